import CofferStore
import Glibc

/// fallocate(2): growing a file, punching holes and zeroing ranges. Space cannot be reserved inside
/// the store (content is sealed and packed as it is written), so plain allocation grows the size (what
/// callers observe) after checking that the disk has room for the new part now: a program that
/// allocates ahead of writing (journald, download managers, databases) hears ENOSPC at fallocate, as on a
/// local filesystem, instead of at a later write. The room is not set aside. A punched or zeroed
/// range gives its whole chunks back (their rows go, the chunk map records holes) and zeroes the
/// parts of the chunks at its edges, as ext4 does.
extension CofferFileSystem {
    // linux/falloc.h (not imported by Glibc's module).
    static let keepSizeFlag: Int32 = 0x01, punchHoleFlag: Int32 = 0x02, zeroRangeFlag: Int32 = 0x10

    public func fallocate(_ ino: InodeNumber, handle: HandleID, mode: Int32, offset: UInt64, length: UInt64) throws(FSError) {
        try checkWritable()
        let keepSize = mode & Self.keepSizeFlag != 0
        let punch = mode & Self.punchHoleFlag != 0, zero = mode & Self.zeroRangeFlag != 0
        // Punching must keep the size (fallocate(2)); collapse, insert and unshare are not supported.
        guard mode & ~(Self.keepSizeFlag | Self.punchHoleFlag | Self.zeroRangeFlag) == 0, !(punch && zero),
            !punch || keepSize
        else { throw .notSupported }
        let (s, size) = try meta.withLock { () throws(FSError) in
            let s = try state(ino)
            return (s, s.record.size)
        }
        guard s.isRegular else { throw s.isDirectory ? .isDirectory : FSError(ENODEV) }
        let (end, overflow) = offset.addingReportingOverflow(length)
        guard length > 0, !overflow, end <= UInt64(Int64.max) else { throw length == 0 ? .invalid : .fileTooBig }
        if !punch, !zero, end > size { try checkRoom(allocating: end - max(offset, size)) }
        try s.content.withWriteLock { () throws(FSError) in
            try meta.withLock { () throws(FSError) in
                if punch || zero { try clearRange(s, from: offset, to: end) }
                let grows = !keepSize && end > s.record.size
                if grows {
                    s.record.size = end
                    s.dirty = true
                }
                // Under the writeback cache the kernel stamps the times itself (`stampsTimes`).
                if stampsTimes(s), punch || zero || grows {
                    let now = StoredTime.now()
                    if punch || zero { s.record.mtime = now }
                    s.record.ctime = now
                }
            }
        }
        try commitIfDue()
    }

    /// Makes [from, to) read as zeros: chunks wholly inside the range (or inside it up to the end of
    /// the file) become holes, the chunks at its edges are rewritten with their part zeroed. Call
    /// under `meta` with the content lock held for writing.
    func clearRange(_ s: InodeState, from: UInt64, to requestedEnd: UInt64) throws(FSError) {
        let size = s.record.size
        let end = min(requestedEnd, size)
        guard from < end else { return }
        try flushTail(s)
        let cs = UInt64(chunkSize)
        // A chunk is dropped whole when the range covers it up to its end or the end of the file.
        let firstWhole = (from + cs - 1) / cs
        let lastWhole: UInt64? = end == size ? (size - 1) / cs : (end / cs == 0 ? nil : end / cs - 1)
        if let lastWhole, firstWhole <= lastWhole {
            do {
                let removed = try store.deleteChunks(file: s.record.contentId, first: firstWhole, last: lastWhole)
                s.record.chunkCount -= min(s.record.chunkCount, UInt64(removed))
                try s.chunkMap.clear(firstWhole, lastWhole, store: store)
            } catch { throw fsError(error, "inode \(s.ino)") }
        }
        // The edges: the chunk holding `from` (if not dropped) and the one holding `end - 1`.
        var edges: [UInt64] = []
        if from % cs != 0 { edges.append(from / cs) }
        let lastIndex = (end - 1) / cs
        if lastWhole.map({ lastIndex > $0 }) ?? true, !edges.contains(lastIndex) { edges.append(lastIndex) }
        for index in edges {
            let start = index * cs
            let length = Int(min(cs, size - start))
            let c = try fileContent(s, offset: start, count: length)
            if c.tags[0].isHole { continue }
            var bytes = try readRange(c, offset: start, count: length)
            let zeroFrom = Int(max(from, start) - start), zeroTo = Int(min(end, start + UInt64(length)) - start)
            for i in zeroFrom..<zeroTo { bytes[i] = 0 }
            let sealed: [UInt8]
            do { sealed = try c.cipher.seal(bytes, index: index) } catch { throw fsError(error, "inode \(s.ino)") }
            _ = try storeChunks(s, [(index, sealed)])
        }
        s.dirty = true
    }
}
