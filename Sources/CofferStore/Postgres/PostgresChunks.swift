/// Content chunks. Ranges are read a page of `chunkPage` rows per round trip, so a long range
/// (fsck walks whole files) never holds more than a page of sealed chunks in memory; a file with
/// uncommitted changes is read through the writer, every other file through the reader pool,
/// concurrently and retried on a reconnected connection if the server went away.
extension PostgresBackend {
    /// 64 rows: 2 MiB of 32 KiB chunks, more than a FUSE read (1 MiB) asks for in one go.
    static let chunkPage = 64

    public func forEachChunk(file: UInt64, first: UInt64, last: UInt64, _ body: (UInt64, UnsafeRawBufferPointer) throws -> Void) throws {
        let dirty = readOnly ? false : pending.withLock { $0.dirtyFiles.contains(file) }
        try forEachChunk(file: file, first: first, last: last, throughGroup: dirty, body)
    }

    /// Through the writer (in the open group) or, for committed rows, through the reader pool.
    private func forEachChunk(
        file: UInt64, first: UInt64, last: UInt64, throughGroup: Bool, _ body: (UInt64, UnsafeRawBufferPointer) throws -> Void
    ) throws {
        let pool = throughGroup ? nil : try readerPool()
        try forEachChunkPage(file: file, first: Int64(bitPattern: first), last: Int64(bitPattern: last), body) { params throws(StoreError) in
            guard let pool else { return try read { try $0.execute(sql.chunkRange, params, prepared: true) } }
            do {
                return try pool.withConnection(retryOnConnectionLoss: true) { try $0.execute(sql.chunkRange, params, prepared: true) }
            } catch { throw StoreError.postgres(error) }
        }
    }

    public func committedChunks(file: UInt64, first: UInt64, last: UInt64) throws(StoreError) -> [(index: UInt64, sealed: [UInt8])]? {
        if !readOnly, pending.withLock({ $0.dirtyFiles.contains(file) }) { return nil }
        var chunks: [(index: UInt64, sealed: [UInt8])] = []
        do {
            // Never through the writer, even if the file changes meanwhile (what comes is then a miss):
            // a reader waiting for this fetch may hold what a thread holding the writer waits for.
            try forEachChunk(file: file, first: first, last: last, throughGroup: false) { index, sealed in chunks.append((index, Array(sealed))) }
        } catch let e as StoreError { throw e } catch { throw .database("\(error)") }
        return chunks
    }

    public func forEachChunkRow(file: UInt64, _ body: (UInt64, UnsafeRawBufferPointer) throws -> Void) throws {
        try forEachChunkPage(file: file, first: Int64.min, last: Int64.max, body) { params throws(StoreError) in
            try read { try $0.execute(sql.chunkRange, params, prepared: true) }
        }
    }

    /// Pages through rows `first...last` (signed, as stored) with `fetch`; `body` runs outside any
    /// connection, and its errors come back unchanged.
    private func forEachChunkPage(
        file: UInt64, first: Int64, last: Int64, _ body: (UInt64, UnsafeRawBufferPointer) throws -> Void,
        fetch: ([PGValue]) throws(StoreError) -> PGResult
    ) throws {
        guard first <= last else { return }
        var from = first
        while true {
            let r = try fetch([Self.id(file), .int8(from), .int8(last), .int8(Int64(Self.chunkPage))])
            var lastSeen = from
            for i in 0..<r.rowCount {
                let index: Int64
                do { index = try r.int64(i, 0) ?? 0 } catch { throw StoreError.postgres(error) }
                lastSeen = index
                do {
                    // NULL (a hostile server) reads as an empty value, which fails authentication.
                    let present: Bool? = try r.withBytes(i, 1) { bytes -> Bool in
                        try body(UInt64(bitPattern: index), bytes)
                        return true
                    }
                    if present == nil { try body(UInt64(bitPattern: index), UnsafeRawBufferPointer(start: nil, count: 0)) }
                } catch let e as PGError { throw StoreError.postgres(e) }
            }
            guard r.rowCount == Self.chunkPage, lastSeen < last, lastSeen >= from else { return }
            from = lastSeen + 1
        }
    }

    /// Queued chunk values are held in memory until the next round trip: at most this many bytes.
    static let queuedChunkLimit = 1 << 20

    /// Several chunks of one file in one round trip (a pipeline of prepared upserts). A small write
    /// (a small file's one chunk, a log line) is queued and goes with the next round trip, as record
    /// puts do; a streaming one is sent at once, so queued chunks never hold more than `queuedChunkLimit`,
    /// and its answers are read by the next statement (`PGConnection.send`): the server stores these
    /// chunks while the next ones are written and sealed. A failure drops the group there, as a queued
    /// write's does (fsync then reports EIO).
    public func putChunks(file: UInt64, _ chunks: [(index: UInt64, sealed: [UInt8])]) throws(StoreError) {
        guard !chunks.isEmpty else { return }
        let total = chunks.reduce(0) { $0 + $1.sealed.count }
        if chunks.count <= 2, pending.withLock({ $0.queuedBytes + total <= Self.queuedChunkLimit }) {
            for chunk in chunks {
                try later(sql.putChunk, [Self.id(file), Self.id(chunk.index), .bytea(chunk.sealed)], bytes: chunk.sealed.count, file: file)
            }
            return
        }
        try write(bytes: total, file: file) { c in
            try c.send(chunks.map { PGStatement(sql.putChunk, [Self.id(file), Self.id($0.index), .bytea($0.sealed)], prepared: true) })
        }
    }

    public func deleteChunks(file: UInt64, from: UInt64) throws(StoreError) -> Int {
        try change(sql.deleteChunksFrom, [Self.id(file), Self.id(from)], file: file)
    }

    public func deleteChunks(file: UInt64, first: UInt64, last: UInt64) throws(StoreError) -> Int {
        try change(sql.deleteChunkRange, [Self.id(file), Self.id(first), Self.id(last)], file: file)
    }

    public func chunkIndices(file: UInt64, first: UInt64, last: UInt64) throws(StoreError) -> [UInt64] {
        try ids(sql.chunkIndices, [Self.id(file), Self.id(first), Self.id(last)])
    }

    public func deleteChunkRow(file: UInt64, index: UInt64) throws(StoreError) {
        try change(sql.deleteChunk, [Self.id(file), Self.id(index)], file: file)
    }
    public func deleteAllChunkRows(file: UInt64) throws(StoreError) { try change(sql.deleteAllChunks, [Self.id(file)], file: file) }
    public func deleteAllChunkMapRows(file: UInt64) throws(StoreError) { try change(sql.deleteAllChunkMaps, [Self.id(file)]) }

    // MARK: Whole-store scans

    public func counts() throws(StoreError) -> StoreCounts {
        try read { c in
            let r = try c.execute(sql.counts, prepared: true)
            var n = StoreCounts()
            n.inodes = try r.count(0, 0)
            n.entries = try r.count(0, 1)
            n.chunks = try r.count(0, 2)
            n.xattrs = try r.count(0, 3)
            n.chunkMapPages = try r.count(0, 4)
            return n
        }
    }

    public func allInodeRows() throws(StoreError) -> [InodeRow] {
        try rows(sql.allInodes) { r, i in InodeRow(id: try Self.u64(r, i, 0), sealed: try r.bytes(i, 1) ?? []) }
    }

    public func allEntryRows() throws(StoreError) -> [EntryRow] {
        try rows(sql.allEntries) { r, i in EntryRow(parentTag: try r.bytes(i, 0) ?? [], tag: try r.bytes(i, 1) ?? [], sealed: try r.bytes(i, 2) ?? [])
        }
    }

    public func allXattrRows() throws(StoreError) -> [XattrRow] {
        try rows(sql.allXattrs) { r, i in XattrRow(inode: try Self.u64(r, i, 0), tag: try r.bytes(i, 1) ?? [], sealed: try r.bytes(i, 2) ?? []) }
    }

    public func allChunkMapRows() throws(StoreError) -> [ChunkMapRow] {
        try rows(sql.allChunkMaps) { r, i in ChunkMapRow(file: try Self.u64(r, i, 0), page: try Self.u64(r, i, 1), sealed: try r.bytes(i, 2) ?? []) }
    }

    public func chunkFileSummaries() throws(StoreError) -> [ChunkFileSummary] {
        try rows(sql.chunkSummaries) { r, i in
            ChunkFileSummary(file: try Self.u64(r, i, 0), rows: try r.count(i, 1), maxIndex: try r.int64(i, 2) ?? 0)
        }
    }

    private func rows<T>(_ statement: String, _ row: (PGResult, Int) throws -> T) throws(StoreError) -> [T] {
        try read { c in
            let r = try c.execute(statement, prepared: true)
            return try (0..<r.rowCount).map { try row(r, $0) }
        }
    }

    private static func u64(_ r: PGResult, _ row: Int, _ column: Int) throws -> UInt64 { UInt64(bitPattern: try r.int64(row, column) ?? 0) }
}
