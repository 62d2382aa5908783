import CFuse3
import CofferFS
import Glibc

/// Directories: opendir (ENOSYS for a filesystem without handles), readdir and readdirplus, releasedir, fsyncdir.
extension LowLevelOps {
    static func opendir(_ req: fuse_req_t?, _ ino: fuse_ino_t, _ fi: UnsafeMutablePointer<fuse_file_info>?) {
        serve(req) { ctx throws(FSError) in
            let fi = try given(fi, else: .invalid)
            // As for files: after ENOSYS the kernel sends no OPENDIR or RELEASEDIR again (two round trips
            // per directory that `ls -R`, `find` and `rm -r` visit), readdir comes with handle 0, and the
            // kernel may keep a listing in its cache until the directory changes (FOPEN_CACHE_DIR).
            if ctx.fs.opensWithoutHandles { throw FSError(ENOSYS) }
            let handle = try ctx.fs.opendir(ino, caller: caller(req))
            fi.pointee.fh = handle
            if fuse_reply_open(req, fi) != 0 {
                ctx.fs.releasedir(ino, handle: handle)
            }
        }
    }

    static func readdir(
        _ req: fuse_req_t?, _ ino: fuse_ino_t, _ size: Int, _ off: off_t,
        _ fi: UnsafeMutablePointer<fuse_file_info>?, plus: Bool
    ) {
        serve(req) { ctx throws(FSError) in
            let handle = try given(fi, else: .badHandle).pointee.fh
            guard size > 0 else {
                fuse_reply_buf(req, nil, 0)
                return
            }
            let reply = DirectoryReply(req, ctx, size: size, plus: plus)
            var cookie = Int64(off)
            fill: while reply.hasRoom {
                let limit = reply.batchLimit
                let entries: [DirectoryEntry]
                do throws(FSError) {
                    entries = try ctx.fs.readdir(ino, handle: handle, offset: cookie, limit: limit, plus: plus)
                } catch {
                    if reply.isEmpty { throw error }
                    break fill  // hand out what we have; the error comes back on the next call
                }
                for index in entries.indices {
                    guard reply.add(entries[index]) else {
                        reply.drop(entries[index...])
                        break fill
                    }
                    cookie = entries[index].offset
                }
                // A short batch means the end of the directory (the kernel's next call confirms it).
                if entries.count < limit { break fill }
            }
            reply.send()
        }
    }

    static func releasedir(_ req: fuse_req_t?, _ ino: fuse_ino_t, _ fi: UnsafeMutablePointer<fuse_file_info>?) {
        if let ctx = context(req), let fi { ctx.fs.releasedir(ino, handle: fi.pointee.fh) }
        replyOK(req)
    }

    static func fsyncdir(
        _ req: fuse_req_t?, _ ino: fuse_ino_t, _ datasync: Int32,
        _ fi: UnsafeMutablePointer<fuse_file_info>?
    ) {
        serve(req) { ctx throws(FSError) in
            let fi = try given(fi, else: .badHandle)
            try ctx.fs.fsyncdir(ino, handle: fi.pointee.fh, dataOnly: datasync != 0)
            replyOK(req)
        }
    }
}
