import Foundation

/// What `coffer copy` needs of the PostgreSQL engine (StoreBackend, "Copies"): the progress record of
/// a destination, a one-row table `copy` in the schema that exists only while a copy into it is
/// unfinished, and the header row written last. (The snapshot is in PostgresTransactions.swift.)
extension PostgresBackend {
    private var copyTable: String { sql.q + ".copy" }

    public func copyProgress() throws(StoreError) -> [UInt8]? {
        try read { c in
            let exists = try c.execute("SELECT EXISTS (SELECT 1 FROM pg_tables WHERE schemaname = $1 AND tablename = 'copy')", [.text(sql.schema)])
            guard try exists.bool(0, 0) == true else { return nil }
            let r = try c.execute("SELECT value FROM \(copyTable) WHERE id = 1")
            return r.rowCount == 0 ? nil : try r.bytes(0, 0)
        }
    }

    /// Not prepared: the table comes and goes, and a prepared plan would outlive it.
    public func setCopyProgress(_ progress: [UInt8]?) throws(StoreError) {
        try write(bytes: progress?.count ?? 0) { c in
            guard let progress else { return try c.executeScript("DROP TABLE IF EXISTS \(copyTable)") }
            try c.executeScript("CREATE TABLE IF NOT EXISTS \(copyTable)(id integer PRIMARY KEY CHECK (id = 1), value bytea NOT NULL)")
            _ = try c.execute(
                "INSERT INTO \(copyTable)(id, value) VALUES (1, $1) ON CONFLICT (id) DO UPDATE SET value = EXCLUDED.value", [.bytea(progress)])
        }
    }

    /// The header row's bytes (read in the snapshot when one is open); nil when there is no row.
    public func headerBytes() throws(StoreError) -> [UInt8]? { try value(sql.header, []) }

    /// Writes the header row in the open group transaction (a copy's last step, with its progress
    /// record's removal: the container appears whole or not at all).
    public func putHeader(_ header: [UInt8]) throws(StoreError) {
        try change("INSERT INTO \(sql.q).header(id, value) VALUES (1, $1) ON CONFLICT (id) DO UPDATE SET value = EXCLUDED.value", [.bytea(header)])
    }

    /// Drops the schema of an unfinished copy (it has a progress record) to start the copy over, in
    /// one transaction; any other schema is left alone.
    public static func dropUnfinishedCopy(_ location: PostgresLocation) throws(StoreError) {
        let c = try connect(location)
        defer { c.close() }
        do {
            try c.transaction { c in
                let r = try c.execute(
                    "SELECT EXISTS (SELECT 1 FROM pg_tables WHERE schemaname = $1 AND tablename = 'copy')", [.text(location.container)])
                guard try r.bool(0, 0) == true else { throw StoreError.database("\(location.display) is not an unfinished copy") }
                try c.executeScript("DROP SCHEMA \(PostgresIdentifier.quoted(location.container)) CASCADE")
            }
        } catch { throw StoreError.postgres(error) }
    }
}
