import CofferTestSupport
import Foundation
import Glibc
import Testing
@testable import CofferFS
@testable import CofferStore

/// fallocate's PUNCH_HOLE and ZERO_RANGE: whole chunks inside the range go (rows and map
/// positions), the chunks at its edges are zeroed in place, and everything reads as a plain file
/// would, also after a remount.
@Suite struct FallocateTests {
    static let punch: Int32 = 0x02 | 0x01  // FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE
    static let zero: Int32 = 0x10  // FALLOC_FL_ZERO_RANGE

    /// A file of `count` 4 KiB chunks holding a pattern no chunk repeats.
    func patterned(_ f: Fixture, _ name: String, bytes count: Int) throws -> (InodeNumber, [UInt8]) {
        let data = (0..<count).map { UInt8(truncatingIfNeeded: $0 &* 31 &+ $0 / 4096) }
        return (try f.file(name, data), data)
    }

    func zeroed(_ data: [UInt8], _ from: Int, _ to: Int) -> [UInt8] {
        var out = data
        for i in from..<min(to, out.count) { out[i] = 0 }
        return out
    }

    @Test func punchFreesWholeChunksAndZeroesTheEdges() throws {
        let f = try Fixture(chunkSize: 4096)
        defer { f.cleanup() }
        let (ino, data) = try patterned(f, "p", bytes: 10 * 4096)  // 10 chunks: a paged chunk map
        try f.fs.commit()
        let cid = try #require(try f.store.inode(ino)?.contentId)
        try f.fs.commit()
        let blocksBefore = try f.fs.getattr(ino).blocks
        try f.fs.fallocate(ino, handle: .none, mode: Self.punch, offset: 5000, length: 12_388)  // [5000, 17388)
        let expected = zeroed(data, 5000, 17_388)
        #expect(try f.fs.getattr(ino).size == UInt64(data.count), "punching keeps the size")
        #expect(try f.contents(ino) == expected)
        #expect(try f.store.chunkIndices(file: cid) == [0, 1, 4, 5, 6, 7, 8, 9], "chunks 2 and 3 were inside the hole")
        #expect(try f.fs.getattr(ino).blocks == blocksBefore - 2 * 4096 / 512)
        try f.fs.commit()
        try f.remount()
        #expect(try f.contents(ino) == expected, "after a remount")
        #expect(try f.store.inode(ino)?.chunkCount == 8)
    }

    @Test func punchToTheEndDropsThePartialLastChunk() throws {
        let f = try Fixture(chunkSize: 4096)
        defer { f.cleanup() }
        let (ino, data) = try patterned(f, "tail", bytes: 10_000)  // chunks 0, 1 and 2 (1808 bytes)
        try f.fs.commit()
        let cid = try #require(try f.store.inode(ino)?.contentId)
        try f.fs.fallocate(ino, handle: .none, mode: Self.punch, offset: 8192, length: 1 << 20)
        #expect(try f.fs.getattr(ino).size == 10_000)
        #expect(try f.contents(ino) == zeroed(data, 8192, 10_000))
        #expect(try f.store.chunkIndices(file: cid) == [0, 1])
        // A hole punched over the whole of a huge range costs nothing per position.
        try f.fs.fallocate(ino, handle: .none, mode: Self.punch, offset: 0, length: 1 << 50)
        #expect(try f.store.chunkIndices(file: cid).isEmpty)
        #expect(try f.contents(ino) == [UInt8](repeating: 0, count: 10_000))
        #expect(try f.fs.getattr(ino).blocks == 0)
        try f.fs.commit()
        try f.remount()
        #expect(try f.contents(ino) == [UInt8](repeating: 0, count: 10_000))
    }

    @Test func zeroRangeZeroesAndGrowsUnlessKeepSize() throws {
        let f = try Fixture(chunkSize: 4096)
        defer { f.cleanup() }
        let (ino, data) = try patterned(f, "z", bytes: 3 * 4096 + 100)
        try f.fs.fallocate(ino, handle: .none, mode: Self.zero | 0x01, offset: 100, length: 200)
        #expect(try f.contents(ino) == zeroed(data, 100, 300), "KEEP_SIZE: only zeroed")
        try f.fs.fallocate(ino, handle: .none, mode: Self.zero, offset: 4000, length: 20_000)
        #expect(try f.fs.getattr(ino).size == 24_000)
        #expect(try f.contents(ino) == zeroed(data, 100, 300).prefix(4000) + [UInt8](repeating: 0, count: 20_000))
        // A punch inside one chunk rewrites that chunk only.
        try f.fs.fallocate(ino, handle: .none, mode: Self.punch, offset: 10, length: 5)
        #expect(try f.contents(ino).prefix(20) == zeroed(data, 10, 15).prefix(20))
        try f.fs.commit()
        try f.remount()
        #expect(try f.fs.getattr(ino).size == 24_000)
        #expect(try f.contents(ino).prefix(4000) == ArraySlice(zeroed(zeroed(data, 100, 300), 10, 15).prefix(4000)))
    }

    @Test func punchWhileTheTailIsBufferedAndUnsupportedModes() throws {
        let f = try Fixture(chunkSize: 4096)
        defer { f.cleanup() }
        let (ino, h) = try f.create("t")
        try f.write(ino, h, at: 0, [UInt8](repeating: 7, count: 6000))  // the last chunk stays in plaintext
        try f.fs.fallocate(ino, handle: h, mode: Self.punch, offset: 4100, length: 100)
        var expected = [UInt8](repeating: 7, count: 6000)
        for i in 4100..<4200 { expected[i] = 0 }
        #expect(try f.contents(ino) == expected)
        expectError(FSError.notSupported) { try f.fs.fallocate(ino, handle: h, mode: 0x02, offset: 0, length: 1) }
        expectError(FSError.notSupported) { try f.fs.fallocate(ino, handle: h, mode: 0x20, offset: 0, length: 4096) }
        expectError(FSError.notSupported) { try f.fs.fallocate(ino, handle: h, mode: Self.punch | Self.zero, offset: 0, length: 1) }
        f.fs.release(ino, handle: h)
    }
}
