import CofferStore

/// A file's last chunk, partly written, kept in plaintext until the file is closed, read there,
/// truncated, written elsewhere, or the group commits. Small appends (tar writes 10 KiB records)
/// then cost one seal and one row write per chunk instead of a read-modify-write per record.
/// Guarded by `meta`, like the rest of `InodeState`; changed only with the content lock held.
struct TailChunk {
    let index: UInt64
    /// The chunk's bytes up to the end of what was written into it.
    var bytes: [UInt8]

    /// Copies `data` in at `offset` inside the chunk, growing it with zeros if needed.
    mutating func merge(_ data: UnsafeRawBufferPointer, at offset: Int) {
        let end = offset + data.count
        if bytes.count < end { bytes.append(contentsOf: repeatElement(0, count: end - bytes.count)) }
        bytes.withUnsafeMutableBytes { UnsafeMutableRawBufferPointer(rebasing: $0[offset ..< end]).copyMemory(from: data) }
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
    func flushTail(_ s: InodeState) throws(FSError) {
        guard let tail = s.tail else { return }
        do {
            let cipher = try s.cipher(keys)
            let sealed = try tail.bytes.withUnsafeBytes { try store.sealChunk($0, file: s.record.contentId, index: tail.index, cipher: cipher) }
            guard let tag = ChunkTag(sealed: sealed) else { throw FSError.io }
            try store.putChunk(file: s.record.contentId, index: tail.index, sealed: sealed)
            try s.chunkMap.set(tail.index, tag, store: store)
        } catch { throw fsError(error, "inode \(s.ino)") }
        s.tail = nil
    }
}
