import Foundation
import GRDB
import GRDBSQLite

/// The rows of each entity kind in SQLite's tables (docs/FORMAT.md): random ids and keyed tags as
/// keys, sealed bytes as values. Lookups use cached statements on the writer (they must see the
/// open group transaction); content goes through the C API (ChunkReaders.swift).
extension SQLiteBackend {
    // MARK: Inodes

    public func inode(_ id: UInt64) throws(StoreError) -> [UInt8]? {
        try writer { db in
            try Data.fetchOne(db.cachedStatement(sql: "SELECT value FROM inodes WHERE id = ?"), arguments: [Int64(bitPattern: id)]).map {
                [UInt8]($0)
            }
        }
    }

    public func inodes(_ ids: [UInt64]) throws(StoreError) -> [UInt64: [UInt8]] {
        try writer { db in
            let statement = try db.cachedStatement(sql: "SELECT value FROM inodes WHERE id = ?")
            var out: [UInt64: [UInt8]] = [:]
            for id in ids {
                if let value = try Data.fetchOne(statement, arguments: [Int64(bitPattern: id)]) { out[id] = [UInt8](value) }
            }
            return out
        }
    }

    public func putInode(_ id: UInt64, sealed: [UInt8]) throws(StoreError) {
        try write(bytes: sealed.count) { db in
            try db.cachedStatement(sql: "INSERT OR REPLACE INTO inodes(id, value) VALUES (?, ?)").execute(arguments: [
                Int64(bitPattern: id), Data(sealed)
            ])
        }
    }

    public func deleteInode(_ id: UInt64) throws(StoreError) {
        try write { db in try db.cachedStatement(sql: "DELETE FROM inodes WHERE id = ?").execute(arguments: [Int64(bitPattern: id)]) }
    }

    // MARK: Directory entries

    public func entry(parentTag: [UInt8], tag: [UInt8]) throws(StoreError) -> [UInt8]? {
        try writer { db in
            try Data.fetchOne(
                db.cachedStatement(sql: "SELECT value FROM dirents WHERE parent = ? AND tag = ?"),
                arguments: [Data(parentTag), Data(tag)]
            ).map { [UInt8]($0) }
        }
    }

    public func putEntry(parentTag: [UInt8], tag: [UInt8], sealed: [UInt8], replace: Bool) throws(StoreError) -> Bool {
        try write(bytes: sealed.count) { db in
            let sql =
                replace
                ? "INSERT OR REPLACE INTO dirents(parent, tag, value) VALUES (?, ?, ?)"
                : "INSERT OR IGNORE INTO dirents(parent, tag, value) VALUES (?, ?, ?)"
            try db.cachedStatement(sql: sql).execute(arguments: [Data(parentTag), Data(tag), Data(sealed)])
            return db.changesCount == 1
        }
    }

    public func deleteEntry(parentTag: [UInt8], tag: [UInt8]) throws(StoreError) {
        try write { db in
            try db.cachedStatement(sql: "DELETE FROM dirents WHERE parent = ? AND tag = ?").execute(arguments: [Data(parentTag), Data(tag)])
        }
    }

    public func entryPage(parentTag: [UInt8], from: [UInt8], limit: Int) throws(StoreError) -> [(tag: [UInt8], sealed: [UInt8])] {
        let rows = try writer { db in
            try Row.fetchAll(
                db.cachedStatement(sql: "SELECT tag, value FROM dirents WHERE parent = ? AND tag >= ? ORDER BY tag LIMIT ?"),
                arguments: [Data(parentTag), Data(from), limit])
        }
        return rows.map(Self.tagAndValue)
    }

    /// A row's tag and sealed value; a value that is no blob (a hostile store) comes back empty, so it
    /// fails authentication and is reported instead of hiding the row.
    static func tagAndValue(_ row: Row) -> (tag: [UInt8], sealed: [UInt8]) {
        // `decode` throws where the subscript would trap on a value that is not a blob or text.
        func bytes(_ i: Int) -> [UInt8] { ((try? row.decode(Data?.self, atIndex: i)) ?? nil).map { [UInt8]($0) } ?? [] }
        return (bytes(0), bytes(1))
    }

    public func hasEntries(parentTag: [UInt8]) throws(StoreError) -> Bool {
        try writer { db in
            try Bool.fetchOne(db.cachedStatement(sql: "SELECT 1 FROM dirents WHERE parent = ? LIMIT 1"), arguments: [Data(parentTag)]) ?? false
        }
    }

    // MARK: Content chunks

    /// Committed content goes through a reader pool, concurrently: small files and the start of
    /// large ones through mapped connections, reads further into a large file (streaming, random
    /// access) through preads. A file with uncommitted changes goes through the writer. A read of one
    /// chunk copies it from its segment file rather than reading it through the segment's mapping:
    /// for random 4 KiB reads the page faults (and the periodic drop of the mapped pages) cost more
    /// than the copy (docs/MEASUREMENTS.md, session 22); a read of several (streaming) keeps the mapping.
    public func forEachChunk(file: UInt64, first: UInt64, last: UInt64, _ body: (UInt64, UnsafeRawBufferPointer) throws -> Void) throws {
        let dirty = readOnly ? false : pending.withLock { $0.dirtyFiles.contains(file) }
        if dirty {
            try writer { db in
                let stmt = try db.cachedStatement(sql: ChunkReaders.rangeQuery(chunkColumns)).sqliteStatement
                RawSQLite.bindRange(stmt, file: file, first: first, last: last)
                try RawSQLite.forEachRow(stmt, segments: segments, body)
            }
        } else {
            do {
                try (first < Self.mappedChunks ? mappedReaders : preadReaders).with { c in
                    RawSQLite.bindRange(c.select, file: file, first: first, last: last)
                    try RawSQLite.forEachRow(
                        c.select, segments: segments, mapping: last > first, heldInRow: { c.bytesSinceMap += $0 }, body)
                }
            } catch let e as StoreError { throw e } catch let e as DatabaseError { throw StoreError.sqlite(e) }
        }
    }

    /// Writes several chunks of one file in one writer visit, binding the sealed bytes in place. Large
    /// chunks are appended to a segment file and their rows say where (SegmentRows.swift).
    public func putChunks(file: UInt64, _ chunks: [(index: UInt64, sealed: [UInt8])]) throws(StoreError) {
        let toSegments = hasSegments ? chunks.reduce(0) { $0 + ($1.sealed.count >= segmentThreshold ? $1.sealed.count : 0) } : 0
        let total = chunks.reduce(0) { $0 + $1.sealed.count }
        try write(bytes: total - toSegments, outsideWAL: toSegments, file: file) { db in
            let stmt = try db.cachedStatement(sql: "INSERT OR REPLACE INTO chunks(file, idx, value, seg, off, len) VALUES (?, ?, ?, ?, ?, ?)")
                .sqliteStatement
            for c in chunks {
                sqlite3_reset(stmt)
                sqlite3_bind_int64(stmt, 1, Int64(bitPattern: file))
                sqlite3_bind_int64(stmt, 2, Int64(bitPattern: c.index))
                let rc: Int32
                if hasSegments, c.sealed.count >= segmentThreshold {
                    let (segment, offset) = try c.sealed.withUnsafeBytes { try appendToSegment(db, $0) }
                    sqlite3_bind_zeroblob(stmt, 3, 0)
                    sqlite3_bind_int64(stmt, 4, segment)
                    sqlite3_bind_int64(stmt, 5, offset)
                    rc = sqlite3_bind_int64(stmt, 6, Int64(c.sealed.count))
                } else {
                    for column: Int32 in 4...6 { sqlite3_bind_null(stmt, column) }
                    rc = c.sealed.withUnsafeBytes { sqlite3_bind_blob(stmt, 3, $0.baseAddress, Int32($0.count), nil) }
                }
                guard rc == SQLITE_OK else { throw StoreError.sqlite(code: rc, stmt) }
                let step = sqlite3_step(stmt)
                // Reset before unbinding (binding a statement that is still running is a misuse): the
                // sealed buffer was bound without a copy and is gone after this iteration.
                sqlite3_reset(stmt)
                sqlite3_bind_null(stmt, 3)
                guard step == SQLITE_DONE else { throw StoreError.sqlite(code: step, stmt) }
            }
        }
    }

    /// Rows one statement deletes at most. A statement keeps a journal (in memory: `temp_store`) of every
    /// page it changes: deleting a 16 GiB file's 524,288 rows in one statement took the daemon 34 MiB
    /// more memory than in pieces of this many.
    static let deletePiece = 8192

    public func deleteChunks(file: UInt64, from: UInt64) throws(StoreError) -> Int {
        try deleteChunks(file: file, first: from, last: UInt64(Int64.max))
    }

    /// Chunks `first...last` of `file` (as stored: signed), deleted `deletePiece` rows at a time in index order.
    public func deleteChunks(file: UInt64, first: UInt64, last: UInt64) throws(StoreError) -> Int {
        try write(file: file) { db in
            let piece = try db.cachedStatement(
                sql: """
                    DELETE FROM chunks WHERE rowid IN
                    (SELECT rowid FROM chunks WHERE file = ? AND idx BETWEEN ? AND ? ORDER BY idx LIMIT \(Self.deletePiece))
                    """)
            var deleted = 0
            repeat {
                do { try piece.execute(arguments: [Int64(bitPattern: file), Int64(bitPattern: first), Int64(bitPattern: last)]) } catch {
                    // The pieces before it stay deleted in the open group, but the caller keeps its chunk
                    // map: the group would commit a map naming rows that are gone. Drop the group instead,
                    // as SQLite does on a full disk (the caller hears it through `onRollback`).
                    if deleted > 0, db.isInsideTransaction { try? db.execute(sql: "ROLLBACK") }
                    throw error
                }
                deleted += db.changesCount
            } while db.changesCount == Self.deletePiece
            return deleted
        }
    }

    public func chunkIndices(file: UInt64, first: UInt64, last: UInt64) throws(StoreError) -> [UInt64] {
        try writer { db in
            try Int64.fetchAll(
                db.cachedStatement(sql: "SELECT idx FROM chunks WHERE file = ? AND idx BETWEEN ? AND ? ORDER BY idx"),
                arguments: [Int64(bitPattern: file), Int64(bitPattern: first), Int64(bitPattern: last)]
            )
            .map { UInt64(bitPattern: $0) }
        }
    }

    // MARK: Chunk map pages

    public func chunkMapPage(file: UInt64, page: UInt64) throws(StoreError) -> [UInt8]? {
        try writer { db in
            try Data.fetchOne(
                db.cachedStatement(sql: "SELECT value FROM chunkmaps WHERE file = ? AND page = ?"),
                arguments: [Int64(bitPattern: file), Int64(bitPattern: page)]
            ).map { [UInt8]($0) }
        }
    }

    public func putChunkMapPage(file: UInt64, page: UInt64, sealed: [UInt8]) throws(StoreError) {
        try write(bytes: sealed.count) { db in
            try db.cachedStatement(sql: "INSERT OR REPLACE INTO chunkmaps(file, page, value) VALUES (?, ?, ?)")
                .execute(arguments: [Int64(bitPattern: file), Int64(bitPattern: page), Data(sealed)])
        }
    }

    public func deleteChunkMapPages(file: UInt64, from: UInt64) throws(StoreError) {
        try write { db in
            try db.cachedStatement(sql: "DELETE FROM chunkmaps WHERE file = ? AND page >= ?")
                .execute(arguments: [Int64(bitPattern: file), Int64(bitPattern: from)])
        }
    }

    public func deleteChunkMapPage(file: UInt64, page: UInt64) throws(StoreError) {
        try write { db in
            try db.cachedStatement(sql: "DELETE FROM chunkmaps WHERE file = ? AND page = ?")
                .execute(arguments: [Int64(bitPattern: file), Int64(bitPattern: page)])
        }
    }

    // MARK: Extended attributes

    public func xattr(inode: UInt64, tag: [UInt8]) throws(StoreError) -> [UInt8]? {
        try writer { db in
            try Data.fetchOne(
                db.cachedStatement(sql: "SELECT value FROM xattrs WHERE inode = ? AND tag = ?"),
                arguments: [Int64(bitPattern: inode), Data(tag)]
            ).map { [UInt8]($0) }
        }
    }

    public func xattrs(inode: UInt64) throws(StoreError) -> [(tag: [UInt8], sealed: [UInt8])] {
        let rows = try writer { db in
            try Row.fetchAll(db.cachedStatement(sql: "SELECT tag, value FROM xattrs WHERE inode = ?"), arguments: [Int64(bitPattern: inode)])
        }
        return rows.map(Self.tagAndValue)
    }

    public func putXattr(inode: UInt64, tag: [UInt8], sealed: [UInt8]) throws(StoreError) {
        try write(bytes: sealed.count) { db in
            try db.cachedStatement(sql: "INSERT OR REPLACE INTO xattrs(inode, tag, value) VALUES (?, ?, ?)")
                .execute(arguments: [Int64(bitPattern: inode), Data(tag), Data(sealed)])
        }
    }

    public func deleteXattr(inode: UInt64, tag: [UInt8]) throws(StoreError) -> Bool {
        try write { db in
            try db.cachedStatement(sql: "DELETE FROM xattrs WHERE inode = ? AND tag = ?").execute(arguments: [Int64(bitPattern: inode), Data(tag)])
            return db.changesCount > 0
        }
    }

    public func deleteXattrs(inode: UInt64) throws(StoreError) {
        try write { db in try db.cachedStatement(sql: "DELETE FROM xattrs WHERE inode = ?").execute(arguments: [Int64(bitPattern: inode)]) }
    }

    // MARK: Orphans

    public func addOrphan(_ id: UInt64) throws(StoreError) {
        try write { db in try db.execute(sql: "INSERT OR IGNORE INTO orphans(id) VALUES (?)", arguments: [Int64(bitPattern: id)]) }
    }

    public func removeOrphan(_ id: UInt64) throws(StoreError) {
        try write { db in try db.execute(sql: "DELETE FROM orphans WHERE id = ?", arguments: [Int64(bitPattern: id)]) }
    }

    public func orphans() throws(StoreError) -> [UInt64] {
        try writer { db in try Int64.fetchAll(db, sql: "SELECT id FROM orphans").map { UInt64(bitPattern: $0) } }
    }

    // MARK: Counts

    public func counts() throws(StoreError) -> StoreCounts {
        try writer { db in try Self.counts(db) }
    }

    /// The counts of the last commit only, in one read transaction on a reader: never the writer's open
    /// group, and the writer is not held meanwhile.
    public func committedCounts() throws(StoreError) -> StoreCounts {
        do { return try pool.read { db in try Self.counts(db) } } catch { throw StoreError.sqlite(error) }
    }

    private static func counts(_ db: Database) throws -> StoreCounts {
        var c = StoreCounts()
        c.inodes = try Int.fetchOne(db, sql: "SELECT count(*) FROM inodes") ?? 0
        c.entries = try Int.fetchOne(db, sql: "SELECT count(*) FROM dirents") ?? 0
        c.chunks = try Int.fetchOne(db, sql: "SELECT count(*) FROM chunks") ?? 0
        c.xattrs = try Int.fetchOne(db, sql: "SELECT count(*) FROM xattrs") ?? 0
        c.chunkMapPages = try Int.fetchOne(db, sql: "SELECT count(*) FROM chunkmaps") ?? 0
        return c
    }
}
