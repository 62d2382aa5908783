import CFileSpace
import Foundation
import Synchronization
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// O_DIRECT through a mount, beside ordinary readers of the same file.
@Suite("O_DIRECT through a mount", .enabled(if: E2E.fuseAvailable, "/dev/fuse is not usable"))
struct DirectIOMountTests {
    /// The first `count` bytes of the file the writer appends: 1 + offset % 251, never zero, so a zero read back
    /// is always wrong. Built by doubling, fast in a debug build: the reader must keep up with the writer.
    static func pattern(count: Int) -> [UInt8] {
        var bytes = (0..<251).map { UInt8(1 + $0) }
        while bytes.count < count { bytes += bytes.prefix(count - bytes.count) }
        return bytes
    }

    /// A tester's `tail -f` of a file appended by `dd bs=4097 oflag=direct` showed zeros from the start of an
    /// append to the next 4 KiB boundary (the file itself was right). Under the writeback cache the kernel
    /// sets the new size when the daemon answers a direct write and drops its pages of the range only after
    /// that; a reader that read the page holding the old end (the rest of it zeros) and sees the new size in
    /// that moment reads those zeros. Here a reader spins on fstat and reads whatever is new while another
    /// thread appends 4,097 bytes at a time with O_DIRECT (128 MiB, or what 8 s allow: a debug daemon is slow);
    /// every byte it reads must be the written one. Before the fix a release daemon showed such zeros in 7 runs of 7,
    /// a debug one in 6 of 7 on a busy machine (with 32 MiB only, one run in four had none).
    @Test func aReaderFollowingUnalignedDirectAppendsNeverSeesZeros() throws {
        let sb = try Sandbox("directtail")
        defer { sb.cleanup() }
        try sb.initAndMount()
        let path = sb.mnt + "/appended"
        let total = 128 << 20, piece = 4097, deadline = Date().addingTimeInterval(8)
        let created = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0o644)
        try #require(created >= 0, "open: errno \(errno)")
        try #require(coffer_set_direct(created, 1) == 0, "O_DIRECT: errno \(errno)")
        let reader = open(path, O_RDONLY)
        try #require(reader >= 0, "open for reading: errno \(errno)")

        let expected = (total + piece - 1) / piece * piece
        let want = Self.pattern(count: expected)
        let done = Atomic<Bool>(false), writeError = Atomic<Int32>(0), writtenTotal = Atomic<Int>(0)
        let writer = Thread {
            var offset = 0
            defer {
                close(created)
                writtenTotal.store(offset, ordering: .relaxed)
                done.store(true, ordering: .releasing)
            }
            guard let buffer = UnsafeMutableRawPointer.allocateAligned(8192) else {
                writeError.store(ENOMEM, ordering: .relaxed)
                return
            }
            defer { free(buffer) }
            while offset < total && Date() < deadline {
                want.withUnsafeBytes { buffer.copyMemory(from: $0.baseAddress! + offset, byteCount: piece) }
                guard Glibc.write(created, buffer, piece) == piece else {
                    writeError.store(errno, ordering: .relaxed)
                    return
                }
                offset += piece
            }
        }
        writer.start()
        var readerOpen = true
        // On a failed requirement: the reader closed and the writer finished before the sandbox unmounts.
        defer {
            if readerOpen { close(reader) }
            // Bounded: a write stuck in the daemon must fail the test, not hang the suite (cleanup unmounts).
            let giveUp = Date().addingTimeInterval(30)
            while !done.load(ordering: .acquiring) && Date() < giveUp { usleep(1000) }
        }

        var position = 0, reads = 0, wrong: [String] = []
        var chunk = [UInt8](repeating: 0, count: 1 << 20)
        let readerGivesUp = Date().addingTimeInterval(60)
        while true {
            guard Date() < readerGivesUp else {
                Issue.record("the reader gave up after 60 s at \(position) bytes (writer done: \(done.load(ordering: .acquiring)))")
                break
            }
            // Whether the writer was done before this fstat: only then is the size it gives the last one.
            let writerDone = done.load(ordering: .acquiring)
            var st = stat()
            try #require(fstat(reader, &st) == 0)
            let size = Int(st.st_size)
            if size > position {
                let n = chunk.withUnsafeMutableBytes { pread(reader, $0.baseAddress, min(size - position, $0.count), off_t(position)) }
                try #require(n > 0, "pread at \(position) of a file of \(size) bytes: \(n), errno \(errno)")
                reads += 1
                try #require(position + n <= want.count, "the file grew past the \(want.count) bytes written")
                let same = chunk.withUnsafeBytes { got in want.withUnsafeBytes { memcmp(got.baseAddress!, $0.baseAddress! + position, n) == 0 } }
                var i = 0
                while !same && i < n {
                    if chunk[i] != want[position + i] {
                        var j = i
                        while j < n && chunk[j] != want[position + j] { j += 1 }
                        wrong.append("\(position + i)..<\(position + j) (first byte \(chunk[i]))")
                        i = j
                    } else {
                        i += 1
                    }
                }
                position += n
            } else if writerDone && size == position {
                break
            }
        }
        #expect(writeError.load(ordering: .relaxed) == 0, "O_DIRECT write failed: errno \(writeError.load(ordering: .relaxed))")
        let written = writtenTotal.load(ordering: .relaxed)
        #expect(written >= 4 << 20, "only \(written) bytes written in 8 s")
        #expect(position == written, "the reader followed the file to \(position) of \(written) bytes")
        #expect(wrong.isEmpty, "\(wrong.count) ranges read wrong in \(reads) reads, the first: \(wrong.prefix(3))")

        close(reader)
        readerOpen = false

        // The file itself, read afresh after a remount.
        try sb.remount()
        let whole = try #require(FileManager.default.contents(atPath: path), "reading \(path) after a remount")
        #expect(whole.count == written)
        #expect(whole == Data(want.prefix(written)), "content after a remount")
    }
}

extension UnsafeMutableRawPointer {
    /// Page-aligned memory for O_DIRECT (free with `free`).
    static func allocateAligned(_ size: Int) -> UnsafeMutableRawPointer? {
        var p: UnsafeMutableRawPointer?
        return posix_memalign(&p, 4096, size) == 0 ? p : nil
    }
}
