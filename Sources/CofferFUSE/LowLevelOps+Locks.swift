import CFuse3
import CofferFS
import Glibc

/// File locks, registered only for a filesystem that shares them with other mounts (`sharesLocks`):
/// getlk, setlk (POSIX and OFD locks; the kernel's lock owner tells them apart), flock, and the FLUSH
/// that every close(2) sends with its owner (POSIX: any close drops the process's locks on the file).
/// Otherwise none of these is in the ops table and the kernel keeps locks itself, per mount.
extension LowLevelOps {
    static func getlk(_ req: fuse_req_t?, _ ino: fuse_ino_t, _ fi: UnsafeMutablePointer<fuse_file_info>?, _ lock: UnsafeMutablePointer<flock>?) {
        serve(req) { ctx throws(FSError) in
            let fi = try given(fi, else: .badHandle), lock = try given(lock, else: .invalid)
            guard let type = try lockType(lock.pointee.l_type) else { throw .invalid }
            let (start, end) = try lockRange(lock.pointee)
            var answer = lock.pointee
            answer.l_whence = Int16(SEEK_SET)
            if let held = try ctx.fs.testLock(
                ino, owner: fi.pointee.lock_owner, lock: FileLock(type: type, start: start, end: end, pid: lock.pointee.l_pid))
            {
                answer.l_type = Int16(held.type == .read ? F_RDLCK : F_WRLCK)
                answer.l_start = off_t(held.start)
                answer.l_len = held.end >= FileLock.toEnd ? 0 : off_t(held.end - held.start + 1)
                answer.l_pid = held.pid
            } else {
                answer.l_type = Int16(F_UNLCK)
            }
            fuse_reply_lock(req, &answer)
        }
    }

    static func setlk(
        _ req: fuse_req_t?, _ ino: fuse_ino_t, _ fi: UnsafeMutablePointer<fuse_file_info>?, _ lock: UnsafeMutablePointer<flock>?, _ sleep: Int32
    ) {
        serve(req) { ctx throws(FSError) in
            let fi = try given(fi, else: .badHandle), lock = try given(lock, else: .invalid)
            let type = try lockType(lock.pointee.l_type)
            let (start, end) = try lockRange(lock.pointee)
            let fs = ctx.fs, owner = fi.pointee.lock_owner, handle = fi.pointee.fh, pid = lock.pointee.l_pid
            try lockRequest(ctx, req, ino, wait: sleep != 0 && type != nil) { () throws(FSError) -> Bool in
                try fs.setLock(ino, handle: handle, owner: owner, type: type, start: start, end: end, pid: pid)
            }
            if type == nil { ctx.lockWaiters.kick() }
        }
    }

    static func flock(_ req: fuse_req_t?, _ ino: fuse_ino_t, _ fi: UnsafeMutablePointer<fuse_file_info>?, _ op: Int32) {
        serve(req) { ctx throws(FSError) in
            let fi = try given(fi, else: .badHandle)
            let type: FileLock.LockType?
            switch op & ~LOCK_NB {
            case LOCK_SH: type = .read
            case LOCK_EX: type = .write
            case LOCK_UN: type = nil
            default: throw .invalid
            }
            let fs = ctx.fs, owner = fi.pointee.lock_owner, handle = fi.pointee.fh, pid = caller(req).pid
            try lockRequest(ctx, req, ino, wait: op & LOCK_NB == 0 && type != nil) { () throws(FSError) -> Bool in
                try fs.flock(ino, handle: handle, owner: owner, type: type, pid: Int32(bitPattern: UInt32(truncatingIfNeeded: pid)))
            }
            if type == nil { ctx.lockWaiters.kick() }
        }
    }

    /// A close(2) of a descriptor: the closing process's POSIX locks on the file go.
    static func flush(_ req: fuse_req_t?, _ ino: fuse_ino_t, _ fi: UnsafeMutablePointer<fuse_file_info>?) {
        if let ctx = context(req), let fi {
            ctx.fs.flush(ino, handle: fi.pointee.fh, owner: fi.pointee.lock_owner)
            ctx.lockWaiters.kick()
        }
        replyOK(req)
    }

    /// Tries once. A blocking request that finds the lock held is parked, and a lock granted on a file whose
    /// kernel pages are stale is handed over for the page drop (`LockWaiters` then answers it; nothing is
    /// answered here). Otherwise answers 0, or throws the error for `serve` to answer.
    private static func lockRequest(
        _ ctx: FUSEContext, _ req: fuse_req_t?, _ ino: fuse_ino_t, wait: Bool, _ attempt: @escaping LockWaiters.Attempt
    ) throws(FSError) {
        let stale: Bool
        do throws(FSError) {
            stale = try attempt()
        } catch  where error.errno == EAGAIN && wait {
            guard let req else { throw FSError(EIO) }
            if !ctx.lockWaiters.park(req, ino: ino, attempt) { throw FSError(EINTR) }
            return
        }
        if stale, let req, ctx.lockWaiters.deliver(req, ino: ino) { return }
        replyOK(req)
    }

    private static func lockType(_ t: Int16) throws(FSError) -> FileLock.LockType? {
        switch Int32(t) {
        case F_RDLCK: return .read
        case F_WRLCK: return .write
        case F_UNLCK: return nil
        default: throw .invalid
        }
    }

    /// libfuse hands ranges from l_start with l_len bytes (0: to the end of any file), whence SEEK_SET.
    private static func lockRange(_ l: flock) throws(FSError) -> (UInt64, UInt64) {
        guard l.l_start >= 0, l.l_len >= 0 else { throw .invalid }
        let start = UInt64(l.l_start)
        guard l.l_len > 0 else { return (start, FileLock.toEnd) }
        let (last, overflow) = start.addingReportingOverflow(UInt64(l.l_len) - 1)
        return (start, overflow ? FileLock.toEnd : min(last, FileLock.toEnd))
    }
}
