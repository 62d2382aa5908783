import Foundation

/// A private PostgreSQL cluster for tests: initdb in a temporary directory owned by the `postgres`
/// user (the server refuses to run as root), a private port on 127.0.0.1 and a private socket
/// directory, so tests never touch a system cluster and parallel runs do not collide. Local (socket)
/// connections are trusted; TCP ones need a password (scram-sha-256), so password handling can be
/// tested over TCP. Stopped by `stop()`, by `deinit`, and by a watchdog if the test process dies.
public final class PostgresCluster: @unchecked Sendable {
    public let root: String
    public var dataDirectory: String { root + "/data" }
    public var socketDirectory: String { root }
    public let port: Int
    public let database = "coffer_test"
    private let bin: String
    private var watchdog: pid_t = 0
    public private(set) var isRunning = false

    /// Starts a new cluster and creates `database`. Fails (never skips) when PostgreSQL is missing.
    /// `serverBin`: where initdb and pg_ctl are (default: the newest /usr/lib/postgresql/N/bin).
    public init(settings: [String] = [], serverBin: String? = nil) throws {
        guard let bin = serverBin ?? Self.serverBin(), FileManager.default.isExecutableFile(atPath: bin + "/initdb") else {
            throw TestFailure(
                "PostgreSQL is not installed (no \(serverBin ?? "/usr/lib/postgresql/*/bin")/initdb): these tests need a real server; `make test` installs Debian's postgresql (apt-get install postgresql)"
            )
        }
        self.bin = bin
        var template = Array("/tmp/coffer-pg-XXXXXX".utf8CString)
        guard let dir = mkdtemp(&template) else { throw TestFailure("mkdtemp failed: \(String(cString: strerror(errno)))") }
        root = String(cString: dir)
        port = Self.freePort()
        do {
            if getuid() == 0 { _ = try Self.run("/bin/chown", ["postgres:postgres", root]) }
            try runAsPostgres(
                "initdb",
                [
                    "-D", dataDirectory, "-U", "postgres", "--auth-local=trust",
                    "--auth-host=scram-sha-256", "--no-sync", "-E", "UTF8", "--locale=C"
                ])
            let conf =
                ([
                    "port = \(port)", "unix_socket_directories = '\(socketDirectory)'",
                    "listen_addresses = '127.0.0.1'"
                ] + settings).joined(separator: "\n") + "\n"
            let confFile = dataDirectory + "/postgresql.auto.conf"
            try (try String(contentsOfFile: confFile, encoding: .utf8) + conf).write(toFile: confFile, atomically: false, encoding: .utf8)
            try start()
            watch()
            try runAsPostgres("createdb", ["-h", socketDirectory, "-p", String(port), "-U", "postgres", database])
        } catch {
            destroy()
            throw error
        }
    }

    deinit { destroy() }

    /// A libpq URI for the superuser over the private socket (trusted, no password).
    public var superuserURI: String { "postgresql:///\(database)?host=\(socketDirectory)&port=\(port)&user=postgres" }

    /// A key=value string for `user` over TCP (password auth), plus `extra` parameters.
    public func tcpConninfo(user: String, _ extra: String = "") -> String {
        "host=127.0.0.1 port=\(port) dbname=\(database) user=\(user) \(extra)"
    }

    public func start() throws {
        try runAsPostgres("pg_ctl", ["-D", dataDirectory, "-l", root + "/server.log", "-w", "-t", "60", "start"])
        isRunning = true
    }

    /// Stops the server: "fast" (clients disconnected, clean shutdown) or "immediate" (a crash).
    public func stop(mode: String = "fast") throws {
        try runAsPostgres("pg_ctl", ["-D", dataDirectory, "-m", mode, "-w", "-t", "60", "stop"])
        isRunning = false
    }

    public func restart(mode: String = "fast") throws {
        try stop(mode: mode)
        try start()
    }

    /// Runs SQL through psql as the superuser over the socket; returns its unaligned output.
    @discardableResult
    public func psql(_ sql: String) throws -> String {
        try runAsPostgres(
            "psql",
            [
                "-h", socketDirectory, "-p", String(port), "-U", "postgres", "-d", database,
                "-X", "-A", "-t", "-q", "-v", "ON_ERROR_STOP=1", "-c", sql
            ])
    }

    /// Stops the server (immediately: its data is thrown away) and removes the directory.
    public func destroy() {
        if isRunning { try? stop(mode: "immediate") }
        if watchdog > 0 {
            kill(watchdog, SIGKILL)
            var st: Int32 = 0
            waitpid(watchdog, &st, 0)
            watchdog = 0
        }
        try? FileManager.default.removeItem(atPath: root)
    }

    /// The server's log, for failure messages.
    public var log: String { (try? String(contentsOfFile: root + "/server.log", encoding: .utf8)) ?? "" }

    // MARK: processes

    /// A shell that outlives a crashed test process just long enough to stop its server.
    private func watch() {
        let script =
            "while kill -0 \(getpid()) 2>/dev/null; do sleep 1; done; "
            + (getuid() == 0 ? "runuser -u postgres -- " : "") + "\(bin)/pg_ctl -D \(dataDirectory) -m immediate stop; rm -rf \(root)"
        watchdog = (try? Self.spawn("/bin/sh", ["-c", script], output: "/dev/null")) ?? 0
    }

    @discardableResult
    public func runAsPostgres(_ tool: String, _ arguments: [String]) throws -> String {
        if getuid() == 0 { return try Self.run("/usr/sbin/runuser", ["-u", "postgres", "--", bin + "/" + tool] + arguments) }
        return try Self.run(bin + "/" + tool, arguments)
    }

    private static func serverBin() -> String? {
        let base = "/usr/lib/postgresql"
        let versions = ((try? FileManager.default.contentsOfDirectory(atPath: base)) ?? []).compactMap(Int.init).sorted()
        return versions.reversed().map { "\(base)/\($0)/bin" }.first { FileManager.default.isExecutableFile(atPath: $0 + "/initdb") }
    }

    /// A port the kernel just handed out on 127.0.0.1 (free now; a collision later fails pg_ctl start).
    private static func freePort() -> Int {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        defer { close(fd) }
        var addr = sockaddr_in()
        addr.sin_family = sa_family_t(AF_INET)
        addr.sin_addr.s_addr = inet_addr("127.0.0.1")
        var len = socklen_t(MemoryLayout<sockaddr_in>.size)
        let ok = withUnsafeMutablePointer(to: &addr) { p in
            p.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, len) == 0 && getsockname(fd, $0, &len) == 0 }
        }
        return ok ? Int(UInt16(bigEndian: addr.sin_port)) : Int.random(in: 20000..<30000)
    }

    /// Runs a command to its end; its output (stdout and stderr) is returned, or thrown with a failure.
    static func run(_ executable: String, _ arguments: [String]) throws -> String {
        let out = "/tmp/coffer-pg-run-\(getpid())-\(UUID().uuidString)"
        defer { unlink(out) }
        let pid = try spawn(executable, arguments, output: out)
        var st: Int32 = 0
        while waitpid(pid, &st, 0) == -1 && errno == EINTR {}
        let text = (try? String(contentsOfFile: out, encoding: .utf8)) ?? ""
        guard st == 0 else { throw TestFailure("\(([executable] + arguments).joined(separator: " ")) failed (status \(st)): \(text)") }
        return text
    }

    /// posix_spawn with stdout and stderr to `output` and no other descriptor inherited: the server
    /// that pg_ctl leaves running must not hold the test runner's pipes open.
    static func spawn(_ executable: String, _ arguments: [String], output: String) throws -> pid_t {
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
        posix_spawn_file_actions_addopen(&actions, 1, output, O_WRONLY | O_CREAT | O_TRUNC, 0o644)
        posix_spawn_file_actions_adddup2(&actions, 1, 2)
        typealias CloseFrom = @convention(c) (UnsafeMutablePointer<posix_spawn_file_actions_t>, Int32) -> Int32
        if let f = dlsym(nil, "posix_spawn_file_actions_addclosefrom_np") { _ = unsafeBitCast(f, to: CloseFrom.self)(&actions, 3) }
        let argv: [UnsafeMutablePointer<CChar>?] = ([executable] + arguments).map { strdup($0) } + [nil]
        defer { argv.forEach { free($0) } }
        var pid: pid_t = 0
        let rc = posix_spawn(&pid, executable, &actions, nil, argv, environ)
        guard rc == 0 else { throw TestFailure("cannot start \(executable): \(String(cString: strerror(rc)))") }
        return pid
    }
}
