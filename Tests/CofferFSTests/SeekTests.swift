import CofferTestSupport
import Glibc
import Testing
@testable import CofferFS

/// lseek's SEEK_DATA and SEEK_HOLE from the chunk map: stored chunks and the plaintext tail are data, chunks the
/// map records as holes are holes, the end of the file is a hole, and at or past the end is ENXIO.
@Suite struct SeekTests {
    let data = CofferFileSystem.seekData, hole = CofferFileSystem.seekHole

    /// (SEEK_DATA, SEEK_HOLE) from each offset.
    func answers(_ f: Fixture, _ ino: InodeNumber, _ offsets: [UInt64]) throws -> [[UInt64]] {
        try offsets.map { [try f.fs.seek(ino, offset: $0, whence: data), try f.fs.seek(ino, offset: $0, whence: hole)] }
    }

    @Test func holesDataAndTheTail() throws {
        let f = try Fixture(chunkSize: 4096)
        defer { f.cleanup() }
        let (ino, h) = try f.create("s")
        // Chunks 2 and 3 hold data, 0-1 and 4-9 are holes, chunk 10 is the plaintext tail (not stored yet).
        _ = try f.write(ino, h, at: 8192, [UInt8](repeating: 1, count: 8192))
        _ = try f.write(ino, h, at: 40960, [UInt8](repeating: 2, count: 100))
        let expected: [[UInt64]] = [[8192, 0], [9000, 16384], [40960, 16384], [40960, 41060], [41000, 41060]]
        let offsets: [UInt64] = [0, 9000, 16384, 40960, 41000]
        #expect(try answers(f, ino, offsets) == expected)
        expectError(FSError(ENXIO)) { try f.fs.seek(ino, offset: 41060, whence: data) }
        expectError(FSError(ENXIO)) { try f.fs.seek(ino, offset: 41060, whence: hole) }
        expectError(FSError.invalid) { try f.fs.seek(ino, offset: 0, whence: SEEK_END) }
        f.fs.release(ino, handle: h)
        try f.fs.commit()
        try f.remount()
        #expect(try answers(f, ino, offsets) == expected, "the same from the stored map")
        // A punched chunk is a hole again.
        try f.fs.fallocate(ino, handle: .none, mode: 0x03, offset: 8192, length: 4096)
        #expect(try answers(f, ino, [0]) == [[12288, 0]])
    }

    /// A file of 2^40 bytes with one byte at its end: SEEK_DATA from the start skips the unlisted pages of the map.
    @Test func aHugeHoleIsSkippedWithoutReadingIt() throws {
        let f = try Fixture(chunkSize: 4096)
        defer { f.cleanup() }
        let (ino, h) = try f.create("huge")
        _ = try f.write(ino, h, at: (1 << 40) - 1, [9])
        f.fs.release(ino, handle: h)
        try f.fs.commit()
        try f.remount()
        #expect(try answers(f, ino, [0, (1 << 40) - 4096]) == [[(1 << 40) - 4096, 0], [(1 << 40) - 4096, 1 << 40]])
    }

    @Test func directoriesAndEmptyFiles() throws {
        let f = try Fixture(chunkSize: 4096)
        defer { f.cleanup() }
        let (ino, h) = try f.create("empty")
        f.fs.release(ino, handle: h)
        expectError(FSError(ENXIO)) { try f.fs.seek(ino, offset: 0, whence: data) }
        expectError(FSError.isDirectory) { try f.fs.seek(root, offset: 0, whence: data) }
    }
}
