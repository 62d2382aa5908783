import Glibc
import Logging

/// Makes sure every request read from /dev/fuse gets exactly one answer, so that a request a handler
/// dropped is an EIO and a log line instead of a mount that hangs (the kernel waits for an answer
/// forever, and so does every caller that needs the same inode, umount included).
///
/// libfuse processes a request on the thread that read it, and the handlers answer on that thread
/// before they return. So when a worker comes back for its next request, the previous one must have
/// been answered: `KillPrivHook` calls `began` for each request it reads, `answered` for each reply
/// written, and `finishPrevious` before the next read, which answers EIO (and logs the request's
/// opcode) when no reply went out. A handler that deliberately answers later, from another thread,
/// says so with `handedOff`.
enum ReplyCheck {
    /// The request the calling thread read last.
    final class Slot {
        var unique: UInt64 = 0
        var opcode: UInt32 = 0
        var answered = true
    }

    private static let key: pthread_key_t? = {
        var key = pthread_key_t()
        return pthread_key_create(&key, nil) == 0 ? key : nil
    }()

    /// The thread's slot; made on its first request and kept for the thread's life (workers are few
    /// and live as long as the session).
    private static func slot() -> Slot? {
        guard let key else { return nil }
        if let p = pthread_getspecific(key) { return Unmanaged<Slot>.fromOpaque(p).takeUnretainedValue() }
        let s = Slot()
        pthread_setspecific(key, Unmanaged.passRetained(s).toOpaque())
        return s
    }

    /// FORGET, INTERRUPT, NOTIFY_REPLY and BATCH_FORGET get no reply.
    private static func expectsReply(_ opcode: UInt32) -> Bool { ![2, 36, 41, 42].contains(opcode) }

    static func began(unique: UInt64, opcode: UInt32) {
        guard let s = slot() else { return }
        s.unique = unique
        s.opcode = opcode
        s.answered = !expectsReply(opcode)
    }

    /// A reply (not a notification: those carry unique 0) is being written.
    static func answered(unique: UInt64) {
        guard unique != 0, let s = slot(), s.unique == unique else { return }
        s.answered = true
    }

    /// The calling thread's request will be answered by another thread.
    static func handedOff() { slot()?.answered = true }

    /// Before the thread reads again: answers EIO for its previous request if nothing answered it, through
    /// `ring` when a ring entry holds that request, else on `fd`.
    static func finishPrevious(_ fd: Int32, logger: Logger?, ring: FUSERing?) {
        guard let s = slot(), !s.answered else { return }
        s.answered = true
        logger?.error("FUSE: request \(s.unique) (opcode \(s.opcode)) was not answered by its handler; answering EIO")
        // struct fuse_out_header: len (u32), error (i32), unique (u64).
        var header = [UInt8](repeating: 0, count: 16)
        header.withUnsafeMutableBytes { h in
            h.storeBytes(of: UInt32(16), toByteOffset: 0, as: UInt32.self)
            h.storeBytes(of: -EIO, toByteOffset: 4, as: Int32.self)
            h.storeBytes(of: s.unique, toByteOffset: 8, as: UInt64.self)
        }
        header.withUnsafeMutableBytes { h in
            var iov = iovec(iov_base: h.baseAddress, iov_len: h.count)
            if ring?.reply(&iov, 1) == nil && fd >= 0 { _ = Glibc.write(fd, h.baseAddress, h.count) }
        }
    }
}
