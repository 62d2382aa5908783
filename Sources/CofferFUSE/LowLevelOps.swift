import CFuse3
import CofferFS
import Glibc
import Logging

/// The `fuse_lowlevel_ops` table. Each C callback is a capture-free closure forwarding to a static function;
/// the filesystem is reached through `fuse_req_userdata`. The ops are split by concern as gocryptfs's
/// fusefrontend is: names and attributes (LowLevelOps+Nodes), file content (+Files), directories
/// (+Directories), extended attributes (+Xattrs); here the table, the plumbing, the lifecycle and statfs.
enum LowLevelOps {
    static func make(sharesLocks: Bool = false) -> fuse_lowlevel_ops {
        var ops = fuse_lowlevel_ops()
        ops.`init` = { userdata, conn in LowLevelOps.initialize(userdata, conn) }
        ops.destroy = { userdata in LowLevelOps.destroy(userdata) }
        ops.lookup = { req, parent, name in LowLevelOps.lookup(req, parent, name) }
        ops.forget = { req, ino, n in LowLevelOps.forget(req, ino, n) }
        ops.forget_multi = { req, count, list in LowLevelOps.forgetMulti(req, count, list) }
        ops.getattr = { req, ino, _ in LowLevelOps.getattr(req, ino) }
        ops.setattr = { req, ino, attr, toSet, fi in LowLevelOps.setattr(req, ino, attr, toSet, fi) }
        ops.readlink = { req, ino in LowLevelOps.readlink(req, ino) }
        ops.mknod = { req, parent, name, mode, rdev in LowLevelOps.mknod(req, parent, name, mode, rdev) }
        ops.mkdir = { req, parent, name, mode in LowLevelOps.mkdir(req, parent, name, mode) }
        ops.unlink = { req, parent, name in LowLevelOps.unlink(req, parent, name) }
        ops.rmdir = { req, parent, name in LowLevelOps.rmdir(req, parent, name) }
        ops.symlink = { req, target, parent, name in LowLevelOps.symlink(req, target, parent, name) }
        ops.rename = { req, parent, name, newParent, newName, flags in
            LowLevelOps.rename(req, parent, name, newParent, newName, flags)
        }
        ops.link = { req, ino, newParent, newName in LowLevelOps.link(req, ino, newParent, newName) }
        ops.open = { req, ino, fi in LowLevelOps.open(req, ino, fi) }
        ops.read = { req, ino, size, off, fi in LowLevelOps.read(req, ino, size, off, fi) }
        ops.write = { req, ino, buf, size, off, fi in LowLevelOps.write(req, ino, buf, size, off, fi) }
        // No flush (unless locks are shared, below): close has nothing to do (changes go out with the
        // group commit; locks are kernel-local). libfuse answers ENOSYS once and the kernel stops sending FLUSH; `noflush`
        // alone is ignored by the kernel when the writeback cache is on.
        ops.release = { req, ino, fi in LowLevelOps.release(req, ino, fi) }
        ops.fsync = { req, ino, datasync, fi in LowLevelOps.fsync(req, ino, datasync, fi) }
        ops.opendir = { req, ino, fi in LowLevelOps.opendir(req, ino, fi) }
        ops.readdir = { req, ino, size, off, fi in LowLevelOps.readdir(req, ino, size, off, fi, plus: false) }
        ops.readdirplus = { req, ino, size, off, fi in LowLevelOps.readdir(req, ino, size, off, fi, plus: true) }
        ops.releasedir = { req, ino, fi in LowLevelOps.releasedir(req, ino, fi) }
        ops.fsyncdir = { req, ino, datasync, fi in LowLevelOps.fsyncdir(req, ino, datasync, fi) }
        ops.statfs = { req, _ in LowLevelOps.statfs(req) }
        ops.setxattr = { req, ino, name, value, size, flags in LowLevelOps.setxattr(req, ino, name, value, size, flags) }
        ops.getxattr = { req, ino, name, size in LowLevelOps.getxattr(req, ino, name, size) }
        ops.listxattr = { req, ino, size in LowLevelOps.listxattr(req, ino, size) }
        ops.removexattr = { req, ino, name in LowLevelOps.removexattr(req, ino, name) }
        ops.create = { req, parent, name, mode, fi in LowLevelOps.create(req, parent, name, mode, fi) }
        ops.fallocate = { req, ino, mode, off, len, fi in LowLevelOps.fallocate(req, ino, mode, off, len, fi) }
        ops.lseek = { req, ino, off, whence, fi in LowLevelOps.lseek(req, ino, off, whence, fi) }
        if sharesLocks {
            // Locks shared with other mounts (LowLevelOps+Locks): every close must reach us with its owner.
            ops.getlk = { req, ino, fi, lock in LowLevelOps.getlk(req, ino, fi, lock) }
            ops.setlk = { req, ino, fi, lock, sleep in LowLevelOps.setlk(req, ino, fi, lock, sleep) }
            ops.flock = { req, ino, fi, op in LowLevelOps.flock(req, ino, fi, op) }
            ops.flush = { req, ino, fi in LowLevelOps.flush(req, ino, fi) }
        }
        return ops
    }

    // MARK: - Plumbing

    /// Runs one request: `body` gets the mount's context and sends the reply when it succeeds; an error it
    /// throws is the reply (EIO when the request has no context). Every op that answers goes through here,
    /// and counts as use of the mount (`-o idle=`) unless `use` is false (what `df MOUNT` asks: statfs and the
    /// root's attributes) or the daemon itself asked (its watchdog's stat and statvfs).
    @inline(__always)
    static func serve(_ req: fuse_req_t?, use: Bool = true, _ body: (FUSEContext) throws(FSError) -> Void) {
        guard let req, let raw = fuse_req_userdata(req) else {
            fuse_reply_err(req, EIO)
            return
        }
        let ctx = Unmanaged<FUSEContext>.fromOpaque(raw).takeUnretainedValue()
        if use && ctx.countsActivity && fuse_req_ctx(req)?.pointee.pid != ctx.ownPid { ctx.activity.add(1, ordering: .relaxed) }
        do { try body(ctx) } catch { fuse_reply_err(req, error.errno > 0 ? error.errno : EIO) }
    }

    /// The context of a request that gets no error reply (forget, release).
    @inline(__always)
    static func context(_ req: fuse_req_t?) -> FUSEContext? {
        guard let req, let raw = fuse_req_userdata(req) else { return nil }
        return Unmanaged<FUSEContext>.fromOpaque(raw).takeUnretainedValue()
    }

    @inline(__always)
    static func caller(_ req: fuse_req_t?) -> Caller {
        guard let req, let c = fuse_req_ctx(req) else { return Caller(uid: 65534, gid: 65534) }
        return Caller(uid: c.pointee.uid, gid: c.pointee.gid, pid: c.pointee.pid, umask: c.pointee.umask)
    }

    /// A name the kernel passed: EINVAL when there is none.
    @inline(__always)
    static func name(_ p: UnsafePointer<CChar>?) throws(FSError) -> [UInt8] {
        guard let bytes = nameBytes(p) else { throw .invalid }
        return bytes
    }

    /// An argument the kernel should have passed; `error` when it did not.
    @inline(__always)
    static func given<T>(_ value: T?, else error: FSError) throws(FSError) -> T {
        guard let value else { throw error }
        return value
    }

    @inline(__always)
    static func replyOK(_ req: fuse_req_t?) { fuse_reply_err(req, 0) }

    /// Replies with an entry; when the kernel did not take it, undoes the lookup reference.
    static func replyEntry(_ ctx: FUSEContext, _ req: fuse_req_t?, _ attributes: Attributes) {
        var e = ctx.entryParam(attributes)
        if fuse_reply_entry(req, &e) != 0 {
            ctx.fs.forget(attributes.ino, lookups: 1)
        }
    }

    // MARK: - Lifecycle

    static func initialize(_ userdata: UnsafeMutableRawPointer?, _ conn: UnsafeMutablePointer<fuse_conn_info>?) {
        guard let userdata, let conn else { return }
        let ctx = Unmanaged<FUSEContext>.fromOpaque(userdata).takeUnretainedValue()
        let capable = conn.pointee.capable
        var want = conn.pointee.want
        func enable(_ flag: Int32) {
            let bit = UInt32(bitPattern: flag)
            if capable & bit != 0 { want |= bit }
        }
        func disable(_ flag: Int32) { want &= ~UInt32(bitPattern: flag) }
        enable(FUSE_CAP_ASYNC_READ)
        // Without OPEN requests O_TRUNC must come as a SETATTR (size 0), as it does without this flag.
        if ctx.fs.opensWithoutHandles { disable(FUSE_CAP_ATOMIC_O_TRUNC) } else { enable(FUSE_CAP_ATOMIC_O_TRUNC) }
        enable(FUSE_CAP_READDIRPLUS)
        enable(FUSE_CAP_READDIRPLUS_AUTO)
        enable(FUSE_CAP_PARALLEL_DIROPS)
        if ctx.writebackRequested { enable(FUSE_CAP_WRITEBACK_CACHE) } else { disable(FUSE_CAP_WRITEBACK_CACHE) }
        // Locks stay kernel-local unless the filesystem shares them with other mounts; no splice; no NFS
        // export; the kernel clears suid/sgid itself.
        if ctx.fs.sharesLocks {
            enable(FUSE_CAP_POSIX_LOCKS)
            enable(FUSE_CAP_FLOCK_LOCKS)
        } else {
            disable(FUSE_CAP_POSIX_LOCKS)
            disable(FUSE_CAP_FLOCK_LOCKS)
        }
        disable(FUSE_CAP_SPLICE_READ)
        disable(FUSE_CAP_SPLICE_WRITE)
        disable(FUSE_CAP_SPLICE_MOVE)
        disable(FUSE_CAP_EXPORT_SUPPORT)
        disable(FUSE_CAP_HANDLE_KILLPRIV)
        conn.pointee.want = want
        conn.pointee.max_write = ctx.maxWrite
        // Options from -o (max_write=, writeback_cache, ...) take precedence over the defaults above.
        if let opts = ctx.connOptions {
            fuse_apply_conn_info_opts(opts, conn)
        }
        // libfuse's receive buffer holds 1 MiB of payload: a larger max_write breaks the session.
        conn.pointee.max_write = min(max(conn.pointee.max_write, 4096), 1 << 20)
        conn.pointee.time_gran = 1
        let granted = conn.pointee.want & UInt32(bitPattern: FUSE_CAP_WRITEBACK_CACHE) != 0
        ctx.writebackGranted.store(granted, ordering: .releasing)
        ctx.fs.writebackCacheGranted(granted)
        ctx.logger.debug(
            "FUSE init",
            metadata: [
                "proto": "\(conn.pointee.proto_major).\(conn.pointee.proto_minor)",
                "max_write": "\(conn.pointee.max_write)",
                "writeback_cache": "\(granted)"
            ])
    }

    static func destroy(_ userdata: UnsafeMutableRawPointer?) {
        guard let userdata else { return }
        Unmanaged<FUSEContext>.fromOpaque(userdata).takeUnretainedValue().shutdownOnce()
    }

    // MARK: - Filesystem

    static func statfs(_ req: fuse_req_t?) {
        serve(req, use: false) { ctx throws(FSError) in
            let s = try ctx.fs.statfs()
            var v = statvfs()
            v.f_bsize = UInt(truncatingIfNeeded: s.blockSize)
            v.f_frsize = UInt(truncatingIfNeeded: s.blockSize)
            v.f_blocks = UInt(truncatingIfNeeded: s.totalBlocks)
            v.f_bfree = UInt(truncatingIfNeeded: s.freeBlocks)
            v.f_bavail = UInt(truncatingIfNeeded: s.availableBlocks)
            v.f_files = UInt(truncatingIfNeeded: s.totalFiles)
            v.f_ffree = UInt(truncatingIfNeeded: s.freeFiles)
            v.f_favail = UInt(truncatingIfNeeded: s.freeFiles)
            v.f_namemax = UInt(truncatingIfNeeded: s.maxNameLength)
            fuse_reply_statfs(req, &v)
        }
    }
}
