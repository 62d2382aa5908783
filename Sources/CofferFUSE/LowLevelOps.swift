import CFuse3
import CofferFS
import Glibc
import Logging

/// The `fuse_lowlevel_ops` table. Each C callback is a capture-free closure forwarding to a static function here;
/// the filesystem is reached through `fuse_req_userdata`.
enum LowLevelOps {
    static func make() -> fuse_lowlevel_ops {
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
        // No flush: close has nothing to do (changes go out with the group commit; locks are
        // kernel-local). libfuse answers ENOSYS once and the kernel stops sending FLUSH; `noflush`
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
        return ops
    }

    // MARK: - Plumbing

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

    @inline(__always)
    static func reply(_ req: fuse_req_t?, error: FSError) {
        fuse_reply_err(req, error.errno > 0 ? error.errno : EIO)
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
        // Locks stay kernel-local; no splice; no NFS export; the kernel clears suid/sgid itself.
        disable(FUSE_CAP_POSIX_LOCKS)
        disable(FUSE_CAP_FLOCK_LOCKS)
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
        ctx.logger.debug("FUSE init", metadata: [
            "proto": "\(conn.pointee.proto_major).\(conn.pointee.proto_minor)",
            "max_write": "\(conn.pointee.max_write)",
            "writeback_cache": "\(granted)",
        ])
    }

    static func destroy(_ userdata: UnsafeMutableRawPointer?) {
        guard let userdata else { return }
        Unmanaged<FUSEContext>.fromOpaque(userdata).takeUnretainedValue().shutdownOnce()
    }

    // MARK: - Names and attributes

    static func lookup(_ req: fuse_req_t?, _ parent: fuse_ino_t, _ name: UnsafePointer<CChar>?) {
        guard let ctx = context(req) else { fuse_reply_err(req, EIO); return }
        guard let name = nameBytes(name) else { fuse_reply_err(req, EINVAL); return }
        do {
            let attributes = try ctx.fs.lookup(parent: parent, name: name)
            replyEntry(ctx, req, attributes)
        } catch {
            if error.errno == ENOENT && ctx.timeouts.negativeEntry > 0 {
                // A negative entry (ino 0) lets the kernel cache the absence.
                var e = fuse_entry_param()
                e.ino = 0
                e.entry_timeout = ctx.timeouts.negativeEntry
                fuse_reply_entry(req, &e)
            } else {
                reply(req, error: error)
            }
        }
    }

    static func forget(_ req: fuse_req_t?, _ ino: fuse_ino_t, _ nlookup: UInt64) {
        if let ctx = context(req) { ctx.fs.forget(ino, lookups: nlookup) }
        fuse_reply_none(req)
    }

    static func forgetMulti(_ req: fuse_req_t?, _ count: Int, _ list: UnsafeMutablePointer<fuse_forget_data>?) {
        if let ctx = context(req), let list, count > 0 {
            for i in 0..<count {
                ctx.fs.forget(list[i].ino, lookups: list[i].nlookup)
            }
        }
        fuse_reply_none(req)
    }

    static func getattr(_ req: fuse_req_t?, _ ino: fuse_ino_t) {
        guard let ctx = context(req) else { fuse_reply_err(req, EIO); return }
        do {
            var st = try ctx.fs.getattr(ino).statValue
            fuse_reply_attr(req, &st, ctx.timeouts.attributes)
        } catch {
            reply(req, error: error)
        }
    }

    static func setattr(_ req: fuse_req_t?, _ ino: fuse_ino_t, _ attr: UnsafeMutablePointer<stat>?, _ toSet: Int32,
                        _ fi: UnsafeMutablePointer<fuse_file_info>?) {
        guard let ctx = context(req) else { fuse_reply_err(req, EIO); return }
        guard let attr else { fuse_reply_err(req, EINVAL); return }
        let st = attr.pointee
        var changes = AttributeChanges()
        if toSet & FUSE_SET_ATTR_MODE != 0 { changes.mode = st.st_mode }
        if toSet & FUSE_SET_ATTR_UID != 0 { changes.uid = st.st_uid }
        if toSet & FUSE_SET_ATTR_GID != 0 { changes.gid = st.st_gid }
        if toSet & FUSE_SET_ATTR_SIZE != 0 {
            guard st.st_size >= 0 else { fuse_reply_err(req, EINVAL); return }
            changes.size = UInt64(st.st_size)
        }
        if toSet & FUSE_SET_ATTR_ATIME_NOW != 0 {
            changes.atime = .now
        } else if toSet & FUSE_SET_ATTR_ATIME != 0 {
            changes.atime = .set(Timestamp(st.st_atim))
        }
        if toSet & FUSE_SET_ATTR_MTIME_NOW != 0 {
            changes.mtime = .now
        } else if toSet & FUSE_SET_ATTR_MTIME != 0 {
            changes.mtime = .set(Timestamp(st.st_mtim))
        }
        if toSet & FUSE_SET_ATTR_CTIME != 0 { changes.ctime = Timestamp(st.st_ctim) }
        changes.clearSetID = KillPrivHook.requested(for: ino)  // FATTR_KILL_SUIDGID: truncate, chown
        let handle: HandleID? = fi.map { $0.pointee.fh }
        do {
            var out = try ctx.fs.setattr(ino, changes: changes, handle: handle, caller: caller(req)).statValue
            fuse_reply_attr(req, &out, ctx.timeouts.attributes)
        } catch {
            reply(req, error: error)
        }
    }

    static func readlink(_ req: fuse_req_t?, _ ino: fuse_ino_t) {
        guard let ctx = context(req) else { fuse_reply_err(req, EIO); return }
        do {
            let target = try ctx.fs.readlink(ino)
            guard let c = cString(target) else { fuse_reply_err(req, EIO); return }
            c.withUnsafeBufferPointer { _ = fuse_reply_readlink(req, $0.baseAddress) }
        } catch {
            reply(req, error: error)
        }
    }

    // MARK: - Namespace changes

    static func mknod(_ req: fuse_req_t?, _ parent: fuse_ino_t, _ name: UnsafePointer<CChar>?, _ mode: mode_t,
                      _ rdev: dev_t) {
        guard let ctx = context(req) else { fuse_reply_err(req, EIO); return }
        guard let name = nameBytes(name) else { fuse_reply_err(req, EINVAL); return }
        do {
            let a = try ctx.fs.mknod(parent: parent, name: name, mode: mode, rdev: UInt64(rdev), caller: caller(req))
            replyEntry(ctx, req, a)
        } catch {
            reply(req, error: error)
        }
    }

    static func mkdir(_ req: fuse_req_t?, _ parent: fuse_ino_t, _ name: UnsafePointer<CChar>?, _ mode: mode_t) {
        guard let ctx = context(req) else { fuse_reply_err(req, EIO); return }
        guard let name = nameBytes(name) else { fuse_reply_err(req, EINVAL); return }
        do {
            let a = try ctx.fs.mkdir(parent: parent, name: name, mode: mode, caller: caller(req))
            replyEntry(ctx, req, a)
        } catch {
            reply(req, error: error)
        }
    }

    static func unlink(_ req: fuse_req_t?, _ parent: fuse_ino_t, _ name: UnsafePointer<CChar>?) {
        guard let ctx = context(req) else { fuse_reply_err(req, EIO); return }
        guard let name = nameBytes(name) else { fuse_reply_err(req, EINVAL); return }
        do {
            try ctx.fs.unlink(parent: parent, name: name)
            replyOK(req)
        } catch {
            reply(req, error: error)
        }
    }

    static func rmdir(_ req: fuse_req_t?, _ parent: fuse_ino_t, _ name: UnsafePointer<CChar>?) {
        guard let ctx = context(req) else { fuse_reply_err(req, EIO); return }
        guard let name = nameBytes(name) else { fuse_reply_err(req, EINVAL); return }
        do {
            try ctx.fs.rmdir(parent: parent, name: name)
            replyOK(req)
        } catch {
            reply(req, error: error)
        }
    }

    static func symlink(_ req: fuse_req_t?, _ target: UnsafePointer<CChar>?, _ parent: fuse_ino_t,
                        _ name: UnsafePointer<CChar>?) {
        guard let ctx = context(req) else { fuse_reply_err(req, EIO); return }
        guard let name = nameBytes(name), let target = nameBytes(target) else { fuse_reply_err(req, EINVAL); return }
        do {
            let a = try ctx.fs.symlink(parent: parent, name: name, target: target, caller: caller(req))
            replyEntry(ctx, req, a)
        } catch {
            reply(req, error: error)
        }
    }

    static func rename(_ req: fuse_req_t?, _ parent: fuse_ino_t, _ name: UnsafePointer<CChar>?,
                       _ newParent: fuse_ino_t, _ newName: UnsafePointer<CChar>?, _ flags: UInt32) {
        guard let ctx = context(req) else { fuse_reply_err(req, EIO); return }
        guard let name = nameBytes(name), let newName = nameBytes(newName) else { fuse_reply_err(req, EINVAL); return }
        let renameFlags = RenameFlags(rawValue: flags)
        guard renameFlags.subtracting([.noReplace, .exchange]).isEmpty else { fuse_reply_err(req, EINVAL); return }
        do {
            try ctx.fs.rename(parent: parent, name: name, newParent: newParent, newName: newName, flags: renameFlags)
            replyOK(req)
        } catch {
            reply(req, error: error)
        }
    }

    static func link(_ req: fuse_req_t?, _ ino: fuse_ino_t, _ newParent: fuse_ino_t, _ newName: UnsafePointer<CChar>?) {
        guard let ctx = context(req) else { fuse_reply_err(req, EIO); return }
        guard let newName = nameBytes(newName) else { fuse_reply_err(req, EINVAL); return }
        do {
            let a = try ctx.fs.link(ino, newParent: newParent, newName: newName)
            replyEntry(ctx, req, a)
        } catch {
            reply(req, error: error)
        }
    }

    // MARK: - Files

    /// Open flags as the filesystem should see them. With the writeback cache the kernel may read through a
    /// write-only handle and handles O_APPEND itself (as libfuse's passthrough_ll does).
    static func effectiveFlags(_ ctx: FUSEContext, _ flags: Int32) -> Int32 {
        guard ctx.writebackGranted.load(ordering: .acquiring) else { return flags }
        var f = flags
        if f & O_ACCMODE == O_WRONLY { f = (f & ~O_ACCMODE) | O_RDWR }
        f &= ~O_APPEND
        return f
    }

    static func open(_ req: fuse_req_t?, _ ino: fuse_ino_t, _ fi: UnsafeMutablePointer<fuse_file_info>?) {
        guard let ctx = context(req) else { fuse_reply_err(req, EIO); return }
        guard let fi else { fuse_reply_err(req, EINVAL); return }
        // The kernel takes ENOSYS as "opens need no round trip" and sends no OPEN or RELEASE again
        // (directories: see opendir). It checks permissions itself (default_permissions).
        if ctx.fs.opensWithoutHandles { fuse_reply_err(req, ENOSYS); return }
        do {
            if KillPrivHook.requested(for: ino) { try ctx.fs.clearSetID(ino) }  // FUSE_OPEN_KILL_SUIDGID (O_TRUNC)
            let result = try ctx.fs.open(ino, flags: effectiveFlags(ctx, fi.pointee.flags), caller: caller(req))
            fi.pointee.fh = result.handle
            fi.pointee.keep_cache = result.keepCache ? 1 : 0
            // Closing needs no round trip: the filesystem's flush does nothing (changes go out
            // with the group commit; locks are kernel-local).
            fi.pointee.noflush = 1
            if fuse_reply_open(req, fi) != 0 {
                // The kernel gave up on this open (interrupted): it will never release the handle.
                ctx.fs.release(ino, handle: result.handle)
            }
        } catch {
            reply(req, error: error)
        }
    }

    static func create(_ req: fuse_req_t?, _ parent: fuse_ino_t, _ name: UnsafePointer<CChar>?, _ mode: mode_t,
                       _ fi: UnsafeMutablePointer<fuse_file_info>?) {
        guard let ctx = context(req) else { fuse_reply_err(req, EIO); return }
        guard let name = nameBytes(name), let fi else { fuse_reply_err(req, EINVAL); return }
        // Without handles a CREATE buys nothing over MKNOD but its RELEASE, a round trip per new file (the
        // kernel sends one after CREATE until an OPEN has been answered ENOSYS, and `tar -x` never opens).
        // After ENOSYS here the kernel creates with MKNOD, sends OPEN once (answered ENOSYS) and no
        // RELEASE; O_EXCL still holds (the kernel marks the file created before its fallback).
        if ctx.fs.opensWithoutHandles { fuse_reply_err(req, ENOSYS); return }
        do {
            let (attributes, result) = try ctx.fs.create(parent: parent, name: name, mode: mode,
                                                         flags: effectiveFlags(ctx, fi.pointee.flags),
                                                         caller: caller(req))
            fi.pointee.fh = result.handle
            fi.pointee.keep_cache = result.keepCache ? 1 : 0
            fi.pointee.noflush = 1
            var e = ctx.entryParam(attributes)
            if fuse_reply_create(req, &e, fi) != 0 {
                ctx.fs.release(attributes.ino, handle: result.handle)
                ctx.fs.forget(attributes.ino, lookups: 1)
            }
        } catch {
            reply(req, error: error)
        }
    }

    static func read(_ req: fuse_req_t?, _ ino: fuse_ino_t, _ size: Int, _ off: off_t,
                     _ fi: UnsafeMutablePointer<fuse_file_info>?) {
        guard let ctx = context(req) else { fuse_reply_err(req, EIO); return }
        guard let fi else { fuse_reply_err(req, EBADF); return }
        guard off >= 0, size >= 0 else { fuse_reply_err(req, EINVAL); return }
        do {
            let data = try ctx.fs.read(ino, handle: fi.pointee.fh, offset: UInt64(off), size: size)
            data.withUnsafeBytes { raw in
                _ = fuse_reply_buf(req, raw.baseAddress?.assumingMemoryBound(to: CChar.self), min(raw.count, size))
            }
        } catch {
            reply(req, error: error)
        }
    }

    static func write(_ req: fuse_req_t?, _ ino: fuse_ino_t, _ buf: UnsafePointer<CChar>?, _ size: Int, _ off: off_t,
                      _ fi: UnsafeMutablePointer<fuse_file_info>?) {
        guard let ctx = context(req) else { fuse_reply_err(req, EIO); return }
        guard let fi else { fuse_reply_err(req, EBADF); return }
        guard off >= 0, size >= 0, buf != nil || size == 0 else { fuse_reply_err(req, EINVAL); return }
        do {
            if KillPrivHook.requested(for: ino) { try ctx.fs.clearSetID(ino) }  // FUSE_WRITE_KILL_SUIDGID
            let written = try ctx.fs.write(ino, handle: fi.pointee.fh, offset: UInt64(off),
                                           data: UnsafeRawBufferPointer(start: buf, count: size))
            fuse_reply_write(req, max(0, min(written, size)))
        } catch {
            reply(req, error: error)
        }
    }

    static func release(_ req: fuse_req_t?, _ ino: fuse_ino_t, _ fi: UnsafeMutablePointer<fuse_file_info>?) {
        if let ctx = context(req), let fi { ctx.fs.release(ino, handle: fi.pointee.fh) }
        replyOK(req)
    }

    static func fsync(_ req: fuse_req_t?, _ ino: fuse_ino_t, _ datasync: Int32,
                      _ fi: UnsafeMutablePointer<fuse_file_info>?) {
        guard let ctx = context(req) else { fuse_reply_err(req, EIO); return }
        do {
            try ctx.fs.fsync(ino, handle: fi.map { $0.pointee.fh }, dataOnly: datasync != 0)
            replyOK(req)
        } catch {
            reply(req, error: error)
        }
    }

    static func fallocate(_ req: fuse_req_t?, _ ino: fuse_ino_t, _ mode: Int32, _ off: off_t, _ length: off_t,
                          _ fi: UnsafeMutablePointer<fuse_file_info>?) {
        guard let ctx = context(req) else { fuse_reply_err(req, EIO); return }
        guard let fi else { fuse_reply_err(req, EBADF); return }
        guard off >= 0, length > 0 else { fuse_reply_err(req, EINVAL); return }
        do {
            try ctx.fs.fallocate(ino, handle: fi.pointee.fh, mode: mode, offset: UInt64(off), length: UInt64(length))
            replyOK(req)
        } catch {
            reply(req, error: error)
        }
    }

    // MARK: - Directories

    static func opendir(_ req: fuse_req_t?, _ ino: fuse_ino_t, _ fi: UnsafeMutablePointer<fuse_file_info>?) {
        guard let ctx = context(req) else { fuse_reply_err(req, EIO); return }
        guard let fi else { fuse_reply_err(req, EINVAL); return }
        // As for files: after ENOSYS the kernel sends no OPENDIR or RELEASEDIR again (two round trips
        // per directory that `ls -R`, `find` and `rm -r` visit), readdir comes with handle 0, and the
        // kernel may keep a listing in its cache until the directory changes (FOPEN_CACHE_DIR).
        if ctx.fs.opensWithoutHandles { fuse_reply_err(req, ENOSYS); return }
        do {
            let handle = try ctx.fs.opendir(ino, caller: caller(req))
            fi.pointee.fh = handle
            if fuse_reply_open(req, fi) != 0 {
                ctx.fs.releasedir(ino, handle: handle)
            }
        } catch {
            reply(req, error: error)
        }
    }

    /// Smallest encoded entry: a 1..8-byte name. fuse_dirent is 24 bytes + name, fuse_direntplus adds the
    /// 128-byte fuse_entry_out; both padded to 8.
    static let minDirentSize = 32
    static let minDirentPlusSize = 160

    static func readdir(_ req: fuse_req_t?, _ ino: fuse_ino_t, _ size: Int, _ off: off_t,
                        _ fi: UnsafeMutablePointer<fuse_file_info>?, plus: Bool) {
        guard let ctx = context(req) else { fuse_reply_err(req, EIO); return }
        guard let fi else { fuse_reply_err(req, EBADF); return }
        guard size > 0 else { fuse_reply_buf(req, nil, 0); return }
        let handle = fi.pointee.fh
        let buffer = UnsafeMutablePointer<CChar>.allocate(capacity: size)
        defer { buffer.deallocate() }
        var used = 0
        var cookie = Int64(off)
        // Entries the kernel will count as lookups if the reply arrives (readdirplus only).
        var counted: [InodeNumber] = []

        fill: while size - used >= (plus ? minDirentPlusSize : minDirentSize) {
            let remaining = size - used
            // Plain entries that don't fit are simply not consumed (the next call resumes at the last cookie);
            // readdirplus entries are lookups, so ask for about as many as should fit.
            let limit = plus ? max(1, remaining / (minDirentPlusSize + 16)) : max(1, remaining / minDirentSize)
            let entries: [DirectoryEntry]
            do {
                entries = try ctx.fs.readdir(ino, handle: handle, offset: cookie, limit: limit, plus: plus)
            } catch {
                if used == 0 { reply(req, error: error); return }
                break fill  // hand out what we have; the error comes back on the next call
            }
            if entries.isEmpty { break fill }
            for index in entries.indices {
                let entry = entries[index]
                let added: Int
                if let name = cString(entry.name), !entry.name.isEmpty {
                    added = name.withUnsafeBufferPointer { namePtr -> Int in
                        let dest = buffer + used
                        if plus {
                            var e: fuse_entry_param
                            if let a = entry.attributes {
                                e = ctx.entryParam(a)
                            } else {
                                // ino 0: the kernel takes the name only, without attributes or a lookup.
                                e = fuse_entry_param()
                                e.attr.st_ino = UInt(truncatingIfNeeded: entry.ino)
                                e.attr.st_mode = entry.type & UInt32(Glibc.S_IFMT)
                            }
                            return fuse_add_direntry_plus(req, dest, size - used, namePtr.baseAddress, &e,
                                                          off_t(entry.offset))
                        } else {
                            var st = stat()
                            st.st_ino = UInt(truncatingIfNeeded: entry.ino)
                            st.st_mode = entry.type & UInt32(Glibc.S_IFMT)
                            return fuse_add_direntry(req, dest, size - used, namePtr.baseAddress, &st,
                                                     off_t(entry.offset))
                        }
                    }
                } else {
                    // A name that cannot be encoded: skip it (and drop its reference).
                    ctx.logger.debug("readdir: skipping an entry with an invalid name", metadata: ["ino": "\(entry.ino)"])
                    if plus, let a = entry.attributes { ctx.fs.forget(a.ino, lookups: 1) }
                    cookie = entry.offset
                    continue
                }
                if added > size - used {
                    // Doesn't fit: this and the following entries are not handed out.
                    if plus {
                        for rest in entries[index...] {
                            if let a = rest.attributes { ctx.fs.forget(a.ino, lookups: 1) }
                        }
                    }
                    break fill
                }
                used += added
                cookie = entry.offset
                if plus, let a = entry.attributes {
                    if entry.name == [0x2E] || entry.name == [0x2E, 0x2E] {
                        // The kernel does not count "." and ".." as lookups.
                        ctx.fs.forget(a.ino, lookups: 1)
                    } else {
                        counted.append(a.ino)
                    }
                }
            }
            // A short batch means the end of the directory (the kernel's next call confirms it).
            if entries.count < limit { break fill }
        }
        if fuse_reply_buf(req, used > 0 ? buffer : nil, used) != 0 {
            for ino in counted { ctx.fs.forget(ino, lookups: 1) }
        }
    }

    static func releasedir(_ req: fuse_req_t?, _ ino: fuse_ino_t, _ fi: UnsafeMutablePointer<fuse_file_info>?) {
        if let ctx = context(req), let fi { ctx.fs.releasedir(ino, handle: fi.pointee.fh) }
        replyOK(req)
    }

    static func fsyncdir(_ req: fuse_req_t?, _ ino: fuse_ino_t, _ datasync: Int32,
                         _ fi: UnsafeMutablePointer<fuse_file_info>?) {
        guard let ctx = context(req) else { fuse_reply_err(req, EIO); return }
        guard let fi else { fuse_reply_err(req, EBADF); return }
        do {
            try ctx.fs.fsyncdir(ino, handle: fi.pointee.fh, dataOnly: datasync != 0)
            replyOK(req)
        } catch {
            reply(req, error: error)
        }
    }

    // MARK: - Filesystem and xattrs

    static func statfs(_ req: fuse_req_t?) {
        guard let ctx = context(req) else { fuse_reply_err(req, EIO); return }
        do {
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
        } catch {
            reply(req, error: error)
        }
    }

    static func setxattr(_ req: fuse_req_t?, _ ino: fuse_ino_t, _ name: UnsafePointer<CChar>?,
                         _ value: UnsafePointer<CChar>?, _ size: Int, _ flags: Int32) {
        guard let ctx = context(req) else { fuse_reply_err(req, EIO); return }
        guard let name = nameBytes(name), size >= 0, value != nil || size == 0 else {
            fuse_reply_err(req, EINVAL); return
        }
        let bytes = size > 0 ? [UInt8](UnsafeRawBufferPointer(start: value, count: size)) : []
        do {
            try ctx.fs.setxattr(ino, name: name, value: bytes, flags: flags)
            replyOK(req)
        } catch {
            reply(req, error: error)
        }
    }

    /// The xattr reply convention: size 0 asks for the length; a too-small buffer is ERANGE.
    static func replyXattr(_ req: fuse_req_t?, _ value: [UInt8], _ size: Int) {
        if size == 0 {
            fuse_reply_xattr(req, value.count)
        } else if value.count > size {
            fuse_reply_err(req, ERANGE)
        } else {
            value.withUnsafeBytes { raw in
                _ = fuse_reply_buf(req, raw.baseAddress?.assumingMemoryBound(to: CChar.self), raw.count)
            }
        }
    }

    static func getxattr(_ req: fuse_req_t?, _ ino: fuse_ino_t, _ name: UnsafePointer<CChar>?, _ size: Int) {
        guard let ctx = context(req) else { fuse_reply_err(req, EIO); return }
        guard let name = nameBytes(name) else { fuse_reply_err(req, EINVAL); return }
        do {
            replyXattr(req, try ctx.fs.getxattr(ino, name: name), size)
        } catch {
            reply(req, error: error)
        }
    }

    static func listxattr(_ req: fuse_req_t?, _ ino: fuse_ino_t, _ size: Int) {
        guard let ctx = context(req) else { fuse_reply_err(req, EIO); return }
        do {
            var joined: [UInt8] = []
            for name in try ctx.fs.listxattr(ino) where !name.isEmpty {
                joined += name
                joined.append(0)
            }
            replyXattr(req, joined, size)
        } catch {
            reply(req, error: error)
        }
    }

    static func removexattr(_ req: fuse_req_t?, _ ino: fuse_ino_t, _ name: UnsafePointer<CChar>?) {
        guard let ctx = context(req) else { fuse_reply_err(req, EIO); return }
        guard let name = nameBytes(name) else { fuse_reply_err(req, EINVAL); return }
        do {
            try ctx.fs.removexattr(ino, name: name)
            replyOK(req)
        } catch {
            reply(req, error: error)
        }
    }
}
