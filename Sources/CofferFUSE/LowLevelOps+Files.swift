import CFuse3
import CofferFS
import Glibc

/// File content: open and create (ENOSYS for a filesystem without handles), read, write, release, fsync, fallocate.
extension LowLevelOps {
    /// Open flags as the filesystem should see them. With the writeback cache the kernel may read through a
    /// write-only handle and handles O_APPEND itself (as libfuse's passthrough_ll does).
    static func effectiveFlags(_ ctx: FUSEContext, _ flags: Int32) -> Int32 {
        guard ctx.writebackGranted.load(ordering: .acquiring) else { return flags }
        var f = flags
        if f & O_ACCMODE == O_WRONLY { f = (f & ~O_ACCMODE) | O_RDWR }
        f &= ~O_APPEND
        return f
    }

    /// An O_APPEND open for writing on a filesystem that places appends itself (`placesAppends`) bypasses the
    /// page cache (FOPEN_DIRECT_IO): the kernel would otherwise copy each append into its pages at the end it
    /// believes, where the filesystem may not have put it. (Such a handle cannot be mapped MAP_SHARED.)
    static func placeAppends(_ ctx: FUSEContext, _ fi: UnsafeMutablePointer<fuse_file_info>) {
        let flags = fi.pointee.flags
        if ctx.fs.placesAppends && flags & O_APPEND != 0 && flags & O_ACCMODE != O_RDONLY { fi.pointee.direct_io = 1 }
    }

    static func open(_ req: fuse_req_t?, _ ino: fuse_ino_t, _ fi: UnsafeMutablePointer<fuse_file_info>?) {
        serve(req) { ctx throws(FSError) in
            let fi = try given(fi, else: .invalid)
            // The kernel takes ENOSYS as "opens need no round trip" and sends no OPEN or RELEASE again
            // (directories: see opendir). It checks permissions itself (default_permissions).
            if ctx.fs.opensWithoutHandles { throw FSError(ENOSYS) }
            // FUSE_OPEN_KILL_SUIDGID (O_TRUNC); the kernel keeps the mode it had until told.
            if KillPrivHook.requested(for: ino), try ctx.fs.clearSetID(ino) { ctx.dropAttributes(ino) }
            let result = try ctx.fs.open(ino, flags: effectiveFlags(ctx, fi.pointee.flags), caller: caller(req))
            if result.attributesChanged { ctx.dropAttributes(ino) }
            fi.pointee.fh = result.handle
            fi.pointee.keep_cache = result.keepCache ? 1 : 0
            placeAppends(ctx, fi)
            // Closing needs no round trip: the filesystem's flush does nothing (changes go out
            // with the group commit; locks are kernel-local), unless locks are shared.
            fi.pointee.noflush = ctx.fs.sharesLocks ? 0 : 1
            if fuse_reply_open(req, fi) != 0 {
                // The kernel gave up on this open (interrupted): it will never release the handle.
                ctx.fs.release(ino, handle: result.handle)
            }
        }
    }

    static func create(
        _ req: fuse_req_t?, _ parent: fuse_ino_t, _ name: UnsafePointer<CChar>?, _ mode: mode_t,
        _ fi: UnsafeMutablePointer<fuse_file_info>?
    ) {
        serve(req) { ctx throws(FSError) in
            let name = try Self.name(name), fi = try given(fi, else: .invalid)
            // Without handles a CREATE buys nothing over MKNOD but its RELEASE, a round trip per new file (the
            // kernel sends one after CREATE until an OPEN has been answered ENOSYS, and `tar -x` never opens).
            // After ENOSYS here the kernel creates with MKNOD, sends OPEN once (answered ENOSYS) and no
            // RELEASE; O_EXCL still holds (the kernel marks the file created before its fallback).
            if ctx.fs.opensWithoutHandles { throw FSError(ENOSYS) }
            let (attributes, result) = try ctx.fs.create(
                parent: parent, name: name, mode: mode,
                flags: effectiveFlags(ctx, fi.pointee.flags),
                caller: caller(req))
            fi.pointee.fh = result.handle
            fi.pointee.keep_cache = result.keepCache ? 1 : 0
            placeAppends(ctx, fi)
            fi.pointee.noflush = ctx.fs.sharesLocks ? 0 : 1
            var e = ctx.entryParam(attributes)
            if fuse_reply_create(req, &e, fi) != 0 {
                ctx.fs.release(attributes.ino, handle: result.handle)
                ctx.fs.forget(attributes.ino, lookups: 1)
            }
        }
    }

    static func read(
        _ req: fuse_req_t?, _ ino: fuse_ino_t, _ size: Int, _ off: off_t,
        _ fi: UnsafeMutablePointer<fuse_file_info>?
    ) {
        serve(req) { ctx throws(FSError) in
            let fi = try given(fi, else: .badHandle)
            guard off >= 0, size >= 0 else { throw .invalid }
            guard let filler = ctx.pageFiller else {
                let data = try ctx.fs.read(ino, handle: fi.pointee.fh, offset: UInt64(off), size: size)
                data.withUnsafeBytes { raw in
                    _ = fuse_reply_buf(req, raw.baseAddress?.assumingMemoryBound(to: CChar.self), min(raw.count, size))
                }
                return
            }
            // The asked part goes in the reply, the rest of its chunks to the page cache (after the reply: the
            // kernel holds the asked pages locked until it has it).
            let r = try ctx.fs.readChunks(ino, handle: fi.pointee.fh, offset: UInt64(off), size: size)
            let from = Int(UInt64(off) - r.start), n = max(0, min(size, r.bytes.count - from))
            r.bytes.withUnsafeBytes { raw in
                _ = fuse_reply_buf(req, raw.baseAddress.map { $0.advanced(by: from).assumingMemoryBound(to: CChar.self) }, n)
            }
            filler.offer(ino: ino, start: r.start, bytes: r.bytes, asked: from..<from + n)
        }
    }

    static func write(
        _ req: fuse_req_t?, _ ino: fuse_ino_t, _ buf: UnsafePointer<CChar>?, _ size: Int, _ off: off_t,
        _ fi: UnsafeMutablePointer<fuse_file_info>?
    ) {
        serve(req) { ctx throws(FSError) in
            let fi = try given(fi, else: .badHandle)
            guard off >= 0, size >= 0, buf != nil || size == 0 else { throw .invalid }
            // FUSE_WRITE_KILL_SUIDGID. The kernel keeps the mode it cached (a write refreshes only size and
            // times), so stat and exec would still see the bits until the attribute timeout: it is told before
            // the reply.
            if KillPrivHook.requested(for: ino), try ctx.fs.clearSetID(ino) { ctx.dropAttributes(ino) }
            let data = UnsafeRawBufferPointer(start: buf, count: size)
            if ctx.fs.placesAppends && fi.pointee.flags & O_APPEND != 0 {
                let appended = try ctx.fs.append(ino, handle: fi.pointee.fh, data: data)
                // The kernel sets the size to where it believed the append went: it asks again instead.
                ctx.dropAttributes(ino)
                fuse_reply_write(req, max(0, min(appended, size)))
                return
            }
            // An O_DIRECT write: the kernel may hold the page at the file's end with zeros where it puts data
            // (PageDropReplies). Not the kernel's own write-back.
            let direct = fi.pointee.flags & Int32(COFFER_O_DIRECT) != 0 && fi.pointee.writepage == 0
            let sizeBefore = direct ? (try? ctx.fs.getattr(ino))?.size : nil
            let done = try ctx.fs.write(ino, handle: fi.pointee.fh, offset: UInt64(off), data: data)
            let written = max(0, min(done, size))
            if let sizeBefore, let req, let page = PageDropReplies.stalePage(oldSize: sizeBefore, offset: off, written: written),
                ctx.pageDropReplies.write(req, ino: ino, dropping: page, written: written, throughRing: ctx.ring != nil)
            {
                return
            }
            fuse_reply_write(req, written)
        }
    }

    static func release(_ req: fuse_req_t?, _ ino: fuse_ino_t, _ fi: UnsafeMutablePointer<fuse_file_info>?) {
        if let ctx = context(req), let fi {
            if ctx.fs.sharesLocks {
                let flockOwner = fi.pointee.flock_release != 0 ? fi.pointee.lock_owner : nil
                ctx.fs.releaseLocks(ino, handle: fi.pointee.fh, flockOwner: flockOwner)
                ctx.lockWaiters.kick()
            }
            ctx.fs.release(ino, handle: fi.pointee.fh)
        }
        replyOK(req)
    }

    static func fsync(
        _ req: fuse_req_t?, _ ino: fuse_ino_t, _ datasync: Int32,
        _ fi: UnsafeMutablePointer<fuse_file_info>?
    ) {
        serve(req) { ctx throws(FSError) in
            try ctx.fs.fsync(ino, handle: fi.map { $0.pointee.fh }, dataOnly: datasync != 0)
            replyOK(req)
        }
    }

    static func fallocate(
        _ req: fuse_req_t?, _ ino: fuse_ino_t, _ mode: Int32, _ off: off_t, _ length: off_t,
        _ fi: UnsafeMutablePointer<fuse_file_info>?
    ) {
        serve(req) { ctx throws(FSError) in
            let fi = try given(fi, else: .badHandle)
            guard off >= 0, length > 0 else { throw .invalid }
            try ctx.fs.fallocate(ino, handle: fi.pointee.fh, mode: mode, offset: UInt64(off), length: UInt64(length))
            // Under FUSE_HANDLE_KILLPRIV_V2 the kernel leaves set-id bits to us, and FALLOCATE carries no mark:
            // a caller other than root (CAP_FSETID, as far as we can tell) clears them, as on ext4.
            if caller(req).uid != 0, try ctx.fs.clearSetID(ino) { ctx.dropAttributes(ino) }
            replyOK(req)
        }
    }

    /// SEEK_DATA and SEEK_HOLE (the kernel keeps SEEK_SET, SEEK_CUR and SEEK_END). Under the writeback cache the
    /// kernel may hold written pages the daemon has not seen, and FUSE_LSEEK does not write them back: without
    /// that, a hole could be reported where data was just written, and `cp --sparse` would leave it out. Those
    /// seeks go to PageDropReplies; over io_uring they stay the kernel's (ENOSYS: data everywhere, a hole at
    /// the end, which is always right).
    static func lseek(_ req: fuse_req_t?, _ ino: fuse_ino_t, _ off: off_t, _ whence: Int32, _ fi: UnsafeMutablePointer<fuse_file_info>?) {
        serve(req) { ctx throws(FSError) in
            guard off >= 0 else { throw FSError(ENXIO) }
            guard ctx.writebackGranted.load(ordering: .acquiring) else {
                fuse_reply_lseek(req, off_t(try ctx.fs.seek(ino, offset: UInt64(off), whence: whence)))
                return
            }
            guard ctx.ring == nil, let req else { throw FSError(ENOSYS) }
            ctx.pageDropReplies.seek(req, ino: ino, offset: off, whence: whence, fs: ctx.fs)
        }
    }
}
