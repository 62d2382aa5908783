import CofferTestSupport
import Foundation
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// `coffer copy` through the real binary: directory and PostgreSQL copies that mount and check clean,
/// interrupted copies that resume, refusals, `--verify` and a mounted source.
@Suite("coffer copy", .enabled(if: E2E.fuseAvailable, "/dev/fuse is not usable"))
struct CopyTests {
    /// A container with a nested tree, a paged chunk map (1 MiB file), an xattr and a symlink; unmounted.
    /// Returns every regular file's bytes as the mount showed them.
    static func filled(_ label: String) throws -> (Sandbox, [String: [UInt8]]) {
        let sb = try Sandbox(label)
        try sb.initAndMount()
        try #require(mkdir(sb.mnt + "/docs", 0o755) == 0 && mkdir(sb.mnt + "/docs/deep", 0o700) == 0)
        try E2E.write(sb.mnt + "/docs/big.bin", E2E.randomBytes(1 << 20))
        try E2E.write(sb.mnt + "/docs/deep/mid.bin", E2E.randomBytes(100_000))
        for i in 0..<40 { try E2E.write(sb.mnt + "/docs/f\(i).txt", "file \(i)\n") }
        try #require(symlink("docs/f1.txt", sb.mnt + "/link") == 0)
        let x = E2E.py("import os, sys; os.setxattr(sys.argv[1], 'user.note', b'v')", [sb.mnt + "/docs/f2.txt"])
        try #require(x.ok, "\(x)")
        let files = E2E.snapshot(sb.mnt)
        let u = sb.unmount()
        try #require(u.ok, "\(u)")
        return (sb, files)
    }

    /// Mounts `container` at a fresh mountpoint, checks every file against `files`, unmounts.
    static func expectSameFiles(_ sb: Sandbox, _ container: String, _ files: [String: [UInt8]], options: String? = nil) throws {
        let mnt = sb.root + "/m-" + UUID().uuidString.prefix(8)
        try #require(mkdir(mnt, 0o755) == 0)
        let m = sb.mount(container: container, at: mnt, options: options)
        try #require(m.ok, "mount of the copy: \(m)")
        defer { _ = sb.unmount(mnt) }
        let seen = E2E.snapshot(mnt)
        #expect(seen.keys.sorted() == files.keys.sorted())
        for (path, bytes) in files { #expect(seen[path] == bytes, "\(path) differs in the copy") }
        #expect((try? FileManager.default.destinationOfSymbolicLink(atPath: mnt + "/link")) == "docs/f1.txt")
        let x = E2E.py("import os, sys; print(os.getxattr(sys.argv[1], 'user.note').decode())", [mnt + "/docs/f2.txt"])
        #expect(x.ok && x.stdout == "v\n", "the xattr in the copy: \(x)")
    }

    static func fsckClean(_ sb: Sandbox, _ container: String) {
        let r = E2E.coffer(["fsck", container, "--passfile", sb.passfile], timeout: 120)
        #expect(r.status == 0 && r.stdout.contains("0 problem(s)"), "fsck of the copy: \(r)")
    }

    /// `coffer copy` with the test hooks: batches of `batchBytes`, `signal` after `killAfter` batches.
    static func copy(_ args: [String], batchBytes: Int? = nil, killAfter: Int? = nil, signal: Int32 = SIGKILL) -> RunResult {
        var env = ProcessInfo.processInfo.environment
        if let batchBytes { env["COFFER_COPY_TEST_BATCH_BYTES"] = String(batchBytes) }
        if let killAfter { env["COFFER_COPY_TEST_KILL_AFTER"] = String(killAfter) }
        env["COFFER_COPY_TEST_KILL_SIGNAL"] = String(signal)
        return E2E.run(E2E.coffer, ["copy"] + args, environment: env, timeout: 120)
    }

    /// A private PostgreSQL cluster; a missing server fails the test (never skips).
    static func cluster() throws -> PostgresCluster {
        do { return try PostgresCluster() } catch {
            throw TestFailure("\(error) — run `make test-deps` (it installs Debian's postgresql)")
        }
    }

    @Test func directoryCopyMountsWithTheSameFilesAndAnOlderCopyIsARollback() throws {
        let (sb, files) = try Self.filled("copydir")
        defer { sb.cleanup() }
        let copy = sb.root + "/copy"
        let r = Self.copy([sb.container, copy])
        #expect(r.ok && r.stdout.contains("copied"), "\(r)")
        #expect(!r.stderr.contains("copying ["), "no progress bar when stderr is not a terminal: \(r)")
        Self.fsckClean(sb, copy)
        let info = E2E.coffer(["info", copy]), original = E2E.coffer(["info", sb.container])
        #expect(
            info.ok && info.stdout.replacingOccurrences(of: copy, with: "") == original.stdout.replacingOccurrences(of: sb.container, with: ""),
            "the same header: \(info) \(original)")
        try Self.expectSameFiles(sb, copy, files)

        // The original moves on; the copy is now an older state of the same container.
        let m = sb.mount()
        try #require(m.ok, "\(m)")
        try E2E.write(sb.mnt + "/later.txt", "later")
        try #require(sb.unmount().ok)
        let mnt = sb.root + "/restore"
        try #require(mkdir(mnt, 0o755) == 0)
        let refused = sb.mount(container: copy, at: mnt)
        #expect(refused.status == 18 && !E2E.isMounted(mnt), "mounting the older copy is a rollback: \(refused)")
        try Self.expectSameFiles(sb, copy, files, options: "allow_rollback")
    }

    @Test func postgresRoundTripIsTheSameContainer() throws {
        let cluster = try Self.cluster()
        defer { cluster.destroy() }
        let (sb, files) = try Self.filled("copypg")
        defer { sb.cleanup() }
        let uri = cluster.superuserURI + "&container=backup"
        let up = Self.copy([sb.container, uri, "--verify", "--passfile", sb.passfile])
        #expect(up.ok && up.stdout.contains("verified:"), "\(up)")
        let again = Self.copy([sb.container, uri])
        #expect(again.status == 1 && again.stderr.contains("already a complete copy of this container"), "\(again)")

        let back = sb.root + "/back"
        let down = Self.copy([uri, back, "--verify", "--passfile", sb.passfile])
        #expect(down.ok && down.stdout.contains("verified:"), "\(down)")
        Self.fsckClean(sb, back)
        try Self.expectSameFiles(sb, back, files)

        // Interrupted on the way into PostgreSQL, then resumed.
        let uri2 = cluster.superuserURI + "&container=second"
        let killed = Self.copy([sb.container, uri2], batchBytes: 64 << 10, killAfter: 4)
        #expect(killed.status != 0, "the hook kills the copy: \(killed)")
        // An unfinished copy is no container, and is said to be one (not "the header row is missing": damage).
        for args in [["copy", uri2, sb.root + "/never"], ["info", uri2], ["mount", uri2, sb.mnt, "--passfile", sb.passfile]] {
            let unfinished = E2E.coffer(args)
            #expect(unfinished.status == 10 && unfinished.stderr.contains("an unfinished coffer copy"), "\(args[0]): \(unfinished)")
        }
        let resumed = Self.copy([sb.container, uri2, "--verify", "--passfile", sb.passfile])
        #expect(resumed.ok && resumed.stderr.contains("resuming an interrupted copy"), "\(resumed)")
        #expect(resumed.stdout.contains("verified:"), "\(resumed)")

        // Killed before its first progress record was committed (the hook at 0 batches): the schema's
        // creation went with it (one transaction), and the same command makes the whole copy.
        let uri3 = cluster.superuserURI + "&container=third"
        #expect(Self.copy([sb.container, uri3], killAfter: 0).status != 0, "the hook kills the copy")
        let fresh = Self.copy([sb.container, uri3, "--verify", "--passfile", sb.passfile])
        #expect(fresh.ok && !fresh.stderr.contains("resuming") && fresh.stdout.contains("verified:"), "\(fresh)")
    }

    @Test func interruptedCopyResumesAndStartsOverWhenTheSourceChanged() throws {
        let (sb, files) = try Self.filled("copyresume")
        defer { sb.cleanup() }
        let copy = sb.root + "/copy"
        let killed = Self.copy([sb.container, copy], batchBytes: 64 << 10, killAfter: 6)
        #expect(killed.status != 0 && !killed.stdout.contains("copied"), "the hook kills the copy: \(killed)")
        #expect(access(copy + "/coffer.json", F_OK) != 0, "no header until every row is there")
        let notYet = E2E.coffer(["info", copy])
        #expect(notYet.status == 10 && notYet.stderr.contains("an unfinished coffer copy"), "an unfinished copy is no container: \(notYet)")

        let resumed = Self.copy([sb.container, copy, "--verify", "--passfile", sb.passfile], batchBytes: 64 << 10)
        #expect(resumed.ok && resumed.stderr.contains("resuming an interrupted copy"), "\(resumed)")
        #expect(!resumed.stderr.contains("interrupted copy: 0 of"), "rows of the first run were kept: \(resumed)")
        #expect(resumed.stdout.contains("verified:"), "\(resumed)")
        Self.fsckClean(sb, copy)
        try Self.expectSameFiles(sb, copy, files)

        // Interrupted again, then the source changes: the next copy starts over and has the change.
        let copy2 = sb.root + "/copy2"
        #expect(Self.copy([sb.container, copy2], batchBytes: 64 << 10, killAfter: 3).status != 0)
        try #require(sb.mount().ok)
        try E2E.write(sb.mnt + "/new.txt", "new")
        var changed = E2E.snapshot(sb.mnt)
        try #require(sb.unmount().ok)
        let over = Self.copy([sb.container, copy2, "--verify", "--passfile", sb.passfile])
        #expect(over.ok && over.stderr.contains("starting over"), "\(over)")
        changed["new.txt"] = Array("new".utf8)
        try Self.expectSameFiles(sb, copy2, changed)
    }

    /// A copy of a mounted container interrupted (SIGTERM, SIGINT, then SIGKILL) leaves no snapshot (each as
    /// large as the store) beside DEST: a signal removes its own, and the next copy removes one a killed copy
    /// left. Each was left behind, one more per interruption (a tester's find).
    @Test func anInterruptedCopyOfAMountedContainerLeavesNoSnapshot() throws {
        let (sb, files) = try Self.filled("copysnap")
        defer { sb.cleanup() }
        try #require(sb.mount().ok)
        let copy = sb.root + "/copy"
        func snapshots() -> [String] {
            ((try? FileManager.default.contentsOfDirectory(atPath: sb.root)) ?? []).filter { $0.hasPrefix(".coffer-snapshot-") }
        }
        for sig in [SIGTERM, SIGINT] {
            let stopped = Self.copy([sb.container, copy], batchBytes: 64 << 10, killAfter: 2, signal: sig)
            #expect(stopped.status == 128 + sig, "\(stopped)")
            #expect(snapshots() == [], "after signal \(sig)")
        }
        let killed = Self.copy([sb.container, copy], batchBytes: 64 << 10, killAfter: 2)
        #expect(killed.status == 128 + SIGKILL, "\(killed)")
        #expect(snapshots().count == 1, "a killed copy cannot remove its snapshot")
        let done = Self.copy([sb.container, copy])
        #expect(done.ok && done.stderr.contains("resuming an interrupted copy"), "\(done)")
        #expect(snapshots() == [], "the next copy removed the one left")
        try #require(sb.unmount().ok)
        Self.fsckClean(sb, copy)
        try Self.expectSameFiles(sb, copy, files)
    }

    /// Killed before its new store held a first progress record (the hook at 0 batches): what the kill left
    /// is the copy's own, and the same command again makes the whole copy. A `store.db` left without a
    /// record was refused as something else's; one that is someone else's still is, untouched.
    @Test func copyKilledBeforeItsFirstProgressRecordStartsAfresh() throws {
        let (sb, files) = try Self.filled("copyearly")
        defer { sb.cleanup() }
        let copy = sb.root + "/copy"
        let killed = Self.copy([sb.container, copy], killAfter: 0)
        #expect(killed.status != 0 && !killed.stdout.contains("copied"), "the hook kills the copy: \(killed)")
        let left = (try? FileManager.default.contentsOfDirectory(atPath: copy)) ?? []
        #expect(!left.isEmpty && !left.contains("coffer.json"), "the kill left a half-made store: \(left)")
        let again = Self.copy([sb.container, copy, "--verify", "--passfile", sb.passfile])
        #expect(again.ok && again.stdout.contains("copied") && again.stdout.contains("verified:"), "\(again)")
        #expect((try? FileManager.default.contentsOfDirectory(atPath: copy))?.filter { $0.hasPrefix("store.db.") } == [], "no temporary store left")
        Self.fsckClean(sb, copy)
        try Self.expectSameFiles(sb, copy, files)

        let other = sb.root + "/other"
        try #require(mkdir(other, 0o755) == 0)
        try E2E.write(other + "/store.db", "not a store")
        let refused = Self.copy([sb.container, other])
        #expect(refused.status == 1 && refused.stderr.contains("refusing to overwrite"), "\(refused)")
        #expect(E2E.readText(other + "/store.db") == "not a store" && (try? FileManager.default.contentsOfDirectory(atPath: other))?.count == 1)
    }

    /// A full disk under DEST is said to be DEST's (not the container's), status 1 (not 13, a damaged store),
    /// for a mounted source (its daemon writes the snapshot beside DEST) and an unmounted one; with room
    /// made, the same command finishes the copy.
    @Test(.enabled(if: E2E.isRoot, "a tmpfs of fixed size needs root"))
    func aFullDestinationDiskIsDestsAndNotADamagedStore() throws {
        let sb = try Sandbox("copyfull")
        defer { sb.cleanup() }
        try sb.initAndMount()
        try E2E.write(sb.mnt + "/big.bin", E2E.randomBytes(12 << 20))
        #expect(E2E.sh("sync '\(sb.mnt)/big.bin'").ok)
        let disk = try sb.smallDisk("5m", name: "small")

        let mounted = Self.copy([sb.container, disk + "/b1"])
        #expect(mounted.status == 1, "\(mounted)")
        #expect(mounted.stderr.contains("DEST \(disk)/b1: no space left beside it (in \(disk)) for the snapshot of the mounted SRC"), "\(mounted)")
        #expect(!mounted.stderr.contains("container's disk") && !mounted.stderr.contains("SRC:"), "\(mounted)")
        #expect((try? FileManager.default.contentsOfDirectory(atPath: disk))?.filter { $0.hasPrefix(".coffer-snapshot-") } == [])
        try #require(sb.unmount().ok)

        let unmounted = Self.copy([sb.container, disk + "/b2"])
        #expect(unmounted.status == 1 && unmounted.stderr.contains("DEST \(disk)/b2: no space left on its disk"), "\(unmounted)")
        #expect(!unmounted.stderr.contains("container's disk"), "\(unmounted)")

        try #require(E2E.sh("mount -o remount,size=100m '\(disk)'").ok)
        let again = Self.copy([sb.container, disk + "/b2", "--verify", "--passfile", sb.passfile])
        #expect(again.ok && again.stdout.contains("verified:"), "\(again)")
    }

    /// The progress record lies in the destination, where anyone may edit it: a count that would index out
    /// of range is refused with a clear error, never a crash.
    @Test func anEditedProgressRecordIsRefused() throws {
        let (sb, _) = try Self.filled("copyedit")
        defer { sb.cleanup() }
        let copy = sb.root + "/copy"
        #expect(Self.copy([sb.container, copy], batchBytes: 64 << 10, killAfter: 3).status != 0)
        let edit = E2E.py(
            """
            import json, sqlite3, sys
            db = sqlite3.connect(sys.argv[1])
            p = json.loads(db.execute('SELECT value FROM coffer_copy WHERE id = 1').fetchone()[0])
            p['done'] = -1
            db.execute('UPDATE coffer_copy SET value = ? WHERE id = 1', (json.dumps(p).encode(),))
            db.commit()
            """, [copy + "/store.db"])
        try #require(edit.ok, "\(edit)")
        let resumed = Self.copy([sb.container, copy])
        #expect(resumed.status == 1 && resumed.stderr.contains("progress record cannot be read"), "\(resumed)")
    }

    @Test func existingDestinationsAreRefused() throws {
        let (sb, _) = try Self.filled("copyrefuse")
        defer { sb.cleanup() }
        // A directory with something else in it.
        let other = sb.root + "/other"
        try #require(mkdir(other, 0o755) == 0)
        try E2E.write(other + "/keep.txt", "keep")
        let r1 = Self.copy([sb.container, other])
        #expect(r1.status == 1 && r1.stderr.contains("not an unfinished copy") && r1.stderr.contains("refusing to overwrite"), "\(r1)")
        #expect(E2E.readText(other + "/keep.txt") == "keep" && (try? FileManager.default.contentsOfDirectory(atPath: other))?.count == 1)
        // A different container, complete and unfinished.
        let second = sb.root + "/second"
        #expect(sb.initContainer(container: second).ok)
        let before = E2E.read(second + "/store.db")
        let r2 = Self.copy([sb.container, second])
        #expect(r2.status == 1 && r2.stderr.contains("is a different container"), "\(r2)")
        #expect(E2E.read(second + "/store.db") == before, "the other container is untouched")
        let partial = sb.root + "/partial"
        #expect(Self.copy([second, partial], killAfter: 1).status != 0)
        let r3 = Self.copy([sb.container, partial])
        #expect(r3.status == 1 && r3.stderr.contains("unfinished copy of a different container"), "\(r3)")
        // A complete copy of this container.
        let copy = sb.root + "/copy"
        #expect(Self.copy([sb.container, copy]).ok)
        let r4 = Self.copy([sb.container, copy])
        #expect(r4.status == 1 && r4.stderr.contains("already a complete copy of this container"), "\(r4)")
        // One inside the other, either way round (the same place is refused too).
        for (from, to) in [(sb.container, sb.container + "/inner"), (sb.container, sb.container + "/segments/x"), (sb.container, sb.root)] {
            let r = Self.copy([from, to])
            #expect(r.status == 64 && r.stderr.contains("one inside the other"), "\(from) -> \(to): \(r)")
        }
        #expect(access(sb.container + "/inner", F_OK) != 0)
        #expect(Self.copy([sb.container, sb.container + "/."]).stderr.contains("the same place"))
    }

    @Test func verifyFindsARowTamperedInTheCopy() throws {
        let (sb, _) = try Self.filled("copytamper")
        defer { sb.cleanup() }
        let copy = sb.root + "/copy"
        // Killed after the schema and the inodes were committed; one copied inode row is then changed.
        #expect(Self.copy([sb.container, copy], killAfter: 2).status != 0)
        let flip = E2E.py(
            """
            import sqlite3, sys
            db = sqlite3.connect(sys.argv[1])
            id, v = db.execute('SELECT id, value FROM inodes ORDER BY id DESC LIMIT 1').fetchone()
            v = bytearray(v); v[20] ^= 1
            db.execute('UPDATE inodes SET value = ? WHERE id = ?', (bytes(v), id)); db.commit()
            """, [copy + "/store.db"])
        try #require(flip.ok, "\(flip)")
        let r = Self.copy([sb.container, copy, "--verify", "--passfile", sb.passfile])
        #expect(r.status == 13, "\(r)")
        #expect(r.stderr.contains("verify: the copy has") && r.stdout.contains("inode"), "\(r)")
        // A wrong secret with --verify is refused before anything is copied (it was found only after the copy).
        let wrong = sb.root + "/wrong"
        try E2E.write(wrong, "not-\(sb.password)\n")
        let refused = Self.copy([sb.container, sb.root + "/copy2", "--verify", "--passfile", wrong])
        #expect(refused.status == 12 && access(sb.root + "/copy2", F_OK) != 0, "\(refused)")
    }
}
