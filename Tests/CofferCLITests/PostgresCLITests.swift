import CofferTestSupport
import Foundation
import Testing
#if canImport(Glibc)
    import Glibc
#endif

// Containers in PostgreSQL through the real binary (issue 16, items 1, 3, 4 and 6): every command with a
// URI, mount(8), fstab and --config, the leases (mounts share, fsck alone), the rollback ledger, the
// server restarted under a writer, and the database password never in argv or logs. Each test uses a
// fresh schema of the process's private cluster (TestEngine); a missing PostgreSQL fails them.

/// A sandbox whose container is a fresh PostgreSQL schema, whatever COFFER_TEST_ENGINE says.
private func pgSandbox(_ label: String) throws -> (Sandbox, String, PostgresCluster) {
    let sb = try Sandbox(label)
    let uri = sb.isDirectoryContainer ? try TestEngine.freshURI() : sb.container
    return (sb, uri, try TestEngine.cluster())
}

/// `coffer ARGS` with extra environment variables (a second "machine" is another COFFER_STATE_DIR).
@discardableResult
private func coffer(_ args: [String], env extra: [String: String], timeout: TimeInterval = 60) -> RunResult {
    var env = ProcessInfo.processInfo.environment
    env["COFFER_STATE_DIR"] = E2E.stateDirectory
    for (k, v) in extra { env[k] = v }
    return E2E.run(E2E.coffer, args, environment: env, timeout: timeout)
}

/// A fault test's sandbox: a fresh container in the tests' cluster, mounted with `options`. `endFaults`
/// cleans up and starts the cluster again when the test left it stopped.
private func mountedForFaults(_ label: String, options: String) throws -> (Sandbox, String, PostgresCluster) {
    let (sb, uri, cluster) = try pgSandbox(label)
    let made = sb.initContainer(container: uri)
    let mounted = made.ok ? sb.mount(container: uri, options: options) : made
    guard mounted.ok else {
        sb.cleanup()
        throw TestFailure("\(label): \(mounted)")
    }
    return (sb, uri, cluster)
}

private func endFaults(_ sb: Sandbox, _ cluster: PostgresCluster) {
    sb.cleanup()
    if !cluster.isRunning { try? cluster.start() }
}

private func schema(_ uri: String) -> String { String(uri.split(separator: "=").last ?? "") }

@Suite("PostgreSQL containers through the CLI", .serialized)
struct PostgresCLITests {
    @Test func everyCommandTakesAURI() throws {
        let (sb, uri, _) = try pgSandbox("pguri")
        defer { sb.cleanup() }
        let i = sb.initContainer(container: uri)
        try #require(i.ok && i.stdout.contains("Created container postgresql:///coffer_test?container="), "\(i)")
        #expect(!i.stdout.contains("host="), "the display leaves out the other parameters: \(i)")
        let again = sb.initContainer(container: uri)
        #expect(again.status == 10 && again.stderr.contains("already exists"), "\(again)")
        let info = E2E.coffer(["info", uri])
        #expect(info.ok && info.stdout.contains("PostgreSQL schema \"\(schema(uri))\""), "\(info)")
        let m = sb.mount(container: uri)
        try #require(m.ok, "\(m)")
        try E2E.write(sb.mnt + "/hello.txt", "hello over PostgreSQL\n")
        #expect(E2E.sh("sync \(sb.mnt)/hello.txt").ok)
        let entry = try #require(E2E.mountEntry(at: sb.mnt))
        #expect(entry.source.hasPrefix("postgresql:///coffer_test?container=") && entry.type == "fuse.coffer", "\(entry)")
        let df = E2E.run("/bin/df", ["-k", sb.mnt])
        #expect(df.ok && df.stdout.contains("4398046511104"), "statfs of a database container is the fixed capacity: \(df)")
        let mountedInfo = E2E.coffer(["info", uri, "--passfile", sb.passfile])
        #expect(mountedInfo.ok && mountedInfo.stdout.contains("Mounted:        by daemon pid"), "\(mountedInfo)")
        #expect(
            mountedInfo.stdout.contains("Entities:       2 inodes, 1 directory entries, 1 content chunks"), "read beside the mount: \(mountedInfo)")
        let fsckMounted = E2E.coffer(["fsck", uri, "--passfile", sb.passfile])
        #expect(fsckMounted.status == 8 && fsckMounted.stderr.contains("container is mounted (pid"), "\(fsckMounted)")
        #expect(sb.unmount().ok)
        let fsck = E2E.coffer(["fsck", uri, "--passfile", sb.passfile])
        #expect(fsck.ok && fsck.stdout.contains("0 problem(s)"), "\(fsck)")
        let newPass = sb.root + "/pass2"
        try E2E.write(newPass, "second-password\n")
        let p = E2E.coffer(["passwd", uri, "--passfile", sb.passfile, "--new-passfile", newPass] + Sandbox.kdfArgs)
        #expect(p.ok && p.stdout.contains("Password changed"), "\(p)")
        #expect(E2E.coffer(["info", uri, "--passfile", sb.passfile]).status == 12, "the old password no longer opens it")
        let counted = E2E.coffer(["info", uri, "--passfile", newPass])
        #expect(counted.ok && counted.stdout.contains("2 inodes"), "\(counted)")
        try #require(sb.mount(container: uri, passfile: newPass).ok)
        #expect(E2E.readText(sb.mnt + "/hello.txt") == "hello over PostgreSQL\n")
        #expect(sb.unmount().ok)
    }

    @Test func mount8FstabAndConfig() throws {
        let (sb, uri, _) = try pgSandbox("pgmount8")
        defer { sb.cleanup() }
        try #require(sb.initContainer(container: uri).ok)
        // mount.fuse3 hands a source with "://", "?" and "&" on as one argument.
        let m8 = try sb.mountWithMount8(source: uri)
        try #require(m8.ok && E2E.isMounted(sb.mnt), "\(m8)")
        try E2E.write(sb.mnt + "/via-mount8", "1")
        #expect(sb.unmount().ok)
        let fstab = sb.root + "/fstab"
        try E2E.write(fstab, "\(uri)  \(sb.mnt)  fuse.\(try sb.dotFreeCoffer())  noauto,passfile=\(sb.passfile)  0 0\n")
        let f = E2E.run("/bin/mount", ["--fstab", fstab, sb.mnt])
        sb.noteDaemon(container: uri)
        try #require(f.ok && E2E.isMounted(sb.mnt), "\(f)")
        #expect(E2E.readText(sb.mnt + "/via-mount8") == "1")
        #expect(sb.unmount().ok)
        let conf = sb.root + "/vault.conf"
        try E2E.write(conf, "container = \(uri)\nmountpoint = m\npassfile = pass\noptions = reconnect_wait=10\n")
        let c = E2E.coffer(["mount", "--config", conf])
        sb.noteDaemon(container: uri)
        try #require(c.ok && E2E.isMounted(sb.mnt), "\(c)")
        #expect(E2E.readText(sb.mnt + "/via-mount8") == "1")
        #expect(sb.unmount().ok)
        let bad = E2E.coffer(["mount", uri, sb.mnt, "--passfile", sb.passfile, "-o", "reconnect_wait=x"])
        #expect(bad.status == 64 && bad.stderr.contains("reconnect_wait"), "\(bad)")
    }

    /// The systemd unit's form, `coffer mount -f --config FILE`, names neither the URI nor the mountpoint in its
    /// argv; `coffer unmount` still finds that daemon (through FILE) and returns only once it has ended (so
    /// "unmounted" means committed). A session holding the leases table keeps the daemon's last step (deleting
    /// its lease row) waiting for 10 s, so an unmount that did not wait for the daemon would return first.
    @Test func unmountWaitsForAForegroundConfigDaemon() throws {
        let (sb, uri, cluster) = try pgSandbox("pgunmountconf")
        defer { sb.cleanup() }
        try #require(sb.initContainer(container: uri).ok)
        let conf = sb.root + "/vault.conf"
        try E2E.write(conf, "container = \(uri)\nmountpoint = m\npassfile = pass\n")
        let child = try ServiceChild(["mount", "-f", "--config", conf], environment: [:])
        defer { child.stop() }
        try #require(E2E.wait(60) { E2E.isMounted(sb.mnt) || !child.spawned.isRunning }, "never mounted")
        try #require(E2E.isMounted(sb.mnt), "the daemon ended: \(child.stderr)")
        try E2E.write(sb.mnt + "/written-last", "kept")
        let leases = "\"\(schema(uri))\".leases"
        let holder = try #require(
            Spawned(
                "/usr/sbin/runuser",
                [
                    "-u", "postgres", "--", "/usr/bin/psql", "-h", cluster.socketDirectory, "-p", String(cluster.port), "-U", "postgres",
                    "-d", cluster.database, "-X", "-q", "-c", "BEGIN; LOCK TABLE \(leases) IN ACCESS EXCLUSIVE MODE; SELECT pg_sleep(10); COMMIT;"
                ], stdinPath: "/dev/null", stdoutPath: "/dev/null", stderrPath: "/dev/null"))
        defer { _ = holder.wait(timeout: 30) }
        let locked = E2E.wait(10) {
            (try? cluster.psql(
                "SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation WHERE l.granted AND l.mode = 'AccessExclusiveLock' "
                    + "AND c.relname = 'leases' AND c.relnamespace = '\"\(schema(uri))\"'::regnamespace"))?.trimmingCharacters(
                    in: .whitespacesAndNewlines) == "1"
        }
        try #require(locked, "the leases table was never locked")
        let start = Date()
        let u = sb.unmount()
        #expect(u.ok, "\(u)")
        #expect(!child.spawned.isRunning, "coffer unmount returned while its daemon still ran")
        #expect(Date().timeIntervalSince(start) > 1, "the daemon could not have ended before the table was let go")
        #expect(child.spawned.wait(timeout: 30) == 0, "\(child.stderr)")
        try #require(sb.mount(container: uri).ok)
        #expect(E2E.readText(sb.mnt + "/written-last") == "kept")
        #expect(sb.unmount().ok)
    }

    /// Leases: a second machine (state directory) mounts beside the first (issue 17); fsck is refused
    /// while any mount's lease lives and a mount while an fsck holds the container. A killed mount's
    /// lease is removed at once by its own machine (its pid is gone) and lapses for the others.
    @Test func leasesLetMountsShareAndKeepFsckAlone() throws {
        let (sb, uri, cluster) = try pgSandbox("pglease")
        defer { sb.cleanup() }
        try #require(sb.initContainer(container: uri).ok)
        let leaseEnv = ["COFFER_PG_LEASE_SECONDS": "4"]
        let other = leaseEnv.merging(["COFFER_STATE_DIR": sb.root + "/machine2"]) { $1 }
        let m2 = sb.root + "/m2"
        try #require(mkdir(m2, 0o755) == 0)
        let first = coffer(["mount", uri, sb.mnt, "--passfile", sb.passfile], env: leaseEnv)
        sb.noteDaemon(container: uri)
        try #require(first.ok, "\(first)")
        let pid = try #require(TestEngine.daemonPid(uri: uri))
        // Renewed: still held after more than one lease duration.
        usleep(6_000_000)
        let fsck = coffer(["fsck", uri, "--passfile", sb.passfile], env: other)
        #expect(fsck.status == 8 && fsck.stderr.contains("container is mounted (pid \(pid) on"), "fsck respects a live lease: \(fsck)")
        let second = coffer(["mount", uri, m2, "--passfile", sb.passfile], env: other)
        sb.noteDaemon(container: uri)
        try #require(second.ok && E2E.isMounted(m2), "a second machine mounts beside the first: \(second)")
        try E2E.write(sb.mnt + "/from-one", "one")
        #expect(E2E.readText(m2 + "/from-one") == "one")
        kill(pid, SIGKILL)
        #expect(E2E.wait(10) { !E2E.isAlive(pid) })
        E2E.run("/bin/fusermount3", ["-uz", sb.mnt])
        #expect(E2E.coffer(["unmount", m2]).ok)
        let start = Date()
        let soon = coffer(["fsck", uri, "--passfile", sb.passfile], env: other)
        #expect(soon.status == 8, "another machine cannot know the killed mount is gone before its lease lapses: \(soon)")
        var checked = false
        while !checked, Date().timeIntervalSince(start) < 15 {
            usleep(500_000)
            checked = coffer(["fsck", uri, "--passfile", sb.passfile], env: other).ok
        }
        #expect(checked, "the lapsed lease no longer keeps fsck out")
        #expect(Date().timeIntervalSince(start) < 10, "lapsed within the lease (4 s)")
        // An fsck holds the container: a mount is refused, naming it. Its lease is a row like a mount's.
        let leases = "\"\(schema(uri))\".leases"
        try cluster.psql("INSERT INTO \(leases) VALUES ('an-fsck', 'elsewhere', 1, 'another-machine', 'fsck', now() + interval '1 hour')")
        let refused = coffer(["mount", uri, sb.mnt, "--passfile", sb.passfile], env: leaseEnv)
        #expect(refused.status == 15 && refused.stderr.contains("pid 1 on elsewhere (fsck)"), "\(refused)")
        // A hostile row's text reaches no terminal as escape sequences.
        try cluster.psql("UPDATE \(leases) SET host = E'else\\x1b]0;owned\\x07where\\n' WHERE holder = 'an-fsck'")
        let escaped = coffer(["mount", uri, sb.mnt, "--passfile", sb.passfile], env: leaseEnv)
        #expect(escaped.status == 15 && escaped.stderr.contains("pid 1 on else?]0;owned?where? (fsck)"), "\(escaped)")
        #expect(!escaped.stderr.contains("\u{1B}") && !escaped.stderr.contains("\u{07}"))
        try cluster.psql("DELETE FROM \(leases) WHERE holder = 'an-fsck'")
        // The same machine sees its killed holder's pid is gone: no wait.
        let here = coffer(["mount", uri, sb.mnt, "--passfile", sb.passfile], env: leaseEnv)
        sb.noteDaemon(container: uri)
        #expect(here.ok, "\(here)")
        let pidHere = try #require(TestEngine.daemonPid(uri: uri))
        kill(pidHere, SIGKILL)
        #expect(E2E.wait(10) { !E2E.isAlive(pidHere) })
        E2E.run("/bin/fusermount3", ["-uz", sb.mnt])
        #expect(coffer(["fsck", uri, "--passfile", sb.passfile], env: leaseEnv).ok, "a dead holder of this machine holds nothing")
    }

    /// The ledger keys by container id: a schema put back from an older dump is refused (18).
    @Test func olderSchemaIsARollback() throws {
        let (sb, uri, cluster) = try pgSandbox("pgrollback")
        defer { sb.cleanup() }
        try #require(sb.initContainer(container: uri).ok)
        try #require(sb.mount(container: uri).ok)
        try E2E.write(sb.mnt + "/a", "old")
        #expect(sb.unmount().ok)
        let dump = cluster.root + "/\(schema(uri)).sql"
        let pg = ["-h", cluster.socketDirectory, "-p", String(cluster.port), "-U", "postgres"]
        try cluster.runAsPostgres("pg_dump", pg + ["-n", schema(uri), "-f", dump, cluster.database])
        try #require(sb.mount(container: uri).ok)
        try E2E.write(sb.mnt + "/a", "new")
        #expect(sb.unmount().ok)
        try cluster.psql("DROP SCHEMA \"\(schema(uri))\" CASCADE")
        try cluster.runAsPostgres("psql", pg + ["-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", cluster.database, "-f", dump])
        let refused = sb.mount(container: uri)
        #expect(refused.status == 18 && refused.stderr.contains("older than the one this machine last saw"), "\(refused)")
        #expect(!E2E.isMounted(sb.mnt))
        let allowed = sb.mount(container: uri, options: "allow_rollback")
        try #require(allowed.ok, "\(allowed)")
        #expect(E2E.readText(sb.mnt + "/a") == "old")
        #expect(sb.unmount().ok)
    }

    /// A server that refuses the last commit (a trigger added while mounted; `commit=60` keeps the write in
    /// memory until the unmount): `coffer unmount` says the daemon ended with an error and exits 1 (it exited 0,
    /// with the loss only in the daemon's log). A clean unmount still exits 0.
    @Test func unmountSaysWhenTheLastCommitFailed() throws {
        let (sb, uri, cluster) = try pgSandbox("pglastcommit")
        defer { sb.cleanup() }
        try #require(sb.initContainer(container: uri).ok)
        try #require(sb.mount(container: uri).ok)
        try E2E.write(sb.mnt + "/kept", "committed")
        let clean = sb.unmount()
        #expect(clean.status == 0 && clean.stderr.isEmpty, "\(clean)")

        try #require(sb.mount(container: uri, options: "commit=60").ok)
        let s = "\"\(schema(uri))\""
        try cluster.psql(
            "CREATE FUNCTION \(s).refuse() RETURNS trigger AS $$ BEGIN RAISE EXCEPTION 'refused'; END $$ LANGUAGE plpgsql; "
                + "CREATE TRIGGER refuse BEFORE INSERT ON \(s).inodes FOR EACH ROW EXECUTE FUNCTION \(s).refuse()")
        // Written and closed, never synced (Foundation's write would fsync, and fail there).
        #expect(E2E.sh("echo 'never committed' > '\(sb.mnt)/lost'").ok)
        let failed = sb.unmount()
        #expect(failed.status == 1 && failed.stderr.contains("the daemon ended with an error: the last commit failed"), "\(failed)")
        #expect(!E2E.isMounted(sb.mnt))
        try cluster.psql("DROP TRIGGER refuse ON \(s).inodes")
        try #require(sb.mount(container: uri).ok)
        #expect(E2E.readText(sb.mnt + "/kept") == "committed" && E2E.readText(sb.mnt + "/lost") == nil)
        #expect(sb.unmount().ok)
    }

    /// A container whose server is down: every command says it cannot connect, with its own status (19),
    /// not "no container" (10) or "store damaged" (13); nothing is mounted, and the container is whole
    /// once the server is back. `coffer fsck` keeps fsck(8)'s status for an operational error (8).
    @Test func aServerThatIsDownIsSaidSoWithItsOwnStatus() throws {
        let (sb, uri, cluster) = try pgSandbox("pgdown")
        defer { endFaults(sb, cluster) }
        try #require(sb.initContainer(container: uri).ok)
        try cluster.stop(mode: "fast")
        for args in [
            ["info", uri], ["mount", "--passfile", sb.passfile, uri, sb.mnt],
            ["passwd", uri, "--passfile", sb.passfile, "--new-passfile", sb.passfile],
            ["copy", uri, sb.root + "/copy"]
        ] {
            let r = E2E.coffer(args)
            #expect(r.status == 19 && (r.stderr.contains("cannot connect") || r.stderr.contains("cannot be reached")), "\(args[0]): \(r)")
        }
        let f = E2E.coffer(["fsck", uri])
        #expect(f.status == 8 && f.stderr.contains("cannot connect"), "\(f)")
        #expect(!E2E.isMounted(sb.mnt))
        try cluster.start()
        let info = E2E.coffer(["info", uri])
        #expect(info.ok, "\(info)")
    }

    /// Mistakes that fail the same way on every try are not a server away (19, which the user unit retries
    /// every 5 s without end): a parameter libpq rejects, a role that does not exist, a schema that is not
    /// there, for every command, `coffer copy`'s source too (it said 19 or 13, "damaged"); a container name
    /// that cannot be one is a usage error (64), said without a word of coffer.json.
    @Test func mistakesInTheURIAreRefusedNotWaitedFor() throws {
        let (sb, uri, cluster) = try pgSandbox("pgmistake")
        defer { sb.cleanup() }
        try #require(sb.initContainer(container: uri).ok)
        let noRole = uri.replacingOccurrences(of: "user=postgres", with: "user=no_such_role")
        let noSchema = uri.replacingOccurrences(of: "container=\(schema(uri))", with: "container=no_such_schema")
        try #require(noRole != uri && noSchema != uri)
        for (bad, reason) in [(uri + "&foo=bar", "invalid URI query parameter"), (noRole, "does not exist"), (noSchema, "no_such_schema")] {
            for args in [["info", bad], ["mount", "--passfile", sb.passfile, bad, sb.mnt], ["copy", bad, sb.root + "/copy"]] {
                let r = E2E.coffer(args)
                #expect(r.status == 10 && r.stderr.contains(reason) && !r.stderr.contains("cannot connect"), "\(args[0]) \(bad): \(r)")
            }
        }
        #expect(!E2E.isMounted(sb.mnt) && E2E.lstatOf(sb.root + "/copy") == nil)
        for name in ["My-Vault", "pg_catalog", String(repeating: "a", count: 70)] {
            let r = sb.initContainer(container: "postgresql:///\(cluster.database)?host=\(cluster.socketDirectory)&container=\(name)")
            #expect(r.status == 64 && r.stderr.contains("use 1-63") && !r.stderr.contains("coffer.json"), "\(name): \(r)")
        }
        let twice = E2E.coffer(["info", uri + "&container=other"])
        #expect(twice.status == 64 && twice.stderr.contains("more than one container"), "\(twice)")
    }

    /// The server lost while a mount claims its lease (after it read the header): status 19, as for a server
    /// that is down, not 1 (which says the server refused). Every session that adds a lease row loses its
    /// connection there.
    @Test func aServerLostAtTheLeaseClaimIsSaidSoWithItsOwnStatus() throws {
        try expectMountLost("pgleasecut") { s in
            (
                cut: "CREATE FUNCTION \(s).cut() RETURNS trigger AS $$ BEGIN PERFORM pg_terminate_backend(pg_backend_pid()); RETURN NEW; "
                    + "END $$ LANGUAGE plpgsql; CREATE TRIGGER cut BEFORE INSERT ON \(s).leases FOR EACH ROW EXECUTE FUNCTION \(s).cut()",
                restore: "DROP TRIGGER cut ON \(s).leases"
            )
        }
    }

    /// The server lost when the mount first reads the root directory (after the lease is in): status 19, not 13
    /// ("store damaged", which would send the user to fsck). A view in the table's place ends every session that
    /// reads the root's row.
    @Test func aServerLostAtTheRootsFirstReadIsSaidSoWithItsOwnStatus() throws {
        try expectMountLost("pgrootcut") { s in
            (
                cut: "CREATE FUNCTION \(s).cut(id bigint) RETURNS boolean AS $$ BEGIN IF id = 1 THEN "
                    + "PERFORM pg_terminate_backend(pg_backend_pid()); END IF; RETURN true; END $$ LANGUAGE plpgsql; "
                    + "ALTER TABLE \(s).inodes RENAME TO inodes_kept; CREATE VIEW \(s).inodes AS SELECT * FROM \(s).inodes_kept WHERE \(s).cut(id)",
                restore: "DROP VIEW \(s).inodes; ALTER TABLE \(s).inodes_kept RENAME TO inodes"
            )
        }
    }

    /// A server that answers the lease claim with an error (here a trigger; a role without the right, a missing
    /// table) refuses the mount: status 1, not 19, which would tell the user to wait for the server.
    @Test func aServerThatRefusesTheLeaseIsNotSaidToBeUnreachable() throws {
        try expectMountLost("pgleaseno", status: 1) { s in
            (
                cut: "CREATE FUNCTION \(s).no() RETURNS trigger AS $$ BEGIN RAISE EXCEPTION 'no lease'; END $$ LANGUAGE plpgsql; "
                    + "CREATE TRIGGER no BEFORE INSERT ON \(s).leases FOR EACH ROW EXECUTE FUNCTION \(s).no()",
                restore: "DROP TRIGGER no ON \(s).leases"
            )
        }
    }

    /// Makes a container, then mounts it with `sql(schema).cut` in force (SQL that makes the server drop sessions, or
    /// refuse, at one moment of the mount): `status` (19: unreachable) and nothing mounted; after `restore`, the
    /// same mount works.
    private func expectMountLost(
        _ label: String, status: Int32 = 19, sourceLocation: SourceLocation = #_sourceLocation,
        _ sql: (String) -> (cut: String, restore: String)
    ) throws {
        let (sb, uri, cluster) = try pgSandbox(label)
        defer { endFaults(sb, cluster) }
        try #require(sb.initContainer(container: uri).ok, sourceLocation: sourceLocation)
        let (cut, restore) = sql("\"\(schema(uri))\"")
        try cluster.psql(cut)
        let r = sb.mount(container: uri, options: "reconnect_wait=2")
        #expect(r.status == status, "\(r)", sourceLocation: sourceLocation)
        #expect(!E2E.isMounted(sb.mnt), sourceLocation: sourceLocation)
        try cluster.psql(restore)
        try #require(sb.mount(container: uri).ok, sourceLocation: sourceLocation)
        #expect(sb.unmount().ok, sourceLocation: sourceLocation)
    }

    /// The server lost in the middle of `coffer init` (after the schema's first table): status 19, not 1; the
    /// half-made container is not there (one transaction), so the same init works once the server is whole. An
    /// event trigger ends the session that creates a table in this container's schema.
    @Test func aServerLostInTheMiddleOfInitIsSaidSoAndLeavesNothing() throws {
        let (sb, uri, cluster) = try pgSandbox("pginitcut")
        defer { endFaults(sb, cluster) }
        let name = schema(uri)
        try cluster.psql(
            "CREATE FUNCTION public.cut_\(name)() RETURNS event_trigger AS $$ BEGIN IF EXISTS (SELECT 1 FROM "
                + "pg_event_trigger_ddl_commands() WHERE schema_name = '\(name)' AND command_tag = 'CREATE TABLE') THEN "
                + "PERFORM pg_terminate_backend(pg_backend_pid()); END IF; END $$ LANGUAGE plpgsql; "
                + "CREATE EVENT TRIGGER cut_\(name) ON ddl_command_end EXECUTE FUNCTION public.cut_\(name)()")
        let r = sb.initContainer(container: uri)
        try cluster.psql("DROP EVENT TRIGGER cut_\(name); DROP FUNCTION public.cut_\(name)()")
        #expect(r.status == 19, "\(r)")
        let left = try cluster.psql("SELECT count(*) FROM pg_namespace WHERE nspname = '\(name)'")
        #expect(left.trimmingCharacters(in: .whitespacesAndNewlines) == "0", "nothing of the container is left: \(left)")
        let again = sb.initContainer(container: uri)
        #expect(again.ok, "\(again)")
    }

    /// The server stopped under a mount holding 40 files it has not committed, then `coffer unmount`: the
    /// last commit fails once, within about one reconnect bound, and the unmount says so. The store used
    /// to read every cached inode again after the failed commit, each read waiting the whole bound with
    /// the filesystem's lock held: 40 inodes at 3 s took two minutes.
    @Test func unmountWithTheServerGoneWaitsOneBoundNotOnePerFile() throws {
        let (sb, uri, cluster) = try mountedForFaults("pggoneunmount", options: "reconnect_wait=3,commit=60")
        defer { endFaults(sb, cluster) }
        try E2E.write(sb.mnt + "/kept", "committed")
        #expect(E2E.sh("sync '\(sb.mnt)/kept'").ok)
        #expect(E2E.sh("cd '\(sb.mnt)' && for i in $(seq 1 40); do echo $i > f$i; done").ok)
        try cluster.stop(mode: "immediate")
        let started = Date()
        let u = sb.unmount()
        let took = Date().timeIntervalSince(started)
        #expect(u.status == 1 && u.stderr.contains("the last commit failed"), "\(u)")
        #expect(took < 30, "unmount took \(took) s")
        #expect(!E2E.isMounted(sb.mnt))
        try cluster.start()
        try #require(sb.mount(container: uri).ok)
        #expect(E2E.readText(sb.mnt + "/kept") == "committed" && E2E.readText(sb.mnt + "/f1") == nil)
        #expect(sb.unmount().ok)
    }

    /// A removal still in the open group when the server restarts: the group is lost, so the file is back
    /// whole, with its fsynced content, and fsck is clean. The reaper used to delete the file's inode after
    /// its unlink was lost: the entry dangled (ls showed ?????????, stat ENOENT, a create EEXIST) and
    /// fsck found a dangling entry (a tester helper's find).
    @Test func aRemovalTheServerLostLeavesTheFileWhole() throws {
        // commit=30: the removal stays in the open group until the restart takes it.
        let (sb, uri, cluster) = try mountedForFaults("pglostrm", options: "reconnect_wait=10,commit=30")
        defer { endFaults(sb, cluster) }
        try E2E.write(sb.mnt + "/f", "precious")
        #expect(E2E.sh("sync '\(sb.mnt)/f'").ok)
        #expect(E2E.sh("rm '\(sb.mnt)/f'").ok)
        try cluster.restart(mode: "fast")
        // The reaper works when the mount is quiet; the first lookup may meet the lost connection (EIO).
        let back = E2E.wait(10) { E2E.readText(sb.mnt + "/f") == "precious" }
        #expect(back, "the file whose removal was lost is back whole")
        #expect(sb.unmount().ok)
        let fsck = E2E.coffer(["fsck", uri, "--passfile", sb.passfile], timeout: 120)
        #expect(fsck.status == 0, "\(fsck)")
    }

    /// A file written and closed, never synced, then the server restarts and the next change meets the lost
    /// connection (the group goes): `coffer unmount` warns that a file lost changes no fsync reported,
    /// although its own commit had nothing left to do. It said nothing (a tester helper's find).
    @Test func unmountSaysWhatADroppedGroupTookUnheard() throws {
        let (sb, uri, cluster) = try mountedForFaults("pgunheard", options: "reconnect_wait=10,commit=30")
        defer { endFaults(sb, cluster) }
        #expect(E2E.sh("echo important > '\(sb.mnt)/unsynced'").ok)
        try cluster.restart(mode: "fast")
        _ = E2E.sh("touch '\(sb.mnt)/other'")  // meets the lost connection: the group is dropped
        let u = sb.unmount()
        // A warning (status 0): a write or close may have told the programs already, which is not tracked.
        #expect(u.status == 0 && u.stderr.contains("warning") && u.stderr.contains("no fsync reported it"), "\(u)")
        #expect(!E2E.isMounted(sb.mnt))
        try #require(sb.mount(container: uri).ok)
        #expect(E2E.readText(sb.mnt + "/unsynced") == nil)
        #expect(sb.unmount().ok)
    }

    /// Six stats at once on a mount whose server is stopped, reconnect_wait=3: each fails within about the
    /// bound, not one bound after the other (they queue behind one another: 4.6, 9.1, ... 27.3 s with a
    /// 5 s bound before); once the server is back the mount answers again.
    @Test func operationsQueuedOnAGoneServerFailWithinOneBound() throws {
        let (sb, uri, cluster) = try mountedForFaults("pgqueued", options: "reconnect_wait=3")
        defer { endFaults(sb, cluster) }
        for name in ["a", "b", "c", "d", "e", "f"] { try E2E.write(sb.mnt + "/" + name, name) }
        try #require(sb.unmount().ok)
        try #require(sb.mount(container: uri, options: "reconnect_wait=3").ok)  // nothing cached
        try cluster.stop(mode: "fast")
        let run = E2E.py(
            """
            import os, sys, threading, time
            took = []
            def look(p):
                t = time.time()
                try: os.stat(p)
                except OSError: pass
                took.append(time.time() - t)
            ts = [threading.Thread(target=look, args=(os.path.join(sys.argv[1], n),)) for n in 'abcdef']
            for t in ts: t.start()
            for t in ts: t.join()
            print(max(took))
            """, [sb.mnt], timeout: 120)
        let slowest = Double(run.stdout.trimmingCharacters(in: .whitespacesAndNewlines)) ?? .infinity
        #expect(slowest < 10, "the slowest of six stats took \(slowest) s with a 3 s bound: \(run)")
        try cluster.start()
        #expect(E2E.readText(sb.mnt + "/a") == "a", "the mount answers once the server is back")
        _ = sb.unmount()
        #expect(!E2E.isMounted(sb.mnt))
    }

    /// The server restarted (-m fast, then -m immediate) under a writer that fsyncs: the mount survives,
    /// every fsynced file reads back, and fsck is clean. With a short reconnect_wait and the server
    /// down longer, an fsync fails with EIO and the mount still answers once the server is back.
    @Test func serverRestartsUnderAWriter() throws {
        let (sb, uri, cluster) = try mountedForFaults("pgrestart", options: "reconnect_wait=60")
        defer { endFaults(sb, cluster) }
        let log = sb.root + "/synced", stop = sb.root + "/stop"
        let writer = try Child(
            E2E.python ?? "/usr/bin/python3",
            [
                "-c",
                """
                import os, sys
                d, log, stop = sys.argv[1], sys.argv[2], sys.argv[3]
                i = errors = 0
                while not os.path.exists(stop):
                    name = 'f%05d' % i
                    try:
                        with open(os.path.join(d, name), 'wb') as f:
                            f.write((name * 1000).encode()); f.flush(); os.fsync(f.fileno())
                        with open(log, 'a') as l:
                            l.write(name + '\\n'); l.flush(); os.fsync(l.fileno())
                    except OSError as e:
                        errors += 1
                        print('error', name, e, flush=True)
                    i += 1
                print('done', i, errors)
                """, sb.mnt, log, stop
            ])
        usleep(1_500_000)
        try cluster.restart(mode: "fast")
        usleep(1_500_000)
        try cluster.restart(mode: "immediate")
        usleep(1_500_000)
        try E2E.write(stop, "")
        #expect(writer.waitForExit(120) == 0, "writer: \(writer.stderr)")
        let synced = (E2E.readText(log) ?? "").split(separator: "\n").map(String.init)
        #expect(synced.count > 10, "the writer made progress across the restarts: \(synced.count) files")
        #expect(E2E.isMounted(sb.mnt), "the mount survived")
        let missing = synced.filter { E2E.readText(sb.mnt + "/" + $0) != String(repeating: $0, count: 1000) }
        #expect(missing.isEmpty, "fsynced files lost or changed: \(missing.prefix(10))")
        #expect(sb.unmount().ok)
        let fsck = E2E.coffer(["fsck", uri, "--passfile", sb.passfile], timeout: 120)
        #expect(fsck.ok, "\(fsck)")
        try #require(sb.mount(container: uri, options: "reconnect_wait=2").ok)
        let lostAfter = synced.filter { E2E.readText(sb.mnt + "/" + $0) != String(repeating: $0, count: 1000) }
        #expect(lostAfter.isEmpty, "after a remount: \(lostAfter.prefix(10))")
        try cluster.stop(mode: "immediate")
        let started = Date()
        let down = E2E.py(
            """
            import os, sys
            try:
                with open(sys.argv[1], 'wb') as f:
                    f.write(b'x' * 5000); f.flush(); os.fsync(f.fileno())
                print('ok')
            except OSError as e:
                print('errno', e.errno)
            """, [sb.mnt + "/while-down"], timeout: 60)
        let waited = Date().timeIntervalSince(started)
        #expect(down.stdout.contains("errno \(EIO)"), "an fsync while the server stays away gets EIO: \(down)")
        #expect(waited < 30, "the bound (2 s) was kept: \(waited) s")
        try cluster.start()
        #expect(E2E.isMounted(sb.mnt))
        try E2E.write(sb.mnt + "/after", "back")
        #expect(E2E.sh("sync \(sb.mnt)/after").ok)
        #expect(E2E.readText(sb.mnt + "/after") == "back")
        #expect(sb.unmount().ok)
        let fsck2 = E2E.coffer(["fsck", uri, "--passfile", sb.passfile], timeout: 120)
        #expect(fsck2.ok, "\(fsck2)")
    }

    /// The database password comes from a passfile (libpq's `passfile=`): it is in no process's argv,
    /// in no output of the daemon at debug level; a URI carrying it is refused without echoing it.
    @Test func databasePasswordNeverInArgvOrLogs() throws {
        let (sb, _, cluster) = try pgSandbox("pgsecret")
        defer { sb.cleanup() }
        let secret = "dbpw-\(UUID().uuidString.prefix(10))"
        let role = "r_" + UUID().uuidString.replacingOccurrences(of: "-", with: "").prefix(12).lowercased()
        try cluster.psql("CREATE ROLE \(role) LOGIN PASSWORD '\(secret)'; GRANT CONNECT, CREATE ON DATABASE \(cluster.database) TO \(role)")
        let pgpass = sb.root + "/pgpass"
        try E2E.write(pgpass, "127.0.0.1:\(cluster.port):\(cluster.database):\(role):\(secret)\n")
        chmod(pgpass, 0o600)
        let base = "postgresql://\(role)@127.0.0.1:\(cluster.port)/\(cluster.database)"
        let uri = base + "?passfile=\(pgpass)&container=s_\(role)"
        let i = sb.initContainer(container: uri)
        try #require(i.ok, "\(i)")
        let withPassword = E2E.coffer(["info", "postgresql://\(role):\(secret)@127.0.0.1:\(cluster.port)/\(cluster.database)?container=s_\(role)"])
        #expect(withPassword.status == 64 && withPassword.stderr.contains("~/.pgpass"), "\(withPassword)")
        #expect(!withPassword.stderr.contains(secret) && !withPassword.stdout.contains(secret))
        let noPass = E2E.coffer(["info", base + "?container=s_\(role)&passfile=/nonexistent"])
        // The server asks for a password and none is found: a refused login, not a server away (status 10, as a
        // container that cannot be read; the user unit does not retry it).
        #expect(noPass.status == 10 && noPass.stderr.contains("password") && !noPass.stderr.contains(secret), "\(noPass)")
        let wrongPass = sb.root + "/wrongpass"
        try E2E.write(wrongPass, "127.0.0.1:\(cluster.port):\(cluster.database):\(role):not-\(secret)\n")
        chmod(wrongPass, 0o600)
        let wrong = E2E.coffer(["info", base + "?container=s_\(role)&passfile=\(wrongPass)"])
        #expect(wrong.status == 10 && wrong.stderr.contains("password authentication failed") && !wrong.stderr.contains(secret), "\(wrong)")
        let daemon = try Child(E2E.coffer, ["mount", "-f", "--log-level", "debug", uri, sb.mnt, "--passfile", sb.passfile])
        defer { daemon.stop() }
        try #require(E2E.wait(30) { E2E.answersAsMount(sb.mnt) }, "foreground mount: \(daemon.stderr)")
        try E2E.write(sb.mnt + "/f", "x")
        #expect(E2E.sh("sync \(sb.mnt)/f").ok)
        let pids = ((try? FileManager.default.contentsOfDirectory(atPath: "/proc")) ?? []).compactMap { pid_t($0) }
        let leaking = pids.filter { E2E.cmdline($0).joined(separator: " ").contains(secret) }
        #expect(leaking.isEmpty, "processes with the password in argv: \(leaking)")
        #expect(sb.unmount().ok)
        #expect(daemon.waitForExit(30) == 0)
        #expect(!daemon.stderr.contains(secret), "the daemon's log: \(daemon.stderr.prefix(500))")
        #expect(daemon.stderr.contains("mounted"), "\(daemon.stderr.prefix(500))")
    }
}
