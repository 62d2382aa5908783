import CofferCrypto
import CofferTestSupport
import Foundation
import GRDB
import Testing
@testable import CofferStore

#if canImport(Glibc)
    import Glibc
#endif

/// A store on a disk with not one byte free, its WAL cut to nothing: a commit of deletes must write new WAL
/// frames, which only the space reserve can hold. The reserve goes back to the disk before the COMMIT; given
/// back after it, SQLite had already rolled the group back whole, and the delete meant to free space was lost
/// (a killed daemon's container remounted on a full disk kept its deleted file).
@Suite(.enabled(if: getuid() == 0, "a tmpfs of fixed size needs root"))
struct FullDiskStoreTests {
    @Test func deletesCommitOnADiskWithNoByteFree() throws {
        try withTempDir { dir in
            #expect(Glibc.system("mount -t tmpfs -o size=16m tmpfs '\(dir)'") == 0)
            defer { _ = Glibc.system("umount '\(dir)'") }
            let (store, keys, path) = try makeStore(in: dir)
            defer { store.close() }
            // Chunks short enough to be rows: deleting them dirties pages, which the commit writes to the WAL.
            let file = try EntityStore.newContentId()
            let cipher = try store.contentCipher(contentId: file)
            for i in 0..<300 {
                try store.putChunk(file: file, index: UInt64(i), sealed: try cipher.seal([UInt8](repeating: 7, count: 2000), index: UInt64(i)))
            }
            try store.commit()
            try store.sqlite.pool.writeWithoutTransaction { db in _ = try db.checkpoint(.truncate) }
            try #require(store.sqlite.walSize() == 0, "the WAL was not cut")
            try #require(store.sqlite.reserve?.isHeld == true, "no reserve on a disk with room for one")

            _ = Glibc.system("dd if=/dev/zero of='\(dir)/hog' bs=4k 2>/dev/null")
            try #require(store.sqlite.freeSpace() == 0, "the disk still has \(store.sqlite.freeSpace()) bytes free")

            #expect(try store.deleteChunks(file: file) == 300)
            #expect(throws: Never.self, "the commit of the deletes failed") { try store.commit() }
            #expect(store.sqlite.reserve?.isHeld == false, "the reserve was not given back")
            store.close()
            unlink(dir + "/hog")
            let reopened = try EntityStore.open(at: path, keys: keys)
            defer { reopened.close() }
            #expect(try reopened.sealedChunks(file: file, first: 0, last: 299).isEmpty, "the deleted chunks came back")
        }
    }
}
