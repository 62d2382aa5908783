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
    private func mountLike(_ made: TestStore, floor: UInt64 = 0) throws -> EntityStore {
        let store = try made.open()
        try #require(store.backend as? PostgresBackend).coherent = true
        store.shareWithOtherMounts(floor: floor)
        return store
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
