/// A PostgreSQL error code (SQLSTATE, five characters), so callers branch on what went wrong instead
/// of on message text (which the server may localize).
public struct SQLState: RawRepresentable, Hashable, Sendable, CustomStringConvertible {
    public let rawValue: String
    public init(rawValue: String) { self.rawValue = rawValue }
    public init(_ code: String) { rawValue = code }
    public var description: String { rawValue }
    /// The two-character class ("08" connection exception, "40" transaction rollback, ...).
    public var errorClass: Substring { rawValue.prefix(2) }

    public static let uniqueViolation = SQLState("23505")
    public static let serializationFailure = SQLState("40001")
    public static let deadlockDetected = SQLState("40P01")
    public static let diskFull = SQLState("53100")
    public static let outOfMemory = SQLState("53200")
    public static let adminShutdown = SQLState("57P01")
    public static let crashShutdown = SQLState("57P02")
    public static let cannotConnectNow = SQLState("57P03")
    public static let undefinedTable = SQLState("42P01")
    public static let insufficientPrivilege = SQLState("42501")
    public static let lockNotAvailable = SQLState("55P03")
}

/// A failure of the PostgreSQL client. Messages come from libpq or the server with every password of
/// the connection string cut out (`PGConnectionString.redact`); the connection string itself is never
/// part of one.
public struct PGError: Error, Equatable, Sendable, CustomStringConvertible {
    public enum Kind: Sendable, Equatable {
        /// No usable connection: refused, lost mid-call, server shut down, reconnect wait ran out.
        case connection
        /// The server refused a statement; `sqlState` says why (constraint, serialization, disk full...).
        case server
        /// The server answered something this client did not ask for (wrong type, length, shape):
        /// treated as hostile or broken, never trapped on.
        case unexpectedResult
        /// A caller's mistake (bad connection string, value out of range, nested pipeline).
        case usage
    }

    public let kind: Kind
    public let sqlState: SQLState?
    public let message: String
    /// A `.connection` failure where one end refused the login: the server asked for a password and none was
    /// found, or the one given did not open the session (wrong password, or no such database after it); or
    /// this client refused the server (`refusesTheServer`). Waiting for the server changes nothing there.
    public var loginRefused = false

    public init(_ kind: Kind, _ message: String, sqlState: SQLState? = nil) {
        self.kind = kind
        self.message = message
        self.sqlState = sqlState
    }

    /// True when retrying on a fresh connection may succeed: the link or the server went away.
    public var isConnectionLoss: Bool { kind == .connection }
    /// True for failures a transaction should simply be retried after (40001, 40P01).
    public var isRetryableTransaction: Bool {
        sqlState == .serializationFailure || sqlState == .deadlockDetected
    }

    public var description: String {
        let code = sqlState.map { " [\($0)]" } ?? ""
        switch kind {
        case .connection: return "PostgreSQL connection error\(code): \(message)"
        case .server: return "PostgreSQL error\(code): \(message)"
        case .unexpectedResult: return "unexpected answer from PostgreSQL: \(message)"
        case .usage: return "PostgreSQL client usage error: \(message)"
        }
    }

    /// Whether libpq's message says it refused the server for the connection string's TLS settings: a
    /// certificate that does not verify or names another host (`sslmode=verify-ca`/`verify-full`), a root
    /// certificate file that cannot be read, a server without TLS where `sslmode=require` asks for it, or
    /// a server that refused this client's certificate. Such a mount would fail the same way on every try
    /// (and one may face an impostor), so it is not a server that is away. libpq has no code for these: its
    /// English words are matched (Coffer sets no locale for messages; a translated one would make such a
    /// refusal read as a server away, as before).
    static func refusesTheServer(_ message: String) -> Bool {
        message.contains("certificate") || message.contains("SSL was required")
    }

    /// SQLSTATEs that mean the session is gone even if libpq has not noticed yet.
    static func meansConnectionLoss(_ state: SQLState?) -> Bool {
        guard let state else { return false }
        return state.errorClass == "08" || state == .adminShutdown || state == .crashShutdown
            || state == .cannotConnectNow
    }
}
