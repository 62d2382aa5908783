import CofferStore
import Glibc

/// Names: lookup, creation, removal, links and rename.
extension CofferFileSystem {
    public func lookup(parent: InodeNumber, name: [UInt8]) throws(FSError) -> Attributes {
        guard name.count <= DirectoryEntryRecord.maxNameLength else { throw .nameTooLong }
        return try locked { () throws(FSError) -> Attributes in
            _ = try directory(parent)
            let child = try cachedEntryState(parent: parent, name: name)
            child.lookups += 1
            return attributes(child)
        }
    }

    public func forget(_ ino: InodeNumber, lookups: UInt64) {
        forgetsSeen.add(1, ordering: .relaxed)
        let removed = meta.withLock { () -> Bool in
            guard let s = inodes[ino] else { return false }
            s.lookups = s.lookups > lookups ? s.lookups - lookups : 0
            if s.unlinkedElsewhere {  // another mount's to remove (release(ifUnused:))
                release(ifUnused: s)
                return false
            }
            guard s.lookups == 0 && (s.record.nlink == 0 || s.dirty) else {
                release(ifUnused: s)
                return false
            }
            if s.record.nlink == 0 && !s.deleted && reapsWhenQuiet && dying.count < Self.maxDying && !store.isLowOnSpace() {
                // `rm` goes on at once; the file's rows go when the filesystem is quiet (reapIfQuiet).
                moveToDying(s)
                return false
            }
            // Removing an unlinked file is several statements: one visit to the writer. Not into an open group
            // of inodes, which does not hold this one (its writes would be refused): the reaper deletes it in
            // a group of the container, or the unmount does; past `maxDying` too, rather than not at all.
            _ = try? store.batch {
                if s.record.nlink == 0 && !s.deleted && store.holdsInodeGroup {
                    moveToDying(s)
                } else {
                    release(ifUnused: s)
                }
            }
            return s.deleted
        }
        // Short of space, `rm` frees it here, at the forget: the deletes commit in pieces
        // (EntityStore.isCommitDue) before new writes need the room. A failure is the next
        // writer's to see.
        if removed { try? commitIfDueOutsideChanges() }
    }

    /// A removed file the kernel is done with leaves memory for `dying`, its rows for the reaper (call under meta).
    private func moveToDying(_ s: InodeState) {
        s.tail = nil
        s.wipeCipher()
        inodes[s.ino] = nil
        dying[s.ino] = s
    }

    /// The inode a name points to (call under meta).
    func entryState(parent: InodeNumber, name: [UInt8]) throws(FSError) -> InodeState {
        let entry: DirectoryEntryRecord?
        do { entry = try store.entry(parent: parent, name: name) } catch {
            let e = fsError(error, "an entry of directory \(parent)")
            if e == .io { logDamagedPath(parent: parent, name: name) }
            throw e
        }
        guard let entry else { throw .notFound }
        let s = try state(entry.ino)
        s.location = (parent, name)
        return s
    }

    /// `entryState` through the entry cache (coherent mounts; call under meta): a name listed or looked
    /// up since anything could have changed it needs no store read.
    private func cachedEntryState(parent: InodeNumber, name: [UInt8]) throws(FSError) -> InodeState {
        guard options.coherent else { return try entryState(parent: parent, name: name) }
        let epoch = storeEpoch.load(ordering: .acquiring), changes = store.entryChanges
        // A hit counts only for a live inode, with nothing changed while its state was read.
        if let ino = entryCache.inode(parent: parent, name: name, epoch: epoch, entryChanges: changes), dying[ino] == nil,
            let s = try? state(ino), !s.deleted, !s.goneElsewhere, !s.unlinkedElsewhere, s.record.nlink > 0,
            storeEpoch.load(ordering: .acquiring) == epoch
        {
            s.location = (parent, name)
            return s
        }
        let s = try entryState(parent: parent, name: name)
        entryCache.keep(parent: parent, name: name, ino: s.ino, epoch: epoch, entryChanges: changes)
        return s
    }

    func existingEntry(parent: InodeNumber, name: [UInt8]) throws(FSError) -> DirectoryEntryRecord? {
        do { return try store.entry(parent: parent, name: name) } catch { throw fsError(error, "an entry of directory \(parent)") }
    }

    /// Creates an inode and its entry; the new inode counts one lookup. Call under meta.
    func makeNode(
        parent: InodeNumber, name: [UInt8], mode: UInt32, rdev: UInt64 = 0, caller: Caller,
        symlink: StoredPath? = nil, size: UInt64 = 0
    ) throws(FSError) -> InodeState {
        try checkWritable()
        do {
            return try store.batch { () throws(FSError) -> InodeState in
                try makeNodeInBatch(parent: parent, name: name, mode: mode, rdev: rdev, caller: caller, symlink: symlink, size: size)
            }
        } catch { throw fsError(error) }
    }

    private func makeNodeInBatch(
        parent: InodeNumber, name: [UInt8], mode: UInt32, rdev: UInt64, caller: Caller,
        symlink: StoredPath?, size: UInt64
    ) throws(FSError) -> InodeState {
        try Self.validate(name: name)
        let dir = try directory(parent)
        guard dir.record.nlink > 0 else { throw .notFound }
        let now = StoredTime.now()
        var mode = mode
        var gid = caller.gid
        // The setgid directory rule: new entries take the directory's group; subdirectories keep the bit.
        if dir.record.mode & UInt32(S_ISGID) != 0 {
            gid = dir.record.gid
            if mode & UInt32(S_IFMT) == UInt32(S_IFDIR) { mode |= UInt32(S_ISGID) }
        }
        let isDir = mode & UInt32(S_IFMT) == UInt32(S_IFDIR)
        let ino = try freeInodeNumber()
        let contentId: UInt64
        do {
            contentId = mode & UInt32(S_IFMT) == UInt32(S_IFREG) ? try EntityStore.newContentId() : 0
        } catch { throw fsError(error) }
        let record = InodeRecord(
            mode: mode, uid: caller.uid, gid: gid, nlink: isDir ? 2 : 1, size: size, rdev: rdev,
            atime: now, mtime: now, ctime: now, contentId: contentId, symlinkTarget: symlink)
        // The entry goes in at once (lookups read the store); the record is born dirty and goes out with the
        // group commit, like the directory's new times, so a commit holds both or neither. A new file is
        // usually changed again before that (tar sets its times, owner and mode): one record write, not two.
        do {
            guard try store.addEntry(parent: parent, DirectoryEntryRecord(name: name, ino: ino, type: mode & UInt32(S_IFMT))) else {
                throw FSError.exists
            }
        } catch { throw fsError(error, "an entry of directory \(parent)") }
        let s = InodeState(ino: ino, record: record)
        s.epoch = storeEpoch.load(ordering: .acquiring)
        s.dirty = true
        if isDir { dir.linkAdded() }
        dir.record.mtime = now
        dir.record.ctime = now
        dir.dirty = true
        s.lookups = 1
        s.location = (parent, name)
        inodes[ino] = s
        return s
    }

    /// An inode number neither the store nor memory uses: a new inode's record reaches the store only
    /// at the next commit, so the store alone cannot tell. Call under meta.
    private func freeInodeNumber() throws(FSError) -> InodeNumber {
        for _ in 0..<16 {
            let ino: InodeNumber
            do { ino = try store.newInodeId() } catch { throw fsError(error) }
            if inodes[ino] == nil && dying[ino] == nil { return ino }
        }
        throw .io
    }

    public func mknod(parent: InodeNumber, name: [UInt8], mode: UInt32, rdev: UInt64, caller: Caller) throws(FSError) -> Attributes {
        let type = mode & UInt32(S_IFMT)
        guard [S_IFREG, S_IFIFO, S_IFCHR, S_IFBLK, S_IFSOCK].contains(where: { UInt32($0) == type }) else { throw .invalid }
        try checkRoom(forName: name)
        return try meta.withLock { () throws(FSError) -> Attributes in
            attributes(try makeNode(parent: parent, name: name, mode: mode, rdev: rdev, caller: caller))
        }
    }

    public func mkdir(parent: InodeNumber, name: [UInt8], mode: UInt32, caller: Caller) throws(FSError) -> Attributes {
        try checkRoom(forName: name)
        return try meta.withLock { () throws(FSError) -> Attributes in
            attributes(try makeNode(parent: parent, name: name, mode: UInt32(S_IFDIR) | (mode & 0o7777), caller: caller))
        }
    }

    public func symlink(parent: InodeNumber, name: [UInt8], target: [UInt8], caller: Caller) throws(FSError) -> Attributes {
        guard !target.isEmpty else { throw .notFound }
        guard target.count <= ContainerPathTransformer.maxLength, !target.contains(0) else { throw .nameTooLong }
        let stored: StoredPath =
            options.plainSymlinks
            ? .verbatim(target)
            : options.symlinkRoot.map { ContainerPathTransformer.store(target, root: Array($0.utf8)) } ?? .verbatim(target)
        try checkRoom(forName: name, extra: target.count)
        return try meta.withLock { () throws(FSError) -> Attributes in
            attributes(
                try makeNode(
                    parent: parent, name: name, mode: UInt32(S_IFLNK) | 0o777, caller: caller,
                    symlink: stored, size: UInt64(target.count)))
        }
    }

    public func readlink(_ ino: InodeNumber) throws(FSError) -> [UInt8] {
        try meta.withLock { () throws(FSError) -> [UInt8] in
            let s = try state(ino)
            guard s.isSymlink, let stored = s.record.symlinkTarget else { throw .invalid }
            let target: [UInt8]
            do { target = try resolvedTarget(stored) } catch {
                logger.error("symlink \(ino) holds a refused target: \(error)")
                throw .io
            }
            // A target inside the mount, written near PATH_MAX under a shorter mountpoint, can be too long
            // under this one: the kernel refuses such a reply, which the reader saw as EIO.
            guard target.count < Int(PATH_MAX) else { throw .nameTooLong }
            return target
        }
    }

    /// A symlink's target as this mount shows it: a path inside the container is rooted at the current
    /// mountpoint, so its length (the symlink's st_size) depends on where the container is mounted.
    func resolvedTarget(_ stored: StoredPath) throws -> [UInt8] {
        try ContainerPathTransformer.resolve(stored, root: Array((options.symlinkRoot ?? "/").utf8))
    }

    public func link(_ ino: InodeNumber, newParent: InodeNumber, newName: [UInt8]) throws(FSError) -> Attributes {
        try checkRoom(forName: newName)
        return try locked { () throws(FSError) -> Attributes in
            let s = try state(ino)
            guard !s.isDirectory else { throw .permission }
            guard s.record.nlink > 0, !s.deleted else { throw .notFound }
            guard s.record.nlink < UInt32.max - 1 else { throw .tooManyLinks }
            let dir = try directory(newParent)
            guard try existingEntry(parent: newParent, name: newName) == nil else { throw .exists }
            do { try store.putEntry(parent: newParent, DirectoryEntryRecord(name: newName, ino: ino, type: s.fileType)) } catch {
                throw fsError(error)
            }
            let now = StoredTime.now()
            s.linkAdded()
            s.record.ctime = now
            try persist(s)
            dir.record.mtime = now
            dir.record.ctime = now
            dir.dirty = true
            s.lookups += 1
            s.location = (newParent, newName)
            return attributes(s)
        }
    }

    public func unlink(parent: InodeNumber, name: [UInt8]) throws(FSError) {
        try checkWritable()
        try locked { () throws(FSError) in
            let dir = try directory(parent)
            let s = try entryState(parent: parent, name: name)
            guard !s.isDirectory else { throw .isDirectory }
            do { try store.deleteEntry(parent: parent, name: name) } catch { throw fsError(error) }
            let now = StoredTime.now()
            dir.record.mtime = now
            dir.record.ctime = now
            dir.dirty = true
            try dropLink(s, now: now)
        }
        // On a full disk, many deletes commit in pieces (EntityStore.isCommitDue).
        try commitIfDue()
    }

    /// One name fewer: the inode goes when its last name goes and the kernel holds no reference
    /// (an open file is held by the kernel's lookup). A held file without names stays and goes at
    /// its forget. For `rm` the forget
    /// follows at once, mostly before the next commit: so the record (and its orphan row, which
    /// makes a crash clean it up at next mount) is written only if a commit comes first, and a
    /// full disk is not asked for room to delete a file.
    func dropLink(_ s: InodeState, now: StoredTime) throws(FSError) {
        s.record.nlink = s.record.nlink > 0 ? s.record.nlink - 1 : 0
        s.record.ctime = now
        if s.record.nlink > 0 {
            try persist(s)
            return
        }
        if s.lookups > 0 {
            s.dirty = true
        } else {
            try destroy(s)
            release(ifUnused: s)
        }
    }

    public func rmdir(parent: InodeNumber, name: [UInt8]) throws(FSError) {
        try checkWritable()
        try locked { () throws(FSError) in
            let dir = try directory(parent)
            let s = try entryState(parent: parent, name: name)
            guard s.isDirectory else { throw .notDirectory }
            try requireEmpty(s)
            do { try store.deleteEntry(parent: parent, name: name) } catch { throw fsError(error) }
            let now = StoredTime.now()
            dir.subdirectoryRemoved()
            dir.record.mtime = now
            dir.record.ctime = now
            dir.dirty = true
            s.record.nlink = 0
            try destroy(s)
            release(ifUnused: s)
        }
        try commitIfDue()
    }

    func requireEmpty(_ dir: InodeState) throws(FSError) {
        let nonEmpty: Bool
        do { nonEmpty = try store.hasEntries(parent: dir.ino) } catch { throw fsError(error) }
        if nonEmpty { throw .notEmpty }
    }

    public func rename(parent: InodeNumber, name: [UInt8], newParent: InodeNumber, newName: [UInt8], flags: RenameFlags) throws(FSError) {
        try checkWritable()
        try Self.validate(name: newName)
        guard flags.isSubset(of: [.noReplace, .exchange]), flags != [.noReplace, .exchange] else { throw .invalid }
        try locked { () throws(FSError) in
            let fromDir = try directory(parent)
            let toDir = try directory(newParent)
            let source = try entryState(parent: parent, name: name)
            let targetEntry = try existingEntry(parent: newParent, name: newName)
            let now = StoredTime.now()
            func put(_ dir: InodeNumber, _ n: [UInt8], _ s: InodeState) throws(FSError) {
                do { try store.putEntry(parent: dir, DirectoryEntryRecord(name: n, ino: s.ino, type: s.fileType)) } catch { throw fsError(error) }
            }
            func touch(_ dirs: InodeState...) {
                for d in dirs {
                    d.record.mtime = now
                    d.record.ctime = now
                    d.dirty = true
                }
            }

            if flags.contains(.exchange) {
                guard let targetEntry else { throw .notFound }
                let target = try state(targetEntry.ino)
                if parent != newParent {
                    if source.isDirectory { try refuseMoveBelowItself(source.ino, into: newParent) }
                    if target.isDirectory { try refuseMoveBelowItself(target.ino, into: parent) }
                }
                try put(parent, name, target)
                try put(newParent, newName, source)
                target.location = (parent, name)
                source.location = (newParent, newName)
                if parent != newParent && source.isDirectory != target.isDirectory {
                    if source.isDirectory {
                        fromDir.subdirectoryRemoved()
                        toDir.linkAdded()
                    } else {
                        fromDir.linkAdded()
                        toDir.subdirectoryRemoved()
                    }
                }
                source.record.ctime = now
                target.record.ctime = now
                source.dirty = true
                target.dirty = true
                touch(fromDir, toDir)
                return
            }
            if source.isDirectory && parent != newParent { try refuseMoveBelowItself(source.ino, into: newParent) }
            if let targetEntry {
                guard !flags.contains(.noReplace) else { throw .exists }
                if targetEntry.ino == source.ino { return }
                let target = try state(targetEntry.ino)
                if source.isDirectory {
                    guard target.isDirectory else { throw .notDirectory }
                    try requireEmpty(target)
                } else if target.isDirectory {
                    throw .isDirectory
                }
                if target.isDirectory {
                    toDir.subdirectoryRemoved()
                    target.record.nlink = 0
                    try destroy(target)
                    release(ifUnused: target)
                } else {
                    try dropLink(target, now: now)
                }
            }
            do { try store.deleteEntry(parent: parent, name: name) } catch { throw fsError(error) }
            try put(newParent, newName, source)
            source.location = (newParent, newName)
            if source.isDirectory && parent != newParent {
                fromDir.subdirectoryRemoved()
                toDir.linkAdded()
            }
            source.record.ctime = now
            source.dirty = true
            touch(fromDir, toDir)
        }
    }

    // MARK: Directories

    /// Nothing to open: a listing resumes from its cookie alone (`DirectoryCookie`).
    public func opendir(_ ino: InodeNumber, caller: Caller) throws(FSError) -> HandleID {
        try locked { () throws(FSError) -> HandleID in
            _ = try directory(ino)
            return .none
        }
    }

    /// ".", "..", then the entries in tag order after the one `offset` names. Entries added or removed
    /// meanwhile may or may not be listed, as POSIX allows; every other entry comes exactly once.
    public func readdir(_ ino: InodeNumber, handle: HandleID, offset: Int64, limit: Int, plus: Bool) throws(FSError) -> [DirectoryEntry] {
        try locked { () throws(FSError) -> [DirectoryEntry] in
            _ = try directory(ino)
            guard offset >= 0 else { throw .invalid }
            let dirType = UInt32(S_IFDIR)
            var out: [DirectoryEntry] = []
            if offset < DirectoryCookie.afterDot {
                out.append(DirectoryEntry(name: [UInt8(ascii: ".")], ino: ino, type: dirType, offset: DirectoryCookie.afterDot))
            }
            if offset < DirectoryCookie.afterDotDot && out.count < limit {
                out.append(
                    DirectoryEntry(
                        name: [UInt8(ascii: "."), UInt8(ascii: ".")], ino: EntityStore.rootInode, type: dirType,
                        offset: DirectoryCookie.afterDotDot))
            }
            // The names handed out are kept for LOOKUPs, marked with what held before they were read.
            let epoch = storeEpoch.load(ordering: .acquiring), changes = store.entryChanges
            let resume = DirectoryCookie(offset)
            var from = resume?.lowerBound ?? []
            var cursor = ListingCursor(resume: resume)
            page: while out.count < limit {
                // The rows of the resumed prefix that were handed out already come first again.
                let want = limit - out.count + (resume.map { Int($0.rank) + 1 } ?? 0)
                let rows: [(tag: [UInt8], record: DirectoryEntryRecord?)]
                do {
                    rows = try store.entryPage(parent: ino, from: from, limit: want) { error in _ = self.fsError(error, "listing directory \(ino)") }
                } catch { throw fsError(error) }
                if plus {
                    // The inodes the loop below will hand out, read in one store call.
                    var ahead = cursor
                    var inos: [InodeNumber] = []
                    for (tag, record) in rows where out.count + inos.count < limit {
                        if ahead.advance(tag: tag) != nil, let e = record { inos.append(e.ino) }
                    }
                    prefetch(inos)
                }
                for (tag, record) in rows {
                    guard out.count < limit else { break page }
                    guard let here = cursor.advance(tag: tag) else { continue }
                    guard let e = record else { continue }  // damaged: reported, left out
                    var entry = DirectoryEntry(name: e.name, ino: e.ino, type: e.type, offset: here.value)
                    if options.coherent { entryCache.keep(parent: ino, name: e.name, ino: e.ino, epoch: epoch, entryChanges: changes) }
                    if plus {
                        // A damaged inode is left out of the listing (its lookup reports EIO).
                        guard let s = try? state(e.ino) else { continue }
                        s.lookups += 1
                        s.location = (ino, e.name)
                        entry.attributes = attributes(s)
                    }
                    out.append(entry)
                }
                guard rows.count == want, let tail = rows.last?.tag else { break }
                from = tail + [0]  // strictly after the last row
            }
            return out
        }
    }

    public func releasedir(_ ino: InodeNumber, handle: HandleID) {}

    /// As fsync: a directory whose changes a dropped group took reports it once.
    public func fsyncdir(_ ino: InodeNumber, handle: HandleID, dataOnly: Bool) throws(FSError) {
        do { try commit() } catch {
            heardLoss(ino)
            throw error
        }
        try checkWriteError(ino)
    }
}

/// Link counts come from the store, where an older sealed record may have been put back: a count at or
/// below its floor (a directory's two) or at its ceiling stays there (or goes to the floor) instead of
/// trapping; fsck reports the mismatch with the entries.
extension InodeState {
    func linkAdded() { record.nlink = record.nlink < .max ? record.nlink + 1 : .max }
    func subdirectoryRemoved() { record.nlink = record.nlink > 2 ? record.nlink - 1 : 2 }
}
