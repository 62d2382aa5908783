import CFuse3
import Foundation

/// Hands the decrypted bytes a READ did not ask for (the rest of the chunks it lay in) to the kernel's page
/// cache with FUSE_NOTIFY_STORE, so later reads in those chunks need no request at all.
///
/// Only on read-only mounts: a store overwrites whatever page the kernel holds, dirty or not (fs/fuse/dev.c
/// `fuse_notify_store` grabs and copies into every page of the range). On a writable mount it could put older
/// bytes over a write still in the kernel's page cache (writeback cache) or sent but not yet applied
/// (write-through: the kernel fills its pages before the WRITE), and with no OPEN or RELEASE reaching us
/// (`opensWithoutHandles`) nothing tells us whether a writer exists.
///
/// Runs on a thread of its own: the kernel locks each page it stores into, and a page that a READ holds
/// locked, waiting for a worker, would otherwise block the worker that stores (all of them, in the worst case).
/// Bounded: what does not fit in `limit` queued bytes is dropped (the kernel asks for it again if it needs it).
final class PageCacheFiller: @unchecked Sendable {
    // @unchecked: everything mutable is guarded by `condition`.
    private struct Job {
        let ino: UInt64
        let start: UInt64
        let bytes: [UInt8]
        let ranges: [Range<Int>]
    }

    private let condition = NSCondition()
    private var jobs: [Job] = []
    private var queued = 0
    private var stopping = false
    private var running = false
    private var session: OpaquePointer?
    private let limit: Int
    private let done = DispatchSemaphore(value: 0)

    init(limit: Int = 4 << 20) { self.limit = limit }

    /// Starts the thread that sends the stores of `session`.
    func start(session: OpaquePointer) {
        condition.lock()
        self.session = session
        running = true
        condition.unlock()
        let thread = Thread { [self] in run() }
        thread.name = "coffer-pagefill"
        thread.start()
    }

    /// Queues the whole pages of `bytes` (file offset `start`, page aligned) outside `asked`, the part the
    /// READ's reply carried. `bytes` ends at a page boundary or at the end of the file.
    func offer(ino: UInt64, start: UInt64, bytes: [UInt8], asked: Range<Int>) {
        let page = 4096
        guard start % UInt64(page) == 0 else { return }
        var ranges: [Range<Int>] = []
        let head = asked.lowerBound / page * page
        if head > 0 { ranges.append(0..<head) }
        let tail = (asked.upperBound + page - 1) / page * page
        if tail < bytes.count { ranges.append(tail..<bytes.count) }
        ranges = ranges.map { $0.clamped(to: 0..<bytes.count) }.filter { !$0.isEmpty }
        guard !ranges.isEmpty else { return }
        // The job keeps all of `bytes`, not only the ranges: that is what the bound must count.
        let size = bytes.count
        condition.lock()
        defer { condition.unlock() }
        guard running, !stopping, queued + size <= limit else { return }
        jobs.append(Job(ino: ino, start: start, bytes: bytes, ranges: ranges))
        queued += size
        condition.signal()
    }

    /// Stops the thread; waits at most `timeout` seconds for a store in progress (one blocked on a page that a
    /// READ no worker answers any more). Returns false if the thread did not end: the session must then stay.
    func stop(timeout: Double = 2) -> Bool {
        condition.lock()
        let wasRunning = running
        stopping = true
        jobs.removeAll()
        queued = 0
        condition.signal()
        condition.unlock()
        guard wasRunning else { return true }
        return done.wait(timeout: .now() + timeout) == .success
    }

    private func run() {
        while true {
            condition.lock()
            while jobs.isEmpty && !stopping { condition.wait() }
            if stopping {
                condition.unlock()
                break
            }
            let job = jobs.removeFirst()
            let se = session
            condition.unlock()
            job.bytes.withUnsafeBytes { raw in
                for r in job.ranges { store(se, job.ino, job.start + UInt64(r.lowerBound), UnsafeRawBufferPointer(rebasing: raw[r])) }
            }
            condition.lock()
            queued -= job.bytes.count
            condition.unlock()
        }
        done.signal()
    }

    private func store(_ se: OpaquePointer?, _ ino: UInt64, _ offset: UInt64, _ bytes: UnsafeRawBufferPointer) {
        guard let base = bytes.baseAddress else { return }
        var buf = fuse_buf()
        buf.size = bytes.count
        buf.mem = UnsafeMutableRawPointer(mutating: base)
        buf.fd = -1
        var bufv = fuse_bufvec(count: 1, idx: 0, off: 0, buf: (buf))
        // An error (the kernel forgot the inode, the mount is going) only means the kernel asks again later.
        _ = fuse_lowlevel_notify_store(se, fuse_ino_t(ino), off_t(offset), &bufv, fuse_buf_copy_flags(0))
    }
}
