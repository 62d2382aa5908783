import CofferTestSupport
import Foundation
import Logging
import Synchronization
import Testing

@testable import CofferFS
@testable import CofferStore
import CofferStoreTestSupport

/// Chunks fetched ahead of a reader going through a file in order (coherent mounts, a server's store).
@Suite("Reading ahead")
struct ReadAheadTests {
    /// A fake store: every chunk's sealed bytes are its index, and every fetch is noted.
    private final class Fetched: @unchecked Sendable {
        let ranges = Mutex<[ClosedRange<UInt64>]>([])
    }

    @Test func aReadThatGoesOnStartsTheNextWindowAndEachChunkIsHandedOutOnce() {
        let seen = Fetched()
        let ahead = ReadAhead { _, first, last in
            seen.ranges.withLock { $0.append(first...last) }
            return (first...last).map { ($0, [UInt8](repeating: UInt8($0 & 0xFF), count: 100)) }
        }
        ahead.didRead(content: 7, first: 0, last: 3, count: 1000)
        ahead.settle()
        #expect(seen.ranges.withLock { $0 }.isEmpty, "a first read says nothing about the next")
        ahead.didRead(content: 7, first: 4, last: 7, count: 1000)
        ahead.settle()
        #expect(seen.ranges.withLock { $0 }.sorted { $0.lowerBound < $1.lowerBound } == [8...23, 24...39], "a window of 32 chunks in two parts")
        let taken = ahead.take(content: 7, first: 8, last: 11)
        #expect(taken.keys.sorted() == [8, 9, 10, 11] && taken[9] == [UInt8](repeating: 9, count: 100))
        #expect(ahead.take(content: 7, first: 8, last: 11).isEmpty, "handed out once")
        #expect(ahead.take(content: 8, first: 12, last: 15).isEmpty, "another file's chunks are its own")
        // Less than a window is left ahead of chunk 11: the next part starts; after chunk 15, 40 are ahead.
        ahead.didRead(content: 7, first: 8, last: 11, count: 1000)
        ahead.didRead(content: 7, first: 12, last: 15, count: 1000)
        ahead.settle()
        #expect(seen.ranges.withLock { $0 }.suffix(1) == [40...55] && seen.ranges.withLock { $0 }.count == 3)
        // A jump elsewhere starts nothing; the file's end bounds a window.
        ahead.didRead(content: 7, first: 500, last: 503, count: 1000)
        ahead.didRead(content: 9, first: 0, last: 3, count: 10)
        ahead.didRead(content: 9, first: 4, last: 7, count: 10)
        ahead.settle()
        #expect(seen.ranges.withLock { $0 }.suffix(1) == [8...9])
        #expect(ahead.fetches == 4 && ahead.chunksTaken == 4)
    }

    @Test func heldChunksStayUnderTheLimit() {
        let big = ReadAhead.limit / 20  // bytes per chunk: 32 chunks ahead are far over the limit
        let ahead = ReadAhead { _, first, last in (first...last).map { ($0, [UInt8](repeating: 1, count: big)) } }
        var first: UInt64 = 0
        for _ in 0..<20 {
            ahead.didRead(content: 1, first: first, last: first + 3, count: 100_000)
            ahead.settle()
            #expect(ahead.heldBytes <= ReadAhead.limit)
            first += 4
        }
    }

    /// Over a real server: a file read in order comes back exact, served mostly from chunks fetched ahead,
    /// and a chunk rewritten after it was fetched is read as it is now, not as it was fetched.
    @Test func aFileReadInOrderOverAServerIsExactAndAChunkChangedSinceIsReadAnew() throws {
        let cs = 32768
        let dir = try makeTempDir()
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let made = try TestStore.create(.postgres, in: dir, name: SQLiteBackend.fileName, chunkSize: cs)
        func mount() throws -> CofferFileSystem {
            let store = try made.open()
            try #require(store.backend as? PostgresBackend).coherent = true
            store.shareWithOtherMounts(floor: 0)
            var options = CofferFileSystem.Options()
            options.coherent = true
            return try CofferFileSystem(store: store, chunkSize: cs, options: options, statfsPath: dir, logger: Logger(label: "test"))
        }
        var g = SplitMix64(seed: 0xA4EAD)
        var model = g.bytes(96 * cs)
        var fs = try mount()
        let ino = try fs.create(parent: root, name: Array("f".utf8), mode: 0o644, flags: O_RDWR, caller: caller).0.ino
        _ = try model.withUnsafeBytes { try fs.write(ino, handle: .none, offset: 0, data: $0) }
        try fs.commit()
        fs.shutdown()

        fs = try mount()
        defer { fs.shutdown() }
        let ahead = try #require(fs.readAhead)
        let step = 4 * cs  // the kernel's 128 KiB
        var offset = 0
        while offset < model.count / 2 {
            #expect(try fs.read(ino, handle: .none, offset: UInt64(offset), size: step) == Array(model[offset..<offset + step]))
            offset += step
        }
        ahead.settle()
        // Chunk 60 was fetched ahead; now it changes here, and the read that reaches it must see that.
        let fresh = g.bytes(cs)
        _ = try fresh.withUnsafeBytes { try fs.write(ino, handle: .none, offset: UInt64(60 * cs), data: $0) }
        model.replaceSubrange(60 * cs..<61 * cs, with: fresh)
        try fs.commit()
        while offset < model.count {
            #expect(try fs.read(ino, handle: .none, offset: UInt64(offset), size: step) == Array(model[offset..<offset + step]))
            offset += step
        }
        #expect(ahead.fetches > 0 && ahead.chunksTaken >= 48, "most chunks came from reading ahead (\(ahead.chunksTaken))")
    }
}
