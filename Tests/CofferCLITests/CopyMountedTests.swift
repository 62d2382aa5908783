import CofferTestSupport
import Foundation
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// `coffer copy` of a mounted directory container: its daemon writes a snapshot through its control socket.
extension CopyTests {
    /// Writes files into `dir` one after another, each fsynced; remembers those that were.
    final class Writer: @unchecked Sendable {
        let dir: String
        private let lock = NSLock()
        private var files: [String: [UInt8]] = [:]
        private var stopping = false, failure: String?
        private let done = DispatchSemaphore(value: 0)

        init(_ dir: String) { self.dir = dir }

        var synced: [String: [UInt8]] { lock.withLock { files } }
        var error: String? { lock.withLock { failure } }

        func start() {
            Thread.detachNewThread { [self] in
                var i = 0
                while !lock.withLock({ stopping }) {
                    let name = "w\(i).bin", bytes = E2E.randomBytes(1 + Int.random(in: 0..<200_000))
                    let fd = open(dir + "/" + name, O_WRONLY | O_CREAT | O_TRUNC, 0o644)
                    let ok = fd >= 0 && bytes.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) } == bytes.count && fsync(fd) == 0
                    if fd >= 0 { close(fd) }
                    lock.withLock { if ok { files[name] = bytes } else { failure = "\(name): errno \(errno)" } }
                    if !ok { break }
                    i += 1
                }
                done.signal()
            }
        }

        func stop() {
            let first = lock.withLock { () -> Bool in
                defer { stopping = true }
                return !stopping
            }
            if first { done.wait() }
        }
    }

    /// The daemon's control socket, in the runtime or state directory the daemon was given.
    static func controlSocket(pid: pid_t, stateDirectory: String = E2E.stateDirectory) -> String? {
        var dirs = [stateDirectory + "/run"]
        if let r = ProcessInfo.processInfo.environment["XDG_RUNTIME_DIR"], r.hasPrefix("/") { dirs.insert(r + "/coffer", at: 0) }
        for d in dirs {
            if let f = (try? FileManager.default.contentsOfDirectory(atPath: d))?.first(where: { $0.hasSuffix("-\(pid).sock") }) {
                return d + "/" + f
            }
        }
        return nil
    }

    @Test func mountedSourceIsCopiedFromASnapshotItsDaemonWrites() throws {
        let sb = try Sandbox("copymounted")
        defer { sb.cleanup() }
        try sb.initAndMount()
        let pid = try #require(E2E.daemonPid(container: sb.container))
        let socket = try #require(Self.controlSocket(pid: pid), "the daemon serves a control socket")
        #expect(E2E.lstatOf(socket).map { $0.st_mode & 0o777 } == 0o600)
        try #require(mkdir(sb.mnt + "/w", 0o755) == 0)
        let writer = Writer(sb.mnt + "/w")
        writer.start()
        defer { writer.stop() }
        try #require(E2E.wait(60) { writer.synced.count >= 20 }, "the writer writes: \(writer.error ?? "")")

        let before = writer.synced  // fsynced before the copy started
        let copy = sb.root + "/copy"
        let r = Self.copy([sb.container, copy, "--verify", "--passfile", sb.passfile])
        #expect(r.ok && r.stdout.contains("copied") && r.stdout.contains("verified:"), "\(r)")
        let after = writer.synced.count
        #expect(E2E.wait(30) { writer.synced.count > after + 5 }, "the mount keeps working after the copy: \(writer.error ?? "")")
        writer.stop()
        #expect(writer.error == nil, "\(writer.error ?? "")")
        let left = (try? FileManager.default.contentsOfDirectory(atPath: sb.root))?.filter { $0.hasPrefix(".coffer-snapshot-") }
        #expect(left == [], "the snapshot is removed")
        Self.fsckClean(sb, copy)

        #expect(sb.unmount().ok)
        #expect(E2E.lstatOf(socket) == nil, "the socket goes at unmount")
        // The copy is an older state than the one this machine has seen since: mounted read-only as a backup.
        let mnt = sb.root + "/restore"
        try #require(mkdir(mnt, 0o755) == 0)
        let m = sb.mount(container: copy, at: mnt, options: "ro,allow_rollback")
        try #require(m.ok, "\(m)")
        defer { _ = sb.unmount(mnt) }
        for (name, bytes) in before { #expect(E2E.read(mnt + "/w/" + name) == bytes, "\(name) (fsynced before the copy) in the copy") }

        // A missing source is said before any password is asked.
        let missing = E2E.onTerminal([E2E.coffer, "copy", sb.root + "/missing", sb.root + "/x", "--verify"], answers: [])
        #expect(missing.status == 10 && !missing.stdout.contains("assword: ") && access(sb.root + "/x", F_OK) != 0, "\(missing)")
    }

    /// The daemon's own peer check (SO_PEERCRED) refuses another user even when the socket's mode lets
    /// them connect; a daemon without a socket (an older version) keeps the refusal to copy.
    @Test func controlSocketRefusesAnotherUser() throws {
        let sb = try Sandbox("copyuid")
        defer { sb.cleanup() }
        try #require(sb.initContainer().ok)
        var env = ProcessInfo.processInfo.environment
        env["COFFER_STATE_DIR"] = sb.root + "/state"
        env["XDG_RUNTIME_DIR"] = nil
        let m = E2E.run(E2E.coffer, ["mount", sb.container, sb.mnt, "--passfile", sb.passfile], environment: env)
        sb.noteDaemon()
        try #require(m.ok, "\(m)")
        defer { _ = sb.unmount() }
        try E2E.write(sb.mnt + "/f.txt", "data")
        let pid = try #require(E2E.daemonPid(container: sb.container))
        let socket = try #require(Self.controlSocket(pid: pid, stateDirectory: sb.root + "/state"))
        for d in [sb.root, sb.root + "/state", sb.root + "/state/run"] { try #require(chmod(d, 0o711) == 0) }
        try #require(chmod(socket, 0o666) == 0)

        let ask =
            "import socket, sys\ns = socket.socket(socket.AF_UNIX)\ns.connect(sys.argv[1])\n"
            + "s.sendall(('snapshot ' + sys.argv[2] + '\\n').encode())\nprint(s.makefile().readline(), end='')"
        let target = sb.root + "/stolen.db"
        let nobody = E2E.run("/usr/sbin/runuser", ["-u", "nobody", "--", "/usr/bin/python3", "-c", ask, socket, target])
        #expect(nobody.ok && nobody.stdout.hasPrefix("ERR permission denied"), "\(nobody)")
        #expect(access(target, F_OK) != 0, "nothing written for another user")
        let root = E2E.run("/usr/bin/python3", ["-c", ask, socket, target])
        #expect(root.stdout == "OK\n" && E2E.statOf(target).map { $0.st_mode & 0o777 } == 0o600, "\(root)")
        let again = E2E.run("/usr/bin/python3", ["-c", ask, socket, target])
        #expect(again.stdout.hasPrefix("ERR") && again.stdout.contains("exists"), "an existing file is never overwritten: \(again)")
        let relative = E2E.run("/usr/bin/python3", ["-c", ask, socket, "x.db"])
        #expect(relative.stdout.hasPrefix("ERR") && relative.stdout.contains("absolute"), "\(relative)")

        unlink(socket)
        let refused = Self.copy([sb.container, sb.root + "/copy"])
        #expect(
            refused.status == 15 && refused.stderr.contains("container is mounted (pid") && refused.stderr.contains("unmount it first"), "\(refused)")
        #expect(access(sb.root + "/copy", F_OK) != 0, "nothing was created")
        #expect(E2E.readText(sb.mnt + "/f.txt") == "data")
    }
}
