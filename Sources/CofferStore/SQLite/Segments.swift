import CFileSpace
import CMappedFault
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
    /// Writeback of appended bytes is started every this many bytes (`startWriteback`).
    static let writebackStep: Int64 = 1 << 20

    let directory: String
    /// The directory, held open once it exists, and the container directory it is made in, held from the
    /// start: segments are reached through them (`/proc/self/fd/N`), so a container renamed or moved while
    /// mounted keeps its segments. By name, appends went to whatever had the old name since (another
    /// container made there: its `segments`, and the synced data was lost).
    private let held = Mutex<Int32>(-1)
    private let parent: Int32

    /// Where segment files are named from: the held directory, else its path.
    var directoryPath: String {
        let fd = held.withLock { $0 }
        return fd >= 0 ? "/proc/self/fd/\(fd)" : directory
    }

    /// Holds the directory open, if it exists and /proc can name it (once).
    func holdDirectory() {
        held.withLock { fd in
            guard fd < 0, parent >= 0 else { return }
            let d = openat(parent, Self.directoryName, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
            if d >= 0 { fd = d }
        }
    }

    /// Makes the directory with the first segment (a store of small files only has none), in the held
    /// container directory; its name is synced before a commit names a segment in it.
    func makeDirectory() {
        let made = parent >= 0 ? mkdirat(parent, Self.directoryName, 0o700) == 0 : mkdir(directory, 0o700) == 0
        if made { _ = parent >= 0 ? fsync(parent) : 0 }
        holdDirectory()
    }

    func path(_ id: Int64) -> String { directoryPath + "/" + String(id) }

    /// The segment ids in the directory (other names are not ours and are left alone).
    func idsOnDisk() -> [Int64] {
        ((try? FileManager.default.contentsOfDirectory(atPath: directoryPath)) ?? []).compactMap { name in
            guard let id = Int64(name), String(id) == name else { return nil }
            return id
        }
    }

    // MARK: Reading

    /// A segment open for reading; closed when the last reader lets go of it, so a segment removed
    /// from the cache while another thread reads it stays readable until that read ends. Its first
    /// `mappedLength` bytes (the file's length when it was opened) are mapped read-only: a chunk is then
    /// decrypted straight from the page cache, without pread's copy (most of a cold streaming read's
    /// daemon time, docs/MEASUREMENTS.md). Segments only grow; a page someone cut off the file reads as
    /// zeros (CMappedFault), and a punched hole as zeros too, which authentication then refuses.
    final class File: Sendable {
        let fd: Int32
        nonisolated(unsafe) let mapped: UnsafeRawPointer?
        let mappedLength: Int64
        /// The mapping was tried and refused (such a file is read with pread, and never mapped again).
        let mapFailed: Bool
        /// Read through the mapping since the last drop (`readMapped`).
        let touched = Atomic<Bool>(false)
        init(fd: Int32, length: Int64, maps: Bool) {
            self.fd = fd
            let p = maps && length > 0 ? mmap(nil, Int(length), PROT_READ, MAP_SHARED, fd, 0) : MAP_FAILED
            mapped = p == MAP_FAILED ? nil : UnsafeRawPointer(p)
            mappedLength = mapped == nil ? 0 : length
            mapFailed = maps && length > 0 && mapped == nil
        }
        deinit {
            if let mapped { munmap(UnsafeMutableRawPointer(mutating: mapped), Int(mappedLength)) }
            Glibc.close(fd)
        }
    }
    private let files = Mutex<[Int64: File]>([:])
    /// Reads map segments (the SIGBUS guard is in place).
    private let maps = coffer_mapped_fault_install() == 0
    /// Bumped by `forget`: a File opened before one is not cached after it (it may be of a file cut or removed since).
    private let forgets = Atomic<UInt64>(0)

    /// Segment `id` open for reading, its mapping reaching `end` if the file does: a segment that grew since
    /// it was mapped is mapped again (through the same open file; readers of the old mapping keep it until
    /// they let go). Nil when there is no such regular file.
    private func file(_ id: Int64, reaching end: Int64) -> File? {
        let before = forgets.load(ordering: .acquiring)
        let cached = files.withLock { $0[id] }
        let opened: File
        if let cached {
            guard maps, !cached.mapFailed, cached.mappedLength < end else { return cached }
            var st = stat()
            guard fstat(cached.fd, &st) == 0, Int64(st.st_size) > cached.mappedLength else { return cached }
            let fd = fcntl(cached.fd, F_DUPFD_CLOEXEC, 0)
            guard fd >= 0 else { return cached }
            opened = File(fd: fd, length: Int64(st.st_size), maps: true)
        } else {
            guard id > 0 else { return nil }
            // Non-blocking: a FIFO put there must not hang the reader; only regular files are read.
            let fd = Glibc.open(path(id), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK)
            guard fd >= 0 else { return nil }
            var st = stat()
            guard fstat(fd, &st) == 0, (st.st_mode & S_IFMT) == S_IFREG else {
                Glibc.close(fd)
                return nil
            }
            opened = File(fd: fd, length: Int64(st.st_size), maps: maps)
        }
        return files.withLock { cache in
            guard forgets.load(ordering: .acquiring) == before else { return opened }
            if let other = cache[id], other.mappedLength >= opened.mappedLength { return other }
            cache[id] = opened
            return opened
        }
    }

    /// Calls `body` with the `length` bytes at `offset` of segment `id` (through the segment's mapping unless
    /// `mapping` is false: then copied with pread), or with no bytes when they
    /// cannot be read (a missing segment, a row pointing outside one): the caller's authentication
    /// then reports the chunk as damaged, never other bytes as its content.
    func read<T>(_ id: Int64, offset: Int64, length: Int64, mapping: Bool = true, _ body: (UnsafeRawBufferPointer) throws -> T) rethrows -> T {
        guard length > 0, length <= Int64(Self.maximumLength), offset >= 0, offset <= Int64.max - length,
            let f = file(id, reaching: offset + length)
        else {
            return try body(UnsafeRawBufferPointer(start: nil, count: 0))
        }
        let gathering = gatheringSegment.load(ordering: .acquiring) == id && offset + length > gatheredStart.load(ordering: .acquiring)
        if !gathering, mapping, let base = f.mapped, offset + length <= f.mappedLength {
            defer { readMapped(f, Int(length)) }
            return try body(UnsafeRawBufferPointer(start: base + Int(offset), count: Int(length)))
        }
        let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: Int(length), alignment: 16)
        defer { buffer.deallocate() }
        let done: Int
        if gathering {
            // Bytes appended since the last write of the gathered ones (the writer reading its own group): those
            // being written (`Flight`), then those gathered after them, which follow them in the file.
            done = gathered.withLock { g in
                let inMemory = g.flight?.start ?? g.start
                let inFile = g.segment == id ? Int(max(0, min(length, inMemory - offset))) : Int(length)
                var n = Self.pread(f.fd, buffer, upTo: inFile, at: offset)
                guard n == inFile, g.segment == id else { return n }
                let runs = [g.flight.map { ($0.start, $0.count, $0.bytes) }, (g.start, g.count, g.bytes)]
                for case let (start, count, bytes)? in runs where n < Int(length) {
                    let at = offset + Int64(n)
                    guard at >= start, at < start + Int64(count) else { continue }
                    let from = Int(at - start), take = min(Int(length) - n, count - from)
                    (buffer.baseAddress! + n).copyMemory(from: bytes.baseAddress! + from, byteCount: take)
                    n += take
                }
                return n
            }
        } else {
            done = Self.pread(f.fd, buffer, upTo: Int(length), at: offset)
        }
        return try body(UnsafeRawBufferPointer(rebasing: buffer[0..<done]))
    }

    /// Counts bytes read through mappings; every `dropEvery` of them, the pages leave the mappings read since
    /// (the page cache keeps them): a streaming read would otherwise count the whole file in the daemon's
    /// resident memory. Dropping after each read instead cost more than the copy it saves (a TLB shootdown each).
    private func readMapped(_ f: File, _ length: Int) {
        f.touched.store(true, ordering: .relaxed)
        let total = mappedSinceDrop.add(length, ordering: .relaxed).newValue
        guard total >= Self.dropEvery, mappedSinceDrop.compareExchange(expected: total, desired: 0, ordering: .relaxed).exchanged else { return }
        let touched = files.withLock { $0.values.filter { $0.touched.exchange(false, ordering: .relaxed) } }
        for t in touched {
            if let m = t.mapped { madvise(UnsafeMutableRawPointer(mutating: m), Int(t.mappedLength), MADV_DONTNEED) }
        }
    }
    private let mappedSinceDrop = Atomic<Int>(0)
    static let dropEvery = 16 << 20

    /// Reads up to `count` bytes at `offset` into the start of `buffer`; stops early at the end of the file or an error.
    private static func pread(_ fd: Int32, _ buffer: UnsafeMutableRawBufferPointer, upTo count: Int, at offset: Int64) -> Int {
        var done = 0
        while done < count {
            let n = Glibc.pread(fd, buffer.baseAddress! + done, count - done, off_t(offset) + off_t(done))
            if n < 0, errno == EINTR { continue }
            guard n > 0 else { break }
            done += n
        }
        return done
    }

    /// Forgets an open segment (it was removed).
    func forget(_ id: Int64) {
        files.withLock { cache in
            forgets.add(1, ordering: .releasing)
            cache.removeValue(forKey: id)
        }
    }

    func forgetAll() {
        files.withLock { cache in
            forgets.add(1, ordering: .releasing)
            cache.removeAll()
        }
    }

    // MARK: Appending (writer only)

    /// The segment taking appends: its id, an fd open for writing, and where the next chunk goes.
    struct Appender {
        var id: Int64
        var fd: Int32
        var end: Int64
        /// Where writeback was last started, and where the last fdatasync reached.
        var kicked: Int64
        var synced: Int64
        /// Written with O_DIRECT (`directWrites`).
        var direct: Bool
    }
    var appender: Appender?
    /// An fdatasync failed: the kernel may have dropped those pages and a later fdatasync would not
    /// say so, so no commit may name what was appended until the group is rolled back.
    var failedSync = false
    /// Segments made by the open transaction: removed if it is rolled back (their rows go with it).
    var madeInTransaction: [Int64] = []

    /// Appends not yet written to the appending segment: its bytes from `start` to the appender's end.
    ///
    /// Chunks are gathered and written in whole 4 KiB blocks, a `pwrite` each time about a MiB is gathered,
    /// and with O_DIRECT where the filesystem has it: the kernel then copies nothing into its page cache
    /// (low on space, each append is written at once through the page cache instead). Each sealed chunk written
    /// on its own through the page cache made that copy the largest item of a streaming write's profile
    /// (ext4's buffered write path was 46% of the daemon's time), and unaligned writes cost twice aligned
    /// ones (dd of 1 GiB: 0.84–0.91 s of system time against 0.45–0.56 s; O_DIRECT 0.23–0.30 s). With
    /// O_DIRECT a block is written once: a commit pads the last partial block with zeros and the next append
    /// starts at the next block, so a block that committed bytes lie in is never written again while a
    /// reader may be caching it (docs/FORMAT.md, "Segments").
    struct Gathered: @unchecked Sendable {  // its buffers are touched only under `gathered`'s lock
        var segment: Int64 = 0
        var start: Int64 = 0
        var count = 0
        var bytes: UnsafeMutableRawBufferPointer
        /// Whole blocks before `start` being written on `flightQueue` (O_DIRECT appends), until `land`.
        var flight: Flight?
        /// A buffer to gather into while another is in flight.
        var spare: UnsafeMutableRawBufferPointer?
    }

    /// Gathered bytes handed to `flightQueue` to be written while the writer gathers the next ones: an
    /// O_DIRECT write of a MiB waited for the disk (0.5–1.5 ms here) with the filesystem's locks held, so a
    /// streaming write sealed nothing meanwhile. Readers copy from `bytes` until the writer lands it.
    struct Flight: @unchecked Sendable {  // its buffer is only read while the write is under way
        var start: Int64
        var count: Int
        var bytes: UnsafeMutableRawBufferPointer
        /// Set by the flight's write when it failed: no commit may name what was appended until the appender
        /// is closed (the group rolled back).
        var error: StoreError?
        /// The file took O_DIRECT at open but not this write: it went through the page cache, as will the rest.
        var fellBack = false
    }
    /// Runs the flights' writes, one at a time; `flights` is entered while one is under way.
    private let flightQueue = DispatchQueue(label: "coffer.segment-writes")
    private let flights = DispatchGroup()
    /// Tests only: a flight's write waits for this first, so a test can read while one is under way.
    nonisolated(unsafe) var flightGate: DispatchSemaphore?
    /// Written only by the writer, under the lock; a reader takes the lock only when `gatheringSegment` and
    /// `gatheredStart` say its range may reach gathered bytes.
    private let gathered: Mutex<Gathered>
    private let gatheringSegment = Atomic<Int64>(0)
    private let gatheredStart = Atomic<Int64>(.max)
    /// Gathered bytes are written once there are this many.
    static let gatherLength = 1 << 20
    /// Whether appends use O_DIRECT where the filesystem has it (tests turn it off to cover the page
    /// cache path, which filesystems without direct I/O take). Writer only.
    var directWrites = true
    private static let block = 4096

    init(directory: String) {
        self.directory = directory
        gathered = Mutex(Gathered(bytes: .allocate(byteCount: Self.gatherLength + Self.block, alignment: Self.block)))
        let container = (directory as NSString).deletingLastPathComponent
        parent =
            access("/proc/self/fd", F_OK) == 0 ? Glibc.open(container.isEmpty ? "." : container, O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1
        holdDirectory()
    }

    deinit {
        flights.wait()
        gathered.withLock { g in
            g.bytes.deallocate()
            g.spare?.deallocate()
            g.flight?.bytes.deallocate()
        }
        held.withLock { if $0 >= 0 { Glibc.close($0) } }
        if parent >= 0 { Glibc.close(parent) }
    }

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
        if Int64(st.st_size) > end {
            _ = ftruncate(fd, off_t(end))
            forget(id)  // its mapping reaches past the new end: new bytes there are read through a new one
        }
        let direct = directWrites && coffer_set_direct(fd, 1) == 0
        // With O_DIRECT, appends start at the next block (the one `end` lies in holds committed bytes);
        // otherwise the gathered bytes start at that block, its first part read back from the file; if
        // that part cannot be read back, at the next block too, rather than writing over it.
        let block = Int64(Self.block)
        let below = end / block * block, above = (end + block - 1) / block * block
        gathered.withLock { g in
            g.segment = id
            g.start = direct ? above : below
            g.count = direct ? 0 : Self.pread(fd, g.bytes, upTo: Int(end - below), at: below)
            if g.count < Int(end - g.start) {
                g.start = above
                g.count = 0
            }
            gatheredStart.store(g.start, ordering: .releasing)
            gatheringSegment.store(id, ordering: .releasing)
            let from = g.start + Int64(g.count)
            appender = Appender(id: id, fd: fd, end: from, kicked: from, synced: from, direct: direct)
        }
    }

    /// Closes the appending segment; bytes gathered and not written are dropped (no commit names them).
    func closeAppender() {
        flights.wait()
        if let a = appender { Glibc.close(a.fd) }
        appender = nil
        gathered.withLock { g in
            if let f = g.flight { recycle(&g, f.bytes) }
            g.flight = nil
            gatheringSegment.store(0, ordering: .releasing)
            gatheredStart.store(.max, ordering: .releasing)
            g.segment = 0
            g.count = 0
        }
    }

    /// Gathers `bytes` at the appender's end; returns where they go. A failure (a full disk) leaves the
    /// end where it was. With `writeThrough` (the disk is low on space) they go to the file at once,
    /// through the page cache, so a full disk fails the append that does not fit, not a commit later
    /// (which would drop the whole group).
    func append(_ bytes: UnsafeRawBufferPointer, writeThrough: Bool = false) throws(StoreError) -> Int64 {
        guard var a = appender else { throw .database("no segment is open for appending") }
        // A flight lands before the next one leaves, and before anything is written here.
        let full = gathered.withLock { $0.count + bytes.count > $0.bytes.count }
        if full || writeThrough { flights.wait() }
        if writeThrough, a.direct, coffer_set_direct(a.fd, 0) == 0 {
            a.direct = false
            appender = a
        }
        let written = try gathered.withLock { (g: inout Gathered) throws(StoreError) -> Int64? in
            var written: Int64?
            if full || writeThrough { try land(&g) }
            if g.count + bytes.count > g.bytes.count {
                // Low on space, even where O_DIRECT could not be turned off, the write is made here and now. (`appender`,
                // not `a`: a flight that fell back from O_DIRECT was just landed.)
                if appender?.direct == true && !writeThrough { launch(&g, a) } else { written = try write(&g, a, whole: false) }
                if g.count + bytes.count > g.bytes.count {
                    // A chunk longer than the buffer (chunks are 32 KiB; rows allow up to 4 MiB).
                    let larger = UnsafeMutableRawBufferPointer.allocate(
                        byteCount: (g.count + bytes.count + Self.block) / Self.block * Self.block, alignment: Self.block)
                    larger.baseAddress!.copyMemory(from: g.bytes.baseAddress!, byteCount: g.count)
                    g.bytes.deallocate()
                    g.bytes = larger
                }
            }
            (g.bytes.baseAddress! + g.count).copyMemory(from: bytes.baseAddress!, byteCount: bytes.count)
            g.count += bytes.count
            if writeThrough && !a.direct {
                do throws(StoreError) { written = try write(&g, a, whole: true) } catch {
                    g.count -= bytes.count
                    throw error
                }
            }
            return written
        }
        appender?.end += Int64(bytes.count)
        if let written { startWriteback(upTo: written) }
        return a.end
    }

    /// Hands the gathered whole blocks to `flightQueue` (O_DIRECT) and goes on gathering in the spare buffer,
    /// from the partial block they leave. Under `gathered`'s lock, with no flight under way.
    private func launch(_ g: inout Gathered, _ a: Appender) {
        let count = g.count / Self.block * Self.block
        guard count > 0 else { return }
        let size = g.bytes.count
        var next: UnsafeMutableRawBufferPointer
        if let s = g.spare, s.count >= size {
            next = s
        } else {
            g.spare?.deallocate()
            next = .allocate(byteCount: size, alignment: Self.block)
        }
        g.spare = nil
        let kept = g.count - count
        next.baseAddress!.copyMemory(from: g.bytes.baseAddress! + count, byteCount: kept)
        let flight = Flight(start: g.start, count: count, bytes: g.bytes)
        g.flight = flight
        g.bytes = next
        g.start += Int64(count)
        g.count = kept
        // `gatheredStart` stays at the flight's start: readers of its bytes take them from memory until it lands.
        let fd = a.fd, id = a.id, gate = flightGate
        flights.enter()
        flightQueue.async { [self] in
            defer { flights.leave() }
            gate?.wait()
            var done = 0, direct = true
            while done < count {
                let n = pwrite(fd, flight.bytes.baseAddress! + done, count - done, off_t(flight.start) + off_t(done))
                let e = n < 0 ? errno : 0
                if e == EINTR { continue }
                // O_DIRECT taken at open but not for these writes: the page cache from now on (as `write`).
                if direct, e == EINVAL || (n > 0 && n % Self.block != 0), coffer_set_direct(fd, 0) == 0 {
                    direct = false
                    gathered.withLock { $0.flight?.fellBack = true }
                    if n > 0 { done += n }
                    continue
                }
                guard n > 0 else {
                    let error = Self.failure("cannot write segment \(id)", n < 0 ? e : ENOSPC)
                    gathered.withLock { $0.flight?.error = error }
                    return
                }
                done += n
            }
        }
    }

    /// Takes back a flight that has ended (`flights.wait()` first): its buffer becomes the spare, and readers read
    /// its bytes from the file. Throws its write's failure, as often as asked, until `closeAppender`.
    private func land(_ g: inout Gathered) throws(StoreError) {
        guard let f = g.flight else { return }
        if f.fellBack { appender?.direct = false }
        if let e = f.error { throw e }
        recycle(&g, f.bytes)
        g.flight = nil
        gatheredStart.store(g.start, ordering: .releasing)
    }

    private func recycle(_ g: inout Gathered, _ buffer: UnsafeMutableRawBufferPointer) {
        if let s = g.spare, s.count >= buffer.count {
            buffer.deallocate()
        } else {
            g.spare?.deallocate()
            g.spare = buffer
        }
    }

    /// Writes the gathered bytes: the whole blocks, or (`whole`) all of them. Without O_DIRECT a partial
    /// last block stays gathered, and the next write rewrites it with more; with O_DIRECT it is padded with
    /// zeros and the appender's end moves past it. Under `gathered`'s lock; a failure changes nothing (the
    /// next write tries again). Returns how far the file now holds the appended bytes.
    private func write(_ g: inout Gathered, _ a: Appender, whole: Bool) throws(StoreError) -> Int64 {
        var count = whole ? g.count : g.count / Self.block * Self.block
        let padded = a.direct && count % Self.block != 0
        if padded {
            let full = (count + Self.block - 1) / Self.block * Self.block
            (g.bytes.baseAddress! + count).initializeMemory(as: UInt8.self, repeating: 0, count: full - count)
            count = full
        }
        var direct = a.direct
        var done = 0
        while done < count {
            let n = pwrite(a.fd, g.bytes.baseAddress! + done, count - done, off_t(g.start) + off_t(done))
            let e = n < 0 ? errno : 0
            if e == EINTR { continue }
            if direct, e == EINVAL || (n > 0 && n % Self.block != 0), coffer_set_direct(a.fd, 0) == 0 {
                // The filesystem takes O_DIRECT at open but not these writes, or wrote part of a block:
                // the page cache from now on (it takes any length at any offset).
                direct = false
                appender?.direct = false
                if n > 0 { done += n }
                continue
            }
            guard n > 0 else { throw Self.failure("cannot write segment \(a.id)", n < 0 ? e : ENOSPC) }
            done += n
        }
        let written = g.start + Int64(count)
        let passed = padded ? count : count / Self.block * Self.block
        if passed > 0 {
            let kept = max(0, g.count - passed)
            memmove(g.bytes.baseAddress!, g.bytes.baseAddress! + passed, kept)
            g.start += Int64(passed)
            g.count = kept
            gatheredStart.store(g.start, ordering: .releasing)
        }
        return written
    }

    /// Starts writeback of what was written since it last was, every `writebackStep` bytes, so the
    /// fdatasync before a commit waits for little.
    private func startWriteback(upTo written: Int64) {
        guard var a = appender, !a.direct, written - a.kicked >= Self.writebackStep else { return }
        _ = coffer_start_writeback(a.fd, off_t(a.kicked), off_t(written - a.kicked))
        a.kicked = written
        appender = a
    }

    /// Writes what was gathered and fdatasyncs what was appended since the last one: a commit that names
    /// these bytes must not reach the disk before them (docs/FORMAT.md, "Transactions and durability").
    func syncAppender() throws(StoreError) {
        guard !failedSync else { throw .database("an earlier fdatasync of a segment failed") }
        guard let a = appender, a.synced < a.end else { return }
        flights.wait()
        let written = try gathered.withLock { (g: inout Gathered) throws(StoreError) in
            try land(&g)
            return try write(&g, a, whole: true)
        }
        // Past the padding of the last block (O_DIRECT): the next append starts at the next block.
        if written > a.end { appender?.end = written }
        guard fdatasync(a.fd) == 0 else {
            let e = errno
            failedSync = true
            if e == ENOSPC || e == EDQUOT { throw .diskFull }
            throw Self.failure("fdatasync of segment \(a.id)", e)
        }
        if let end = appender?.end { appender?.synced = end }
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
            // A range is freed chunks lying end to end: never longer than a segment can be.
            let longest = Self.segmentLength + Int64(Self.maximumLength)
            for r in group where r.offset >= 0 && r.length > 0 && r.length <= longest && r.offset < Int64.max / 2 {
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
    func allocatedBytes() -> UInt64 { Self.allocatedBytes(directory: directoryPath) }

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
