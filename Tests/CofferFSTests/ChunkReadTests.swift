import CofferTestSupport
import Testing
@testable import CofferFS
@testable import CofferStore

/// `readChunks`: the whole chunks the asked bytes lie in (what the adapter hands to the kernel's page cache on
/// read-only mounts), cut at the file size, and only the asked bytes when the range reaches a buffered tail.
@Suite("Whole-chunk reads")
struct ChunkReadTests {
    let cs = 32768

    @Test func returnsTheWholeChunksCutAtTheFileSize() throws {
        let f = try Fixture(chunkSize: cs)
        defer { f.cleanup() }
        var g = SplitMix64(seed: 0xC4C4E)
        var model = g.bytes(100_000)
        let ino = try f.file("f", model)
        func check(_ offset: Int, _ size: Int, start: Int, end: Int, sourceLocation: SourceLocation = #_sourceLocation) throws {
            let r = try f.fs.readChunks(ino, handle: .none, offset: UInt64(offset), size: size)
            #expect(r.start == UInt64(start), sourceLocation: sourceLocation)
            #expect(r.bytes == Array(model[start..<end]), sourceLocation: sourceLocation)
        }
        try check(40_000, 4096, start: 32768, end: 65536)  // inside one chunk
        try check(30_000, 5000, start: 0, end: 65536)  // across a chunk boundary
        try check(99_000, 4096, start: 98304, end: 100_000)  // the last chunk, cut at the size
        try check(65536, 32768, start: 65536, end: 98304)  // exactly one chunk
        let past = try f.fs.readChunks(ino, handle: .none, offset: 100_000, size: 10)
        #expect(past.start == 100_000 && past.bytes.isEmpty)
        // Grown by a truncate: the hole reads as zeros, cut at the new size.
        _ = try f.fs.setattr(ino, changes: AttributeChanges(size: 200_000), handle: nil, caller: caller)
        model += [UInt8](repeating: 0, count: 100_000)
        try check(197_000, 100, start: 196_608, end: 200_000)
        try check(150_000, 10, start: 131_072, end: 163_840)
        // `read` still returns exactly what was asked.
        #expect(try f.fs.read(ino, handle: .none, offset: 40_000, size: 4096) == Array(model[40_000..<44_096]))
    }

    @Test func aBufferedTailIsNotWidenedIntoAndStaysBuffered() throws {
        let f = try Fixture(chunkSize: cs)
        defer { f.cleanup() }
        var g = SplitMix64(seed: 0x7A11)
        let (ino, h) = try f.create("tail")
        let cid = try required(f.contentId(ino))
        var model = g.bytes(cs + 1000)  // chunk 0 sealed, chunk 1 is the buffered tail
        try f.write(ino, h, at: 0, Array(model[0..<cs]))
        try f.write(ino, h, at: UInt64(cs), Array(model[cs...]))
        let more = g.bytes(500)
        try f.write(ino, h, at: UInt64(model.count), more)
        model += more
        #expect(try f.store.chunkIndices(file: cid) == [0], "chunk 1 is still in memory")
        // A read inside chunk 0 widens to chunk 0 and leaves the tail alone.
        let r0 = try f.fs.readChunks(ino, handle: h, offset: 100, size: 10)
        #expect(r0.start == 0 && r0.bytes == Array(model[0..<cs]))
        #expect(try f.store.chunkIndices(file: cid) == [0])
        // A read reaching the tail gets the asked bytes only (the tail is sealed first, as for `read`).
        let r1 = try f.fs.readChunks(ino, handle: h, offset: UInt64(cs + 10), size: 100)
        #expect(r1.start == UInt64(cs + 10) && r1.bytes == Array(model[cs + 10..<cs + 110]))
        #expect(try f.store.chunkIndices(file: cid) == [0, 1])
        // Sealed now: the next read of that chunk is widened.
        let r2 = try f.fs.readChunks(ino, handle: h, offset: UInt64(cs + 10), size: 100)
        #expect(r2.start == UInt64(cs) && r2.bytes == Array(model[cs...]))
    }
}
