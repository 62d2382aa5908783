import CFuse3
import CofferFS
import Foundation
import Glibc

/// Lock requests that cannot be answered by the worker that read them, on a filesystem that shares its
/// locks (`sharesLocks`), answered by one thread of this mount instead:
///
/// - blocking requests (F_SETLKW, F_OFD_SETLKW, flock without LOCK_NB) whose first attempt found the lock
///   held: parked here instead of holding a worker (there are only cores+1 of them), and tried again (at
///   once after an unlock on this mount, else every 50 ms growing to 300 ms: another mount's unlock is
///   seen within that);
/// - granted locks on a file another mount changed: the kernel's pages of the file are dropped before the
///   answer (`fuse_lowlevel_notify_inval_inode`). Not on a worker: the kernel waits there for pages that
///   READs hold locked, and READs need workers.
///
/// Exactly one reply per request handed over, whatever happens: a request is answered by whoever takes it
/// off the list, in the same hold of `cond`: this thread (0 when granted, the error when an attempt fails
/// otherwise than EAGAIN, EINTR when the caller was interrupted) or `stop` (EINTR to all; called when the
/// session loop has ended, before the session is unmounted and destroyed). `stop` waits for nothing: an
/// attempt still running then finds its request gone and answers nothing (a lock it got meanwhile goes
/// with the mount's other locks at shutdown). The libfuse calls made with `cond` held (a reply,
/// `fuse_req_interrupted`) take only libfuse's session lock, which libfuse never holds while it calls the
/// interrupt callback; the callback only marks and wakes. Page drops run outside `cond`, counted, and
/// `detach` bounds the wait for one at the end (one blocked on a READ nobody answers any more: the session
/// is then left to the process's exit, as `PageCacheFiller`'s).
final class LockWaiters: @unchecked Sendable {
    /// One try: true when granted on a file whose kernel pages are stale; throws EAGAIN while held elsewhere.
    typealias Attempt = @Sendable () throws(FSError) -> Bool

    private final class Waiter {
        let req: fuse_req_t
        let ino: UInt64
        /// nil: already granted, only the page drop and the answer are left.
        let attempt: Attempt?
        var interrupted = false
        init(_ req: fuse_req_t, _ ino: UInt64, _ attempt: Attempt?) {
            self.req = req
            self.ino = ino
            self.attempt = attempt
        }
    }

    private let cond = NSCondition()
    private var waiters: [Waiter] = []
    private var stopped = false
    private var kicked = false
    private var started = false
    /// The session for page drops (nil before `attach` and after `detach`), and drops under way. Under `gate`.
    private let gate = NSCondition()
    private var session: OpaquePointer?
    private var dropping = 0

    /// Takes over `req` after its first attempt found the lock held elsewhere. True: this object answers it
    /// from now on. False (the mount is ending): the caller answers it (EINTR).
    func park(_ req: fuse_req_t, ino: UInt64, _ attempt: @escaping Attempt) -> Bool {
        // Before the request is listed (it could be answered at once after); an interrupt that came
        // already calls the callback right here (it finds nothing) and shows in fuse_req_interrupted below.
        fuse_req_interrupt_func(req, LockWaiters.onInterrupt, Unmanaged.passUnretained(self).toOpaque())
        return add(req, ino, attempt)
    }

    /// Takes over a granted request whose file's pages must be dropped before it is answered 0. False (the
    /// mount is ending): the caller answers it.
    func deliver(_ req: fuse_req_t, ino: UInt64) -> Bool { add(req, ino, nil) }

    private func add(_ req: fuse_req_t, _ ino: UInt64, _ attempt: Attempt?) -> Bool {
        cond.lock()
        defer { cond.unlock() }
        guard !stopped else { return false }
        let w = Waiter(req, ino, attempt)
        if attempt != nil { w.interrupted = fuse_req_interrupted(req) != 0 }
        waiters.append(w)
        ReplyCheck.handedOff()  // the worker's request is answered from the waiter thread
        kicked = true
        if !started {
            started = true
            let t = Thread { [self] in run() }
            t.name = "coffer-lockwait"
            t.start()
        }
        cond.broadcast()
        return true
    }

    /// A lock was given back on this mount: try the parked requests now.
    func kick() {
        cond.lock()
        if !waiters.isEmpty {
            kicked = true
            cond.broadcast()
        }
        cond.unlock()
    }

    /// Answers every request still here EINTR and stops the thread (without waiting for it). Idempotent.
    func stop() {
        cond.lock()
        defer { cond.unlock() }
        stopped = true
        for w in waiters { fuse_reply_err(w.req, EINTR) }
        waiters = []
        cond.broadcast()
    }

    /// The session pages are dropped in, once its loop runs.
    func attach(_ se: OpaquePointer) {
        gate.lock()
        session = se
        gate.unlock()
    }

    /// After `stop`: no page drop starts any more; waits up to `timeout` seconds for one under way. False
    /// when one is still under way: the session must not be destroyed.
    func detach(timeout: Double = 2) -> Bool {
        gate.lock()
        defer { gate.unlock() }
        session = nil
        let deadline = Date().addingTimeInterval(timeout)
        while dropping > 0 && gate.wait(until: deadline) {}
        return dropping == 0
    }

    /// libfuse calls this from the worker that read the FUSE_INTERRUPT (holding the request's own lock),
    /// or from `fuse_req_interrupt_func` when the interrupt came first. It answers nothing itself.
    private static let onInterrupt: fuse_interrupt_func_t = { req, data in
        guard let req, let data else { return }
        let me = Unmanaged<LockWaiters>.fromOpaque(data).takeUnretainedValue()
        me.cond.lock()
        for w in me.waiters where w.req == req { w.interrupted = true }
        me.kicked = true
        me.cond.broadcast()
        me.cond.unlock()
    }

    private func run() {
        coffer_name_this_thread("coffer-lockwait")
        var pause = 0.05
        while true {
            cond.lock()
            while waiters.isEmpty && !stopped { cond.wait() }
            if !kicked && !stopped { _ = cond.wait(until: Date().addingTimeInterval(pause)) }
            let wasKicked = kicked
            kicked = false
            if stopped {
                cond.unlock()
                return
            }
            let batch = waiters
            cond.unlock()
            for w in batch { serve(w) }
            pause = wasKicked ? 0.05 : min(pause * 1.5, 0.3)
        }
    }

    private func serve(_ w: Waiter) {
        guard let attempt = w.attempt else {
            dropPages(w.ino)
            reply(w, 0)
            return
        }
        if isInterrupted(w) {
            reply(w, EINTR)
            return
        }
        do throws(FSError) {
            if try attempt() { dropPages(w.ino) }
            reply(w, 0)
        } catch  where error.errno == EAGAIN {
            return  // still held elsewhere: next round
        } catch {
            reply(w, error.errno > 0 ? error.errno : EIO)
        }
    }

    private func dropPages(_ ino: UInt64) {
        gate.lock()
        guard let se = session else {
            gate.unlock()
            return
        }
        dropping += 1
        gate.unlock()
        _ = fuse_lowlevel_notify_inval_inode(se, ino, 0, 0)
        gate.lock()
        dropping -= 1
        gate.broadcast()
        gate.unlock()
    }

    private func isInterrupted(_ w: Waiter) -> Bool {
        cond.lock()
        defer { cond.unlock() }
        return w.interrupted
    }

    /// Answers `w` if it is still listed (`stop` may have answered it), taking it off the list. Under
    /// `cond`, so that once `stop` has returned no reply can follow (the session is destroyed next).
    private func reply(_ w: Waiter, _ errno: Int32) {
        cond.lock()
        defer { cond.unlock() }
        guard let i = waiters.firstIndex(where: { $0 === w }) else { return }
        waiters.remove(at: i)
        fuse_reply_err(w.req, errno)
    }
}
