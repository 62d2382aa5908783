/// The one mapping from the PostgreSQL client's errors to the store's. Messages come from
/// `PGError`, which has every password of the connection string cut out already.
extension StoreError {
    static func postgres(_ error: any Error) -> StoreError {
        switch error {
        case let e as StoreError: return e
        case let e as PGError:
            if e.sqlState == .diskFull { return .diskFull }
            if e.sqlState == .readOnlyTransaction { return .readOnly }
            if e.kind == .connection || e.isConnectionLoss { return .unavailable(e.description) }
            return .database(e.description)
        default: return .database("\(error)")
        }
    }
}

extension SQLState {
    /// A write in a read-only transaction (a store opened read-only, a hot standby).
    static let readOnlyTransaction = SQLState("25006")
}
