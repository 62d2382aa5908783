import Foundation
import Testing

#if canImport(Glibc)
    import Glibc
#endif

// The "Mount" issue: real FUSE mounts through the built binary: lifecycle, failures, foreground mode,
// the mount.fuse3 / fstab form, secrets, durability after SIGKILL.

/// Processes whose command line names `container` (a coffer daemon serving it), excluding ourselves.
func cofferProcesses(serving container: String) -> [pid_t] {
    guard let names = try? FileManager.default.contentsOfDirectory(atPath: "/proc") else { return [] }
    return names.compactMap { pid_t($0) }.filter { pid in
        guard pid != getpid(), E2E.isAlive(pid) else { return false }
        let argv = E2E.cmdline(pid)
        return argv.contains { $0.hasSuffix("coffer") } && argv.contains(container)
    }
}

/// A long-running child (a foreground mount), with output in files.
final class Child: @unchecked Sendable {
    let spawned: Spawned
    let outPath: String, errPath: String
    init(_ executable: String, _ arguments: [String]) throws {
        let tag = "/tmp/coffer-e2e-child-\(getpid())-\(UUID().uuidString)"
        outPath = tag + ".out"
        errPath = tag + ".err"
        guard let s = Spawned(executable, arguments, stdinPath: "/dev/null", stdoutPath: outPath, stderrPath: errPath) else {
            throw Sandbox.SandboxError("cannot start \(executable)")
        }
        spawned = s
    }
    var pid: pid_t { spawned.pid }
    var stderr: String { E2E.readText(errPath) ?? "" }
    /// Waits for exit; SIGKILLs it (our own child only) after `seconds`. Returns the exit status, nil on timeout.
    func waitForExit(_ seconds: Double) -> Int32? { spawned.wait(timeout: seconds) }
    func stop() {
        if spawned.isRunning { _ = spawned.wait(timeout: 0.1) }
        unlink(outPath)
        unlink(errPath)
    }
}

@Suite("Mount: lifecycle, failures, mount(8), durability", .enabled(if: E2E.fuseAvailable, "/dev/fuse is not usable"))
struct MountTests {
    /// A container directory renamed while mounted keeps working: segment files are reached through the
    /// directory the mount holds open. By name, a large file's fsync failed ("cannot open segment") and,
    /// with a new container made under the old name, its content went into that one's segments.
    @Test func aContainerRenamedWhileMountedKeepsItsSegments() throws {
        let sb = try Sandbox("renamed")
        defer { sb.cleanup() }
        guard sb.isDirectoryContainer else { return }  // a directory's name only
        try sb.initAndMount()
        // Small before the move: the segments directory is made after it.
        let before = E2E.randomBytes(3000), after = E2E.randomBytes(3_000_000)
        try E2E.write(sb.mnt + "/before.bin", before)
        let moved = sb.root + "/moved"
        try #require(rename(sb.container, moved) == 0)
        try #require(sb.initContainer().ok, "a new container under the old name")
        try E2E.write(sb.root + "/after.src", after)
        let synced = E2E.sh("cp '\(sb.root)/after.src' '\(sb.mnt)/after.bin' && sync '\(sb.mnt)/after.bin'")
        #expect(synced.ok, "\(synced)")
        #expect(E2E.sh("fusermount3 -u '\(sb.mnt)'").ok)
        usleep(500_000)  // the daemon ends on its own (its lock is not where `coffer unmount` looks)
        let m = sb.mount(container: moved)
        try #require(m.ok, "\(m)")
        let same = E2E.read(sb.mnt + "/before.bin") == before && E2E.read(sb.mnt + "/after.bin") == after
        #expect(same, "both files read back from the renamed container")
        #expect(sb.unmount().ok)
        let fsck = E2E.coffer(["fsck", moved, "--passfile", sb.passfile], timeout: 120)
        #expect(fsck.status == 0, "\(fsck)")
    }

    /// The daemon keeps each segment it reads open: it runs with the hard limit of open files, not the soft one.
    @Test func theDaemonMayOpenAsManyFilesAsTheHardLimitAllows() throws {
        let sb = try Sandbox("nofile")
        defer { sb.cleanup() }
        guard sb.isDirectoryContainer else { return }  // segments are the embedded engine's
        try #require(sb.initContainer().ok)
        // Started with a soft limit of 256, as a login shell may give.
        let m = E2E.sh("ulimit -Sn 256 && '\(E2E.coffer)' mount '\(sb.container)' '\(sb.mnt)' --passfile '\(sb.passfile)'")
        sb.noteDaemon()
        try #require(m.ok, "\(m)")
        let pid = try #require(E2E.daemonPid(container: sb.container))
        let limits = try String(contentsOfFile: "/proc/\(pid)/limits", encoding: .utf8)
        let line = try #require(limits.split(separator: "\n").first { $0.hasPrefix("Max open files") })
        let numbers = line.split(separator: " ").compactMap { Int($0) }
        #expect(numbers.count == 2 && numbers[0] == numbers[1], "soft and hard: \(line)")
        #expect(sb.unmount().ok)
    }

    /// The daemon leaves the directory `coffer mount` was run from: a filesystem the user happened to be in
    /// (here a tmpfs; a USB stick, another mount) can be unmounted while the container stays mounted. Before,
    /// the daemon kept it as its working directory and umount said "target is busy". Relative paths given
    /// from there (container, mountpoint, passfile) still work.
    @Test func theDaemonDoesNotKeepItsStartingDirectoryBusy() throws {
        let sb = try Sandbox("cwd")
        defer { sb.cleanup() }
        try #require(sb.initContainer().ok)
        let elsewhere = try sb.smallDisk("4m", name: "elsewhere")
        let container = sb.isDirectoryContainer ? "../c" : sb.container
        let m = E2E.sh("cd '\(elsewhere)' && '\(E2E.coffer)' mount '\(container)' ../m --passfile ../pass")
        sb.noteDaemon()
        try #require(m.ok, "\(m)")
        let pid = try #require(E2E.daemonPid(container: sb.container))
        #expect((try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/\(pid)/cwd")) == "/")
        let umount = E2E.run("/bin/umount", [elsewhere])
        #expect(umount.ok, "the directory the mount was started from is not kept busy: \(umount)")
        try E2E.write(sb.mnt + "/after", "still mounted\n")
        #expect(E2E.sh("sync '\(sb.mnt)/after'").ok)
        #expect(sb.unmount().ok)
        try #require(sb.mount().ok)
        #expect(E2E.readText(sb.mnt + "/after") == "still mounted\n")
        #expect(sb.unmount().ok)
    }

    @Test func mountWriteUnmountRemount() throws {
        let sb = try Sandbox("lifecycle")
        defer { sb.cleanup() }
        try #require(sb.initContainer().ok)
        let parentDev = E2E.device(sb.root)
        let m = sb.mount()
        try #require(m.ok, "\(m)")
        // Right after return, the mountpoint answers as a filesystem of its own.
        let dev = E2E.device(sb.mnt)
        #expect(
            dev != nil && dev != parentDev,
            "mount returned before the mountpoint answered (st_dev \(String(describing: dev)) vs parent \(String(describing: parentDev)))")
        let entry = try #require(E2E.mountEntry(at: sb.mnt), "no /proc/mounts entry")
        #expect(entry.type == "fuse.coffer", "type is \(entry.type)")
        #expect(entry.source == sb.container, "source is \(entry.source)")
        let daemon = try #require(E2E.daemonPid(container: sb.container), "no daemon holds the container lock")
        #expect(E2E.isAlive(daemon))

        let big = E2E.randomBytes(3 << 20)
        try E2E.write(sb.mnt + "/big.bin", big)
        var expected: [String: [UInt8]] = ["big.bin": big]
        for i in 0..<200 {
            let dir = "d\(i % 5)/e\(i % 3)/f\(i % 2)"
            try FileManager.default.createDirectory(atPath: sb.mnt + "/" + dir, withIntermediateDirectories: true)
            let content = Array("file \(i) ".utf8) + E2E.randomBytes(i * 7 % 300)
            try E2E.write(sb.mnt + "/\(dir)/small\(i).txt", content)
            expected["\(dir)/small\(i).txt"] = content
        }
        #expect(E2E.snapshot(sb.mnt) == expected, "read-back before unmount differs")

        let u = sb.unmount()
        #expect(u.ok, "\(u)")
        #expect(!E2E.isMounted(sb.mnt), "still mounted after coffer unmount")
        #expect(!E2E.isAlive(daemon), "the daemon \(daemon) is still running after coffer unmount returned")
        #expect(E2E.snapshot(sb.mnt).isEmpty, "files visible on the bare mountpoint")

        let m2 = sb.mount()
        try #require(m2.ok, "\(m2)")
        let after = E2E.snapshot(sb.mnt)
        #expect(after.keys.sorted() == expected.keys.sorted(), "file set differs after remount")
        #expect(after["big.bin"] == big, "3 MiB file differs after remount")
        #expect(after == expected, "contents differ after remount")
        #expect(sb.unmount().ok)
    }

    /// With the writeback cache (the default), a root daemon lifts the kernel's strict dirty-page limit
    /// for its own mount (and only with it: with no_writeback_cache the kernel's limits stay as they are).
    @Test(.enabled(if: E2E.isRoot, "only root may change /sys/class/bdi")) func writebackLimitsFollowTheCache() throws {
        let sb = try Sandbox("bdi")
        defer { sb.cleanup() }
        try #require(sb.initContainer().ok)
        func limits() throws -> (ratio: String, strict: String) {
            let dev = try #require(E2E.device(sb.mnt))
            let dir = "/sys/class/bdi/\((dev >> 8) & 0xfff | (dev >> 32) & ~0xfff):\(dev & 0xff | (dev >> 12) & ~0xff)"
            let ratio = try String(contentsOfFile: dir + "/max_ratio", encoding: .utf8).trimmingCharacters(in: .whitespacesAndNewlines)
            let strict = try String(contentsOfFile: dir + "/strict_limit", encoding: .utf8).trimmingCharacters(in: .whitespacesAndNewlines)
            return (ratio, strict)
        }
        try #require(sb.mount().ok)
        let relaxed = try limits()
        #expect(relaxed.ratio == "20" && relaxed.strict == "0", "with the writeback cache, the default: \(relaxed)")
        #expect(sb.unmount().ok)
        try #require(sb.mount(options: "writeback_cache").ok)
        let asked = try limits()
        #expect(asked.ratio == "20" && asked.strict == "0", "with -o writeback_cache: \(asked)")
        #expect(sb.unmount().ok)
        try #require(sb.mount(options: "no_writeback_cache").ok)
        let kernel = try limits()
        #expect(kernel.ratio == "1" && kernel.strict == "1", "without it the kernel's FUSE defaults stay: \(kernel)")
        #expect(sb.unmount().ok)
    }

    @Test func wrongPasswordMountsNothing() throws {
        let sb = try Sandbox("mountwrong")
        defer { sb.cleanup() }
        try #require(sb.initContainer().ok)
        let bad = sb.root + "/bad"
        try E2E.write(bad, "wrong\n")
        let r = sb.mount(passfile: bad)
        #expect(r.status == 12, "\(r)")
        #expect(r.stderrLines.count == 1, "\(r)")
        #expect(!E2E.isMounted(sb.mnt))
        #expect(E2E.wait(5) { cofferProcesses(serving: sb.container).isEmpty }, "a daemon is left running")
    }

    @Test func badMountpointsAreRefused() throws {
        let sb = try Sandbox("badmnt")
        defer { sb.cleanup() }
        try #require(sb.initContainer().ok)
        let missing = sb.root + "/missing"
        let r1 = sb.mount(at: missing)
        #expect(r1.status == 14, "\(r1)")
        #expect(!E2E.isMounted(missing))

        let full = sb.root + "/full"
        try #require(mkdir(full, 0o755) == 0)
        try E2E.write(full + "/x", "x")
        let r2 = sb.mount(at: full)
        #expect(r2.status == 14, "\(r2)")
        #expect(r2.stderr.contains("not empty"), "\(r2)")
        #expect(!E2E.isMounted(full))
        #expect(E2E.readText(full + "/x") == "x")

        let file = sb.root + "/plainfile"
        try E2E.write(file, "f")
        let r3 = sb.mount(at: file)
        #expect(r3.status == 14, "\(r3)")
        #expect(E2E.wait(5) { cofferProcesses(serving: sb.container).isEmpty }, "a daemon is left running")
    }

    @Test func secondMountOfTheSameContainerIsRefused() throws {
        let sb = try Sandbox("twice")
        defer { sb.cleanup() }
        try sb.initAndMount()
        let other = sb.root + "/m2"
        try #require(mkdir(other, 0o755) == 0)
        let r = sb.mount(at: other)
        #expect(r.status == 15, "\(r)")
        #expect(r.stderr.contains("already mounted"), "\(r)")
        #expect(!E2E.isMounted(other))
        // The first mount still works.
        try E2E.write(sb.mnt + "/still.txt", "works")
        #expect(E2E.readText(sb.mnt + "/still.txt") == "works")
        #expect(E2E.isMounted(sb.mnt))
        #expect(sb.unmount().ok)
    }

    @Test func unknownMountOptionIsNamed() throws {
        let sb = try Sandbox("badopt")
        defer { sb.cleanup() }
        try #require(sb.initContainer().ok)
        let r = sb.mount(options: "noatime,frobnicate_widgets")
        #expect(r.status != 0, "\(r)")
        #expect(r.stderr.contains("frobnicate_widgets"), "\(r)")
        #expect(!E2E.isMounted(sb.mnt))
        // An option that is only "=" (a slip in fstab) is unknown too, not a crash.
        for bad in ["=", "noatime,=x"] {
            let e = sb.mount(options: bad)
            #expect(e.status == 64 && e.stderr.contains("unknown"), "\(bad): \(e)")
        }
        #expect(E2E.wait(5) { cofferProcesses(serving: sb.container).isEmpty })
    }

    /// `-o idle=2`: a mount used now and then stays; a program's working directory inside keeps an idle mount
    /// (the unmount is a normal one, refused while in use); `df` now and then is not use; once let go and left
    /// alone for the idle time it unmounts by itself, exits 0, and everything written is there after a remount.
    @Test func anIdleMountUnmountsItselfWhenNothingUsesIt() throws {
        let sb = try Sandbox("idle")
        defer { sb.cleanup() }
        try #require(sb.initContainer().ok)
        for bad in ["idle=soon", "idle=-5", "idle=0.5", "idle=8d", "idle=30d", "idle="] {
            let r = sb.mount(options: bad)
            #expect(r.status == 64 && r.stderr.contains(bad == "idle=" ? "unknown" : bad), "\(bad): \(r)")
        }
        let daemon = try sb.foregroundMount(options: "idle=2")
        defer { daemon.stop() }
        for i in 0..<8 {
            try E2E.write(sb.mnt + "/f\(i)", "file \(i)")
            usleep(500_000)
        }
        #expect(E2E.isMounted(sb.mnt), "unmounted while used every half second")
        let inside = try Child("/bin/sh", ["-c", "cd '\(sb.mnt)' && : > here && exec sleep 4"])
        defer { inside.stop() }
        #expect(E2E.wait(10) { FileManager.default.fileExists(atPath: sb.mnt + "/here") })
        usleep(3_000_000)
        #expect(E2E.isMounted(sb.mnt), "unmounted while a shell's working directory was inside")
        #expect(inside.waitForExit(20) == 0)
        // df every half second for 5 s: the mount is gone before it ends (statfs is not use).
        let df = E2E.run("/bin/sh", ["-c", "for i in $(seq 1 10); do df '\(sb.mnt)' > /dev/null; sleep 0.5; done"])
        #expect(df.ok, "\(df)")
        #expect(!E2E.isMounted(sb.mnt), "still mounted after the idle time with nothing inside but df")
        #expect(daemon.waitForExit(30) == 0, "\(daemon.stderr)")
        #expect(daemon.stderr.contains("no use for 2 s (idle=)"), "\(daemon.stderr)")
        try #require(sb.mount().ok)
        let missing = (0..<8).filter { E2E.readText(sb.mnt + "/f\($0)") != "file \($0)" }
        #expect(missing.isEmpty, "files written before the idle unmount: \(missing)")
        #expect(sb.unmount().ok)
    }

    /// `-o idle=6` (longer than the kernel's 5 s attribute cache): a stat of the mountpoint every second, as a
    /// panel's `df` or a service's health check does, reaches the daemon as GETATTR of the root whenever the
    /// cache runs out, and is not use: the mount still unmounts after its idle time. A stat of a file inside is.
    @Test func statsOfTheMountpointAreNotUse() throws {
        let sb = try Sandbox("idlestat")
        defer { sb.cleanup() }
        try #require(sb.initContainer().ok)
        let daemon = try sb.foregroundMount(options: "idle=6")
        defer { daemon.stop() }
        try E2E.write(sb.mnt + "/f", "kept")
        // A file's attributes asked every second (a new name each time: nothing cached) keep it mounted.
        let inside = E2E.run("/bin/sh", ["-c", "for i in $(seq 1 9); do stat '\(sb.mnt)/none-'$i > /dev/null 2>&1; sleep 1; done"])
        #expect(inside.status == 0 || inside.status == 1, "\(inside)")
        #expect(E2E.isMounted(sb.mnt), "unmounted while a name inside was looked up every second")
        let root = E2E.run("/bin/sh", ["-c", "for i in $(seq 1 14); do stat '\(sb.mnt)' > /dev/null 2>&1; sleep 1; done"])
        #expect(root.ok, "\(root)")
        #expect(!E2E.isMounted(sb.mnt), "still mounted after 14 s of stats of the mountpoint alone")
        #expect(daemon.waitForExit(30) == 0, "\(daemon.stderr)")
    }

    /// A mount with `-o idle=` that someone else detached (`umount -l` while a shell is inside) and a tmpfs
    /// mounted on the same path: the idle watcher leaves the tmpfs alone (the path no longer leads to its mount),
    /// and the daemon ends once the shell lets go.
    @Test(.enabled(if: E2E.isRoot, "umount -l and a tmpfs need root"))
    func anIdleWatcherLeavesAnotherMountAtItsPathAlone() throws {
        let sb = try Sandbox("idlepath")
        defer { sb.cleanup() }
        try #require(sb.initContainer().ok)
        let daemon = try sb.foregroundMount(options: "idle=1")
        defer { daemon.stop() }
        // Long enough to outlast a slow start under load (a shell gone before the lazy unmount let the idle
        // watcher unmount first: "not mounted" in one CI run).
        let inside = try Child("/bin/sh", ["-c", "cd '\(sb.mnt)' && : > here && exec sleep 15"])
        defer { inside.stop() }
        #expect(E2E.wait(10) { FileManager.default.fileExists(atPath: sb.mnt + "/here") })
        try #require(E2E.sh("umount -l '\(sb.mnt)' && mount -t tmpfs -o size=1m tmpfs '\(sb.mnt)'").ok)
        defer { _ = E2E.sh("umount '\(sb.mnt)'") }
        usleep(4_000_000)
        let table = E2E.mountTable().filter { $0.mountpoint == sb.mnt }
        #expect(table.map(\.type) == ["tmpfs"], "the tmpfs at the path was unmounted: \(table)")
        #expect(inside.waitForExit(30) == 0)
        #expect(daemon.waitForExit(30) == 0, "\(daemon.stderr)")
    }

    @Test func maxThreadsIsCheckedAndApplies() throws {
        let sb = try Sandbox("maxthreads")
        defer { sb.cleanup() }
        try #require(sb.initContainer().ok)
        for bad in ["max_threads=0", "max_threads=lots", "max_threads=100000"] {
            let r = sb.mount(options: bad)
            #expect(r.status == 64, "\(bad): \(r)")
            #expect(r.stderr.contains(bad), "\(r)")
            #expect(!E2E.isMounted(sb.mnt))
        }
        // One worker thread still serves several writers at once.
        try #require(sb.mount(options: "max_threads=1").ok)
        let writers = E2E.run(
            "/bin/sh",
            [
                "-c",
                "for i in 1 2 3 4; do (head -c 300000 /dev/urandom > \"$1/f$i\"; cp \"$1/f$i\" \"$1/g$i\") & done; wait; for i in 1 2 3 4; do cmp \"$1/f$i\" \"$1/g$i\" || exit 1; done",
                "sh", sb.mnt
            ])
        #expect(writers.ok, "\(writers)")
        #expect(sb.unmount().ok)
    }

    /// While mounted, the daemon holds the store for itself (EntityStore.exclusiveByDefault): no other
    /// process opens it through SQLite, the `-shm` file stays empty, and `coffer info` says it is mounted and
    /// asks the daemon, which commits, then counts the committed rows (a file not yet committed counts only
    /// because of that commit). After the unmount everything opens it again.
    @Test func theDaemonHoldsTheStoreAlone() throws {
        guard E2E.which("sqlite3") != nil else {
            Issue.record("sqlite3 missing (make test-deps installs it)")
            return
        }
        let sb = try Sandbox("storealone")
        defer { sb.cleanup() }
        try sb.initAndMount()
        try E2E.write(sb.mnt + "/f.txt", "data")
        #expect(E2E.sh("sync '\(sb.mnt)/f.txt'").ok)
        let store = sb.container + "/store.db"
        let locked = E2E.run("/usr/bin/env", ["sqlite3", store, "SELECT count(*) FROM inodes"])
        #expect(!locked.ok && locked.stderr.contains("locked"), "another process read the mounted store: \(locked)")
        // The WAL index stays in the daemon's memory; the -shm file is only there for read-only opens.
        #expect(E2E.statOf(store + "-shm")?.st_size == 0, "the WAL index went to a file")
        let pid = try #require(E2E.daemonPid(container: sb.container))
        // The daemon answers for its store: it commits what is pending (g.txt, never synced), then counts.
        try E2E.write(sb.mnt + "/g.txt", "more")
        let mounted = E2E.coffer(["info", sb.container, "--passfile", sb.passfile])
        #expect(mounted.ok && mounted.stdout.contains("Mounted:        by daemon pid \(pid)"), "\(mounted)")
        #expect(mounted.stdout.contains("Unlocked by:") && mounted.stdout.contains("Generation:"), "\(mounted)")
        #expect(mounted.stdout.contains("Entities:       3 inodes, 2 directory entries, 2 content chunks"), "\(mounted)")
        #expect(mounted.stdout.contains("Chunk sealing:  in 4 KiB blocks (coffer.chunk.v2)"), "the daemon tells the form: \(mounted)")
        let wrong = sb.root + "/wrong-pass"
        try E2E.write(wrong, "not the password\n")
        chmod(wrong, 0o600)
        let refused = E2E.coffer(["info", sb.container, "--passfile", wrong])
        #expect(refused.status == 12 && !refused.stdout.contains("Entities:"), "no counts without the secret: \(refused)")
        #expect(E2E.readText(sb.mnt + "/f.txt") == "data")
        #expect(sb.unmount().ok)
        let count = E2E.run("/usr/bin/env", ["sqlite3", store, "SELECT count(*) FROM inodes"])
        #expect(count.ok && count.stdout == "3\n", "\(count)")
        let info = E2E.coffer(["info", sb.container, "--passfile", sb.passfile])
        #expect(info.ok && info.stdout.contains("Entities:       3 inodes") && !info.stdout.contains("Mounted:"), "\(info)")
        #expect(info.stdout.contains("Chunk sealing:  in 4 KiB blocks (coffer.chunk.v2)"), "\(info)")
    }

    /// Someone truncates `store.db` while it is mounted (a sync client replacing it, an attacker): the
    /// reads that needed the lost pages fail with EIO, and the daemon lives on and unmounts. The readers
    /// map the store, so without the SIGBUS guard (CMappedFault) the first such read killed the daemon.
    /// Files of 7000 bytes: their chunks are held in their rows (larger ones go to segment files, whose
    /// truncation is tested below).
    @Test func truncatingTheStoreWhileMountedGivesEIONotACrash() throws {
        let sb = try Sandbox("truncstore")
        defer { sb.cleanup() }
        try sb.initAndMount()
        let files = (0..<400).map { sb.mnt + "/f\($0)" }
        for f in files { try E2E.write(f, E2E.randomBytes(7000)) }
        #expect(E2E.sh("sync '\(sb.mnt)'").ok)
        usleep(2_500_000)  // the idle checkpoint moves the pages into store.db, where the readers map them
        let pid = try #require(E2E.daemonPid(container: sb.container))
        let direct = "for f in \"$@\"; do dd if=\"$f\" of=/dev/null iflag=direct bs=8k status=none || echo \"failed $f\"; done"
        let first = E2E.run("/bin/sh", ["-c", direct, "sh"] + files)
        try #require(first.ok && !first.stdout.contains("failed"), "reads before the truncation: \(first)")
        #expect(truncate(sb.container + "/store.db", 1 << 20) == 0)
        let after = E2E.run("/bin/sh", ["-c", direct, "sh"] + files)
        #expect(after.stdout.contains("failed"), "every file still read after losing all but 1 MiB of the store: \(after)")
        #expect(after.stderr.contains("Input/output error"), "\(after)")
        #expect(E2E.isAlive(pid), "the daemon died when the store was truncated under it")
        #expect(sb.unmount().ok)
        #expect(E2E.wait(10) { !E2E.isAlive(pid) })
    }

    /// A segment file truncated under the mount: the files whose chunks were in it fail with EIO, the
    /// others read, and the daemon lives on.
    @Test func truncatingASegmentWhileMountedGivesEIOOnItsFilesOnly() throws {
        let sb = try Sandbox("truncsegment")
        defer { sb.cleanup() }
        try sb.initAndMount()
        let small = E2E.randomBytes(3000)
        try E2E.write(sb.mnt + "/small", small)
        for i in 0..<4 { try E2E.write(sb.mnt + "/big\(i)", E2E.randomBytes(200_000)) }
        #expect(E2E.sh("sync '\(sb.mnt)'").ok)
        let pid = try #require(E2E.daemonPid(container: sb.container))
        #expect(truncate(sb.container + "/segments/1", 100_000) == 0)
        let r = E2E.sh("for i in 0 1 2 3; do dd if='\(sb.mnt)'/big$i of=/dev/null iflag=direct bs=64k status=none || echo failed; done")
        #expect(r.stdout.components(separatedBy: "failed").count - 1 == 4, "\(r)")
        #expect(r.stderr.contains("Input/output error"), "\(r)")
        #expect(E2E.read(sb.mnt + "/small") == small, "a file held in its row is untouched")
        #expect(E2E.isAlive(pid), "the daemon died")
        #expect(sb.unmount().ok)
    }

    /// Segment files no row lists: a mount removes them once the rollback check passed (a group a crash
    /// cut off left them), but not in a store replaced by an older copy, where they hold the newer
    /// state's content: refused as a rollback, the newer segment is still there to go back to.
    @Test func straySegmentsGoOnlyAfterTheRollbackCheck() throws {
        let sb = try Sandbox("straysegments")
        defer { sb.cleanup() }
        try sb.initAndMount()
        let first = E2E.randomBytes(300_000)
        try E2E.write(sb.mnt + "/first", first)
        try #require(sb.unmount().ok)
        let saved = sb.root + "/saved.db"
        try FileManager.default.copyItem(atPath: sb.container + "/store.db", toPath: saved)
        // 70 MB more: the next segment is started (a segment takes 64 MiB).
        try #require(sb.mount().ok)
        try #require(E2E.sh("head -c 70000000 /dev/urandom > '\(sb.mnt)/second' && sync '\(sb.mnt)/second'").ok)
        try #require(sb.unmount().ok)
        try #require(FileManager.default.fileExists(atPath: sb.container + "/segments/2"))
        unlink(sb.container + "/store.db")
        try FileManager.default.copyItem(atPath: saved, toPath: sb.container + "/store.db")
        let refused = sb.mount()
        #expect(refused.status == 18, "\(refused)")
        #expect(FileManager.default.fileExists(atPath: sb.container + "/segments/2"), "the newer state's segment was removed")

        // The older state accepted (allow_rollback): what it does not list goes, as a stray file a crash
        // leaves would; what it lists stays.
        try E2E.write(sb.container + "/segments/99", E2E.randomBytes(5000))
        try #require(sb.mount(options: "allow_rollback").ok)
        #expect(!FileManager.default.fileExists(atPath: sb.container + "/segments/2"), "a segment no row lists was kept")
        #expect(!FileManager.default.fileExists(atPath: sb.container + "/segments/99"), "a stray segment file was kept")
        #expect(E2E.read(sb.mnt + "/first") == first)
        #expect(E2E.lstatOf(sb.mnt + "/second") == nil)
        #expect(sb.unmount().ok)
    }

    @Test func unmountOfSomethingElseIsRefused() throws {
        let sb = try Sandbox("unmountnot")
        defer { sb.cleanup() }
        let r = sb.unmount()
        #expect(r.status == 14, "\(r)")
    }

    @Test func unmountOfABusyMountIsRefusedAndLeavesItWorking() throws {
        let sb = try Sandbox("busy")
        defer { sb.cleanup() }
        try sb.initAndMount()
        try E2E.write(sb.mnt + "/f", "data")
        let holder = try Child("/bin/sh", ["-c", "cd \"$1\" && exec sleep 60", "sh", sb.mnt])
        defer {
            holder.spawned.signal(SIGKILL)
            holder.stop()
        }
        #expect(
            E2E.wait(10) { (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/\(holder.pid)/cwd")) == sb.mnt },
            "the holder did not enter the mount")
        let u = sb.unmount()
        #expect(u.status != 0, "\(u)")
        #expect(u.stderr.contains("busy"), "\(u)")
        #expect(E2E.isMounted(sb.mnt))
        #expect(E2E.readText(sb.mnt + "/f") == "data", "the mount stopped working after a refused unmount")
        holder.spawned.signal(SIGKILL)
        _ = holder.waitForExit(10)
        let u2 = sb.unmount()
        #expect(u2.ok, "\(u2)")
        #expect(!E2E.isMounted(sb.mnt))
    }

    /// `coffer unmount` of a mount whose daemon was killed: it unmounts, and says (non-zero) that the daemon
    /// ended without finishing. It returned 0 silently, and the file written last was gone (a tester's find).
    @Test func unmountAfterTheDaemonWasKilledSaysSo() throws {
        let sb = try Sandbox("unmountdead")
        defer { sb.cleanup() }
        try sb.initAndMount()
        try E2E.write(sb.mnt + "/f", "x")
        _ = E2E.statOf(sb.mnt)  // the root's attributes cached: the check must not be answered from them
        let pid = try #require(E2E.daemonPid(container: sb.container))
        try #require(E2E.cmdline(pid).contains(sb.container), "lock pid is not our daemon")
        #expect(kill(pid, SIGKILL) == 0)
        #expect(E2E.wait(10) { !E2E.isAlive(pid) })
        let u = sb.unmount()
        #expect(u.status == 1 && u.stderr.contains("ended without finishing"), "\(u)")
        #expect(!E2E.isMounted(sb.mnt))
    }

    @Test func autoUnmountCleansUpAfterSIGKILL() throws {
        let sb = try Sandbox("autounmount")
        defer { sb.cleanup() }
        try #require(sb.initContainer().ok)
        // `coffer mount` must return once the mount answers, auto_unmount or not.
        let first = sb.mount(options: "auto_unmount", timeout: 15)
        #expect(first.ok, "coffer mount -o auto_unmount did not return: \(first)")
        try #require(E2E.wait(5) { E2E.isMounted(sb.mnt) }, "not mounted")
        try E2E.write(sb.mnt + "/f", "x")
        let pid = try #require(E2E.daemonPid(container: sb.container))
        try #require(E2E.cmdline(pid).contains(sb.container), "lock pid is not our daemon")
        #expect(kill(pid, SIGKILL) == 0)
        #expect(E2E.wait(10) { !E2E.isMounted(sb.mnt) }, "auto_unmount left the dead mount in place")
        let m = sb.mount(timeout: 15)
        #expect(m.ok, "\(m)")
    }

    @Test func foregroundMountEndsCleanlyOnSIGTERM() throws {
        let sb = try Sandbox("fg")
        defer { sb.cleanup() }
        try #require(sb.initContainer().ok)
        let child = try Child(E2E.coffer, ["mount", "-f", sb.container, sb.mnt, "--passfile", sb.passfile])
        defer { child.stop() }
        let up = E2E.wait(30) { E2E.isMounted(sb.mnt) && E2E.answersAsMount(sb.mnt) }
        try #require(up, "foreground mount did not come up: \(child.stderr)")
        #expect(E2E.daemonPid(container: sb.container) == child.pid, "the lock is not held by the foreground process")
        let data = E2E.randomBytes(300_000)
        try E2E.write(sb.mnt + "/fg.bin", data)
        #expect(child.spawned.signal(SIGTERM))
        let status = child.waitForExit(30)
        #expect(status == 0, "foreground mount exit status \(String(describing: status)) after SIGTERM: \(child.stderr)")
        #expect(!E2E.isMounted(sb.mnt), "still mounted after SIGTERM")
        let m = sb.mount()
        try #require(m.ok, "\(m)")
        #expect(E2E.read(sb.mnt + "/fg.bin") == data, "data written before SIGTERM was not committed")
        #expect(sb.unmount().ok)
    }

    /// SIGTERM to an ordinary user's daemon (mounted through the setuid fusermount3, which also unmounts
    /// it): with the mount idle it commits the bytes still in the writeback cache, unmounts and ends; with a
    /// program inside the mount it detaches (fusermount3 -uz), serves the program to its end, then ends.
    /// Both keep every byte written, as root's do.
    @Test(.enabled(if: E2E.isRoot && E2E.which("unshare") != nil && E2E.which("setpriv") != nil, "needs root, unshare and setpriv"))
    func sigtermUnmountsAnOrdinaryUsersMount() throws {
        let sb = try Sandbox("sigtermuser")
        defer { sb.cleanup() }
        let (c, m, root) = (sb.container, sb.mnt, sb.root)
        let mount = "$AS_NOBODY \(E2E.coffer) mount \(c) \(m) --passfile \(sb.passfile)"
        let r = try sb.runUnprivileged(
            """
            trap '\(E2E.coffer) unmount \(m) >/dev/null 2>&1' EXIT
            daemon() { pgrep -u 65534 -f -- "mount \(c) \(m) --"; }
            ended() { for i in $(seq 1 100); do kill -0 "$1" 2>/dev/null || return 0; sleep 0.1; done; return 1; }
            mounted() { grep -q " \(m) fuse.coffer " /proc/mounts; }
            $AS_NOBODY \(E2E.coffer) init \(c) --passfile \(sb.passfile) \(Sandbox.kdfArgs.joined(separator: " ")) > /dev/null || exit 92
            \(mount) || exit 93
            $AS_NOBODY sh -c 'head -c 300000 /dev/urandom > \(root)/idle && cp \(root)/idle \(m)/idle' || exit 94
            pid=$(daemon); kill -TERM "$pid"
            ended "$pid" && echo "idle: ended"
            mounted || echo "idle: unmounted"
            \(mount) || exit 95
            $AS_NOBODY sh -c 'head -c 300000 /dev/urandom > \(root)/busy && cp \(root)/busy \(m)/busy' || exit 96
            $AS_NOBODY sh -c 'cd \(m) && : > inside && exec sleep 5' & sleeper=$!
            for i in $(seq 1 100); do $AS_NOBODY test -e \(m)/inside && break; sleep 0.1; done
            pid=$(daemon); kill -TERM "$pid"
            for i in $(seq 1 100); do mounted || break; sleep 0.1; done
            mounted || echo "busy: detached"
            kill -0 "$pid" 2>/dev/null && echo "busy: serving"
            wait "$sleeper"
            ended "$pid" && echo "busy: ended"
            \(mount) || exit 97
            $AS_NOBODY sh -c 'cmp \(root)/idle \(m)/idle && cmp \(root)/busy \(m)/busy' && echo "bytes kept"
            \(E2E.coffer) unmount \(m) || exit 98
            exit 0
            """)
        #expect(r.ok, "\(r)")
        for line in ["idle: ended", "idle: unmounted", "busy: detached", "busy: serving", "busy: ended", "bytes kept"] {
            #expect(r.stdout.contains(line), "\(line): \(r)")
        }
        #expect(!E2E.isMounted(m), "a mount leaked out of the private namespace")
    }

    /// SIGTERM while a program holds a file it wrote (no fsync: the bytes sit in the kernel's writeback cache)
    /// unmounts as `coffer unmount --lazy` does: the daemon serves the program until it closes, then commits
    /// and exits 0. Before, libfuse's handler ended the loop and the session was dropped: the close failed
    /// (ENOTCONN) and the file was empty after a remount. An idle mount still ends at once.
    @Test func sigtermWaitsForAProgramStillWritingThenCommitsItsBytes() throws {
        let sb = try Sandbox("sigtermbusy")
        defer { sb.cleanup() }
        let data = E2E.randomBytes(300_000)
        let (daemon, writer) = try Self.foregroundMountWithAHeldWriter(sb, writing: data)
        defer {
            writer.spawned.signal(SIGKILL)
            writer.stop()
            daemon.stop()
        }
        #expect(daemon.spawned.signal(SIGTERM))
        #expect(E2E.wait(10) { !E2E.isMounted(sb.mnt) }, "not detached after SIGTERM")
        usleep(500_000)
        #expect(daemon.spawned.isRunning, "the daemon ended while a program still had the file open: \(daemon.stderr)")
        try E2E.write(sb.root + "/go", "")
        #expect(writer.waitForExit(30) == 0, "the writer's close failed: \(writer.stderr)")
        let status = daemon.waitForExit(30)
        #expect(status == 0, "exit status \(String(describing: status)) after SIGTERM: \(daemon.stderr)")
        #expect(daemon.stderr.contains("is in use: detached"), "\(daemon.stderr)")

        // Remounted in the foreground: the bytes are there, and an idle mount ends promptly on SIGTERM.
        let again = try Child(E2E.coffer, ["mount", "-f", sb.container, sb.mnt, "--passfile", sb.passfile])
        defer { again.stop() }
        try #require(E2E.wait(30) { E2E.isMounted(sb.mnt) && E2E.answersAsMount(sb.mnt) }, "remount did not come up: \(again.stderr)")
        let held = E2E.read(sb.mnt + "/held.bin")
        let kept = held == data
        #expect(kept, "the bytes written before SIGTERM are not there after remount: \(held?.count ?? -1) of \(data.count) bytes")
        let start = Date()
        #expect(again.spawned.signal(SIGTERM))
        let idleStatus = again.waitForExit(30)
        let took = Date().timeIntervalSince(start)
        #expect(idleStatus == 0, "idle mount exit status \(String(describing: idleStatus)): \(again.stderr)")
        #expect(took < 5, "an idle mount took \(took) s to end on SIGTERM")
        #expect(!E2E.isMounted(sb.mnt))
    }

    /// A second SIGTERM while a program still uses the detached mount ends the daemon at once, and its log and
    /// status (1) say that changes may be lost.
    @Test func aSecondSIGTERMEndsAtOnceAndSaysChangesMayBeLost() throws {
        let sb = try Sandbox("sigtermtwice")
        defer { sb.cleanup() }
        let (daemon, writer) = try Self.foregroundMountWithAHeldWriter(sb, writing: Array("x".utf8))
        defer {
            writer.spawned.signal(SIGKILL)
            writer.stop()
            daemon.stop()
        }
        #expect(daemon.spawned.signal(SIGTERM))
        #expect(E2E.wait(10) { daemon.stderr.contains("is in use: detached") }, "\(daemon.stderr)")
        #expect(daemon.spawned.signal(SIGTERM))
        let status = daemon.waitForExit(10)
        #expect(status == 1, "exit status \(String(describing: status)) after a second SIGTERM: \(daemon.stderr)")
        #expect(daemon.stderr.contains("may be lost"), "\(daemon.stderr)")
    }

    /// A new container mounted in the foreground, and a program that has written `data` to `held.bin` in it
    /// without fsync and holds it open until `go` appears in the sandbox (`heldWriter`).
    private static func foregroundMountWithAHeldWriter(_ sb: Sandbox, writing data: [UInt8]) throws -> (daemon: Child, writer: Child) {
        let python = try #require(E2E.python, "python3 is needed for the program holding the file")
        try #require(sb.initContainer().ok)
        let daemon = try Child(E2E.coffer, ["mount", "-f", sb.container, sb.mnt, "--passfile", sb.passfile])
        guard E2E.wait(30, { E2E.isMounted(sb.mnt) && E2E.answersAsMount(sb.mnt) }) else {
            daemon.stop()
            throw Sandbox.SandboxError("mount did not come up: \(daemon.stderr)")
        }
        try E2E.write(sb.root + "/src", data)
        let writer = try Child(python, ["-c", heldWriter, sb.root + "/src", sb.mnt + "/held.bin", sb.root + "/written", sb.root + "/go"])
        guard E2E.wait(20, { FileManager.default.fileExists(atPath: sb.root + "/written") }) else {
            writer.stop()
            daemon.stop()
            throw Sandbox.SandboxError("the writer did not write: \(writer.stderr)")
        }
        return (daemon, writer)
    }

    /// Copies argv[1] into argv[2] without fsync and keeps it open; creates argv[3] once written, closes once
    /// argv[4] exists (exit 1 when the close fails).
    private static let heldWriter = """
        import os, sys, time
        src, dst, written, go = sys.argv[1:5]
        fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        data = memoryview(open(src, "rb").read())
        while data:
            data = data[os.write(fd, data):]
        open(written, "w").close()
        while not os.path.exists(go):
            time.sleep(0.05)
        try:
            os.close(fd)
        except OSError as e:
            print("close:", e, file=sys.stderr)
            sys.exit(1)
        """

    @Test func mountDotFuse3FormWithAbsoluteType() throws {
        let sb = try Sandbox("mounttype")
        defer { sb.cleanup() }
        try #require(sb.initContainer().ok)
        let exe = try sb.dotFreeCoffer()
        let r = E2E.run("/bin/mount", ["-t", "fuse.\(exe)", sb.container, sb.mnt, "-o", "passfile=\(sb.passfile)"])
        sb.noteDaemon()
        try #require(r.ok, "\(r)")
        #expect(E2E.answersAsMount(sb.mnt), "mount(8) returned before the mount answered")
        let entry = try #require(E2E.mountEntry(at: sb.mnt))
        #expect(entry.type.hasPrefix("fuse"), "\(entry.type)")
        #expect(entry.type == "fuse.coffer", "type is \(entry.type) (subtype from mount.fuse3 vs coffer's own)")
        try E2E.write(sb.mnt + "/via-mount8.txt", "hello from mount(8)")
        let u = E2E.run("/bin/umount", [sb.mnt])
        #expect(u.ok, "\(u)")
        #expect(!E2E.isMounted(sb.mnt))
        #expect(E2E.wait(10) { cofferProcesses(serving: sb.container).isEmpty }, "daemon still running after umount")
        let m = sb.mount()
        try #require(m.ok, "\(m)")
        #expect(E2E.readText(sb.mnt + "/via-mount8.txt") == "hello from mount(8)")
    }

    @Test func fstabLine() throws {
        let sb = try Sandbox("fstab")
        defer { sb.cleanup() }
        try #require(sb.initContainer().ok)
        let exe = try sb.dotFreeCoffer()
        let fstab = sb.root + "/fstab"
        try E2E.write(fstab, "# test fstab\n\(sb.container) \(sb.mnt) fuse.\(exe) noauto,nodev,nosuid,passfile=\(sb.passfile) 0 0\n")
        let r = E2E.run("/bin/mount", ["--fstab", fstab, sb.mnt])
        sb.noteDaemon()
        try #require(r.ok, "\(r)")
        let entry = try #require(E2E.mountEntry(at: sb.mnt))
        #expect(entry.source == sb.container, "\(entry)")
        #expect(entry.options.split(separator: ",").contains("nodev"), "nodev not applied: \(entry.options)")
        #expect(E2E.answersAsMount(sb.mnt))
        try E2E.write(sb.mnt + "/f", "fstab")
        #expect(E2E.readText(sb.mnt + "/f") == "fstab")
        let u = E2E.run("/bin/umount", [sb.mnt])
        #expect(u.ok, "\(u)")
        #expect(!E2E.isMounted(sb.mnt))
    }

    @Test func passwordNeverInTheDaemonsArgvOrEnvironment() throws {
        let sb = try Sandbox("argv")
        defer { sb.cleanup() }
        try sb.initAndMount()
        let pid = try #require(E2E.daemonPid(container: sb.container))
        try #require(E2E.isAlive(pid))
        let argv = E2E.cmdline(pid)
        #expect(!argv.isEmpty, "cannot read /proc/\(pid)/cmdline")
        #expect(argv.contains(sb.container), "lock pid \(pid) is not our daemon: \(argv)")
        #expect(!argv.joined(separator: " ").contains(sb.password), "password in the daemon's argv: \(argv)")
        let environ = String(decoding: E2E.read("/proc/\(pid)/environ") ?? [], as: UTF8.self)
        #expect(!environ.contains(sb.password), "password in the daemon's environment")
        #expect(sb.unmount().ok)
    }

    /// A daemon must not keep descriptors of whoever ran `coffer mount` (pipes a caller waits on for EOF,
    /// files on other filesystems that then cannot be unmounted, ...): only its own.
    @Test func daemonKeepsNoDescriptorsOfItsCaller() throws {
        let sb = try Sandbox("fdleak")
        defer { sb.cleanup() }
        try #require(sb.initContainer().ok)
        let marker = sb.root + "/caller-marker"
        let r = E2E.run(
            "/bin/sh",
            [
                "-c", "exec 7>\"$1\"; exec \"$2\" mount \"$3\" \"$4\" --passfile \"$5\"", "sh",
                marker, E2E.coffer, sb.container, sb.mnt, sb.passfile
            ])
        sb.noteDaemon()
        try #require(r.ok, "\(r)")
        let pid = try #require(E2E.daemonPid(container: sb.container))
        try #require(E2E.cmdline(pid).contains(sb.container))
        let fds = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/fd")) ?? []
        #expect(!fds.isEmpty, "cannot list /proc/\(pid)/fd")
        let targets = fds.compactMap { try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/\(pid)/fd/\($0)") }
        #expect(!targets.contains(marker), "the daemon inherited its caller's descriptor 7 (\(marker)); open: \(targets)")
        #expect(sb.unmount().ok)
    }

    @Test func promptedPasswordGoesThroughAPipe() throws {
        guard E2E.python != nil else {
            Issue.record("python3 missing (make test-deps installs it)")
            return
        }
        let sb = try Sandbox("argvprompt")
        defer { sb.cleanup() }
        try #require(sb.initContainer().ok)
        let r = E2E.onTerminal([E2E.coffer, "mount", sb.container, sb.mnt], answers: [("Password: ", sb.password)])
        sb.noteDaemon()
        try #require(r.status == 0, "\(r)")
        try #require(E2E.isMounted(sb.mnt))
        let pid = try #require(E2E.daemonPid(container: sb.container))
        let argv = E2E.cmdline(pid)
        #expect(argv.contains(sb.container), "\(argv)")
        #expect(!argv.joined(separator: " ").contains(sb.password), "password in argv: \(argv)")
        let environ = String(decoding: E2E.read("/proc/\(pid)/environ") ?? [], as: UTF8.self)
        #expect(!environ.contains(sb.password))
        try E2E.write(sb.mnt + "/p", "prompted")
        #expect(E2E.readText(sb.mnt + "/p") == "prompted")
        #expect(sb.unmount().ok)
    }

    @Test func fsyncedDataSurvivesSIGKILL() throws {
        guard E2E.python != nil else {
            Issue.record("python3 missing (make test-deps installs it)")
            return
        }
        let sb = try Sandbox("sigkill")
        defer { sb.cleanup() }
        try sb.initAndMount()
        let data = E2E.randomBytes(1 << 20)
        let src = sb.root + "/src.bin"
        try E2E.write(src, data)
        let w = E2E.py(
            """
            import os, sys
            data = open(sys.argv[1], 'rb').read()
            fd = os.open(sys.argv[2], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.write(fd, data)
            os.fsync(fd)
            os.close(fd)
            os.mkdir(sys.argv[3])
            fd = os.open(sys.argv[3], os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)
            """, [src, sb.mnt + "/synced.bin", sb.mnt + "/synced-dir"])
        try #require(w.ok, "\(w)")
        let pid = try #require(E2E.daemonPid(container: sb.container))
        try #require(E2E.cmdline(pid).contains(sb.container), "lock pid is not our daemon")
        #expect(kill(pid, SIGKILL) == 0)
        #expect(E2E.wait(10) { !E2E.isAlive(pid) })
        let z = E2E.run("/bin/fusermount3", ["-uz", sb.mnt])
        #expect(z.ok, "\(z)")
        #expect(!E2E.isMounted(sb.mnt))
        // The stale lock (file still naming the dead pid) is taken over.
        let m = sb.mount()
        try #require(m.ok, "remount after SIGKILL failed: \(m)")
        #expect(E2E.read(sb.mnt + "/synced.bin") == data, "fsynced file lost or damaged")
        #expect(E2E.statOf(sb.mnt + "/synced-dir").map { ($0.st_mode & S_IFMT) == S_IFDIR } == true)
        #expect(sb.unmount().ok)
        #expect(sb.mount().ok, "a third mount fails")
        #expect(E2E.read(sb.mnt + "/synced.bin") == data)
    }

    @Test func readOnlyMount() throws {
        let sb = try Sandbox("ro")
        defer { sb.cleanup() }
        try sb.initAndMount()
        try E2E.write(sb.mnt + "/a", "before")
        try sb.remount(options: "ro")
        #expect(E2E.readText(sb.mnt + "/a") == "before")
        #expect(E2E.mountEntry(at: sb.mnt)?.options.split(separator: ",").contains("ro") == true)
        let w = E2E.sh("echo x > '\(sb.mnt)/b'")
        #expect(!w.ok, "write on a read-only mount succeeded")
        #expect(w.stderr.contains("Read-only"), "\(w)")
    }
}

/// Rollback: a store replaced by an older copy of itself is refused at mount (issue "Integrity").
@Suite("Rollback detection") struct RollbackTests {
    @Test func olderStoreIsRefusedUnlessAllowed() throws {
        guard E2E.fuseAvailable else {
            print("skipped: /dev/fuse missing")
            return
        }
        let sb = try Sandbox("rollback")
        defer { sb.cleanup() }
        try sb.initAndMount()
        try E2E.write(sb.mnt + "/old.txt", "old")
        try #require(sb.unmount().ok)
        // An attacker's copy of the store as it is now...
        let saved = sb.root + "/saved"
        try #require(mkdir(saved, 0o700) == 0)
        for f in ["store.db", "store.db-wal", "store.db-shm"] where FileManager.default.fileExists(atPath: sb.container + "/" + f) {
            try FileManager.default.copyItem(atPath: sb.container + "/" + f, toPath: saved + "/" + f)
        }
        // ...the user goes on working...
        try #require(sb.mount().ok)
        try E2E.write(sb.mnt + "/new.txt", "new")
        try #require(sb.unmount().ok)
        // ...and the old copy is put back.
        for f in ["store.db", "store.db-wal", "store.db-shm"] {
            unlink(sb.container + "/" + f)
            if FileManager.default.fileExists(atPath: saved + "/" + f) {
                try FileManager.default.copyItem(atPath: saved + "/" + f, toPath: sb.container + "/" + f)
            }
        }
        let refused = sb.mount()
        #expect(refused.status == 18, "rollback must be refused with its own status: \(refused)")
        #expect(refused.stderr.contains("older"), "\(refused)")
        #expect(!E2E.isMounted(sb.mnt), "nothing may stay mounted")
        let accepted = sb.mount(options: "allow_rollback")
        #expect(accepted.ok, "\(accepted)")
        #expect(E2E.readText(sb.mnt + "/old.txt") == "old")
        #expect(E2E.readText(sb.mnt + "/new.txt") == nil, "the rolled-back store does not have the newer file")
        #expect(sb.unmount().ok)
        // Accepted once, it is the newest seen: mounts normally again.
        let again = sb.mount()
        #expect(again.ok, "\(again)")
    }
}

/// A full disk: ENOSPC to the writer, the daemon keeps running, synced data survives, and writing
/// works again once space is freed.
@Suite("Full disk") struct FullDiskTests {
    /// A container on a 24 MiB tmpfs in a sandbox, mounted, with 3 MB synced in keep.bin. After
    /// `body` the mount and the tmpfs go, also when it fails.
    private func onASmallDisk(_ name: String, _ body: (Sandbox, _ container: String, _ keep: [UInt8]) throws -> Void) throws {
        let sb = try Sandbox(name)
        defer { sb.cleanup() }
        let disk = sb.root + "/disk"
        try #require(mkdir(disk, 0o700) == 0)
        let tmpfs = E2E.sh("mount -t tmpfs -o size=24m tmpfs '\(disk)'")
        try #require(tmpfs.ok, "\(tmpfs)")
        defer { _ = E2E.sh("umount '\(disk)' || umount -l '\(disk)'") }
        let container = disk + "/c"
        try #require(sb.initContainer(container: container).ok)
        let m = sb.mount(container: container)
        try #require(m.ok, "\(m)")
        defer { _ = sb.unmount() }
        let keep = E2E.randomBytes(3_000_000)
        try E2E.write(sb.mnt + "/keep.bin", keep)
        #expect(E2E.sh("sync '\(sb.mnt)/keep.bin'").ok)
        try body(sb, container, keep)
    }

    /// Two containers on two small filesystems (tmpfs) whose directories have the same inode number: a mount
    /// of one is no reason to refuse the other. /proc/locks names a lock by device and inode, and a lock on the
    /// same inode elsewhere was taken for this container's (full-disk tests failed as "already mounted" when
    /// they ran beside each other).
    @Test func aLockOnTheSameInodeElsewhereIsNotThisContainers() throws {
        let sb = try Sandbox("sameinode")
        defer { sb.cleanup() }
        var roots: [String] = []
        for name in ["d1", "d2"] {
            let disk = sb.root + "/" + name
            try #require(mkdir(disk, 0o700) == 0)
            try #require(E2E.sh("mount -t tmpfs -o size=8m tmpfs '\(disk)'").ok)
            roots.append(disk)
        }
        defer { for disk in roots { _ = E2E.sh("umount '\(disk)' || umount -l '\(disk)'") } }
        let a = roots[0] + "/c", b = roots[1] + "/c"
        try #require(sb.initContainer(container: a).ok && sb.initContainer(container: b).ok)
        let inodeA = try #require(E2E.statOf(a)).st_ino, inodeB = try #require(E2E.statOf(b)).st_ino
        try #require(inodeA == inodeB, "the case needs the same inode number on both filesystems")
        let mntB = sb.root + "/mb"
        try #require(mkdir(mntB, 0o700) == 0)
        try #require(sb.mount(container: a).ok)
        let mountedB = sb.mount(container: b, at: mntB)
        #expect(mountedB.ok, "\(mountedB)")
        try E2E.write(mntB + "/f", "b")
        #expect(sb.unmount(mntB).ok)
        #expect(E2E.readText(sb.mnt + "/f") == nil, "two containers")
        #expect(sb.unmount().ok)
    }

    /// A copy larger than the disk, under the writeback cache (a tester's find): cp fails at close, and the file
    /// left is the prefix that fit, not the whole size with tens of MB of zeros before a tail that still fit
    /// (the kernel writes a file's pages back after write(2) returned, and a later, smaller one was accepted).
    /// Writes already in flight when the first was refused may leave a few MiB of zeros near the end.
    @Test(.enabled(if: E2E.isRoot, "a tmpfs of fixed size needs root"))
    func aCopyThatDoesNotFitLeavesAPrefix() throws {
        let sb = try Sandbox("enospcprefix")
        defer { sb.cleanup() }
        let container = try sb.smallDisk("40m") + "/c"
        try #require(sb.initContainer(container: container).ok)
        try #require(sb.mount(container: container).ok)
        let source = E2E.randomBytes(60_000_000)
        try E2E.write(sb.root + "/src", source)
        let cp = E2E.run("/bin/cp", [sb.root + "/src", sb.mnt + "/copy"])
        #expect(!cp.ok && cp.stderr.contains("No space left"), "\(cp)")
        #expect(sb.unmount().ok)
        try #require(sb.mount(container: container).ok)
        let copy = try #require(E2E.read(sb.mnt + "/copy"))
        let same = (0..<min(copy.count, source.count)).first { copy[$0] != source[$0] } ?? copy.count
        #expect(copy.count < source.count && copy.count <= same + (16 << 20), "kept \(copy.count) bytes, the first \(same) as written")
        let past = (same..<copy.count).filter { copy[$0] != 0 && copy[$0] != source[$0] }
        #expect(past.isEmpty, "bytes neither written nor zero past \(same): \(past.count)")
        #expect(same > 8 << 20, "only \(same) bytes kept")
        #expect(sb.unmount().ok)
        let fsck = E2E.coffer(["fsck", container, "--passfile", sb.passfile])
        #expect(fsck.ok, "\(fsck)")
    }

    @Test func enospcLosesNothingSynced() throws {
        guard E2E.fuseAvailable else {
            print("skipped: /dev/fuse missing")
            return
        }
        try onASmallDisk("enospc") { sb, container, keep in
            let fill = E2E.sh("dd if=/dev/zero of='\(sb.mnt)/fill' bs=1M count=100 conv=fsync")
            #expect(!fill.ok, "writing 100 MiB onto a 24 MiB disk must fail: \(fill)")
            #expect(fill.stderr.contains("No space left"), "the writer is told ENOSPC: \(fill)")
            let pid = E2E.daemonPid(container: container)
            #expect(pid.map(E2E.isAlive) == true, "the daemon keeps running")
            #expect(E2E.read(sb.mnt + "/keep.bin") == keep, "synced data is intact")
            _ = E2E.sh("rm -f '\(sb.mnt)/fill'")
            let again = E2E.sh("dd if=/dev/urandom of='\(sb.mnt)/after' bs=64k count=16 conv=fsync")
            #expect(again.ok, "writing works again after deleting: \(again)")
            let u = sb.unmount()
            #expect(u.ok, "\(u)")
            let r = sb.mount(container: container)
            #expect(r.ok, "\(r)")
            #expect(E2E.read(sb.mnt + "/keep.bin") == keep, "synced data is intact after a remount")
            #expect(E2E.read(sb.mnt + "/after")?.count == 1 << 20)
        }
    }

    /// Names made on a full disk (mkdir, symlink, create, link, xattrs) are each refused with ENOSPC or kept: none is answered
    /// and then lost with a group that cannot commit. A tester's find: 3,000 mkdirs answered, listed, and gone a
    /// second later and after the remount, with no warning at unmount. Once the filler is removed, names are made
    /// again, and kept.
    @Test(.enabled(if: E2E.isRoot, "a tmpfs of fixed size needs root"))
    func namesMadeOnAFullDiskAreRefusedOrKept() throws {
        try onASmallDisk("enospcnames") { sb, container, keep in
            try #require(E2E.sh("setfattr -n user.pre -v 1 '\(sb.mnt)/keep.bin'").ok)
            let fill = E2E.sh("dd if=/dev/urandom of='\(sb.mnt)/fill' bs=1M count=40")
            #expect(!fill.ok && fill.stderr.contains("No space left"), "the disk fills: \(fill)")
            let script = sb.root + "/names.py"
            try E2E.write(
                script,
                """
                import errno, os, sys
                os.chdir(sys.argv[1])
                p = sys.argv[2]
                made = []
                for i in range(1500):
                    for name, make in (
                        (p + "d%d" % i, os.mkdir), (p + "s%d" % i, lambda n: os.symlink("keep.bin", n)),
                        (p + "f%d" % i, lambda n: os.close(os.open(n, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))),
                        (p + "l%d" % i, lambda n: os.link("keep.bin", n))):
                        try:
                            make(name)
                            made.append(name)
                        except OSError as e:
                            if e.errno != errno.ENOSPC: raise
                try:
                    os.setxattr("keep.bin", "user." + p, b"x" * 2000)
                    made.append("user." + p)
                except OSError as e:
                    if e.errno != errno.ENOSPC: raise
                # What a put would fail with given room, it fails with on a full disk too (ext4 does).
                for flag, name, want in ((os.XATTR_CREATE, "user.pre", errno.EEXIST), (os.XATTR_REPLACE, "user.no" + p, errno.ENODATA)):
                    try:
                        os.setxattr("keep.bin", name, b"y", flag)
                        sys.exit("%s was put" % name)
                    except OSError as e:
                        if e.errno != want: sys.exit("%s: %s, not %s" % (name, e, errno.errorcode[want]))
                print(" ".join(made))
                """)
            func names(_ prefix: String) throws -> Set<String> {
                let r = E2E.sh("python3 '\(script)' '\(sb.mnt)' \(prefix)")
                try #require(r.ok, "only ENOSPC may refuse a name: \(r)")
                return Set(r.stdout.split(whereSeparator: { $0 == " " || $0 == "\n" }).map(String.init))
            }
            let full = try names("a")
            #expect(full.count < 6001, "a full disk refused nothing: \(full.count) names made")
            // Room again (the space reserved for deletes, released when the disk filled, is taken back first).
            let rm = E2E.sh("rm '\(sb.mnt)/fill'")
            #expect(rm.ok, "\(rm)")
            let roomy = try names("b")
            #expect(!roomy.isEmpty, "nothing was made with room freed")
            let answered = full.union(roomy)
            let u = sb.unmount()
            #expect(u.ok && !u.stderr.contains("lost"), "\(u)")
            try #require(sb.mount(container: container).ok)
            let listed = Set((try? FileManager.default.contentsOfDirectory(atPath: sb.mnt)) ?? [])
            let kept = listed.filter { $0.hasPrefix("a") || $0.hasPrefix("b") }
            let answeredNames = answered.filter { !$0.hasPrefix("user.") }
            let lost = answeredNames.subtracting(kept).count, unanswered = kept.subtracting(answeredNames).count
            #expect(lost == 0 && unanswered == 0, "of \(answeredNames.count) names answered, \(lost) are gone; \(unanswered) are there unanswered")
            for x in ["a", "b"] {
                let note = E2E.sh("getfattr --only-values -n user.\(x) '\(sb.mnt)/keep.bin'")
                #expect(note.ok == answered.contains("user." + x), "user.\(x) is there exactly when it was answered: \(note)")
            }
            #expect(E2E.read(sb.mnt + "/keep.bin") == keep, "synced data is intact")
        }
    }

    /// Another program fills the disk and the daemon's next group commit fails: the group is dropped (its writers
    /// hear ENOSPC), and that is no rollback. The ledger used to be told the generation of the commit that failed,
    /// and the next mount was refused as a rollback (status 18).
    @Test func aCommitTheFullDiskDroppedIsNoRollbackAtTheNextMount() throws {
        try onASmallDisk("droppedcommit") { sb, container, keep in
            let disk = (container as NSString).deletingLastPathComponent
            _ = E2E.sh("dd if=/dev/zero of='\(disk)/filler' bs=4k")  // ends when the disk is full
            let writes = E2E.sh("mkdir '\(sb.mnt)/d' && for i in $(seq 1 300); do head -c 8000 /dev/urandom > '\(sb.mnt)/d/f'$i || exit 1; done")
            // ENOSPC, or the directory made in the dropped group is gone with it.
            #expect(!writes.ok && (writes.stderr.contains("No space left") || writes.stderr.contains("nonexistent")), "\(writes)")
            #expect(sb.unmount().ok)
            _ = E2E.sh("rm -f '\(disk)/filler'")
            let again = sb.mount(container: container)
            try #require(again.ok, "\(again)")
            let intact = E2E.read(sb.mnt + "/keep.bin") == keep
            #expect(intact, "synced data is intact")
        }
    }

    /// Small files written without fsync into a new directory until the disk is full, the writer going on
    /// after its first ENOSPC (cp -r, tar): the disk's room decides when writes fail, and every file whose
    /// write was answered is there, whole, the directory with them. Two ways this lost answered files:
    /// every file's bytes waited in the daemon's memory for the group commit, which found no room and took
    /// the whole group (the directory included); and once the disk was full, writes still went into memory
    /// and were answered, and the next attempt to store them dropped the group again (87 of every 88 small
    /// files accepted and lost).
    @Test func smallFilesUntilTheDiskIsFullKeepWhatWasWrittenBefore() throws {
        try onASmallDisk("fullsmall") { sb, _, keep in
            let fill = E2E.py(
                #"""
                import errno, os, sys
                d = os.path.join(sys.argv[1], 'd')
                os.mkdir(d)
                written, failed = [], 0
                for i in range(3000):
                    try:
                        with open(os.path.join(d, 'f%d' % i), 'wb') as f:
                            f.write(bytes([i % 251]) * 20000)
                        written.append('f%d' % i)
                    except OSError as e:
                        if e.errno != errno.ENOSPC:
                            print('unexpected', e); sys.exit(3)
                        failed += 1
                        if failed > 30: break
                print(' '.join(written))
                """#, [sb.mnt])
            try #require(fill.ok, "\(fill)")
            let written = fill.stdout.split(separator: " ").map { $0.trimmingCharacters(in: .whitespacesAndNewlines) }
            // 24 MiB, of which keep.bin and the 8 MiB reserve take 11: about 650 such files fit.
            #expect(
                written.count > 100 && written.count < 1000, "the writes fail once the disk is full: \(written.count) files of 20,000 bytes accepted")
            let wrong = written.filter { name in
                guard let i = Int(name.dropFirst()) else { return true }
                return E2E.read(sb.mnt + "/d/" + name) != [UInt8](repeating: UInt8(i % 251), count: 20000)
            }
            #expect(wrong.isEmpty, "every file whose write was answered is there and reads back: \(wrong.count) are not, e.g. \(wrong.prefix(5))")
            #expect(E2E.read(sb.mnt + "/keep.bin") == keep, "synced data is intact")
        }
    }

    /// Files of 3,000 bytes (their chunks are rows in the database, not segments) until the disk is full,
    /// then half of them deleted: new small files can be written. Deleting rows frees pages inside the
    /// database, not on the disk, and the room check (RoomCheck.swift) first counted only the disk.
    @Test func smallFilesFitWhereDeletedSmallFilesWere() throws {
        try onASmallDisk("fullrows") { sb, _, _ in
            let run = E2E.py(
                #"""
                import errno, os, sys
                d = sys.argv[1]; ok = []; full = 0
                for i in range(100000):
                    try:
                        with open(os.path.join(d, 'f%d' % i), 'wb') as f:
                            f.write(bytes([i % 251]) * 3000)
                        ok.append(i)
                    except OSError as e:
                        if e.errno != errno.ENOSPC:
                            print('unexpected', e); sys.exit(3)
                        full += 1
                        if full > 20: break
                os.sync()
                for i in ok[: len(ok) // 2]: os.unlink(os.path.join(d, 'f%d' % i))
                fd = os.open(d, os.O_RDONLY); os.fsync(fd); os.close(fd)
                for k in range(20):
                    with open(os.path.join(d, 'new%d' % k), 'wb') as f:
                        f.write(b'n' * 1000); f.flush(); os.fsync(f.fileno())
                print(len(ok))
                """#, [sb.mnt])
            #expect(run.ok, "writing small files where deleted ones were: \(run)")
            let written = Int(run.stdout.trimmingCharacters(in: .whitespacesAndNewlines)) ?? 0
            #expect(written > 1000, "the disk took many small files before it was full: \(run)")
            #expect(E2E.read(sb.mnt + "/new19") == Array(repeating: UInt8(ascii: "n"), count: 1000))
        }
    }

    /// A large file written a MiB at a time, each fsynced, until the disk is full: the write that fails
    /// leaves nothing behind. Its rows went into the group without the chunk map naming them, were
    /// committed at the unmount, and fsck found them past the end of the file (reads there gave EIO once
    /// the file grew over them).
    @Test func aWriteTheFullDiskStoppedLeavesNoRowsBehind() throws {
        try onASmallDisk("fullbig") { sb, container, _ in
            let writes = E2E.sh(
                "for i in $(seq 0 39); do dd if=/dev/urandom of='\(sb.mnt)/big' bs=1M count=1 seek=$i conv=notrunc,fsync status=none || exit 1; done")
            #expect(!writes.ok && writes.stderr.contains("No space left"), "\(writes)")
            #expect(sb.unmount().ok)
            let fsck = E2E.coffer(["fsck", container, "--passfile", sb.passfile], timeout: 120)
            #expect(fsck.status == 0, "\(fsck)")
        }
    }

    /// Many small files written in 10 KiB records (they wait in the tail buffer until fsync or
    /// close) until the disk is full: every failure is ENOSPC, from write or fsync, every file
    /// whose fsync succeeded reads back, and the daemon keeps running.
    @Test func smallFilesUntilTheDiskIsFull() throws {
        guard E2E.fuseAvailable else {
            print("skipped: /dev/fuse missing")
            return
        }
        try onASmallDisk("enospcsmall") { sb, container, keep in
            let pid = E2E.daemonPid(container: container)
            let appends = E2E.py(
                #"""
                import errno, os, sys
                ok, full = [], 0
                for i in range(1000):
                    p = os.path.join(sys.argv[1], 'small%d' % i)
                    data = bytes([i % 251]) * 30000
                    try:
                        fd = os.open(p, os.O_WRONLY | os.O_CREAT, 0o644)
                        try:
                            for k in range(0, len(data), 10240):
                                os.write(fd, data[k:k + 10240])
                            os.fsync(fd)
                            ok.append(i)
                        finally:
                            os.close(fd)
                    except OSError as e:
                        if e.errno != errno.ENOSPC:
                            print('unexpected', e); sys.exit(3)
                        full += 1
                for i in ok:
                    if open(os.path.join(sys.argv[1], 'small%d' % i), 'rb').read() != bytes([i % 251]) * 30000:
                        print('wrong bytes in small%d' % i); sys.exit(4)
                print(len(ok), full)
                """#, [sb.mnt])
            #expect(appends.ok, "\(appends)")
            let counts = appends.stdout.split(separator: " ").compactMap { Int($0.trimmingCharacters(in: .whitespacesAndNewlines)) }
            #expect(counts.count == 2 && counts[1] > 0, "the full disk must refuse some small files: \(appends)")
            #expect(pid.map(E2E.isAlive) == true, "the daemon keeps running after failed tail flushes")
            #expect(E2E.read(sb.mnt + "/keep.bin") == keep, "synced data is intact")
        }
    }

    /// Small fsynced files until the disk is full (the writer keeps trying after the first ENOSPC,
    /// as cp -r does), then all of them deleted at once: the deletes commit (fsync of the
    /// directory succeeds), a 1 MiB file can be written, and after a remount the deleted files
    /// stay deleted. The writer used to fill the space the reserve gave back, and the last
    /// commits' frames could not be checkpointed into the database file, so the WAL could not
    /// start over and even the deletes needed new room (docs/MEASUREMENTS.md, "Full disk").
    @Test func deletingManySmallFilesOnAFullDisk() throws {
        guard E2E.fuseAvailable else {
            print("skipped: /dev/fuse missing")
            return
        }
        try onASmallDisk("enospcrm") { sb, container, keep in
            let fill = E2E.py(
                #"""
                import errno, os, sys
                made, full, streak = 0, 0, 0
                for i in range(3000):
                    if streak >= 50: break
                    p = os.path.join(sys.argv[1], 'small%d' % i)
                    try:
                        fd = os.open(p, os.O_WRONLY | os.O_CREAT, 0o644)
                        try:
                            os.write(fd, bytes([i % 251]) * 30000)
                            os.fsync(fd)
                            streak = 0
                        finally:
                            os.close(fd)
                    except OSError as e:
                        if e.errno != errno.ENOSPC:
                            print('unexpected', e); sys.exit(3)
                        full += 1; streak += 1
                names = [n for n in os.listdir(sys.argv[1]) if n.startswith('small')]
                for n in names:
                    os.unlink(os.path.join(sys.argv[1], n))
                d = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECTORY)
                try:
                    os.fsync(d)
                except OSError as e:
                    print('fsync of the directory after deleting:', e); sys.exit(5)
                finally:
                    os.close(d)
                print(len(names), full)
                """#, [sb.mnt])
            #expect(fill.ok, "\(fill)")
            let counts = fill.stdout.split(separator: " ").compactMap { Int($0.trimmingCharacters(in: .whitespacesAndNewlines)) }
            #expect(counts.count == 2 && counts[0] > 100 && counts[1] > 0, "many small files, then ENOSPC: \(fill)")
            let after = E2E.randomBytes(1 << 20)
            do { try E2E.write(sb.mnt + "/after", after) } catch { Issue.record("writing 1 MiB after deleting: \(error)") }
            let synced = E2E.sh("sync '\(sb.mnt)/after'")
            #expect(synced.ok, "a 1 MiB file can be written and synced after deleting: \(synced)")
            #expect(E2E.read(sb.mnt + "/after").map { $0 == after } == true, "the new file reads back")
            let u = sb.unmount()
            try #require(u.ok, "\(u)")
            let r = sb.mount(container: container)
            try #require(r.ok, "\(r)")
            let names = (try? FileManager.default.contentsOfDirectory(atPath: sb.mnt))?.sorted() ?? []
            let onlyTheKeptFiles = names == ["after", "keep.bin"]
            #expect(onlyTheKeptFiles, "the deleted files stay deleted after a remount: \(names.prefix(5)) (\(names.count) names)")
            #expect(E2E.read(sb.mnt + "/after").map { $0 == after } == true, "the file written after deleting reads back after a remount")
            #expect(E2E.read(sb.mnt + "/keep.bin").map { $0 == keep } == true, "synced data is intact after a remount")
        }
    }
}

/// Chunk rows deleted from an unmounted container: the file reads as EIO, never as zeros; the
/// other files stay readable (issue "Integrity", the part the sealed chunk count covers).
@Suite("Deleted chunks") struct DeletedChunkTests {
    @Test(arguments: ["idx = 1", "idx = (SELECT max(idx) FROM chunks c2 WHERE c2.file = chunks.file)"])
    func deletedChunkIsEIO(which: String) throws {
        guard E2E.fuseAvailable else {
            print("skipped: /dev/fuse missing")
            return
        }
        guard E2E.which("sqlite3") != nil else {
            Issue.record("sqlite3 missing (make test-deps installs it)")
            return
        }
        let sb = try Sandbox("chunkdel")
        defer { sb.cleanup() }
        try sb.initAndMount()
        let big = E2E.randomBytes(200_000)  // 7 chunks of 32 KiB
        let small = E2E.randomBytes(1000)  // 1 chunk
        try E2E.write(sb.mnt + "/big.bin", big)
        try E2E.write(sb.mnt + "/small.bin", small)
        try #require(sb.unmount().ok)
        let sql = "DELETE FROM chunks WHERE file IN (SELECT file FROM chunks GROUP BY file HAVING count(*) = 7) AND \(which);"
        let edit = E2E.sh("sqlite3 '\(sb.container)/store.db' \"\(sql)\" && sqlite3 '\(sb.container)/store.db' 'SELECT changes();'")
        try #require(edit.ok, "\(edit)")
        try #require(sb.mount().ok)
        let read = E2E.sh("cat '\(sb.mnt)/big.bin' > /dev/null")
        #expect(!read.ok, "a file with a deleted chunk must not read: \(read)")
        #expect(read.stderr.contains("Input/output error"), "\(read)")
        #expect(E2E.read(sb.mnt + "/small.bin") == small, "the other files stay readable")
    }
}
