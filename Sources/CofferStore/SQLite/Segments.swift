import CFileSpace
import Foundation
import Glibc
import Synchronization

/// Content chunks kept beside the database, in append-only segment files (docs/FORMAT.md, "Segments").
///
/// In WAL mode SQLite writes every byte twice, into the WAL and then, at the checkpoint, into the
/// database file, and until that checkpoint the container holds it twice on disk (issue 19: the peak
/// of a 1 GiB write was 2.2x the data). A chunk appended to a segment is written once; its row in
/// `chunks` says only where it lies (WiscKey's key-value separation). The sealed bytes are the same
/// as in a row, so the chunk map, the associated data and fsck vouch for them as before.
///
/// This type holds the files; `SQLiteBackend` (SegmentRows.swift) ties them to the rows. The appending
/// state is touched only on the writer connection, one thread at a time; reads come from any thread.
final class Segments: @unchecked Sendable {
    static let directoryName = "segments"
    /// A segment takes appends up to this length, then the next one is started.
    static let segmentLength: Int64 = 64 << 20
    /// Sealed chunks at least this long go to a segment; shorter ones (small files, tails) stay in their
    /// row, where several share a B-tree page.
    static let minimumLength = 8 << 10
    /// The longest value a row may point at: a hostile row must not make the daemon allocate more.
    static let maximumLength = 4 << 20
    /// Writeback of appended bytes is started every this many bytes, so the fdatasync before a commit
    /// waits for little.
    static let writebackStep: Int64 = 1 << 20

    let directory: String

    init(directory: String) { self.directory = directory }

    func path(_ id: Int64) -> String { directory + "/" + String(id) }

    /// The segment ids in the directory (other names are not ours and are left alone).
    func idsOnDisk() -> [Int64] {
        ((try? FileManager.default.contentsOfDirectory(atPath: directory)) ?? []).compactMap { name in
            guard let id = Int64(name), String(id) == name else { return nil }
            return id
        }
    }

    // MARK: Reading

    /// A segment open for reading; closed when the last reader lets go of it, so a segment removed
    /// from the cache while another thread reads it stays readable until that read ends.
    final class File: Sendable {
        let fd: Int32
        init(fd: Int32) { self.fd = fd }
        deinit { Glibc.close(fd) }
    }
    private let files = Mutex<[Int64: File]>([:])

    private func file(_ id: Int64) -> File? {
        if let f = files.withLock({ $0[id] }) { return f }
        guard id > 0 else { return nil }
        // Non-blocking: a FIFO put there must not hang the reader; only regular files are read.
        let fd = Glibc.open(path(id), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK)
        guard fd >= 0 else { return nil }
        var st = stat()
        guard fstat(fd, &st) == 0, (st.st_mode & S_IFMT) == S_IFREG else {
            Glibc.close(fd)
            return nil
        }
        let f = File(fd: fd)
        return files.withLock { cache in
            if let other = cache[id] { return other }
            cache[id] = f
            return f
        }
    }

    /// Calls `body` with the `length` bytes at `offset` of segment `id`, or with no bytes when they
    /// cannot be read (a missing segment, a row pointing outside one): the caller's authentication
    /// then reports the chunk as damaged, never other bytes as its content.
    func read<T>(_ id: Int64, offset: Int64, length: Int64, _ body: (UnsafeRawBufferPointer) throws -> T) rethrows -> T {
        guard length > 0, length <= Int64(Self.maximumLength), offset >= 0, offset <= Int64.max - length, let f = file(id) else {
            return try body(UnsafeRawBufferPointer(start: nil, count: 0))
        }
        let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: Int(length), alignment: 16)
        defer { buffer.deallocate() }
        var done = 0
        while done < Int(length) {
            let n = pread(f.fd, buffer.baseAddress! + done, Int(length) - done, off_t(offset) + off_t(done))
            if n < 0, errno == EINTR { continue }
            guard n > 0 else { break }
            done += n
        }
        return try body(UnsafeRawBufferPointer(rebasing: buffer[0..<done]))
    }

    /// Forgets an open segment (it was removed).
    func forget(_ id: Int64) { _ = files.withLock { $0.removeValue(forKey: id) } }

    func forgetAll() { files.withLock { $0.removeAll() } }

    // MARK: Appending (writer only)

    /// The segment taking appends: its id, an fd open for writing, and where the next chunk goes.
    struct Appender {
        var id: Int64
        var fd: Int32
        var end: Int64
        /// Where writeback was last started, and where the last fdatasync reached.
        var kicked: Int64
        var synced: Int64
    }
    var appender: Appender?
    /// An fdatasync failed: the kernel may have dropped those pages and a later fdatasync would not
    /// say so, so no commit may name what was appended until the group is rolled back.
    var failedSync = false
    /// Segments made by the open transaction: removed if it is rolled back (their rows go with it).
    var madeInTransaction: [Int64] = []

    /// Opens segment `id` for appending at `end`, cutting off what a crash or a rolled-back transaction
    /// left after it.
    func openAppender(_ id: Int64, end: Int64, create: Bool) throws(StoreError) {
        closeAppender()
        let fd = Glibc.open(path(id), O_RDWR | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK | (create ? O_CREAT | O_EXCL : 0), 0o600)
        guard fd >= 0 else { throw Self.failure("cannot open segment \(id)", errno) }
        var st = stat()
        guard fstat(fd, &st) == 0, (st.st_mode & S_IFMT) == S_IFREG else {
            Glibc.close(fd)
            throw StoreError.database("segment \(id) is not a regular file")
        }
        if Int64(st.st_size) > end { _ = ftruncate(fd, off_t(end)) }
        appender = Appender(id: id, fd: fd, end: end, kicked: end, synced: end)
    }

    func closeAppender() {
        if let a = appender { Glibc.close(a.fd) }
        appender = nil
    }

    /// Writes `bytes` at the appender's end; returns where they went. A short write (a full disk)
    /// leaves the end where it was: the next append overwrites the partial bytes.
    func append(_ bytes: UnsafeRawBufferPointer) throws(StoreError) -> Int64 {
        guard var a = appender else { throw .database("no segment is open for appending") }
        var done = 0
        while done < bytes.count {
            let n = pwrite(a.fd, bytes.baseAddress! + done, bytes.count - done, off_t(a.end) + off_t(done))
            if n < 0, errno == EINTR { continue }
            guard n > 0 else {
                let e = n < 0 ? errno : ENOSPC
                if e == ENOSPC || e == EDQUOT { throw .diskFull }
                throw Self.failure("cannot write segment \(a.id)", e)
            }
            done += n
        }
        let offset = a.end
        a.end += Int64(bytes.count)
        if a.end - a.kicked >= Self.writebackStep {
            _ = coffer_start_writeback(a.fd, off_t(a.kicked), off_t(a.end - a.kicked))
            a.kicked = a.end
        }
        appender = a
        return offset
    }

    /// fdatasync of what was appended since the last one: a commit that names these bytes must not
    /// reach the disk before them (docs/FORMAT.md, "Transactions and durability").
    func syncAppender() throws(StoreError) {
        guard !failedSync else { throw .database("an earlier fdatasync of a segment failed") }
        guard var a = appender, a.synced < a.end else { return }
        guard fdatasync(a.fd) == 0 else {
            let e = errno
            failedSync = true
            if e == ENOSPC || e == EDQUOT { throw .diskFull }
            throw Self.failure("fdatasync of segment \(a.id)", e)
        }
        a.synced = a.end
        appender = a
    }

    /// Gives the space of dead chunks back to the disk: the whole 4 KiB blocks inside each range
    /// (FALLOC_FL_PUNCH_HOLE; the file keeps its length and offsets). Only for ranges no committed row
    /// names any more. Best effort: a filesystem without hole punching keeps the space until the
    /// segment dies as a whole.
    func punch(_ ranges: [(segment: Int64, offset: Int64, length: Int64)]) {
        let block: Int64 = 4096
        for (id, group) in Dictionary(grouping: ranges, by: { $0.segment }) {
            let fd = Glibc.open(path(id), O_RDWR | O_CLOEXEC | O_NOFOLLOW)
            guard fd >= 0 else { continue }
            defer { Glibc.close(fd) }
            for r in group where r.offset >= 0 && r.length > 0 && r.length <= Int64(Self.maximumLength) && r.offset < Int64.max / 2 {
                let start = (r.offset + block - 1) / block * block
                let end = (r.offset + r.length) / block * block
                if end > start { _ = coffer_punch_hole(fd, off_t(start), off_t(end - start)) }
            }
        }
    }

    /// Removes whole segments (no committed row names them; never the appending one). Punching and
    /// removing touch no appending state: a snapshot's end may run them on another thread.
    func remove(_ ids: [Int64]) {
        for id in ids {
            forget(id)
            unlink(path(id))
        }
    }

    /// Allocated bytes of every segment (holes not counted).
    func allocatedBytes() -> UInt64 { Self.allocatedBytes(directory: directory) }

    static func allocatedBytes(directory: String) -> UInt64 {
        ((try? FileManager.default.contentsOfDirectory(atPath: directory)) ?? []).reduce(0) { total, name in
            var st = stat()
            return total + (lstat(directory + "/" + name, &st) == 0 && (st.st_mode & S_IFMT) == S_IFREG ? UInt64(st.st_blocks) * 512 : 0)
        }
    }

    private static func failure(_ what: String, _ e: Int32) -> StoreError {
        e == ENOSPC || e == EDQUOT ? .diskFull : .database("\(what): \(String(cString: strerror(e)))")
    }
}
