import CFuse3
import CofferFS
import Glibc

/// Extended attributes: set, get, list, remove.
extension LowLevelOps {
    static func setxattr(
        _ req: fuse_req_t?, _ ino: fuse_ino_t, _ name: UnsafePointer<CChar>?,
        _ value: UnsafePointer<CChar>?, _ size: Int, _ flags: Int32
    ) {
        serve(req) { ctx throws(FSError) in
            let name = try Self.name(name)
            guard size >= 0, value != nil || size == 0 else { throw .invalid }
            let bytes = size > 0 ? [UInt8](UnsafeRawBufferPointer(start: value, count: size)) : []
            try ctx.fs.setxattr(ino, name: name, value: bytes, flags: flags)
            replyOK(req)
        }
    }

    /// The xattr reply convention: size 0 asks for the length; a too-small buffer is ERANGE.
    static func replyXattr(_ req: fuse_req_t?, _ value: [UInt8], _ size: Int) throws(FSError) {
        if size == 0 {
            fuse_reply_xattr(req, value.count)
        } else if value.count > size {
            throw .range
        } else {
            value.withUnsafeBytes { raw in
                _ = fuse_reply_buf(req, raw.baseAddress?.assumingMemoryBound(to: CChar.self), raw.count)
            }
        }
    }

    static func getxattr(_ req: fuse_req_t?, _ ino: fuse_ino_t, _ name: UnsafePointer<CChar>?, _ size: Int) {
        serve(req) { ctx throws(FSError) in
            let name = try Self.name(name)
            try replyXattr(req, try ctx.fs.getxattr(ino, name: name), size)
        }
    }

    static func listxattr(_ req: fuse_req_t?, _ ino: fuse_ino_t, _ size: Int) {
        serve(req) { ctx throws(FSError) in
            var joined: [UInt8] = []
            for name in try ctx.fs.listxattr(ino) where !name.isEmpty {
                joined += name
                joined.append(0)
            }
            try replyXattr(req, joined, size)
        }
    }

    static func removexattr(_ req: fuse_req_t?, _ ino: fuse_ino_t, _ name: UnsafePointer<CChar>?) {
        serve(req) { ctx throws(FSError) in
            try ctx.fs.removexattr(ino, name: try Self.name(name))
            replyOK(req)
        }
    }
}
