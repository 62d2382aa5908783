import Foundation
import Testing

#if canImport(Glibc)
    import Glibc
#endif

// Issue 18: what a newcomer trips over on the command line (version, mistyped commands, checks before
// any password, stacked mounts, help texts, mount flags, leftovers, unmount-then-mount).

@Suite("CLI: first use")
struct FirstUseTests {
    @Test func versionInEveryForm() {
        let outputs = [["--version"], ["-V"], ["version"]].map { E2E.coffer($0) }
        for r in outputs {
            #expect(r.ok, "\(r)")
            #expect(r.stdout.hasPrefix("coffer ") && r.stdout.contains("container format coffer-container version 1"), "\(r)")
        }
        #expect(Set(outputs.map(\.stdout)).count == 1, "the three forms print the same: \(outputs)")
    }

    @Test func mistypedCommandIsNotAMount() throws {
        let sb = try Sandbox("inof")
        defer { sb.cleanup() }
        try #require(sb.initContainer().ok)
        let r = E2E.coffer(["inof", sb.container])
        #expect(r.status == 64, "\(r)")
        #expect(r.stderr.contains("unknown command \"inof\""), "\(r)")
        for command in ["init", "info", "passwd", "mount", "unmount", "fsck", "version"] {
            #expect(r.stderr.contains("  \(command) "), "the command list names \(command): \(r)")
        }
        // On a terminal nothing asks for a password either.
        let tty = E2E.onTerminal([E2E.coffer, "inof", sb.container], answers: [])
        #expect(tty.status == 64 && !tty.stdout.contains("assword: "), "\(tty)")
        // Aliases are commands too.
        let alias = E2E.coffer(["umount", sb.mnt])
        #expect(alias.status == 14 && alias.stderr.contains("not a mounted Coffer container"), "\(alias)")
        // A path that is not a container is not taken for a mount.
        let notContainer = E2E.coffer([sb.mnt, sb.mnt])
        #expect(notContainer.status == 64 && notContainer.stderr.contains("not a Coffer container"), "\(notContainer)")
    }

    /// A URI is taken as a mount (PostgresCLITests mounts them); one carrying the database password is
    /// refused (64) without printing it: the password belongs in ~/.pgpass, not in argv.
    @Test func containerURIIsTakenAsAMountAndAPasswordInItRefusedClearly() throws {
        let sb = try Sandbox("uri")
        defer { sb.cleanup() }
        let r = E2E.coffer(["postgresql://me:hunter2@db.example/vault", sb.mnt, "-o", "passfile=" + sb.passfile])
        #expect(r.status == 64, "\(r)")
        #expect(r.stderr.contains("carries the database password") && r.stderr.contains("~/.pgpass") && !r.stderr.contains("unknown command"), "\(r)")
        #expect(!r.stderr.contains("hunter2"), "the URI's password is printed: \(r)")
        #expect(!E2E.isMounted(sb.mnt))
    }

    @Test func containerAndMountpointAreCheckedBeforeAnyPassword() throws {
        let sb = try Sandbox("beforepw")
        defer { sb.cleanup() }
        try #require(sb.initContainer().ok)
        let cases: [(args: [String], status: Int32)] = [
            (["mount", sb.root + "/missing", sb.mnt], 10),
            (["mount", sb.container, sb.root + "/nomnt"], 14),
            (["init", sb.container], 10),
            (["passwd", sb.root + "/missing"], 10),
            (["passwd", sb.container, "--new-passfile", sb.root + "/missing"], 17),
            (["info", "--unlock", sb.root + "/missing"], 10),
            (["fsck", sb.root + "/missing"], 8)
        ]
        for c in cases {
            let r = E2E.onTerminal([E2E.coffer] + c.args, answers: [])
            #expect(r.status == c.status, "\(c.args): \(r)")
            #expect(!r.stdout.contains("assword: "), "\(c.args) asked for a password: \(r)")
        }
        // Without a terminal, the same answer (not "no password source").
        let plain = E2E.coffer(["mount", "/nonexistent", sb.mnt])
        #expect(plain.status == 10 && !plain.stderr.contains("password"), "\(plain)")
    }

    @Test func infoChecksThePasswordSourceBeforePrintingTheHeader() throws {
        let sb = try Sandbox("infopf")
        defer { sb.cleanup() }
        try #require(sb.initContainer().ok)
        let r = E2E.coffer(["info", "--passfile", sb.root + "/nonexistent", sb.container])
        #expect(r.status == 17 && r.stderr.contains("cannot read password file"), "\(r)")
        #expect(r.stdout.isEmpty, "the header was printed first: \(r)")
        let ok = E2E.coffer(["info", "--passfile", sb.passfile, sb.container])
        #expect(ok.ok && ok.stdout.contains("Key slots:") && ok.stdout.contains("Generation:"), "\(ok)")
    }

    @Test func mountsDoNotStackAndAlreadyMountedSaysWhere() throws {
        let sb = try Sandbox("stack")
        defer { sb.cleanup() }
        try sb.initAndMount()
        let second = sb.root + "/c2"
        try #require(sb.initContainer(container: second).ok)
        let r = sb.mount(container: second)
        #expect(r.status == 14 && r.stderr.contains("already a mountpoint"), "\(r)")
        #expect(E2E.mountTable().filter { $0.mountpoint == sb.mnt }.count == 1, "two mounts on \(sb.mnt)")

        let other = sb.root + "/m2"
        try #require(mkdir(other, 0o755) == 0)
        let twice = sb.mount(at: other)
        let pid = try #require(E2E.daemonPid(container: sb.container))
        #expect(twice.status == 15 && twice.stderr.contains("already mounted on \(sb.mnt) (daemon pid \(pid))"), "\(twice)")

        // -o nonempty mounts over it as asked.
        let over = sb.mount(container: second, options: "nonempty")
        #expect(over.ok, "\(over)")
        #expect(E2E.mountTable().filter { $0.mountpoint == sb.mnt }.count == 2)
        sb.noteDaemon(container: second)
    }

    /// The option names `help mount` lists: lines "  NAME[, NAME]: what it does" under "Options (-o".
    static func documentedOptions(_ help: String) -> [String] {
        help.split(separator: "\n", omittingEmptySubsequences: false)
            .drop { !$0.hasPrefix("Options (-o") }.dropFirst().prefix { !$0.isEmpty }
            .flatMap { $0.dropFirst(2).split(separator: ":", maxSplits: 1)[0].split(separator: ",") }
            .map { $0.trimmingCharacters(in: .whitespaces) }
    }

    @Test func helpListsEveryMountOptionOnceAndWrapsFreely() throws {
        let wide = ["COLUMNS": "2000", "PATH": "/usr/bin:/bin"]
        let help = E2E.run(E2E.coffer, ["help", "mount"], environment: wide)
        try #require(help.ok, "\(help)")
        let names = Self.documentedOptions(help.stdout)
        #expect(names.count >= 20, "\(names)")
        for name in ["passfile=FILE", "allow_rollback", "max_threads=N", "no_writeback_cache", "suid", "dev", "nonempty"] {
            #expect(names.contains(name), "help mount leaves out \(name): \(names)")
        }
        // The unknown-option error and the man page name the same options.
        let bad = E2E.coffer(["mount", "/x", "/y", "-o", "bogus"])
        #expect(bad.status == 64, "\(bad)")
        let man = try #require(
            E2E.readText(
                URL(fileURLWithPath: #filePath).deletingLastPathComponent()
                    .appendingPathComponent("../../docs/coffer.1").standardizedFileURL.path))
        for name in names {
            #expect(bad.stderr.contains(name), "the unknown-option error leaves out \(name): \(bad)")
            #expect(man.contains(name.replacingOccurrences(of: "-", with: "\\-")), "docs/coffer.1 leaves out \(name) (make man)")
        }
        // No hard line breaks inside a sentence: at 2000 columns each paragraph is one line.
        #expect(help.stdout.split(separator: "\n").contains { $0.hasPrefix("Returns once") && $0.hasSuffix("password is asked.") }, "\(help)")
        let top = E2E.run(E2E.coffer, ["--help"], environment: wide)
        #expect(
            top.stdout.split(separator: "\n").contains { $0.hasPrefix("Exit statuses:") && $0.hasSuffix("(see `coffer fsck --help`).") }, "\(top)")
        // init creates a password slot: no --keyfile, and --kdf's default said once.
        let initHelp = E2E.run(E2E.coffer, ["init", "--help"], environment: wide)
        #expect(!initHelp.stdout.contains("--keyfile") && !initHelp.stdout.contains("key file slot"), "\(initHelp)")
        #expect(initHelp.stdout.components(separatedBy: "argon2id").count - 1 == 2, "--kdf: values and default once each: \(initHelp)")
    }

    @Test func nosuidNodevInEveryForm() throws {
        let sb = try Sandbox("nosuid")
        defer { sb.cleanup() }
        try #require(sb.initContainer().ok)
        func flags() throws -> Set<Substring> { Set(try #require(E2E.mountEntry(at: sb.mnt)).options.split(separator: ",")) }
        let forms: [(String, () throws -> RunResult, Bool)] = [
            ("coffer mount", { sb.mount() }, true),
            ("mount -t fuse.coffer", { try sb.mountWithMount8() }, true),
            ("coffer mount -o suid,dev", { sb.mount(options: "suid,dev") }, false),
            ("mount -t fuse.coffer -o allow_suid,allow_dev", { try sb.mountWithMount8(options: "allow_suid,allow_dev") }, false)
        ]
        for (form, mount, restricted) in forms {
            let r = try mount()
            try #require(r.ok, "\(form): \(r)")
            let f = try flags()
            #expect(f.contains("nosuid") == restricted && f.contains("nodev") == restricted, "\(form): \(f)")
            // Reads do not move atime: the mount says noatime, not the relatime it showed before.
            #expect(f.contains("noatime") && !f.contains("relatime"), "\(form): \(f)")
            let u = sb.unmount()
            try #require(u.ok, "\(form): \(u)")
        }
    }

    @Test func statusLedgerGoesToTheTestsTemporaryStateDirectory() throws {
        let sb = try Sandbox("statedir")
        defer { sb.cleanup() }
        try sb.initAndMount()
        try E2E.write(sb.mnt + "/f", "x")
        try #require(sb.unmount().ok)
        let header = try #require(E2E.readText(sb.container + "/coffer.json"))
        let id = try #require(header.range(of: #"[0-9a-f]{32}"#, options: .regularExpression).map { String(header[$0]) })
        #expect(E2E.stateDirectory.hasPrefix("/tmp/"), "\(E2E.stateDirectory)")
        #expect(E2E.statOf(E2E.stateDirectory + "/\(id).generation") != nil, "no ledger entry in \(E2E.stateDirectory)")
        let home = ProcessInfo.processInfo.environment["HOME"] ?? NSHomeDirectory()
        #expect(E2E.statOf(home + "/.local/state/coffer/\(id).generation") == nil, "the test wrote to the user's own state")
    }

    @Test func noLockFileLeftAndTheDirectoryLockHolds() throws {
        let sb = try Sandbox("lockdir")
        defer { sb.cleanup() }
        try #require(sb.initContainer().ok)
        // A lock file of an earlier version is removed by the next mount.
        try E2E.write(sb.container + "/coffer.lock", "12345\n")
        let m = sb.mount()
        try #require(m.ok, "\(m)")
        let pid = try #require(E2E.daemonPid(container: sb.container), "no daemon holds the container directory's lock")
        #expect(E2E.cmdline(pid).contains(sb.container), "\(E2E.cmdline(pid))")
        #expect(E2E.lstatOf(sb.container + "/coffer.lock") == nil, "coffer.lock while mounted")
        let fsck = E2E.coffer(["fsck", sb.container, "--passfile", sb.passfile])
        #expect(fsck.status == 8 && fsck.stderr.contains("pid \(pid)"), "\(fsck)")
        try #require(sb.unmount().ok)
        #expect(E2E.lstatOf(sb.container + "/coffer.lock") == nil, "coffer.lock after unmount")
        #expect(E2E.daemonPid(container: sb.container) == nil, "the lock is still held")
    }

    @Test func mountRightAfterFusermountWaitsForTheOldDaemon() throws {
        let sb = try Sandbox("unmountmount")
        defer { sb.cleanup() }
        try sb.initAndMount()
        try E2E.write(sb.mnt + "/kept.txt", "kept")
        let old = try #require(E2E.daemonPid(container: sb.container))
        // The old daemon is stopped: its mount goes away, its lock stays, as while it commits.
        try #require(kill(old, SIGSTOP) == 0)
        var resumed = false
        defer { if !resumed { kill(old, SIGCONT) } }
        let u = E2E.run("/bin/fusermount3", ["-u", sb.mnt], timeout: 30)
        try #require(u.ok && !E2E.isMounted(sb.mnt), "\(u)")
        let err = sb.root + "/mount.err"
        let child = try #require(
            Spawned(
                E2E.coffer, ["mount", sb.container, sb.mnt, "--passfile", sb.passfile],
                stdinPath: "/dev/null", stdoutPath: sb.root + "/mount.out", stderrPath: err))
        let said = E2E.wait(20) { E2E.readText(err)?.contains("waiting for the daemon of an earlier mount") == true }
        #expect(said, "no waiting message: \(E2E.readText(err) ?? "")")
        #expect(child.isRunning, "the new mount did not wait")
        kill(old, SIGCONT)
        resumed = true
        let status = child.wait(timeout: 60)
        sb.noteDaemon()
        #expect(status == 0, "mount after the old daemon finished: \(String(describing: status)) \(E2E.readText(err) ?? "")")
        #expect(E2E.readText(sb.mnt + "/kept.txt") == "kept")
        #expect(E2E.wait(10) { !E2E.isAlive(old) }, "the old daemon did not end")
    }
}
