import GRDB
import Glibc

/// What to do about schema objects in a store file that Coffer never makes (a trigger, a view, an
/// index or a table someone added with sqlite3). A trigger runs its own SQL on every write Coffer
/// makes; the rest is inert but says the file was edited (docs/FORMAT.md "Schema").
public enum ForeignObjectPolicy: Sendable {
    /// Opening fails (store damaged): mounts and every other command.
    case refuse
    /// Opened as it is (fsck's check lists them; a copy reads only Coffer's tables).
    case tolerate
    /// fsck's repair, once confirmed: dropped when the store is set up for writing, before anything
    /// else is written, in a transaction of their own, with the rows whose columns have the wrong type.
    case repair
}

/// One object of a store file's schema (`sqlite_master`).
public struct SchemaObject: Sendable, Equatable, CustomStringConvertible {
    public let type: String
    public let name: String
    /// The name as a terminal may show it: control characters escaped, at most 64 characters.
    public var description: String {
        let shown = name.unicodeScalars.prefix(64).map {
            $0.properties.generalCategory == .control ? "\\u{\(String($0.value, radix: 16))}" : String($0)
        }
        return "\(type) \"\(shown.joined())\(name.unicodeScalars.count > 64 ? "…" : "")\""
    }
}

extension SQLiteBackend {
    /// Every table Coffer makes (docs/FORMAT.md): `segments` since segment files, `coffer_copy` while a copy is unfinished.
    static let ownTables: Set<String> = [
        "coffer_meta", "coffer_kinds", "inodes", "dirents", "chunks", "xattrs", "orphans", "chunkmaps", "segments", "coffer_copy"
    ]
    /// Coffer's one index, as SQLite keeps its statement: one of that name made otherwise (UNIQUE, other
    /// columns) would change what Coffer's writes do, so it counts as foreign.
    static let ownIndexes: [String: String] = [
        "chunks_by_segment": "CREATE INDEX chunks_by_segment ON chunks(seg, off, len) WHERE seg IS NOT NULL"
    ]

    /// Schema objects Coffer does not make. SQLite's own (`sqlite_*`: automatic indexes of the primary
    /// keys, statistics tables) are its own business. Our triggers are TEMP: none lives in the file.
    /// Columns are cast to text: a hostile schema may hold other types there.
    static func foreignObjects(_ db: Database) throws -> [SchemaObject] {
        let rows = try Row.fetchAll(
            db, sql: "SELECT CAST(type AS TEXT), CAST(name AS TEXT), CAST(tbl_name AS TEXT), CAST(sql AS TEXT) FROM main.sqlite_master")
        return rows.compactMap { row in
            func text(_ i: Int) -> String { ((try? row.decode(String?.self, atIndex: i)) ?? nil) ?? "?" }
            let (type, name, table, sql) = (text(0), text(1), text(2), text(3))
            switch type {
            case "table" where ownTables.contains(name) || name.hasPrefix("sqlite_"): return nil
            case "index" where ownTables.contains(table) && (ownIndexes[name] == sql || name.hasPrefix("sqlite_autoindex_")): return nil
            default: return SchemaObject(type: type, name: name)
            }
        }
    }

    public func foreignObjects() throws(StoreError) -> [SchemaObject] {
        do { return try pool.unsafeRead { try Self.foreignObjects($0) } } catch { throw .notAStore("cannot read the schema: \(error)") }
    }

    /// Refuses a store with foreign objects, naming them.
    func refuseForeignObjects() throws(StoreError) {
        // A database without Coffer's tables is no store at all (the schema check then says so).
        let ours = try? pool.unsafeRead { try Bool.fetchOne($0, sql: "SELECT 1 FROM main.sqlite_master WHERE name = 'coffer_meta'") }
        guard ours == true else { return }
        let found = try foreignObjects()
        guard !found.isEmpty else { return }
        let names = found.prefix(5).map(\.description).joined(separator: ", ") + (found.count > 5 ? " and \(found.count - 5) more" : "")
        throw .foreignObjects(names)
    }

    /// Each table's columns as Coffer writes them: SQLite keeps whatever type it is given (a key of 5.5 or 'x'
    /// where Coffer writes integers, text where it writes blobs), and such a row matches none of Coffer's lookups.
    static let columnTypes: [(table: String, integers: [String], blobs: [String])] = [
        ("inodes", [], ["value"]), ("dirents", [], ["parent", "tag", "value"]), ("chunks", ["file", "idx"], ["value"]),
        ("xattrs", ["inode"], ["tag", "value"]), ("chunkmaps", ["file", "page"], ["value"]), ("orphans", ["id"], [])
    ]

    static func mistyped(integers: [String], blobs: [String]) -> String {
        (integers.map { "typeof(\($0)) != 'integer'" } + blobs.map { "typeof(\($0)) != 'blob'" }).joined(separator: " OR ")
    }

    /// How many rows of each table have a column of another type than Coffer writes (tables without any left out).
    public func mistypedRows() throws(StoreError) -> [(table: String, count: Int)] {
        do {
            return try pool.unsafeRead { db in
                try Self.columnTypes.compactMap { t in
                    let n = try Int.fetchOne(db, sql: "SELECT count(*) FROM \(t.table) WHERE \(Self.mistyped(integers: t.integers, blobs: t.blobs))")
                    return (n ?? 0) > 0 ? (t.table, n ?? 0) : nil
                }
            }
        } catch { throw .database("\(error)") }
    }

    /// The repair's first step (ForeignObjectPolicy.repair), in one transaction: every foreign object is dropped
    /// (dropping fires no trigger; a trigger or index on a foreign table goes with the table, and what is already
    /// gone is skipped), then every mistyped row, once no trigger can fire: an integer stored as a real (truncated,
    /// as reads take it) or a blob stored as text gets its type back unless another row holds that key; the rest
    /// is dropped. Restored rows are authenticated by the check after the repair, as any row.
    func repairStoreFile() throws(StoreError) {
        do {
            try pool.writeWithoutTransaction { db in
                try db.inTransaction {
                    for o in try Self.foreignObjects(db)
                    where try Bool.fetchOne(db, sql: "SELECT 1 FROM main.sqlite_master WHERE name = ?", arguments: [o.name]) == true {
                        let kind = ["trigger": "TRIGGER", "view": "VIEW", "index": "INDEX", "table": "TABLE"][o.type]
                        guard let kind else { continue }
                        try db.execute(sql: "DROP \(kind) IF EXISTS main.\(o.name.quotedDatabaseIdentifier)")
                    }
                    for t in Self.columnTypes {
                        // The type back where the bytes allow: the row is then what Coffer's reads took it for.
                        for c in t.integers {
                            try db.execute(sql: "UPDATE OR IGNORE \(t.table) SET \(c) = CAST(\(c) AS INTEGER) WHERE typeof(\(c)) = 'real'")
                        }
                        for c in t.blobs {  // text keeps its bytes; a number cast would be its decimal digits
                            try db.execute(sql: "UPDATE OR IGNORE \(t.table) SET \(c) = CAST(\(c) AS BLOB) WHERE typeof(\(c)) = 'text'")
                        }
                        try db.execute(sql: "DELETE FROM \(t.table) WHERE \(Self.mistyped(integers: t.integers, blobs: t.blobs))")
                    }
                    return .commit
                }
            }
        } catch { throw .database("cannot drop the objects Coffer never makes and the mistyped rows: \(error)") }
    }

    /// Segment files the rows point into that are missing or shorter than the bytes they name (deleted,
    /// cut short, or left behind by a copy of the store file alone): each chunk in them reads as damaged,
    /// and restoring that one file mends them all.
    public func segmentFileCheck() throws(StoreError) -> [String] {
        guard hasSegments else { return [] }
        let needs: [(id: Int64, end: Int64, chunks: Int)]
        do {
            needs = try pool.unsafeRead { db in
                try Row.fetchAll(
                    db,
                    sql:
                        "SELECT seg, max(off + len), count(*) FROM chunks WHERE seg IS NOT NULL AND \(Self.accepted("chunks")) GROUP BY seg ORDER BY seg"
                ).map { row in
                    (
                        (try? row.decode(Int64.self, atIndex: 0)) ?? -1, (try? row.decode(Int64.self, atIndex: 1)) ?? 0,
                        (try? row.decode(Int.self, atIndex: 2)) ?? 0
                    )
                }
            }
        } catch { throw .database("cannot list the segment files the rows name: \(error)") }
        var found: [String] = []
        for n in needs where n.id >= 0 {
            var st = stat()
            let name = "segments/\(n.id)"
            if stat(segments.path(n.id), &st) != 0 {
                let why = errno == ENOENT ? "is missing" : "cannot be read (\(String(cString: strerror(errno))))"
                found.append("\(name) \(why); \(n.chunks) chunk(s) lie in it")
            } else if Int64(st.st_size) < n.end {
                found.append("\(name) is \(st.st_size) bytes, shorter than the \(n.end) its \(n.chunks) chunk(s) need")
            }
        }
        return found
    }

    /// SQLite's structural check of the file (`PRAGMA quick_check`: every page's b-tree structure, not
    /// whether each index agrees with its table). Its first `limit` complaints; empty when sound. SQLite
    /// cannot mend a damaged page (REINDEX and VACUUM stop at it): fsck reports it and leaves it.
    public func fileCheck(limit: Int = 20) throws(StoreError) -> [String] {
        do {
            let lines = try pool.unsafeRead { db in try String.fetchAll(db, sql: "PRAGMA main.quick_check(\(limit))") }
            guard lines != ["ok"] else { return [] }
            // A complaint may span lines; the first names the schema ("*** in database main ***").
            return lines.flatMap { $0.split(separator: "\n").map(String.init) }.filter { !$0.hasPrefix("*** ") }
        } catch {
            // A page the check cannot even read (SQLITE_CORRUPT, SQLITE_NOTADB) is itself the finding.
            if let e = error as? DatabaseError, e.resultCode == .SQLITE_CORRUPT || e.resultCode == .SQLITE_NOTADB {
                return ["the check stopped at a damaged page: \(e.message ?? "\(e.resultCode)")"]
            }
            throw .database("SQLite's check of the store file could not run: \(error)")
        }
    }
}
