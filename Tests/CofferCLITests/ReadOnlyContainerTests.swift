import Foundation
import Testing

#if canImport(Glibc)
    import Glibc
#endif

// Issue 5, "Surviving faults": a container that cannot be written. The tests show the container through a
// read-only bind mount, which refuses writes even to root (root ignores permission bits, so chmod would
// prove nothing here).

@Suite(
    "Read-only container directory",
    .enabled(if: E2E.fuseAvailable, "/dev/fuse is not usable"),
    .enabled(if: E2E.isRoot, "a read-only bind mount needs root"))
struct ReadOnlyContainerTests {
    /// A read-only view of `sb.container` at `sb.root/NAME`; the caller unmounts it (`unbind`).
    func bindReadOnly(_ sb: Sandbox, at name: String = "ro") throws -> String {
        let ro = sb.root + "/" + name
        try #require(mkdir(ro, 0o700) == 0)
        let b = E2E.run("/bin/mount", ["--bind", "-o", "ro", sb.container, ro])
        try #require(b.ok, "\(b)")
        // The view really is read-only, for root too.
        let probe = open(ro + "/probe", O_WRONLY | O_CREAT, 0o600)
        let probeErrno = errno
        if probe >= 0 { close(probe) }
        try #require(probe < 0 && probeErrno == EROFS, "the bind mount is writable (errno \(probeErrno))")
        return ro
    }

    func unbind(_ ro: String) {
        if E2E.isMounted(ro) { E2E.run("/bin/umount", [ro]) }
        if E2E.isMounted(ro) { E2E.run("/bin/umount", ["-l", ro]) }
    }

    /// `coffer` with its rollback ledger in the sandbox, to see what a mount records.
    func coffer(_ sb: Sandbox, _ arguments: [String]) -> RunResult {
        var env = ProcessInfo.processInfo.environment
        env["COFFER_STATE_DIR"] = sb.root + "/state"
        return E2E.run(E2E.coffer, arguments, environment: env, timeout: 60)
    }

    @Test func mountsReadOnlyWithANoticeAndReadsBack() throws {
        let sb = try Sandbox("rocontainer")
        defer { sb.cleanup() }
        try sb.initAndMount()
        let big = E2E.randomBytes(200_000)
        try E2E.write(sb.mnt + "/big.bin", big)
        try FileManager.default.createDirectory(atPath: sb.mnt + "/dir", withIntermediateDirectories: false)
        try E2E.write(sb.mnt + "/dir/small.txt", "small")
        try #require(sb.unmount().ok)
        let storeBefore = E2E.read(sb.container + "/store.db")

        let ro = try bindReadOnly(sb)
        defer { unbind(ro) }
        let m = coffer(sb, ["mount", ro, sb.mnt, "--passfile", sb.passfile])
        try #require(m.ok, "a read-only container must mount (read-only): \(m)")
        #expect(m.stderrLines.count == 1 && m.stderr.contains("mounting read-only"), "one notice line: \(m)")
        let entry = try #require(E2E.mountEntry(at: sb.mnt))
        #expect(entry.options.split(separator: ",").contains("ro"), "the mount is not read-only: \(entry.options)")
        #expect(E2E.read(sb.mnt + "/big.bin") == big, "a multi-chunk file reads back")
        #expect(E2E.readText(sb.mnt + "/dir/small.txt") == "small")

        let fd = open(sb.mnt + "/new.txt", O_WRONLY | O_CREAT, 0o644)
        let createErrno = errno
        if fd >= 0 { close(fd) }
        #expect(fd < 0 && createErrno == EROFS, "creating a file: errno \(createErrno), want EROFS")
        let wfd = open(sb.mnt + "/big.bin", O_WRONLY)
        let writeErrno = errno
        if wfd >= 0 { close(wfd) }
        #expect(wfd < 0 && writeErrno == EROFS, "opening for writing: errno \(writeErrno), want EROFS")
        let made = mkdir(sb.mnt + "/d2", 0o755)
        let mkdirErrno = errno
        #expect(made != 0 && mkdirErrno == EROFS, "mkdir: errno \(mkdirErrno), want EROFS")

        let daemons = cofferProcesses(serving: ro)
        #expect(daemons.count == 1, "one daemon serves the read-only container: \(daemons)")
        // The lock still works (an flock on the read-only directory) and names the daemon holding it
        // (from the kernel's lock table: nothing can be written there).
        let other = sb.root + "/m2"
        try #require(mkdir(other, 0o755) == 0)
        let twice = coffer(sb, ["mount", ro, other, "--passfile", sb.passfile])
        #expect(twice.status == 15, "a second mount of the read-only container: \(twice)")
        let named = daemons.first.map { twice.stderr.contains("daemon pid \($0))") } ?? false
        #expect(named, "the refusal names the daemon \(daemons): \(twice)")
        #expect(!E2E.isMounted(other))
        let u = sb.unmount()
        #expect(u.ok, "\(u)")
        #expect(!E2E.isMounted(sb.mnt))
        // `coffer unmount` waited for the daemon it found in the lock table.
        let left = cofferProcesses(serving: ro)
        #expect(left.isEmpty, "the read-only daemon is still running after coffer unmount returned: \(left)")
        // A read-only mount records no generation (it may be of a backup or a snapshot).
        // (The state dir may also hold `run/`, where a daemon without XDG_RUNTIME_DIR keeps its control socket.)
        let ledger = (try? FileManager.default.contentsOfDirectory(atPath: sb.root + "/state"))?.filter { $0.contains(".generation") }
        #expect((ledger ?? []).isEmpty, "a read-only mount wrote the rollback ledger: \(ledger ?? [])")

        let info = coffer(sb, ["info", ro, "--passfile", sb.passfile])
        #expect(info.ok, "coffer info on a read-only container: \(info)")
        #expect(info.stdout.contains("Generation:"), "\(info)")
        unbind(ro)
        #expect(E2E.read(sb.container + "/store.db") == storeBefore, "the store changed under a read-only mount")
    }

    @Test func explicitReadWriteIsRefused() throws {
        let sb = try Sandbox("rocontainerrw")
        defer { sb.cleanup() }
        try #require(sb.initContainer().ok)
        let ro = try bindReadOnly(sb)
        defer { unbind(ro) }
        let r = coffer(sb, ["mount", ro, sb.mnt, "--passfile", sb.passfile, "-o", "rw"])
        #expect(r.status != 0, "-o rw on a read-only container must be refused: \(r)")
        #expect(r.stderrLines.count == 1 && r.stderr.contains("cannot be mounted read-write"), "\(r)")
        #expect(!E2E.isMounted(sb.mnt))
        let none = E2E.wait(5) { cofferProcesses(serving: ro).isEmpty }
        #expect(none, "a daemon is left running")
        // Asked for ro, it mounts without a notice.
        let ok = coffer(sb, ["mount", ro, sb.mnt, "--passfile", sb.passfile, "-o", "ro"])
        #expect(ok.ok && ok.stderr.isEmpty, "\(ok)")
        #expect(sb.unmount().ok)
    }

    /// A container left by a killed daemon (commits still in the WAL) on a read-only medium: the commits
    /// are read through the -shm left beside them; without it the mount says why instead of losing them.
    @Test func crashedContainerOnReadOnlyMedium() throws {
        let sb = try Sandbox("rocontainercrash")
        defer { sb.cleanup() }
        try sb.initAndMount()
        let data = E2E.randomBytes(100_000)
        try E2E.write(sb.mnt + "/synced.bin", data)
        let sync = E2E.run("/bin/sync", [sb.mnt + "/synced.bin"])
        try #require(sync.ok, "\(sync)")
        let pid = try #require(E2E.daemonPid(container: sb.container))
        try #require(E2E.cmdline(pid).contains(sb.container), "lock pid is not our daemon")
        #expect(kill(pid, SIGKILL) == 0)
        let died = E2E.wait(10) { !E2E.isAlive(pid) }
        #expect(died)
        #expect(E2E.run("/bin/fusermount3", ["-uz", sb.mnt]).ok)
        let wal = E2E.statOf(sb.container + "/store.db-wal").map { Int($0.st_size) } ?? 0
        try #require(wal > 0, "the killed daemon left no commits in the WAL; the test needs some")

        let ro = try bindReadOnly(sb)
        defer { unbind(ro) }
        let m = coffer(sb, ["mount", ro, sb.mnt, "--passfile", sb.passfile])
        try #require(m.ok, "\(m)")
        #expect(E2E.read(sb.mnt + "/synced.bin") == data, "the commit in the WAL is not read")
        #expect(sb.unmount().ok)

        unbind(ro)
        try #require(unlink(sb.container + "/store.db-shm") == 0)
        let ro2 = try bindReadOnly(sb, at: "ro2")
        defer { unbind(ro2) }
        let r = coffer(sb, ["mount", ro2, sb.mnt, "--passfile", sb.passfile])
        #expect(r.status == 13, "\(r)")
        #expect(r.stderr.contains("write-ahead log"), "the refusal says why: \(r)")
        #expect(!E2E.isMounted(sb.mnt))
        unbind(ro2)
        // Writable again, the container mounts and still has the file.
        let again = coffer(sb, ["mount", sb.container, sb.mnt, "--passfile", sb.passfile])
        try #require(again.ok, "\(again)")
        #expect(E2E.read(sb.mnt + "/synced.bin") == data)
        #expect(sb.unmount().ok)
    }
}

extension ReadOnlyContainerTests {
    /// mount(8) passes `rw` whenever `ro` is not given: that default must not turn into a refusal.
    @Test func mount8OfAReadOnlyContainerMountsReadOnly() throws {
        let sb = try Sandbox("rocontainermount8")
        defer { sb.cleanup() }
        try sb.initAndMount()
        try E2E.write(sb.mnt + "/f", "via mount(8)")
        try #require(sb.unmount().ok)
        let ro = try bindReadOnly(sb)
        defer { unbind(ro) }
        let exe = try sb.dotFreeCoffer()
        let r = E2E.run("/bin/mount", ["-t", "fuse.\(exe)", ro, sb.mnt, "-o", "passfile=\(sb.passfile)"])
        try #require(r.ok, "\(r)")
        #expect(r.stderr.contains("mounting read-only"), "\(r)")
        let entry = try #require(E2E.mountEntry(at: sb.mnt))
        #expect(entry.options.split(separator: ",").contains("ro"), "\(entry.options)")
        #expect(E2E.readText(sb.mnt + "/f") == "via mount(8)")
        let u = E2E.run("/bin/umount", [sb.mnt])
        #expect(u.ok, "\(u)")
        #expect(!E2E.isMounted(sb.mnt))
    }
}
