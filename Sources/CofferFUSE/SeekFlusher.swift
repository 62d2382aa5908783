import CFuse3
import CofferFS
import Foundation
import Glibc
import Synchronization

/// SEEK_DATA and SEEK_HOLE under the writeback cache, answered off the workers. The kernel may hold written
/// pages the daemon has not seen, and FUSE_LSEEK does not write them back, so each seek first has the kernel
/// do it (FUSE_NOTIFY_INVAL_INODE from the offset on launders dirty pages as WRITEs, then drops the pages)
/// and then answers from the chunk map. The WRITEs need free workers: with the wait on a worker, as many
/// concurrent seeks as workers froze the mount for good (a tester's find). Here one thread takes the seeks in
/// turn and replies itself; the worker that read the request goes back at once.
///
/// Over io_uring a request holds its ring entry until it is answered, so a seek parked here would still take
/// an entry the WRITEs may need: there the kernel keeps SEEK_DATA and SEEK_HOLE (ENOSYS).
final class SeekFlusher: Sendable {
    private struct Request: @unchecked Sendable { let req: fuse_req_t }
    private let queue = DispatchQueue(label: "coffer-seek")
    private let running = DispatchGroup()
    /// The session while it can take replies and notifications; nil once `stop` was called.
    private let session = Mutex<FUSEContext.SessionPointer?>(nil)

    func start(session se: OpaquePointer) { session.withLock { $0 = FUSEContext.SessionPointer(pointer: se) } }

    /// Takes the request: it is answered here, later (EINTR when the mount is stopping).
    func take(_ req: fuse_req_t, ino: UInt64, offset: off_t, whence: Int32, fs: any FileSystemOperations) {
        let r = Request(req: req)
        running.enter()
        queue.async { [self] in
            defer { running.leave() }
            // The pointer is used outside its lock (the notification waits for WRITEs); `stop` waits for it.
            guard let se = session.withLock({ $0?.pointer }) else {
                fuse_reply_err(r.req, EINTR)
                return
            }
            _ = fuse_lowlevel_notify_inval_inode(se, ino, offset, 0)
            do throws(FSError) {
                let at = try fs.seek(ino, offset: UInt64(offset), whence: whence)
                fuse_reply_lseek(r.req, off_t(at))
            } catch { fuse_reply_err(r.req, error.errno > 0 ? error.errno : EIO) }
        }
    }

    /// Stops: seeks not started are answered EINTR, one in progress is waited for at most `timeout` seconds.
    /// False if it did not end (a notification waiting for a WRITE no worker reads any more): the session
    /// must then stay.
    func stop(timeout: Double = 2) -> Bool {
        session.withLock { $0 = nil }
        return running.wait(timeout: .now() + timeout) == .success
    }
}
