import Foundation
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// Issue "Integrity": each attack is made on an unmounted container with ordinary tools (python3's
/// sqlite3 module, cp; for a PostgreSQL container psql as the server's superuser: TamperStore), then
/// the container is mounted and read. Damage inside a file is EIO on that file and nothing else; no
/// read ever returns bytes that are not the file's own. The same attacks run on either engine
/// (COFFER_TEST_ENGINE=postgres: the server is the attacker).
@Suite("Integrity: attacks on a real container", .enabled(if: E2E.fuseAvailable, "/dev/fuse is not usable"))
struct IntegrityTests {
    /// The tree every attack starts from. `paged` has more than 8 chunks (its chunk map is paged),
    /// `inline` 5 (inline map), the rest one chunk each. Chunks are 32 KiB.
    static let files: [String: Int] = ["paged.bin": 330_000, "inline.bin": 150_000, "a.txt": 1000, "b.txt": 2000, "d/inner.txt": 3000]

    final class World {
        let sb: Sandbox
        var originals: [String: [UInt8]] = [:]
        var inodes: [String: UInt64] = [:]
        /// The store the attacks edit: the directory's store.db, or the container's URI.
        var store: String { TamperStore.target(sb.container) }
        var isPostgres: Bool { TestEngine.isURI(sb.container) }

        init(_ label: String) throws {
            sb = try Sandbox(label)
            // The caller's cleanup is not set up until this returns: a failure here unmounts itself.
            do {
                try sb.initAndMount()
                try #require(mkdir(sb.mnt + "/d", 0o755) == 0)
                for (name, size) in IntegrityTests.files.sorted(by: { $0.key < $1.key }) {
                    let bytes = E2E.randomBytes(size)
                    try E2E.write(sb.mnt + "/" + name, bytes)
                    originals[name] = bytes
                    let st = try #require(E2E.statOf(sb.mnt + "/" + name))
                    inodes[name] = UInt64(st.st_ino)
                }
                try #require(E2E.sh("setfattr -n user.note -v secret-note '\(sb.mnt)/a.txt'").ok)
                try #require(sb.unmount().ok)
            } catch {
                sb.cleanup()
                throw error
            }
        }

        /// Runs a python3 program with `db` connected to the store (sqlite3, or psql on the schema:
        /// TamperStore), the store's path or URI as argv[1] and `extra` after it.
        func edit(_ program: String, _ extra: [String] = []) throws {
            let r = E2E.py(TamperStore.python + "db = connect(sys.argv[1])\n" + program + "\ndb.commit()\n", [store] + extra)
            try #require(r.ok, "the edit failed: \(r)")
        }

        /// A copy of the container's store as it is now (the attacker's old copy), for `ATTACH DATABASE
        /// ? AS old` in an edit: a copy of store.db, or of the schema in the same cluster.
        func snapshot() throws -> String {
            if isPostgres {
                let old = TamperStore.schema(sb.container) + "_old"
                try TamperStore.copySchema(from: TamperStore.schema(sb.container), to: old)
                return old
            }
            let copy = sb.root + "/old"
            try #require(E2E.run("/bin/cp", ["-a", sb.container, copy]).ok)
            // Its chunks back in their rows (TamperStore.inline_segments), as `edit` does to the store.
            try #require(E2E.py(TamperStore.python + "connect(sys.argv[1]).close()", [copy + "/store.db"]).ok)
            return copy + "/store.db"
        }

        /// Reads every original path through the mount: "ok" with the bytes equal to the original,
        /// or the error's name. A read that returns other bytes is recorded as "WRONG".
        func readAll() -> [String: String] {
            var out: [String: String] = [:]
            for (name, bytes) in originals {
                switch IntegrityTests.readFile(sb.mnt + "/" + name) {
                case .success(let got): out[name] = got == bytes ? "ok" : "WRONG"
                case .failure(let e) where e.code == EIO: out[name] = "EIO"
                case .failure(let e) where e.code == ENOENT: out[name] = "ENOENT"
                case .failure(let e): out[name] = "errno \(e.code)"
                }
            }
            return out
        }

        /// Mounts, reads everything, checks the daemon survived, unmounts.
        func mountAndRead() throws -> [String: String] {
            let m = sb.mount()
            try #require(m.ok, "mount failed: \(m)")
            let pid = E2E.daemonPid(container: sb.container)
            let result = readAll()
            let listing = E2E.sh("ls -laR '\(sb.mnt)' > /dev/null")
            #expect(listing.status == 0 || listing.stderr.contains("Input/output error"), "listing: \(listing)")
            if let pid { #expect(E2E.isAlive(pid), "the daemon died while reading a damaged container") }
            #expect(sb.unmount().ok)
            return result
        }

        /// Every path reads its own bytes except `damaged`, which give EIO (or ENOENT where allowed).
        func expect(_ result: [String: String], damaged: Set<String>, orMissing: Set<String> = [], sourceLocation: SourceLocation = #_sourceLocation)
        {
            for (name, outcome) in result.sorted(by: { $0.key < $1.key }) {
                if damaged.contains(name) {
                    #expect(outcome == "EIO", "\(name): \(outcome)", sourceLocation: sourceLocation)
                } else if orMissing.contains(name) {
                    #expect(outcome == "EIO" || outcome == "ENOENT", "\(name): \(outcome)", sourceLocation: sourceLocation)
                } else {
                    #expect(outcome == "ok", "\(name) should be intact: \(outcome)", sourceLocation: sourceLocation)
                }
            }
        }

        func cleanup() { sb.cleanup() }
    }

    /// SQL that selects the content id of the file with `chunks` chunks (the sizes above are distinct).
    static func file(withChunks chunks: Int) -> String {
        "(SELECT file FROM chunks GROUP BY file HAVING count(*) = \(chunks))"
    }
    static let pagedFile = file(withChunks: 11)
    static let inlineFile = file(withChunks: 5)

    static let flipOneBit = """
        def flip(table, where, args=()):
            row = db.execute(f'SELECT value FROM {table} WHERE {where} LIMIT 1', args).fetchone()
            assert row, (table, where)
            v = bytearray(row[0]); v[len(v) // 2] ^= 0x10
            assert db.execute(f'UPDATE {table} SET value = ? WHERE value = ?', (bytes(v), row[0])).rowcount == 1

        """

    @Test func bitFlipInAChunkIsEIOOnThatFileOnly() throws {
        let w = try World("flipchunk")
        defer { w.cleanup() }
        try w.edit(Self.flipOneBit + "flip('chunks', 'file = \(Self.pagedFile) AND idx = 4')")
        w.expect(try w.mountAndRead(), damaged: ["paged.bin"])
    }

    /// Chunks sealed in 4 KiB blocks: a byte flipped in one block of a chunk fails the reads of that block; the
    /// file's other blocks, in the same chunk too, still read their own bytes (read one page at a time, without
    /// readahead), and reading the whole file is EIO.
    @Test func bitFlipInOneBlockFailsTheReadsOfThatBlockOnly() throws {
        let w = try World("flipblock")
        defer { w.cleanup() }
        try w.edit(
            """
            row = db.execute('SELECT value FROM chunks WHERE file = \(Self.pagedFile) AND idx = 4').fetchone()
            v = bytearray(row[0])
            assert len(v) == 32768 + 8 * 16 + 16, len(v)
            v[2 * 4112 + 100] ^= 0x10
            assert db.execute('UPDATE chunks SET value = ? WHERE value = ?', (bytes(v), row[0])).rowcount == 1
            """)
        try #require(w.sb.mount().ok)
        defer { _ = w.sb.unmount() }
        let original = try #require(w.originals["paged.bin"])
        // Chunk 4's blocks 1, 2 (the damaged one) and 3, then block 2 of chunk 3.
        let offsets = [4 * 32768 + 4096, 4 * 32768 + 8192, 4 * 32768 + 12288, 3 * 32768 + 8192]
        let probe = E2E.py(
            """
            import os, sys
            fd = os.open(sys.argv[1], os.O_RDONLY)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
            for off in map(int, sys.argv[2:]):
                try:
                    print(os.pread(fd, 4096, off).hex())
                except OSError as e:
                    print('errno', e.errno)
            """, [w.sb.mnt + "/paged.bin"] + offsets.map(String.init))
        try #require(probe.ok, "\(probe)")
        let lines = probe.stdout.split(separator: "\n").map(String.init)
        try #require(lines.count == offsets.count, "\(probe)")
        for (offset, line) in zip(offsets, lines) {
            if offset == 4 * 32768 + 8192 {
                #expect(line == "errno \(EIO)", "the damaged block")
            } else {
                #expect(line == original[offset..<offset + 4096].map { String(format: "%02x", $0) }.joined(), "block at \(offset)")
            }
        }
        if case .failure(let e) = Self.readFile(w.sb.mnt + "/paged.bin") { #expect(e.code == EIO) } else { Issue.record("the whole file read") }
        #expect((try? Self.readFile(w.sb.mnt + "/inline.bin").get()) == w.originals["inline.bin"])
    }

    @Test func bitFlipInAChunkMapPageIsEIOOnThatFile() throws {
        let w = try World("flippage")
        defer { w.cleanup() }
        try w.edit(Self.flipOneBit + "flip('chunkmaps', 'file = \(Self.pagedFile)')")
        w.expect(try w.mountAndRead(), damaged: ["paged.bin"])
    }

    @Test func bitFlipInAnInodeIsEIOOnThatFile() throws {
        let w = try World("flipinode")
        defer { w.cleanup() }
        let ino = try #require(w.inodes["b.txt"])
        try w.edit(Self.flipOneBit + "flip('inodes', 'id = ?', (\(Int64(bitPattern: ino)),))")
        w.expect(try w.mountAndRead(), damaged: ["b.txt"])
    }

    @Test func bitFlipInADirectoryEntryHidesOnlyThatEntry() throws {
        let w = try World("flipentry")
        defer { w.cleanup() }
        // The entry group with one row is d/'s (it holds inner.txt only).
        try w.edit(Self.flipOneBit + "flip('dirents', 'parent = (SELECT parent FROM dirents GROUP BY parent HAVING count(*) = 1)')")
        w.expect(try w.mountAndRead(), damaged: ["d/inner.txt"])
    }

    @Test func bitFlipInAnXattrFailsThatAttributeOnly() throws {
        let w = try World("flipxattr")
        defer { w.cleanup() }
        try w.edit(Self.flipOneBit + "flip('xattrs', 'true')")
        try #require(w.sb.mount().ok)
        let get = E2E.sh("getfattr -n user.note '\(w.sb.mnt)/a.txt'")
        #expect(!get.ok && get.stderr.contains("Input/output error"), "\(get)")
        #expect(!get.stdout.contains("secret-note"))
        #expect(E2E.read(w.sb.mnt + "/a.txt") == w.originals["a.txt"], "the file's content is untouched")
        #expect(w.sb.unmount().ok)
    }

    /// A PostgreSQL server is live under the mount: it flips a chunk and an inode the mount has not
    /// read yet. (A directory's store.db is attacked here only while unmounted.)
    @Test(.enabled(if: TestEngine.isPostgres, "the server edits rows under a live mount"))
    func bitFlipsUnderALiveMountAreEIO() throws {
        let w = try World("liveflip")
        defer { w.cleanup() }
        let ino = try #require(w.inodes["b.txt"])
        try #require(w.sb.mount().ok)
        let pid = E2E.daemonPid(container: w.sb.container)
        try w.edit(Self.flipOneBit + "flip('chunks', 'file = \(Self.pagedFile) AND idx = 4')")
        try w.edit(Self.flipOneBit + "flip('inodes', 'id = ?', (\(Int64(bitPattern: ino)),))")
        w.expect(w.readAll(), damaged: ["paged.bin", "b.txt"])
        if let pid { #expect(E2E.isAlive(pid), "the daemon died") }
        #expect(w.sb.unmount().ok)
    }

    /// A live PostgreSQL server puts back the older version of a chunk the mount has just rewritten
    /// (and fsynced): never read as the file's bytes.
    @Test(.enabled(if: TestEngine.isPostgres, "the server edits rows under a live mount"))
    func olderChunkPutBackUnderALiveMountIsEIO() throws {
        let w = try World("livereplay")
        defer { w.cleanup() }
        let old = try w.snapshot()
        try #require(w.sb.mount().ok)
        let pid = E2E.daemonPid(container: w.sb.container)
        let fresh = E2E.randomBytes(32768)
        let r = E2E.py(
            "import os, sys\nfd = os.open(sys.argv[1], os.O_WRONLY)\nos.pwrite(fd, bytes.fromhex(sys.argv[2]), 65536)\nos.fsync(fd)\nos.close(fd)",
            [w.sb.mnt + "/inline.bin", fresh.map { String(format: "%02x", $0) }.joined()])
        try #require(r.ok, "\(r)")
        w.originals["inline.bin"]?.replaceSubrange(65536..<98304, with: fresh)
        try w.edit(
            """
            db.execute('ATTACH DATABASE ? AS old', (sys.argv[2],))
            f = db.execute('SELECT \(Self.inlineFile)').fetchone()[0]
            v = db.execute('SELECT value FROM old.chunks WHERE file=? AND idx=2', (f,)).fetchone()[0]
            assert v != db.execute('SELECT value FROM chunks WHERE file=? AND idx=2', (f,)).fetchone()[0], 'the rewrite is not committed'
            assert db.execute('UPDATE chunks SET value=? WHERE file=? AND idx=2', (v, f)).rowcount == 1
            """, [old])
        let result = w.readAll()
        w.expect(result, damaged: ["inline.bin"])
        if let pid { #expect(E2E.isAlive(pid), "the daemon died") }
        #expect(w.sb.unmount().ok)
    }

    /// The server (or an editor of store.db) drops a whole table: the mount is refused, or the
    /// table's rows are EIO where they are asked for; every other file and name keeps working.
    @Test func droppedXattrTableFailsOnlyXattrs() throws {
        let w = try World("droptable")
        defer { w.cleanup() }
        try w.edit(
            """
            db.execute('DROP TABLE xattrs')
            try:
                db.execute('SELECT count(*) FROM xattrs'); assert False, 'the table is still there'
            except DatabaseError:
                pass
            """)
        let m = w.sb.mount()
        try #require(m.ok, "\(m)")
        let pid = E2E.daemonPid(container: w.sb.container)
        let get = E2E.sh("getfattr -n user.note '\(w.sb.mnt)/a.txt'")
        #expect(!get.ok && get.stderr.contains("Input/output error"), "\(get)")
        w.expect(w.readAll(), damaged: [])
        let listing = E2E.sh("ls -laR '\(w.sb.mnt)'")
        #expect(listing.ok, "\(listing)")
        try E2E.write(w.sb.mnt + "/new.txt", "written after the damage")
        #expect(E2E.readText(w.sb.mnt + "/new.txt") == "written after the damage")
        if let pid { #expect(E2E.isAlive(pid), "the daemon died") }
        #expect(w.sb.unmount().ok)
    }

    @Test func chunksSwappedWithinAFileAndBetweenFiles() throws {
        let w = try World("swap")
        defer { w.cleanup() }
        try w.edit(
            """
            p = db.execute('SELECT \(Self.pagedFile)').fetchone()[0]
            def value(f, i): return db.execute('SELECT value FROM chunks WHERE file=? AND idx=?', (f, i)).fetchone()[0]
            a, b = value(p, 1), value(p, 2)
            assert a != b
            assert db.execute('UPDATE chunks SET value=? WHERE file=? AND idx=?', (b, p, 1)).rowcount == 1
            assert db.execute('UPDATE chunks SET value=? WHERE file=? AND idx=?', (a, p, 2)).rowcount == 1
            """)
        w.expect(try w.mountAndRead(), damaged: ["paged.bin"])
        try w.edit(
            """
            p = db.execute('SELECT \(Self.pagedFile)').fetchone()[0]
            q = db.execute('SELECT \(Self.inlineFile)').fetchone()[0]
            x = db.execute('SELECT value FROM chunks WHERE file=? AND idx=3', (p,)).fetchone()[0]
            y = db.execute('SELECT value FROM chunks WHERE file=? AND idx=3', (q,)).fetchone()[0]
            assert x != y
            assert db.execute('UPDATE chunks SET value=? WHERE file=? AND idx=3', (y, p)).rowcount == 1
            assert db.execute('UPDATE chunks SET value=? WHERE file=? AND idx=3', (x, q)).rowcount == 1
            """)
        w.expect(try w.mountAndRead(), damaged: ["paged.bin", "inline.bin"])
    }

    /// The attack the peers all miss: an older version of a chunk, from an earlier copy of the same
    /// container, put back at its own position in its own file.
    @Test func olderVersionOfAChunkIsEIO() throws {
        let w = try World("replay")
        defer { w.cleanup() }
        let old = try w.snapshot()
        try #require(w.sb.mount().ok)
        for name in ["paged.bin", "inline.bin"] {
            // Overwrite chunk 2 in place (same size, same positions).
            let fresh = E2E.randomBytes(32768)
            let r = E2E.py(
                "import sys\nf = open(sys.argv[1], 'r+b'); f.seek(65536); f.write(bytes.fromhex(sys.argv[2])); f.close()",
                [w.sb.mnt + "/" + name, fresh.map { String(format: "%02x", $0) }.joined()])
            try #require(r.ok, "\(r)")
            w.originals[name]?.replaceSubrange(65536..<98304, with: fresh)
        }
        try #require(w.sb.unmount().ok)
        #expect(w.readAllAfterMount() == ["paged.bin": "ok", "inline.bin": "ok", "a.txt": "ok", "b.txt": "ok", "d/inner.txt": "ok"])
        for (name, chunks) in [("paged.bin", 11), ("inline.bin", 5)] {
            try w.edit(
                """
                db.execute('ATTACH DATABASE ? AS old', (sys.argv[2],))
                f = db.execute('SELECT \(Self.file(withChunks: chunks))').fetchone()[0]
                v = db.execute('SELECT value FROM old.chunks WHERE file=? AND idx=2', (f,)).fetchone()[0]
                assert v != db.execute('SELECT value FROM chunks WHERE file=? AND idx=2', (f,)).fetchone()[0]
                assert db.execute('UPDATE chunks SET value=? WHERE file=? AND idx=2', (v, f)).rowcount == 1
                """, [old])
            _ = name
        }
        w.expect(try w.mountAndRead(), damaged: ["paged.bin", "inline.bin"])
        // The whole old content of the paged file, chunks and map page consistent with each other,
        // under today's inode: the page's version is not the one the inode names.
        try w.edit(
            """
            db.execute('ATTACH DATABASE ? AS old', (sys.argv[2],))
            f = db.execute('SELECT \(Self.pagedFile)').fetchone()[0]
            assert db.execute('DELETE FROM chunks WHERE file=?', (f,)).rowcount == 11
            assert db.execute('INSERT INTO chunks SELECT * FROM old.chunks WHERE file=?', (f,)).rowcount == 11
            n = db.execute('UPDATE chunkmaps SET value=(SELECT value FROM old.chunkmaps o WHERE o.file=chunkmaps.file AND o.page=chunkmaps.page) WHERE file=?', (f,)).rowcount
            assert n == 1, n
            """, [old])
        w.expect(try w.mountAndRead(), damaged: ["paged.bin", "inline.bin"])
    }

    @Test func oldChunkPutIntoAHoleIsEIO() throws {
        let w = try World("hole")
        defer { w.cleanup() }
        let old = try w.snapshot()
        try #require(w.sb.mount().ok)
        // Punch chunks 1... out by truncating to one chunk, then grow back: a hole the user made.
        try #require(E2E.sh("truncate -s 32768 '\(w.sb.mnt)/inline.bin' && truncate -s 150000 '\(w.sb.mnt)/inline.bin'").ok)
        w.originals["inline.bin"]?.replaceSubrange(32768..., with: [UInt8](repeating: 0, count: 150_000 - 32768))
        try #require(w.sb.unmount().ok)
        #expect(w.readAllAfterMount()["inline.bin"] == "ok", "a hole the user made reads as zeros")
        try w.edit(
            """
            db.execute('ATTACH DATABASE ? AS old', (sys.argv[2],))
            f = db.execute('SELECT file FROM old.chunks GROUP BY file HAVING count(*) = 5').fetchone()[0]
            assert db.execute('INSERT INTO chunks SELECT * FROM old.chunks WHERE file=? AND idx=2', (f,)).rowcount == 1
            """, [old])
        w.expect(try w.mountAndRead(), damaged: ["inline.bin"])
    }

    @Test func fileExtendedAtAChunkBoundaryKeepsItsAuthenticSize() throws {
        let w = try World("extend")
        defer { w.cleanup() }
        let old = try w.snapshot()
        try #require(w.sb.mount().ok)
        try #require(E2E.sh("truncate -s 65536 '\(w.sb.mnt)/paged.bin'").ok)
        w.originals["paged.bin"]?.removeSubrange(65536...)
        try #require(w.sb.unmount().ok)
        // Chunks 2... of the old copy put back after the end: never read as part of the file.
        try w.edit(
            """
            db.execute('ATTACH DATABASE ? AS old', (sys.argv[2],))
            f = db.execute('SELECT file FROM old.chunks GROUP BY file HAVING count(*) = 11').fetchone()[0]
            n = db.execute('INSERT INTO chunks SELECT * FROM old.chunks WHERE file=? AND idx>=2', (f,)).rowcount
            assert n == 9, n
            """, [old])
        w.expect(try w.mountAndRead(), damaged: [])
        try #require(w.sb.mount().ok)
        #expect(E2E.statOf(w.sb.mnt + "/paged.bin")?.st_size == 65536)
        #expect(w.sb.unmount().ok)
    }

    @Test func fileCutShortAtAChunkBoundaryIsEIO() throws {
        let w = try World("cut")
        defer { w.cleanup() }
        try w.edit("assert db.execute('DELETE FROM chunks WHERE file = \(Self.inlineFile) AND idx >= 3').rowcount == 2")
        w.expect(try w.mountAndRead(), damaged: ["inline.bin"])
    }

    @Test func inodesSwappedAreEIO() throws {
        let w = try World("inoswap")
        defer { w.cleanup() }
        let a = Int64(bitPattern: try #require(w.inodes["a.txt"])), b = Int64(bitPattern: try #require(w.inodes["b.txt"]))
        try w.edit(
            """
            va = db.execute('SELECT value FROM inodes WHERE id=?', (\(a),)).fetchone()[0]
            vb = db.execute('SELECT value FROM inodes WHERE id=?', (\(b),)).fetchone()[0]
            assert va != vb
            assert db.execute('UPDATE inodes SET value=? WHERE id=?', (vb, \(a))).rowcount == 1
            assert db.execute('UPDATE inodes SET value=? WHERE id=?', (va, \(b))).rowcount == 1
            """)
        w.expect(try w.mountAndRead(), damaged: ["a.txt", "b.txt"])
    }

    @Test func entryMovedUnderAnotherDirectoryIsNotFollowed() throws {
        let w = try World("entrymove")
        defer { w.cleanup() }
        // Move one of the root's entries into d/'s group (the group with a single row).
        try w.edit(
            """
            d = db.execute('SELECT parent FROM dirents GROUP BY parent HAVING count(*) = 1').fetchone()[0]
            root = db.execute('SELECT parent FROM dirents GROUP BY parent HAVING count(*) > 1').fetchone()[0]
            tag = db.execute('SELECT tag FROM dirents WHERE parent=? LIMIT 1', (root,)).fetchone()[0]
            assert d != root
            assert db.execute('UPDATE dirents SET parent=? WHERE parent=? AND tag=?', (d, root, tag)).rowcount == 1
            """)
        let result = try w.mountAndRead()
        // The moved name is gone from the root (its row is elsewhere) and does not open in d/. If
        // the row moved was d's own, d/inner.txt is what becomes unreachable.
        let gone = result.filter { $0.value != "ok" }
        #expect(gone.count == 1, "\(result)")
        #expect(gone.values.allSatisfy { $0 == "ENOENT" || $0 == "EIO" }, "\(result)")
        #expect(!result.values.contains("WRONG"))
        if result["d/inner.txt"] == "ok" {
            try #require(w.sb.mount().ok)
            let listing = try FileManager.default.contentsOfDirectory(atPath: w.sb.mnt + "/d")
            #expect(listing == ["inner.txt"], "the moved entry must not show up in d/: \(listing)")
            #expect(w.sb.unmount().ok)
        }
    }

    @Test func entryPointingAtAnotherFilesInodeIsEIO() throws {
        let w = try World("entrypoint")
        defer { w.cleanup() }
        // Give one root entry the sealed value of another (which names another inode).
        try w.edit(
            """
            root = db.execute('SELECT parent FROM dirents GROUP BY parent HAVING count(*) > 1').fetchone()[0]
            rows = db.execute('SELECT tag, value FROM dirents WHERE parent=? LIMIT 2', (root,)).fetchall()
            assert len(rows) == 2 and rows[0][1] != rows[1][1]
            assert db.execute('UPDATE dirents SET value=? WHERE parent=? AND tag=?', (rows[1][1], root, rows[0][0])).rowcount == 1
            """)
        let result = try w.mountAndRead()
        let failed = result.filter { $0.value != "ok" }
        #expect(failed.count <= 2 && !failed.isEmpty, "\(result)")
        #expect(failed.values.allSatisfy { $0 == "EIO" || $0 == "ENOENT" }, "\(result)")
        #expect(!result.values.contains("WRONG"), "no name may open another file's content: \(result)")
    }

    @Test func storeOfAnotherContainerIsRefused() throws {
        let w = try World("foreign")
        defer { w.cleanup() }
        let other = w.isPostgres ? try TestEngine.freshURI() : w.sb.root + "/other"
        let i = w.sb.initContainer(container: other)
        try #require(i.ok, "\(i)")
        if w.isPostgres {
            // The server serves the other container's rows under our schema, our header kept (as
            // store.db is replaced beside our coffer.json).
            try w.edit(
                """
                db.execute('ATTACH DATABASE ? AS other', (sys.argv[2],))
                for t in ['meta', 'kinds', 'inodes', 'dirents', 'chunks', 'xattrs', 'orphans', 'chunkmaps']:
                    db.execute('DELETE FROM %s' % t)
                    db.execute('INSERT INTO %s SELECT * FROM other.%s' % (t, t))
                theirs = db.execute("SELECT value FROM meta WHERE name = 'container'").fetchone()
                assert theirs and theirs == db.execute("SELECT value FROM other.meta WHERE name = 'container'").fetchone()
                """, [TamperStore.schema(other)])
        } else {
            try #require(E2E.run("/bin/cp", [other + "/store.db", w.store]).ok)
        }
        let m = w.sb.mount()
        #expect(m.status == 13, "\(m)")
        #expect(m.stderr.contains("another container"), "\(m)")
        #expect(!E2E.isMounted(w.sb.mnt))
    }

    @Test func keySlotCopiedFromAnotherContainerIsRefused() throws {
        let w = try World("slotcopy")
        defer { w.cleanup() }
        let other = w.isPostgres ? try TestEngine.freshURI() : w.sb.root + "/other"
        try #require(w.sb.initContainer(container: other).ok)
        // The attacker knows the other container's password (the same pass file here) and puts its
        // slot into ours: the slot is bound to its own container id, and the header MAC to our key.
        if w.isPostgres {
            try w.edit(
                """
                db.execute('ATTACH DATABASE ? AS other', (sys.argv[2],))
                mine = json.loads(db.execute('SELECT value FROM header').fetchone()[0])
                theirs = json.loads(db.execute('SELECT value FROM other.header').fetchone()[0])
                assert mine['slots'] != theirs['slots']
                mine['slots'] = theirs['slots'] + mine['slots'][1:]
                assert db.execute('UPDATE header SET value = ?', (json.dumps(mine, indent=2).encode(),)).rowcount == 1
                """, [TamperStore.schema(other)])
        } else {
            try w.edit(
                """
                mine = json.load(open(sys.argv[2])); theirs = json.load(open(sys.argv[3]))
                mine['slots'] = theirs['slots'] + mine['slots'][1:]
                json.dump(mine, open(sys.argv[2], 'w'), indent=2)
                """, [w.sb.container + "/coffer.json", other + "/coffer.json"])
        }
        let m = w.sb.mount()
        #expect(m.status == 11 || m.status == 12, "\(m)")
        #expect(!E2E.isMounted(w.sb.mnt))
    }
}

extension IntegrityTests {
    struct Errno: Error { let code: Int32 }

    /// The whole file, or the errno of the first failing call.
    static func readFile(_ path: String) -> Result<[UInt8], Errno> {
        let fd = open(path, O_RDONLY)
        guard fd >= 0 else { return .failure(Errno(code: errno)) }
        defer { close(fd) }
        var out: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 1 << 16)
        while true {
            let n = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
            if n < 0 { return .failure(Errno(code: errno)) }
            if n == 0 { return .success(out) }
            out += buffer[0..<n]
        }
    }
}

extension IntegrityTests.World {
    /// Mount, read everything, unmount (for checks between attacks).
    func readAllAfterMount() -> [String: String] {
        guard sb.mount().ok else { return ["mount": "failed"] }
        defer { sb.unmount() }
        return readAll()
    }
}
