import CofferCrypto
import Foundation
import GRDB
import CofferTestSupport
import Testing
@testable import CofferStore
import CofferStoreTestSupport

@Suite("Free pages go back to the disk")
struct FreePagesTests {
    func fileSize(_ path: String) throws -> Int {
        try #require(try FileManager.default.attributesOfItem(atPath: path)[.size] as? Int)
    }

    /// A large file written first and deleted: pages of the file written after it are moved into its
    /// place, the end of the database is cut off, and every chunk of the other file still opens.
    @Test func deletedContentShrinksTheStoreAndMovedPagesStayIntact() throws {
        try withTempDir { dir in
            let (store, keys, path) = try makeStore(in: dir)
            store.sqlite.segmentThreshold = .max  // content in rows, as small chunks are held
            let big = try EntityStore.newContentId(), kept = try EntityStore.newContentId()
            try store.putTestChunks(file: big, count: 512, seed: 1, keys: keys)  // 32 MiB
            try store.putTestChunks(file: kept, count: 64, seed: 100, keys: keys)  // 4 MiB, after it in the file
            try store.commit()
            let before = try store.sqlite.pageCounts()
            #expect(before.total * store.sqlite.pageSize > 36 << 20, "\(before)")
            // Nothing to give back yet.
            #expect(try store.giveBackFreePages() == 0)

            _ = try store.deleteChunks(file: big)
            try store.commit()
            let freed = try store.sqlite.pageCounts()
            #expect(freed.free * store.sqlite.pageSize > 30 << 20, "deleting 32 MiB freed only \(freed)")
            var pieces = 0
            while true {
                let n = try store.giveBackFreePages(limit: 256)
                #expect(n <= 256)
                if n == 0 { break }
                pieces += 1
                try store.commit()
                try #require(pieces < 1000, "giving back free pages does not end")
            }
            let after = try store.sqlite.pageCounts()
            #expect(pieces >= 2, "the limit per piece was not kept (\(pieces) pieces)")
            #expect(after.free <= store.sqlite.freePagesToKeep(pageCount: after.total), "\(after)")
            #expect(after.total * store.sqlite.pageSize < 14 << 20, "the store still has \(after.total) pages")
            try expectTestChunks(store, file: kept, count: 64, seed: 100)

            // The file itself is cut at the next checkpoint, and everything reads back after a reopen.
            store.close()
            store.close()  // a second close does nothing
            #expect(try fileSize(path) < 14 << 20)
            let reopened = try EntityStore.open(at: path, keys: keys)
            defer { reopened.close() }
            try expectTestChunks(reopened, file: kept, count: 64, seed: 100)
            #expect(try reopened.chunkIndices(file: big).isEmpty)
        }
    }

    /// Free pages below the margin stay for reuse; stores made without incremental vacuum and
    /// read-only stores are left alone.
    @Test func marginOlderStoresAndReadOnlyStoresAreLeftAlone() throws {
        try withTempDir { dir in
            let (store, keys, path) = try makeStore(in: dir)
            store.sqlite.segmentThreshold = .max  // content in rows, as small chunks are held
            let file = try EntityStore.newContentId()
            try store.putTestChunks(file: file, count: 64, seed: 7, keys: keys)  // 4 MiB: under the 8 MiB margin once freed
            try store.commit()
            _ = try store.deleteChunks(file: file)
            try store.commit()
            #expect(try store.sqlite.pageCounts().free > 200)
            #expect(try store.giveBackFreePages() == 0)
            // 32 MiB more, freed: read-only, nothing moves.
            try store.putTestChunks(file: file, count: 512, seed: 7, keys: keys)
            try store.commit()
            _ = try store.deleteChunks(file: file)
            try store.commit()
            store.close()
            let readOnly = try EntityStore.open(at: path, keys: keys, readOnly: true)
            #expect(try readOnly.giveBackFreePages() == 0)
            readOnly.close()

            // A store as they were made before (auto_vacuum NONE): free pages stay.
            let queue = try DatabaseQueue(path: path)
            try queue.writeWithoutTransaction { db in
                try db.execute(sql: "PRAGMA auto_vacuum = NONE")
                try db.execute(sql: "VACUUM")
                try db.execute(sql: "CREATE TABLE padding(x)")
                try db.execute(sql: "INSERT INTO padding VALUES (zeroblob(40000000))")
                try db.execute(sql: "DROP TABLE padding")
            }
            try queue.close()
            let older = try EntityStore.open(at: path, keys: keys)
            defer { older.close() }
            #expect(!older.sqlite.vacuumsIncrementally)
            let counts = try older.sqlite.pageCounts()
            #expect(counts.free * older.sqlite.pageSize > 30 << 20, "\(counts)")
            #expect(try older.giveBackFreePages() == 0)
            #expect(try older.sqlite.pageCounts().total == counts.total)
        }
    }
}
