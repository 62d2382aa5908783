import CofferStoreTestSupport
import CofferTestSupport
import Foundation
import Synchronization
import Testing

@testable import CofferStore

/// Two stores over one PostgreSQL container, as two mounts (issue 17): groups run one after the other
/// under the writer lock, each adopts the other's generation, hears its commits, and refuses a state
/// below what it saw durable (a rollback while mounted).
@Suite("Several stores on one PostgreSQL container")
struct SharedStoreTests {
    /// Opens a store as a mount does: coherent, sharing with others, a durable floor.
    private func mountLike(_ made: TestStore, floor: UInt64 = 0, holder: String? = nil) throws -> EntityStore {
        let store = try made.open()
        let backend = try #require(store.backend as? PostgresBackend)
        backend.coherent = true
        backend.fenceHolder = holder
        store.shareWithOtherMounts(floor: floor)
        return store
    }

    /// Groups span changes, so a mount that needs the writer lock asks its holder to end its group (a
    /// notification), then waits: to write (`beginGroup`) or, at an open, for what the holder closed
    /// (`catchUp`, the lock taken shared). Until the holder commits, neither goes on.
    @Test func aMountWaitingForTheWriterLockAsksItsHolder() throws {
        let made = try TestStore.create(.postgres, in: "")
        let location = try #require(made.location)
        let leaseA = try PostgresLease.take(location, purpose: "mount", machine: "ask-a")
        let leaseB = try PostgresLease.take(location, purpose: "mount", machine: "ask-b")
        defer {
            leaseA.release()
            leaseB.release()
        }
        let a = try mountLike(made, holder: leaseA.me.holder), b = try mountLike(made, holder: leaseB.me.holder)
        defer {
            a.close()
            b.close()
        }
        let asked = Mutex(0)
        a.onOthersWaiting = { asked.withLock { $0 += 1 } }
        for (round, writes) in [(0, false), (1, true)] {
            let ino = UInt64(60 + round)
            try a.beginGroup()
            try a.putInode(ino, sampleInode(size: ino))
            #expect(!a.othersWaiting, "round \(round): nobody asked yet")
            let waiter = BackgroundCall { if writes { try b.beginGroup() } else { try b.catchUp() } }
            #expect(waitUntil(5, every: 0.01) { a.othersWaiting }, "round \(round): the holder heard the request")
            // An open's wait is told apart from a writer's: a busy holder ends its group after its slice
            // for the first, only once it pauses for the second (CofferFileSystem.yieldsToOthers).
            #expect(a.readersWaiting == !writes, "round \(round): who waits, a reader or a writer")
            usleep(200_000)
            #expect(!waiter.done, "round \(round): the waiter waits while the group is open")
            try a.commit(durable: false)
            #expect(!a.othersWaiting && !a.readersWaiting, "round \(round): the request ends with the group")
            #expect(waitUntil(5, every: 0.01) { waiter.done }, "round \(round): the waiter goes on after the commit")
            #expect(waiter.failure == nil)
            #expect(try b.inode(ino)?.size == ino, "round \(round): and sees what was committed")
            if writes { try b.commit(durable: false) }
        }
        #expect(asked.withLock { $0 } == 2, "one request per wait")

        // A request heard while this mount has no group open (c held the lock) does not cut a group
        // begun later short.
        let leaseC = try PostgresLease.take(location, purpose: "mount", machine: "ask-c")
        defer { leaseC.release() }
        let c = try mountLike(made, holder: leaseC.me.holder)
        defer { c.close() }
        try c.beginGroup()
        let waiter = Thread { _ = try? b.catchUp() }
        waiter.start()
        #expect(waitUntil(5, every: 0.01) { asked.withLock { $0 } == 3 }, "a heard b's request for c's group")
        #expect(!a.othersWaiting, "a has no group: nobody waits for it")
        try c.commit(durable: false)
        usleep(100_000)
        try a.beginGroup()
        #expect(!a.othersWaiting, "the old request is not for a's new group")
        try a.commit(durable: false)
    }

    /// A mount alone (no other lease row) holds the sole lock, and its opens cost no round trip
    /// (`catchUp`). A mount that joins goes on only once the one alone has let go: from then on every
    /// open looks at the server again, and sees what the newcomer committed.
    @Test func aMountAloneSkipsItsOpenChecksUntilAnotherJoins() throws {
        let made = try TestStore.create(.postgres, in: "")
        let location = try #require(made.location)
        let leaseA = try PostgresLease.take(location, purpose: "mount", machine: "sole-a")
        defer { leaseA.release() }
        let a = try mountLike(made, holder: leaseA.me.holder)
        defer { a.close() }
        let backendA = try #require(a.backend as? PostgresBackend)
        usleep(300_000)
        #expect(!backendA.isSole, "not alone before it joined")
        try a.awaitOtherGroups()
        #expect(waitUntil(5) { backendA.isSole }, "alone once joined")
        let before = backendA.writerRoundTrips
        for _ in 0..<10 { #expect(!(try a.catchUp())) }
        #expect(backendA.writerRoundTrips == before, "an open of a mount alone costs no round trip")

        let leaseB = try PostgresLease.take(location, purpose: "mount", machine: "sole-b")
        defer { leaseB.release() }
        let b = try mountLike(made, holder: leaseB.me.holder)
        defer { b.close() }
        try b.awaitOtherGroups()
        #expect(!backendA.isSole, "b joined only after a let go")
        try b.beginGroup()
        try b.putInode(70, sampleInode(size: 70))
        try b.commit(durable: false)
        #expect(try a.catchUp(), "a's next open sees b's commit")
        #expect(backendA.writerRoundTrips > before)
        #expect(try a.inode(70)?.size == 70)
        usleep(1_500_000)
        let backendB = try #require(b.backend as? PostgresBackend)
        #expect(!backendA.isSole && !backendB.isSole, "neither is alone while both have leases")
    }

    /// A mount alone that does not let go of the sole lock (a stopped process; here a session holding it)
    /// keeps a newcomer out for `joinWait` seconds, then the newcomer fails saying why; once the lock is
    /// gone it joins.
    @Test func aJoinNoMountAloneAnswersFailsSayingWhy() throws {
        let made = try TestStore.create(.postgres, in: "")
        let location = try #require(made.location)
        let stuck = try PGConnection(location.conninfo)
        defer { stuck.close() }
        try stuck.execute("SELECT pg_advisory_lock_shared(\(PostgresSQL.soleSpace), hashtext($1))", [.text(location.container)])
        let lease = try PostgresLease.take(location, purpose: "mount", machine: "join-b")
        defer { lease.release() }
        let b = try mountLike(made, holder: lease.me.holder)
        defer { b.close() }
        try #require(b.backend as? PostgresBackend).joinWait = 1
        var failure: StoreError?
        do { try b.awaitOtherGroups() } catch { failure = error }
        if case .unavailable(let why)? = failure {
            #expect(why.contains("did not answer within 1 s"))
        } else {
            Issue.record("expected unavailable, got \(String(describing: failure))")
        }
        stuck.close()
        try b.awaitOtherGroups()
    }

    /// A session holding the writer lock in the name of a mount (`writerPrefix` and its lease holder) that
    /// does not go on: a machine stopped in the middle of a statement, which the server waits for without
    /// limit (here a session with no idle timeout). While its lease is live, or while it runs a statement,
    /// it is waited for; once it stalls on its client with its lease lapsed, the waiting mount ends that
    /// session and begins its group.
    @Test func aWriterWhoseLeaseLapsedIsEndedByTheNextWaiter() throws {
        let m = try StoppedMachine("stop")
        defer { m.close() }
        try m.stuck.executeScript("BEGIN; SELECT pg_advisory_xact_lock(\(PostgresSQL.lockSpace), hashtext('\(m.location.container)'))")
        let (made, stuck, look) = (m.made, m.stuck, m.look)
        let stuckPid = try #require(try stuck.execute("SELECT pg_backend_pid()").int64(0, 0))
        let b = try mountLike(made, holder: m.lease.me.holder)
        defer { b.close() }
        try #require(b.backend as? PostgresBackend).lockSlice = 0.2
        let began = Mutex(false)
        let failure = Mutex<(any Error)?>(nil)
        let waiter = Thread {
            do { try b.beginGroup() } catch { failure.withLock { $0 = error } }
            began.withLock { $0 = true }
        }
        waiter.start()
        func stuckIsAlive() throws -> Bool {
            try look.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = $1", [.int4(Int32(stuckPid))]).int64(0, 0) == 1
        }
        usleep(1_500_000)
        #expect(!began.withLock { $0 }, "a holder whose lease is live is waited for")
        #expect(try stuckIsAlive())
        // Its lease lapses while it works (a statement running, not waiting on its client): still waited for.
        let working = Thread { _ = try? stuck.execute("SELECT pg_sleep(2)") }
        working.start()
        usleep(200_000)
        try m.lapse()
        usleep(1_200_000)
        #expect(!began.withLock { $0 }, "a holder that works is waited for, lease or not")
        #expect(try stuckIsAlive())
        // Then it stalls on its client (idle in its transaction) with its lease lapsed: ended.
        let ended = waitUntil(10, every: 0.05) { began.withLock { $0 } }
        if !ended { stuck.close() }  // lets the waiter go, so the test ends
        #expect(ended, "the waiter ended the session of the lapsed lease")
        _ = waitUntil(10) { began.withLock { $0 } }
        #expect(failure.withLock { $0 } == nil, "\(String(describing: failure.withLock { $0 }))")
        #expect(waitUntil(5) { (try? stuckIsAlive()) == false }, "the stopped session was ended")
        let backend = try #require(b.backend as? PostgresBackend)
        #expect(try backend.read { try $0.execute("SHOW lock_timeout").text(0, 0) } == "0", "the group waits for other locks as before")
        try b.putInode(90, sampleInode(size: 90))
        try b.commit(durable: true)
        #expect(try b.inode(90)?.size == 90)
    }

    /// The same for a machine stopped in a group of inodes (the writer lock shared, an inode's lock): a mount
    /// waiting for that inode ends it once its lease lapsed.
    @Test func aStoppedGroupOfInodesIsEndedOnceItsLeaseLapsed() throws {
        let m = try StoppedMachine("stop-inode")
        defer { m.close() }
        let container = m.location.container
        try m.stuck.executeScript(
            "BEGIN; SELECT pg_advisory_xact_lock_shared(\(PostgresSQL.lockSpace), hashtext('\(container)')); "
                + "SELECT pg_advisory_xact_lock(\(PostgresSQL.inodeSpace), hashtext('\(container):7'))")
        let b = try mountLike(m.made, holder: m.lease.me.holder)
        defer { b.close() }
        try #require(b.backend as? PostgresBackend).lockSlice = 0.2
        try #require(b.backend as? PostgresBackend).inodeGroupsBesideIdleMounts = true
        let waiter = BackgroundCall { _ = try b.beginGroup(.inode(7)) }
        usleep(1_000_000)
        #expect(!waiter.done, "a holder of the inode whose lease is live is waited for")
        try m.lapse()
        let ended = waitUntil(10, every: 0.05) { waiter.done }
        if !ended { m.stuck.close() }  // lets the waiter go, so the test ends
        #expect(ended, "the waiter ended the session of the lapsed lease")
        _ = waitUntil(10) { waiter.done }
        #expect(waiter.failure == nil)
        #expect(b.holdsInodeGroup, "b waited for the inode, not the container")
        try b.putInode(7, sampleInode(size: 7))
        try b.commit(durable: true)
        #expect(try b.inode(7)?.size == 7)
    }

    /// A machine stopped between the two round trips of a group of inodes' commit holds the state row: the
    /// next commit of a group of inodes waits for it in slices, and ends it once its lease lapsed.
    @Test func aCommitStoppedOnTheStateRowIsEndedOnceItsLeaseLapsed() throws {
        let m = try StoppedMachine("stop-commit")
        defer { m.close() }
        let q = PostgresSQL(schema: m.location.container).q
        try m.stuck.executeScript(
            "BEGIN; SELECT pg_advisory_xact_lock_shared(\(PostgresSQL.lockSpace), hashtext('\(m.location.container)')); "
                + "SELECT value FROM \(q).meta WHERE name = 'state' FOR UPDATE")
        let b = try mountLike(m.made, holder: m.lease.me.holder)
        defer { b.close() }
        let backend = try #require(b.backend as? PostgresBackend)
        backend.lockSlice = 0.2
        backend.inodeGroupsBesideIdleMounts = true
        #expect(try b.beginGroup(.inode(8)) && b.holdsInodeGroup)
        try b.putInode(8, sampleInode(size: 8))
        let committing = BackgroundCall { try b.commit(durable: true) }
        usleep(1_000_000)
        #expect(!committing.done, "the commit waits for the row while the holder's lease is live")
        try m.lapse()
        let ended = waitUntil(10, every: 0.05) { committing.done }
        if !ended { m.stuck.close() }  // lets the commit go, so the test ends
        #expect(ended, "the committer ended the session of the lapsed lease")
        _ = waitUntil(10) { committing.done }
        #expect(committing.failure == nil, "the group survived the slices: \(String(describing: committing.failure))")
        #expect(try b.inode(8)?.size == 8)
    }

    /// A mount alone that was stopped (its listener's session, named after its lease, holds the sole lock
    /// and sends nothing) with its lease lapsed: a mount that joins ends that session and joins, instead of
    /// failing for as long as the stopped one stays stopped (a tester's find).
    @Test func aJoinEndsAStoppedMountAloneOnceItsLeaseLapsed() throws {
        let m = try StoppedMachine("alone")
        defer { m.close() }
        try m.stuck.execute("SELECT pg_advisory_lock_shared(\(PostgresSQL.soleSpace), hashtext($1))", [.text(m.location.container)])
        let b = try mountLike(m.made, holder: m.lease.me.holder)
        defer { b.close() }
        let backend = try #require(b.backend as? PostgresBackend)
        backend.joinWait = 3
        backend.soleStall = 0.3
        // Its lease live: waited for, then the join fails saying why.
        if case .unavailable? = storeError({ try b.awaitOtherGroups() }) {} else { Issue.record("a live stopped mount alone keeps a join out") }
        try m.lapse()
        let started = ContinuousClock.now
        try b.awaitOtherGroups()
        #expect(ContinuousClock.now - started < .seconds(3), "ended within a slice or two")
        #expect(throws: (any Error).self, "the stopped session was ended") { try m.stuck.execute("SELECT 1") }
    }

    @Test func groupsSeeEachOtherAndGenerationsGrowByOne() throws {
        let made = try TestStore.create(.postgres, in: "")
        let a = try mountLike(made), b = try mountLike(made)
        defer {
            a.close()
            b.close()
        }
        let heard = Mutex(0)
        b.onForeignChange = { heard.withLock { $0 += 1 } }
        let start = a.generation
        try a.beginGroup()
        try a.putInode(40, sampleInode(size: 40))
        try a.commit(durable: false)
        #expect(a.generation == start + 1)
        // b's next group adopts a's generation: its commit is one more, not a second start + 1.
        try b.beginGroup()
        #expect(heard.withLock { $0 } >= 1, "b was told the store changed under it")
        #expect(try b.inode(40)?.size == 40)
        try b.putInode(41, sampleInode(size: 41))
        try b.commit(durable: true)
        #expect(b.generation == start + 2)
        #expect(try a.catchUp(), "a sees that b committed")
        #expect(a.generation == start + 2)
        #expect(!(try a.catchUp()), "nothing changed since")
    }

    /// A mount whose writer had to reconnect cannot tell from the generation whether the server lost
    /// its commits that were not durable: another mount may have committed past them meanwhile (seen
    /// as a synced file lost in SharedMountTests' restart test). Its next group reports them as
    /// possibly lost all the same; a group without a reconnect does not.
    @Test func aReconnectReportsCommitsThatMayBeLostEvenBehindAnotherMounts() throws {
        let made = try TestStore.create(.postgres, in: "")
        let location = try #require(made.location)
        let a = try mountLike(made), b = try mountLike(made)
        defer {
            a.close()
            b.close()
        }
        let lost = Mutex(0)
        a.onLostCommits = { lost.withLock { $0 += 1 } }
        try a.beginGroup()
        try a.putInode(60, sampleInode(size: 60))
        try a.commit(durable: false)
        _ = try a.catchUp()  // each writer's last query names the container: theirs are the sessions cut below
        _ = try b.catchUp()
        let killed = try TestPostgres.cluster().psql(
            """
            SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
            WHERE pid <> pg_backend_pid() AND state = 'idle' AND query LIKE '%"\(location.container)"%'
            """)
        #expect((Int(killed.trimmingCharacters(in: .whitespacesAndNewlines)) ?? 0) >= 2, "both writers cut: \(killed)")
        try b.beginGroup()
        try b.putInode(61, sampleInode(size: 61))
        try b.commit(durable: false)
        #expect(b.generation > a.generation, "b committed past a's last commit")
        #expect(lost.withLock { $0 } == 0)
        try a.beginGroup()
        #expect(lost.withLock { $0 } == 1, "a reconnected: its commits since the last durable one may be gone")
        try a.commit(durable: false)
        try a.beginGroup()
        try a.commit(durable: false)
        #expect(lost.withLock { $0 } == 1, "no reconnect, nothing more reported")
    }

    /// A state row below what this machine saw durable, served while mounted: every group begin and
    /// every check refuses it, and nothing is written over it.
    @Test func aStateBelowTheDurableFloorIsRefused() throws {
        let made = try TestStore.create(.postgres, in: "")
        let location = try #require(made.location)
        let q = PostgresIdentifier.quoted(location.container)
        let a = try mountLike(made)
        defer { a.close() }
        try a.beginGroup()
        try a.putInode(50, sampleInode(size: 50))
        try a.commit(durable: true)
        let old = try TestPostgres.cluster().psql("SELECT encode(value, 'hex') FROM \(q).meta WHERE name = 'state'")
        try a.beginGroup()
        try a.putInode(51, sampleInode(size: 51))
        try a.commit(durable: true)
        let seen = a.generation
        try TestPostgres.cluster().psql(
            "UPDATE \(q).meta SET value = decode('\(old.trimmingCharacters(in: .whitespacesAndNewlines))', 'hex') WHERE name = 'state'")
        #expect(throws: StoreError.rolledBack(seen: seen, served: seen - 1)) { try a.catchUp() }
        #expect(throws: StoreError.rolledBack(seen: seen, served: seen - 1)) { try a.beginGroup() }
        let stored = try TestPostgres.cluster().psql("SELECT encode(value, 'hex') FROM \(q).meta WHERE name = 'state'")
        #expect(stored == old, "nothing was written over the old state")
        #expect(try a.inode(51)?.size == 51)
    }
}

/// A machine that stopped while its session held a lock: `stuck`, named after the lease `stopped` (as a
/// mount's writer and listener are), which sends nothing more; `lease` is for the other machine's mount,
/// and `look` reads and changes what the server holds.
private final class StoppedMachine {
    let made: TestStore, location: PostgresLocation
    let stopped: PostgresLease, lease: PostgresLease
    let stuck: PGConnection, look: PGConnection

    init(_ tag: String) throws {
        made = try TestStore.create(.postgres, in: "")
        location = try #require(made.location)
        stopped = try PostgresLease.take(location, purpose: "mount", machine: tag + "-a")
        lease = try PostgresLease.take(location, purpose: "mount", machine: tag + "-b")
        stuck = try PGConnection(location.conninfo)
        look = try PGConnection(location.conninfo)
        try stuck.execute(PostgresSQL.nameSession, [.text(PostgresSQL.writerPrefix + stopped.me.holder)])
    }

    /// The stopped machine's lease lapses (as it does once the machine stops renewing it).
    func lapse() throws {
        try look.execute(
            "UPDATE \(PostgresSQL(schema: location.container).q).leases SET expires = now() - interval '1 second' WHERE holder = $1",
            [.text(stopped.me.holder)])
    }

    func close() {
        stuck.close()
        look.close()
        stopped.release()
        lease.release()
    }
}
