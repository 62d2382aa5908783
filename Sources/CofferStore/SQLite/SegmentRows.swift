import Foundation
import GRDB
import GRDBSQLite
import Glibc
import Synchronization

/// How the rows of `chunks` point into segment files (Segments.swift, docs/FORMAT.md "Segments").
///
/// A row whose `seg` is set holds no bytes (`value` is empty): its sealed chunk is the `len` bytes at
/// `off` of segment file `seg`. Table `segments` lists the segment files with how many of their bytes
/// committed rows still name (`live`). The writer keeps that count with temporary triggers of its own
/// connection (never stored in the file), which also list every range a delete or a replace freed;
/// after the commit that freed them is on disk, those ranges are punched out of their files, and a
/// segment no row names any more is removed.
extension SQLiteBackend {
    /// Tables of a store that keeps content in segments (new stores have the columns from the start).
    static let segmentTables = """
        CREATE TABLE IF NOT EXISTS segments(id INTEGER PRIMARY KEY, size INTEGER NOT NULL, live INTEGER NOT NULL);
        CREATE INDEX IF NOT EXISTS chunks_by_segment ON chunks(seg, off, len) WHERE seg IS NOT NULL;
        """

    /// The writer's own bookkeeping: live byte counts and the ranges freed by the open transaction. A
    /// freed chunk that starts where the last freed range ends extends it (a removed file's chunks mostly
    /// lie end to end): deleting a 16 GiB file listed 524,288 ranges, each read back as a row, and the
    /// daemon grew from 48 to 174 MiB (with the statement journal: `deletePiece`). Only a chunk a read
    /// would accept is listed (a damaged row's length must not punch out its neighbours), so a range is
    /// never longer than its segment.
    /// `recursive_triggers` makes INSERT OR REPLACE fire the delete trigger for the row it replaces. No
    /// statement on the writer moves a row between segments (only inserts and deletes), so there is no
    /// UPDATE trigger; a compaction that moves chunks would add one.
    static let segmentTriggers = """
        PRAGMA recursive_triggers = ON;
        CREATE TEMP TABLE IF NOT EXISTS freed_chunks(seg INTEGER, off INTEGER, len INTEGER);
        CREATE TEMP TRIGGER IF NOT EXISTS chunk_added AFTER INSERT ON main.chunks WHEN new.seg IS NOT NULL
        BEGIN UPDATE segments SET live = live + \(validLength("new.len")) WHERE id = new.seg; END;
        CREATE TEMP TRIGGER IF NOT EXISTS chunk_removed AFTER DELETE ON main.chunks WHEN old.seg IS NOT NULL
        BEGIN
            UPDATE segments SET live = live - \(validLength("old.len")) WHERE id = old.seg;
            INSERT INTO freed_chunks(seg, off, len) SELECT old.seg, old.off, old.len
                WHERE \(accepted("old")) AND NOT EXISTS (
                SELECT 1 FROM freed_chunks WHERE rowid = (SELECT max(rowid) FROM freed_chunks) AND seg = old.seg AND off + len = old.off);
            UPDATE freed_chunks SET len = len + old.len
                WHERE \(accepted("old")) AND rowid = (SELECT max(rowid) FROM freed_chunks) AND seg = old.seg AND off + len = old.off;
        END;
        """

    /// A row's length as live counts take it: only a length a read accepts (the column is not sealed; a
    /// damaged one, NULL or near 2^63, must neither overflow a count nor break the constraint on it).
    static func validLength(_ column: String) -> String {
        "(CASE WHEN \(column) BETWEEN 1 AND \(Segments.maximumLength) THEN \(column) ELSE 0 END)"
    }

    /// Whether `row`'s segment columns name bytes a read would accept (offset ≥ 0, length 1 B to 4 MiB).
    static func accepted(_ row: String) -> String { "\(row).off >= 0 AND \(row).len BETWEEN 1 AND \(Segments.maximumLength)" }

    /// Whether the store's `chunks` table has the segment columns (stores made before 2026-11-27 get
    /// them when first opened for writing).
    static func hasSegmentColumns(_ db: Database) throws -> Bool {
        try Bool.fetchOne(db, sql: "SELECT count(*) > 0 FROM pragma_table_info('chunks') WHERE name = 'seg'") ?? false
    }

    /// The columns a chunk read selects: index, value, and where the value lies when not in the row.
    var chunkColumns: String { hasSegments ? "idx, value, seg, off, len" : "idx, value, NULL, NULL, NULL" }

    /// On the writer, before any write: the columns and tables (older stores), the triggers, and what
    /// a crash left: live counts recounted from the rows, and, once that state is on disk, segments no
    /// row names removed (never the last one: ids are not reused). Files no row lists are left alone:
    /// they may be the newer segments of a store that was replaced by an older copy (which the rollback
    /// check refuses after this); new segments are numbered above them.
    func setUpSegments() throws {
        var st = stat()
        if lstat(segments.directory, &st) == 0, (st.st_mode & S_IFMT) != S_IFDIR {
            throw StoreError.notAStore("\(segments.directory) is not a directory")
        }
        let dead = try pool.writeWithoutTransaction { db -> [Int64] in
            if !(try Self.hasSegmentColumns(db)) {
                try db.inTransaction {
                    try db.execute(sql: "ALTER TABLE chunks ADD COLUMN seg INTEGER")
                    try db.execute(sql: "ALTER TABLE chunks ADD COLUMN off INTEGER")
                    try db.execute(sql: "ALTER TABLE chunks ADD COLUMN len INTEGER")
                    return .commit
                }
            }
            try db.execute(sql: Self.segmentTables)
            try db.execute(sql: Self.segmentTriggers)
            var dead: [Int64] = []
            try db.inTransaction {
                try db.execute(
                    sql: "UPDATE segments SET live = coalesce((SELECT sum(\(Self.validLength("len"))) FROM chunks WHERE seg = segments.id), 0)")
                dead = try Int64.fetchAll(db, sql: Self.deadSegments, arguments: [Self.noSegment])
                if !dead.isEmpty { try db.execute(sql: "DELETE FROM segments WHERE id IN (\(dead.map(String.init).joined(separator: ",")))") }
                return .commit
            }
            return dead
        }
        hasSegments = true
        // Only once no state the disk may come back to names them.
        if !dead.isEmpty, (try? syncWAL()) != nil { segments.remove(dead) }
    }

    /// Removes segment files that neither `segments` lists nor any chunk row names (EntityStore.removeStrayFiles
    /// says when): a damaged `segments` table (its rows are not sealed) must not cost the chunks of a file
    /// that is still there. On the writer, so no segment is being started meanwhile.
    func removeUnlistedSegments() {
        guard !readOnly, hasSegments else { return }
        let listed = try? writer { db in
            Set(try Int64.fetchAll(db, sql: "SELECT id FROM segments UNION SELECT DISTINCT seg FROM chunks WHERE seg IS NOT NULL"))
                .union(segments.madeInTransaction)
        }
        guard let listed else { return }
        segments.remove(segments.idsOnDisk().filter { !listed.contains($0) })
    }

    /// Segments no committed row names, other than `?` (the appending one) and the last one.
    static let deadSegments = """
        SELECT id FROM segments WHERE live <= 0 AND id != ? AND id != (SELECT max(id) FROM segments)
        AND NOT EXISTS (SELECT 1 FROM chunks WHERE seg = segments.id)
        """
    static let noSegment: Int64 = 0

    /// Puts one sealed chunk in the appending segment (starting a new one when it is full); returns
    /// where it went. On the writer, inside the group transaction.
    func appendToSegment(_ db: Database, _ sealed: UnsafeRawBufferPointer) throws -> (segment: Int64, offset: Int64) {
        if segments.appender == nil {
            // The last segment, if it has room and opens (else a new one: the last may be damaged).
            let last = try Row.fetchOne(db, sql: "SELECT id, size FROM segments ORDER BY id DESC LIMIT 1")
            if let last, let id = Self.int64(last, 0), let size = Self.int64(last, 1), size >= 0, size < Segments.segmentLength {
                try? segments.openAppender(id, end: size, create: false)
            }
            if segments.appender == nil { try startSegment(db) }
        }
        if let a = segments.appender, a.end > 0, a.end + Int64(sealed.count) > Segments.segmentLength {
            try segments.syncAppender()
            try db.execute(sql: "UPDATE segments SET size = ? WHERE id = ?", arguments: [segments.appender?.end ?? a.end, a.id])
            try startSegment(db)
        }
        guard let id = segments.appender?.id else { throw StoreError.database("no segment is open for appending") }
        return (id, try segments.append(sealed, writeThrough: isLowOnSpace()))
    }

    /// A new segment, numbered above every row and every file (ids are never reused).
    private func startSegment(_ db: Database) throws {
        let last = max(try Int64.fetchOne(db, sql: "SELECT max(id) FROM segments") ?? 0, segments.idsOnDisk().max() ?? 0)
        guard last < Int64.max - 1 else { throw StoreError.notAStore("segment ids are exhausted (a damaged store)") }
        let id = last + 1
        // Made with the first segment: a store of small files only has none.
        segments.makeDirectory()
        try db.execute(sql: "INSERT INTO segments(id, size, live) VALUES (?, 0, 0)", arguments: [id])
        segments.madeInTransaction.append(id)
        try segments.openAppender(id, end: 0, create: true)
        // Its name must be on disk before a durable commit names it.
        FileIO.fsyncDirectory(of: segments.path(id))
    }

    /// What a commit freed: ranges to punch and segments to remove once it is on disk.
    struct FreedSegmentSpace {
        var ranges: [(segment: Int64, offset: Int64, length: Int64)] = []
        var segments: [Int64] = []
        var isEmpty: Bool { ranges.isEmpty && segments.isEmpty }
    }

    /// Inside the group transaction, right before COMMIT: the appended bytes reach the disk first (the
    /// commit names them), the appending segment's length is recorded, and what the transaction freed
    /// is taken out of the tables.
    func segmentsBeforeCommit(_ db: Database) throws -> FreedSegmentSpace {
        guard hasSegments else { return FreedSegmentSpace() }
        try segments.syncAppender()
        let appending = segments.appender?.id ?? Self.noSegment
        if let a = segments.appender { try db.execute(sql: "UPDATE segments SET size = ? WHERE id = ?", arguments: [a.end, a.id]) }
        var freed = FreedSegmentSpace()
        freed.segments = try Int64.fetchAll(db, sql: Self.deadSegments, arguments: [appending])
        if !freed.segments.isEmpty {
            try db.execute(sql: "DELETE FROM segments WHERE id IN (\(freed.segments.map(String.init).joined(separator: ",")))")
        }
        let dead = Set(freed.segments)
        let rows = try Row.fetchCursor(db, sql: "SELECT seg, off, len FROM temp.freed_chunks")
        while let row = try rows.next() {
            guard let s = Self.int64(row, 0), let o = Self.int64(row, 1), let l = Self.int64(row, 2), !dead.contains(s) else { continue }
            freed.ranges.append((s, o, l))
        }
        try db.execute(sql: "DELETE FROM temp.freed_chunks")
        return freed
    }

    /// After the commit: its segments are settled. What it freed, and what earlier commits freed but
    /// could not give back yet, goes once the WAL is fsynced (then no state the disk may come back to
    /// names it), unless a snapshot is reading the segments (then when it ends). True when the WAL was
    /// fsynced here. Readers never see a range go from under them: a file's content is read under its
    /// content lock, and the write or truncation that freed the range held that lock exclusively and
    /// made the file's reads go through the writer until this commit.
    func segmentsCommitted(_ freed: FreedSegmentSpace) -> Bool {
        segments.madeInTransaction.removeAll()
        let waiting = segmentPins.withLock { p in
            p.waiting.ranges += freed.ranges
            p.waiting.segments += freed.segments
            return !p.waiting.isEmpty
        }
        guard waiting else { return false }
        let synced = (try? syncWAL()) != nil
        giveBack(
            segmentPins.withLock { p in
                p.durable = synced
                return synced && p.count == 0 ? p.takeWaiting() : FreedSegmentSpace()
            })
        return synced
    }

    /// The open transaction is gone: so are the segments it made, and what it appended is cut off
    /// when the appending segment is opened again.
    func segmentsRolledBack() {
        segments.failedSync = false
        segments.closeAppender()
        segments.remove(segments.madeInTransaction)
        segments.madeInTransaction.removeAll()
    }

    /// While pinned, freed segment space is kept (a snapshot reads segments after its read transaction).
    func pinSegments() { segmentPins.withLock { $0.count += 1 } }

    func unpinSegments() {
        giveBack(
            segmentPins.withLock { p in
                p.count -= 1
                return p.count == 0 && p.durable ? p.takeWaiting() : FreedSegmentSpace()
            })
    }

    /// Punches and removes what was taken from the pins (outside their lock: no snapshot older than the
    /// commits that freed it is left, and a newer one reads none of it).
    private func giveBack(_ freed: FreedSegmentSpace) {
        guard !freed.isEmpty else { return }
        segments.punch(unnamedParts(of: freed.ranges))
        segments.remove(freed.segments)
    }

    /// The parts of `ranges` that no committed chunk row names. A range was freed by the rows deleted over
    /// it, whose segment, offset and length are not sealed: a damaged one may cover another file's chunk,
    /// which must not be punched out. When the rows cannot be read, nothing is punched (only space is lost).
    func unnamedParts(of ranges: [(segment: Int64, offset: Int64, length: Int64)]) -> [(segment: Int64, offset: Int64, length: Int64)] {
        guard !ranges.isEmpty else { return [] }
        let longest = Int64(Segments.maximumLength)
        let parts = try? pool.read { db -> [(segment: Int64, offset: Int64, length: Int64)] in
            let near = try db.cachedStatement(sql: "SELECT off, len FROM chunks WHERE seg = ? AND off > ? AND off < ? ORDER BY off")
            var out: [(segment: Int64, offset: Int64, length: Int64)] = []
            for r in ranges {
                let (end, overflow) = r.offset.addingReportingOverflow(r.length)
                guard r.offset >= 0, r.length > 0, !overflow else { continue }
                var start = r.offset
                let rows = try Row.fetchCursor(near, arguments: [r.segment, r.offset - longest, end])
                while start < end, let row = try rows.next() {
                    guard let o = Self.int64(row, 0), let l = Self.int64(row, 1), l > 0, l <= longest else { continue }
                    let (e, over) = o.addingReportingOverflow(l)
                    guard !over, e > start else { continue }
                    if o > start { out.append((r.segment, start, o - start)) }
                    start = e
                }
                if start < end { out.append((r.segment, start, end - start)) }
            }
            return out
        }
        return parts ?? []
    }

    /// Snapshots reading the segments, and the space freed meanwhile (or not yet known to be freed on
    /// disk: `durable` is false until the WAL was fsynced after it was freed).
    struct SegmentPins {
        var count = 0
        var waiting = FreedSegmentSpace()
        var durable = true
        mutating func takeWaiting() -> FreedSegmentSpace {
            defer { waiting = FreedSegmentSpace() }
            return waiting
        }
    }

    /// An integer column of a row that a hostile store may have filled with anything else (GRDB's
    /// subscript would trap on it).
    static func int64(_ row: Row, _ i: Int) -> Int64? { (try? row.decode(Int64?.self, atIndex: i)) ?? nil }

    /// Rewrites every row of the store at `path` (a snapshot of this one) that points into a segment to
    /// hold its sealed bytes itself, so the snapshot stands alone.
    func inlineSegments(into path: String) throws {
        let queue = try DatabaseQueue(path: path)
        defer { try? queue.close() }
        try queue.write { db in
            guard try Self.hasSegmentColumns(db) else { return }
            let refs = try Row.fetchAll(db, sql: "SELECT file, idx, seg, off, len FROM chunks WHERE seg IS NOT NULL")
            let update = try db.makeStatement(sql: "UPDATE chunks SET value = ?, seg = NULL, off = NULL, len = NULL WHERE file = ? AND idx = ?")
            for r in refs {
                guard let file = Self.int64(r, 0), let idx = Self.int64(r, 1) else { continue }
                let bytes = segments.read(Self.int64(r, 2) ?? 0, offset: Self.int64(r, 3) ?? 0, length: Self.int64(r, 4) ?? 0) { Data($0) }
                try update.execute(arguments: [bytes, file, idx])
            }
            try db.execute(sql: "DELETE FROM segments")
        }
    }
}
