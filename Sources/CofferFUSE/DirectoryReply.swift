import CFuse3
import CofferFS
import Glibc

/// The buffer of one READDIR or READDIRPLUS reply, filled with encoded entries until the next does not fit.
///
/// A readdirplus entry is a lookup the filesystem has already counted: one that is not handed out (it does
/// not fit, its name cannot be encoded, it is "." or "..", or the reply does not reach the kernel) is
/// forgotten again here, so the counts match what the kernel holds.
final class DirectoryReply {
    /// Smallest encoded entry: a 1..8-byte name. fuse_dirent is 24 bytes + name, fuse_direntplus adds the
    /// 128-byte fuse_entry_out; both padded to 8.
    static let minDirentSize = 32
    static let minDirentPlusSize = 160

    private let req: fuse_req_t?
    private let ctx: FUSEContext
    private let size: Int
    private let plus: Bool
    private let buffer: UnsafeMutablePointer<CChar>
    private var used = 0
    /// Entries the kernel will count as lookups if the reply arrives (readdirplus only).
    private var counted: [InodeNumber] = []

    init(_ req: fuse_req_t?, _ ctx: FUSEContext, size: Int, plus: Bool) {
        self.req = req
        self.ctx = ctx
        self.size = size
        self.plus = plus
        buffer = .allocate(capacity: size)
    }

    deinit { buffer.deallocate() }

    var isEmpty: Bool { used == 0 }
    /// Room for at least the smallest entry.
    var hasRoom: Bool { size - used >= (plus ? Self.minDirentPlusSize : Self.minDirentSize) }

    /// How many entries to ask the filesystem for. Plain entries that don't fit are simply not consumed (the
    /// next call resumes at the last cookie); readdirplus entries are lookups, so ask for about as many as fit.
    var batchLimit: Int {
        let remaining = size - used
        return plus ? max(1, remaining / (Self.minDirentPlusSize + 16)) : max(1, remaining / Self.minDirentSize)
    }

    /// Encodes `entry`; false when it does not fit (then nothing was added and the caller stops).
    /// An entry whose name cannot be encoded is skipped (true: listing goes on past it).
    func add(_ entry: DirectoryEntry) -> Bool {
        guard let name = cString(entry.name), !entry.name.isEmpty else {
            ctx.logger.debug("readdir: skipping an entry with an invalid name", metadata: ["ino": "\(entry.ino)"])
            if plus, let a = entry.attributes { ctx.fs.forget(a.ino, lookups: 1) }
            return true
        }
        let added = name.withUnsafeBufferPointer { encode(entry, name: $0.baseAddress) }
        guard added <= size - used else { return false }
        used += added
        if plus, let a = entry.attributes {
            if entry.name == [0x2E] || entry.name == [0x2E, 0x2E] {
                // The kernel does not count "." and ".." as lookups.
                ctx.fs.forget(a.ino, lookups: 1)
            } else {
                counted.append(a.ino)
            }
        }
        return true
    }

    /// Entries the filesystem returned that will not be handed out.
    func drop(_ entries: ArraySlice<DirectoryEntry>) {
        guard plus else { return }
        for e in entries {
            if let a = e.attributes { ctx.fs.forget(a.ino, lookups: 1) }
        }
    }

    /// Sends what was added; if the kernel does not take it, its lookups are undone.
    func send() {
        if fuse_reply_buf(req, used > 0 ? buffer : nil, used) != 0 {
            for ino in counted { ctx.fs.forget(ino, lookups: 1) }
        }
    }

    /// fuse_add_direntry(_plus) at the end of the buffer: the size the entry needs (written only if it fits).
    private func encode(_ entry: DirectoryEntry, name: UnsafePointer<CChar>?) -> Int {
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
            return fuse_add_direntry_plus(req, dest, size - used, name, &e, off_t(entry.offset))
        }
        var st = stat()
        st.st_ino = UInt(truncatingIfNeeded: entry.ino)
        st.st_mode = entry.type & UInt32(Glibc.S_IFMT)
        return fuse_add_direntry(req, dest, size - used, name, &st, off_t(entry.offset))
    }
}
