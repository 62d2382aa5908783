import Foundation
import GRDB
import Glibc
import CofferTestSupport
import Testing
@testable import CofferFS
@testable import CofferStore
import CofferStoreTestSupport

@Suite("File content")
struct ContentTests {
    @Test(arguments: [4096, 65536])
    func createWriteRead(chunkSize: Int) throws {
        let f = try Fixture(chunkSize: chunkSize)
        defer { f.cleanup() }
        let (ino, h) = try f.create("hello.txt")
        #expect(try f.write(ino, h, at: 0, b("hello, world")) == 12)
        #expect(try f.fs.read(ino, handle: h, offset: 0, size: 100) == b("hello, world"))
        #expect(try f.fs.read(ino, handle: h, offset: 7, size: 5) == b("world"))
        #expect(try f.fs.read(ino, handle: h, offset: 12, size: 5) == [])
        #expect(try f.fs.read(ino, handle: h, offset: 1000, size: 5) == [])
        #expect(try f.fs.getattr(ino).size == 12)
        #expect(try f.write(ino, h, at: 0, []) == 0)
        f.fs.release(ino, handle: h)
        #expect(h == .none, "create hands out no handle: the kernel sends no RELEASE for it")
        #expect(try f.contents(ino) == b("hello, world"))
        // Opens hand out no handle either (a mount never sends OPEN); a handle never handed out is refused.
        #expect(try f.fs.open(ino, flags: O_RDWR, caller: caller).handle == .none)
        expectError(FSError.badHandle) { _ = try f.fs.read(ino, handle: 1, offset: 0, size: 1) }
        expectError(FSError.badHandle) { _ = try f.write(ino, 1, at: 0, [1]) }
    }

    /// Every read goes through whole and partial chunks; chunks sealed in blocks (new stores) and whole (older ones).
    @Test(arguments: [(4096, true), (32768, true), (32768, false)])
    func unalignedWritesSpanningChunksMatchAModel(cs: Int, blocks: Bool) throws {
        let f = try Fixture(chunkSize: cs, registry: blocks ? .standard : .wholeChunks)
        #expect(f.store.chunkSealing == (blocks ? .blocks : .whole))
        defer { f.cleanup() }
        let (ino, h) = try f.create("model")
        var model: [UInt8] = []
        var g = SplitMix64(seed: 0xF11E)
        func apply(_ offset: Int, _ data: [UInt8]) throws {
            try f.write(ino, h, at: UInt64(offset), data)
            if model.count < offset + data.count { model += [UInt8](repeating: 0, count: offset + data.count - model.count) }
            model.replaceSubrange(offset..<offset + data.count, with: data)
        }
        // Hand-picked edges: across one boundary, exactly one chunk, a chunk and a byte, inside one chunk.
        try apply(1000, g.bytes(10000))
        try apply(cs - 1, g.bytes(2))
        try apply(2 * cs, g.bytes(cs))
        try apply(3 * cs - 1, g.bytes(cs + 2))
        try apply(5, g.bytes(3))
        try apply(10 * cs + 17, g.bytes(1))  // beyond EOF: leaves a hole
        #expect(try f.contents(ino) == model)
        // Random writes and truncates, checked against the model.
        for step in 0..<300 {
            switch Int.random(in: 0..<10, using: &g) {
            case 0:
                let size = Int.random(in: 0...12 * cs, using: &g)
                _ = try f.fs.setattr(ino, changes: AttributeChanges(size: UInt64(size)), handle: h, caller: caller)
                if size < model.count { model.removeSubrange(size...) } else { model += [UInt8](repeating: 0, count: size - model.count) }
            default:
                let offset = Int.random(in: 0...12 * cs, using: &g)
                let length = Int.random(in: 1...3 * cs, using: &g)
                try apply(offset, g.bytes(length))
            }
            #expect(try f.fs.getattr(ino).size == UInt64(model.count), "step \(step)")
            if step % 5 == 0 {
                let offset = Int.random(in: 0...model.count, using: &g)
                let size = Int.random(in: 1...4 * cs, using: &g)
                let got = try f.fs.read(ino, handle: h, offset: UInt64(offset), size: size)
                #expect(got == Array(model[offset..<min(model.count, offset + size)]), "step \(step) read \(offset)+\(size)")
            }
        }
        #expect(try f.fs.read(ino, handle: h, offset: 0, size: model.count + 10) == model)
        f.fs.release(ino, handle: h)
        try f.remount()
        #expect(try f.contents(ino) == model, "after remount")
        // Committed chunks, read from the store: parts of one chunk, across chunks, past the end.
        for _ in 0..<60 {
            let offset = Int.random(in: 0...model.count, using: &g), size = Int.random(in: 1...2 * cs, using: &g)
            let got = try f.fs.read(ino, handle: .none, offset: UInt64(offset), size: size)
            #expect(got == Array(model[offset..<min(model.count, offset + size)]), "after remount, read \(offset)+\(size)")
        }
    }

    @Test func sparseWriteFarBeyondEOFReadsZeros() throws {
        let f = try Fixture(chunkSize: 65536)
        defer { f.cleanup() }
        let (ino, h) = try f.create("sparse")
        try f.write(ino, h, at: 0, b("head"))
        let far: UInt64 = 100 * 65536 + 123
        try f.write(ino, h, at: far, b("tail"))
        #expect(try f.fs.getattr(ino).size == far + 4)
        let middle = try f.fs.read(ino, handle: h, offset: 4, size: 300_000)
        let middleIsZero = middle.allSatisfy { $0 == 0 }
        #expect(middle.count == 300_000 && middleIsZero)
        #expect(try f.fs.read(ino, handle: h, offset: far - 2, size: 10) == [0, 0] + b("tail"))
        let cid = try #require(f.contentId(ino))
        #expect(try f.store.chunkIndices(file: cid) == [0, 100], "only the written chunks are stored")
    }

    @Test func fiveMiBRandomRoundTrip() throws {
        for cs in [4096, 65536] {
            let f = try Fixture(chunkSize: cs)
            defer { f.cleanup() }
            var g = SplitMix64(seed: UInt64(cs))
            let data = g.bytes(5 << 20)
            let (ino, h) = try f.create("big")
            // Written in uneven pieces, as a stream would be.
            var offset = 0
            while offset < data.count {
                let n = min(data.count - offset, 131_072 + 333)
                try f.write(ino, h, at: UInt64(offset), Array(data[offset..<offset + n]))
                offset += n
            }
            f.fs.release(ino, handle: h)
            try f.fs.commit()
            #expect(try f.contents(ino) == data)
            let cid = try #require(f.contentId(ino))
            #expect(try f.store.chunkIndices(file: cid).count == (5 << 20) / cs)
            try f.remount()
            #expect(try f.contents(ino) == data, "after remount (chunk size \(cs))")
        }
    }

    @Test func writesPastFourGiB() throws {
        let f = try Fixture(chunkSize: 65536)
        defer { f.cleanup() }
        let (ino, h) = try f.create("huge")
        let offset: UInt64 = (5 << 30) + 65530  // straddles a chunk boundary above 4 GiB
        let payload = (0..<100).map { UInt8($0) }
        try f.write(ino, h, at: offset, payload)
        try f.write(ino, h, at: 1 << 32, b("4G"))
        #expect(try f.fs.getattr(ino).size == offset + 100)
        #expect(try f.fs.read(ino, handle: h, offset: offset, size: 200) == payload)
        #expect(try f.fs.read(ino, handle: h, offset: 1 << 32, size: 2) == b("4G"))
        #expect(try f.fs.read(ino, handle: h, offset: 1 << 30, size: 4096) == [UInt8](repeating: 0, count: 4096))
        let cid = try #require(f.contentId(ino))
        #expect(try f.store.chunkIndices(file: cid) == [65536, (offset / 65536), (offset / 65536) + 1])
        f.fs.release(ino, handle: h)
        try f.remount()
        let h2 = try f.fs.open(ino, flags: O_RDONLY, caller: caller).handle
        #expect(try f.fs.read(ino, handle: h2, offset: offset, size: 100) == payload)
        f.fs.release(ino, handle: h2)
        // The largest offsets are refused, not wrapped.
        let h3 = try f.fs.open(ino, flags: O_WRONLY, caller: caller).handle
        expectError(FSError.fileTooBig) { _ = try f.write(ino, h3, at: UInt64(Int64.max) - 1, [1, 2, 3]) }
        expectError(FSError.fileTooBig) { _ = try f.write(ino, h3, at: UInt64.max - 1, [1, 2, 3]) }
        f.fs.release(ino, handle: h3)
    }

    /// A chunk map lists at most 2^20 pages: a write that needs one more page is refused (EFBIG) before
    /// it is taken, never turned into an inode that no read accepts; pages already listed still take writes.
    @Test func aMapAtItsPageLimitTakesNoNewPage() throws {
        let perPage = UInt64(ChunkMapRoot.positionsPerPage)
        let full = (0..<UInt64(ChunkMapRoot.maxPages)).map { ChunkMapPageRef(page: $0 * 2, version: 1) }
        let map = ChunkMap(file: 1, root: .paged(full))
        #expect(map.fits(0, perPage - 1), "a listed page")
        #expect(map.fits(2 * perPage + 5, 2 * perPage + 300), "another listed page")
        #expect(!map.fits(perPage, perPage), "page 1 is not listed: one too many")
        #expect(!map.fits(2 * perPage - 1, 2 * perPage), "a write across a listed and an unlisted page")
        let roomy = ChunkMap(file: 1, root: .paged(Array(full.dropLast())))
        #expect(roomy.fits(perPage, perPage), "one page below the limit")
        #expect(!roomy.fits(perPage, perPage, tail: 3 * perPage), "with a buffered chunk on another new page")

        // Through a write: a file whose map is full takes no chunk on a page it does not list.
        let f = try Fixture(chunkSize: 4096, engine: .sqlite)
        defer { f.cleanup() }
        let ino = try f.file("full")
        try f.fs.commit()
        var record = try #require(try f.store.inode(ino))
        record.chunkMap = .paged(full)
        try f.store.putInode(ino, record)
        try f.store.commit()
        try f.remount()
        let h = try f.fs.open(ino, flags: O_WRONLY, caller: caller).handle
        expectError(FSError.fileTooBig) { _ = try f.write(ino, h, at: 4096 * perPage, [1]) }
        f.fs.release(ino, handle: h)
    }

    /// A row copied under an index that reads back as the same integer (5.5 in an INTEGER column) must not
    /// stand in for the chunk deleted after it: the read is EIO, not zeros.
    @Test func aChunkListedTwiceDoesNotHideADeletedOne() throws {
        let f = try Fixture(chunkSize: 4096, engine: .sqlite)
        defer { f.cleanup() }
        let ino = try f.file("f", (0..<(3 * 4096)).map { UInt8(truncatingIfNeeded: $0 / 7) })
        let cid = try #require(f.contentId(ino))
        try f.fs.commit()
        let q = try DatabaseQueue(path: f.storePath)
        try q.write { db in
            let file = Int64(bitPattern: cid)
            let copy = "INSERT INTO chunks(file, idx, value, seg, off, len) SELECT file, 1.5, value, seg, off, len FROM chunks"
            try db.execute(sql: copy + " WHERE file = ? AND idx = 1", arguments: [file])
            try db.execute(sql: "DELETE FROM chunks WHERE file = ? AND idx = 2", arguments: [file])
        }
        try q.close()
        try f.remount()
        let h = try f.fs.open(ino, flags: O_RDONLY, caller: caller).handle
        expectError(FSError.io) { _ = try f.fs.read(ino, handle: h, offset: 0, size: 3 * 4096) }
        f.fs.release(ino, handle: h)
    }

    @Test func truncateOnOpen() throws {
        let f = try Fixture(chunkSize: 4096)
        defer { f.cleanup() }
        let ino = try f.file("t", [UInt8](repeating: 9, count: 10000))
        let cid = try #require(f.contentId(ino))
        let h = try f.fs.open(ino, flags: O_WRONLY | O_TRUNC, caller: caller).handle
        #expect(try f.fs.getattr(ino).size == 0)
        #expect(try f.store.chunkIndices(file: cid).isEmpty)
        try f.write(ino, h, at: 0, b("new"))
        f.fs.release(ino, handle: h)
        #expect(try f.contents(ino) == b("new"))
        // Opening a directory is refused.
        expectError(FSError.isDirectory) { _ = try f.fs.open(root, flags: O_RDONLY, caller: caller) }
    }

    @Test(arguments: [4096, 65536])
    func truncateShrinkThenGrowReadsZeros(chunkSize: Int) throws {
        let f = try Fixture(chunkSize: chunkSize)
        defer { f.cleanup() }
        var g = SplitMix64(seed: 7)
        let data = g.bytes(3 * chunkSize + 100)
        let ino = try f.file("t", data)
        let cut = UInt64(chunkSize + 10)
        #expect(try f.fs.setattr(ino, changes: AttributeChanges(size: cut), handle: nil, caller: caller).size == cut)
        let cid = try #require(f.contentId(ino))
        #expect(try f.store.chunkIndices(file: cid) == [0, 1])
        _ = try f.fs.setattr(ino, changes: AttributeChanges(size: UInt64(data.count + 50)), handle: nil, caller: caller)
        let after = try f.contents(ino)
        #expect(after.count == data.count + 50)
        #expect(Array(after.prefix(Int(cut))) == Array(data.prefix(Int(cut))))
        let tailIsZero = after[Int(cut)...].allSatisfy { $0 == 0 }
        #expect(tailIsZero, "bytes past the old end must read as zeros")
        // Writing into the grown region keeps the zeros around it.
        let h = try f.fs.open(ino, flags: O_RDWR, caller: caller).handle
        try f.write(ino, h, at: cut + 5, b("X"))
        f.fs.release(ino, handle: h)
        let again = try f.contents(ino)
        #expect(Array(again[Int(cut)..<Int(cut) + 7]) == [0, 0, 0, 0, 0, 0x58, 0])
        // Shrink to exactly a chunk boundary, and to zero.
        _ = try f.fs.setattr(ino, changes: AttributeChanges(size: UInt64(chunkSize)), handle: nil, caller: caller)
        #expect(try f.store.chunkIndices(file: cid) == [0])
        #expect(try f.contents(ino) == Array(data.prefix(chunkSize)))
        _ = try f.fs.setattr(ino, changes: AttributeChanges(size: 0), handle: nil, caller: caller)
        #expect(try f.store.chunkIndices(file: cid).isEmpty)
        #expect(try f.contents(ino) == [])
        // Truncating a directory is refused.
        expectError(FSError.isDirectory) { _ = try f.fs.setattr(root, changes: AttributeChanges(size: 0), handle: nil, caller: caller) }
    }

    @Test func fallocateGrowsOrKeepsSize() throws {
        let f = try Fixture(chunkSize: 4096)
        defer { f.cleanup() }
        let (ino, h) = try f.create("fa")
        try f.write(ino, h, at: 0, b("abc"))
        try f.fs.fallocate(ino, handle: h, mode: 1, offset: 0, length: 100_000)
        #expect(try f.fs.getattr(ino).size == 3)
        try f.fs.fallocate(ino, handle: h, mode: 0, offset: 0, length: 10_000)
        #expect(try f.fs.getattr(ino).size == 10_000)
        #expect(try f.fs.read(ino, handle: h, offset: 0, size: 10_000) == b("abc") + [UInt8](repeating: 0, count: 9997))
        // Collapsing a range and punching without keeping the size are refused (FallocateTests has the rest).
        expectError(FSError.notSupported) { try f.fs.fallocate(ino, handle: h, mode: 8, offset: 0, length: 4096) }
        expectError(FSError.notSupported) { try f.fs.fallocate(ino, handle: h, mode: 2, offset: 0, length: 1) }
        f.fs.release(ino, handle: h)
    }

    @Test func concurrentWritersToDifferentFiles() throws {
        let f = try Fixture(chunkSize: 4096)
        defer { f.cleanup() }
        let fs = f.fs
        let threads = 6
        var files: [(ino: InodeNumber, handle: HandleID, data: [UInt8])] = []
        for t in 0..<threads {
            var g = SplitMix64(seed: UInt64(t) + 100)
            let (ino, h) = try f.create("c\(t)")
            files.append((ino, h, g.bytes(300_000 + t * 777)))
        }
        let snapshot = files
        let failures = Failures()
        DispatchQueue.concurrentPerform(iterations: threads) { t in
            let (ino, h, data) = snapshot[t]
            var offset = 0
            var piece = 1000 + t * 37  // uneven, unaligned pieces
            while offset < data.count {
                let n = min(piece, data.count - offset)
                do {
                    let written = try data[offset..<offset + n].withUnsafeBytes { try fs.write(ino, handle: h, offset: UInt64(offset), data: $0) }
                    if written != n { failures.add("thread \(t): short write") }
                    if offset % 50_000 < n {
                        let back = try fs.read(ino, handle: h, offset: UInt64(offset), size: n)
                        if back != Array(data[offset..<offset + n]) { failures.add("thread \(t): read-back mismatch at \(offset)") }
                    }
                } catch { failures.add("thread \(t): \(error)") }
                offset += n
                piece = piece * 3 % 9000 + 100
            }
            if t % 2 == 0 { do { try fs.fsync(ino, handle: h, dataOnly: false) } catch { failures.add("fsync: \(error)") } }
        }
        #expect(failures.all.isEmpty, "\(failures.all.prefix(5))")
        for file in files { f.fs.release(file.ino, handle: file.handle) }
        for (t, file) in files.enumerated() { #expect(try f.contents(file.ino) == file.data, "file \(t)") }
        try f.remount()
        for (t, file) in files.enumerated() { #expect(try f.contents(file.ino) == file.data, "file \(t) after remount") }
    }

    @Test func concurrentReadersAndAWriterOnOneFile() throws {
        let f = try Fixture(chunkSize: 4096)
        defer { f.cleanup() }
        var g = SplitMix64(seed: 99)
        let initial = g.bytes(64 * 4096)
        let ino = try f.file("shared", initial)
        let fs = f.fs
        let failures = Failures()
        DispatchQueue.concurrentPerform(iterations: 4) { t in
            do {
                let h = try fs.open(ino, flags: O_RDWR, caller: caller).handle
                defer { fs.release(ino, handle: h) }
                for i in 0..<64 {
                    if t == 0 {
                        // The writer replaces whole chunks with one byte value each.
                        let chunk = [UInt8](repeating: UInt8(i), count: 4096)
                        _ = try chunk.withUnsafeBytes { try fs.write(ino, handle: h, offset: UInt64(i * 4096), data: $0) }
                    } else {
                        // Readers must see, for each chunk, either the old bytes or the new ones: never a mix.
                        let idx = (i * 7 + t) % 64
                        let got = try fs.read(ino, handle: h, offset: UInt64(idx * 4096), size: 4096)
                        let old = Array(initial[idx * 4096..<(idx + 1) * 4096])
                        if got != old && got != [UInt8](repeating: UInt8(idx), count: 4096) { failures.add("reader \(t): torn chunk \(idx)") }
                    }
                }
            } catch { failures.add("thread \(t): \(error)") }
        }
        #expect(failures.all.isEmpty, "\(failures.all.prefix(5))")
        let expected = (0..<64).flatMap { [UInt8](repeating: UInt8($0), count: 4096) }
        #expect(try f.contents(ino) == expected)
    }

    @Test func damagedChunkIsEIONeverWrongData() throws {
        let f = try Fixture(chunkSize: 4096)
        defer { f.cleanup() }
        let ino = try f.file("victim", [UInt8](repeating: 0x5A, count: 3 * 4096))
        let cid = try #require(f.contentId(ino))
        try f.fs.commit()
        // Replace chunk 1 with chunk 0's sealed bytes (a swap inside the file).
        let chunk0 = try #require(try f.store.sealedChunks(file: cid, first: 0, last: 0).first)
        try f.store.putChunk(file: cid, index: 1, sealed: chunk0.sealed)
        let h = try f.fs.open(ino, flags: O_RDONLY, caller: caller).handle
        defer { f.fs.release(ino, handle: h) }
        #expect(try f.fs.read(ino, handle: h, offset: 0, size: 4096) == [UInt8](repeating: 0x5A, count: 4096))
        expectError(FSError.io) { _ = try f.fs.read(ino, handle: h, offset: 4096, size: 10) }
        expectError(FSError.io) { _ = try f.fs.read(ino, handle: h, offset: 0, size: 3 * 4096) }
        // A flipped bit as well.
        var flipped = chunk0.sealed
        flipped[40] ^= 1
        try f.store.putChunk(file: cid, index: 2, sealed: flipped)
        expectError(FSError.io) { _ = try f.fs.read(ino, handle: h, offset: 2 * 4096 + 1, size: 10) }
    }
}

/// Thread-safe collection of failure messages.
final class Failures: @unchecked Sendable {
    private let lock = NSLock()
    private var messages: [String] = []
    func add(_ m: String) {
        lock.lock()
        messages.append(m)
        lock.unlock()
    }
    var all: [String] {
        lock.lock()
        defer { lock.unlock() }
        return messages
    }
}

/// The per-file chunk map (docs/FORMAT.md): what AEAD alone misses is caught on read, holes stay
/// holes, and the map moves between its inline and paged forms as files grow and shrink.
@Suite("Chunk map")
struct ChunkMapTests {
    static let cs = 4096

    /// Writes `versions` successive contents over chunk 1 of a 3-chunk file, keeping a copy of each
    /// sealed chunk 1; returns the file and the copies (oldest first).
    func fileWithHistory(_ f: Fixture, versions: Int) throws -> (ino: InodeNumber, cid: UInt64, old: [[UInt8]], content: [UInt8]) {
        var g = SplitMix64(seed: 0xC0FFEE)
        var content = g.bytes(3 * Self.cs)
        let ino = try f.file("f", content)
        let cid = try required(f.contentId(ino))
        var old: [[UInt8]] = []
        for _ in 0..<versions {
            try f.fs.commit()
            old.append(try required(f.store.sealedChunks(file: cid, first: 1, last: 1).first?.sealed))
            let fresh = g.bytes(Self.cs)
            content.replaceSubrange(Self.cs..<2 * Self.cs, with: fresh)
            let h = try f.fs.open(ino, flags: O_RDWR, caller: caller).handle
            try f.write(ino, h, at: UInt64(Self.cs), fresh)
            f.fs.release(ino, handle: h)
        }
        try f.fs.commit()
        return (ino, cid, old, content)
    }

    func readChunk(_ f: Fixture, _ ino: InodeNumber, _ index: Int) throws -> [UInt8] {
        let h = try f.fs.open(ino, flags: O_RDONLY, caller: caller).handle
        defer { f.fs.release(ino, handle: h) }
        return try f.fs.read(ino, handle: h, offset: UInt64(index * Self.cs), size: Self.cs)
    }

    @Test func olderVersionOfAChunkIsEIO() throws {
        let f = try Fixture(chunkSize: Self.cs)
        defer { f.cleanup() }
        let (ino, cid, old, content) = try fileWithHistory(f, versions: 2)
        #expect(try f.contents(ino) == content)
        // Put back the first version of chunk 1: it authenticates under the file key (same file,
        // same position), but it is not the chunk the map names.
        try f.store.putChunk(file: cid, index: 1, sealed: old[0])
        try f.remount()
        #expect(try readChunk(f, ino, 0) == Array(content[0..<Self.cs]), "the other chunks still read")
        #expect(try readChunk(f, ino, 2) == Array(content[2 * Self.cs..<3 * Self.cs]))
        #expect(fsError { _ = try readChunk(f, ino, 1) } == .io)
        #expect(fsError { _ = try f.contents(ino) } == .io)
    }

    @Test func deletedChunkIsEIOButAHoleReadsAsZeros() throws {
        let f = try Fixture(chunkSize: Self.cs)
        defer { f.cleanup() }
        let (ino, h) = try f.create("sparse")
        try f.write(ino, h, at: 0, [UInt8](repeating: 7, count: Self.cs))
        try f.write(ino, h, at: UInt64(4 * Self.cs), [UInt8](repeating: 9, count: Self.cs))
        f.fs.release(ino, handle: h)
        try f.fs.commit()
        let cid = try required(f.contentId(ino))
        #expect(try readChunk(f, ino, 2) == [UInt8](repeating: 0, count: Self.cs), "a hole the user made reads as zeros")
        #expect(try f.store.deleteChunks(file: cid, from: 4) == 1)
        try f.store.commit()
        try f.remount()
        #expect(fsError { _ = try readChunk(f, ino, 4) } == .io, "a deleted chunk is not a hole")
        #expect(try readChunk(f, ino, 0) == [UInt8](repeating: 7, count: Self.cs))
    }

    @Test func chunkStoredWhereTheFileHasAHoleIsEIO() throws {
        let f = try Fixture(chunkSize: Self.cs)
        defer { f.cleanup() }
        // A 3-chunk file whose chunk 1 is later punched back to a hole by truncating and regrowing.
        var g = SplitMix64(seed: 5)
        let content = g.bytes(3 * Self.cs)
        let ino = try f.file("f", content)
        let cid = try required(f.contentId(ino))
        try f.fs.commit()
        let oldChunk1 = try required(f.store.sealedChunks(file: cid, first: 1, last: 1).first?.sealed)
        _ = try f.fs.setattr(ino, changes: AttributeChanges(size: UInt64(Self.cs)), handle: nil, caller: caller)
        _ = try f.fs.setattr(ino, changes: AttributeChanges(size: UInt64(3 * Self.cs)), handle: nil, caller: caller)
        try f.fs.commit()
        #expect(try readChunk(f, ino, 1) == [UInt8](repeating: 0, count: Self.cs))
        // The old chunk 1 put back into today's hole authenticates but the map says hole.
        try f.store.putChunk(file: cid, index: 1, sealed: oldChunk1)
        try f.store.commit()
        try f.remount()
        #expect(fsError { _ = try readChunk(f, ino, 1) } == .io)
        #expect(try readChunk(f, ino, 0) == Array(content[0..<Self.cs]))
    }

    @Test func pagedMapsGrowShrinkAndDetectAnOlderPage() throws {
        let f = try Fixture(chunkSize: Self.cs)
        defer { f.cleanup() }
        let (ino, h) = try f.create("big")
        let cid = try required(f.contentId(ino))
        // Small: inline, no page rows.
        try f.write(ino, h, at: 0, [UInt8](repeating: 1, count: 3 * Self.cs))
        try f.fs.commit()
        #expect(try f.store.counts().chunkMapPages == 0)
        // Past 8 chunks and far into page 2 (positions 2048...): paged, page 1 all holes.
        try f.write(ino, h, at: UInt64(2100 * Self.cs), [UInt8](repeating: 2, count: Self.cs))
        try f.fs.commit()
        let mapRoot = try required(f.store.inode(ino)).chunkMap
        guard case .paged(let refs) = mapRoot else {
            Issue.record("expected a paged map, got \(mapRoot)")
            return
        }
        #expect(refs.map(\.page) == [0, 2], "page 1 is all holes and not stored")
        #expect(try f.store.counts().chunkMapPages == 2)
        #expect(try readChunk(f, ino, 1500) == [UInt8](repeating: 0, count: Self.cs))
        #expect(try readChunk(f, ino, 2100) == [UInt8](repeating: 2, count: Self.cs))
        // Keep page 0 as it is now, change chunk 0 (page 0 gets a new version), put the old page back.
        let oldPage0 = try required(f.store.rawChunkMapPage(file: cid, page: 0))
        try f.write(ino, h, at: 0, [UInt8](repeating: 3, count: Self.cs))
        try f.fs.commit()
        try f.store.putRawChunkMapPage(file: cid, page: 0, sealed: oldPage0)
        try f.store.commit()
        f.fs.release(ino, handle: h)
        try f.remount()
        #expect(fsError { _ = try readChunk(f, ino, 0) } == .io, "an older map page does not open against the inode")
        #expect(try readChunk(f, ino, 2100) == [UInt8](repeating: 2, count: Self.cs), "other pages still work")
    }

    /// Reading far into a sparse file loads many (empty) pages; dropping clean pages from memory
    /// must never lose an inline map's tags.
    @Test func manyPagesReadKeepTheInlineTags() throws {
        let f = try Fixture(chunkSize: Self.cs)
        defer { f.cleanup() }
        let content = [UInt8](repeating: 5, count: 3 * Self.cs)
        let ino = try f.file("f", content)
        let pageBytes = Self.cs * ChunkMapRoot.positionsPerPage
        _ = try f.fs.setattr(ino, changes: AttributeChanges(size: UInt64(100 * pageBytes)), handle: nil, caller: caller)
        try f.fs.commit()  // the map is clean now: its pages may be dropped from memory
        let h = try f.fs.open(ino, flags: O_RDONLY, caller: caller).handle
        for p in 1..<100 {
            #expect(try f.fs.read(ino, handle: h, offset: UInt64(p * pageBytes), size: 1) == [0])
        }
        #expect(try f.fs.read(ino, handle: h, offset: 0, size: 3 * Self.cs) == content)
        f.fs.release(ino, handle: h)
        try f.fs.commit()
        try f.remount()
        #expect(try readChunk(f, ino, 2) == Array(content[2 * Self.cs..<3 * Self.cs]))
    }

    /// A byte written a petabyte in costs one page reference, not one per empty page before it.
    @Test func farSparseWriteStoresOnePage() throws {
        let f = try Fixture(chunkSize: Self.cs)
        defer { f.cleanup() }
        let (ino, h) = try f.create("far")
        let offset: UInt64 = 1 << 50
        try f.write(ino, h, at: 0, [1])
        try f.write(ino, h, at: offset, [2])
        f.fs.release(ino, handle: h)
        try f.fs.commit()
        let mapRoot = try required(f.store.inode(ino)).chunkMap
        let farPage = offset / UInt64(Self.cs) / UInt64(ChunkMapRoot.positionsPerPage)
        #expect(mapRoot == .paged([ChunkMapPageRef(page: 0, version: 0), ChunkMapPageRef(page: farPage, version: 0)]).withVersions(of: mapRoot))
        try f.remount()
        let h2 = try f.fs.open(ino, flags: O_RDONLY, caller: caller).handle
        #expect(try f.fs.read(ino, handle: h2, offset: offset - 1, size: 10) == [0, 2])
        #expect(try f.fs.read(ino, handle: h2, offset: 0, size: 2) == [1, 0])
        f.fs.release(ino, handle: h2)
    }

    @Test func truncatingBackToAFewChunksReturnsToTheInlineForm() throws {
        let f = try Fixture(chunkSize: Self.cs)
        defer { f.cleanup() }
        var g = SplitMix64(seed: 77)
        let content = g.bytes(20 * Self.cs + 5)
        let ino = try f.file("f", content)
        try f.fs.commit()
        #expect(try f.store.counts().chunkMapPages == 1)
        _ = try f.fs.setattr(ino, changes: AttributeChanges(size: UInt64(2 * Self.cs + 10)), handle: nil, caller: caller)
        try f.fs.commit()
        #expect(try f.store.counts().chunkMapPages == 0)
        let mapRoot = try required(f.store.inode(ino)).chunkMap
        guard case .inline(let tags) = mapRoot else {
            Issue.record("expected an inline map, got \(mapRoot)")
            return
        }
        #expect(tags.count == 3 && !tags.contains(.hole))
        try f.remount()
        #expect(try f.contents(ino) == Array(content[0..<2 * Self.cs + 10]))
        // Unlink removes every row of the file, pages included.
        let big = try f.file("g", g.bytes(30 * Self.cs))
        try f.fs.commit()
        #expect(try f.store.counts().chunkMapPages == 1)
        try f.fs.unlink(parent: root, name: b("g"))
        f.fs.forget(big, lookups: 1)
        try f.fs.commit()
        #expect(try f.store.counts().chunkMapPages == 0)
    }
}

extension ChunkMapRoot {
    /// This paged root with the versions of `other` (versions are random; tests compare pages).
    func withVersions(of other: ChunkMapRoot) -> ChunkMapRoot {
        guard case .paged(let mine) = self, case .paged(let theirs) = other, mine.count == theirs.count else { return self }
        return .paged(zip(mine, theirs).map { ChunkMapPageRef(page: $0.page, version: $1.version) })
    }
}

/// The tail buffer (TailChunk): small appends stay in memory until the chunk is done with, and
/// every way of looking at the file sees them.
@Suite("Tail chunk buffer")
struct TailChunkTests {
    @Test func smallAppendsAreSealedOncePerChunkAndReadBackEverywhere() throws {
        let cs = 32768
        let f = try Fixture(chunkSize: cs)
        defer { f.cleanup() }
        let (ino, h) = try f.create("tar-like")
        let cid = try required(f.contentId(ino))
        var model: [UInt8] = []
        var g = SplitMix64(seed: 10240)
        for _ in 0..<3 {  // 30 KiB: all inside chunk 0
            let record = g.bytes(10240)
            try f.write(ino, h, at: UInt64(model.count), record)
            model += record
        }
        #expect(try f.store.chunkIndices(file: cid).isEmpty, "nothing sealed while the chunk is still being appended to")
        #expect(try f.fs.getattr(ino).size == UInt64(model.count))
        #expect(try f.fs.getattr(ino).blocks == UInt64(model.count / 512), "the buffered chunk counts as stored")
        // A read of the tail sees it (and seals it).
        #expect(try f.fs.read(ino, handle: h, offset: 0, size: model.count) == model)
        #expect(try f.store.chunkIndices(file: cid) == [0])
        // Appending again re-opens chunk 0 into the buffer, then moves on to chunk 1.
        for _ in 0..<4 {
            let record = g.bytes(10240)
            try f.write(ino, h, at: UInt64(model.count), record)
            model += record
        }
        // A write elsewhere seals the tail first, then goes through the normal path.
        let patch = g.bytes(100)
        try f.write(ino, h, at: 5, patch)
        model.replaceSubrange(5..<105, with: patch)
        let more = g.bytes(3000)
        try f.write(ino, h, at: UInt64(model.count), more)
        model += more
        // Truncation below the tail seals it first.
        _ = try f.fs.setattr(ino, changes: AttributeChanges(size: UInt64(model.count - 1000)), handle: h, caller: caller)
        model.removeLast(1000)
        let last = g.bytes(500)
        try f.write(ino, h, at: UInt64(model.count), last)
        model += last
        #expect(try f.fs.read(ino, handle: h, offset: 0, size: model.count + 1) == model)
        // Close seals it; the group commit makes it durable.
        f.fs.release(ino, handle: h)
        #expect(try f.store.chunkIndices(file: cid) == [0, 1, 2])
        try f.crashAndRemount()
        #expect(try f.contents(ino) == model)
        #expect(try f.fs.getattr(ino).blocks == UInt64((model.count + 511) / 512))
    }

    /// Many small files written faster than groups commit: their tails are stored once they hold more
    /// than `heldTailVolume`, so memory stays bounded and the group's volume sees them. Before, every
    /// tail waited for the commit (tens of MiB a second of small files, all lost at once when the
    /// commit found a full disk).
    @Test func tailsOfManySmallFilesAreStoredBeforeTheCommit() throws {
        var options = CofferFileSystem.Options()
        options.heldTailVolume = 64 << 10
        options.commitInterval = .seconds(3600)
        let f = try Fixture(chunkSize: 32768, options: options)
        defer { f.cleanup() }
        var g = SplitMix64(seed: 0x7A115)
        var files: [(InodeNumber, [UInt8])] = []
        for i in 0..<60 {
            let (ino, h) = try f.create("small\(i)")
            let data = g.bytes(10000)
            try f.write(ino, h, at: 0, data)
            files.append((ino, data))
            let held = f.fs.meta.withLock { f.fs.heldTailBytes }
            #expect(held < options.heldTailVolume + 10000, "tails held after file \(i): \(held) bytes")
        }
        let stored = try files.filter { !(try f.store.chunkIndices(file: try required(f.contentId($0.0))).isEmpty) }.count
        #expect(stored >= 50, "the tails of all but the last few files are stored before any commit: \(stored) of 60")
        for (ino, data) in files { #expect(try f.contents(ino) == data) }
        try f.fs.commit()
        try f.crashAndRemount()
        for (ino, data) in files { #expect(try f.contents(ino) == data) }
    }

    @Test func groupCommitSealsTheTailOfAnOpenFile() throws {
        let f = try Fixture(chunkSize: 32768)
        defer { f.cleanup() }
        let (ino, h) = try f.create("open")
        try f.write(ino, h, at: 0, b("written, not closed"))
        try f.fs.fsync(ino, handle: h, dataOnly: false)
        // A crash now (the handle never closed) keeps what fsync made durable.
        try f.crashAndRemount()
        #expect(try f.contents(ino) == b("written, not closed"))
    }

    @Test func randomSmallWritesMatchAModel() throws {
        let cs = 4096
        let f = try Fixture(chunkSize: cs)
        defer { f.cleanup() }
        let (ino, h) = try f.create("model")
        var model: [UInt8] = []
        var g = SplitMix64(seed: 0x7A11)
        for step in 0..<400 {
            switch Int.random(in: 0..<20, using: &g) {
            case 0:
                let size = Int.random(in: 0...model.count + cs, using: &g)
                _ = try f.fs.setattr(ino, changes: AttributeChanges(size: UInt64(size)), handle: h, caller: caller)
                if size < model.count { model.removeSubrange(size...) } else { model += [UInt8](repeating: 0, count: size - model.count) }
            case 1:
                #expect(try f.fs.read(ino, handle: h, offset: 0, size: model.count + 10) == model, "step \(step)")
            case 2:
                try f.fs.commit()
            case 3, 4:
                let offset = Int.random(in: 0...max(0, model.count), using: &g)
                let data = g.bytes(Int.random(in: 1...300, using: &g))
                try f.write(ino, h, at: UInt64(offset), data)
                if model.count < offset + data.count { model += [UInt8](repeating: 0, count: offset + data.count - model.count) }
                model.replaceSubrange(offset..<offset + data.count, with: data)
            default:
                let data = g.bytes(Int.random(in: 1...1500, using: &g))
                try f.write(ino, h, at: UInt64(model.count), data)
                model += data
            }
        }
        #expect(try f.fs.read(ino, handle: h, offset: 0, size: model.count + 10) == model)
        f.fs.release(ino, handle: h)
        try f.remount()
        #expect(try f.contents(ino) == model)
    }
}
