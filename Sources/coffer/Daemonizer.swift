import CofferCrypto
import CofferStore
import Foundation
import Glibc

/// Starts the mount daemon in the background and waits until the mount answers (or fails), so
/// that `coffer mount` returns to the shell only with a working mount or one clear error line.
///
/// The daemon is this same program, re-run with `--ready-fd`; a prompted or extpass password travels to it
/// through a pipe (`--secret-fd`), never through argv or the environment.
enum Daemonizer {
    static let secretFD: Int32 = 3
    static let readyFD: Int32 = 4

    /// Returns the daemon's pid once its mount answers.
    @discardableResult
    static func startInBackground(secret: SecretOptions, arguments: [String]) throws -> pid_t {
        var args = arguments + ["--ready-fd", String(readyFD)]
        if let p = secret.passfile { args += ["--passfile", p] }
        if let k = secret.keyfile { args += ["--keyfile", k] }
        // A prompted password and an extpass command's answer are handed over: the command runs here,
        // where the user's terminal is (systemd-ask-password, pinentry), not in the detached daemon.
        let prompted: SecureBytes?
        if let e = secret.extpass {
            prompted = try SecretReader.firstLine(ofCommand: e)
        } else {
            prompted = secret.isGiven ? nil : try SecretReader.prompt("Password: ", confirm: false)
        }
        defer { prompted?.wipe() }
        if prompted != nil { args += ["--secret-fd", String(secretFD)] }

        var readyPipe: [Int32] = [0, 0], secretPipe: [Int32] = [-1, -1]
        guard makePipe(&readyPipe) else { throw CLIFailure(message: "pipe: \(String(cString: strerror(errno)))", code: 1) }
        if prompted != nil, !makePipe(&secretPipe) { throw CLIFailure(message: "pipe: \(String(cString: strerror(errno)))", code: 1) }

        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
        posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0)
        posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0)
        posix_spawn_file_actions_adddup2(&actions, readyPipe[1], readyFD)
        if prompted != nil { posix_spawn_file_actions_adddup2(&actions, secretPipe[0], secretFD) }

        var attr = posix_spawnattr_t()
        posix_spawnattr_init(&attr)
        defer { posix_spawnattr_destroy(&attr) }
        posix_spawnattr_setflags(&attr, posixSpawnSetsid)

        let exe = "/proc/self/exe"
        let argv: [UnsafeMutablePointer<CChar>?] = (["coffer"] + args).map { strdup($0) } + [nil]
        defer { for p in argv { free(p) } }
        var pid: pid_t = 0
        let rc = posix_spawn(&pid, exe, &actions, &attr, argv, environ)
        close(readyPipe[1])
        if prompted != nil { close(secretPipe[0]) }
        guard rc == 0 else {
            close(readyPipe[0])
            throw CLIFailure(message: "cannot start the mount daemon: \(String(cString: strerror(rc)))", code: ExitStatus.mountFailed)
        }
        if let prompted {
            prompted.withUnsafeBytes { buf in
                if let base = buf.baseAddress { _ = Glibc.write(secretPipe[1], base, buf.count) }
            }
            close(secretPipe[1])
        }
        let reply = readAll(readyPipe[0])
        close(readyPipe[0])
        if reply.hasPrefix("OK") { return pid }
        if reply.hasPrefix("ERR ") {
            let rest = reply.dropFirst(4)
            let parts = rest.split(separator: " ", maxSplits: 1)
            let code = Int32(parts.first ?? "1") ?? 1
            let message = parts.count > 1 ? String(parts[1]).trimmingCharacters(in: .newlines) : "mount failed"
            var status: Int32 = 0
            waitpid(pid, &status, 0)
            throw CLIFailure(message: message, code: code)
        }
        var status: Int32 = 0
        waitpid(pid, &status, 0)
        throw CLIFailure(message: "the mount daemon ended before the mount was ready (status \(status))", code: ExitStatus.mountFailed)
    }

    /// glibc's POSIX_SPAWN_SETSID (not exported to Swift without _GNU_SOURCE): the daemon leaves the
    /// shell's session, so closing the terminal does not end the mount.
    static let posixSpawnSetsid: Int16 = 0x80

    static func makePipe(_ fds: inout [Int32]) -> Bool {
        guard pipe(&fds) == 0 else { return false }
        for fd in fds { _ = fcntl(fd, F_SETFD, FD_CLOEXEC) }
        return true
    }

    /// Reads the daemon's one-line answer. Stops at the newline, not at EOF: helpers the daemon
    /// starts (fusermount3 for auto_unmount) may live as long as the mount.
    static func readAll(_ fd: Int32) -> String {
        var data = [UInt8]()
        var byte: UInt8 = 0
        while true {
            let n = read(fd, &byte, 1)
            if n < 0 && errno == EINTR { continue }
            if n <= 0 { break }
            data.append(byte)
            if byte == UInt8(ascii: "\n") || data.count > 65536 { break }
        }
        return String(decoding: data, as: UTF8.self)
    }

    /// In the daemon (started with --ready-fd): closes every descriptor inherited from the launcher
    /// except stdio and the ready/secret pipes, and keeps those two from leaking into programs the
    /// daemon starts. Runs first thing in main, before anything of ours opens a descriptor.
    static func closeInheritedDescriptors(_ argv: [String]) {
        guard let i = argv.firstIndex(of: "--ready-fd"), i + 1 < argv.count, let ready = Int32(argv[i + 1]) else { return }
        var keep: Set<Int32> = [0, 1, 2, ready]
        if let j = argv.firstIndex(of: "--secret-fd"), j + 1 < argv.count, let secret = Int32(argv[j + 1]) { keep.insert(secret) }
        var open: [Int32] = []
        if let dir = opendir("/proc/self/fd") {
            let own = dirfd(dir)
            while let entry = readdir(dir) {
                let name = withUnsafeBytes(of: entry.pointee.d_name) { String(decoding: $0.prefix(while: { $0 != 0 }), as: UTF8.self) }
                if let fd = Int32(name), fd != own { open.append(fd) }
            }
            closedir(dir)
        }
        for fd in open where !keep.contains(fd) { close(fd) }
        for fd in keep where fd > 2 { _ = fcntl(fd, F_SETFD, FD_CLOEXEC) }
    }
}

extension Daemonizer {
    /// Environment variables naming files that libpq (at every connection, reconnects included) or the
    /// generation ledger (at every durable commit) opens while the daemon runs, with libpq's parameter of each.
    static let pathVariables = [
        ("PGPASSFILE", "passfile"), ("PGSERVICEFILE", ""), ("PGSYSCONFDIR", ""), ("PGSSLROOTCERT", "sslrootcert"),
        ("PGSSLCERT", "sslcert"), ("PGSSLKEY", "sslkey"), ("PGSSLCRL", "sslcrl"), ("PGSSLCRLDIR", "sslcrldir"), ("COFFER_STATE_DIR", "")
    ]

    /// In the daemon (started with --ready-fd): makes those variables absolute against the launcher's working
    /// directory (with the exceptions of `PostgresLocation.absoluteFile`), so they still name the same files
    /// after `leaveWorkingDirectory`. Runs first thing in main, before any thread could read the environment
    /// while it changes.
    static func makeInheritedPathsAbsolute(_ argv: [String]) {
        guard argv.contains("--ready-fd") else { return }
        for (name, key) in pathVariables {
            guard let value = getenv(name).map({ String(cString: $0) }), let absolute = PostgresLocation.absoluteFile(key, value) else { continue }
            setenv(name, absolute, 1)
        }
    }

    /// In the daemon, once it serves: moves to "/", as daemon(3) and libfuse's fuse_daemonize do, so the
    /// directory `coffer mount` was run from (another mount, a USB stick) is not kept busy for as long as
    /// the mount lives (`umount` of it said "target is busy"). Every path the daemon still needs is
    /// absolute by then: the container and mountpoint (argv), libpq's files (`PostgresLocation`, above).
    static func leaveWorkingDirectory() {
        _ = chdir("/")
    }
}

/// The daemon's side of the readiness pipe.
final class ReadyPipe: @unchecked Sendable {
    private var fd: Int32
    private let lock = NSLock()
    init(_ fd: Int32) { self.fd = fd }

    func succeed() { send("OK\n") }
    func fail(_ failure: CLIFailure) { send("ERR \(failure.code) \(failure.message)\n") }

    private func send(_ text: String) {
        lock.lock()
        defer { lock.unlock() }
        guard fd >= 0 else { return }
        _ = text.withCString { Glibc.write(fd, $0, strlen($0)) }
        close(fd)
        fd = -1
    }
}
