import CofferStore

/// A file's last chunk, partly written, kept in plaintext until it is read there, truncated, written
/// elsewhere, the group commits, the kernel forgets the file, or the tails held hold too much
/// (`storeHeldTails`). Small appends (tar writes 10 KiB records)
/// then cost one seal and one row write per chunk instead of a read-modify-write per record.
/// Guarded by `meta`, like the rest of `InodeState`. A write sets it with the content lock held; a
/// commit, a sweep or a forget may store it under `meta` alone (a write flushes it before its plan).
struct TailChunk {
    let index: UInt64
    /// The chunk's bytes up to the end of what was written into it.
    var bytes: [UInt8]

    /// Copies `data` in at `offset` inside the chunk, growing it with zeros if needed.
    mutating func merge(_ data: UnsafeRawBufferPointer, at offset: Int) {
        let end = offset + data.count
        if bytes.count < end { bytes.append(contentsOf: repeatElement(0, count: end - bytes.count)) }
        bytes.withUnsafeMutableBytes { UnsafeMutableRawBufferPointer(rebasing: $0[offset..<end]).copyMemory(from: data) }
    }
}

extension CofferFileSystem {
    /// Whether a write of [start, end) may go into the tail buffer: it stays inside one chunk, does
    /// not fill it whole (a whole chunk is sealed at once), and that chunk is the file's last.
    func fitsTail(start: UInt64, end: UInt64, newSize: UInt64) -> UInt64? {
        let cs = UInt64(chunkSize)
        let index = start / cs
        guard (end - 1) / cs == index, end - start < cs, (newSize - 1) / cs == index else { return nil }
        return index
    }

    /// Seals and stores the tail buffer, if any, and records it in the chunk map. Call under `meta`.
    /// A new chunk was counted when the tail started (`recordWrite`), so the count is not added again.
    func flushTail(_ s: InodeState) throws(FSError) {
        guard let tail = s.tail else { return }
        let sealed: [UInt8]
        do { sealed = try s.cipher(store).seal(tail.bytes, index: tail.index) } catch { throw fsError(error, "inode \(s.ino)") }
        _ = try storeChunks(s, [(tail.index, sealed)])
        s.tail = nil
    }

    /// Whether the tails held are to be stored now (`storeHeldTails`): once `Options.heldTailVolume` bytes
    /// were written into tails since the last time, or 256 KiB on a disk running low. Call under meta.
    func heldTailsDue() -> Bool {
        heldTailBytes >= options.heldTailVolume || isShortOfSpaceForTails()
    }

    /// Stores every tail held. Small files written faster than groups commit would otherwise pile up in
    /// memory (a second of them is tens of MiB), unseen by the group's volume and free-space checks
    /// (`EntityStore.isCommitDue`): on a nearly full disk the commit then found no room for any of
    /// them and the whole group went, the directory made for them included. Stored, they count
    /// toward the group, which commits in steps as the disk fills. A file dropped from memory since
    /// (a reread record) or deleted is skipped: its tail went with it.
    func storeHeldTails() throws(FSError) {
        try meta.withLock { () throws(FSError) in
            let tails = heldTails
            forgetHeldTails()
            for (i, s) in tails.enumerated() where inodes[s.ino] === s && !s.deleted {
                do throws(FSError) { try flushTail(s) } catch {
                    heldTails = Array(tails[i...])  // still held, stored at the commit
                    throw error
                }
            }
        }
    }

    /// The tails held were stored or dropped (call under meta).
    func forgetHeldTails() {
        heldTails.removeAll()
        heldTailBytes = 0
        heldTailsProbed = 0
    }

    /// On a disk running low, tails are stored every 256 KiB, so that the group that finds the disk
    /// full holds little. The disk is looked at once per 256 KiB held (call under meta).
    private func isShortOfSpaceForTails() -> Bool {
        let step = heldTailBytes >> 18
        guard step > heldTailsProbed else { return false }
        heldTailsProbed = step
        return store.isLowOnSpace()
    }
}
