import CofferCrypto
import Foundation
import CofferTestSupport
import Testing
@testable import CofferStore
import CofferStoreTestSupport

/// A hostile server (or anyone with psql and the role) edits the container's rows while the store is
/// closed: the same typed errors as for an edited SQLite file (StoreTamperTests).
@Suite("PostgreSQL engine: tampering is detected")
struct PostgresTamperTests {
    /// A closed store, SQL on its schema (`S` stands for the quoted schema), and the store reopened.
    struct Victim {
        let made: TestStore
        var schema: String { PostgresIdentifier.quoted(made.location?.container ?? "?") }
        func sql(_ text: String) throws { try TestPostgres.cluster().psql(text.replacingOccurrences(of: "S.", with: schema + ".")) }
        func open() throws -> EntityStore { try made.open() }
    }

    func victim(_ fill: (EntityStore) throws -> Void) throws -> Victim {
        let made = try TestStore.create(.postgres, in: "")
        let store = try made.open()
        try fill(store)
        store.close()
        return Victim(made: made)
    }

    @Test func flippedBytesSwappedAndMovedInodes() throws {
        let v = try victim { s in
            for id: UInt64 in [100, 200, 201, 300] { try s.putInode(id, sampleInode(size: id)) }
        }
        for position in [0, 11, 30] {
            try v.sql("UPDATE S.inodes SET value = set_byte(value, \(position), get_byte(value, \(position)) # 1) WHERE id = 100")
            let s = try v.open()
            expectAuthFailure(.inode, "flip at \(position)") { _ = try s.inode(100) }
            #expect(try s.inode(EntityStore.rootInode) != nil, "the other inodes stay readable")
            s.close()
            try v.sql("UPDATE S.inodes SET value = set_byte(value, \(position), get_byte(value, \(position)) # 1) WHERE id = 100")
        }
        try v.sql("UPDATE S.inodes a SET value = b.value FROM S.inodes b WHERE (a.id, b.id) IN ((200, 201), (201, 200))")
        try v.sql("UPDATE S.inodes SET id = 301 WHERE id = 300")
        try v.sql("UPDATE S.inodes SET value = '\\x0102' WHERE id = 100")
        let s = try v.open()
        defer { s.close() }
        expectAuthFailure(.inode) { _ = try s.inode(100) }
        expectAuthFailure(.inode) { _ = try s.inode(200) }
        expectAuthFailure(.inode) { _ = try s.inode(201) }
        #expect(try s.inode(300) == nil)
        expectAuthFailure(.inode) { _ = try s.inode(301) }
    }

    @Test func entriesAndXattrsMovedBetweenNames() throws {
        let v = try victim { s in
            try s.putEntry(parent: 1, DirectoryEntryRecord(name: b("a"), ino: 10, type: 0o100000))
            try s.putEntry(parent: 1, DirectoryEntryRecord(name: b("b"), ino: 11, type: 0o100000))
            try s.putXattr(10, name: b("user.a"), value: b("1"))
            try s.putXattr(11, name: b("user.a"), value: b("2"))
        }
        try v.sql("UPDATE S.dirents a SET value = b.value FROM S.dirents b WHERE a.parent = b.parent AND a.tag <> b.tag")
        try v.sql("UPDATE S.xattrs a SET value = b.value FROM S.xattrs b WHERE a.inode <> b.inode")
        let s = try v.open()
        defer { s.close() }
        expectAuthFailure(.directoryEntry) { _ = try s.entry(parent: 1, name: b("a")) }
        expectAuthFailure(.directoryEntry) { _ = try s.entry(parent: 1, name: b("b")) }
        expectAuthFailure(.extendedAttribute) { _ = try s.xattr(10, name: b("user.a")) }
    }

    @Test func chunksMovedAndMapPagesReplayed() throws {
        let file = try EntityStore.newContentId()
        var current = ChunkMapPageRef(page: 0, version: 0)
        let v = try victim { s in
            let cipher = try s.contentCipher(contentId: file)
            try s.putChunks(file: file, try (0..<2).map { i in (UInt64(i), try cipher.seal([UInt8(i)], index: UInt64(i))) })
            _ = try s.writeChunkMapPage(file: file, page: 0, tags: [ChunkTag(high: 1, low: 1)])
            try s.commit()
        }
        // Keep the old page, let the owner rewrite it, then put the old one back.
        try v.sql("CREATE TABLE S.saved AS SELECT * FROM S.chunkmaps")
        let s1 = try v.open()
        current = try s1.writeChunkMapPage(file: file, page: 0, tags: [ChunkTag(high: 2, low: 2)])
        s1.close()
        try v.sql("UPDATE S.chunkmaps c SET value = o.value FROM S.saved o WHERE c.file = o.file AND c.page = o.page")
        try v.sql("UPDATE S.chunks SET idx = idx + 5")
        let s = try v.open()
        defer { s.close() }
        expectAuthFailure(.chunkMapPage) { _ = try s.chunkMapPage(file: file, page: 0, version: current.version) }
        let cipher = try s.contentCipher(contentId: file)
        let moved = try s.sealedChunks(file: file, first: 0, last: 10)
        #expect(moved.map(\.index) == [5, 6])
        for c in moved {
            var out = [UInt8](repeating: 0, count: 16)
            expectAuthFailure(.contentChunk) { _ = try out.withUnsafeMutableBytes { try cipher.open(c.sealed, index: c.index, into: $0) } }
        }
    }

    @Test func stateAndSchemaRows() throws {
        let v = try victim { s in try s.putInode(7, sampleInode()) }
        try v.sql("CREATE TABLE S.saved AS SELECT * FROM S.meta")
        let s1 = try v.open()
        let older = s1.generation
        try s1.putInode(8, sampleInode())
        try s1.commit()
        s1.close()
        // An older state row put back reads as that generation (the rollback ledger refuses it).
        try v.sql("UPDATE S.meta m SET value = o.value FROM S.saved o WHERE m.name = o.name")
        let replayed = try v.open()
        #expect(replayed.generation == older)
        replayed.close()
        try v.sql("UPDATE S.meta SET value = '\\x00112233445566778899aabbccddeeff' WHERE name = 'container'")
        #expect(storeError { _ = try v.open() } == .wrongContainer)
        try v.sql("UPDATE S.meta m SET value = o.value FROM S.saved o WHERE m.name = o.name AND m.name = 'container'")
        try v.sql("DELETE FROM S.meta WHERE name = 'state'")
        if case .notAStore? = storeError({ _ = try v.open() }) {} else { Issue.record("a store without state must be notAStore") }
        try v.sql("UPDATE S.kinds SET transformer = 'evil.v9' WHERE kind = 1")
        if case .unknownTransformer? = storeError({ _ = try v.open() }) {} else { Issue.record("an unknown transformer must be refused") }
    }
}
