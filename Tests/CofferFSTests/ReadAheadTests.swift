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

    /// A file written whole and committed over a real server, then a coherent filesystem on it (a mount).
    private struct Served {
        let made: TestStore, dir: String, ino: InodeNumber, contentId: UInt64, model: [UInt8]
        static let cs = 32768
        init(chunks: Int, seed: UInt64) throws {
            let dir = try makeTempDir()
            let made = try TestStore.create(.postgres, in: dir, name: SQLiteBackend.fileName, chunkSize: Self.cs)
            var g = SplitMix64(seed: seed)
            let model = g.bytes(chunks * Self.cs)
            let fs = try Self.mount(made, dir)
            defer { fs.shutdown() }
            let ino = try fs.create(parent: root, name: Array("f".utf8), mode: 0o644, flags: O_RDWR, caller: caller).0.ino
            _ = try model.withUnsafeBytes { try fs.write(ino, handle: .none, offset: 0, data: $0) }
            try fs.commit()
            (self.dir, self.made, self.model, self.ino) = (dir, made, model, ino)
            contentId = try required(fs.inodes[ino]?.record.contentId)
        }
        func mount() throws -> CofferFileSystem { try Self.mount(made, dir) }
        private static func mount(_ made: TestStore, _ dir: String) throws -> CofferFileSystem {
            let store = try made.open()
            try #require(store.backend as? PostgresBackend).coherent = true
            store.shareWithOtherMounts(floor: 0)
            var options = CofferFileSystem.Options()
            options.coherent = true
            return try CofferFileSystem(store: store, chunkSize: cs, options: options, statfsPath: dir, logger: Logger(label: "test"))
        }
    }

    /// A chunk the server changed (a byte flipped, its tag left alone) is fetched ahead like any other and
    /// still fails to open: the read that reaches it is EIO, never other bytes, and the rest reads exact.
    @Test func aDamagedChunkFetchedAheadIsEIOAndTheRestReads() throws {
        let served = try Served(chunks: 32, seed: 0xDA4A6E)
        defer { try? FileManager.default.removeItem(atPath: served.dir) }
        let schema = PostgresIdentifier.quoted(try required(served.made.location).container)
        let file = Int64(bitPattern: served.contentId)
        try TestPostgres.cluster().psql(
            "UPDATE \(schema).chunks SET value = set_byte(value, 100, get_byte(value, 100) # 1) WHERE file = \(file) AND idx = 20")
        let fs = try served.mount()
        defer { fs.shutdown() }
        let step = 4 * Served.cs
        for offset in stride(from: 0, to: served.model.count, by: step) {
            if (offset / Served.cs...(offset + step) / Served.cs - 1).contains(20) {
                #expect(fsError { _ = try fs.read(served.ino, handle: .none, offset: UInt64(offset), size: step) } == .io)
            } else {
                #expect(try fs.read(served.ino, handle: .none, offset: UInt64(offset), size: step) == Array(served.model[offset..<offset + step]))
            }
        }
        #expect(try required(fs.readAhead).chunksTaken > 0, "the damaged chunk's neighbours came from reading ahead")
    }

    /// Over a real server: a file read in order comes back exact, served mostly from chunks fetched ahead,
    /// and a chunk rewritten after it was fetched is read as it is now, not as it was fetched.
    @Test func aFileReadInOrderOverAServerIsExactAndAChunkChangedSinceIsReadAnew() throws {
        let served = try Served(chunks: 96, seed: 0xA4EAD)
        defer { try? FileManager.default.removeItem(atPath: served.dir) }
        let cs = Served.cs, ino = served.ino
        var model = served.model, g = SplitMix64(seed: 0xF4E54)
        let fs = try served.mount()
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
