import CPostgres
import Foundation
import Synchronization

/// One statement of a pipelined batch.
public struct PGStatement: Sendable {
    public var sql: String
    public var params: [PGValue]
    /// Parsed and planned once per connection (see `PGConnection.execute(_:_:prepared:)`).
    public var prepared: Bool
    public init(_ sql: String, _ params: [PGValue] = [], prepared: Bool = false) {
        self.sql = sql
        self.params = params
        self.prepared = prepared
    }
}

/// One libpq connection, used by one thread at a time (the pool hands it out). Calls are synchronous,
/// like the FUSE workers and the store API above it. Parameters and results are binary
/// (`PQexecParams` with formats 1): bytea travels at its size, int8 as 8 big-endian bytes.
public final class PGConnection: @unchecked Sendable {
    private var handle: OpaquePointer?
    /// The connection string, kept to reconnect (libpq keeps it in memory too); never printed.
    private let conninfo: String
    private let secrets: [String]
    /// Set when the server answered out of protocol: the session state is unknown, so reconnect.
    private var poisoned = false
    /// Names of the statements prepared on this session, by SQL and parameter types.
    private var preparedNames: [String: String] = [:]

    /// Connects once (no retry: a wrong string or password should fail at once). Any libpq URI or
    /// key=value string works; `connect_timeout` defaults to 10 s where the string does not set it.
    public init(_ conninfo: String) throws(PGError) {
        self.conninfo = conninfo
        secrets = PGConnectionString.secrets(in: conninfo)
        try open()
    }

    deinit { if let handle { PQfinish(handle) } }

    private func open() throws(PGError) {
        ahead = []
        unsettled = 0
        if let handle { PQfinish(handle) }
        handle = nil
        poisoned = false
        preparedNames = [:]
        let keywords = PGConnectionString.defaults.map(\.0) + ["dbname"]
        let values = PGConnectionString.defaults.map(\.1) + [conninfo]
        let kw = keywords.map { strdup($0) }, vs = values.map { strdup($0) }
        defer { (kw + vs).forEach { free($0) } }
        let c = (kw.map { UnsafePointer($0) } + [nil]).withUnsafeBufferPointer { k in
            (vs.map { UnsafePointer($0) } + [nil]).withUnsafeBufferPointer { v in
                PQconnectdbParams(k.baseAddress, v.baseAddress, 1)  // 1: expand "dbname" as a URI/conninfo
            }
        }
        guard let c else { throw PGError(.connection, "out of memory") }
        guard PQstatus(c) == CONNECTION_OK else {
            var error = PGError(.connection, errorMessage(c))
            error.loginRefused = PGError.refusesForGood(
                error.message, askedForPassword: PQconnectionNeedsPassword(c) != 0 || PQconnectionUsedPassword(c) != 0)
            PQfinish(c)
            throw error
        }
        PQsetNoticeProcessor(c, { _, _ in }, nil)  // NOTICEs would go to the daemon's stderr
        handle = c
    }

    /// Drops this session and opens a new one, retrying for up to `seconds` (pauses from 50 ms
    /// doubling to 1 s) while the server is unreachable or starting up. A single attempt may add
    /// `connect_timeout` to the bound. Throws `.connection` when the wait runs out.
    /// `store`: a wait of the store's own (writer, readers), which reads and marks the server `gone`; the lease's and
    /// the lock table's short waits do neither (their 1 s waits running out would cut the store's bound short).
    public func reconnect(within seconds: Double, store: Bool = false) throws(PGError) {
        try Self.retrying(within: seconds, server: store ? conninfo : nil) { () throws(PGError) in try open() }
    }

    /// Servers (by conninfo) a wait ran out on, until a connection to one is made again: a wait for
    /// such a server makes one attempt and gives up. Operations queue behind the first one (most hold
    /// the filesystem's lock), and each waited the whole bound in turn: six stats on a mount whose
    /// server was stopped failed after 4.6, 9.1, ... 27.3 s with a 5 s bound.
    private static let gone = Mutex<Set<String>>([])

    /// `attempt` until it succeeds or `seconds` have passed (pauses 50 ms doubling to 1 s); one attempt
    /// while `server` is known gone (`gone`; nil: a wait that neither reads nor marks it).
    static func retrying<T>(within seconds: Double, server: String?, _ attempt: () throws(PGError) -> T) throws(PGError) -> T {
        let deadline = Date().addingTimeInterval(seconds)
        var pause = 0.05
        while true {
            do {
                let result = try attempt()
                if let server { _ = gone.withLock { $0.remove(server) } }
                return result
            } catch {
                if let server, gone.withLock({ $0.contains(server) }) {
                    throw PGError(.connection, "no connection (nor within the last wait for this server): \(error.message)")
                }
                if Date().addingTimeInterval(pause) > deadline {
                    if let server { _ = gone.withLock { $0.insert(server) } }
                    throw PGError(.connection, "no connection within \(seconds) s: \(error.message)")
                }
            }
            Thread.sleep(forTimeInterval: pause)
            pause = min(pause * 2, 1)
        }
    }

    /// Whether the session is usable, checked without a round trip: an idle session receives nothing
    /// unless the server is going away (a FATAL message, then end of file) or sends a notice, so read
    /// while the socket is readable; libpq notices the end of file on the read after the message.
    public var isAlive: Bool {
        guard let c = handle, !poisoned, PQstatus(c) == CONNECTION_OK else { return false }
        guard unsettled == 0 else { return true }  // answers still to come: `settle` reads them
        for _ in 0..<8 {
            var p = pollfd(fd: PQsocket(c), events: Int16(POLLIN), revents: 0)
            guard poll(&p, 1, 0) == 1 else { break }
            guard PQconsumeInput(c) == 1, PQstatus(c) == CONNECTION_OK else { return false }
            _ = PQisBusy(c)  // parses what came (notices), so the buffer does not grow
        }
        return PQstatus(c) == CONNECTION_OK
    }

    /// Waits up to `timeout` seconds for notifications (on a session that ran LISTEN) and returns the
    /// payloads of those that came; throws `.connection` when the session is gone.
    public func notifications(timeout: Double) throws(PGError) -> [String] {
        let c = try connected()
        var p = pollfd(fd: PQsocket(c), events: Int16(POLLIN), revents: 0)
        if poll(&p, 1, Int32(timeout * 1000)) > 0 {
            guard PQconsumeInput(c) == 1 else { throw connectionError(c) }
        }
        var payloads: [String] = []
        while let n = PQnotifies(c) {
            payloads.append(n.pointee.extra.map { String(cString: $0) } ?? "")
            PQfreemem(n)
        }
        guard PQstatus(c) == CONNECTION_OK else { throw connectionError(c) }
        return payloads
    }

    /// Ends the session; `isAlive` is false until `reconnect`.
    public func close() {
        ahead = []
        unsettled = 0
        if let handle { PQfinish(handle) }
        handle = nil
    }

    /// Whether a transaction is open (or failed and not yet rolled back).
    public var inTransaction: Bool {
        guard let c = handle else { return false }
        let s = PQtransactionStatus(c)
        return s == PQTRANS_INTRANS || s == PQTRANS_INERROR || s == PQTRANS_ACTIVE
    }

    /// The open transaction failed (a statement errored in it): the server now accepts only ROLLBACK.
    public var transactionFailed: Bool { handle.map { PQtransactionStatus($0) == PQTRANS_INERROR } ?? false }

    /// The server's version as libpq reports it (150018 for 15.18); 0 when not connected.
    public var serverVersion: Int { handle.map { Int(PQserverVersion($0)) } ?? 0 }

    /// Statements that go ahead of the next `execute` or `pipeline`, in its round trip (a group's
    /// queued writes: PostgresBackend.later). Their results are not returned; a failure among them
    /// fails that call. Emptied by the call, and by `close` and `reconnect`.
    public var ahead: [PGStatement] = []

    /// Runs one statement with binary parameters and a binary result.
    /// `prepared`: the statement is parsed and planned once per connection and then only bound and
    /// run (pgbench -S here: 41 µs a SELECT prepared, 87 µs not); for the fixed statements of the
    /// store, not for SQL built on the fly (each text stays prepared until the session ends).
    @discardableResult
    public func execute(_ sql: String, _ params: [PGValue] = [], prepared: Bool = false) throws(PGError) -> PGResult {
        try settle()
        if !ahead.isEmpty {
            guard let r = try pipeline([PGStatement(sql, params, prepared: prepared)]).first else {
                throw PGError(.server, "no answer to the statement")
            }
            return r
        }
        let c = try connected()
        let p = try PGParameterArrays(params)
        roundTrips += 1
        let r: OpaquePointer?
        if prepared {
            let name = try prepare(sql, p, c)
            r = p.withPointers { PQexecPrepared(c, name, $0, $2, $3, $4, 1) }
        } else {
            r = p.withPointers { PQexecParams(c, sql, $0, $1, $2, $3, $4, 1) }
        }
        return try check(r, c)
    }

    /// The session's name for `sql` with these parameter types, preparing it on first use.
    private func prepare(_ sql: String, _ p: borrowing PGParameterArrays, _ c: OpaquePointer) throws(PGError) -> String {
        let key = Self.key(sql, p.types)
        if let name = preparedNames[key] { return name }
        let name = "coffer_\(preparedNames.count)"
        _ = try check(p.withPointers { n, t, _, _, _ in PQprepare(c, name, sql, n, t) }, c)
        preparedNames[key] = name
        return name
    }

    private static func key(_ sql: String, _ types: [Oid]) -> String { types.map(String.init).joined(separator: ",") + ";" + sql }

    /// Runs several statements separated by semicolons (schema setup); text protocol, no parameters.
    public func executeScript(_ sql: String) throws(PGError) {
        try settle()
        let c = try connected()
        roundTrips += 1
        _ = try check(PQexec(c, sql), c)
    }

    /// BEGIN, `body`, COMMIT; ROLLBACK when `body` throws (the error is rethrown). A COMMIT the
    /// server turns into a rollback (the transaction had failed) throws too.
    @discardableResult
    public func transaction<T>(_ body: (PGConnection) throws -> T) throws -> T {
        guard !inTransaction else { throw PGError(.usage, "a transaction is already open on this connection") }
        try execute("BEGIN")
        let value: T
        do { value = try body(self) } catch {
            if isAlive { _ = try? execute("ROLLBACK") }
            throw error
        }
        try commit()
        return value
    }

    func commit() throws(PGError) {
        let r = try execute("COMMIT")
        if let tag = PQcmdStatus(r.handle), String(cString: tag) == "ROLLBACK" {
            throw PGError(.server, "the transaction had failed and was rolled back")
        }
    }

    /// Sends every statement, then one sync, and reads the answers: one round trip for the batch.
    /// Without an explicit BEGIN the batch runs as one implicit transaction (all or nothing). The
    /// first error is thrown after every answer up to the sync has been read, so the connection stays
    /// usable; statements after a failed one come back aborted and are not run.
    public func pipeline(_ statements: [PGStatement]) throws(PGError) -> [PGResult] {
        try settle()
        let skip = ahead.count
        guard let (c, count) = try sendBatch(statements) else { return [] }
        return Array(try readBatch(c, count).dropFirst(skip))
    }

    /// Sends a batch as `pipeline` does and returns without waiting for its answers: the server works
    /// on it while the caller goes on (a streaming write prepares its next chunks meanwhile). The
    /// answers are read by the next call on this session (`settle`), which throws the batch's first
    /// error, if any, instead of running its own statements; nothing else can run before them.
    public func send(_ statements: [PGStatement]) throws(PGError) {
        try settle()
        guard let (_, count) = try sendBatch(statements) else { return }
        unsettled = count
    }

    /// Reads the answers of a batch `send` left unread; throws its first error. Every other call on the
    /// session does this first.
    public func settle() throws(PGError) {
        guard unsettled > 0 else { return }
        let count = unsettled
        unsettled = 0
        guard let c = handle else { throw PGError(.connection, "not connected to the server") }
        _ = try readBatch(c, count)
    }

    /// Statements and batches sent on this connection, each a round trip (tests count them).
    public private(set) var roundTrips = 0

    /// Statements of a batch sent by `send` whose answers are not read yet (0: none).
    private var unsettled = 0

    /// `ahead` and `statements` sent in pipeline mode with one sync at the end; nil when both are empty.
    private func sendBatch(_ statements: [PGStatement]) throws(PGError) -> (OpaquePointer, Int)? {
        let statements = ahead + statements
        guard !statements.isEmpty else { return nil }
        let c = try connected()
        guard PQpipelineStatus(c) == PQ_PIPELINE_OFF else { throw PGError(.usage, "a pipeline is already running") }
        for s in statements {
            try PGParameterArrays.validate(s.params)
            if s.prepared { _ = try prepare(s.sql, try PGParameterArrays(s.params), c) }  // before the batch: once per session
        }
        guard PQenterPipelineMode(c) == 1 else { throw connectionError(c) }
        ahead = []  // from here on sent, or the connection is given up
        roundTrips += 1
        // In blocking mode libpq reads pending answers while a send would block, so a large batch
        // cannot deadlock against a server waiting for us to read; the sync flushes what is left.
        for s in statements {  // libpq copies each statement into its buffer: one value copy alive at a time
            guard let p = try? PGParameterArrays(s.params) else { throw abandon(c) }
            let name = s.prepared ? preparedNames[Self.key(s.sql, p.types)] : nil
            let sent =
                if let name { p.withPointers { PQsendQueryPrepared(c, name, $0, $2, $3, $4, 1) } } else {
                    p.withPointers { PQsendQueryParams(c, s.sql, $0, $1, $2, $3, $4, 1) }
                }
            guard sent == 1 else { throw abandon(c) }
        }
        guard PQpipelineSync(c) == 1 else { throw abandon(c) }
        return (c, statements.count)
    }

    /// The answers of a sent batch of `count` statements, up to its sync; leaves pipeline mode.
    private func readBatch(_ c: OpaquePointer, _ count: Int) throws(PGError) -> [PGResult] {
        var results: [PGResult] = []
        var firstError: PGError?
        for _ in 0..<count {
            guard let r = PQgetResult(c) else { throw abandon(c) }
            if PQresultStatus(r) == PGRES_PIPELINE_SYNC {
                PQclear(r)
                throw abandon(c, "the server ended the batch early")
            }
            do { results.append(try check(r, c)) } catch {
                if error.kind == .connection { throw abandon(c) }
                if firstError == nil { firstError = error }
            }
            while let extra = PQgetResult(c) { PQclear(extra) }  // NULL ends each statement's answers
        }
        guard let sync = PQgetResult(c) else { throw abandon(c) }
        let synced = PQresultStatus(sync) == PGRES_PIPELINE_SYNC
        PQclear(sync)
        guard synced else { throw abandon(c, "no sync at the end of the batch") }
        guard PQexitPipelineMode(c) == 1 else { throw abandon(c) }
        if let firstError { throw firstError }
        return results
    }

    // MARK: errors

    private func connected() throws(PGError) -> OpaquePointer {
        guard let c = handle, !poisoned, PQstatus(c) == CONNECTION_OK else {
            throw PGError(.connection, "not connected to the server")
        }
        return c
    }

    /// A result turned into a PGResult or a typed error.
    private func check(_ r: OpaquePointer?, _ c: OpaquePointer) throws(PGError) -> PGResult {
        guard let r else {
            throw PGError(PQstatus(c) == CONNECTION_BAD ? .connection : .server, errorMessage(c))
        }
        let result = PGResult(r)  // owns r from here (PQclear in deinit)
        switch PQresultStatus(r) {
        case PGRES_COMMAND_OK, PGRES_TUPLES_OK, PGRES_EMPTY_QUERY:
            return result
        case PGRES_PIPELINE_ABORTED:
            throw PGError(.server, "not run: an earlier statement of the batch failed")
        case PGRES_FATAL_ERROR, PGRES_NONFATAL_ERROR, PGRES_BAD_RESPONSE:
            let state = field(r, "C").flatMap { $0.count == 5 ? SQLState($0) : nil }
            let primary = field(r, "M") ?? errorMessage(c)
            let lost = PQstatus(c) == CONNECTION_BAD || PGError.meansConnectionLoss(state)
            throw PGError(lost ? .connection : .server, redact(primary), sqlState: state)
        default:  // COPY, or anything a statement of ours never produces: session state unknown
            poisoned = true
            throw PGError(.unexpectedResult, "result status \(PQresultStatus(r).rawValue)")
        }
    }

    /// A batch that cannot be finished: the session is dropped (reconnect to use it again).
    private func abandon(_ c: OpaquePointer, _ why: String? = nil) -> PGError {
        let lost = PQstatus(c) == CONNECTION_BAD
        poisoned = true
        if lost || why == nil { return connectionError(c) }
        return PGError(.unexpectedResult, why ?? "")
    }

    private func connectionError(_ c: OpaquePointer) -> PGError { PGError(.connection, errorMessage(c)) }

    private func field(_ r: OpaquePointer, _ code: Character) -> String? {
        guard let a = code.asciiValue, let p = PQresultErrorField(r, Int32(a)) else { return nil }
        return String(cString: p)
    }

    private func errorMessage(_ c: OpaquePointer) -> String {
        guard let p = PQerrorMessage(c) else { return "unknown error" }
        let m = String(cString: p).trimmingCharacters(in: .whitespacesAndNewlines)
        return redact(m.isEmpty ? "unknown error" : m)
    }

    private func redact(_ m: String) -> String { PGConnectionString.redact(m, secrets: secrets) }
}
