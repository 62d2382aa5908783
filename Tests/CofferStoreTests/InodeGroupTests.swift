import CofferStoreTestSupport
import CofferTestSupport
import Foundation
import Synchronization
import Testing

@testable import CofferStore

/// Groups of inodes (`GroupScope.inode`): two mounts changing different inodes commit beside each
/// other, with generations that still grow by one per commit; a mount that needs an inode another
/// holds, or the container, waits for that group; an open waits only for the group that changes what
/// it opens (docs/FORMAT.md, "Several mounts at once").
@Suite("Groups of inodes on one PostgreSQL container")
struct InodeGroupTests {
    /// Two stores as two mounts: coherent, each under its own lease, sharing with the other.
    private final class Two: @unchecked Sendable {  // lets only
        let a: EntityStore, b: EntityStore
        private let leases: [PostgresLease]
        /// `busy`: groups of inodes beside the other mount whether or not it writes (the rule is tested below).
        init(busy: Bool = true) throws {
            let made = try TestStore.create(.postgres, in: "")
            let location = try #require(made.location)
            leases = [
                try PostgresLease.take(location, purpose: "mount", machine: "inode-a"),
                try PostgresLease.take(location, purpose: "mount", machine: "inode-b")
            ]
            func mount(_ lease: PostgresLease) throws -> EntityStore {
                let store = try made.open()
                let backend = try #require(store.backend as? PostgresBackend)
                backend.coherent = true
                backend.fenceHolder = lease.me.holder
                backend.inodeGroupsBesideIdleMounts = busy
                store.shareWithOtherMounts(floor: 0)
                return store
            }
            a = try mount(leases[0])
            b = try mount(leases[1])
            // A first group each: from then on both know they are not alone (alone, a mount takes the container).
            for s in [a, b] {
                try s.beginGroup()
                try s.commit(durable: false)
            }
            #expect(!a.isAlone && !b.isAlone)
        }
        func close() {
            a.close()
            b.close()
            for l in leases { l.release() }
        }
    }

    @Test func groupsOfDifferentInodesCommitBesideEachOther() throws {
        let t = try Two()
        defer { t.close() }
        #expect(try t.a.beginGroup(.inode(10)))
        try t.a.putInode(10, sampleInode(size: 10))
        #expect(t.a.holdsInodeGroup)
        // B's group of another inode goes on while A's is open, and commits first.
        let other = BackgroundCall {
            guard try t.b.beginGroup(.inode(20)) else { throw StoreError.database("refused") }
            try t.b.putInode(20, sampleInode(size: 20))
            try t.b.commit(durable: false)
        }
        #expect(waitUntil(5, every: 0.01) { other.done }, "B does not wait for A's group")
        #expect(other.failure == nil)
        #expect(t.a.hasPendingChanges, "A's group is still open")
        let afterB = t.b.generation
        try t.a.commit(durable: true)
        #expect(t.a.generation == afterB + 1, "A's commit seals the generation after B's")
        // Each sees the other's inode, and a new group of B's adopts A's generation.
        #expect(try t.b.inode(10)?.size == 10)
        #expect(try t.a.inode(20)?.size == 20)
        try t.b.beginGroup()
        #expect(t.b.generation == t.a.generation)
        try t.b.commit(durable: false)
    }

    /// Beside a mount that writes nothing, a group takes the container (no lock per inode to pay); once the
    /// other mount commits, or asks for a lock, groups of inodes.
    @Test func groupsOfInodesOnlyBesideAMountThatWrites() throws {
        let t = try Two(busy: false)
        defer { t.close() }
        #expect(try t.a.beginGroup(.inode(10)))
        #expect(!t.a.holdsInodeGroup, "b wrote nothing: a's group takes the container")
        try t.a.putInode(10, sampleInode(size: 10))
        try t.a.commit(durable: false)
        #expect(waitUntil(5, every: 0.01) { (t.b.backend as? PostgresBackend)?.othersBusy == true }, "b heard a's commit")
        #expect(try t.b.beginGroup(.inode(20)))
        #expect(t.b.holdsInodeGroup, "a writes: b's group holds only its inode")
        try t.b.putInode(20, sampleInode(size: 20))
        try t.b.commit(durable: false)
    }

    @Test func aGroupWaitsForTheMountHoldingItsInode() throws {
        let t = try Two()
        defer { t.close() }
        #expect(try t.a.beginGroup(.inode(10)))
        try t.a.putInode(10, sampleInode(size: 1))
        let waiter = BackgroundCall { _ = try t.b.beginGroup(.inode(10)) }
        #expect(waitUntil(5, every: 0.01) { t.a.othersWaiting }, "B asked A to end its group")
        usleep(200_000)
        #expect(!waiter.done, "B waits while A's group holds the inode")
        try t.a.putInode(10, sampleInode(size: 2))
        try t.a.commit(durable: false)
        #expect(waitUntil(5, every: 0.01) { waiter.done })
        #expect(waiter.failure == nil)
        #expect(try t.b.inode(10)?.size == 2, "B decides on what A committed")
        try t.b.putInode(10, sampleInode(size: 3))
        try t.b.commit(durable: false)
        #expect(try t.a.inode(10)?.size == 3)
    }

    /// A group holding inodes never waits: when it meets one held elsewhere, or a change that needs
    /// the container, it is refused and its mount commits first.
    @Test func anOpenGroupRefusesWhatItWouldHaveToWaitFor() throws {
        let t = try Two()
        defer { t.close() }
        #expect(try t.a.beginGroup(.inode(10)))
        #expect(try t.b.beginGroup(.inode(20)))
        #expect(try !t.b.beginGroup(.inode(10)), "held by A")
        #expect(try !t.b.beginGroup(.container), "the container is wanted")
        #expect(try t.b.beginGroup(.inode(20)) && t.b.beginGroup(.nothing), "what B holds, and nothing")
        #expect(try t.b.beginGroup(.inode(30)), "a free inode is taken into the open group")
        try t.b.putInode(30, sampleInode(size: 30))
        // Rows of an inode the group does not hold are refused, and the group with them (reported as lost).
        let dropped = Mutex(0)
        t.b.onRollback = { _ in dropped.withLock { $0 += 1 } }
        #expect(throws: StoreError.self) { try t.b.putInode(10, sampleInode(size: 1)) }
        #expect(!t.b.hasPendingChanges && dropped.withLock { $0 } == 1, "b's group was dropped")
        #expect(try t.b.beginGroup(.inode(30)))
        #expect(throws: StoreError.self) { try t.b.addEntry(parent: 40, DirectoryEntryRecord(name: Array("n".utf8), ino: 30, type: 0o100000)) }
        #expect(dropped.withLock { $0 } == 2)
        // A new inode is the group's.
        #expect(try t.b.beginGroup(.inode(30)))
        let made = try t.b.newInodeId()
        try t.b.putInode(made, sampleInode(size: 1))
        try t.b.commit(durable: false)
        try t.a.commit(durable: false)
    }

    @Test func theContainersGroupAndInodeGroupsWaitForEachOther() throws {
        let t = try Two()
        defer { t.close() }
        #expect(try t.a.beginGroup(.inode(10)))
        try t.a.putInode(10, sampleInode(size: 10))
        let whole = BackgroundCall { try t.b.beginGroup() }
        usleep(300_000)
        #expect(!whole.done, "the container's group waits for A's group of inodes")
        try t.a.commit(durable: false)
        #expect(waitUntil(5, every: 0.01) { whole.done })
        #expect(whole.failure == nil)
        let inodes = BackgroundCall { _ = try t.a.beginGroup(.inode(40)) }
        usleep(300_000)
        #expect(!inodes.done, "a group of inodes waits for B's group of the container")
        try t.b.putInode(40, sampleInode(size: 40))
        try t.b.commit(durable: false)
        #expect(waitUntil(5, every: 0.01) { inodes.done })
        #expect(try t.a.inode(40)?.size == 40)
        try t.a.commit(durable: false)
    }

    /// Close-to-open per inode: an open waits for the group that changes what it opens, not for a group
    /// of other inodes; beside a group of its own mount, on a connection of the pool.
    @Test func anOpenWaitsOnlyForTheGroupChangingItsInode() throws {
        let t = try Two()
        defer { t.close() }
        #expect(try t.a.beginGroup(.inode(10)))
        try t.a.putInode(10, sampleInode(size: 10))
        #expect(try t.b.beginGroup(.inode(20)))
        try t.b.putInode(20, sampleInode(size: 20))
        let elsewhere = BackgroundCall { _ = try t.b.catchUp(of: 30) }
        #expect(waitUntil(5, every: 0.01) { elsewhere.done }, "nobody changes inode 30")
        let opening = BackgroundCall { _ = try t.b.catchUp(of: 10) }
        #expect(waitUntil(5, every: 0.01) { t.a.readersWaiting }, "A hears that a reader waits")
        usleep(200_000)
        #expect(!opening.done, "the open of A's inode waits for A's group")
        try t.b.commit(durable: false)  // B's own group is not held up by the wait
        try t.a.commit(durable: false)
        #expect(waitUntil(5, every: 0.01) { opening.done })
        #expect(opening.failure == nil)
        #expect(try t.b.inode(10)?.size == 10)
    }

    /// Commits at the same moment take turns on the state row: every commit of either mount seals its own
    /// generation, and together they are consecutive.
    @Test func commitsAtTheSameMomentSealConsecutiveGenerations() throws {
        let t = try Two()
        defer { t.close() }
        let start = max(t.a.generation, t.b.generation)
        let rounds = 20
        var sealed: [UInt64] = []
        for round in 0..<rounds {
            let ids: [UInt64] = [UInt64(100 + 2 * round), UInt64(101 + 2 * round)]
            #expect(try t.a.beginGroup(.inode(ids[0])) && t.b.beginGroup(.inode(ids[1])))
            try t.a.putInode(ids[0], sampleInode(size: ids[0]))
            try t.b.putInode(ids[1], sampleInode(size: ids[1]))
            let other = BackgroundCall { try t.b.commit(durable: round % 2 == 0) }
            try t.a.commit(durable: round % 2 == 1)
            #expect(waitUntil(10, every: 0.001) { other.done })
            #expect(other.failure == nil, "round \(round): \(String(describing: other.failure))")
            sealed += [t.a.generation, t.b.generation]
        }
        #expect(Set(sealed).count == 2 * rounds, "no generation sealed twice: \(sealed)")
        #expect(Set(sealed) == Set((start + 1)...(start + UInt64(2 * rounds))), "and none skipped: \(sealed)")
    }

    /// A record cached before another mount changed it is read again once this mount's group takes its
    /// inode: the state read under the lock shows another generation, and the store says it changed.
    @Test func takingAnInodeAfterAnotherMountsCommitRereads() throws {
        let t = try Two()
        defer { t.close() }
        let changes = Mutex(0)
        t.a.onForeignChange = { changes.withLock { $0 += 1 } }
        #expect(try t.a.beginGroup(.inode(10)))
        try t.a.putInode(10, sampleInode(size: 10))
        #expect(try t.b.beginGroup(.inode(20)))
        try t.b.putInode(20, sampleInode(size: 20))
        try t.b.commit(durable: false)
        // Once a's listener heard the commit (it says so too), only the lock's state can tell a again.
        let backend = try #require(t.a.backend as? PostgresBackend)
        #expect(waitUntil(10, every: 0.01) { backend.lastHeard.withLock { $0 } != nil })
        usleep(50_000)
        changes.withLock { $0 = 0 }
        #expect(try t.a.beginGroup(.inode(20)), "b's group is over: a takes inode 20 into its open group")
        #expect(changes.withLock { $0 } == 1, "the lock came with a newer state: a's cached records are stale")
        #expect(try t.a.inode(20)?.size == 20)
        try t.a.commit(durable: false)
        #expect(t.a.generation == t.b.generation + 1)
    }
}
