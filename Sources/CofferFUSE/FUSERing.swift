import CFuse3
import CFuseRing
import Glibc
import Logging

/// FUSE over io_uring, when the kernel offers it (Linux 6.14+ with `enable_uring` set on the fuse module):
/// requests come through ring entries (CFuseRing: one io_uring and one thread each, per CPU queue) instead
/// of read(2) on /dev/fuse, and a reply and the wait for the next request are one system call that wakes
/// no other thread. Measured with libfuse's passthrough example on this kind of machine, 4 KiB random reads
/// ran at 76k against 28–41k requests a second (docs/MEASUREMENTS.md).
///
/// libfuse 3.14 knows nothing of rings, so this sits beside it: `KillPrivHook` makes the rings, asks for the
/// flag in the INIT reply and starts them once it is written; an entry's thread lays each request out as
/// /dev/fuse would and hands it to `fuse_session_process_buf`; the session's writev hook routes each reply to
/// the entry that holds its request (`reply`), and everything else to /dev/fuse: notifications, and replies to
/// requests read there (INIT, and any from before the entries were registered; FORGET and INTERRUPT always
/// come that way and get none).
final class FUSERing: @unchecked Sendable {
    // @unchecked: `handle` is the C rings, used from many threads; the C side locks what it shares.
    private let handle: OpaquePointer

    private init(handle: OpaquePointer) { self.handle = handle }

    /// Frees the rings once nothing can reply through them (a lock waiter may hold this object after `stop`).
    deinit { coffer_ring_free(handle) }

    /// Entries per CPU queue: a request that blocks (an fsync waiting for its commit) holds up only its
    /// own entry, and a streaming reader's readahead is decrypted on more than one thread.
    static let entriesPerQueue: UInt32 = 3

    /// Makes the entries on `fd` (the session's /dev/fuse); nil when they could not be made (requests keep
    /// coming through /dev/fuse then). `run` starts them.
    static func make(fd: Int32, payloadSize: Int, context: FUSEContext) -> FUSERing? {
        let userdata = Unmanaged.passUnretained(context).toOpaque()
        guard let handle = coffer_ring_start(fd, entriesPerQueue, payloadSize, handleRequest, entryFailed, userdata) else {
            context.logger.warning(
                "FUSE: io_uring entries could not be made; requests come through /dev/fuse",
                metadata: ["error": "\(String(cString: strerror(errno)))"])
            return nil
        }
        return FUSERing(handle: handle)
    }

    /// Sends a reply through the entry that holds its request. nil: no entry holds it (write it to
    /// /dev/fuse); otherwise writev's result.
    func reply(_ iov: UnsafePointer<iovec>, _ count: Int32) -> Int? {
        let n = coffer_ring_reply(handle, iov, count)
        if n == -1 { return nil }
        return n < 0 ? -1 : n
    }

    /// Starts the entries' threads, which register them: call once this ring answers `context.ring`, since a
    /// request may come the moment an entry is registered and its reply must find the entry.
    func run() -> Int32 { coffer_ring_run(handle) }

    /// Requests that came through the rings so far.
    var requests: UInt64 { coffer_ring_requests(handle) }

    /// Stops the entries' threads (after the session loop ended and lock waiters were answered).
    func stop() { coffer_ring_stop(handle) }

    /// On an entry's thread: one request, laid out as read(2) gives it.
    private static let handleRequest: coffer_ring_handler = { userdata, request, length in
        guard let userdata, let request else { return }
        let context = Unmanaged<FUSEContext>.fromOpaque(userdata).takeUnretainedValue()
        KillPrivHook.noted(request, length, userdata)
        guard let se = context.session.withLock({ $0?.pointer }) else {
            ReplyCheck.finishPrevious(-1, logger: nil, ring: context.ring)  // the loop is over: answer EIO
            return
        }
        var buf = fuse_buf()
        buf.mem = request
        buf.size = length
        fuse_session_process_buf(se, &buf)
        ReplyCheck.finishPrevious(-1, logger: context.logger, ring: context.ring)
    }

    /// On an entry's thread that ends on an error.
    private static let entryFailed: coffer_ring_failed = { userdata, error, registering in
        guard let userdata else { return }
        Unmanaged<FUSEContext>.fromOpaque(userdata).takeUnretainedValue().ringFailed(error, registering: registering != 0)
    }
}
