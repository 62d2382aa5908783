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
    /// this client refused the server or the string (`refusesForGood`). Waiting for the server changes nothing there.
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

    /// Whether a connection that failed was refused for good: it would fail the same way on every try, so
    /// waiting for the server (and the user unit's retry every 5 s) is pointless. Refused, on positive evidence
    /// only: libpq refused the string or the server locally (`clientRefusals`: an unknown parameter,
    /// `sslmode=bogus`, an undefined service, a client key it cannot use, a certificate that does not verify
    /// or names another host, a missing root certificate file, no TLS where `sslmode` requires it); or the
    /// server refused the login (`askedForPassword`, or `serverRefusals`: no such role or database, no
    /// pg_hba.conf entry) unless the message also says the server is away (`awayWords`: full of clients or
    /// shutting down right after the password check). Anything else, an unknown message included, is a server
    /// away. libpq has no codes for these: its English words are matched (Coffer sets no locale for
    /// messages), and so are the server's, which follow its `lc_messages`: a translated refusal reads as a
    /// server away, retried as before.
    static func refusesForGood(_ message: String, askedForPassword: Bool) -> Bool {
        if clientRefusals.contains(where: message.contains) { return true }
        if awayWords.contains(where: message.contains) { return false }
        return askedForPassword || serverRefusals.contains(where: message.contains)
    }

    /// libpq's own words for a connection string, key or server it refuses before any login.
    static let clientRefusals = [
        "invalid ", "missing \"=\"", "definition of service", "service file",  // the string (URI, option, value)
        "certificate", "private key", "SSL was required", "GSSAPI encryption required"
    ]

    /// The server's words (in English) for a login it refuses whatever the moment.
    static let serverRefusals = ["does not exist", "no pg_hba.conf entry", "authentication failed", "is not permitted to log in"]

    /// libpq's and the server's words for a server that cannot be reached or does not take connections yet.
    static let awayWords = [
        "Connection refused", "No such file or directory", "Resource temporarily unavailable",  // nothing listens, a full backlog
        "timeout expired", "Connection timed out", "Network is unreachable", "Network is down", "No route to host", "Host is unreachable",
        "Host is down", "Cannot assign requested address",
        "could not translate host name", "Temporary failure in name resolution",  // DNS, e.g. before the network is up
        "the database system is", "too many clients", "too many connections for", "remaining connection slots are reserved",
        "could not fork new process", "out of memory", "hot standby", "session is read-only",  // 57P03, 53300, a failover
        "server closed the connection unexpectedly", "could not receive data from server", "could not send data to server",
        "could not send startup packet", "SSL connection has been closed unexpectedly", "unexpected eof", "Broken pipe",
        "Connection reset by peer", "SSL SYSCALL error", "EOF detected", "terminating connection due to"
    ]

    /// SQLSTATEs that mean the session is gone even if libpq has not noticed yet.
    static func meansConnectionLoss(_ state: SQLState?) -> Bool {
        guard let state else { return false }
        return state.errorClass == "08" || state == .adminShutdown || state == .crashShutdown
            || state == .cannotConnectNow
    }
}
