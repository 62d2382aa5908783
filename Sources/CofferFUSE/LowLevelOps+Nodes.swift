import CFuse3
import CofferFS
import Glibc

/// Names and attributes: lookup and forget, stat and setattr, readlink, and the namespace changes.
extension LowLevelOps {
    static func lookup(_ req: fuse_req_t?, _ parent: fuse_ino_t, _ name: UnsafePointer<CChar>?) {
        serve(req) { ctx throws(FSError) in
            let name = try Self.name(name)
            do throws(FSError) {
                replyEntry(ctx, req, try ctx.fs.lookup(parent: parent, name: name))
            } catch  where error.errno == ENOENT && ctx.timeouts.negativeEntry > 0 {
                // A negative entry (ino 0) lets the kernel cache the absence.
                var e = fuse_entry_param()
                e.ino = 0
                e.entry_timeout = ctx.timeouts.negativeEntry
                fuse_reply_entry(req, &e)
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
        // The root's attributes are what `df MOUNT` and a stat of the mountpoint ask: not use (`-o idle=`).
        serve(req, use: ino != fuse_ino_t(FUSE_ROOT_ID)) { ctx throws(FSError) in
            var st = try ctx.fs.getattr(ino).statValue
            fuse_reply_attr(req, &st, ctx.timeouts.attributes)
        }
    }

    static func setattr(
        _ req: fuse_req_t?, _ ino: fuse_ino_t, _ attr: UnsafeMutablePointer<stat>?, _ toSet: Int32,
        _ fi: UnsafeMutablePointer<fuse_file_info>?
    ) {
        serve(req) { ctx throws(FSError) in
            let st = try given(attr, else: .invalid).pointee
            var out = try ctx.fs.setattr(
                ino, changes: try changes(st, toSet, ino), handle: fi.map { $0.pointee.fh },
                caller: caller(req)
            ).statValue
            fuse_reply_attr(req, &out, ctx.timeouts.attributes)
        }
    }

    /// What a SETATTR asks to change, from the kernel's stat and FUSE_SET_ATTR_* bits.
    static func changes(_ st: stat, _ toSet: Int32, _ ino: fuse_ino_t) throws(FSError) -> AttributeChanges {
        var changes = AttributeChanges()
        if toSet & FUSE_SET_ATTR_MODE != 0 { changes.mode = st.st_mode }
        if toSet & FUSE_SET_ATTR_UID != 0 { changes.uid = st.st_uid }
        if toSet & FUSE_SET_ATTR_GID != 0 { changes.gid = st.st_gid }
        if toSet & FUSE_SET_ATTR_SIZE != 0 {
            guard st.st_size >= 0 else { throw .invalid }
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
        return changes
    }

    static func readlink(_ req: fuse_req_t?, _ ino: fuse_ino_t) {
        serve(req) { ctx throws(FSError) in
            let target = try given(cString(try ctx.fs.readlink(ino)), else: .io)
            target.withUnsafeBufferPointer { _ = fuse_reply_readlink(req, $0.baseAddress) }
        }
    }

    // MARK: - Namespace changes

    static func mknod(
        _ req: fuse_req_t?, _ parent: fuse_ino_t, _ name: UnsafePointer<CChar>?, _ mode: mode_t,
        _ rdev: dev_t
    ) {
        serve(req) { ctx throws(FSError) in
            let name = try Self.name(name)
            replyEntry(ctx, req, try ctx.fs.mknod(parent: parent, name: name, mode: mode, rdev: UInt64(rdev), caller: caller(req)))
        }
    }

    static func mkdir(_ req: fuse_req_t?, _ parent: fuse_ino_t, _ name: UnsafePointer<CChar>?, _ mode: mode_t) {
        serve(req) { ctx throws(FSError) in
            let name = try Self.name(name)
            replyEntry(ctx, req, try ctx.fs.mkdir(parent: parent, name: name, mode: mode, caller: caller(req)))
        }
    }

    static func unlink(_ req: fuse_req_t?, _ parent: fuse_ino_t, _ name: UnsafePointer<CChar>?) {
        serve(req) { ctx throws(FSError) in
            try ctx.fs.unlink(parent: parent, name: try Self.name(name))
            replyOK(req)
        }
    }

    static func rmdir(_ req: fuse_req_t?, _ parent: fuse_ino_t, _ name: UnsafePointer<CChar>?) {
        serve(req) { ctx throws(FSError) in
            try ctx.fs.rmdir(parent: parent, name: try Self.name(name))
            replyOK(req)
        }
    }

    static func symlink(
        _ req: fuse_req_t?, _ target: UnsafePointer<CChar>?, _ parent: fuse_ino_t,
        _ name: UnsafePointer<CChar>?
    ) {
        serve(req) { ctx throws(FSError) in
            let name = try Self.name(name), target = try Self.name(target)
            replyEntry(ctx, req, try ctx.fs.symlink(parent: parent, name: name, target: target, caller: caller(req)))
        }
    }

    static func rename(
        _ req: fuse_req_t?, _ parent: fuse_ino_t, _ name: UnsafePointer<CChar>?,
        _ newParent: fuse_ino_t, _ newName: UnsafePointer<CChar>?, _ flags: UInt32
    ) {
        serve(req) { ctx throws(FSError) in
            let name = try Self.name(name), newName = try Self.name(newName)
            let renameFlags = RenameFlags(rawValue: flags)
            guard renameFlags.subtracting([.noReplace, .exchange]).isEmpty else { throw .invalid }
            try ctx.fs.rename(parent: parent, name: name, newParent: newParent, newName: newName, flags: renameFlags)
            replyOK(req)
        }
    }

    static func link(_ req: fuse_req_t?, _ ino: fuse_ino_t, _ newParent: fuse_ino_t, _ newName: UnsafePointer<CChar>?) {
        serve(req) { ctx throws(FSError) in
            let newName = try Self.name(newName)
            replyEntry(ctx, req, try ctx.fs.link(ino, newParent: newParent, newName: newName))
        }
    }
}
