import Foundation
import GRDB

/// What `coffer copy` needs of the embedded engine (StoreBackend, "Copies"): a read snapshot of a
/// source and the progress record of a destination, a one-row table `coffer_copy` that exists only
/// while a copy into this store is unfinished.
extension SQLiteBackend {
    /// One read transaction on the writer connection (every read here goes through it) until `close`.
    public func beginSnapshot() throws(StoreError) {
        guard readOnly else { throw .database("a snapshot is taken on a store opened read-only") }
        try writer { db in
            try db.execute(sql: "BEGIN DEFERRED")
            // A deferred transaction takes its snapshot at its first read.
            _ = try Int.fetchOne(db, sql: "SELECT count(*) FROM coffer_meta")
        }
    }

    public func copyProgress() throws(StoreError) -> [UInt8]? {
        try writer { db in
            guard try Bool.fetchOne(db, sql: "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'coffer_copy'") == true else { return nil }
            return try Data.fetchOne(db, sql: "SELECT value FROM coffer_copy WHERE id = 1").map { [UInt8]($0) }
        }
    }

    public func setCopyProgress(_ progress: [UInt8]?) throws(StoreError) {
        try write(bytes: progress?.count ?? 0) { db in
            guard let progress else { return try db.execute(sql: "DROP TABLE IF EXISTS coffer_copy") }
            try db.execute(sql: "CREATE TABLE IF NOT EXISTS coffer_copy(id INTEGER PRIMARY KEY CHECK (id = 1), value BLOB NOT NULL)")
            try db.execute(sql: "INSERT OR REPLACE INTO coffer_copy(id, value) VALUES (1, ?)", arguments: [Data(progress)])
        }
    }
}

/// A mounted store copied by its own daemon (`coffer copy` of a mounted container): no other process
/// can open it (unix-excl VFS).
extension SQLiteBackend {
    /// Writes the last committed state to `path` (an empty file or none) with `VACUUM INTO`, on a reader
    /// connection: one read transaction, so the copy is consistent and the writer is never held up. The
    /// chunks it names in segment files are then copied into its rows (the snapshot stands alone); no
    /// segment space is given back meanwhile, so they are still there to be read.
    public func snapshot(into path: String) throws(StoreError) {
        pinSegments()
        defer { unpinSegments() }
        do {
            try pool.unsafeRead { db in try db.execute(sql: "VACUUM INTO ?", arguments: [path]) }
            try inlineSegments(into: path)
        } catch { throw StoreError.sqlite(error) }
    }
}
