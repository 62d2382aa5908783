import Synchronization

/// When the disk last looked roomy, and how many bytes were written since (`CofferFileSystem.checkRoom`).
struct RoomCheck {
    var at: ContinuousClock.Instant = .now
    var bytesSince = 0
    var low = true
    /// What the names and xattrs made since the last commit will take (`entityBytes` each): their records
    /// reach the store only at the commit, so the store's count of pending bytes does not hold them yet.
    var entityBytes = 0
}

extension CofferFileSystem {
    /// Room kept aside beyond a write's bytes: the commit's rows, a segment's alignment.
    static let roomMargin: Int64 = 1 << 20

    /// Refuses a write (ENOSPC) that the disk has no room for, before any of it is held or stored, as a
    /// local filesystem refuses it at write(2). Without it, a write on a full disk went into the tail
    /// buffer and was answered, and the group that then found no room to store it was dropped, taking
    /// every change since the last commit: a writer that kept going after its first ENOSPC (cp -r, tar)
    /// saw 87 of every 88 small files accepted and lost. Looks at the disk once per 100 ms or 16 MiB
    /// written while it is roomy (`EntityStore.isLowOnSpace`), at every write while it is low.
    func checkRoom(for count: Int) throws(FSError) {
        // Engines with a disk of their own only; a coherent mount's change must not commit its group.
        guard !options.coherent else { return }
        let due = roomCheck.withLock { c -> Bool in
            c.bytesSince += count
            guard c.low || c.bytesSince >= 16 << 20 || ContinuousClock.now - c.at >= .milliseconds(100) else { return false }
            c.bytesSince = 0
            c.at = .now
            return true
        }
        guard due else { return }
        let low = store.isLowOnSpace()
        roomCheck.withLock { $0.low = low }
        guard low, !hasRoom(for: count) else { return }
        // Removed files' space comes back only with the commit that deletes their rows, once it is synced
        // (freed segment ranges are reused only when no state on the disk still names them): commit now
        // and look again, as a local filesystem has the space of `rm` at once.
        try? commit()
        if !hasRoom(for: count) { throw .noSpace }
    }

    /// `checkRoom(for:)` for a write of `count` bytes at `offset` of `s`; a refused write past the file's stored
    /// end marks it (`InodeState.refusedFrom`, which `refusesGap` then reads under the content lock).
    func checkRoom(for count: Int, writing s: InodeState, at offset: UInt64) throws(FSError) {
        do { try checkRoom(for: count) } catch {
            meta.withLock { if offset + UInt64(count) > s.record.size { s.refusedFrom = min(s.refusedFrom ?? offset, offset) } }
            throw error
        }
    }

    /// Whether a write starting at `start` must be refused to keep `s` a prefix of what was written: one past
    /// its stored end was refused for room, and the disk still looked low at the last look; once it does not,
    /// the mark goes. Call under `meta`.
    func refusesGap(_ s: InodeState, at start: UInt64) -> Bool {
        guard s.refusedFrom != nil, start > s.record.size else { return false }
        if roomCheck.withLock({ $0.low }) { return true }
        s.refusedFrom = nil
        return false
    }

    /// Bytes a change that adds entities (an inode and its entry, a link, an xattr) is counted as.
    static let entityBytes = 4096

    /// Refuses (ENOSPC) a change that adds entities when the disk has no room for them, as ext4 refuses
    /// mkdir on a full disk. Without it, 3,000 mkdirs on a full disk were each answered and then lost with
    /// the group that could not commit (a tester's find). A read-only mount says EROFS first, as ext4 does.
    /// Call outside `meta`: it may commit.
    func checkRoomForEntities(_ extra: Int = 0) throws(FSError) {
        try checkWritable()
        try checkRoom(for: Self.entityBytes + extra)
        roomCheck.withLock { $0.entityBytes += Self.entityBytes + extra }
    }

    /// `checkRoomForEntities` for a new name (mknod, mkdir, symlink, create, link): a bad name is EINVAL or
    /// ENAMETOOLONG before a full disk is ENOSPC.
    func checkRoom(forName name: [UInt8], extra: Int = 0) throws(FSError) {
        try Self.validate(name: name)
        try checkRoomForEntities(extra)
    }

    /// Refuses (ENOSPC) an allocation of `bytes` past a file's end that the disk cannot hold now, looking
    /// at the disk every time: one fallocate can ask for more than all the writes between two checks.
    func checkRoom(allocating bytes: UInt64) throws(FSError) {
        guard !options.coherent else { return }
        let count = Int(min(bytes, 1 << 62))  // no disk is that large; the sum with the margin stays in range
        guard !hasRoom(for: count) else { return }
        try? commit()  // removed files' space comes back with the commit that deletes their rows
        if !hasRoom(for: count) { throw .noSpace }
    }

    private func hasRoom(for count: Int) -> Bool {
        let held = meta.withLock { heldTailBytes } + roomCheck.withLock { $0.entityBytes }
        return store.hasRoom(forWrite: count, more: Int64(held) + Self.roomMargin)
    }
}
