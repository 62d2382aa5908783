import GRDB
import GRDBSQLite

/// The one mapping from SQLite's results to the store's errors, for GRDB's errors and for result
/// codes of statements stepped through the C API alike.
extension StoreError {
    /// A store error for whatever the SQLite engine threw (a `StoreError` stays as it is).
    static func sqlite(_ error: any Error) -> StoreError {
        switch error {
        case let e as StoreError: return e
        case is NoRoomToGrow: return .diskFull
        case let e as DatabaseError: return sqlite(code: e.extendedResultCode.rawValue, message: e.message)
        default: return .database("\(error)")
        }
    }

    /// A store error for a result code; the message from the statement's connection.
    static func sqlite(code: Int32, _ stmt: OpaquePointer?) -> StoreError {
        let db = stmt.flatMap { sqlite3_db_handle($0) }
        return sqlite(code: code, message: db.flatMap { sqlite3_errmsg($0) }.map { String(cString: $0) })
    }

    private static func sqlite(code: Int32, message: String?) -> StoreError {
        switch code & 0xFF {
        case SQLITE_FULL: return .diskFull
        case SQLITE_READONLY: return .readOnly
        default: return .database(message ?? "SQLite error \(code)")
        }
    }
}
