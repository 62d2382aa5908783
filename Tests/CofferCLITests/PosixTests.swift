import Foundation
import Testing

#if canImport(Glibc)
    import Glibc
#endif

// The POSIX surface through a real mount, with ordinary tools and syscalls.

/// Makes a small tree with files, nested directories, an empty file, modes, a symlink and odd names.
func makeTree(_ dir: String) throws {
    let fm = FileManager.default
    try fm.createDirectory(atPath: dir + "/a/b/c", withIntermediateDirectories: true)
    try fm.createDirectory(atPath: dir + "/empty-dir", withIntermediateDirectories: true)
    try E2E.write(dir + "/top.txt", "top level\n")
    try E2E.write(dir + "/a/one.bin", E2E.randomBytes(70_000))
    try E2E.write(dir + "/a/b/two.bin", E2E.randomBytes(200_001))
    try E2E.write(dir + "/a/b/c/three.txt", "deep\n")
    try E2E.write(dir + "/a/empty", [UInt8]())
    try E2E.write(dir + "/name with spaces & ünïcødé.txt", "odd name\n")
    chmod(dir + "/a/one.bin", 0o600)
    chmod(dir + "/a/b/c/three.txt", 0o751)
    symlink("b/c/three.txt", dir + "/a/rel-link")
    _ = E2E.sh("touch -h -d '2010-01-02 03:04:05' '\(dir)/a/one.bin' '\(dir)/top.txt'")
}

@Suite("POSIX surface through a mount", .enabled(if: E2E.fuseAvailable, "/dev/fuse is not usable"))
struct PosixTests {
    @Test func cpArchiveAndDiff() throws {
        let sb = try Sandbox("cpa")
        defer { sb.cleanup() }
        try sb.initAndMount()
        let src = sb.root + "/src"
        try makeTree(src)
        let cp = E2E.run("/bin/cp", ["-a", src, sb.mnt + "/dst"])
        #expect(cp.ok, "\(cp)")
        let diff = E2E.run("/usr/bin/diff", ["-r", "--no-dereference", src, sb.mnt + "/dst"])
        #expect(diff.ok, "\(diff)")
        // cp -a keeps modes and mtimes.
        let s = E2E.statOf(src + "/a/one.bin"), d = E2E.statOf(sb.mnt + "/dst/a/one.bin")
        #expect(s?.st_mode == d?.st_mode)
        #expect(s?.st_mtim.tv_sec == d?.st_mtim.tv_sec)
        #expect((try? FileManager.default.destinationOfSymbolicLink(atPath: sb.mnt + "/dst/a/rel-link")) == "b/c/three.txt")
        try sb.remount()
        let again = E2E.run("/usr/bin/diff", ["-r", "--no-dereference", src, sb.mnt + "/dst"])
        #expect(again.ok, "after remount: \(again)")
    }

    @Test func rsyncKeepsHardLinksAndXattrs() throws {
        guard let rsync = E2E.which("rsync") else {
            Issue.record("rsync is not installed (make test-deps installs it)")
            return
        }
        let sb = try Sandbox("rsync")
        defer { sb.cleanup() }
        try sb.initAndMount()
        let src = sb.root + "/src"
        try makeTree(src)
        try E2E.write(src + "/linked", "shared content\n")
        #expect(link(src + "/linked", src + "/a/also-linked") == 0)
        let x = E2E.sh("setfattr -n user.tag -v rsync-value '\(src)/top.txt'")
        try #require(x.ok, "\(x)")
        let r = E2E.run(rsync, ["-aHX", src + "/", sb.mnt + "/copy/"])
        #expect(r.ok, "\(r)")
        let a = E2E.statOf(sb.mnt + "/copy/linked"), b = E2E.statOf(sb.mnt + "/copy/a/also-linked")
        #expect(a != nil && a?.st_ino == b?.st_ino, "hard link not preserved")
        #expect(a?.st_nlink == 2)
        let g = E2E.sh("getfattr --only-values -n user.tag '\(sb.mnt)/copy/top.txt'")
        #expect(g.stdout == "rsync-value", "\(g)")
        let diff = E2E.run("/usr/bin/diff", ["-r", "--no-dereference", src, sb.mnt + "/copy"])
        #expect(diff.ok, "\(diff)")
        // A second run finds nothing to transfer.
        let again = E2E.run(rsync, ["-aHXi", src + "/", sb.mnt + "/copy/"])
        #expect(again.ok && again.stdout.trimmingCharacters(in: .whitespacesAndNewlines).isEmpty, "second rsync transferred: \(again)")
    }

    @Test func tarRoundTrip() throws {
        let sb = try Sandbox("tar")
        defer { sb.cleanup() }
        try sb.initAndMount()
        let src = sb.root + "/src"
        try makeTree(src)
        let c = E2E.run("/bin/tar", ["cf", sb.mnt + "/t.tar", "-C", src, "."])
        #expect(c.ok, "\(c)")
        try FileManager.default.createDirectory(atPath: sb.mnt + "/x", withIntermediateDirectories: false)
        let x = E2E.run("/bin/tar", ["xf", sb.mnt + "/t.tar", "-C", sb.mnt + "/x"])
        #expect(x.ok, "\(x)")
        let diff = E2E.run("/usr/bin/diff", ["-r", "--no-dereference", src, sb.mnt + "/x"])
        #expect(diff.ok, "\(diff)")
        // And back out of the mount onto the plain disk.
        let out = sb.root + "/out"
        try FileManager.default.createDirectory(atPath: out, withIntermediateDirectories: false)
        let x2 = E2E.run("/bin/tar", ["xf", sb.mnt + "/t.tar", "-C", out])
        #expect(x2.ok, "\(x2)")
        #expect(E2E.run("/usr/bin/diff", ["-r", "--no-dereference", src, out]).ok)
    }

    @Test func sparseFile() throws {
        let sb = try Sandbox("sparse")
        defer { sb.cleanup() }
        try sb.initAndMount()
        let f = sb.mnt + "/sparse"
        let t = E2E.run("/usr/bin/truncate", ["-s", "5G", f])
        try #require(t.ok, "\(t)")
        let w = E2E.sh("printf THE-END | dd of='\(f)' bs=1 seek=$((5*1024*1024*1024 - 7)) conv=notrunc status=none")
        #expect(w.ok, "\(w)")
        let st = try #require(E2E.statOf(f))
        #expect(st.st_size == 5 << 30)
        #expect(Int(st.st_blocks) * 512 < 16 << 20, "a 5 GiB sparse file uses \(st.st_blocks) blocks")
        let du = E2E.run("/usr/bin/du", ["-k", f])
        let kib = Int(du.stdout.split(separator: "\t").first ?? "") ?? -1
        #expect(kib >= 0 && kib < 16 * 1024, "du says \(du.stdout)")
        let head = E2E.sh("head -c 1048576 '\(f)' | tr -d '\\000' | wc -c")
        #expect(head.stdout.trimmingCharacters(in: .whitespacesAndNewlines) == "0", "the start of a sparse file is not zeros: \(head)")
        let tail = E2E.sh("tail -c 7 '\(f)'")
        #expect(tail.stdout == "THE-END", "\(tail)")
        let mid = E2E.sh("dd if='\(f)' bs=65536 skip=40000 count=4 status=none | tr -d '\\000' | wc -c")
        #expect(mid.stdout.trimmingCharacters(in: .whitespacesAndNewlines) == "0", "\(mid)")
    }

    @Test func writeAndReadBeyond4GiB() throws {
        guard E2E.python != nil else {
            Issue.record("python3 missing (make test-deps installs it)")
            return
        }
        let sb = try Sandbox("big")
        defer { sb.cleanup() }
        try sb.initAndMount()
        let data = sb.root + "/chunk"
        try E2E.write(data, E2E.randomBytes(200_003))
        let prog = """
            import os, sys
            data = open(sys.argv[1], 'rb').read()
            off = (4 << 30) + 12345
            fd = os.open(sys.argv[2], os.O_RDWR | os.O_CREAT, 0o644)
            if sys.argv[3] == 'write':
                assert os.pwrite(fd, data, off) == len(data)
                os.fsync(fd)
            st = os.fstat(fd)
            assert st.st_size == off + len(data), st.st_size
            back = os.pread(fd, len(data), off)
            assert back == data, 'read back differs'
            assert os.pread(fd, 4096, 1 << 32) == bytes(4096), 'bytes before the write are not zeros'
            assert os.pread(fd, 100, off + len(data)) == b'', 'read past EOF returned data'
            os.close(fd)
            print('ok')
            """
        let w = E2E.py(prog, [data, sb.mnt + "/huge", "write"])
        #expect(w.ok && w.stdout == "ok\n", "\(w)")
        try sb.remount()
        let r = E2E.py(prog, [data, sb.mnt + "/huge", "read"])
        #expect(r.ok && r.stdout == "ok\n", "after remount: \(r)")
    }

    @Test func appendExclusiveAndTruncOpen() throws {
        guard E2E.python != nil else {
            Issue.record("python3 missing (make test-deps installs it)")
            return
        }
        let sb = try Sandbox("append")
        defer { sb.cleanup() }
        try sb.initAndMount()
        let r = E2E.py(
            """
            import os, sys, errno
            p = sys.argv[1]
            with open(p, 'wb') as f: f.write(b'start;')
            fd1 = os.open(p, os.O_WRONLY | os.O_APPEND)
            fd2 = os.open(p, os.O_WRONLY | os.O_APPEND)
            os.lseek(fd1, 0, os.SEEK_SET)
            os.write(fd1, b'one;')
            os.write(fd2, b'two;')
            os.close(fd1); os.close(fd2)
            print(open(p, 'rb').read().decode())
            try:
                os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                print('excl-succeeded')
            except OSError as e:
                print('excl', errno.errorcode[e.errno])
            fd = os.open(p + '.new', os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o640)
            os.close(fd)
            print('new-mode', oct(os.stat(p + '.new').st_mode & 0o777))
            fd = os.open(p, os.O_WRONLY | os.O_TRUNC)
            os.close(fd)
            print('after-trunc', os.stat(p).st_size)
            """, [sb.mnt + "/log"])
        let lines = r.stdout.split(separator: "\n").map(String.init)
        #expect(r.ok, "\(r)")
        #expect(lines.first == "start;one;two;", "O_APPEND: \(r)")
        #expect(lines.contains("excl EEXIST"), "O_EXCL on an existing file: \(r)")
        #expect(lines.contains("new-mode 0o640"), "\(r)")
        #expect(lines.contains("after-trunc 0"), "O_TRUNC: \(r)")
    }

    @Test func renameVariants() throws {
        guard E2E.python != nil else {
            Issue.record("python3 missing (make test-deps installs it)")
            return
        }
        let sb = try Sandbox("rename")
        defer { sb.cleanup() }
        try sb.initAndMount()
        let m = sb.mnt
        try E2E.write(m + "/a", "AAA")
        try E2E.write(m + "/b", "BBB")
        // rename(2) over an existing target.
        let mv = E2E.run("/bin/mv", [m + "/a", m + "/b"])
        #expect(mv.ok, "\(mv)")
        #expect(E2E.readText(m + "/b") == "AAA")
        #expect(!FileManager.default.fileExists(atPath: m + "/a"))
        // Directories: rename a dir over an empty dir; not over a non-empty one.
        try FileManager.default.createDirectory(atPath: m + "/d1/sub", withIntermediateDirectories: true)
        try E2E.write(m + "/d1/sub/f", "in d1")
        try FileManager.default.createDirectory(atPath: m + "/d2", withIntermediateDirectories: true)
        #expect(rename(m + "/d1", m + "/d2") == 0, "rename dir over empty dir: \(errno)")
        #expect(E2E.readText(m + "/d2/sub/f") == "in d1")
        try FileManager.default.createDirectory(atPath: m + "/d3/x", withIntermediateDirectories: true)
        #expect(rename(m + "/d2", m + "/d3") == -1 && (errno == ENOTEMPTY || errno == EEXIST), "rename over a non-empty dir")

        try E2E.write(m + "/x", "XXX")
        try E2E.write(m + "/y", "YYY")
        let r = E2E.py(
            """
            import ctypes, os, sys, errno
            libc = ctypes.CDLL(None, use_errno=True)
            AT_FDCWD = -100
            def renameat2(a, b, flags):
                rc = libc.renameat2(AT_FDCWD, a.encode(), AT_FDCWD, b.encode(), flags)
                return 'ok' if rc == 0 else errno.errorcode[ctypes.get_errno()]
            m = sys.argv[1]
            print('noreplace-existing', renameat2(m + '/x', m + '/y', 1))
            print('noreplace-new', renameat2(m + '/x', m + '/z', 1))
            print('exchange', renameat2(m + '/z', m + '/y', 2))
            print('exchange-missing', renameat2(m + '/z', m + '/nothing', 2))
            """, [m])
        let lines = r.stdout.split(separator: "\n").map(String.init)
        #expect(r.ok, "\(r)")
        #expect(lines.contains("noreplace-existing EEXIST"), "\(r)")
        #expect(lines.contains("noreplace-new ok"), "\(r)")
        #expect(lines.contains("exchange ok"), "\(r)")
        #expect(lines.contains("exchange-missing ENOENT"), "\(r)")
        // After: x was renamed to z, then z and y swapped.
        #expect(!FileManager.default.fileExists(atPath: m + "/x"))
        #expect(E2E.readText(m + "/y") == "XXX")
        #expect(E2E.readText(m + "/z") == "YYY")
        try sb.remount()
        #expect(E2E.readText(m + "/y") == "XXX")
        #expect(E2E.readText(m + "/z") == "YYY")
        #expect(E2E.readText(m + "/b") == "AAA")
    }

    @Test func chmodChownAndNanosecondTimes() throws {
        let sb = try Sandbox("attrs")
        defer { sb.cleanup() }
        try sb.initAndMount()
        let f = sb.mnt + "/f"
        try E2E.write(f, "attrs")
        if E2E.isRoot {
            // chown clears set-user-ID on a regular file (Linux does so for root too).
            #expect(chmod(f, 0o4755) == 0)
            #expect(chown(f, 1234, 5678) == 0, "chown as root: \(errno)")
            #expect(E2E.statOf(f).map { $0.st_mode & 0o7777 } == 0o755, "chown did not clear set-user-ID")
            // Also when it changes no owner (chown(f, -1, -1)), and set-group-ID with group-execute (a tester's find).
            #expect(chmod(f, 0o6755) == 0)
            #expect(chown(f, uid_t.max, gid_t.max) == 0, "chown(-1, -1): \(errno)")
            #expect(E2E.statOf(f).map { $0.st_mode & 0o7777 } == 0o755, "chown(-1, -1) did not clear the set-id bits")
            #expect(chmod(f, 0o2745) == 0 && chown(f, uid_t.max, gid_t.max) == 0)
            #expect(E2E.statOf(f).map { $0.st_mode & 0o7777 } == 0o2745, "set-group-ID without group-execute is kept")
        }
        #expect(chmod(f, 0o4751) == 0)
        let t = E2E.run("/usr/bin/touch", ["-d", "2001-02-03 04:05:06.123456789 +0000", f])
        #expect(t.ok, "\(t)")
        let ta = E2E.run("/usr/bin/touch", ["-a", "-d", "1999-12-31 23:59:58.987654321 +0000", f])
        #expect(ta.ok, "\(ta)")
        func check(_ when: String) {
            let st = E2E.statOf(f)
            #expect(st.map { $0.st_mode & 0o7777 } == 0o4751, "\(when): mode")
            if E2E.isRoot {
                #expect(
                    st?.st_uid == 1234 && st?.st_gid == 5678, "\(when): owner \(String(describing: st?.st_uid)):\(String(describing: st?.st_gid))")
            }
            #expect(st?.st_mtim.tv_nsec == 123_456_789, "\(when): mtime ns \(String(describing: st?.st_mtim.tv_nsec))")
            #expect(st?.st_atim.tv_nsec == 987_654_321, "\(when): atime ns")
            let y = E2E.run("/usr/bin/env", ["TZ=UTC", "stat", "-c", "%y", f])
            #expect(y.stdout.hasPrefix("2001-02-03 04:05:06.123456789"), "\(when): \(y)")
        }
        check("mounted")
        try sb.remount()
        check("after remount")
    }

    /// With the writeback cache the kernel stamps mtime and ctime on writes from its coarse clock; times the
    /// daemon stamps (create) come from the same clock, so a write right after a create never moves them back.
    /// (With CLOCK_REALTIME in the daemon, 300 of 300 writes did.)
    @Test func timesNeverGoBackAfterAWrite() throws {
        guard E2E.python != nil else {
            Issue.record("python3 missing (make test-deps installs it)")
            return
        }
        let sb = try Sandbox("times")
        defer { sb.cleanup() }
        try sb.initAndMount()
        let r = E2E.py(
            """
            import os, sys
            m = sys.argv[1]; back = []
            for i in range(300):
                p = os.path.join(m, f"f{i}")
                with open(p, "wb") as f:
                    s1 = os.fstat(f.fileno())
                    f.write(b"x" * 100); f.flush(); os.fsync(f.fileno())
                    s2 = os.fstat(f.fileno())
                s3 = os.stat(p)
                if min(s2.st_mtime_ns, s3.st_mtime_ns) < s1.st_mtime_ns or s3.st_ctime_ns < s1.st_ctime_ns:
                    back.append((i, s1.st_mtime_ns, s2.st_mtime_ns, s3.st_mtime_ns))
            print("backwards", len(back), back[:3])
            """, [sb.mnt])
        #expect(r.stdout == "backwards 0 []\n", "\(r)")
    }
    @Test func truncateAndFallocate() throws {
        let sb = try Sandbox("trunc")
        defer { sb.cleanup() }
        try sb.initAndMount()
        let f = sb.mnt + "/t"
        let orig = E2E.randomBytes(150_000)
        try E2E.write(f, orig)
        #expect(truncate(f, 70_000) == 0)
        #expect(E2E.read(f) == Array(orig[0..<70_000]), "truncate down")
        #expect(truncate(f, 300_000) == 0)
        let grown = E2E.read(f)
        #expect(grown?.count == 300_000)
        #expect(grown.map { Array($0[0..<70_000]) } == Array(orig[0..<70_000]), "truncate up lost the start")
        #expect(grown.map { $0[70_000...].allSatisfy { $0 == 0 } } == true, "truncate up: old bytes came back instead of zeros")
        // Down to the middle of a chunk and up again: no stale bytes.
        #expect(truncate(f, 100) == 0)
        #expect(truncate(f, 65_536 + 10) == 0)
        let again = E2E.read(f)
        #expect(again.map { Array($0[0..<100]) } == Array(orig[0..<100]))
        #expect(again.map { $0[100...].allSatisfy { $0 == 0 } } == true)

        let fa = E2E.run("/usr/bin/fallocate", ["-l", "1M", sb.mnt + "/alloc"])
        #expect(fa.ok, "\(fa)")
        #expect(E2E.statOf(sb.mnt + "/alloc")?.st_size == 1 << 20)
        #expect(E2E.read(sb.mnt + "/alloc").map { $0.count == 1 << 20 && $0.allSatisfy { $0 == 0 } } == true)
        // fallocate keeping the size, on an existing file.
        try E2E.write(sb.mnt + "/keep", "abc")
        let fk = E2E.run("/usr/bin/fallocate", ["-n", "-l", "1M", sb.mnt + "/keep"])
        #expect(fk.ok, "\(fk)")
        #expect(E2E.readText(sb.mnt + "/keep") == "abc")
        try sb.remount()
        #expect(E2E.statOf(f)?.st_size == 65_546)
        #expect(E2E.statOf(sb.mnt + "/alloc")?.st_size == 1 << 20)
    }

    @Test func syncFsyncFdatasyncAndStatfs() throws {
        guard E2E.python != nil else {
            Issue.record("python3 missing (make test-deps installs it)")
            return
        }
        let sb = try Sandbox("fsync")
        defer { sb.cleanup() }
        try sb.initAndMount()
        let r = E2E.py(
            """
            import os, sys
            p = sys.argv[1] + '/s'
            fd = os.open(p, os.O_WRONLY | os.O_CREAT, 0o644)
            os.write(fd, b'x' * 100000)
            os.fsync(fd)
            os.write(fd, b'y')
            os.fdatasync(fd)
            os.close(fd)
            d = os.open(sys.argv[1], os.O_RDONLY)
            os.fsync(d)
            os.close(d)
            os.sync()
            st = os.statvfs(sys.argv[1])
            print('statfs', st.f_bsize > 0, st.f_blocks > 0, st.f_namemax)
            """, [sb.mnt])
        #expect(r.ok, "\(r)")
        #expect(r.stdout.contains("statfs True True 255"), "\(r)")
        let s = E2E.run("/bin/sync", ["-f", sb.mnt + "/s"])
        #expect(s.ok, "\(s)")
        let df = E2E.run("/bin/df", ["-P", sb.mnt])
        #expect(df.ok, "\(df)")
        #expect(E2E.statOf(sb.mnt + "/s")?.st_size == 100_001)
    }

    @Test func fifoAndDeviceNodes() throws {
        let sb = try Sandbox("mknod")
        defer { sb.cleanup() }
        try sb.initAndMount()
        let m = sb.mnt
        let f = E2E.run("/usr/bin/mkfifo", [m + "/fifo"])
        #expect(f.ok, "\(f)")
        let c = E2E.run("/bin/mknod", [m + "/cdev", "c", "1", "3"])
        if E2E.isRoot { #expect(c.ok, "\(c)") }
        let b = E2E.run("/bin/mknod", [m + "/bdev", "b", "7", "200"])
        if E2E.isRoot { #expect(b.ok, "\(b)") }
        func check(_ when: String) {
            let types = E2E.run("/usr/bin/stat", ["-c", "%n|%F|%t|%T", m + "/fifo", m + "/cdev", m + "/bdev"])
            let lines = types.stdout.split(separator: "\n").map(String.init)
            #expect(lines.contains("\(m)/fifo|fifo|0|0"), "\(when): \(types)")
            if E2E.isRoot {
                #expect(lines.contains("\(m)/cdev|character special file|1|3"), "\(when): \(types)")
                #expect(lines.contains("\(m)/bdev|block special file|7|c8"), "\(when): \(types)")
            }
        }
        check("mounted")
        // A FIFO on the mount works as a FIFO (the kernel handles the data).
        let pipe = E2E.sh("(echo through-fifo > '\(m)/fifo' &) ; timeout 10 cat '\(m)/fifo'")
        #expect(pipe.stdout == "through-fifo\n", "\(pipe)")
        try sb.remount()
        check("after remount")
    }

    @Test func userXattrs() throws {
        let sb = try Sandbox("xattr")
        defer { sb.cleanup() }
        try sb.initAndMount()
        let f = sb.mnt + "/x"
        try E2E.write(f, "x")
        try FileManager.default.createDirectory(atPath: sb.mnt + "/dir", withIntermediateDirectories: false)
        #expect(E2E.run("/usr/bin/setfattr", ["-n", "user.color", "-v", "blue", f]).ok)
        #expect(E2E.run("/usr/bin/setfattr", ["-n", "user.shape", "-v", "0x00ff00", f]).ok)
        #expect(E2E.run("/usr/bin/setfattr", ["-n", "user.on-dir", "-v", "d", sb.mnt + "/dir"]).ok)
        let get = E2E.run("/usr/bin/getfattr", ["--only-values", "-n", "user.color", f])
        #expect(get.stdout == "blue", "\(get)")
        let list = E2E.run("/usr/bin/getfattr", ["-d", "-m", "^user\\.", f])
        #expect(list.stdout.contains("user.color=\"blue\"") && list.stdout.contains("user.shape"), "\(list)")
        let missing = E2E.run("/usr/bin/getfattr", ["-n", "user.nope", f])
        #expect(!missing.ok && missing.stderr.contains("No such attribute"), "\(missing)")
        // Replace, remove.
        #expect(E2E.run("/usr/bin/setfattr", ["-n", "user.color", "-v", "green", f]).ok)
        #expect(E2E.run("/usr/bin/setfattr", ["-x", "user.shape", f]).ok)
        try sb.remount()
        #expect(E2E.run("/usr/bin/getfattr", ["--only-values", "-n", "user.color", f]).stdout == "green")
        let gone = E2E.run("/usr/bin/getfattr", ["-n", "user.shape", f])
        #expect(!gone.ok, "removed xattr is back: \(gone)")
        #expect(E2E.run("/usr/bin/getfattr", ["--only-values", "-n", "user.on-dir", sb.mnt + "/dir"]).stdout == "d")
        // Only user.* (and what the kernel handles) is accepted for ordinary names.
        let other = E2E.run("/usr/bin/setfattr", ["-n", "bogus.ns", "-v", "1", f])
        #expect(!other.ok, "\(other)")
    }

    /// Attribute names past the kernel's 64 KiB list: the one that would not fit is ENOSPC (as ext4 when its
    /// block is full), so the file's attributes stay listable and `cp -a` keeps them all. Every put was
    /// taken before (a tester's find): listxattr then failed with E2BIG and cp -a dropped them silently.
    @Test func attributeNamesPastTheListLimitAreRefused() throws {
        let sb = try Sandbox("xattrlist")
        defer { sb.cleanup() }
        try sb.initAndMount()
        let put = E2E.py(
            """
            import errno, os, sys
            f = sys.argv[1] + '/x'
            open(f, 'w').close()
            for i in range(300):
                try: os.setxattr(f, 'user.%03d' % i + 'x' * 245, b'v')
                except OSError as e:
                    print(i, errno.errorcode[e.errno]); break
            print(len(os.listxattr(f)))
            """, [sb.mnt])
        // 258 names of 253 bytes (254 with their NUL) fill 65,532 bytes; the 259th would not fit.
        #expect(put.ok && put.stdout == "258 ENOSPC\n258\n", "\(put)")
        #expect(E2E.sh("cp -a '\(sb.mnt)/x' '\(sb.mnt)/y'").ok)
        #expect(E2E.py("import os, sys; print(len(os.listxattr(sys.argv[1])))", [sb.mnt + "/y"]).stdout == "258\n")
    }

    /// Coffer keeps no security.*, system.* or trusted.* attributes and says so with EOPNOTSUPP, as ext4 mounted
    /// noacl does. `ls -l` remembers that per device: it then stops asking for security.selinux and
    /// system.posix_acl_access on every entry (ENODATA cost two GETXATTR round trips per entry).
    @Test func otherXattrNamespacesAreUnsupportedSoLsStopsAsking() throws {
        let sb = try Sandbox("xattrns")
        defer { sb.cleanup() }
        try #require(sb.initContainer().ok)
        let child = try Child(E2E.coffer, ["mount", "-f", "-o", "debug", sb.container, sb.mnt, "--passfile", sb.passfile])
        defer { child.stop() }
        try #require(E2E.wait(30) { E2E.isMounted(sb.mnt) && E2E.answersAsMount(sb.mnt) }, "mount: \(child.stderr)")
        sb.noteDaemon()
        try FileManager.default.createDirectory(atPath: sb.mnt + "/d", withIntermediateDirectories: false)
        for i in 0..<100 { try E2E.write(sb.mnt + "/d/f\(i)", "\(i)") }
        let errors = E2E.py(
            """
            import os, sys, errno
            for name in ['security.selinux', 'system.posix_acl_access', 'trusted.x', 'security.capability']:
                try: os.getxattr(sys.argv[1], name); print(name, 'found')
                except OSError as e: print(name, errno.errorcode.get(e.errno))
            """, [sb.mnt + "/d/f0"])
        #expect(
            errors.stdout == """
                security.selinux ENOTSUP
                system.posix_acl_access ENOTSUP
                trusted.x ENOTSUP
                security.capability ENOTSUP

                """, "\(errors)")
        let before = child.stderr.components(separatedBy: "opcode: GETXATTR").count
        let ls = E2E.run("/bin/ls", ["-lR", sb.mnt + "/d"])
        #expect(ls.ok && ls.stdout.split(separator: "\n").filter { $0.hasPrefix("-rw") }.count == 100, "\(ls)")
        #expect(!ls.stdout.contains("+ "), "an ACL mark in ls -l: \(ls.stdout.prefix(300))")
        let asked = child.stderr.components(separatedBy: "opcode: GETXATTR").count - before
        #expect(asked <= 4, "ls -lR over 100 files sent \(asked) GETXATTR requests")
        // fusermount3, not `coffer unmount`: that waits for the daemon to be gone, and our unreaped child is not.
        #expect(E2E.run("/bin/fusermount3", ["-u", sb.mnt]).ok)
        #expect(child.waitForExit(30) == 0, "\(child.stderr.suffix(500))")
    }

    @Test func nameLengthLimit() throws {
        guard E2E.python != nil else {
            Issue.record("python3 missing (make test-deps installs it)")
            return
        }
        let sb = try Sandbox("names")
        defer { sb.cleanup() }
        try sb.initAndMount()
        let r = E2E.py(
            """
            import os, sys, errno
            m = sys.argv[1]
            n255 = 'n' * 251 + '.txt'
            with open(os.path.join(m, n255), 'w') as f: f.write('255')
            print('listed', n255 in os.listdir(m))
            print('read', open(os.path.join(m, n255)).read())
            # 255 bytes of UTF-8 (2-byte chars): allowed too.
            u = 'é' * 127 + 'x'
            assert len(u.encode()) == 255
            open(os.path.join(m, u), 'w').close()
            print('utf8', u in os.listdir(m))
            for name in ['m' * 256, 'é' * 128]:
                try:
                    open(os.path.join(m, name), 'w').close()
                    print('256 created')
                except OSError as e:
                    print('256', errno.errorcode[e.errno])
            try:
                os.mkdir(os.path.join(m, 'd' * 256))
                print('mkdir256 created')
            except OSError as e:
                print('mkdir256', errno.errorcode[e.errno])
            """, [sb.mnt])
        let lines = r.stdout.split(separator: "\n").map(String.init)
        #expect(r.ok, "\(r)")
        #expect(lines.contains("listed True") && lines.contains("read 255") && lines.contains("utf8 True"), "\(r)")
        #expect(lines.filter { $0 == "256 ENAMETOOLONG" }.count == 2, "\(r)")
        #expect(lines.contains("mkdir256 ENAMETOOLONG"), "\(r)")
        try sb.remount()
        let n255 = String(repeating: "n", count: 251) + ".txt"
        #expect(E2E.readText(sb.mnt + "/" + n255) == "255")
    }

    @Test func absoluteSymlinksFollowTheMountpoint() throws {
        let sb = try Sandbox("symlinks")
        defer { sb.cleanup() }
        try sb.initAndMount()
        let m = sb.mnt
        try FileManager.default.createDirectory(atPath: m + "/docs", withIntermediateDirectories: false)
        try E2E.write(m + "/docs/target.txt", "target")
        #expect(symlink(m + "/docs/target.txt", m + "/abs") == 0)
        #expect(symlink("docs/target.txt", m + "/rel") == 0)
        #expect(symlink("../docs/../docs/target.txt", m + "/docs/dotted") == 0)
        #expect(symlink("/etc/hostname", m + "/outside") == 0)
        #expect(symlink(m, m + "/root-link") == 0)
        #expect((try? FileManager.default.destinationOfSymbolicLink(atPath: m + "/abs")) == m + "/docs/target.txt")
        #expect(E2E.readText(m + "/abs") == "target")

        let m2 = sb.root + "/elsewhere"
        try #require(mkdir(m2, 0o755) == 0)
        try sb.remount(at: m2)
        func readlink(_ p: String) -> String? { try? FileManager.default.destinationOfSymbolicLink(atPath: p) }
        #expect(
            readlink(m2 + "/abs") == m2 + "/docs/target.txt",
            "absolute link inside the mount did not follow the new mountpoint: \(String(describing: readlink(m2 + "/abs")))")
        #expect(E2E.readText(m2 + "/abs") == "target", "cat through the absolute link fails at the new mountpoint")
        let cat = E2E.run("/bin/cat", [m2 + "/abs"])
        #expect(cat.stdout == "target", "\(cat)")
        #expect(readlink(m2 + "/rel") == "docs/target.txt")
        #expect(readlink(m2 + "/docs/dotted") == "../docs/../docs/target.txt")
        #expect(readlink(m2 + "/outside") == "/etc/hostname", "a target outside the mount must stay as given")
        #expect(readlink(m2 + "/root-link") == m2)
        #expect(E2E.lstatOf(m2 + "/abs").map { ($0.st_mode & S_IFMT) == S_IFLNK } == true)
        // st_size is the length readlink gives here (programs size their buffer by it), on every path.
        for link in ["abs", "rel", "docs/dotted", "outside", "root-link"] {
            let size = E2E.lstatOf(m2 + "/" + link).map { Int($0.st_size) }
            #expect(size == readlink(m2 + "/" + link)?.utf8.count, "\(link): st_size \(String(describing: size))")
        }
        #expect(E2E.unmount(sb, m2).ok)
    }

    @Test func plainSymlinksKeepTheTargetAsGiven() throws {
        let sb = try Sandbox("plainlinks")
        defer { sb.cleanup() }
        try sb.initAndMount(options: "plain_symlinks")
        let m = sb.mnt
        try E2E.write(m + "/target.txt", "t")
        #expect(symlink(m + "/target.txt", m + "/abs") == 0)
        #expect((try? FileManager.default.destinationOfSymbolicLink(atPath: m + "/abs")) == m + "/target.txt")
        let m2 = sb.root + "/other"
        try #require(mkdir(m2, 0o755) == 0)
        // Remount elsewhere without the option: a link stored as given stays as given.
        try sb.remount(at: m2)
        #expect(
            (try? FileManager.default.destinationOfSymbolicLink(atPath: m2 + "/abs")) == m + "/target.txt",
            "plain_symlinks target was rewritten")
        #expect(E2E.unmount(sb, m2).ok)
    }

    @Test func unlinkOfAnOpenFile() throws {
        guard E2E.python != nil else {
            Issue.record("python3 missing (make test-deps installs it)")
            return
        }
        let sb = try Sandbox("unlinkopen")
        defer { sb.cleanup() }
        try sb.initAndMount()
        let r = E2E.py(
            """
            import os, sys
            p = sys.argv[1] + '/doomed'
            with open(p, 'wb') as f: f.write(b'A' * 100000)
            fd = os.open(p, os.O_RDWR)
            os.unlink(p)
            print('gone', not os.path.exists(p), os.path.basename(p) not in os.listdir(sys.argv[1]))
            os.lseek(fd, 0, os.SEEK_END)
            os.write(fd, b'tail' * 30000)
            os.lseek(fd, 0, os.SEEK_SET)
            data = b''
            while True:
                chunk = os.read(fd, 1 << 20)
                if not chunk: break
                data += chunk
            print('data', data == b'A' * 100000 + b'tail' * 30000)
            print('nlink', os.fstat(fd).st_nlink)
            # A new file with the same name is a different file.
            with open(p, 'wb') as f: f.write(b'new')
            os.lseek(fd, 0, os.SEEK_SET)
            print('old', os.read(fd, 3))
            os.close(fd)
            print('new', open(p, 'rb').read())
            """, [sb.mnt])
        let lines = r.stdout.split(separator: "\n").map(String.init)
        #expect(r.ok, "\(r)")
        #expect(lines.contains("gone True True"), "\(r)")
        #expect(lines.contains("data True"), "\(r)")
        #expect(lines.contains("nlink 0"), "\(r)")
        #expect(lines.contains("old b'AAA'"), "\(r)")
        #expect(lines.contains("new b'new'"), "\(r)")
        try sb.remount()
        #expect(E2E.readText(sb.mnt + "/doomed") == "new")
        #expect(try FileManager.default.contentsOfDirectory(atPath: sb.mnt) == ["doomed"])
    }

    @Test func hardLinkCounts() throws {
        let sb = try Sandbox("hardlinks")
        defer { sb.cleanup() }
        try sb.initAndMount()
        let m = sb.mnt
        try E2E.write(m + "/a", "shared")
        try FileManager.default.createDirectory(atPath: m + "/sub", withIntermediateDirectories: false)
        #expect(link(m + "/a", m + "/b") == 0)
        #expect(link(m + "/a", m + "/sub/c") == 0)
        #expect(E2E.statOf(m + "/a")?.st_nlink == 3)
        #expect(E2E.statOf(m + "/a")?.st_ino == E2E.statOf(m + "/sub/c")?.st_ino)
        try E2E.write(m + "/b", "changed via b")
        #expect(E2E.readText(m + "/sub/c") == "changed via b")
        #expect(unlink(m + "/a") == 0)
        #expect(E2E.statOf(m + "/b")?.st_nlink == 2)
        // Directory link counts: 2 + subdirectories.
        try FileManager.default.createDirectory(atPath: m + "/sub/s1", withIntermediateDirectories: false)
        try FileManager.default.createDirectory(atPath: m + "/sub/s2", withIntermediateDirectories: false)
        #expect(E2E.statOf(m + "/sub")?.st_nlink == 4, "dir nlink \(String(describing: E2E.statOf(m + "/sub")?.st_nlink))")
        #expect(link(m + "/sub", m + "/sublink") == -1 && errno == EPERM, "hard link to a directory")
        try sb.remount()
        #expect(E2E.statOf(m + "/b")?.st_nlink == 2)
        #expect(E2E.statOf(m + "/b")?.st_ino == E2E.statOf(m + "/sub/c")?.st_ino)
        #expect(E2E.readText(m + "/sub/c") == "changed via b")
        #expect(unlink(m + "/b") == 0)
        #expect(E2E.statOf(m + "/sub/c")?.st_nlink == 1)
    }

    @Test func tenThousandEntriesInOneDirectory() throws {
        guard E2E.python != nil else {
            Issue.record("python3 missing (make test-deps installs it)")
            return
        }
        let sb = try Sandbox("manyfiles")
        defer { sb.cleanup() }
        try sb.initAndMount()
        let dir = sb.mnt + "/many"
        let r = E2E.py(
            """
            import os, sys
            d = sys.argv[1]
            os.mkdir(d)
            for i in range(10000):
                os.close(os.open('%s/entry-%05d' % (d, i), os.O_WRONLY | os.O_CREAT, 0o644))
            print(len(os.listdir(d)))
            """, [dir], timeout: 150)
        #expect(r.ok && r.stdout == "10000\n", "\(r)")
        let ls = E2E.sh("ls '\(dir)' | wc -l")
        #expect(ls.stdout.trimmingCharacters(in: .whitespacesAndNewlines) == "10000", "\(ls)")
        let unique = E2E.sh("ls -f '\(dir)' | sort | uniq -d | wc -l")
        #expect(unique.stdout.trimmingCharacters(in: .whitespacesAndNewlines) == "0", "readdir returned duplicates: \(unique)")
        #expect(E2E.statOf(dir + "/entry-09999") != nil)
        #expect(E2E.statOf(dir + "/entry-10000") == nil)
    }

    @Test func sqliteDatabase() throws {
        guard let sqlite = E2E.which("sqlite3") else {
            Issue.record("sqlite3 CLI is not installed (make test-deps installs it)")
            return
        }
        let sb = try Sandbox("sqlite")
        defer { sb.cleanup() }
        try sb.initAndMount()
        let db = sb.mnt + "/test.db"
        let r = E2E.run(
            sqlite,
            [
                db,
                """
                PRAGMA journal_mode=WAL;
                CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT);
                BEGIN;
                WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 1000)
                  INSERT INTO t(v) SELECT printf('row-%d', x) FROM c;
                COMMIT;
                SELECT count(*) FROM t;
                PRAGMA integrity_check;
                """
            ])
        #expect(r.ok, "\(r)")
        #expect(r.stdout.contains("1000\nok"), "\(r)")
        try sb.remount()
        let q = E2E.run(sqlite, [db, "SELECT count(*), max(v) FROM t; PRAGMA integrity_check;"])
        #expect(q.stdout == "1000|row-999\nok\n", "\(q)")
        // Rollback journal mode too.
        let j = E2E.run(
            sqlite, [sb.mnt + "/j.db", "PRAGMA journal_mode=DELETE; CREATE TABLE a(x); INSERT INTO a VALUES(1),(2); SELECT sum(x) FROM a;"])
        #expect(j.stdout.hasSuffix("3\n"), "\(j)")
    }

    @Test func gitInitAndCommit() throws {
        guard let git = E2E.which("git") else {
            Issue.record("git is not installed (make test-deps installs it)")
            return
        }
        let sb = try Sandbox("git")
        defer { sb.cleanup() }
        try sb.initAndMount()
        let repo = sb.mnt + "/repo"
        let env = [
            "HOME": sb.root, "PATH": "/usr/bin:/bin", "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_AUTHOR_NAME": "T", "GIT_AUTHOR_EMAIL": "t@example.org", "GIT_COMMITTER_NAME": "T", "GIT_COMMITTER_EMAIL": "t@example.org"
        ]
        func g(_ args: [String]) -> RunResult { E2E.run(git, ["-C", repo] + args, environment: env) }
        #expect(E2E.run(git, ["init", "-q", repo], environment: env).ok)
        try E2E.write(repo + "/README", "hello\n")
        try FileManager.default.createDirectory(atPath: repo + "/src", withIntermediateDirectories: false)
        try E2E.write(repo + "/src/main.c", "int main(void) { return 0; }\n")
        #expect(g(["add", "-A"]).ok)
        let c = g(["commit", "-q", "-m", "first"])
        #expect(c.ok, "\(c)")
        try E2E.write(repo + "/README", "hello again\n")
        #expect(g(["commit", "-q", "-am", "second"]).ok)
        try sb.remount()
        let log = g(["log", "--format=%s"])
        #expect(log.stdout == "second\nfirst\n", "\(log)")
        let fsck = g(["fsck", "--strict"])
        #expect(fsck.ok, "\(fsck)")
        let status = g(["status", "--porcelain"])
        #expect(status.ok && status.stdout.isEmpty, "\(status)")
    }

    /// A mount that another user can reach (the sandbox and the mountpoint are world-searchable), for
    /// tests that act as nobody; nil, saying so, when not root.
    static func mountForOtherUsers(_ name: String, options: String) throws -> Sandbox? {
        guard E2E.isRoot else {
            print("skipped: needs root to act as another user")
            return nil
        }
        let sb = try Sandbox(name)
        chmod(sb.root, 0o755)
        do { try sb.initAndMount(options: options) } catch {
            sb.cleanup()
            throw error
        }
        #expect(chmod(sb.mnt, 0o755) == 0)
        return sb
    }

    static func asNobody(_ script: String) -> RunResult {
        E2E.run("/usr/sbin/runuser", ["-u", "nobody", "--", "/bin/sh", "-c", script])
    }

    @Test func allowOtherAndPermissions() throws {
        guard let sb = try Self.mountForOtherUsers("allowother", options: "allow_other") else { return }
        defer { sb.cleanup() }
        let m = sb.mnt
        try FileManager.default.createDirectory(atPath: m + "/pub", withIntermediateDirectories: false)
        #expect(chmod(m + "/pub", 0o1777) == 0)
        try E2E.write(m + "/secret", "root only")
        #expect(chmod(m + "/secret", 0o600) == 0)
        try E2E.write(m + "/public", "everyone")
        #expect(chmod(m + "/public", 0o644) == 0)

        let asNobody = Self.asNobody
        let create = asNobody("echo mine > '\(m)/pub/nobody.txt'")
        #expect(create.ok, "\(create)")
        let st = E2E.statOf(m + "/pub/nobody.txt")
        #expect(st?.st_uid == 65534, "owner is \(String(describing: st?.st_uid)), expected nobody")
        #expect(st?.st_gid == 65534, "group is \(String(describing: st?.st_gid))")
        let readPublic = asNobody("cat '\(m)/public'")
        #expect(readPublic.stdout == "everyone", "\(readPublic)")
        let readSecret = asNobody("cat '\(m)/secret'")
        #expect(!readSecret.ok && readSecret.stderr.contains("Permission denied"), "\(readSecret)")
        let writeRoot = asNobody("echo x > '\(m)/nobody-at-root'")
        #expect(!writeRoot.ok && writeRoot.stderr.contains("Permission denied"), "\(writeRoot)")
        // Sticky dir: nobody cannot delete root's file in /pub.
        try E2E.write(m + "/pub/roots", "r")
        let del = asNobody("rm -f '\(m)/pub/roots'")
        #expect(!del.ok && FileManager.default.fileExists(atPath: m + "/pub/roots"), "sticky bit ignored: \(del)")
        try sb.remount(options: "allow_other")
        #expect(E2E.statOf(m + "/pub/nobody.txt")?.st_uid == 65534)
    }

    /// setxattr on a directory racing its rmdir, and a rename over it: the kernel sends a SETXATTR it resolved
    /// before the removal after it, and the daemon then put the attribute of an inode whose rows were gone (a
    /// tester's fsck: hundreds of unreferenced-xattr, 3 runs of 3). Now ENOENT, and the store checks clean.
    @Test func setxattrRacingRmdirLeavesNothingBehind() throws {
        let sb = try Sandbox("xattrrace")
        defer { sb.cleanup() }
        try sb.initAndMount()
        let race = E2E.run(
            "/usr/bin/python3",
            [
                "-c",
                """
                import os, sys
                d = sys.argv[1] + '/d'
                pid = os.fork()
                if pid == 0:
                    for i in range(1500):
                        try: os.mkdir(d)
                        except FileExistsError: pass
                        if i % 2: os.mkdir(d + 'e'); os.rename(d + 'e', d)
                        else: os.rmdir(d)
                    os._exit(0)
                puts = 0
                while not os.waitpid(pid, os.WNOHANG)[0]:
                    try:
                        os.setxattr(d, 'user.x', b'v'); puts += 1
                    except OSError: pass
                print(puts)
                """,
                sb.mnt
            ], timeout: 120)
        #expect(race.ok, "\(race)")
        #expect((Int(race.stdout.trimmingCharacters(in: .whitespacesAndNewlines)) ?? 0) > 0, "no setxattr got through: \(race)")
        #expect(sb.unmount().ok)
        let fsck = E2E.coffer(["fsck", sb.container, "--passfile", sb.passfile], timeout: 120)
        #expect(fsck.status == 0, "\(fsck.stdout.prefix(600))")
    }

    /// A set-id file appended by a user who is not its owner, its last page not in the kernel's cache (after a
    /// remount): the kernel sends that write through (FUSE_HANDLE_KILLPRIV_V2) with the page holding the file's
    /// end locked until the answer. A page drop of it before the answer (meant for O_DIRECT writes) hung the
    /// writer for good.
    @Test func aSetIDFileAppendedByAnotherUserAfterARemountIsAnswered() throws {
        guard let sb = try Self.mountForOtherUsers("setidcold", options: "allow_other") else { return }
        defer { sb.cleanup() }
        let path = sb.mnt + "/s"
        try E2E.write(path, "0123456789")
        #expect(chmod(path, 0o6777) == 0)
        try sb.remount(options: "allow_other")
        let w = E2E.run("/usr/sbin/runuser", ["-u", "nobody", "--", "/bin/sh", "-c", "printf x >> '\(path)'"], timeout: 20)
        #expect(w.ok, "append by nobody: \(w)")
        #expect(E2E.statOf(path).map { $0.st_mode & 0o7777 } == 0o0777)
        #expect(E2E.readText(path) == "0123456789x")
    }

    /// Set-id bits as ext4 keeps them (the daemon clears them under FUSE_HANDLE_KILLPRIV_V2): a write or
    /// truncate by an unprivileged user clears set-user-ID and (group-executable) set-group-ID, root's keeps
    /// them, chown clears them also for root; set-group-ID without group-execute stays for a group member.
    @Test(arguments: ["allow_other", "allow_other,no_writeback_cache"])
    func setIDBitsOnWriteTruncateAndChown(options: String) throws {
        guard let sb = try Self.mountForOtherUsers("setid", options: options) else { return }
        defer { sb.cleanup() }
        let m = sb.mnt
        func mode(_ name: String) -> mode_t? { E2E.statOf(m + "/" + name).map { $0.st_mode & 0o7777 } }
        let asNobody = Self.asNobody
        for name in ["w", "t", "o", "r", "c", "g", "f"] {
            try E2E.write(m + "/" + name, "0123456789")
            #expect(chmod(m + "/" + name, name == "g" ? 0o2767 : 0o6777) == 0)
        }
        #expect(chown(m + "/g", 0, 65534) == 0 && chmod(m + "/g", 0o2767) == 0)

        let w = asNobody("printf x >> '\(m)/w'")
        #expect(w.ok, "\(w)")
        #expect(mode("w") == 0o0777, "write by nobody: \(String(describing: mode("w")))")
        let t = asNobody("truncate -s 3 '\(m)/t'")
        #expect(t.ok, "\(t)")
        #expect(mode("t") == 0o0777, "truncate by nobody: \(String(describing: mode("t")))")
        let o = asNobody("printf y > '\(m)/o'")
        #expect(o.ok, "\(o)")
        #expect(mode("o") == 0o0777, "O_TRUNC open by nobody: \(String(describing: mode("o")))")
        let f = asNobody("fallocate -l 65536 '\(m)/f'")
        #expect(f.ok, "\(f)")
        #expect(mode("f") == 0o0777, "fallocate by nobody: \(String(describing: mode("f")))")
        #expect(E2E.readText(m + "/o") == "y")
        // Set-group-ID without group-execute, written by a member of the group: kept (as on ext4).
        let g = asNobody("printf z >> '\(m)/g'")
        #expect(g.ok, "\(g)")
        #expect(mode("g") == 0o2767, "write by a group member: \(String(describing: mode("g")))")

        let fd = open(m + "/r", O_WRONLY | O_APPEND)
        #expect(fd >= 0)
        #expect(Glibc.write(fd, "root", 4) == 4)
        #expect(ftruncate(fd, 2) == 0)
        close(fd)
        #expect(mode("r") == 0o6777, "write and truncate by root keep the bits: \(String(describing: mode("r")))")

        #expect(chown(m + "/c", 65534, 65534) == 0)
        #expect(mode("c") == 0o0777, "chown by root: \(String(describing: mode("c")))")

        try sb.remount(options: options)
        #expect(mode("w") == 0o0777 && mode("t") == 0o0777 && mode("o") == 0o0777 && mode("c") == 0o0777 && mode("f") == 0o0777)
        #expect(mode("r") == 0o6777 && mode("g") == 0o2767)
        #expect(E2E.read(m + "/w").map { String(decoding: $0, as: UTF8.self) } == "0123456789x")
        #expect(E2E.read(m + "/t")?.count == 3)
    }

    /// A set-user-ID program that another user just wrote to has lost the bit for exec too, not only in the
    /// store: the kernel is told at once (it keeps the mode it cached across a write), so the program runs as
    /// the writer, as on ext4 (a mount with `suid`).
    @Test(arguments: ["allow_other,suid", "allow_other,suid,no_writeback_cache"])
    func aSetUserIDProgramWrittenByAnotherUserRunsAsThatUser(options: String) throws {
        guard let sb = try Self.mountForOtherUsers("setid-exec", options: options) else { return }
        defer { sb.cleanup() }
        let m = sb.mnt
        let copy = E2E.run("/bin/cp", ["/usr/bin/id", m + "/idsu"])
        try #require(copy.ok, "\(copy)")
        #expect(chmod(m + "/idsu", 0o4777) == 0)
        #expect(E2E.statOf(m + "/idsu").map { $0.st_mode & 0o7777 } == 0o4777)  // cached by the kernel now
        let run = Self.asNobody("printf '\\0' >> '\(m)/idsu' && '\(m)/idsu' -u")
        #expect(run.ok, "\(run)")
        #expect(run.stdout.trimmingCharacters(in: .whitespacesAndNewlines) == "65534", "ran as \(run.stdout) after nobody wrote to it")
        #expect(E2E.statOf(m + "/idsu").map { $0.st_mode & 0o7777 } == 0o0777)
    }

    @Test func withoutAllowOtherOtherUsersAreShutOut() throws {
        guard E2E.isRoot else {
            print("skipped: needs root to act as another user")
            return
        }
        let sb = try Sandbox("noallow")
        defer { sb.cleanup() }
        chmod(sb.root, 0o755)
        try sb.initAndMount()
        #expect(chmod(sb.mnt, 0o755) == 0)
        let ls = E2E.run("/usr/sbin/runuser", ["-u", "nobody", "--", "/bin/ls", sb.mnt])
        #expect(!ls.ok && ls.stderr.contains("Permission denied"), "\(ls)")
    }
}

extension E2E {
    /// `coffer unmount DIR` for a sandbox's second mountpoint.
    static func unmount(_ sb: Sandbox, _ mountpoint: String) -> RunResult { sb.unmount(mountpoint) }
}
