import Foundation

/// The header of a PostgreSQL container: the same JSON bytes `coffer.json` holds for a directory,
/// in the one row of the schema's `header` table, so key slots and the header MAC work unchanged
/// and a copy between engines moves the header as it is. Each call is one short connection; a
/// rewrite is one UPDATE (its own transaction: the old header or the new, never part of one).
enum PostgresHeader {
    static func read(_ location: PostgresLocation) throws(ContainerError) -> Data {
        let sql = PostgresSQL(schema: location.container)
        let r: PGResult
        do {
            let c = try PGConnection(location.conninfo)
            defer { c.close() }
            guard try c.execute(PostgresSQL.schemaExists, [.text(location.container)]).bool(0, 0) == true else {
                throw ContainerError.unreadable(location.display, "the database has no container \"\(location.container)\"")
            }
            r = try c.execute(sql.header)
            // A copy writes the header row last and drops its progress table with it: both missing is damage.
            if r.rowCount == 0, try c.execute("SELECT to_regclass($1) IS NOT NULL", [.text(sql.q + ".copy")]).bool(0, 0) == true {
                throw ContainerError.unfinishedCopy(location.display, orLostHeader: false)
            }
        } catch { throw containerError(error, location) }
        guard r.rowCount == 1, let bytes = try? r.bytes(0, 0) else { throw .headerDamaged("the header row is missing") }
        return Data(bytes)
    }

    /// Rewrites the header row; when `replacing` is given, only while the row still holds those bytes
    /// (`headerChanged` otherwise: another process rewrote it since this one read it).
    static func write(_ data: Data, replacing old: Data?, to location: PostgresLocation) throws(ContainerError) {
        do {
            let c = try PGConnection(location.conninfo)
            defer { c.close() }
            let sql = PostgresSQL(schema: location.container)
            let r =
                if let old { try c.execute(sql.replaceHeader, [.bytea([UInt8](data)), .bytea([UInt8](old))]) } else {
                    try c.execute(sql.updateHeader, [.bytea([UInt8](data))])
                }
            guard r.affectedRows == 1 else {
                guard try c.execute(sql.header).rowCount == 1 else { throw ContainerError.headerDamaged("the header row is missing") }
                throw ContainerError.headerChanged
            }
        } catch { throw containerError(error, location) }
    }

    /// Whether the database already has a schema by the container's name.
    static func exists(_ location: PostgresLocation) throws(ContainerError) -> Bool {
        do {
            let c = try PGConnection(location.conninfo)
            defer { c.close() }
            return try c.execute(PostgresSQL.schemaExists, [.text(location.container)]).bool(0, 0) == true
        } catch { throw containerError(error, location) }
    }

    private static func containerError(_ error: any Error, _ location: PostgresLocation) -> ContainerError {
        if let e = error as? ContainerError { return e }
        // A server away is worth waiting for (status 19, retried by the user unit); a refused login is not.
        if let e = error as? PGError, e.isConnectionLoss, !e.loginRefused { return .unreachable(location.display, e.message) }
        return .unreadable(location.display, "\(error)")  // PGError: passwords already cut out
    }
}
