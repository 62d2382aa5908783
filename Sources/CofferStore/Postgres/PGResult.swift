import CPostgres

/// A statement's result, always in binary format. Every accessor checks the row and column range, the
/// column's type and the value's length against what it decodes: the bytes come from the server,
/// which is not trusted not to lie (a hostile server gets an error, never a trap).
public final class PGResult: @unchecked Sendable {  // a PGresult is read-only once received
    let handle: OpaquePointer
    public let rowCount: Int
    public let columnCount: Int

    init(_ handle: OpaquePointer) {
        self.handle = handle
        rowCount = max(0, Int(PQntuples(handle)))
        columnCount = max(0, Int(PQnfields(handle)))
    }

    deinit { PQclear(handle) }

    /// Rows an INSERT, UPDATE, DELETE (...) touched; 0 when the command does not say.
    public var affectedRows: Int {
        guard let s = PQcmdTuples(handle) else { return 0 }
        return Int(String(cString: s)) ?? 0
    }

    /// The command tag ("COMMIT", "ROLLBACK", "INSERT 0 1", ...).
    public var commandStatus: String { PQcmdStatus(handle).map { String(cString: $0) } ?? "" }

    public func isNull(_ row: Int, _ column: Int) throws(PGError) -> Bool {
        try check(row, column)
        return PQgetisnull(handle, Int32(row), Int32(column)) != 0
    }

    /// An int8 (or a narrower integer) column; nil for NULL.
    public func int64(_ row: Int, _ column: Int) throws(PGError) -> Int64? {
        guard let raw = try value(row, column, [PGValue.OID.int8, PGValue.OID.int4, PGValue.OID.int2]) else { return nil }
        switch raw.count {
        case 8: return raw.loadUnaligned(as: Int64.self).bigEndian
        case 4: return Int64(raw.loadUnaligned(as: Int32.self).bigEndian)
        case 2: return Int64(raw.loadUnaligned(as: Int16.self).bigEndian)
        default: throw PGError(.unexpectedResult, "an integer of \(raw.count) bytes in column \(column)")
        }
    }

    /// A row count (`count(*)`): never negative, and never so large that the sums and weights of
    /// progress totals overflow, whatever a hostile server sends.
    public func count(_ row: Int, _ column: Int) throws(PGError) -> Int {
        Int(max(0, min(try int64(row, column) ?? 0, 1 << 48)))
    }

    public func bool(_ row: Int, _ column: Int) throws(PGError) -> Bool? {
        guard let raw = try value(row, column, [PGValue.OID.bool]) else { return nil }
        guard raw.count == 1 else { throw PGError(.unexpectedResult, "a bool of \(raw.count) bytes in column \(column)") }
        return raw[0] != 0
    }

    /// A bytea column's bytes (copied); nil for NULL.
    public func bytes(_ row: Int, _ column: Int) throws(PGError) -> [UInt8]? {
        guard let raw = try value(row, column, [PGValue.OID.bytea]) else { return nil }
        return Array(raw)
    }

    /// A bytea column's bytes without a copy, valid only inside `body` (sealed chunks go straight to
    /// AES-GCM); nil for NULL.
    public func withBytes<R>(_ row: Int, _ column: Int, _ body: (UnsafeRawBufferPointer) throws -> R) throws -> R? {
        guard let raw = try value(row, column, [PGValue.OID.bytea]) else { return nil }
        return try body(raw)
    }

    /// A text-like column (text, varchar, name, char) as UTF-8; nil for NULL.
    public func text(_ row: Int, _ column: Int) throws(PGError) -> String? {
        let kinds = [PGValue.OID.text, PGValue.OID.varchar, PGValue.OID.name, PGValue.OID.bpchar]
        guard let raw = try value(row, column, kinds) else { return nil }
        guard let s = String(validating: raw, as: UTF8.self) else {
            throw PGError(.unexpectedResult, "text in column \(column) is not UTF-8")
        }
        return s
    }

    private func check(_ row: Int, _ column: Int) throws(PGError) {
        guard row >= 0, row < rowCount, column >= 0, column < columnCount else {
            throw PGError(.usage, "row \(row), column \(column) outside a result of \(rowCount)x\(columnCount)")
        }
    }

    /// The raw binary value after every check; nil for NULL.
    private func value(_ row: Int, _ column: Int, _ types: [Oid]) throws(PGError) -> UnsafeRawBufferPointer? {
        try check(row, column)
        let r = Int32(row), c = Int32(column)
        let type = PQftype(handle, c)
        guard types.contains(type) else {
            throw PGError(.unexpectedResult, "column \(column) has type oid \(type), expected \(types.map(String.init).joined(separator: " or "))")
        }
        guard PQfformat(handle, c) == 1 else { throw PGError(.unexpectedResult, "column \(column) is not in binary format") }
        if PQgetisnull(handle, r, c) != 0 { return nil }
        let length = Int(PQgetlength(handle, r, c))
        guard length >= 0, let p = PQgetvalue(handle, r, c) else {
            throw PGError(.unexpectedResult, "no value at row \(row), column \(column)")
        }
        return UnsafeRawBufferPointer(start: p, count: length)
    }
}
