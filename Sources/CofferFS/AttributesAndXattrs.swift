import CofferStore
import Glibc

/// stat, setattr, statfs and extended attributes.
extension CofferFileSystem {
    public func getattr(_ ino: InodeNumber) throws(FSError) -> Attributes {
        try meta.withLock { () throws(FSError) -> Attributes in attributes(try state(ino)) }
    }

    public func setattr(_ ino: InodeNumber, changes: AttributeChanges, handle: HandleID?, caller: Caller) throws(FSError) -> Attributes {
        try checkWritable()
        let s = try meta.withLock { () throws(FSError) in try state(ino) }
        if let size = changes.size {
            try truncate(s, to: size)
            meta.withLock { s.refusedFrom = nil }
        }
        return try meta.withLock { () throws(FSError) -> Attributes in
            let now = StoredTime.now()
            var changed = changes.size != nil
            if let mode = changes.mode {
                s.record.mode = (s.record.mode & UInt32(S_IFMT)) | (mode & 0o7777)
                changed = true
            }
            if let uid = changes.uid, uid != UInt32.max {
                s.record.uid = uid
                changed = true
            }
            if let gid = changes.gid, gid != UInt32.max {
                s.record.gid = gid
                changed = true
            }
            if (changes.uid != nil || changes.gid != nil || changes.isOwnerlessChown) && !s.isDirectory {
                // chown clears setuid, and setgid when group-executable (as chown(2) on Linux, even to -1, -1).
                if s.record.mode & UInt32(S_ISUID | S_ISGID) != 0 { changed = true }
                s.record.mode &= ~UInt32(S_ISUID)
                if s.record.mode & UInt32(S_IXGRP) != 0 { s.record.mode &= ~UInt32(S_ISGID) }
            }
            if changes.clearSetID && dropSetID(s) { changed = true }
            if let a = changes.atime {
                s.record.atime = a.resolved(now)
                changed = true
            }
            if let m = changes.mtime {
                s.record.mtime = m.resolved(now)
                changed = true
            }
            if let ctime = changes.ctime {
                s.record.ctime = ctime.stored
            } else if changed && stampsTimes(s) {
                s.record.ctime = now
            }
            // Written back with the next group commit (or when the inode leaves memory).
            s.dirty = true
            return attributes(s)
        }
    }

    @discardableResult public func clearSetID(_ ino: InodeNumber) throws(FSError) -> Bool {
        try meta.withLock { () throws(FSError) -> Bool in
            let s = try state(ino)
            guard s.isRegular, s.record.mode & UInt32(S_ISUID | S_ISGID) != 0 else { return false }
            try checkWritable()
            guard dropSetID(s) else { return false }
            if stampsTimes(s) { s.record.ctime = .now() }
            s.dirty = true
            return true
        }
    }

    /// Clears set-user-ID, and set-group-ID when group-executable (as the VFS on write, truncate and chown);
    /// true if the mode changed. Call under `meta`.
    func dropSetID(_ s: InodeState) -> Bool {
        let before = s.record.mode
        s.record.mode &= ~UInt32(S_ISUID)
        if s.record.mode & UInt32(S_IXGRP) != 0 { s.record.mode &= ~UInt32(S_ISGID) }
        return s.record.mode != before
    }

    /// The disk under the container; without one (a database server's disk is not the client's to
    /// see) a fixed capacity of 2^40 free 4 KiB blocks and 2^32 free inodes, so tools that check free
    /// space before writing (cp, rsync, installers) go ahead.
    public func statfs() throws(FSError) -> FileSystemStatistics {
        guard let statfsPath else {
            return FileSystemStatistics(
                blockSize: 4096, totalBlocks: 1 << 40, freeBlocks: 1 << 40, availableBlocks: 1 << 40,
                totalFiles: 1 << 32, freeFiles: 1 << 32, maxNameLength: UInt64(DirectoryEntryRecord.maxNameLength))
        }
        var st = statvfs()
        guard statvfs(statfsPath, &st) == 0 else { throw FSError(errno) }
        return FileSystemStatistics(
            blockSize: UInt64(st.f_frsize), totalBlocks: UInt64(st.f_blocks), freeBlocks: UInt64(st.f_bfree),
            availableBlocks: UInt64(st.f_bavail), totalFiles: UInt64(st.f_files), freeFiles: UInt64(st.f_ffree),
            maxNameLength: UInt64(DirectoryEntryRecord.maxNameLength))
    }

    // MARK: Extended attributes (user.* only; names and values sealed)

    private static let userPrefix = Array("user.".utf8)

    public func setxattr(_ ino: InodeNumber, name: [UInt8], value: [UInt8], flags: Int32) throws(FSError) {
        try checkWritable()
        guard name.starts(with: Self.userPrefix) else { throw .notSupported }
        // As ext4: a name with nothing after its prefix is EINVAL, one past 255 bytes ERANGE.
        guard name.count > Self.userPrefix.count else { throw .invalid }
        guard name.count <= ExtendedAttributeRecord.maxNameLength else { throw .range }
        guard value.count <= ExtendedAttributeRecord.maxValueLength else { throw FSError(E2BIG) }
        // A symlink, XATTR_CREATE of a name there and XATTR_REPLACE of one missing fail as they would with room,
        // as on ext4: a full disk is no reason to hide that. Looked at again below, under the same lock as the put.
        try meta.withLock { () throws(FSError) in try checkXattrFlags(ino, name: name, flags: flags) }
        try checkRoomForEntities(name.count + value.count)
        try meta.withLock { () throws(FSError) in
            try checkXattrFlags(ino, name: name, flags: flags)
            // A directory removed (rmdir, or renamed over) while the kernel still held it, or a file it no longer
            // holds: its rows are gone, and an attribute put now would outlive them (fsck: unreferenced-xattr).
            let s = try state(ino)
            guard !s.deleted else { throw .notFound }
            try checkNameListRoom(ino, adding: name)
            do { try store.putXattr(ino, name: name, value: value) } catch { throw fsError(error) }
            s.record.ctime = .now()
            s.dirty = true
        }
    }

    /// The kernel lists at most 64 KiB of names (XATTR_LIST_MAX): past that listxattr fails with E2BIG,
    /// and cp -a and rsync -X lose every attribute of the file. So a new name that would not fit is ENOSPC,
    /// as ext4 answers when its attribute block is full. Call under `meta`.
    private func checkNameListRoom(_ ino: InodeNumber, adding name: [UInt8]) throws(FSError) {
        let names: [[UInt8]]
        do {
            // Each name takes 256 bytes at most with its NUL: 256 of them always fit, and none is opened.
            guard try store.xattrCount(ino) >= Self.nameListLimit / 256 else { return }
            names = try store.xattrs(ino).map(\.name)
        } catch { throw fsError(error, "xattrs of inode \(ino)") }
        guard !names.contains(name) else { return }
        if names.reduce(name.count + 1, { $0 + $1.count + 1 }) > Self.nameListLimit { throw .noSpace }
    }
    static let nameListLimit = 65536

    /// Refuses an xattr put on a symlink (EPERM), XATTR_CREATE of a name `ino` has (EEXIST), XATTR_REPLACE of
    /// one it lacks (ENODATA). Call under `meta`.
    private func checkXattrFlags(_ ino: InodeNumber, name: [UInt8], flags: Int32) throws(FSError) {
        guard !(try state(ino)).isSymlink else { throw .permission }
        guard flags & 3 != 0 else { return }
        let exists: Bool
        do { exists = try store.xattr(ino, name: name) != nil } catch { throw fsError(error, "xattr of inode \(ino)") }
        if flags & 1 != 0 && exists { throw .exists }  // XATTR_CREATE
        if flags & 2 != 0 && !exists { throw .noData }  // XATTR_REPLACE
    }

    public func getxattr(_ ino: InodeNumber, name: [UInt8]) throws(FSError) -> [UInt8] {
        // Other namespaces are not supported, and say so as ext4 with noacl does: EOPNOTSUPP, not ENODATA.
        // ls remembers EOPNOTSUPP per device and then stops asking for security.selinux and
        // system.posix_acl_access on every entry, two round trips each; ENODATA made it ask for all of them.
        guard name.starts(with: Self.userPrefix) else { throw .notSupported }
        return try meta.withLock { () throws(FSError) -> [UInt8] in
            _ = try state(ino)
            let value: [UInt8]?
            do { value = try store.xattr(ino, name: name) } catch { throw fsError(error, "xattr of inode \(ino)") }
            guard let value else { throw .noData }
            return value
        }
    }

    public func listxattr(_ ino: InodeNumber) throws(FSError) -> [[UInt8]] {
        try meta.withLock { () throws(FSError) -> [[UInt8]] in
            _ = try state(ino)
            do { return try store.xattrs(ino).map(\.name) } catch { throw fsError(error, "xattrs of inode \(ino)") }
        }
    }

    public func removexattr(_ ino: InodeNumber, name: [UInt8]) throws(FSError) {
        try checkWritable()
        guard name.starts(with: Self.userPrefix) else { throw .notSupported }
        try meta.withLock { () throws(FSError) in
            let s = try state(ino)
            let removed: Bool
            do { removed = try store.deleteXattr(ino, name: name) } catch { throw fsError(error) }
            guard removed else { throw .noData }
            s.record.ctime = .now()
            s.dirty = true
        }
    }
}

extension TimeChange {
    func resolved(_ now: StoredTime) -> StoredTime {
        switch self {
        case .now: return now
        case .set(let t): return t.stored
        }
    }
}
