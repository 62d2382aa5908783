import CofferCrypto
import CofferStore
import Glibc

/// File content: chunked, each chunk sealed under the file's key and bound to (content id, index).
/// A chunk holds the bytes written into it up to the end of the data; bytes past a chunk's
/// plaintext inside the file size read as zeros (holes).
extension CofferFileSystem {
    /// A mount never calls this (OPEN is answered ENOSYS: `opensWithoutHandles`); it opens as the
    /// kernel then does: no handle, O_TRUNC as a truncate.
    public func open(_ ino: InodeNumber, flags: Int32, caller: Caller) throws(FSError) -> OpenResult {
        let writing = flags & O_ACCMODE != O_RDONLY
        if writing || flags & O_TRUNC != 0 { try checkWritable() }
        let s = try meta.withLock { () throws(FSError) -> InodeState in
            let s = try state(ino)
            if s.isDirectory { throw .isDirectory }
            // Close-to-open: a name another mount removed is not opened from this kernel's stale entry (a
            // rollback journal deleted elsewhere would be replayed); ESTALE makes the kernel look it up again.
            if s.unlinkedElsewhere && options.coherent { throw FSError(ESTALE) }
            return s
        }
        if flags & O_TRUNC != 0 && s.isRegular { try truncate(s, to: 0) }
        guard options.coherent else {
            // The kernel's page cache stays valid across opens: every change goes through us.
            return OpenResult(handle: .none, keepCache: true)
        }
        // Another mount changed the file since the kernel last saw it: its pages and attributes go.
        let changed = meta.withLock {
            defer { s.changedElsewhere = false }
            return s.changedElsewhere
        }
        return OpenResult(handle: .none, keepCache: !changed, attributesChanged: changed)
    }

    /// Whether another mount changed the file since the kernel was last told (its cached pages are stale),
    /// clearing the mark: the caller has the kernel drop them. False when the file cannot be read.
    func takeChangedElsewhere(_ ino: InodeNumber) -> Bool {
        meta.withLock {
            guard let s = try? state(ino) else { return false }
            defer { s.changedElsewhere = false }
            return s.changedElsewhere
        }
    }

    public func create(parent: InodeNumber, name: [UInt8], mode: UInt32, flags: Int32, caller: Caller) throws(FSError) -> (Attributes, OpenResult) {
        try checkRoom(forName: name)
        return try meta.withLock { () throws(FSError) -> (Attributes, OpenResult) in
            let s = try makeNode(parent: parent, name: name, mode: UInt32(S_IFREG) | (mode & 0o7777), caller: caller)
            // Once the kernel opens without asking (opensWithoutHandles), it sends no RELEASE for
            // created files either (measured on 6.18): no handle to leak; the kernel's lookup holds
            // the file. O_APPEND writes are placed by the kernel.
            return (attributes(s), OpenResult(handle: .none, keepCache: true))
        }
    }

    /// Nothing to do: no handle was handed out. A file's plaintext tail goes at the group commit, the
    /// forget or a sweep of the tails held (`storeHeldTails`); an unlinked file goes with the kernel's forget.
    public func release(_ ino: InodeNumber, handle: HandleID) {}

    /// Durable once it returns: the group transaction, with this file in it, is committed.
    public func fsync(_ ino: InodeNumber, handle: HandleID?, dataOnly: Bool) throws(FSError) {
        guard !options.readOnly else { return }
        do { try commit() } catch {
            heardLoss(ino)
            throw error
        }
        try checkWriteError(ino)
    }

    /// An fsync of `ino` failed: its caller heard that the file's changes may be lost (the unmount need
    /// not say it again, and the next fsync does not report the same loss).
    func heardLoss(_ ino: InodeNumber) {
        meta.withLock {
            inodes[ino]?.writeError = nil
            unheardLosses.remove(ino)
        }
    }

    /// Reports (once) that changes to this file were lost when the store dropped a group; a file that is gone
    /// with such a group (or removed on another machine) fails every fsync: nothing of it can become durable.
    func checkWriteError(_ ino: InodeNumber) throws(FSError) {
        try meta.withLock { () throws(FSError) in
            if let s = inodes[ino], s.goneElsewhere, s.writeError == nil { throw FSError(ESTALE) }
            if let s = inodes[ino], let e = s.writeError {
                s.writeError = nil
                unheardLosses.remove(ino)
                throw e
            }
        }
    }

    // MARK: Reading

    public func read(_ ino: InodeNumber, handle: HandleID, offset: UInt64, size: Int) throws(FSError) -> [UInt8] {
        try read(ino, handle: handle, offset: offset, size: size, wholeChunks: false).bytes
    }

    /// The whole chunks the asked bytes lie in, up to the end of the file, for the kernel's page cache (read-only
    /// mounts, PageCacheFiller): whole chunks are decrypted then, also where a chunk is sealed in blocks. Only the
    /// asked bytes when the range reaches the file's plaintext tail (`TailChunk`, not sealed yet).
    public func readChunks(_ ino: InodeNumber, handle: HandleID, offset: UInt64, size: Int) throws(FSError) -> ChunkRead {
        try read(ino, handle: handle, offset: offset, size: size, wholeChunks: true)
    }

    func read(_ ino: InodeNumber, handle: HandleID, offset: UInt64, size: Int, wholeChunks: Bool) throws(FSError) -> ChunkRead {
        let s = try meta.withLock { () throws(FSError) -> InodeState in
            guard handle == .none else { throw .badHandle }
            return try state(ino)
        }
        return try s.content.withReadLock { () throws(FSError) -> ChunkRead in
            let (content, start, count, fileSize) = try meta.withLock { () throws(FSError) -> (FileContent?, UInt64, Int, UInt64) in
                guard offset < s.record.size, size > 0 else { return (nil, offset, 0, 0) }
                let cs = UInt64(chunkSize)
                var start = offset, end = offset + min(UInt64(size), s.record.size - offset)
                if let tail = s.tail, (end - 1) / cs >= tail.index {
                    try flushTail(s)
                } else if wholeChunks {
                    start = offset / cs * cs
                    end = min(s.record.size, (end - 1) / cs * cs + cs)
                }
                let count = Int(end - start)
                return (try fileContent(s, offset: start, count: count), start, count, s.record.size)
            }
            guard let content else { return ChunkRead(start: offset, bytes: []) }
            do throws(FSError) {
                let bytes = try readRange(content, offset: start, count: count)
                let cs = UInt64(chunkSize)
                readAhead?.didRead(
                    content: content.id, first: start / cs, last: (start + UInt64(count) - 1) / cs, count: (fileSize + cs - 1) / cs)
                return ChunkRead(start: start, bytes: bytes)
            } catch {
                if error == .io { meta.withLock { logDamagedPath(ino) } }
                throw error
            }
        }
    }

    /// What reading a range of a file needs: its content id, key, and the chunk map's tags for the
    /// chunks the range touches. Call under `meta` (and the content lock).
    struct FileContent {
        let ino: InodeNumber
        let id: UInt64
        let cipher: ContentCipher
        let first: UInt64
        let tags: [ChunkTag]

        /// The tag the map names for chunk `index` (a hole outside the range read).
        func tag(_ index: UInt64) -> ChunkTag {
            index >= first && index - first < UInt64(tags.count) ? tags[Int(index - first)] : .hole
        }
    }

    func fileContent(_ s: InodeState, offset: UInt64, count: Int) throws(FSError) -> FileContent {
        let cs = UInt64(chunkSize)
        let first = offset / cs, last = (offset + UInt64(max(count, 1)) - 1) / cs
        let cipher = try s.cipher(store)
        do {
            return FileContent(
                ino: s.ino, id: s.record.contentId, cipher: cipher, first: first,
                tags: try s.chunkMap.tags(first, last, store: store))
        } catch { throw fsError(error, "inode \(s.ino)") }
    }

    /// Bytes [offset, offset+count) of a file's content, every chunk checked against the file's
    /// chunk map: a hole reads as zeros, a stored chunk must be the one the map names (its tag) and
    /// open under the file key. A missing, extra or older chunk is EIO. Chunks are opened straight
    /// from the store's buffer into the reply; of a chunk the range covers in part, only the asked bytes.
    func readRange(_ c: FileContent, offset: UInt64, count: Int) throws(FSError) -> [UInt8] {
        let cs = UInt64(chunkSize)
        let end = offset + UInt64(count)
        let first = offset / cs, last = (end - 1) / cs
        var output = [UInt8](repeating: 0, count: count)
        var seen = 0, previous: UInt64?
        let store = self.store
        // Chunks fetched ahead (ReadAhead) serve the read when they are all the map names; else the store does.
        let held = readAhead.flatMap { Self.heldChunks($0.take(content: c.id, first: first, last: last), c, first, last) }
        do {
            try output.withUnsafeMutableBytes { out in
                func place(_ index: UInt64, _ sealed: UnsafeRawBufferPointer) throws {
                    // The engine answers for first...last only; a row outside (a hostile server's) is not placed.
                    guard index >= first, index <= last else {
                        throw StoreError.authenticationFailed(
                            kind: .contentChunk, entity: "chunk \(index) of content \(c.id) (outside the range read)")
                    }
                    let expected = c.tag(index)
                    guard !expected.isHole, ChunkTag(sealed: sealed) == expected else {
                        throw StoreError.authenticationFailed(
                            kind: .contentChunk,
                            entity: expected.isHole
                                ? "chunk \(index) of content \(c.id) (stored where the file's chunk map has a hole)"
                                : "chunk \(index) of content \(c.id) (not the chunk the file's chunk map names: an older or foreign copy)")
                    }
                    // Chunks come in index order: one listed twice (a copied row under an index that reads back
                    // as the same integer) must not stand in for one that was deleted.
                    if let previous, index <= previous {
                        throw StoreError.authenticationFailed(
                            kind: .contentChunk, entity: "chunk \(index) of content \(c.id) (listed twice or out of order)")
                    }
                    previous = index
                    seen += 1
                    let start = index * cs
                    if start >= offset && start + cs <= end {
                        let dst = UnsafeMutableRawBufferPointer(rebasing: out[Int(start - offset)..<Int(start - offset + cs)])
                        _ = try c.cipher.open(sealed, index: index, into: dst)
                        return
                    }
                    // A chunk the range covers in part: only its asked bytes (sealed in blocks, only their blocks are
                    // decrypted); the output is zeros past the chunk's end. A value that states more than a chunk is
                    // refused before anything is decrypted.
                    guard let n = c.cipher.plaintextLength(sealed), n <= Int(cs) else {
                        throw StoreError.authenticationFailed(kind: .contentChunk, entity: "chunk \(index) of content \(c.id) (longer than a chunk)")
                    }
                    let from = max(offset, start), to = min(end, start + cs)
                    guard from < to else { return }
                    let dst = UnsafeMutableRawBufferPointer(rebasing: out[Int(from - offset)..<Int(to - offset)])
                    _ = try c.cipher.open(sealed, index: index, bytes: Int(from - start)..<Int(to - start), into: dst)
                }
                if let held {
                    for (index, sealed) in held { try sealed.withUnsafeBytes { try place(index, $0) } }
                } else {
                    try store.forEachChunk(file: c.id, first: first, last: last, place)
                }
            }
            let wanted = (first...last).reduce(0) { n, i in c.tag(i).isHole ? n : n + 1 }
            if seen != wanted {
                throw StoreError.authenticationFailed(
                    kind: .contentChunk, entity: "\(wanted - seen) chunk(s) of content \(c.id) (deleted from the container)")
            }
        } catch { throw fsError(error, "inode \(c.ino), content \(c.id)") }
        return output
    }

    /// The chunks of `first...last` from `held`, in order, when it has every one the map names there
    /// with the tag the map names (a chunk changed since it was fetched is not used); nil otherwise.
    static func heldChunks(_ held: [UInt64: [UInt8]], _ c: FileContent, _ first: UInt64, _ last: UInt64) -> [(UInt64, [UInt8])]? {
        guard !held.isEmpty else { return nil }
        var chunks: [(UInt64, [UInt8])] = []
        for index in first...last {
            let expected = c.tag(index)
            if expected.isHole { continue }
            guard let sealed = held[index], sealed.withUnsafeBytes({ ChunkTag(sealed: $0) }) == expected else { return nil }
            chunks.append((index, sealed))
        }
        return chunks
    }

    // MARK: Writing

    public func write(_ ino: InodeNumber, handle: HandleID, offset: UInt64, data: UnsafeRawBufferPointer) throws(FSError) -> Int {
        try write(ino, handle: handle, at: offset, data: data)
    }

    public func append(_ ino: InodeNumber, handle: HandleID, data: UnsafeRawBufferPointer) throws(FSError) -> Int {
        try write(ino, handle: handle, at: nil, data: data)
    }

    /// Writes `data` at `offset`, or at the file's end as this filesystem sees it (nil: an append placed
    /// here, under the file's content lock, so appends here and the other writes to it stay in order).
    private func write(_ ino: InodeNumber, handle: HandleID, at offset: UInt64?, data: UnsafeRawBufferPointer) throws(FSError) -> Int {
        try checkWritable()
        let s = try meta.withLock { () throws(FSError) -> InodeState in
            // Without a handle the kernel has placed O_APPEND writes at the end already.
            guard handle == .none else { throw .badHandle }
            return try state(ino)
        }
        guard s.isRegular else { throw .invalid }
        guard !data.isEmpty else { return 0 }
        try checkRoom(for: data.count, writing: s, at: offset ?? meta.withLock { s.record.size })
        var sweep = false
        try s.content.withWriteLock { () throws(FSError) in
            enum Plan {
                case done
                case loadTail(FileContent, UInt64)
                case seal(FileContent)
            }
            let (start, oldSize, plan) = try meta.withLock { () throws(FSError) -> (UInt64, UInt64, Plan) in
                let start = offset ?? s.record.size
                let (end, overflow) = start.addingReportingOverflow(UInt64(data.count))
                guard !overflow, end <= UInt64(Int64.max) else { throw .fileTooBig }
                if refusesGap(s, at: start) { throw .noSpace }
                // A map lists at most `ChunkMapRoot.maxPages` pages: one that needed more would leave an inode
                // that no read accepts (a file of 32 TiB at 32 KiB chunks, 4 TiB at 4 KiB, or one that sparse).
                guard s.chunkMap.fits(start / UInt64(chunkSize), (end - 1) / UInt64(chunkSize), tail: s.tail?.index) else {
                    throw .fileTooBig
                }
                let index = fitsTail(start: start, end: end, newSize: max(s.record.size, end))
                if let index, s.tail?.index == index {
                    s.tail?.merge(data, at: Int(start - index * UInt64(chunkSize)))
                    heldTailBytes += data.count
                    sweep = heldTailsDue()
                    recordWrite(s, end: end, addedChunks: 0)
                    return (start, s.record.size, .done)
                }
                try flushTail(s)
                let content = try fileContent(s, offset: start, count: data.count)
                if let index { return (start, s.record.size, .loadTail(content, index)) }
                return (start, s.record.size, .seal(content))
            }
            switch plan {
            case .done:
                break
            case .loadTail(let content, let index):
                // Start buffering this chunk: what it holds now, then the new bytes.
                let chunkStart = index * UInt64(chunkSize)
                let isNew = content.tags[0].isHole
                var tail = TailChunk(index: index, bytes: [])
                if !isNew && chunkStart < oldSize {
                    tail.bytes = try readRange(content, offset: chunkStart, count: Int(min(UInt64(chunkSize), oldSize - chunkStart)))
                }
                tail.merge(data, at: Int(start - chunkStart))
                meta.withLock {
                    s.tail = tail
                    heldTails.append(s)
                    heldTailBytes += tail.bytes.count
                    sweep = heldTailsDue()
                    recordWrite(s, end: start + UInt64(data.count), addedChunks: isNew ? 1 : 0)
                }
            case .seal(let content):
                let sealed = try sealRange(content, oldSize: oldSize, offset: start, data: data)
                // Rows, map and size change together under `meta`, so no group commit sees one without
                // the others (a crash then leaves a file whose map names exactly its stored chunks).
                try meta.withLock { () throws(FSError) in
                    let added = try storeChunks(s, sealed)
                    recordWrite(s, end: start + UInt64(data.count), addedChunks: added)
                }
            }
        }
        if sweep { try storeHeldTails() }
        try commitIfDue()
        return data.count
    }

    /// The one way sealed chunks reach the store: their rows, then their tags into the file's chunk
    /// map. Returns how many of the positions were holes (the stored chunk count grows by that).
    /// Call under `meta`: rows, map and size change together, so no group commit sees one without
    /// the others (a crash then leaves a file whose map names exactly its stored chunks).
    func storeChunks(_ s: InodeState, _ sealed: [(index: UInt64, sealed: [UInt8])]) throws(FSError) -> UInt64 {
        var added: UInt64 = 0
        do {
            try store.putChunks(file: s.record.contentId, sealed)
            for c in sealed {
                guard let tag = ChunkTag(sealed: c.sealed) else { throw FSError.io }
                if try s.chunkMap.set(c.index, tag, store: store).isHole { added += 1 }
            }
        } catch {
            // Some rows may be stored (over older ones) without the map naming them: the group goes, as when
            // the engine drops it on a full disk (its files' fsyncs report it). A commit of it left rows past
            // the end of the file, which read as damage once the file grew over them.
            let e = fsError(error, "inode \(s.ino)")
            store.dropOpenGroup(error as? StoreError ?? (e == .noSpace ? .diskFull : .database("a write failed half way: \(error)")))
            throw e
        }
        return added
    }

    /// What a write changes in the record: size, times, stored chunk count. Set-id bits are the kernel's call
    /// (`clearSetID`): a root writer keeps them, as on local filesystems. Call under `meta`.
    func recordWrite(_ s: InodeState, end: UInt64, addedChunks: UInt64) {
        let now = StoredTime.now()
        s.record.chunkCount += addedChunks
        s.record.size = max(s.record.size, end)
        if stampsTimes(s) {
            s.record.mtime = now
            s.record.ctime = now
        }
        s.dirty = true
    }

    /// Seals the chunks that [offset, offset+data.count) touches, merging partial chunks with what
    /// they held (read and checked through the map). Call with the content lock held for writing.
    func sealRange(_ c: FileContent, oldSize: UInt64, offset: UInt64, data: UnsafeRawBufferPointer) throws(FSError) -> [(
        index: UInt64, sealed: [UInt8]
    )] {
        let cs = UInt64(chunkSize)
        let end = offset + UInt64(data.count)
        let first = offset / cs, last = (end - 1) / cs
        // Only the first and last chunk can be partial; read those that hold data.
        var existing: [UInt64: [UInt8]] = [:]
        for index in Set([first, last]) {
            let start = index * cs
            let covered = offset <= start && end >= start + cs
            if covered || start >= oldSize || c.tags[Int(index - c.first)].isHole { continue }
            existing[index] = try readRange(c, offset: start, count: Int(min(cs, oldSize - start)))
        }
        var sealed: [(index: UInt64, sealed: [UInt8])] = []
        sealed.reserveCapacity(Int(last - first + 1))
        for index in first...last {
            let start = index * cs
            let from = max(offset, start), to = min(end, start + cs)
            let srcOffset = Int(from - offset)
            do {
                if from == start && to == start + cs {
                    let slice = UnsafeRawBufferPointer(rebasing: data[srcOffset..<srcOffset + Int(cs)])
                    sealed.append((index, try c.cipher.seal(slice, index: index)))
                } else {
                    var plain = existing[index] ?? []
                    let needed = Int(to - start)
                    if plain.count < needed { plain.append(contentsOf: repeatElement(0, count: needed - plain.count)) }
                    plain.withUnsafeMutableBytes { p in
                        let dst = UnsafeMutableRawBufferPointer(rebasing: p[Int(from - start)..<Int(to - start)])
                        dst.copyMemory(from: UnsafeRawBufferPointer(rebasing: data[srcOffset..<srcOffset + Int(to - from)]))
                    }
                    sealed.append((index, try c.cipher.seal(plain, index: index)))
                }
            } catch { throw fsError(error) }
        }
        return sealed
    }

    /// Sets the size: shrinking drops whole chunks past the end and trims the last one, so bytes
    /// past the new end read as zeros if the file grows again.
    func truncate(_ s: InodeState, to newSize: UInt64) throws(FSError) {
        try checkWritable()
        guard s.isRegular else { throw s.isDirectory ? .isDirectory : .invalid }
        guard newSize <= UInt64(Int64.max) else { throw .fileTooBig }
        try s.content.withWriteLock { () throws(FSError) in
            try meta.withLock { () throws(FSError) in
                try flushTail(s)
                let old = s.record.size
                let now = StoredTime.now()
                if newSize < old {
                    let cs = UInt64(chunkSize)
                    let keep = (newSize + cs - 1) / cs
                    let tail = newSize % cs
                    let index = newSize / cs
                    do {
                        let removed = try store.deleteChunks(file: s.record.contentId, from: keep)
                        s.record.chunkCount -= min(s.record.chunkCount, UInt64(removed))
                        try s.chunkMap.truncate(keep: keep, store: store)
                    } catch { throw fsError(error, "inode \(s.ino)") }
                    // Trim the last chunk if it is stored (a hole stays a hole).
                    if tail != 0 {
                        let c = try fileContent(s, offset: index * cs, count: Int(tail))
                        if !c.tags[0].isHole {
                            let bytes = try readRange(c, offset: index * cs, count: Int(tail))
                            let sealed: [UInt8]
                            do { sealed = try c.cipher.seal(bytes, index: index) } catch { throw fsError(error, "inode \(s.ino)") }
                            _ = try storeChunks(s, [(index, sealed)])
                        }
                    }
                }
                s.record.size = newSize
                if stampsTimes(s) {
                    if newSize != old { s.record.mtime = now }
                    s.record.ctime = now
                }
                s.dirty = true
            }
        }
    }
}
