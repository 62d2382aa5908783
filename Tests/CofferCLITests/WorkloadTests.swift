import CofferTestSupport
import Foundation
import Testing

#if canImport(Glibc)
    import Glibc
#endif

// Issue 3: workloads through a real mount that the POSIX tests do not cover: a directory of 100,000
// files, concurrent writers and readers in separate processes (also on one file), git clones inside the
// mount and into it, editor-style saves (temporary file + fsync + rename over a file a reader still has
// open) and moves of trees, and a scan of the container for anything written through the mount in clear.

@Suite("Workloads through a mount", .enabled(if: E2E.fuseAvailable, "/dev/fuse is not usable"))
struct WorkloadTests {
    static func trimmed(_ r: RunResult) -> String { r.stdout.trimmingCharacters(in: .whitespacesAndNewlines) }

    // MARK: 100,000 files

    @Test func hundredThousandFilesInOneDirectory() throws {
        guard E2E.python != nil else {
            Issue.record("python3 missing (make test-deps installs it)")
            return
        }
        let sb = try Sandbox("100k")
        defer { sb.cleanup() }
        try sb.initAndMount()
        let dir = sb.mnt + "/big"
        let count = 100_000
        let started = Date()
        // Empty files (mknod: one request each), every 1000th created with open and given 12 bytes naming it.
        let made = E2E.py(
            """
            import os, sys, stat
            d, n = sys.argv[1], int(sys.argv[2])
            os.mkdir(d)
            for i in range(n):
                p = '%s/file-%06d' % (d, i)
                if i % 1000 == 0:
                    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                    os.write(fd, b'file %06d\\n' % i)
                    os.close(fd)
                else:
                    os.mknod(p, 0o644 | stat.S_IFREG)
            """, [dir, String(count)], timeout: 400)
        try #require(made.ok, "\(made)")
        let created = Date()
        func listAndStat(_ when: String) {
            // ls -l stats every entry; the first line is "total N".
            let ls = E2E.sh("ls -l '\(dir)' | tail -n +2 | wc -l", timeout: 300)
            #expect(Self.trimmed(ls) == "\(count)", "\(when): ls -l: \(ls)")
            let dup = E2E.sh("ls -f '\(dir)' | sort | uniq -d | wc -l", timeout: 300)
            #expect(Self.trimmed(dup) == "0", "\(when): readdir gave duplicates: \(dup)")
            // find -printf %s stats every file: count of each size.
            let sizes = E2E.sh("find '\(dir)' -type f -printf '%s\\n' | sort -n | uniq -c | awk '{print $1\"x\"$2}' | tr '\\n' ' '", timeout: 300)
            #expect(Self.trimmed(sizes) == "99900x0 100x12", "\(when): sizes: \(sizes)")
            #expect(E2E.readText(dir + "/file-042000") == "file 042000\n", "\(when)")
            #expect(E2E.statOf(dir + "/file-099999") != nil && E2E.statOf(dir + "/file-100000") == nil, "\(when)")
        }
        listAndStat("mounted")
        let listed = Date()
        try sb.remount()
        listAndStat("after remount")
        print(
            "WorkloadTests: 100k files: created in \(Int(created.timeIntervalSince(started))) s, listed and stated in \(Int(listed.timeIntervalSince(created))) s, total \(Int(Date().timeIntervalSince(started))) s"
        )
    }

    // MARK: concurrent processes

    static let concurrentProgram = #"""
        import os, sys, random, time
        mode, dirp, i = sys.argv[1], sys.argv[2], int(sys.argv[3])
        SIZE = 1_500_000            # each writer's own file
        BLOCK = 10_000              # the shared file's blocks: not chunk-aligned, so both writers touch the same chunks
        NBLOCKS = 160

        def own(k):
            return random.Random('own-%d' % k).randbytes(SIZE)

        def shared():
            out = bytearray()
            for b in range(NBLOCKS):
                out += random.Random('shared-%d' % b).randbytes(BLOCK)
            return bytes(out)

        def fail(msg):
            sys.stderr.write('%s %d: %s\n' % (mode, i, msg)); sys.exit(1)

        def readall(p):
            with open(p, 'rb') as f: return f.read()

        if mode == 'writer':
            data = own(i)
            other = (i + 1) % 8
            want = own(other)
            rnd = random.Random(i)
            fd = os.open('%s/own-%d' % (dirp, i), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            pos, reads = 0, 0
            while pos < SIZE:
                n = min(rnd.choice([100, 4096, 32768, 50000, 131072]), SIZE - pos)
                os.write(fd, data[pos:pos + n]); pos += n
                if rnd.random() < 0.05: os.fsync(fd)
                if rnd.random() < 0.3:
                    # Whatever of the other writer's file is there already is a prefix of what it writes.
                    try: got = readall('%s/own-%d' % (dirp, other))
                    except FileNotFoundError: got = b''
                    if want[:len(got)] != got: fail('file %d read while written is not a prefix (%d bytes)' % (other, len(got)))
                    reads += 1
            os.close(fd)
            def size_of(k):
                try: return os.path.getsize('%s/own-%d' % (dirp, k))
                except FileNotFoundError: return -1
            deadline = time.time() + 200
            while size_of(other) < SIZE:
                if time.time() > deadline: fail('file %d never complete' % other)
                time.sleep(0.05)
            if readall('%s/own-%d' % (dirp, other)) != want: fail('file %d differs once complete' % other)
            print('writer %d ok, %d reads meanwhile' % (i, reads))
        elif mode == 'shared':
            # Writer i writes the blocks b with b % 2 == i, in a shuffled order, through its own descriptor.
            data = shared()
            fd = os.open('%s/shared' % dirp, os.O_WRONLY | os.O_CREAT, 0o644)
            blocks = [b for b in range(NBLOCKS) if b % 2 == i]
            random.Random(100 + i).shuffle(blocks)
            for b in blocks:
                os.pwrite(fd, data[b * BLOCK:(b + 1) * BLOCK], b * BLOCK)
            os.fsync(fd)
            os.close(fd)
            print('shared %d ok' % i)
        elif mode == 'check':
            for k in range(8):
                if readall('%s/own-%d' % (dirp, k)) != own(k): fail('own-%d differs' % k)
            got, want = readall('%s/shared' % dirp), shared()
            if got != want:
                bad = next((o for o in range(min(len(got), len(want))) if got[o] != want[o]), min(len(got), len(want)))
                fail('shared differs: %d bytes, want %d, first difference at %d (block %d)' % (len(got), len(want), bad, bad // BLOCK))
            print('check ok')
        """#

    @Test func eightProcessesWritingAndReadingConcurrently() throws {
        guard let python = E2E.python else {
            Issue.record("python3 missing (make test-deps installs it)")
            return
        }
        let sb = try Sandbox("concurrent")
        defer { sb.cleanup() }
        try sb.initAndMount()
        let dir = sb.mnt + "/work"
        try #require(mkdir(dir, 0o755) == 0)
        let prog = sb.root + "/concurrent.py"
        try E2E.write(prog, Self.concurrentProgram)
        // Ten background processes (8 writers/readers, 2 on one file), each one's status collected.
        var script = "cd '\(sb.root)'\n"
        for i in 0..<8 { script += "'\(python)' '\(prog)' writer '\(dir)' \(i) > out-w\(i) 2>&1 & p\(i)=$!\n" }
        for i in 0..<2 { script += "'\(python)' '\(prog)' shared '\(dir)' \(i) > out-s\(i) 2>&1 & q\(i)=$!\n" }
        script += "rc=0\n"
        for i in 0..<8 { script += "wait $p\(i) || { rc=1; echo \"writer \(i) failed: $(cat out-w\(i))\"; }\n" }
        for i in 0..<2 { script += "wait $q\(i) || { rc=1; echo \"shared \(i) failed: $(cat out-s\(i))\"; }\n" }
        script += "cat out-w* out-s*\nexit $rc\n"
        let r = E2E.sh(script, timeout: 400)
        #expect(r.ok, "\(r)")
        #expect(r.stdout.components(separatedBy: " ok").count - 1 == 10, "\(r)")
        let check = E2E.run(python, [prog, "check", dir, "0"], timeout: 120)
        #expect(check.ok && check.stdout == "check ok\n", "\(check)")
        try sb.remount()
        let again = E2E.run(python, [prog, "check", dir, "0"], timeout: 120)
        #expect(again.ok && again.stdout == "check ok\n", "after remount: \(again)")
    }

    // MARK: git

    @Test func gitCloneIntoAndInsideTheMount() throws {
        guard let git = E2E.which("git") else {
            Issue.record("git is not installed (make test-deps installs it)")
            return
        }
        let sb = try Sandbox("gitclone")
        defer { sb.cleanup() }
        try sb.initAndMount()
        let env = [
            "HOME": sb.root, "PATH": "/usr/bin:/bin", "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_AUTHOR_NAME": "T", "GIT_AUTHOR_EMAIL": "t@example.org", "GIT_COMMITTER_NAME": "T", "GIT_COMMITTER_EMAIL": "t@example.org"
        ]
        func g(_ dir: String, _ args: [String]) -> RunResult { E2E.run(git, ["-C", dir] + args, environment: env, timeout: 180) }

        // A source repository outside the mount: a few commits, a subdirectory, a binary file, a symlink.
        let src = sb.root + "/src"
        #expect(E2E.run(git, ["init", "-q", src], environment: env).ok)
        try FileManager.default.createDirectory(atPath: src + "/lib/deep", withIntermediateDirectories: true)
        var rng = SplitMix64(seed: 3)
        for round in 0..<4 {
            try E2E.write(src + "/README", "round \(round)\n")
            try E2E.write(src + "/lib/code-\(round).c", String(repeating: "int f\(round)(void) { return \(round); }\n", count: 200))
            try E2E.write(src + "/lib/deep/blob.bin", rng.bytes(150_000 + round * 10_000))
            if round == 1 { symlink("lib/code-1.c", src + "/link") }
            #expect(g(src, ["add", "-A"]).ok)
            let c = g(src, ["commit", "-q", "-m", "round \(round)"])
            #expect(c.ok, "\(c)")
        }
        let head = Self.trimmed(g(src, ["rev-parse", "HEAD"]))

        let fromOutside = sb.mnt + "/from-outside"  // outside -> mount (objects copied)
        let localClone = sb.mnt + "/local-clone"  // mount -> mount, local: objects hard-linked
        let packClone = sb.mnt + "/sub/pack-clone"  // mount -> mount through the pack protocol
        let c1 = E2E.run(git, ["clone", "-q", src, fromOutside], environment: env, timeout: 180)
        try #require(c1.ok, "\(c1)")
        let c2 = E2E.run(git, ["clone", "-q", fromOutside, localClone], environment: env, timeout: 180)
        try #require(c2.ok, "\(c2)")
        try FileManager.default.createDirectory(atPath: sb.mnt + "/sub", withIntermediateDirectories: false)
        let c3 = E2E.run(git, ["clone", "-q", "--no-local", "file://" + localClone, packClone], environment: env, timeout: 180)
        try #require(c3.ok, "\(c3)")
        // A commit and a gc (repack, prune: renames and unlinks) in one of them.
        try E2E.write(localClone + "/lib/new.txt", "new\n")
        #expect(g(localClone, ["add", "-A"]).ok)
        #expect(g(localClone, ["commit", "-q", "-m", "in the mount"]).ok)
        let gc = g(localClone, ["gc", "-q", "--prune=now"])
        #expect(gc.ok, "\(gc)")

        func verify(_ when: String) {
            for (repo, commits) in [(fromOutside, 4), (localClone, 5), (packClone, 4)] {
                let fsck = g(repo, ["fsck", "--strict", "--full"])
                #expect(fsck.ok, "\(when): fsck \(repo): \(fsck)")
                let status = g(repo, ["status", "--porcelain"])
                #expect(status.ok && status.stdout.isEmpty, "\(when): status \(repo): \(status)")
                let count = g(repo, ["rev-list", "--count", "HEAD"])
                #expect(Self.trimmed(count) == "\(commits)", "\(when): \(repo): \(count)")
                #expect(E2E.read(repo + "/lib/deep/blob.bin") == E2E.read(src + "/lib/deep/blob.bin"), "\(when): \(repo): blob differs")
                #expect((try? FileManager.default.destinationOfSymbolicLink(atPath: repo + "/link")) == "lib/code-1.c", "\(when): \(repo): link")
            }
            #expect(Self.trimmed(g(packClone, ["rev-parse", "HEAD"])) == head, "\(when)")
            let diff = E2E.run("/usr/bin/diff", ["-r", "--exclude=.git", src, fromOutside])
            #expect(diff.ok, "\(when): \(diff)")
        }
        verify("mounted")
        try sb.remount()
        verify("after remount")
        // And a clone back out of the mount is the same history.
        let back = sb.root + "/back"
        let c4 = E2E.run(git, ["clone", "-q", localClone, back], environment: env, timeout: 180)
        #expect(c4.ok, "\(c4)")
        #expect(Self.trimmed(g(back, ["rev-parse", "HEAD"])) == Self.trimmed(g(localClone, ["rev-parse", "HEAD"])))
        #expect(g(back, ["fsck", "--strict"]).ok)
    }

    // MARK: editor saves, moves

    @Test func editorStyleSavesWhileAReaderHoldsTheOldFile() throws {
        guard E2E.python != nil else {
            Issue.record("python3 missing (make test-deps installs it)")
            return
        }
        let sb = try Sandbox("editor")
        defer { sb.cleanup() }
        try sb.initAndMount()
        let r = E2E.py(
            """
            import os, sys, random
            d = sys.argv[1]
            os.mkdir(d + '/docs')
            p = d + '/docs/report.txt'
            old = random.Random(1).randbytes(200_000)
            new1 = random.Random(2).randbytes(150_001)
            new2 = random.Random(3).randbytes(70_000)
            with open(p, 'wb') as f: f.write(old)
            os.chmod(p, 0o640)
            # A reader opens the original and reads part of it.
            rd = os.open(p, os.O_RDONLY)
            first = os.read(rd, 50_000)
            # gedit/kate style: write a temporary file, fsync, rename over the original.
            tmp = d + '/docs/.report.txt.tmp'
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o640)
            os.write(fd, new1); os.fsync(fd); os.close(fd)
            os.rename(tmp, p)
            dfd = os.open(d + '/docs', os.O_RDONLY | os.O_DIRECTORY); os.fsync(dfd); os.close(dfd)
            # The reader still reads the old content, to the end and again from the start.
            rest = b''
            while True:
                c = os.read(rd, 65536)
                if not c: break
                rest += c
            print('reader', first + rest == old, os.pread(rd, 100, 0) == old[:100], os.fstat(rd).st_nlink)
            print('path', open(p, 'rb').read() == new1, oct(os.stat(p).st_mode & 0o777))
            # vim style (backupcopy=no): rename the original to a backup, write the new file, fsync, drop the backup.
            rd2 = os.open(p, os.O_RDONLY)
            os.rename(p, p + '~')
            fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o640)
            os.write(fd, new2); os.fsync(fd); os.close(fd)
            os.unlink(p + '~')
            print('reader2', os.pread(rd2, 200_000, 0) == new1)
            os.close(rd); os.close(rd2)
            print('files', sorted(os.listdir(d + '/docs')))
            """, [sb.mnt])
        let lines = r.stdout.split(separator: "\n").map(String.init)
        #expect(r.ok, "\(r)")
        #expect(lines.contains("reader True True 0"), "\(r)")
        #expect(lines.contains("path True 0o640"), "\(r)")
        #expect(lines.contains("reader2 True"), "\(r)")
        #expect(lines.contains("files ['report.txt']"), "\(r)")
        try sb.remount()
        let after = E2E.py(
            """
            import os, sys, random
            d = sys.argv[1] + '/docs'
            print(sorted(os.listdir(d)), open(d + '/report.txt', 'rb').read() == random.Random(3).randbytes(70_000), oct(os.stat(d + '/report.txt').st_mode & 0o777))
            """, [sb.mnt])
        #expect(after.stdout == "['report.txt'] True 0o640\n", "after remount: \(after)")
    }

    @Test func mvOfFilesAndTreesAcrossDirectories() throws {
        let sb = try Sandbox("mv")
        defer { sb.cleanup() }
        try sb.initAndMount()
        let m = sb.mnt
        // A tree made outside, copied in, then moved around inside the mount with mv.
        let src = sb.root + "/src"
        try makeTree(src)
        #expect(E2E.run("/bin/cp", ["-a", src, m + "/tree"]).ok)
        let fm = FileManager.default
        try fm.createDirectory(atPath: m + "/one/two", withIntermediateDirectories: true)
        try fm.createDirectory(atPath: m + "/elsewhere", withIntermediateDirectories: true)
        for i in 0..<20 { try E2E.write(m + "/one/file-\(i)", "file \(i)\n" + String(repeating: "x", count: i * 3000)) }
        let files = (0..<20).map { m + "/one/file-\($0)" }
        let mvFiles = E2E.run("/bin/mv", files + [m + "/one/two/"])
        #expect(mvFiles.ok, "\(mvFiles)")
        let mvTree = E2E.run("/bin/mv", [m + "/tree", m + "/one/two/moved-tree"])
        #expect(mvTree.ok, "\(mvTree)")
        let mvUp = E2E.run("/bin/mv", [m + "/one/two", m + "/elsewhere/"])
        #expect(mvUp.ok, "\(mvUp)")
        // A file moved over an existing one, and a tree moved in from outside (a copy and a delete).
        try E2E.write(m + "/elsewhere/victim", "old")
        #expect(E2E.run("/bin/mv", ["-f", m + "/elsewhere/two/file-3", m + "/elsewhere/victim"]).ok)
        let outside = sb.root + "/outside"
        try makeTree(outside)
        let mvIn = E2E.run("/bin/mv", [outside, m + "/one/from-outside"])
        #expect(mvIn.ok, "\(mvIn)")
        #expect(!fm.fileExists(atPath: outside))

        func check(_ when: String) {
            #expect((try? fm.contentsOfDirectory(atPath: m).sorted()) == ["elsewhere", "one"], "\(when)")
            #expect((try? fm.contentsOfDirectory(atPath: m + "/one").sorted()) == ["from-outside"], "\(when)")
            let two = (try? fm.contentsOfDirectory(atPath: m + "/elsewhere/two")) ?? []
            #expect(Set(two) == Set((0..<20).filter { $0 != 3 }.map { "file-\($0)" } + ["moved-tree"]), "\(when): \(two.sorted())")
            for i in 0..<20 where i != 3 {
                #expect(E2E.readText(m + "/elsewhere/two/file-\(i)") == "file \(i)\n" + String(repeating: "x", count: i * 3000), "\(when): file-\(i)")
            }
            #expect(E2E.readText(m + "/elsewhere/victim") == "file 3\n" + String(repeating: "x", count: 9000), "\(when)")
            let d1 = E2E.run("/usr/bin/diff", ["-r", "--no-dereference", src, m + "/elsewhere/two/moved-tree"])
            #expect(d1.ok, "\(when): \(d1)")
            // The moved-in tree has the same content as the one made the same way (random parts aside).
            let listing = E2E.sh("cd '\(m)/one/from-outside' && find . | sort | tr '\\n' ' '")
            let expectedListing = E2E.sh("cd '\(src)' && find . | sort | tr '\\n' ' '")
            #expect(listing.stdout == expectedListing.stdout, "\(when): \(listing)")
            #expect(E2E.statOf(m + "/elsewhere/two/moved-tree/a/b/c")?.st_nlink == 2, "\(when)")
            #expect(E2E.statOf(m + "/elsewhere")?.st_nlink == 3, "\(when): nlink of elsewhere")
        }
        check("mounted")
        try sb.remount()
        check("after remount")
    }

    // MARK: space of deleted files

    /// `rm` of a large file gives its space back to the disk while the mount stays up (its chunks are
    /// punched out of the segment files, a margin of free pages stays in the store), and the files written
    /// after it read back unchanged. The embedded engine only: a PostgreSQL server gives space back by
    /// itself (autovacuum).
    @Test(.enabled(if: !TestEngine.isPostgres, "store.db shrinking is the SQLite engine's"))
    func deletingAFileGivesItsSpaceBackToTheDisk() throws {
        let sb = try Sandbox("shrink")
        defer { sb.cleanup() }
        try sb.initAndMount()
        let store = sb.container + "/store.db"
        // The store file, its WAL, and the space its segment files take (large chunks live there).
        func storeSize() -> Int {
            let segments = sb.container + "/segments"
            let inSegments = ((try? FileManager.default.contentsOfDirectory(atPath: segments)) ?? []).reduce(0) {
                $0 + Int(E2E.statOf(segments + "/" + $1)?.st_blocks ?? 0) * 512
            }
            return Int(E2E.statOf(store)?.st_size ?? -1) + Int(E2E.statOf(store + "-wal")?.st_size ?? 0) + inSegments
        }
        let dd = E2E.sh("head -c 50331648 /dev/urandom > '\(sb.mnt)/big.bin' && sync '\(sb.mnt)/big.bin'")
        try #require(dd.ok, "\(dd)")
        var small: [String: [UInt8]] = [:]
        for i in 0..<40 {
            small["s\(i).bin"] = E2E.randomBytes(20_000 + i * 997)
            try E2E.write(sb.mnt + "/s\(i).bin", small["s\(i).bin"]!)
        }
        #expect(E2E.run("/bin/sync", []).ok)
        #expect(E2E.wait(30) { storeSize() >= 48 << 20 }, "the store is \(storeSize()) bytes after writing 48 MiB")
        #expect(E2E.run("/bin/rm", [sb.mnt + "/big.bin"]).ok)
        #expect(E2E.wait(30) { storeSize() < 20 << 20 }, "the store is still \(storeSize()) bytes 30 s after rm of 48 MiB")
        #expect(E2E.snapshot(sb.mnt) == small, "files written after the deleted one differ")
        try sb.remount()
        #expect(E2E.snapshot(sb.mnt) == small, "files written after the deleted one differ after a remount")
        #expect(storeSize() < 20 << 20)
        #expect(sb.unmount().ok)
    }

    // MARK: nothing in clear

    static func encodings(_ marker: String) -> [(String, [UInt8])] {
        var le: [UInt8] = [], be: [UInt8] = []
        for u in marker.utf16 {
            le += [UInt8(u & 0xFF), UInt8(u >> 8)]
            be += [UInt8(u >> 8), UInt8(u & 0xFF)]
        }
        return [("UTF-8", Array(marker.utf8)), ("UTF-16LE", le), ("UTF-16BE", be)]
    }

    /// glibc's memmem (a GNU extension the Glibc module does not show).
    typealias MemmemFunction = @convention(c) (UnsafeRawPointer?, Int, UnsafeRawPointer?, Int) -> UnsafeMutableRawPointer?
    static let memmem: MemmemFunction = unsafeBitCast(dlsym(nil, "memmem")!, to: MemmemFunction.self)

    /// Whether `needle` occurs in `haystack` (memmem).
    static func find(_ needle: [UInt8], in haystack: [UInt8]) -> Bool {
        haystack.withUnsafeBytes { h in
            needle.withUnsafeBytes { n in
                Self.memmem(h.baseAddress, h.count, n.baseAddress, n.count) != nil
            }
        }
    }

    @Test func nothingWrittenThroughTheMountIsInClearInTheContainer() throws {
        let sb = try Sandbox("clear")
        defer { sb.cleanup() }
        try sb.initAndMount()
        let m = sb.mnt
        let id = UUID().uuidString.prefix(8)
        let markers = [
            "FileNameMarker\(id)", "DirNameMarker\(id)", "LinkTargetMarker\(id)", "LinkNameMarker\(id)",
            "XattrNameMarker\(id)", "XattrValueMarker\(id)", "SmallContentMarker\(id)", "LargeContentMarker\(id)",
            "RenamedAwayMarker\(id)", "DeletedFileMarker\(id)"
        ]
        let dir = m + "/" + markers[1]
        try #require(mkdir(dir, 0o755) == 0)
        let file = dir + "/" + markers[0] + ".txt"
        try E2E.write(file, markers[6] + "\n")
        // A large file: the marker everywhere, also across every chunk boundary.
        var large = Array(String(repeating: markers[7] + " ", count: 150_000).utf8)  // about 4 MB
        large += E2E.randomBytes(100_000)
        try E2E.write(dir + "/large.bin", large)
        #expect(symlink("../" + markers[2], dir + "/" + markers[3]) == 0)
        #expect(symlink("/etc/" + markers[2], dir + "/abs-link") == 0)
        #expect(symlink(m + "/" + markers[2], dir + "/inside-link") == 0)
        let x = E2E.run("/usr/bin/setfattr", ["-n", "user." + markers[4], "-v", markers[5], file])
        #expect(x.ok, "\(x)")
        try E2E.write(m + "/" + markers[8], "renamed " + markers[8])
        #expect(rename(m + "/" + markers[8], m + "/plain-name") == 0)
        try E2E.write(m + "/" + markers[9], markers[9])
        #expect(unlink(m + "/" + markers[9]) == 0)
        let u = sb.unmount()
        try #require(u.ok, "\(u)")

        var scanned = 0, bytes = 0
        var found: [String] = []
        // A PostgreSQL container: every file the server keeps (tables, TOAST, WAL) after a checkpoint.
        var scanRoot = sb.container
        if !sb.isDirectoryContainer {
            let cluster = try TestEngine.cluster()
            try cluster.psql("CHECKPOINT")
            scanRoot = cluster.dataDirectory
        }
        let e = FileManager.default.enumerator(atPath: scanRoot)
        while let rel = e?.nextObject() as? String {
            let path = scanRoot + "/" + rel
            guard let st = E2E.lstatOf(path), (st.st_mode & S_IFMT) == S_IFREG, let content = E2E.read(path) else { continue }
            scanned += 1
            bytes += content.count
            for marker in markers {
                for (encoding, needle) in Self.encodings(marker) where Self.find(needle, in: content) {
                    found.append("\(marker) as \(encoding) in \(rel)")
                }
            }
            // Names in the container's directory too.
            for marker in markers where rel.contains(marker) { found.append("\(marker) in the container's file name \(rel)") }
        }
        #expect(found.isEmpty, "in clear in the container: \(found)")
        #expect(scanned > 0 && bytes > large.count, "scanned \(scanned) files, \(bytes) bytes")
        // The scan does find a marker where there is one.
        #expect(Self.find(Self.encodings(markers[7])[1].1, in: Self.encodings("xx" + markers[7] + "yy")[1].1))

        // And everything is there through a new mount.
        let mount = sb.mount()
        try #require(mount.ok, "\(mount)")
        #expect(E2E.readText(file) == markers[6] + "\n")
        #expect(E2E.read(dir + "/large.bin") == large)
        #expect((try? FileManager.default.destinationOfSymbolicLink(atPath: dir + "/" + markers[3])) == "../" + markers[2])
        #expect(E2E.run("/usr/bin/getfattr", ["--only-values", "-n", "user." + markers[4], file]).stdout == markers[5])
        #expect(E2E.readText(m + "/plain-name") == "renamed " + markers[8])
    }
}
