import CofferFUSE
import CofferTestSupport
import Foundation
import Testing

#if canImport(Glibc)
    import Glibc
#endif

// End-to-end support: drives the built `coffer` binary (and ordinary tools) as child processes (posix_spawn, see `run`).
// Every test gets its own sandbox directory under /tmp; every mount made inside a sandbox is undone
// by `Sandbox.cleanup()` (fusermount3 -u, then -uz), which every mounting test runs in a `defer`.

/// The outcome of one command.
struct RunResult: CustomStringConvertible {
    let status: Int32
    let stdout: String
    let stderr: String
    let timedOut: Bool
    let command: String

    var ok: Bool { status == 0 && !timedOut }
    var description: String {
        "`\(command)` -> status \(status)\(timedOut ? " (timed out)" : "")\nstdout: \(stdout.prefix(2000))\nstderr: \(stderr.prefix(2000))"
    }
    /// Non-empty lines of stderr.
    var stderrLines: [Substring] { stderr.split(separator: "\n", omittingEmptySubsequences: true) }
}

enum E2E {
    /// The `coffer` executable built next to the running test bundle.
    static let coffer: String = locateCoffer()

    static let fuseAvailable: Bool = {
        if access("/dev/fuse", R_OK | W_OK) == 0 { return true }
        print("CofferCLITests: /dev/fuse is not usable (\(String(cString: strerror(errno)))): mount tests are skipped")
        return false
    }()

    static var isRoot: Bool { geteuid() == 0 }

    static func locateCoffer() -> String {
        if let env = ProcessInfo.processInfo.environment["COFFER_BIN"], isExecutableFile(env) { return env }
        var starts: [String] = []
        if let exe = try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe") { starts.append(exe) }
        starts.append(Bundle.main.bundleURL.path)
        if let e = Bundle.main.executableURL?.path { starts.append(e) }
        starts.append(CommandLine.arguments.first ?? "")
        for start in starts where !start.isEmpty {
            var dir = URL(fileURLWithPath: start).standardizedFileURL
            for _ in 0..<6 {
                let candidate = dir.appendingPathComponent("coffer").path
                if isExecutableFile(candidate) { return candidate }
                dir = dir.deletingLastPathComponent()
                if dir.path == "/" { break }
            }
        }
        return "/nonexistent/coffer"
    }

    static func isExecutableFile(_ path: String) -> Bool {
        var st = stat()
        guard stat(path, &st) == 0, (st.st_mode & S_IFMT) == S_IFREG else { return false }
        return access(path, X_OK) == 0
    }

    static func which(_ tool: String) -> String? {
        for dir in ["/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"] {
            let p = dir + "/" + tool
            if isExecutableFile(p) { return p }
        }
        let r = run("/bin/sh", ["-c", "command -v \(tool)"])
        let p = r.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        return r.ok && !p.isEmpty ? p : nil
    }

    static let python: String? = which("python3")

    /// Runs a program with stdout/stderr captured in files and waits for it with waitpid (polling, with a
    /// timeout after which the child, and only the child, is SIGKILLed).
    ///
    /// Not Foundation's `Process`: on Linux it learns of a child's exit when a socket shared with the child
    /// closes, and with tests running in parallel that socket leaks into concurrently spawned `coffer mount`
    /// launchers and from them into their daemons (which keep inherited descriptors), so a `coffer mount`
    /// that had exited long ago was never seen to end. posix_spawn with file actions opens the capture files
    /// in the child only, and waitpid does not depend on any descriptor.
    @discardableResult
    static func run(
        _ executable: String, _ arguments: [String], stdin: String? = nil,
        environment: [String: String]? = nil, timeout: TimeInterval = 90
    ) -> RunResult {
        let command = ([executable] + arguments).joined(separator: " ")
        let tag = "/tmp/coffer-e2e-io-\(getpid())-\(UUID().uuidString)"
        let outPath = tag + ".out", errPath = tag + ".err", inPath = tag + ".in"
        defer { for p in [outPath, errPath, inPath] { unlink(p) } }
        if let stdin { _ = FileManager.default.createFile(atPath: inPath, contents: Data(stdin.utf8)) }
        guard
            let child = Spawned(
                executable, arguments, stdinPath: stdin == nil ? "/dev/null" : inPath,
                stdoutPath: outPath, stderrPath: errPath, environment: environment)
        else {
            return RunResult(
                status: -1, stdout: "", stderr: "cannot start \(executable): \(String(cString: strerror(errno)))", timedOut: false, command: command)
        }
        let status = child.wait(timeout: timeout)
        let stdout = readText(outPath) ?? ""
        let stderr = readText(errPath) ?? ""
        return RunResult(status: status ?? 137, stdout: stdout, stderr: stderr, timedOut: status == nil, command: command)
    }

    @discardableResult
    static func coffer(_ arguments: [String], stdin: String? = nil, timeout: TimeInterval = 60) -> RunResult {
        run(coffer, arguments, stdin: stdin, timeout: timeout)
    }

    @discardableResult
    static func sh(_ script: String, timeout: TimeInterval = 120) -> RunResult {
        run("/bin/sh", ["-c", script], timeout: timeout)
    }

    /// Runs a python3 program (skipping is the caller's business when python3 is missing).
    @discardableResult
    static func py(_ program: String, _ arguments: [String] = [], timeout: TimeInterval = 120) -> RunResult {
        run(python ?? "/usr/bin/python3", ["-c", program] + arguments, timeout: timeout)
    }

    /// Drives `command` on a pseudo-terminal: waits for each prompt (and for echo to be off) before typing
    /// its answer, then prints everything the program wrote and exits with its status.
    static func onTerminal(_ command: [String], answers: [(prompt: String, answer: String)], timeout: TimeInterval = 60) -> RunResult {
        let program = #"""
            import os, pty, sys, time, select, termios
            sep = sys.argv.index('--')
            pairs = sys.argv[1:sep]
            cmd = sys.argv[sep + 1:]
            pid, fd = pty.fork()
            if pid == 0:
                os.execv(cmd[0], cmd)
            out = b''
            def pump(deadline):
                global out
                r, _, _ = select.select([fd], [], [], max(0.0, min(0.05, deadline - time.time())))
                if r:
                    try:
                        d = os.read(fd, 4096)
                    except OSError:
                        d = b''
                    if not d:
                        return False
                    out += d
                return True
            seen = 0
            for i in range(0, len(pairs), 2):
                prompt, answer = pairs[i].encode(), pairs[i + 1].encode()
                deadline = time.time() + 30
                while out.find(prompt, seen) < 0:
                    if time.time() > deadline or not pump(deadline):
                        sys.stdout.write(out.decode(errors='replace'))
                        sys.stdout.write('\n<<no prompt %r>>\n' % prompt)
                        os.kill(pid, 9); os.waitpid(pid, 0)
                        sys.exit(99)
                seen = out.find(prompt, seen) + len(prompt)
                # The program turns echo off (flushing input) after writing the prompt: type only after that.
                while termios.tcgetattr(fd)[3] & termios.ECHO:
                    if time.time() > deadline:
                        break
                    pump(deadline)
                time.sleep(0.05)
                os.write(fd, answer + b'\n')
            deadline = time.time() + 60
            while pump(deadline) and time.time() < deadline:
                pass
            _, status = os.waitpid(pid, 0)
            sys.stdout.write(out.decode(errors='replace'))
            sys.exit(os.waitstatus_to_exitcode(status) & 0xff)
            """#
        var args: [String] = []
        for a in answers { args += [a.prompt, a.answer] }
        return run(python ?? "/usr/bin/python3", ["-c", program] + args + ["--"] + command, timeout: timeout)
    }

    // MARK: files

    static func randomBytes(_ count: Int) -> [UInt8] {
        var g = SystemRandomNumberGenerator()
        var bytes = [UInt8](repeating: 0, count: count)
        var i = 0
        while i < count {
            var v = g.next()
            withUnsafeBytes(of: &v) { raw in
                for b in raw where i < count {
                    bytes[i] = b
                    i += 1
                }
            }
        }
        return bytes
    }

    static func write(_ path: String, _ bytes: [UInt8]) throws {
        try Data(bytes).write(to: URL(fileURLWithPath: path))
    }

    static func write(_ path: String, _ text: String) throws {
        try Data(text.utf8).write(to: URL(fileURLWithPath: path))
    }

    static func read(_ path: String) -> [UInt8]? {
        guard let d = FileManager.default.contents(atPath: path) else { return nil }
        return [UInt8](d)
    }

    static func readText(_ path: String) -> String? {
        read(path).map { String(decoding: $0, as: UTF8.self) }
    }

    static func lstatOf(_ path: String) -> stat? {
        var st = stat()
        return lstat(path, &st) == 0 ? st : nil
    }

    static func statOf(_ path: String) -> stat? {
        var st = stat()
        return stat(path, &st) == 0 ? st : nil
    }

    /// Every regular file under `dir` (relative paths) with its bytes.
    static func snapshot(_ dir: String) -> [String: [UInt8]] {
        var result: [String: [UInt8]] = [:]
        guard let e = FileManager.default.enumerator(atPath: dir) else { return result }
        while let rel = e.nextObject() as? String {
            let p = dir + "/" + rel
            if let st = lstatOf(p), (st.st_mode & S_IFMT) == S_IFREG { result[rel] = read(p) }
        }
        return result
    }

    // MARK: mounts

    struct MountEntry {
        let source: String
        let mountpoint: String
        let type: String
        let options: String
    }

    static func mountTable() -> [MountEntry] {
        guard let text = try? String(contentsOfFile: "/proc/mounts", encoding: .utf8) else { return [] }
        return text.split(separator: "\n").compactMap { line in
            let f = line.split(separator: " ")
            guard f.count >= 4 else { return nil }
            return MountEntry(
                source: MountInfo.unescape(String(f[0])), mountpoint: MountInfo.unescape(String(f[1])), type: String(f[2]), options: String(f[3]))
        }
    }

    static func mountEntry(at path: String) -> MountEntry? {
        mountTable().last { $0.mountpoint == path }
    }

    static func isMounted(_ path: String) -> Bool { mountEntry(at: path) != nil }

    /// The device of `path` (stat), nil when stat fails.
    static func device(_ path: String) -> UInt64? {
        statOf(path).map { UInt64($0.st_dev) }
    }

    /// True when `path` answers as the root of its own filesystem.
    static func answersAsMount(_ path: String) -> Bool {
        guard let d = device(path), let parent = device((path as NSString).deletingLastPathComponent) else { return false }
        return d != parent
    }

    /// The daemon holding the container's lock: an flock on the container directory, in the kernel's lock table
    /// (/proc/locks lines read `1: FLOCK  ADVISORY  WRITE PID MAJ:MIN:INODE 0 EOF`): a holder of a lock on
    /// the directory's inode that has the directory open.
    static func daemonPid(container: String) -> pid_t? {
        if TestEngine.isURI(container) { return TestEngine.daemonPid(uri: container) }
        guard let st = statOf(container), let table = readText("/proc/locks") else { return nil }
        let path = (container as NSString).standardizingPath
        for line in table.split(separator: "\n") {
            let f = line.split(separator: " ")
            guard f.count >= 6, f[1] == "FLOCK", f[5].split(separator: ":").last == Substring(String(st.st_ino)),
                let pid = pid_t(f[4])
            else { continue }
            let fds = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/fd")) ?? []
            if fds.contains(where: { (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/\(pid)/fd/\($0)")) == path }) {
                return pid
            }
        }
        return nil
    }

    /// The rollback ledger of every coffer the tests run (`COFFER_STATE_DIR`, set in each child's environment
    /// unless the test sets it): never the user's ~/.local/state/coffer. Removed when the test process exits;
    /// one left by a run that did not exit normally (its pid in the name is gone) is removed by the next run.
    static let stateDirectory: String = {
        let prefix = "coffer-e2e-state-"
        for name in (try? FileManager.default.contentsOfDirectory(atPath: "/tmp")) ?? [] where name.hasPrefix(prefix) {
            if let pid = pid_t(name.dropFirst(prefix.count).prefix { $0 != "-" }), !isAlive(pid) {
                try? FileManager.default.removeItem(atPath: "/tmp/" + name)
            }
        }
        var template = Array("/tmp/\(prefix)\(getpid())-XXXXXX".utf8CString)
        let dir = template.withUnsafeMutableBufferPointer { mkdtemp($0.baseAddress!) }.map { String(cString: $0) }
        atexit { E2E.removeStateDirectory() }
        return dir ?? "/tmp/\(prefix)\(getpid())"
    }()

    static func removeStateDirectory() {
        try? FileManager.default.removeItem(atPath: stateDirectory)
    }

    /// A process that exists and is not a zombie, nor is any of its threads: a killed daemon's main
    /// thread shows Z while another is still leaving (say, in a write to a slow disk), and until the
    /// last one has left its files, and so its container's lock, are still held (CI: an fsck right
    /// after a SIGKILL found the container "mounted" by the killed pid).
    static func isAlive(_ pid: pid_t) -> Bool {
        guard kill(pid, 0) == 0 || errno == EPERM else { return false }
        let tasks = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/task")) ?? ["\(pid)"]
        return tasks.contains { task in
            guard let stat = readText("/proc/\(pid)/task/\(task)/stat") ?? readText("/proc/\(pid)/stat"),
                let close = stat.lastIndex(of: ")")
            else { return false }
            let state = stat[stat.index(after: close)...].trimmingCharacters(in: .whitespaces).first
            return state != "Z" && state != "X"
        }
    }

    static func cmdline(_ pid: pid_t) -> [String] {
        guard let bytes = read("/proc/\(pid)/cmdline") else { return [] }
        return bytes.split(separator: 0, omittingEmptySubsequences: false).map { String(decoding: $0, as: UTF8.self) }
    }

    /// Waits up to `seconds` for `condition`.
    @discardableResult
    static func wait(_ seconds: Double, _ condition: () -> Bool) -> Bool { waitUntil(seconds, condition) }

    /// Unmounts `path` if mounted: fusermount3 -u, then -uz when that did not work.
    static func forceUnmount(_ path: String) {
        guard isMounted(path) else { return }
        run("/bin/fusermount3", ["-u", path], timeout: 30)
        if isMounted(path) { run("/bin/fusermount3", ["-u", path], timeout: 30) }
        if isMounted(path) { run("/bin/fusermount3", ["-uz", path], timeout: 30) }
        if isMounted(path) { run("/bin/umount", ["-l", path], timeout: 30) }
    }
}

/// A fresh directory under /tmp for one test: container `c` (with COFFER_TEST_ENGINE=postgres a URI to
/// a fresh schema instead: TestEngine), mountpoint `m`, password file `pass`.
final class Sandbox: @unchecked Sendable {
    let root: String
    let password: String
    /// The container's directory or URI (a test of a PostgreSQL container may point it at its own URI).
    var container: String
    /// The container is a directory (`c`): tests of files in it need one.
    var isDirectoryContainer: Bool { !TestEngine.isURI(container) }
    var mnt: String { root + "/m" }
    var passfile: String { root + "/pass" }
    /// Daemons this sandbox saw (holding the container's lock), waited for at cleanup.
    private var daemons: [pid_t] = []
    private let lock = NSLock()

    static let kdfArgs = ["--kdf", "scrypt", "--scrypt-logn", "16"]

    init(_ label: String = "t") throws {
        var template = Array("/tmp/coffer-e2e-\(label.filter { $0.isLetter || $0.isNumber }.prefix(24))-XXXXXX".utf8CString)
        guard let p = template.withUnsafeMutableBufferPointer({ mkdtemp($0.baseAddress!) }) else {
            throw SandboxError("mkdtemp failed: \(String(cString: strerror(errno)))")
        }
        root = String(cString: p)
        container = TestEngine.isPostgres ? try TestEngine.freshURI() : root + "/c"
        password = "pw-\(UUID().uuidString.prefix(12))"
        guard mkdir(root + "/m", 0o755) == 0 else { throw SandboxError("mkdir m failed") }
        try E2E.write(root + "/pass", password + "\n")
    }

    struct SandboxError: Error, CustomStringConvertible {
        let description: String
        init(_ d: String) { description = d }
    }

    /// `coffer init c --passfile pass` with the fast test KDF.
    @discardableResult
    func initContainer(_ extra: [String] = [], container: String? = nil) -> RunResult {
        E2E.coffer(["init", container ?? self.container, "--passfile", passfile] + Sandbox.kdfArgs + extra)
    }

    /// `coffer mount c m --passfile pass [-o opts]`; remembers the daemon for cleanup.
    @discardableResult
    func mount(
        container: String? = nil, at mountpoint: String? = nil, options: String? = nil, passfile: String? = nil,
        timeout: TimeInterval = 60
    ) -> RunResult {
        var args = ["mount", container ?? self.container, mountpoint ?? mnt]
        if let passfile { args += ["--passfile", passfile] } else if options?.contains("passfile=") != true { args += ["--passfile", self.passfile] }
        if let options { args += ["-o", options] }
        let r = E2E.coffer(args, timeout: timeout)
        noteDaemon(container: container ?? self.container)
        return r
    }

    func noteDaemon(container: String? = nil) {
        if let pid = E2E.daemonPid(container: container ?? self.container), E2E.isAlive(pid) {
            lock.lock()
            daemons.append(pid)
            lock.unlock()
        }
    }

    /// A path to the coffer binary without any "." in it, for `fuse./abs/path` types: libmount cuts the type's
    /// ".subtype" at the LAST dot of the helper path, so a dot anywhere in the path (".build") hides mount.fuse3.
    func dotFreeCoffer() throws -> String {
        let dir = root + "/bin"
        if !FileManager.default.fileExists(atPath: dir) { try #require(mkdir(dir, 0o755) == 0) }
        let path = dir + "/coffer"
        if E2E.lstatOf(path) == nil { try #require(symlink(E2E.coffer, path) == 0, "symlink: \(errno)") }
        try #require(!path.contains("."), "sandbox path \(path) has a dot")
        return path
    }

    /// `mount -t fuse./PATH/coffer SOURCE m -o passfile=pass[,OPTIONS]`: mount(8), through mount.fuse3.
    @discardableResult
    func mountWithMount8(source: String? = nil, options: String = "") throws -> RunResult {
        let exe = try dotFreeCoffer()
        let extra = options.isEmpty ? "" : "," + options
        let r = E2E.run("/bin/mount", ["-t", "fuse." + exe, source ?? container, mnt, "-o", "passfile=\(passfile)" + extra])
        noteDaemon(container: source)
        return r
    }

    /// `coffer unmount m`.
    @discardableResult
    func unmount(_ mountpoint: String? = nil) -> RunResult {
        E2E.coffer(["unmount", mountpoint ?? mnt])
    }

    /// Creates and mounts a fresh container; throws (failing the test) when either step fails.
    func initAndMount(options: String? = nil, initArgs: [String] = []) throws {
        let i = initContainer(initArgs)
        try #require(i.ok, "init failed: \(i)")
        let m = mount(options: options)
        try #require(m.ok, "mount failed: \(m)")
        try #require(E2E.isMounted(mnt), "not in /proc/mounts after mount returned")
    }

    /// Runs `script` (sh) in a private mount namespace whose /dev/fuse everyone may use, so commands run
    /// as `$AS_NOBODY COMMAND` (uid and gid 65534) mount through the setuid fusermount3 as an ordinary
    /// user would; nothing outside sees those mounts. The sandbox's root is given to nobody first;
    /// COFFER_STATE_DIR is `root/state`. Root only; status 90: the namespace could not be set up.
    func runUnprivileged(_ script: String, timeout: TimeInterval = 120) throws -> RunResult {
        try #require(E2E.run("/bin/chown", ["-R", "65534:65534", root]).ok)
        let prelude = """
            mknod \(root)/fuse c 10 229 && chmod 666 \(root)/fuse && mount --bind \(root)/fuse /dev/fuse || exit 90
            export COFFER_STATE_DIR=\(root)/state
            AS_NOBODY="setpriv --reuid=65534 --regid=65534 --clear-groups"

            """
        return E2E.run(E2E.which("unshare") ?? "unshare", ["-m", "--propagation", "private", "/bin/sh", "-c", prelude + script], timeout: timeout)
    }

    /// `coffer mount -f` of the container (with `-o options`, the daemon's log at `logLevel`, and `environment`
    /// entries NAME=VALUE for it), once the mount answers.
    func foregroundMount(options: String? = nil, logLevel: String = "notice", environment: [String] = []) throws -> Child {
        let args = ["mount", "-f", "--log-level", logLevel, container, mnt, "--passfile", passfile] + (options.map { ["-o", $0] } ?? [])
        let daemon = try Child("/usr/bin/env", environment + [E2E.coffer] + args)
        guard E2E.wait(30, { E2E.answersAsMount(mnt) }) else {
            daemon.stop()
            throw SandboxError("the mount did not come up: \(daemon.stderr)")
        }
        return daemon
    }

    /// A tmpfs of `size` (mount(8)'s form: "24m") at `root/name`, for full-disk tests (root only).
    /// `cleanup` unmounts it after the mounts made on top of it.
    func smallDisk(_ size: String, name: String = "disk") throws -> String {
        let disk = root + "/" + name
        try #require(mkdir(disk, 0o700) == 0)
        let tmpfs = E2E.sh("mount -t tmpfs -o size=\(size) tmpfs '\(disk)'")
        try #require(tmpfs.ok, "\(tmpfs)")
        return disk
    }

    /// Unmounts and mounts again at `at` (default: the same mountpoint).
    func remount(at: String? = nil, options: String? = nil) throws {
        let u = unmount()
        try #require(u.ok, "unmount failed: \(u)")
        try #require(!E2E.isMounted(mnt), "still mounted after coffer unmount")
        let m = mount(at: at, options: options)
        try #require(m.ok, "remount failed: \(m)")
    }

    /// Every mount under the sandbox is removed; daemons seen get a moment to exit; the directory goes
    /// only when nothing is mounted under it any more.
    func cleanup() {
        for entry in E2E.mountTable().reversed() where entry.mountpoint.hasPrefix(root + "/") || entry.source.hasPrefix(root + "/") {
            E2E.forceUnmount(entry.mountpoint)
        }
        lock.lock()
        let seen = daemons
        lock.unlock()
        for pid in Set(seen) { E2E.wait(10) { !E2E.isAlive(pid) } }
        let stillMounted = E2E.mountTable().contains { $0.mountpoint.hasPrefix(root + "/") }
        if !stillMounted {
            E2E.run("/bin/rm", ["-rf", "--one-file-system", root], timeout: 120)
        } else {
            print("CofferCLITests: leaving \(root) in place: something is still mounted under it")
        }
    }
}

/// A child started with posix_spawn: stdin/stdout/stderr opened from paths in the child, every other descriptor
/// closed in the child, reaped with waitpid.
final class Spawned: @unchecked Sendable {
    let pid: pid_t
    private var status: Int32?
    private let lock = NSLock()

    init?(
        _ executable: String, _ arguments: [String], stdinPath: String, stdoutPath: String, stderrPath: String,
        environment: [String: String]? = nil
    ) {
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 0, stdinPath, O_RDONLY, 0)
        posix_spawn_file_actions_addopen(&actions, 1, stdoutPath, O_WRONLY | O_CREAT | O_TRUNC, 0o600)
        posix_spawn_file_actions_addopen(&actions, 2, stderrPath, O_WRONLY | O_CREAT | O_TRUNC, 0o600)
        Self.closeFrom(&actions, 3)
        var attr = posix_spawnattr_t()
        posix_spawnattr_init(&attr)
        defer { posix_spawnattr_destroy(&attr) }
        // Default signal dispositions and an empty mask in the child, whatever the test runner uses.
        var all = sigset_t(), none = sigset_t()
        sigfillset(&all)
        sigemptyset(&none)
        posix_spawnattr_setsigdefault(&attr, &all)
        posix_spawnattr_setsigmask(&attr, &none)
        posix_spawnattr_setflags(&attr, Int16(POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK))
        let argv: [UnsafeMutablePointer<CChar>?] = ([executable] + arguments).map { strdup($0) } + [nil]
        defer { for p in argv { free(p) } }
        var env = environment ?? ProcessInfo.processInfo.environment
        if env["COFFER_STATE_DIR"] == nil { env["COFFER_STATE_DIR"] = E2E.stateDirectory }
        let envStrings = env.map { "\($0.key)=\($0.value)" }
        let envp: [UnsafeMutablePointer<CChar>?] = envStrings.map { strdup($0) } + [nil]
        defer { for p in envp { free(p) } }
        var pid: pid_t = 0
        let rc = posix_spawn(&pid, executable, &actions, &attr, argv, envp)
        guard rc == 0 else {
            errno = rc
            return nil
        }
        self.pid = pid
    }

    /// glibc's posix_spawn_file_actions_addclosefrom_np (2.34+), which the Glibc module does not show; without it,
    /// every descriptor open now except 0-2 is closed by name (racy against descriptors opened meanwhile).
    private static func closeFrom(_ actions: inout posix_spawn_file_actions_t, _ low: Int32) {
        typealias CloseFrom = @convention(c) (UnsafeMutablePointer<posix_spawn_file_actions_t>, Int32) -> Int32
        if let sym = dlsym(nil, "posix_spawn_file_actions_addclosefrom_np") {
            let f = unsafeBitCast(sym, to: CloseFrom.self)
            if f(&actions, low) == 0 { return }
        }
        for name in (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd")) ?? [] {
            if let fd = Int32(name), fd >= low { posix_spawn_file_actions_addclose(&actions, fd) }
        }
    }

    /// Exit status (128+signal when killed), nil when still running.
    func poll() -> Int32? {
        lock.lock()
        defer { lock.unlock() }
        if let status { return status }
        var st: Int32 = 0
        let r = waitpid(pid, &st, WNOHANG)
        guard r == pid else { return nil }
        let sig = st & 0x7f
        status = sig == 0 ? (st >> 8) & 0xff : 128 + sig
        return status
    }

    var isRunning: Bool { poll() == nil }

    /// Signals the child only while it is not reaped (so its pid cannot have been reused).
    @discardableResult
    func signal(_ sig: Int32) -> Bool {
        lock.lock()
        defer { lock.unlock() }
        guard status == nil else { return false }
        return kill(pid, sig) == 0
    }

    /// Waits up to `timeout` seconds; then SIGKILLs the child and returns nil.
    func wait(timeout: TimeInterval) -> Int32? {
        let deadline = Date().addingTimeInterval(timeout)
        var sleep: useconds_t = 1_000
        while Date() < deadline {
            if let s = poll() { return s }
            usleep(sleep)
            sleep = min(sleep * 2, 20_000)
        }
        if let s = poll() { return s }
        kill(pid, SIGKILL)
        while poll() == nil { usleep(5_000) }
        return nil
    }
}
