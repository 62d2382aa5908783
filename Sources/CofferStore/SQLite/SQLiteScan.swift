import Foundation
import GRDB
import GRDBSQLite

/// Whole-table enumerations and single-row deletes for `coffer fsck`, which must look at every row,
/// including rows no lookup would reach (stray entries, chunks of no file). Columns are read with
/// SQLite's C accessors, which coerce whatever a hostile store holds instead of trapping.
extension SQLiteBackend {
    public func allInodeRows() throws(StoreError) -> [InodeRow] {
        try scan("SELECT id, value FROM inodes") { s in InodeRow(id: Self.u64(s, 0), sealed: Self.blob(s, 1)) }
    }

    public func allEntryRows() throws(StoreError) -> [EntryRow] {
        try scan("SELECT parent, tag, value FROM dirents") { s in
            EntryRow(parentTag: Self.blob(s, 0), tag: Self.blob(s, 1), sealed: Self.blob(s, 2))
        }
    }

    public func allXattrRows() throws(StoreError) -> [XattrRow] {
        try scan("SELECT inode, tag, value FROM xattrs") { s in XattrRow(inode: Self.u64(s, 0), tag: Self.blob(s, 1), sealed: Self.blob(s, 2)) }
    }

    public func allChunkMapRows() throws(StoreError) -> [ChunkMapRow] {
        try scan("SELECT file, page, value FROM chunkmaps") { s in ChunkMapRow(file: Self.u64(s, 0), page: Self.u64(s, 1), sealed: Self.blob(s, 2)) }
    }

    public func chunkFileSummaries() throws(StoreError) -> [ChunkFileSummary] {
        try scan("SELECT file, count(*), max(idx) FROM chunks GROUP BY file") { s in
            ChunkFileSummary(file: Self.u64(s, 0), rows: Int(sqlite3_column_int64(s, 1)), maxIndex: sqlite3_column_int64(s, 2))
        }
    }

    public func forEachChunkRow(file: UInt64, _ body: (UInt64, UnsafeRawBufferPointer) throws -> Void) throws {
        try writer { db in
            // The statement object owns the SQLite statement: keep it alive while stepping.
            let statement = try db.makeStatement(sql: "SELECT \(chunkColumns) FROM chunks WHERE file = ? ORDER BY idx")
            try withExtendedLifetime(statement) {
                let stmt = statement.sqliteStatement
                sqlite3_bind_int64(stmt, 1, Int64(bitPattern: file))
                try RawSQLite.forEachRow(stmt, segments: segments, body)
            }
        }
    }

    public func deleteChunkRow(file: UInt64, index: UInt64) throws(StoreError) {
        try write(file: file) { db in
            try db.execute(sql: "DELETE FROM chunks WHERE file = ? AND idx = ?", arguments: [Int64(bitPattern: file), Int64(bitPattern: index)])
        }
    }

    public func deleteAllChunkRows(file: UInt64) throws(StoreError) {
        try write(file: file) { db in try db.execute(sql: "DELETE FROM chunks WHERE file = ?", arguments: [Int64(bitPattern: file)]) }
    }

    public func deleteAllChunkMapRows(file: UInt64) throws(StoreError) {
        try write { db in try db.execute(sql: "DELETE FROM chunkmaps WHERE file = ?", arguments: [Int64(bitPattern: file)]) }
    }

    // MARK: Plumbing

    private func scan<T>(_ sql: String, _ row: (OpaquePointer) -> T) throws(StoreError) -> [T] {
        try writer { db in
            let statement = try db.makeStatement(sql: sql)
            return try withExtendedLifetime(statement) {
                let stmt = statement.sqliteStatement
                var out: [T] = []
                while true {
                    let rc = sqlite3_step(stmt)
                    if rc == SQLITE_DONE { break }
                    guard rc == SQLITE_ROW else { throw StoreError.sqlite(code: rc, stmt) }
                    out.append(row(stmt))
                }
                return out
            }
        }
    }

    private static func u64(_ s: OpaquePointer, _ column: Int32) -> UInt64 { UInt64(bitPattern: sqlite3_column_int64(s, column)) }

    private static func blob(_ s: OpaquePointer, _ column: Int32) -> [UInt8] {
        // blob before bytes: the length is only right once the value is in blob form.
        guard let p = sqlite3_column_blob(s, column) else { return [] }
        let n = Int(sqlite3_column_bytes(s, column))
        guard n > 0 else { return [] }
        return Array(UnsafeRawBufferPointer(start: p, count: n))
    }
}
