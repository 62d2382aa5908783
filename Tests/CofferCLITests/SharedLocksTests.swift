import CofferTestSupport
import Foundation
import Testing
#if canImport(Glibc)
    import Glibc
#endif

// Locks across mounts of one PostgreSQL container (issue 17, item 2), through the real binary: two
// daemons, each with its own state directory (two "machines"), mount one container; flock, POSIX
// record locks and sqlite3 taken through one are seen by the other; blocked waiters are granted, or
// interrupted; a killed holder process, or a killed daemon (once its lease lapses), frees its locks.
// Every wait is bounded; every process started here is killed by its pid; both mounts are unmounted.

/// Two mounts of one fresh PostgreSQL container: `a` (the test's state directory) and `b` (another one),
/// both with 4 s leases.
private final class TwoMounts {
    let sb: Sandbox
    let uri: String
    var a: String { sb.mnt }
    let b: String
    let envA: [String: String]
    let envB: [String: String]
    private var children: [Spawned] = []
    private var count = 0

    init(_ label: String) throws {
        let sb = try Sandbox(label)
        self.sb = sb
        uri = (try? TestEngine.quietURI()) ?? ""
        b = sb.root + "/m2"
        envA = ["COFFER_PG_LEASE_SECONDS": "4"]
        envB = ["COFFER_PG_LEASE_SECONDS": "4", "COFFER_STATE_DIR": sb.root + "/machine2"]
        do {
            try #require(!uri.isEmpty, "no PostgreSQL for the test")
            try #require(mkdir(b, 0o755) == 0)
            try #require(sb.initContainer(container: uri).ok)
            let ma = coffer(["mount", uri, a, "--passfile", sb.passfile], env: envA)
            sb.noteDaemon(container: uri)
            try #require(ma.ok && E2E.isMounted(a), "\(ma)")
            let mb = coffer(["mount", uri, b, "--passfile", sb.passfile], env: envB)
            sb.noteDaemon(container: uri)
            try #require(mb.ok && E2E.isMounted(b), "\(mb)")
        } catch {
            close()
            throw error
        }
    }

    func coffer(_ args: [String], env extra: [String: String], timeout: TimeInterval = 60) -> RunResult {
        var env = ProcessInfo.processInfo.environment
        env["COFFER_STATE_DIR"] = E2E.stateDirectory
        for (k, v) in extra { env[k] = v }
        return E2E.run(E2E.coffer, args, environment: env, timeout: timeout)
    }

    /// Starts a background process; its output goes to the returned files.
    func spawn(_ exe: String, _ args: [String]) throws -> (Spawned, out: String, err: String) {
        count += 1
        let out = sb.root + "/bg\(count).out", err = sb.root + "/bg\(count).err"
        let child = try #require(Spawned(exe, args, stdinPath: "/dev/null", stdoutPath: out, stderrPath: err))
        children.append(child)
        return (child, out, err)
    }

    func python(_ program: String, _ args: [String]) throws -> (Spawned, out: String, err: String) {
        try spawn(E2E.python ?? "/usr/bin/python3", ["-c", program] + args)
    }

    /// The daemon serving `mountpoint`.
    func daemon(_ mountpoint: String) -> pid_t? {
        let pids = ((try? FileManager.default.contentsOfDirectory(atPath: "/proc")) ?? []).compactMap { pid_t($0) }
        return pids.first { pid in
            let args = E2E.cmdline(pid)
            return args.count > 2 && args[1] == "mount" && args.contains(uri) && args.contains(mountpoint) && E2E.isAlive(pid)
                && args.contains("--ready-fd")
        }
    }

    /// Kills what was started here (by pid), unmounts both mounts, removes the sandbox.
    func close() {
        for c in children where c.isRunning {
            c.signal(SIGKILL)
            _ = c.wait(timeout: 10)
        }
        for m in [sb.mnt, sb.root + "/m2"] where E2E.isMounted(m) {
            E2E.run(E2E.coffer, ["unmount", m], timeout: 30)
        }
        sb.cleanup()
    }
}

private let flockTool = "/usr/bin/flock"

private func text(_ path: String) -> String { E2E.readText(path) ?? "" }

/// `flock -n FILE true`: 0 when the lock was free, 1 when it is held.
private func tryFlock(_ path: String, shared: Bool = false) -> Int32 {
    E2E.run(flockTool, (shared ? ["-s"] : []) + ["-n", path, "true"], timeout: 20).status
}

/// Holds a flock on argv[1] (argv[2]: "ex" or "sh") until killed.
private let flockHolder = """
    import fcntl, os, sys, time
    fd = os.open(sys.argv[1], os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX if sys.argv[2] == "ex" else fcntl.LOCK_SH)
    print("held", flush=True)
    time.sleep(60)
    """

/// Holds lockf ranges on argv[1]: bytes 0-99 exclusive, then 0-49 unlocked (a sub-range): 50-99 stay.
private let rangeHolder = """
    import fcntl, os, sys, time
    fd = os.open(sys.argv[1], os.O_RDWR)
    fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 100, 0)
    fcntl.lockf(fd, fcntl.LOCK_UN, 50, 0)
    print("held", os.getpid(), flush=True)
    time.sleep(60)
    """

/// Tries ranges of argv[1] without waiting and prints what each got; then F_GETLK of the whole file.
private let rangeProbe = """
    import errno, fcntl, os, struct, sys
    fd = os.open(sys.argv[1], os.O_RDWR)
    def attempt(name, start, length, kind=fcntl.LOCK_EX):
        try:
            fcntl.lockf(fd, kind | fcntl.LOCK_NB, length, start)
            fcntl.lockf(fd, fcntl.LOCK_UN, length, start)
            print(name, "ok")
        except OSError as e:
            print(name, errno.errorcode[e.errno])
    attempt("0-49", 0, 50)
    attempt("100-199", 100, 100)
    attempt("60-69", 60, 10)
    attempt("40-59", 40, 20)
    attempt("shared-60", 60, 1, fcntl.LOCK_SH)
    r = fcntl.fcntl(fd, fcntl.F_GETLK, struct.pack("hhqqi4x", fcntl.F_WRLCK, 0, 0, 0, 0))
    t, w, start, length, pid = struct.unpack("hhqqi4x", r)
    print("getlk", "W" if t == fcntl.F_WRLCK else t, start, length, pid)
    """

/// Waits (F_SETLKW) for bytes 60-69 of argv[1]; with argv[2] = "alarm", a SIGALRM after 1 s interrupts it.
private let rangeWaiter = """
    import fcntl, os, signal, sys, time
    fd = os.open(sys.argv[1], os.O_RDWR)
    class Interrupted(Exception): pass
    def on_alarm(*a): raise Interrupted()
    if sys.argv[2] == "alarm":
        signal.signal(signal.SIGALRM, on_alarm)
        signal.setitimer(signal.ITIMER_REAL, 1.0)
    print("waiting", flush=True)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX, 10, 60)
        print("granted", flush=True)
    except Interrupted:
        print("interrupted", flush=True)
    """

/// OFD locks (F_OFD_SETLK): their owner is the open file, so two open files of one process conflict,
/// here one through each mount; the lock goes with its open file's last close (RELEASE, which the
/// kernel sends after close returns: retried briefly).
private let ofdProbe = """
    import errno, fcntl, os, struct, sys, time
    F_OFD_SETLK = 37
    def ofd(fd, t, start, length):
        fcntl.fcntl(fd, F_OFD_SETLK, struct.pack("hhqqi4x", t, 0, start, length, 0))
    def attempt(name, fd):
        try:
            ofd(fd, fcntl.F_WRLCK, 5, 10)
            print(name, "ok")
            return True
        except OSError as e:
            print(name, errno.errorcode[e.errno])
            return False
    fd1 = os.open(sys.argv[1], os.O_RDWR)
    fd2 = os.open(sys.argv[2], os.O_RDWR)
    ofd(fd1, fcntl.F_WRLCK, 0, 10)
    attempt("other-file", fd2)
    os.close(fd1)
    for _ in range(40):
        if attempt("after-close", fd2): break
        time.sleep(0.05)
    """

@Suite("Locks across mounts of a PostgreSQL container", .serialized)
struct SharedLocksTests {
    /// flock(2): held on A, refused on B (and to another open file on A); a blocked waiter on B is
    /// interrupted by its timer (EINTR), another is granted once the holder is killed (-9: the kernel
    /// closes its file); shared locks share.
    @Test func flockIsSeenByTheOtherMount() throws {
        guard E2E.python != nil else { return }
        let m = try TwoMounts("lkflock")
        defer { m.close() }
        try E2E.write(m.a + "/f", "x")
        try #require(E2E.wait(5) { E2E.lstatOf(m.b + "/f") != nil })
        #expect(tryFlock(m.b + "/f") == 0, "free at first")
        let (holder, _, _) = try m.python(flockHolder, [m.a + "/f", "ex"])
        try #require(E2E.wait(10) { tryFlock(m.b + "/f") == 1 }, "B sees A's flock")
        #expect(tryFlock(m.a + "/f") == 1, "another open file on A is refused too")
        #expect(tryFlock(m.b + "/f", shared: true) == 1, "a shared lock is refused while A holds it exclusive")

        let start = Date()
        let timedOut = E2E.run(flockTool, ["-w", "1", m.b + "/f", "true"], timeout: 20)
        let waited = Date().timeIntervalSince(start)
        #expect(timedOut.status == 1 && waited >= 0.9 && waited < 6, "a waiter interrupted by its timer ends (EINTR): \(timedOut), \(waited) s")

        let (waiter, out, _) = try m.spawn(flockTool, [m.b + "/f", "-c", "echo granted"])
        usleep(700_000)
        #expect(waiter.isRunning, "blocked while A holds the lock")
        holder.signal(SIGKILL)
        #expect(waiter.wait(timeout: 15) == 0 && text(out).contains("granted"), "granted once the holder is gone: \(text(out))")
        #expect(tryFlock(m.b + "/f") == 0, "free again: neither the interrupted nor the granted waiter kept it")

        let (s1, _, _) = try m.python(flockHolder, [m.a + "/f", "sh"])
        try #require(E2E.wait(10) { tryFlock(m.b + "/f") == 1 }, "B sees A's shared flock")
        #expect(tryFlock(m.b + "/f", shared: true) == 0, "shared locks share across mounts")
        s1.signal(SIGKILL)
        #expect(E2E.wait(10) { tryFlock(m.b + "/f") == 0 }, "freed when its holder is killed")
    }

    /// POSIX record locks (lockf/fcntl): ranges split and unlocked in part on A; B gets what does not
    /// overlap and is refused what does; F_GETLK names the range and the holder's pid (same host); a
    /// blocked F_SETLKW is interrupted by a signal, another is granted once the holder is killed.
    @Test func recordLocksAreSeenByTheOtherMount() throws {
        guard E2E.python != nil else { return }
        let m = try TwoMounts("lkrange")
        defer { m.close() }
        try E2E.write(m.a + "/r", [UInt8](repeating: 7, count: 300))
        try #require(E2E.wait(5) { E2E.lstatOf(m.b + "/r") != nil })
        let (holder, holderOut, holderErr) = try m.python(rangeHolder, [m.a + "/r"])
        try #require(E2E.wait(10) { text(holderOut).hasPrefix("held") }, "\(text(holderErr))")
        let probe = E2E.run(E2E.python ?? "/usr/bin/python3", ["-c", rangeProbe, m.b + "/r"], timeout: 30)
        try #require(probe.ok, "\(probe)")
        let lines = probe.stdout.split(separator: "\n").map(String.init)
        #expect(lines.contains("0-49 ok"), "the unlocked sub-range is free: \(lines)")
        #expect(lines.contains("100-199 ok"), "a range that does not overlap is granted: \(lines)")
        #expect(lines.contains("60-69 EAGAIN") || lines.contains("60-69 EACCES"), "an overlapping range is refused: \(lines)")
        #expect(lines.contains("40-59 EAGAIN") || lines.contains("40-59 EACCES"), "a range overlapping in part is refused: \(lines)")
        #expect(lines.contains("shared-60 EAGAIN") || lines.contains("shared-60 EACCES"), "a read lock under a write lock is refused: \(lines)")
        #expect(lines.contains("getlk W 50 50 \(holder.pid)"), "F_GETLK names the held range and its pid: \(lines)")

        // Another process opening and closing the file on A (its FLUSH and RELEASE) leaves the holder's locks.
        #expect(E2E.run("/bin/cat", [m.a + "/r"], timeout: 20).ok)
        let again = E2E.run(E2E.python ?? "/usr/bin/python3", ["-c", rangeProbe, m.b + "/r"], timeout: 30)
        #expect(again.stdout.contains("60-69 EAGAIN") || again.stdout.contains("60-69 EACCES"), "still held: \(again)")

        let (interrupted, iOut, iErr) = try m.python(rangeWaiter, [m.b + "/r", "alarm"])
        #expect(interrupted.wait(timeout: 15) == 0 && text(iOut).contains("interrupted"), "SIGALRM ends the wait: \(text(iOut)) \(text(iErr))")

        let (waiter, wOut, wErr) = try m.python(rangeWaiter, [m.b + "/r", "wait"])
        try #require(E2E.wait(10) { text(wOut).contains("waiting") })
        usleep(700_000)
        #expect(waiter.isRunning && !text(wOut).contains("granted"), "blocked while A holds 50-99")
        holder.signal(SIGKILL)
        #expect(waiter.wait(timeout: 15) == 0 && text(wOut).contains("granted"), "granted once the holder is killed: \(text(wOut)) \(text(wErr))")
        let after = E2E.run(E2E.python ?? "/usr/bin/python3", ["-c", rangeProbe, m.a + "/r"], timeout: 30)
        #expect(after.stdout.contains("60-69 ok") && after.stdout.contains("getlk 2 "), "the waiter's lock went with its exit: \(after)")

        let ofd = E2E.run(E2E.python ?? "/usr/bin/python3", ["-c", ofdProbe, m.a + "/r", m.b + "/r"], timeout: 30)
        #expect(
            ofd.stdout.hasPrefix("other-file EAGAIN\n") || ofd.stdout.hasPrefix("other-file EACCES\n"), "OFD locks of two open files conflict: \(ofd)"
        )
        #expect(ofd.stdout.hasSuffix("after-close ok\n"), "an OFD lock goes with its open file: \(ofd)")
    }

    /// sqlite3 on B: "database is locked" while a transaction on A holds the write lock; once that
    /// process is killed, B rolls its journal back and writes; a reader on B that keeps the database
    /// open sees A's later commit (the kernel's pages are dropped when the lock is taken).
    @Test func sqliteLocksAcrossMounts() throws {
        guard E2E.python != nil, let sqlite = E2E.which("sqlite3") else { return }
        let m = try TwoMounts("lksqlite")
        defer { m.close() }
        let dbA = m.a + "/db", dbB = m.b + "/db"
        let made = E2E.run(sqlite, [dbA, "CREATE TABLE t(x); INSERT INTO t VALUES (1);"], timeout: 30)
        try #require(made.ok, "\(made)")
        try #require(E2E.wait(5) { E2E.lstatOf(dbB) != nil })
        let (holder, hOut, hErr) = try m.python(
            """
            import sqlite3, sys, time
            c = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=0)
            c.execute("BEGIN EXCLUSIVE")
            c.execute("INSERT INTO t VALUES (2)")
            print("locked", flush=True)
            time.sleep(60)
            """, [dbA])
        try #require(E2E.wait(10) { text(hOut).contains("locked") }, "\(text(hErr))")
        let refused = E2E.run(sqlite, [dbB, "INSERT INTO t VALUES (3);"], timeout: 30)
        #expect(!refused.ok && refused.stderr.contains("database is locked"), "\(refused)")
        holder.signal(SIGKILL)
        _ = holder.wait(timeout: 10)
        var wrote = false
        let deadline = Date().addingTimeInterval(15)
        while !wrote && Date() < deadline {
            wrote = E2E.run(sqlite, [dbB, "INSERT INTO t VALUES (3);"], timeout: 30).ok
            if !wrote { usleep(200_000) }
        }
        #expect(wrote, "B writes once A's transaction is gone")
        let seen = E2E.run(sqlite, [dbA, "SELECT group_concat(x) FROM t;"], timeout: 30)
        #expect(seen.ok && seen.stdout == "1,3\n", "the killed transaction rolled back, B's row is in: \(seen)")

        // A reader on B that keeps the database open (and the kernel its pages) sees A's next commit.
        let go = m.sb.root + "/go"
        let (reader, rOut, rErr) = try m.python(
            """
            import os, sqlite3, sys, time
            c = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=5)
            print(c.execute("SELECT count(*) FROM t").fetchone()[0], flush=True)
            for _ in range(300):
                if os.path.exists(sys.argv[2]): break
                time.sleep(0.05)
            print(c.execute("SELECT count(*) FROM t").fetchone()[0], flush=True)
            """, [dbB, go])
        try #require(E2E.wait(10) { text(rOut) == "2\n" }, "\(text(rOut)) \(text(rErr))")
        #expect(E2E.run(sqlite, [dbA, "INSERT INTO t VALUES (4); INSERT INTO t VALUES (5);"], timeout: 30).ok)
        try E2E.write(go, "")
        #expect(reader.wait(timeout: 20) == 0 && text(rOut) == "2\n4\n", "the open reader sees A's commit: \(text(rOut)) \(text(rErr))")
    }

    /// A daemon that stops while a request waits for a lock answers it (EINTR) and exits: nothing is left
    /// unanswered. The waiter uses the mount, so the first SIGTERM only detaches it (served until its users let
    /// go, as `coffer unmount --lazy`); the second ends it at once.
    @Test func aParkedWaiterIsAnsweredWhenTheDaemonStops() throws {
        guard E2E.python != nil else { return }
        let m = try TwoMounts("lkstop")
        defer { m.close() }
        try E2E.write(m.a + "/f", "x")
        try #require(E2E.wait(5) { E2E.lstatOf(m.b + "/f") != nil })
        let daemonB = try #require(m.daemon(m.b))
        let (_, hOut, _) = try m.python(flockHolder, [m.a + "/f", "ex"])
        try #require(E2E.wait(10) { text(hOut).contains("held") })
        try #require(E2E.wait(10) { tryFlock(m.b + "/f") == 1 })
        let (waiter, wOut, _) = try m.spawn(flockTool, [m.b + "/f", "-c", "echo granted"])
        usleep(700_000)
        try #require(waiter.isRunning, "parked")
        kill(daemonB, SIGTERM)
        usleep(700_000)
        #expect(waiter.isRunning && E2E.isAlive(daemonB), "the first SIGTERM left the waiter waiting on a detached mount")
        kill(daemonB, SIGTERM)
        let status = waiter.wait(timeout: 20)
        #expect(
            status != nil && status != 0 && !text(wOut).contains("granted"), "the waiter got an error, not the lock: \(String(describing: status))")
        #expect(E2E.wait(20) { !E2E.isAlive(daemonB) }, "the daemon exited")
        #expect(tryFlock(m.a + "/f") == 1, "A's lock is untouched")
    }

    /// A daemon killed -9 loses its locks once its lease lapses (4 s here), although the process that
    /// took the lock through it still runs.
    @Test func aKilledDaemonsLocksLapseWithItsLease() throws {
        guard E2E.python != nil else { return }
        let m = try TwoMounts("lkdaemon")
        defer { m.close() }
        try E2E.write(m.a + "/f", "x")
        try #require(E2E.wait(5) { E2E.lstatOf(m.b + "/f") != nil })
        let daemonA = try #require(m.daemon(m.a))
        _ = try m.python(flockHolder, [m.a + "/f", "ex"])
        try #require(E2E.wait(10) { tryFlock(m.b + "/f") == 1 }, "B sees A's flock")
        kill(daemonA, SIGKILL)
        let killed = Date()
        #expect(E2E.wait(10) { !E2E.isAlive(daemonA) })
        E2E.run("/bin/fusermount3", ["-uz", m.a], timeout: 30)
        #expect(tryFlock(m.b + "/f") == 1, "the lease has not lapsed yet: still held")
        #expect(E2E.wait(15) { tryFlock(m.b + "/f") == 0 }, "freed once the dead daemon's lease lapsed")
        let took = Date().timeIntervalSince(killed)
        #expect(took < 12, "within the lease (4 s) and a renewal: \(took) s")
    }
}
