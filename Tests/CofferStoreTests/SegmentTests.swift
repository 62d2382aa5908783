import CFileSpace
import CofferCrypto
import Foundation
import GRDB
import CofferTestSupport
import Synchronization
import Testing
@testable import CofferStore
import CofferStoreTestSupport

/// Large chunks in segment files (docs/FORMAT.md, "Segments"): written once, read back as they were
/// sealed, their space given back after deletes, and what a crash or a rollback left cleaned up.
/// A store holding, for each of `chunks`, a new file of that many test chunks (`putTestChunks`), committed and
/// closed: the content ids, in order.
private func committedStore(in dir: String, chunks: [(count: Int, seed: UInt8)]) throws -> (keys: ContainerKeys, path: String, files: [UInt64]) {
    let (store, keys, path) = try makeStore(in: dir)
    var files: [UInt64] = []
    for c in chunks {
        let file = try EntityStore.newContentId()
        try store.putTestChunks(file: file, count: c.count, seed: c.seed, keys: keys)
        files.append(file)
    }
    try store.commit()
    store.close()
    return (keys, path, files)
}

@Suite("Content in segment files")
struct SegmentTests {
    func segmentFiles(_ path: String) -> [String: Int] {
        let dir = (path as NSString).deletingLastPathComponent + "/segments"
        var out: [String: Int] = [:]
        for name in (try? FileManager.default.contentsOfDirectory(atPath: dir)) ?? [] {
            var st = stat()
            if stat(dir + "/" + name, &st) == 0 { out[name] = Int(st.st_blocks) * 512 }
        }
        return out
    }

    /// 64 KiB chunks go to segments (the database file and its WAL stay small), small ones stay in their
    /// rows; both read back, before and after the commit and after a reopen; a segment is full at 64 MiB.
    @Test func largeChunksAreWrittenOnceIntoSegments() throws {
        try withTempDir { dir in
            let (store, keys, path) = try makeStore(in: dir)
            let big = try EntityStore.newContentId(), small = try EntityStore.newContentId()
            try store.putTestChunks(file: big, count: 1100, seed: 3, keys: keys)  // 68.75 MiB: two segments
            let cipher = try store.contentCipher(contentId: small)
            try store.putChunk(file: small, index: 0, sealed: try cipher.seal([UInt8](repeating: 9, count: 100), index: 0))
            try expectTestChunks(store, file: big, count: 1100, seed: 3)  // uncommitted: through the writer
            try store.commit()
            try expectTestChunks(store, file: big, count: 1100, seed: 3)  // committed: through the readers
            let files = segmentFiles(path)
            #expect(Set(files.keys) == ["1", "2"], "\(files)")
            #expect(files.values.reduce(0, +) >= 1100 * 65536)
            #expect(SQLiteBackend.sizeOnDisk(path: path) < UInt64(1100 * 65536 + (8 << 20)), "content was written twice")
            let inRows = try store.sqlite.pool.read { db in
                try Int.fetchOne(db, sql: "SELECT count(*) FROM chunks WHERE seg IS NULL AND length(value) > 0")
            }
            #expect(inRows == 1, "only the small chunk is held in its row")
            store.close()

            let reopened = try EntityStore.open(at: path, keys: keys)
            defer { reopened.close() }
            try expectTestChunks(reopened, file: big, count: 1100, seed: 3)
            let sealed = try #require(try reopened.sealedChunks(file: small, first: 0, last: 0).first)
            var out = [UInt8](repeating: 0, count: 65536)
            let n = try out.withUnsafeMutableBytes { try reopened.contentCipher(contentId: small).open(sealed.sealed, index: 0, into: $0) }
            #expect(n == 100 && out[0] == 9)
        }
    }

    /// Appends are gathered and written in whole blocks: with O_DIRECT a commit pads the last block and
    /// the next append starts at the next one; through the page cache the next append goes on in that
    /// block. Either way every chunk reads back before the commit (from the gathered bytes, or partly from
    /// the file), after it, and after a reopen.
    @Test(arguments: [true, false]) func appendsAreGatheredIntoWholeBlocks(directWrites: Bool) throws {
        try withTempDir { dir in
            // O_DIRECT only where the test directory's filesystem takes it (tmpfs before Linux 6.6 does not):
            // then the appender must have fallen back to the page cache layout.
            let direct = directWrites && Self.takesDirectWrites(dir)
            let (store, keys, path) = try makeStore(in: dir)
            store.sqlite.segments.directWrites = directWrites
            let odd = try EntityStore.newContentId(), more = try EntityStore.newContentId()
            let cipher = try store.contentCipher(contentId: odd)
            let plain = (0..<3).map { i in [UInt8](repeating: UInt8(40 + i), count: 10000) }
            for (i, p) in plain.enumerated() { try store.putChunk(file: odd, index: UInt64(i), sealed: try cipher.seal(p, index: UInt64(i))) }
            #expect(store.sqlite.segments.appender?.direct == direct, "O_DIRECT on this filesystem")
            func expectOdd(_ s: EntityStore) throws {
                let c = try s.contentCipher(contentId: odd)
                let sealed = try s.sealedChunks(file: odd, first: 0, last: 2)
                #expect(sealed.count == 3)
                for (i, chunk) in sealed.enumerated() {
                    var out = [UInt8](repeating: 0, count: 10000)
                    let n = try out.withUnsafeMutableBytes { try c.open(chunk.sealed, index: UInt64(i), into: $0) }
                    #expect(n == 10000 && out == plain[i])
                }
            }
            try expectOdd(store)  // gathered, not yet written
            try store.commit()
            let sealedLength = ContentCipher.sealedLength(10000, sealing: .blocks)
            let size = try store.sqlite.pool.read { db in try Int.fetchOne(db, sql: "SELECT size FROM segments WHERE id = 1") }
            #expect(size == (direct ? (3 * sealedLength + 4095) / 4096 * 4096 : 3 * sealedLength))
            // 40 chunks of 64 KiB: the gathered bytes are written every MiB, so reads before the commit
            // span the file and the gathered bytes.
            try store.putTestChunks(file: more, count: 40, seed: 7, keys: keys)
            let first = try store.sqlite.writer { db in
                try Int.fetchOne(db, sql: "SELECT off FROM chunks WHERE file = ? AND idx = 0", arguments: [Int64(bitPattern: more)])
            }
            #expect(first == size)
            try expectOdd(store)
            try expectTestChunks(store, file: more, count: 40, seed: 7)
            try store.commit()
            try expectOdd(store)
            try expectTestChunks(store, file: more, count: 40, seed: 7)
            store.close()

            let reopened = try EntityStore.open(at: path, keys: keys)
            defer { reopened.close() }
            reopened.sqlite.segments.directWrites = directWrites
            try expectOdd(reopened)
            try expectTestChunks(reopened, file: more, count: 40, seed: 7)
            let later = try EntityStore.newContentId()
            try reopened.putTestChunks(file: later, count: 2, seed: 9, keys: keys)  // appends after a reopen
            try reopened.commit()
            try expectTestChunks(reopened, file: later, count: 2, seed: 9)
            try expectOdd(reopened)
            try expectTestChunks(reopened, file: more, count: 40, seed: 7)
        }
    }

    /// With O_DIRECT, a gathered MiB is written while the next chunks are gathered: the chunks of a write still
    /// under way read back from memory (the file does not hold them yet), and once it lands, from the file;
    /// the commit waits for it.
    @Test func chunksBeingWrittenReadBackFromMemory() throws {
        try withTempDir { dir in
            guard Self.takesDirectWrites(dir) else {
                Issue.record("no O_DIRECT in \(dir): the write under way is not exercised")
                return
            }
            let (store, keys, path) = try makeStore(in: dir)
            // Low on space, appends are written at once, after the held flight: the test would wait for itself.
            try #require(!store.sqlite.isLowOnSpace(), "\(dir) is low on space")
            let segments = store.sqlite.segments
            let gate = DispatchSemaphore(value: 0)
            segments.flightGate = gate
            defer { gate.signal() }
            let file = try EntityStore.newContentId()
            // 20 chunks of 64 KiB: one MiB is handed to the flight, the rest stays gathered.
            try store.putTestChunks(file: file, count: 20, seed: 5, keys: keys)
            var st = stat()
            #expect(stat(dir + "/segments/1", &st) == 0 && st.st_size == 0, "the flight is held: the file holds nothing yet")
            try expectTestChunks(store, file: file, count: 20, seed: 5)
            // The commit names those bytes: it waits for the flight.
            let committed = DispatchSemaphore(value: 0)
            let outcome = Mutex<Result<Void, StoreError>?>(nil)
            DispatchQueue.global().async {
                let r = Result<Void, StoreError> { () throws(StoreError) in try store.commit() }
                outcome.withLock { $0 = r }
                committed.signal()
            }
            let waited = committed.wait(timeout: .now() + .milliseconds(300)) == .timedOut
            #expect(waited, "the commit did not wait for the flight")
            segments.flightGate = nil
            gate.signal()
            if waited { committed.wait() }
            try outcome.withLock { $0 }?.get()
            #expect(stat(dir + "/segments/1", &st) == 0 && st.st_size >= 20 * 65536, "the commit wrote every chunk")
            try expectTestChunks(store, file: file, count: 20, seed: 5)
            let more = try EntityStore.newContentId()
            try store.putTestChunks(file: more, count: 40, seed: 8, keys: keys)  // two flights, no gate
            try expectTestChunks(store, file: more, count: 40, seed: 8)
            try store.commit()
            store.close()
            let reopened = try EntityStore.open(at: path, keys: keys)
            defer { reopened.close() }
            try expectTestChunks(reopened, file: file, count: 20, seed: 5)
            try expectTestChunks(reopened, file: more, count: 40, seed: 8)
        }
    }

    /// Whether a 4 KiB O_DIRECT write succeeds in `dir`.
    static func takesDirectWrites(_ dir: String) -> Bool {
        let fd = open(dir + "/direct-probe", O_RDWR | O_CREAT | O_EXCL, 0o600)
        guard fd >= 0 else { return false }
        defer {
            close(fd)
            unlink(dir + "/direct-probe")
        }
        let block = UnsafeMutableRawBufferPointer.allocate(byteCount: 4096, alignment: 4096)
        defer { block.deallocate() }
        block.initializeMemory(as: UInt8.self, repeating: 0)
        return coffer_set_direct(fd, 1) == 0 && pwrite(fd, block.baseAddress, 4096, 0) == 4096
    }

    /// Low on space, an append goes to the file at once (through the page cache), so a full disk fails
    /// the append that does not fit instead of the commit that would write it later.
    @Test func appendsGoToTheFileAtOnceWhenLowOnSpace() throws {
        try withTempDir { dir in
            let segments = Segments(directory: dir)
            try segments.openAppender(1, end: 0, create: true)
            defer { segments.closeAppender() }
            func fileSize() -> Int {
                var st = stat()
                return stat(dir + "/1", &st) == 0 ? Int(st.st_size) : -1
            }
            let chunks = [[UInt8](repeating: 7, count: 10000), [UInt8](repeating: 8, count: 9000)]
            let first = try chunks[0].withUnsafeBytes { try segments.append($0) }
            #expect(first == 0 && fileSize() == 0, "gathered, not written")
            let second = try chunks[1].withUnsafeBytes { try segments.append($0, writeThrough: true) }
            #expect(second == 10000 && fileSize() == 19000, "written through")
            #expect(segments.appender?.direct == false)
            for (offset, chunk) in zip([first, second], chunks) {
                let back = segments.read(1, offset: offset, length: Int64(chunk.count)) { [UInt8]($0) }
                #expect(back == chunk)
            }
        }
    }

    /// Deleting gives the space back once the delete is committed: a segment no row names goes, and the
    /// dead chunks of one still in use are punched out; the chunks that stay read back.
    @Test func deletesGiveSegmentSpaceBack() throws {
        try withTempDir { dir in
            let (store, keys, path) = try makeStore(in: dir)
            let first = try EntityStore.newContentId(), second = try EntityStore.newContentId()
            try store.putTestChunks(file: first, count: 1030, seed: 1, keys: keys)  // fills segment 1 (1023), starts 2
            try store.putTestChunks(file: second, count: 100, seed: 2, keys: keys)  // in segment 2
            try store.commit()
            let before = segmentFiles(path)
            #expect(before["1"] ?? 0 > 60 << 20 && before["2"] ?? 0 > 6 << 20, "\(before)")

            _ = try store.deleteChunks(file: first)
            try store.commit()
            let after = segmentFiles(path)
            #expect(after["1"] == nil, "segment 1 holds nothing live and stays: \(after)")
            #expect(after["2"] ?? 0 < 100 * 65536 + (1 << 20), "the dead chunks in segment 2 were not punched out: \(after)")
            try expectTestChunks(store, file: second, count: 100, seed: 2)

            // Rewriting a file in place frees its old chunks as well.
            try store.putTestChunks(file: second, count: 100, seed: 5, keys: keys)
            try store.commit()
            let rewritten = segmentFiles(path).values.reduce(0, +)
            #expect(rewritten < 100 * 65536 + (1 << 20), "the replaced chunks still take space: \(rewritten)")
            try expectTestChunks(store, file: second, count: 100, seed: 5)
            let live = try store.sqlite.pool.read { db in try Int64.fetchOne(db, sql: "SELECT sum(live) FROM segments") }
            #expect(live == Int64(100 * ContentCipher.sealedLength(65536, sealing: .blocks)))
            store.close()
        }
    }

    /// Deleting a large file's rows (a removed file, an orphan at mount): 40,000 chunk rows, more than a
    /// 1 GiB file of 32 KiB chunks has, go in a few statements on a freshly opened writer; their ranges, end to end in
    /// their segment, are listed as one; their live counts fall to zero. With statement journals spilling
    /// to temporary files past 1 MiB this once failed with SQLITE_FULL (docs/MEASUREMENTS.md, session 17).
    @Test func aFileOfManyChunksIsDeleted() throws {
        try withTempDir { dir in
            let (store, keys, path) = try makeStore(in: dir)
            store.sqlite.segmentThreshold = 64  // small chunks into segments: many rows, little to write
            let file = try EntityStore.newContentId(), kept = try EntityStore.newContentId()
            let cipher = try store.contentCipher(contentId: file)
            let count = 40_000
            try store.batch {
                for i in 0..<count {
                    try store.putChunk(
                        file: file, index: UInt64(i), sealed: try cipher.seal([UInt8](repeating: UInt8(i & 0xFF), count: 64), index: UInt64(i)))
                }
            }
            let inSegments = try store.sqlite.writer { db in try Int.fetchOne(db, sql: "SELECT count(*) FROM chunks WHERE seg IS NOT NULL") }
            #expect(inSegments == count)
            try store.putTestChunks(file: kept, count: 2, seed: 7, keys: keys)
            try store.commit()
            store.close()

            let reopened = try EntityStore.open(at: path, keys: keys)
            defer { reopened.close() }
            #expect(try reopened.deleteChunks(file: file) == count)
            let freed = try reopened.sqlite.writer { db in try Int.fetchOne(db, sql: "SELECT count(*) FROM temp.freed_chunks") }
            #expect(freed == 1, "chunks lying end to end are freed as one range")
            try reopened.commit()
            #expect(try reopened.chunkIndices(file: file).isEmpty)
            let live = try reopened.sqlite.pool.read { db in try Int64.fetchOne(db, sql: "SELECT sum(live) FROM segments") }
            #expect(live == Int64(2 * ContentCipher.sealedLength(65536, sealing: .blocks)), "the deleted rows are still counted live")
            try expectTestChunks(reopened, file: kept, count: 2, seed: 7)
        }
    }

    /// A group that is rolled back takes the segment it started with it; what a killed process left
    /// (bytes after the last commit, a wrong live count) is mended at the next open for writing, and
    /// nothing committed is lost.
    @Test func rollbacksAndCrashLeftoversAreCleanedUp() throws {
        try withTempDir { dir in
            let (store, keys, path) = try makeStore(in: dir)
            let kept = try EntityStore.newContentId()
            try store.putTestChunks(file: kept, count: 10, seed: 4, keys: keys)
            try store.commit()
            let committed = try #require(segmentFiles(path)["1"])

            // A group SQLite drops (as on a full disk): its rows go, the segment it started goes, and the
            // bytes it appended to segment 1 are cut off when appending starts again.
            let lost = try EntityStore.newContentId()
            try store.putTestChunks(file: lost, count: 1030, seed: 6, keys: keys)
            #expect(segmentFiles(path)["2"] != nil)
            try store.sqlite.writer { db in try db.execute(sql: "ROLLBACK") }
            #expect(try store.chunkIndices(file: lost).isEmpty)
            #expect(segmentFiles(path)["2"] == nil, "the segment of a dropped group was kept")
            try store.putTestChunks(file: lost, count: 1, seed: 6, keys: keys)
            try store.commit()
            #expect(try #require(segmentFiles(path)["1"]) <= committed + 2 * 65536)
            _ = try store.deleteChunks(file: lost)
            try store.commit()
            store.close()

            let segments = (path as NSString).deletingLastPathComponent + "/segments"
            // A file no row lists, and a segment file padded with bytes after its committed size.
            try Data(repeating: 1, count: 70000).write(to: URL(fileURLWithPath: segments + "/7"))
            let h = try #require(FileHandle(forWritingAtPath: segments + "/1"))
            h.seekToEndOfFile()
            h.write(Data(repeating: 2, count: 200_000))
            try h.close()
            // A wrong live count (bookkeeping, mended from the rows).
            try editStoreFile(path, "UPDATE segments SET live = 0")

            let reopened = try EntityStore.open(at: path, keys: keys)
            defer { reopened.close() }
            // A file no row lists is left alone (it may belong to a newer state of the store, which the
            // rollback check is about to refuse); new segments are numbered above it.
            #expect(segmentFiles(path)["7"] != nil, "a file no row lists was removed")
            reopened.removeStrayFiles()  // what a mount does once the rollback check passed
            #expect(segmentFiles(path)["7"] == nil, "a file no row lists was kept")
            try expectTestChunks(reopened, file: kept, count: 10, seed: 4)
            let live = try reopened.sqlite.pool.read { db in try Int64.fetchOne(db, sql: "SELECT sum(live) FROM segments") }
            #expect(live == Int64(10 * ContentCipher.sealedLength(65536, sealing: .blocks)))
            // Appends continue after the committed size, over what the crash left.
            try reopened.putTestChunks(file: lost, count: 2, seed: 8, keys: keys)
            try reopened.commit()
            try expectTestChunks(reopened, file: lost, count: 2, seed: 8)
            #expect(try #require(segmentFiles(path)["1"]) <= committed + 4 * 65536)
        }
    }

    /// A row whose length was changed to more than a chunk can be (40 MiB) is deleted: its range is not
    /// listed as freed, so the committed chunks after it in the segment are not punched out.
    @Test func aDamagedLengthPunchesNothingElse() throws {
        try withTempDir { dir in
            let (keys, path, files) = try committedStore(in: dir, chunks: [(2, 1), (1, 2), (3, 3)])
            let (before, victim, after) = (files[0], files[1], files[2])
            try editStoreFile(path, "UPDATE chunks SET len = ? WHERE file = ?", [40 << 20, Int64(victim)])

            let reopened = try EntityStore.open(at: path, keys: keys)
            defer { reopened.close() }
            #expect(try reopened.deleteChunks(file: victim) == 1)
            try reopened.commit()
            try expectTestChunks(reopened, file: before, count: 2, seed: 1)
            try expectTestChunks(reopened, file: after, count: 3, seed: 3)
        }
    }

    /// A row whose segment columns were changed to name another file's chunk (they are not sealed): deleting
    /// it punches nothing a committed row still names, so the other file reads back.
    @Test func aRowNamingAnotherChunkPunchesNothingOfIt() throws {
        try withTempDir { dir in
            let (keys, path, files) = try committedStore(in: dir, chunks: [(2, 1), (2, 2)])
            let (liar, victim) = (files[0], files[1])
            try editStoreFile(
                path, "UPDATE chunks SET off = (SELECT off FROM chunks WHERE file = ? AND idx = 1) WHERE file = ? AND idx = 0",
                [Int64(bitPattern: victim), Int64(bitPattern: liar)])

            let reopened = try EntityStore.open(at: path, keys: keys)
            defer { reopened.close() }
            #expect(try reopened.deleteChunks(file: liar) == 2)
            try reopened.commit()
            try expectTestChunks(reopened, file: victim, count: 2, seed: 2)
        }
    }

    /// The `segments` table damaged (its rows are not sealed): emptied, the stray-file sweep of a mount still
    /// keeps every segment a chunk row names; a length near 2^63 or NULL in a row neither overflows the live
    /// counts nor keeps the store from opening, and its delete goes through.
    @Test func damagedSegmentColumnsCostNoOtherChunk() throws {
        try withTempDir { dir in
            let (keys, path, files) = try committedStore(in: dir, chunks: [(3, 4), (1, 5), (1, 6)])
            let (kept, odd, null) = (files[0], files[1], files[2])
            try editStoreFile(path, "UPDATE chunks SET len = ? WHERE file = ?", [Int64.max, Int64(bitPattern: odd)])
            try editStoreFile(path, "UPDATE chunks SET len = NULL WHERE file = ?", [Int64(bitPattern: null)])
            var reopened = try EntityStore.open(at: path, keys: keys)
            #expect(try reopened.deleteChunks(file: odd) == 1)
            #expect(try reopened.deleteChunks(file: null) == 1)
            try reopened.commit()
            try expectTestChunks(reopened, file: kept, count: 3, seed: 4)
            reopened.close()

            try editStoreFile(path, "DELETE FROM segments")
            reopened = try EntityStore.open(at: path, keys: keys)
            defer { reopened.close() }
            reopened.removeStrayFiles()
            #expect(segmentFiles(path)["1"] != nil, "the segment the rows name is still there")
            try expectTestChunks(reopened, file: kept, count: 3, seed: 4)
        }
    }

    /// A segment's bytes changed, a row pointed at another chunk's bytes or outside its file, a segment
    /// missing: that chunk fails authentication, nothing else is affected.
    @Test func tamperedSegmentsFailAuthentication() throws {
        try withTempDir { dir in
            let (keys, path, files) = try committedStore(in: dir, chunks: [(4, 1)])
            let file = files[0]
            let segment = (path as NSString).deletingLastPathComponent + "/segments/1"
            let queue = try DatabaseQueue(path: path)
            let offsets = try queue.read { db in
                try Int64.fetchAll(db, sql: "SELECT off FROM chunks WHERE file = ? ORDER BY idx", arguments: [Int64(file)])
            }
            try #require(offsets.count == 4)
            // Chunk 0: a flipped byte in the segment. Chunk 1: its row points at chunk 2's bytes.
            // Chunk 3: its row points past the end of the file.
            let h = try #require(FileHandle(forUpdatingAtPath: segment))
            h.seek(toFileOffset: UInt64(offsets[0] + 100))
            let b = h.readData(ofLength: 1)
            h.seek(toFileOffset: UInt64(offsets[0] + 100))
            h.write(Data([b[0] ^ 1]))
            try h.close()
            try queue.write { db in
                try db.execute(sql: "UPDATE chunks SET off = ? WHERE file = ? AND idx = 1", arguments: [offsets[2], Int64(file)])
                try db.execute(sql: "UPDATE chunks SET off = 1000000000 WHERE file = ? AND idx = 3", arguments: [Int64(file)])
            }
            try queue.close()

            let reopened = try EntityStore.open(at: path, keys: keys, readOnly: true)
            let cipher = try reopened.contentCipher(contentId: file)
            var out = [UInt8](repeating: 0, count: 65536)
            for c in try reopened.sealedChunks(file: file, first: 0, last: 3) {
                let opened = Result { try out.withUnsafeMutableBytes { try cipher.open(c.sealed, index: c.index, into: $0) } }
                if c.index == 2 {
                    #expect((try? opened.get()) == 65536)
                } else {
                    #expect((try? opened.get()) == nil, "chunk \(c.index) opened")
                }
            }
            reopened.close()
            unlink(segment)
            let missing = try EntityStore.open(at: path, keys: keys, readOnly: true)
            defer { missing.close() }
            let gone = try missing.sealedChunks(file: file, first: 2, last: 2)
            #expect(gone.count == 1 && gone[0].sealed.isEmpty, "a missing segment reads as no bytes")
        }
    }

    /// Reads of several chunks go through a segment's mapping: one cut short while it is mapped (another process
    /// truncated it) reads as damage where it was cut, never as a crash (SIGBUS) and never as other bytes; what is
    /// left reads. A read of one chunk (copied with pread) sees the cut the same way.
    @Test func aSegmentCutWhileMappedReadsAsDamage() throws {
        try withTempDir { dir in
            let (keys, path, files) = try committedStore(in: dir, chunks: [(4, 1)])
            let file = files[0]
            let reading = try EntityStore.open(at: path, keys: keys, readOnly: true)
            defer { reading.close() }
            let cipher = try reading.contentCipher(contentId: file)
            var out = [UInt8](repeating: 0, count: 65536)
            func opened(_ first: UInt64, _ last: UInt64) throws -> [UInt64: Bool] {
                var result: [UInt64: Bool] = [:]
                for c in try reading.sealedChunks(file: file, first: first, last: last) {
                    result[c.index] = (try? out.withUnsafeMutableBytes { try cipher.open(c.sealed, index: c.index, into: $0) }) == 65536
                }
                return result
            }
            #expect(try opened(0, 3) == [0: true, 1: true, 2: true, 3: true], "before the cut")
            #expect(try opened(2, 2) == [2: true], "one chunk before the cut")
            #expect(truncate(dir + "/segments/1", 70_000) == 0)  // inside chunk 1, with chunk 0 whole
            let faults = ChunkReaders.faultsRepaired
            #expect(try opened(0, 3) == [0: true, 1: false, 2: false, 3: false], "the chunk before the cut reads, none past it")
            #expect(ChunkReaders.faultsRepaired > faults, "the cut pages were read through the mapping")
            #expect(try opened(2, 2)[2] != true, "one chunk past the cut, copied, opened")
        }
    }

    /// A hostile container: `segments` a symbolic link (the cleanup at open would remove numbered files
    /// wherever it points) is refused for writing; a FIFO where a segment should be reads as no bytes
    /// instead of hanging the reader.
    @Test func hostileSegmentFilesAreRefusedOrReadAsDamaged() throws {
        try withTempDir { dir in
            let (keys, path, files) = try committedStore(in: dir, chunks: [(2, 1)])
            let file = files[0]
            let segments = dir + "/segments"
            unlink(segments + "/1")
            #expect(mkfifo(segments + "/1", 0o600) == 0)
            let reading = try EntityStore.open(at: path, keys: keys, readOnly: true)
            let chunks = try reading.sealedChunks(file: file, first: 0, last: 1)
            #expect(chunks.count == 2 && chunks.allSatisfy { $0.sealed.isEmpty }, "a FIFO segment read as bytes")
            reading.close()

            let elsewhere = dir + "/elsewhere"
            try FileManager.default.createDirectory(atPath: elsewhere, withIntermediateDirectories: false)
            try Data([1]).write(to: URL(fileURLWithPath: elsewhere + "/5"))
            #expect(rename(segments, dir + "/moved") == 0 && symlink(elsewhere, segments) == 0)
            #expect(throws: StoreError.self) { _ = try EntityStore.open(at: path, keys: keys) }
            #expect(FileManager.default.fileExists(atPath: elsewhere + "/5"), "a file outside the container was removed")
        }
    }

    /// The snapshot `coffer copy` takes of a mounted store holds every chunk in its row.
    @Test func aSnapshotStandsAlone() throws {
        try withTempDir { dir in
            let (store, keys, _) = try makeStore(in: dir)
            defer { store.close() }
            let file = try EntityStore.newContentId()
            try store.putTestChunks(file: file, count: 20, seed: 7, keys: keys)
            try store.commit()
            try FileManager.default.createDirectory(atPath: dir + "/snap", withIntermediateDirectories: false)
            try store.snapshot(into: dir + "/snap/store.db")
            #expect(!FileManager.default.fileExists(atPath: dir + "/snap/segments"))
            let copy = try EntityStore.open(at: dir + "/snap/store.db", keys: keys, readOnly: true)
            defer { copy.close() }
            try expectTestChunks(copy, file: file, count: 20, seed: 7)
            let refs = try copy.sqlite.pool.read { db in try Int.fetchOne(db, sql: "SELECT count(*) FROM chunks WHERE seg IS NOT NULL") }
            #expect(refs == 0)
        }
    }
}
