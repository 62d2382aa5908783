import CofferCrypto
import Foundation
import CofferTestSupport
import Synchronization
import Testing
@testable import CofferStore
import CofferStoreTestSupport

/// What the PostgreSQL engine adds to the behaviour every engine shares (EntityStoreTests runs that on
/// both): order and paging as SQLite has them, batches, a group lost to a statement error or to the
/// server, a server restarted under a store, and typed errors for rows edited on the server.
@Suite("PostgreSQL engine")
struct PostgresEngineTests {
    @Test(arguments: StoreEngine.allCases) func entryPagesFollowBytewiseTagOrder(engine: StoreEngine) throws {
        try withTempDir { dir in
            let (store, _, _) = try makeStore(engine, in: dir)
            defer { store.close() }
            for i in 0..<50 { try store.putEntry(parent: 1, DirectoryEntryRecord(name: b("n\(i)"), ino: UInt64(100 + i), type: 0o100000)) }
            let all = try store.entryPage(parent: 1, from: [], limit: -1)
            #expect(all.count == 50)
            #expect(zip(all, all.dropFirst()).allSatisfy { $0.tag.lexicographicallyPrecedes($1.tag) }, "tags in bytewise order")
            var paged: [[UInt8]] = []
            var from: [UInt8] = []
            while true {
                let page = try store.entryPage(parent: 1, from: from, limit: 7)
                guard let last = page.last else { break }
                paged += page.map(\.tag)
                from = last.tag + [0]  // the smallest tag after it
            }
            #expect(paged == all.map(\.tag))
            #expect(all.allSatisfy { $0.record != nil })
        }
    }

    @Test(arguments: StoreEngine.allCases) func longChunkRangesReadWholeCommittedOrNot(engine: StoreEngine) throws {
        try withTempDir { dir in
            let (store, _, _) = try makeStore(engine, in: dir)
            defer { store.close() }
            let file = try EntityStore.newContentId()
            let cipher = try store.contentCipher(contentId: file)
            let chunks = try (0..<150).map { i in (index: UInt64(i), sealed: try cipher.seal([UInt8(i)], index: UInt64(i))) }
            try store.putChunks(file: file, chunks)
            for committed in [false, true] {
                #expect(
                    try store.sealedChunks(file: file, first: 0, last: 149).map(\.index) == (0..<150).map { UInt64($0) }, "committed: \(committed)")
                #expect(try store.sealedChunks(file: file, first: 10, last: 140).count == 131)
                #expect(try store.sealedChunks(file: file, first: 149, last: UInt64(Int64.max)).map(\.sealed) == [chunks[149].sealed])
                try store.commit()
            }
        }
    }

    @Test func batchHoldsTheWriterForItsThread() throws {
        let (store, _, _) = try makeStore(.postgres, in: "")
        defer { store.close() }
        let order = Mutex<[String]>([])
        let done = DispatchSemaphore(value: 0)
        try store.batch {
            try store.putInode(20, sampleInode(size: 20))
            Thread {
                let seen = (try? store.inode(20))??.size
                order.withLock { $0.append("other saw \(seen.map(String.init) ?? "nothing")") }
                done.signal()
            }.start()
            Thread.sleep(forTimeInterval: 0.3)
            #expect(try store.inode(20)?.size == 20, "calls of the batch's own thread join it")
            order.withLock { $0.append("batch") }
        }
        done.wait()
        #expect(order.withLock { $0 } == ["batch", "other saw 20"])
        struct Marker: Error {}
        #expect(throws: Marker.self) { try store.batch { throw Marker() } }
    }

    /// PostgreSQL aborts the whole transaction on a failed statement: the group is rolled back and
    /// the store hears of it; the store goes on working.
    @Test func aFailedStatementDropsTheGroup() throws {
        let made = try TestStore.create(.postgres, in: "")
        let store = try made.open()
        defer { store.close() }
        let location = try #require(made.location)
        let rollbacks = Mutex(0)
        store.onRollback = { _ in rollbacks.withLock { $0 += 1 } }
        try store.putInode(30, sampleInode(size: 30))
        try store.commit()
        try store.putInode(30, sampleInode(size: 31))
        try store.putInode(31, sampleInode(size: 1))
        let q = PostgresIdentifier.quoted(location.container)
        try TestPostgres.cluster().psql("ALTER TABLE \(q).xattrs ADD CONSTRAINT refuse CHECK (false) NOT VALID")
        // A put nothing waits for is sent with the next statement: that one reports the failure.
        try store.putXattr(30, name: b("user.x"), value: b("v"))
        #expect(throws: StoreError.self) { _ = try store.inode(31) }
        #expect(rollbacks.withLock { $0 } == 1)
        #expect(store.hasPendingChanges == false)
        #expect(try store.inode(30)?.size == 30, "the group's writes are gone")
        #expect(try store.inode(31) == nil)
        try TestPostgres.cluster().psql("ALTER TABLE \(q).xattrs DROP CONSTRAINT refuse")
        try store.putInode(32, sampleInode(size: 32))
        try store.commit()
        #expect(try store.inode(32)?.size == 32)
    }

    /// Every commit renews the lease it was opened under, in its own transaction: once that lease is
    /// gone (it lapsed and was removed), this store commits nothing more (its group is dropped and reported).
    @Test func aStoreThatLostItsLeaseCommitsNothing() throws {
        let made = try TestStore.create(.postgres, in: "")
        let store = try made.open()
        defer { store.close() }
        let location = try #require(made.location)
        let lease = try PostgresLease.take(location, purpose: "mount", machine: "lease-test")
        defer { lease.release() }
        let backend = try #require(store.backend as? PostgresBackend)
        backend.fenceHolder = lease.me.holder
        let rollbacks = Mutex<[StoreError]>([])
        store.onRollback = { e in rollbacks.withLock { $0.append(e) } }
        try store.putInode(50, sampleInode(size: 50))
        try store.commit()
        #expect(try store.inode(50)?.size == 50, "commits go through while the lease is ours")
        let q = PostgresIdentifier.quoted(location.container)
        try TestPostgres.cluster().psql("DELETE FROM \(q).leases")
        try store.putInode(51, sampleInode(size: 51))
        #expect(throws: StoreError.leaseLost) { try store.commit() }
        #expect(rollbacks.withLock { $0 } == [.leaseLost])
        let other = try made.open()
        defer { other.close() }
        #expect(try other.inode(51) == nil, "nothing of the fenced group reached the server")
        #expect(try other.inode(50)?.size == 50)
    }

    /// The writer's session is killed with a group open (an operator, a failover): rolled back,
    /// reported, and the next call reconnects.
    @Test func aTerminatedSessionDropsTheGroup() throws {
        let made = try TestStore.create(.postgres, in: "")
        let store = try made.open()
        defer { store.close() }
        let location = try #require(made.location)
        let rollbacks = Mutex(0)
        store.onRollback = { _ in rollbacks.withLock { $0 += 1 } }
        try store.putInode(40, sampleInode(size: 40))
        #expect(try store.inode(40)?.size == 40, "the group's own write is read back (and the session's last query names the schema)")
        let killed = try TestPostgres.cluster().psql(
            """
            SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
            WHERE state LIKE 'idle in transaction%' AND query LIKE '%"\(location.container)"%'
            """)
        #expect(killed.trimmingCharacters(in: .whitespacesAndNewlines) == "1")
        #expect(throws: StoreError.self) { _ = try store.inode(40) }
        #expect(rollbacks.withLock { $0 } == 1)
        #expect(try store.inode(40) == nil)
        try store.putInode(41, sampleInode(size: 41))
        try store.commit()
        let reopened = try made.open()
        defer { reopened.close() }
        #expect(try reopened.inode(41)?.size == 41)
        #expect(try reopened.inode(40) == nil)
    }

    /// On a private cluster: a restart under an idle store is waited out; a crash under an open group
    /// loses the group (reported) and nothing of it; a server that stays down fails calls after the
    /// bounded wait with an error that says so.
    @Test func serverRestarts() throws {
        let cluster = try PostgresCluster()
        defer { cluster.destroy() }
        let made = try TestStore.create(.postgres, in: "", cluster: cluster)
        let store = try made.open(reconnectWait: 30)
        defer { store.close() }
        let rollbacks = Mutex(0)
        store.onRollback = { _ in rollbacks.withLock { $0 += 1 } }
        try store.putInode(10, sampleInode(size: 10))
        try store.commit()
        let committed = store.generation

        try cluster.restart()
        #expect(try store.inode(10)?.size == 10, "an idle store reconnects")
        #expect(rollbacks.withLock { $0 } == 0)

        try store.putInode(10, sampleInode(size: 99))
        try store.putInode(11, sampleInode(size: 11))
        try cluster.restart(mode: "immediate")
        #expect(throws: StoreError.self) { _ = try store.inode(11) }
        #expect(rollbacks.withLock { $0 } == 1)
        #expect(try store.inode(10)?.size == 10, "nothing of the lost group is visible")
        #expect(try store.inode(11) == nil)
        try store.putInode(12, sampleInode(size: 12))
        try store.commit()
        #expect(store.generation == committed + 1)

        let quick = try made.open(reconnectWait: 1)
        defer { quick.close() }
        try cluster.stop()
        let start = ContinuousClock.now
        let error = storeError { _ = try quick.inode(12) }
        #expect(ContinuousClock.now - start < .seconds(15), "bounded wait")
        #expect(error?.description.contains("no connection within") == true, "\(String(describing: error))")
        try cluster.start()
        #expect(try quick.inode(12)?.size == 12)
    }
}
