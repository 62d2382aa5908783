import CFuse3
import CofferFS
import Foundation
import Glibc
import Synchronization

/// Requests answered only after the kernel dropped some of its pages of a file
/// (`fuse_lowlevel_notify_inval_inode` with an offset), on one thread of this mount instead of the worker
/// that read them: such a drop waits for pages that READs hold locked and launders dirty pages as WRITEs,
/// and both need free workers. With the wait on a worker, as many concurrent seeks as workers froze the
/// mount for good (a tester's find).
///
/// - SEEK_DATA and SEEK_HOLE under the writeback cache. The kernel may hold written pages the daemon has
///   not seen, and FUSE_LSEEK does not write them back, so each seek first has the kernel do it (the drop
///   from the offset on) and then answers from the chunk map.
/// - O_DIRECT writes into the page that holds a file's end when that end is not on a page boundary
///   (`stalePage`). The kernel sets the file's new size when the WRITE is answered and drops its pages of the
///   range only after that: a reader that had that page (zeros after the old end) and sees the new size in
///   between reads those zeros (a tester's `tail -f` of `dd bs=4097 oflag=direct`). The page is dropped
///   before the answer, with or without the writeback cache (without it the kernel drops the range before
///   the WRITE, and a READ in between brings the page back: a reader on a PostgreSQL mount saw those zeros
///   under load). What is left is the kernel's own window, as on any filesystem: a reader that took
///   the page just before the drop and reads the size just after the answer. Only O_DIRECT writes: a
///   write-through WRITE holds that very page locked until it is answered, so a drop of it would wait for
///   ever; one that carries O_DIRECT all the same is answered after `patience` (1 s).
///
/// Over io_uring a request holds its ring entry until it is answered, so a request parked here would still
/// take an entry the READs and WRITEs may need: there the kernel keeps SEEK_DATA and SEEK_HOLE (ENOSYS), and
/// only one direct write at a time waits here (each queue has three entries, so two usually stay free for
/// the READs and WRITEs its page drop waits for); while one does, the others are answered at once.
final class PageDropReplies: Sendable {
    private struct Request: @unchecked Sendable { let req: fuse_req_t }
    private let queue = DispatchQueue(label: "coffer-page-drops")
    private let running = DispatchGroup()
    /// The session while it can take replies and notifications; nil once `stop` was called.
    private let session = Mutex<FUSEContext.SessionPointer?>(nil)
    /// Whether a direct write that came through io_uring is waiting here (holding its ring entry).
    private let ringEntryHeld = Atomic<Bool>(false)

    func start(session se: OpaquePointer) { session.withLock { $0 = FUSEContext.SessionPointer(pointer: se) } }

    /// Takes a seek: it is answered here, later (EINTR when the mount is stopping).
    func seek(_ req: fuse_req_t, ino: UInt64, offset: off_t, whence: Int32, fs: any FileSystemOperations) {
        later(req) { req, se in
            // With the session gone nothing can be laundered any more, so the chunk map may be behind.
            guard let se else {
                fuse_reply_err(req, EINTR)
                return
            }
            _ = fuse_lowlevel_notify_inval_inode(se, ino, offset, 0)
            do throws(FSError) {
                let at = try fs.seek(ino, offset: UInt64(offset), whence: whence)
                fuse_reply_lseek(req, off_t(at))
            } catch { fuse_reply_err(req, error.errno > 0 ? error.errno : EIO) }
        }
    }

    /// Takes a direct write the filesystem has done: the kernel's page at `page` is dropped, then the WRITE
    /// is answered `written` (also when the mount is stopping: the write was done), or after `patience` if the
    /// drop is still waiting by then (`Once`). False when it was not taken (`throughRing` while another
    /// ring entry waits here): the caller answers it.
    func write(_ req: fuse_req_t, ino: UInt64, dropping page: off_t, written: Int, throughRing: Bool) -> Bool {
        if throughRing {
            guard ringEntryHeld.compareExchange(expected: false, desired: true, ordering: .acquiringAndReleasing).exchanged
            else { return false }
        }
        let once = Once()
        let answer: @Sendable (fuse_req_t) -> Void = { [self] req in
            guard once.claim() else { return }
            // Free before the answer: the writer's next WRITE may come at once, and the drop is over.
            if throughRing { ringEntryHeld.store(false, ordering: .releasing) }
            fuse_reply_write(req, written)
        }
        later(req) { req, se in
            if let se { _ = fuse_lowlevel_notify_inval_inode(se, ino, page, 1) }
            answer(req)
        }
        // The drop waits for that page if a WRITE holds it locked until it is answered: a write-through (a set-id
        // file written by its non-owner, or on a mount without the writeback cache the kernel's buffered rest of a
        // direct write that came back short), which the file's O_DIRECT flag does not tell apart. Answering it
        // lets the drop finish; it is only the kernel's own window that stays open then. Not counted in `running`:
        // a drop still waiting holds it already (so the session outlives this answer), and one that ended has
        // answered (so this does nothing), and an unmount need not wait out the timer.
        let r = Request(req: req)
        DispatchQueue.global().asyncAfter(deadline: .now() + Self.patience) { answer(r.req) }
        return true
    }

    /// How long a direct write waits for its page drop before it is answered anyway.
    static let patience: DispatchTimeInterval = .seconds(1)

    /// One answer per request, from whichever of the drop and the patience timer comes first (the other must
    /// not touch the request: libfuse frees it with the answer).
    private final class Once: Sendable {
        private let taken = Atomic<Bool>(false)
        func claim() -> Bool { taken.compareExchange(expected: false, desired: true, ordering: .acquiringAndReleasing).exchanged }
    }

    /// The page of a direct write's range that the kernel may hold with zeros where the write put data: the
    /// one holding the file's end before the write (`oldSize`), when that end is not on a page boundary and the
    /// write puts data in that page past it. Pages wholly past the old end were never read; pages wholly
    /// before it held data.
    static func stalePage(oldSize: UInt64, offset: off_t, written: Int) -> off_t? {
        let pageSize = UInt64(max(4096, sysconf(Int32(_SC_PAGESIZE))))
        guard offset >= 0, written > 0, oldSize % pageSize != 0 else { return nil }
        let start = UInt64(offset), page = oldSize - oldSize % pageSize
        guard start < page + pageSize, start + UInt64(written) > oldSize else { return nil }
        return off_t(page)
    }

    /// Runs `answer` on this mount's thread with the session (nil once stopping); it must answer the request.
    private func later(_ req: fuse_req_t, _ answer: @escaping @Sendable (fuse_req_t, OpaquePointer?) -> Void) {
        ReplyCheck.handedOff()
        let r = Request(req: req)
        running.enter()
        queue.async { [self] in
            defer { running.leave() }
            // The pointer is used outside its lock (a drop waits for READs and WRITEs); `stop` waits for it.
            answer(r.req, session.withLock { $0?.pointer })
        }
    }

    /// Stops dropping pages: requests not started are answered without a drop (seeks EINTR), one in progress is
    /// waited for at most `timeout` seconds. Called before the ring entries stop, so that answers still go
    /// through them, and again once the mount is gone. False if one did not end (a drop waiting for a READ or
    /// WRITE no worker reads any more): the session must then stay.
    @discardableResult
    func stop(timeout: Double) -> Bool {
        session.withLock { $0 = nil }
        return running.wait(timeout: .now() + timeout) == .success
    }
}
