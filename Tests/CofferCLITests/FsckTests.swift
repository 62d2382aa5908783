import Foundation
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// `coffer fsck` on real containers made and filled through a real mount, damaged with sqlite3.
@Suite(
    "fsck on real containers", .enabled(if: E2E.fuseAvailable, "/dev/fuse is not usable"),
    .enabled(if: E2E.which("sqlite3") != nil, "sqlite3 is missing"))
struct FsckTests {
    /// 7 chunks of 32 KiB (inline map), and a one-chunk file.
    static func filled(_ label: String) throws -> (Sandbox, big: [UInt8], small: [UInt8]) {
        let sb = try Sandbox(label)
        try sb.initAndMount()
        let big = E2E.randomBytes(200_000), small = E2E.randomBytes(1000)
        try #require(mkdir(sb.mnt + "/docs", 0o755) == 0)
        try E2E.write(sb.mnt + "/docs/big.bin", big)
        try E2E.write(sb.mnt + "/small.bin", small)
        let u = sb.unmount()
        try #require(u.ok, "\(u)")
        return (sb, big, small)
    }

    /// Deletes chunk 1 of the 7-chunk file, as DeletedChunkTests does.
    static func deleteChunk(_ sb: Sandbox) throws {
        let sql = "DELETE FROM chunks WHERE file IN (SELECT file FROM chunks GROUP BY file HAVING count(*) = 7) AND idx = 1;"
        let edit = E2E.run("/usr/bin/env", ["sqlite3", sb.container + "/store.db", sql])
        try #require(edit.ok, "\(edit)")
    }

    /// Every row of the store, as text: equal dumps mean nothing changed.
    static func dump(_ sb: Sandbox) throws -> String {
        let r = E2E.run("/usr/bin/env", ["sqlite3", "-readonly", sb.container + "/store.db", ".dump"])
        try #require(r.ok, "\(r)")
        return r.stdout
    }

    func fsck(_ sb: Sandbox, _ extra: [String] = [], passfile: String? = nil) -> RunResult {
        E2E.coffer(["fsck", sb.container, "--passfile", passfile ?? sb.passfile] + extra, timeout: 120)
    }

    @Test func cleanContainerExitsZero() throws {
        let (sb, _, _) = try Self.filled("fsckclean")
        defer { sb.cleanup() }
        let r = fsck(sb)
        #expect(r.status == 0, "\(r)")
        #expect(r.stdout.contains("0 problem(s)"), "\(r)")
        #expect(!r.stderr.contains("checking ["), "no progress bar when stderr is not a terminal: \(r)")
    }

    @Test func damagedContainerExitsFourAndNamesThePath() throws {
        let (sb, _, _) = try Self.filled("fsckdamaged")
        defer { sb.cleanup() }
        try Self.deleteChunk(sb)
        let r = fsck(sb)
        #expect(r.status == 4, "\(r)")
        #expect(r.stdout.contains("chunk-missing: /docs/big.bin"), "\(r)")
        #expect(r.stdout.contains("32768-65536"), "the unreadable bytes are named: \(r)")
    }

    @Test func jsonListsTheProblem() throws {
        let (sb, _, _) = try Self.filled("fsckjson")
        defer { sb.cleanup() }
        try Self.deleteChunk(sb)
        let r = fsck(sb, ["--json"])
        #expect(r.status == 4, "\(r)")
        let parsed = try JSONSerialization.jsonObject(with: Data(r.stdout.utf8))
        let doc = try #require(parsed as? [String: Any], "\(r.stdout)")
        #expect(doc["status"] as? Int == 4)
        let problems = try #require(doc["problems"] as? [[String: Any]], "\(r.stdout)")
        let kinds = problems.compactMap { $0["kind"] as? String }
        let paths = problems.compactMap { $0["path"] as? String }
        #expect(kinds == ["chunk-missing"], "\(r.stdout)")
        #expect(paths == ["/docs/big.bin"], "\(r.stdout)")
        let counts = try #require(doc["counts"] as? [String: Any], "\(r.stdout)")
        #expect(counts["chunks"] as? Int == 7, "8 chunks written, one deleted: \(r.stdout)")
    }

    @Test func repairWithYesFixesAndTheContainerMountsAgain() throws {
        let (sb, big, small) = try Self.filled("fsckrepair")
        defer { sb.cleanup() }
        try Self.deleteChunk(sb)
        let repair = fsck(sb, ["--repair", "--yes"])
        #expect(repair.status == 1, "\(repair)")
        #expect(repair.stdout.contains("bytes lost: 32768-65536"), "\(repair)")
        let again = fsck(sb)
        #expect(again.status == 0, "a second fsck after the repair: \(again)")

        let m = sb.mount()
        try #require(m.ok, "\(m)")
        #expect(E2E.read(sb.mnt + "/small.bin") == small, "the undamaged file reads back")
        var expected = big
        for i in 32768..<65536 { expected[i] = 0 }
        #expect(E2E.read(sb.mnt + "/docs/big.bin") == expected, "the damaged file keeps its readable chunks; the lost one is zeros")
        let found = (try? FileManager.default.contentsOfDirectory(atPath: sb.mnt + "/lost+found")) ?? []
        #expect(found.count == 1 && found.first?.hasPrefix("big.bin#") == true, "\(found)")
        #expect(sb.unmount().ok)
    }

    @Test func mountedContainerIsRefusedAndLeftAlone() throws {
        let sb = try Sandbox("fsckmounted")
        defer { sb.cleanup() }
        try sb.initAndMount()
        try E2E.write(sb.mnt + "/f.txt", "data")
        // The daemon's group commit and idle checkpoint are done within this.
        usleep(2_500_000)
        // The daemon holds the store for itself (no other process can read it through SQLite): its bytes.
        let files = ["store.db", "store.db-wal"].map { sb.container + "/" + $0 }
        let before = files.map { FileManager.default.contents(atPath: $0) }
        #expect(before[0] != nil)
        let r = fsck(sb, ["--repair", "--yes"])
        #expect(r.status == 8, "\(r)")
        #expect(r.stderr.contains("container is mounted (pid"), "\(r)")
        #expect(r.stderr.contains("unmount it first"), "\(r)")
        let after = files.map { FileManager.default.contents(atPath: $0) }
        #expect(before == after, "fsck changed a mounted container")
        #expect(E2E.readText(sb.mnt + "/f.txt") == "data", "the mount keeps working")
        #expect(sb.unmount().ok)
        let clean = fsck(sb)
        #expect(clean.status == 0, "\(clean)")
    }

    @Test func wrongPasswordIsAnOperationalError() throws {
        let (sb, _, _) = try Self.filled("fsckwrongpw")
        defer { sb.cleanup() }
        let wrong = sb.root + "/wrong"
        try E2E.write(wrong, "not-the-password\n")
        let r = fsck(sb, passfile: wrong)
        #expect(r.status == 8, "\(r)")
        #expect(r.stderr.contains("wrong password"), "\(r)")
    }

    @Test func repairWithoutYesAndWithoutATerminalChangesNothing() throws {
        let (sb, _, _) = try Self.filled("fscknotty")
        defer { sb.cleanup() }
        try Self.deleteChunk(sb)
        let before = try Self.dump(sb)
        let r = fsck(sb, ["--repair"])
        #expect(r.status == 4, "\(r)")
        #expect(r.stderr.contains("--yes"), "the message says how to repair: \(r)")
        let after = try Self.dump(sb)
        #expect(before == after, "nothing may change without confirmation")
    }

    @Test func answeringNoOnTheTerminalCancels() throws {
        let python = try #require(E2E.python, "python3 is needed to drive a terminal")
        let (sb, _, _) = try Self.filled("fsckno")
        defer { sb.cleanup() }
        try Self.deleteChunk(sb)
        let before = try Self.dump(sb)
        let program = #"""
            import os, pty, sys, time, select
            pid, fd = pty.fork()
            if pid == 0:
                os.execv(sys.argv[1], sys.argv[1:])
            out = b''
            deadline = time.time() + 60
            answered = False
            while time.time() < deadline:
                r, _, _ = select.select([fd], [], [], 0.1)
                if r:
                    try:
                        d = os.read(fd, 4096)
                    except OSError:
                        break
                    if not d:
                        break
                    out += d
                if not answered and b'[y/N]' in out:
                    os.write(fd, b'n\n')
                    answered = True
            _, status = os.waitpid(pid, 0)
            sys.stdout.write(out.decode(errors='replace'))
            sys.exit(os.waitstatus_to_exitcode(status) & 0xff)
            """#
        let r = E2E.run(python, ["-c", program, E2E.coffer, "fsck", sb.container, "--passfile", sb.passfile, "--repair"], timeout: 90)
        #expect(r.status == 32, "\(r)")
        #expect(r.stdout.contains("The repair will:"), "the confirmation lists what it will do: \(r)")
        let after = try Self.dump(sb)
        #expect(before == after, "a cancelled repair changes nothing")
    }

    @Test func usageErrorsExitSixteen() throws {
        let none = E2E.coffer(["fsck"])
        #expect(none.status == 16, "\(none)")
        let yesAlone = E2E.coffer(["fsck", "/nonexistent", "--yes"])
        #expect(yesAlone.status == 16, "\(yesAlone)")
        let help = E2E.coffer(["fsck", "--help"])
        #expect(help.status == 0, "\(help)")
        #expect(help.stdout.contains("32  cancelled by the user"), "--help documents the exit statuses: \(help)")
    }

    /// SQL someone added to the store file: a trigger that would run on every write the mount makes (this
    /// one empties the file's content), a view, a table and its index. The mount refuses the store before
    /// writing anything; fsck names each object and its repair drops them, and the files are all there.
    @Test func objectsCofferNeverMakesAreRefusedByTheMountAndDroppedByTheRepair() throws {
        let (sb, big, small) = try Self.filled("fsckforeign")
        defer { sb.cleanup() }
        let sql = """
            CREATE TRIGGER evil AFTER INSERT ON inodes BEGIN DELETE FROM chunks; END;
            CREATE VIEW peek AS SELECT id FROM inodes;
            CREATE TABLE extra(x); CREATE INDEX extra_x ON extra(x);
            """
        let edit = E2E.run("/usr/bin/env", ["sqlite3", sb.container + "/store.db", sql])
        try #require(edit.ok, "\(edit)")
        let before = try Self.dump(sb)

        let m = sb.mount()
        #expect(m.status == 13, "\(m)")
        #expect(m.stderr.contains("trigger \"evil\"") && m.stderr.contains("fsck --repair"), "\(m)")
        #expect(try Self.dump(sb) == before, "the refused mount wrote nothing")

        let found = fsck(sb)
        #expect(found.status == 4, "\(found)")
        for name in ["trigger \"evil\"", "view \"peek\"", "table \"extra\"", "index \"extra_x\""] {
            #expect(found.stdout.contains("foreign-schema-object: store: \(name)"), "\(name): \(found)")
        }
        let repair = fsck(sb, ["--repair", "--yes"])
        #expect(repair.status == 1, "\(repair)")
        let objects = E2E.run("/usr/bin/env", ["sqlite3", "-readonly", sb.container + "/store.db", "SELECT name FROM sqlite_master"])
        #expect(objects.ok && !["evil", "peek", "extra"].contains { objects.stdout.contains($0) }, "\(objects)")

        try #require(sb.mount().ok)
        try E2E.write(sb.mnt + "/new.txt", "written after the repair")
        #expect(E2E.read(sb.mnt + "/docs/big.bin") == big && E2E.read(sb.mnt + "/small.bin") == small, "every file reads back")
        #expect(sb.unmount().ok)
    }

    /// Keys stored as another type (SQLite keeps any): a chunk's index as a real, every entry's keys as text. fsck
    /// reports them, its repair gives them their type back and loses nothing: every file reads as written.
    @Test func mistypedRowsGetTheirTypeBackAndNothingIsLost() throws {
        let (sb, big, small) = try Self.filled("fsckmistyped")
        defer { sb.cleanup() }
        // The entries' first key column too: lookups by directory then miss them, and a plan made beside them
        // linked every file into /lost+found before the rows were given their type back.
        let sql = "UPDATE chunks SET idx = idx + 0.5 WHERE idx = 3; UPDATE dirents SET parent = CAST(parent AS TEXT), tag = CAST(tag AS TEXT);"
        let edit = E2E.run("/usr/bin/env", ["sqlite3", sb.container + "/store.db", sql])
        try #require(edit.ok, "\(edit)")
        let found = fsck(sb)
        #expect(found.status == 4, "\(found)")
        #expect(found.stdout.contains("mistyped-row: store: 1 row(s) of chunks"), "\(found)")
        #expect(found.stdout.contains("mistyped-row: store: 3 row(s) of dirents"), "\(found)")
        let repair = fsck(sb, ["--repair", "--yes"])
        #expect(repair.status == 1 && !repair.stdout.contains("lost"), "nothing lost, nothing in lost+found: \(repair)")
        #expect(fsck(sb).status == 0)
        try #require(sb.mount().ok)
        #expect(E2E.read(sb.mnt + "/docs/big.bin") == big && E2E.read(sb.mnt + "/small.bin") == small, "every file reads back")
        #expect(sb.unmount().ok)
    }

    /// A zeroed page of the chunks' index: the rows all open, so only SQLite's own check finds it. fsck says
    /// so (status 4), and its repair, which cannot mend a page, says so and changes nothing.
    @Test func aDamagedPageOfTheStoreFileIsReported() throws {
        let (sb, _, _) = try Self.filled("fsckpage")
        defer { sb.cleanup() }
        let store = sb.container + "/store.db"
        let q = E2E.run(
            "/usr/bin/env",
            ["sqlite3", "-readonly", store, "SELECT rootpage FROM sqlite_master WHERE name = 'sqlite_autoindex_chunks_1'; PRAGMA page_size;"])
        let numbers = q.stdout.split(separator: "\n").compactMap { Int($0) }
        try #require(q.ok && numbers.count == 2, "\(q)")
        let (page, size) = (numbers[0], numbers[1])
        let fd = open(store, O_WRONLY)
        try #require(fd >= 0)
        let zeros = [UInt8](repeating: 0, count: size)
        #expect(pwrite(fd, zeros, size, off_t((page - 1) * size)) == size)
        close(fd)

        let before = E2E.read(store)
        let found = fsck(sb)
        #expect(found.status == 4, "\(found)")
        #expect(found.stdout.contains("store-file-damaged: store: SQLite's check: Page \(page):"), "\(found)")
        let repair = fsck(sb, ["--repair", "--yes"])
        #expect(repair.status == 4 && repair.stderr.contains("nothing found here can be repaired"), "\(repair)")
        #expect(E2E.read(store) == before, "the repair changed nothing")
    }

    /// A page whose header SQLite cannot even read (here the dirents table's root, its cell count made
    /// huge): its own check stops with an error there. That is reported as `store-file-damaged` (4); it
    /// was an operational error (8, "could not run") while the mount worked (a tester's find).
    @Test func aPageTheCheckCannotReadIsReported() throws {
        let (sb, _, _) = try Self.filled("fsckheader")
        defer { sb.cleanup() }
        let store = sb.container + "/store.db"
        let q = E2E.run(
            "/usr/bin/env", ["sqlite3", "-readonly", store, "SELECT rootpage FROM sqlite_master WHERE name = 'dirents'; PRAGMA page_size;"])
        let numbers = q.stdout.split(separator: "\n").compactMap { Int($0) }
        try #require(q.ok && numbers.count == 2, "\(q)")
        let fd = open(store, O_WRONLY)
        try #require(fd >= 0)
        let header: [UInt8] = [0x0D, 0, 0, 0, 9]  // over the cell count and what follows: a count no page holds
        #expect(pwrite(fd, header, header.count, off_t((numbers[0] - 1) * numbers[1] + 3)) == header.count)
        close(fd)
        let found = fsck(sb)
        #expect(found.status == 4 && found.stdout.contains("store-file-damaged: store: SQLite's check: the check stopped"), "\(found)")
    }

    /// A segment file cut short, then removed: fsck names it (segment-file-damaged: restoring that one file
    /// mends every chunk in it), and `coffer copy` refuses a source with it (13) instead of copying the damage.
    /// Both said nothing of the file before: fsck called its chunks "an older or foreign copy" and the copy
    /// succeeded (a tester's find).
    @Test func aMissingOrShortSegmentFileIsNamed() throws {
        let (sb, _, _) = try Self.filled("fscksegment")
        defer { sb.cleanup() }
        let dir = sb.container + "/segments"
        let names = try FileManager.default.contentsOfDirectory(atPath: dir).filter { Int($0) != nil }
        let name = try #require(names.first { (E2E.statOf(dir + "/" + $0)?.st_size ?? 0) > 100_000 }, "a segment with the big file: \(names)")
        #expect(truncate(dir + "/" + name, 50_000) == 0)
        let short = fsck(sb)
        #expect(short.status == 4 && short.stdout.contains("segment-file-damaged: store: segments/\(name) is 50000 bytes, shorter"), "\(short)")
        #expect(unlink(dir + "/" + name) == 0)
        let missing = fsck(sb)
        #expect(missing.status == 4 && missing.stdout.contains("segment-file-damaged: store: segments/\(name) is missing"), "\(missing)")
        let copy = E2E.coffer(["copy", sb.container, sb.root + "/backup"])
        #expect(copy.status == 13 && copy.stderr.contains("SRC is damaged: segments/\(name) is missing"), "\(copy)")
    }

    @Test func missingContainerIsAnOperationalError() throws {
        let r = E2E.coffer(["fsck", "/nonexistent/coffer-fsck-test", "--passfile", "/dev/null"])
        #expect(r.status == 8, "\(r)")
        #expect(r.stderr.contains("no such container"), "\(r)")
    }

    /// A garbage header is an operational error (8); a store file cut short is a problem fsck reports
    /// (store-file-damaged, 4), which it does not repair, and which a mount refuses saying so. It was an
    /// operational error saying "not a Coffer entity store" (a tester's find).
    @Test func garbageHeaderIsAnErrorAndACutStoreIsReportedDamaged() throws {
        let (sb, _, _) = try Self.filled("fsckgarbage")
        defer { sb.cleanup() }
        let store = sb.container + "/store.db"
        let header = sb.container + "/coffer.json"
        let saved = try #require(E2E.read(header))
        try E2E.write(header, "{ not json")
        let garbage = fsck(sb)
        #expect(garbage.status == 8, "\(garbage)")
        try E2E.write(header, saved)

        let cut = E2E.run("/usr/bin/truncate", ["-s", "20000", store])
        try #require(cut.ok, "\(cut)")
        let before = E2E.read(store)
        let r = fsck(sb, ["--repair", "--yes"])
        #expect(r.status == 4 && r.stdout.contains("store-file-damaged: store: SQLite cannot open it"), "\(r)")
        #expect(r.stderr.contains("nothing found here can be repaired"), "\(r)")
        #expect(E2E.read(store) == before, "the repair changed nothing")
        let m = sb.mount()
        #expect(m.status == 13 && m.stderr.contains("the store file is damaged"), "\(m)")
    }
}
