import CofferTestSupport
import Foundation
import Testing

#if canImport(Glibc)
    import Glibc
#endif

// Issue 15, "mtime changes across a remount after fallocate": with the writeback cache the kernel stamps a
// regular file's mtime and ctime itself (write(2), mmap writes, truncate, fallocate) and shows its own times
// until the inode leaves its cache; the daemon's stored times are what the next mount shows. They must be
// the same. A seeded random mix of buffered, mmap, O_DIRECT and copy_file_range writes, fallocate (plain
// and KEEP_SIZE), truncate and ftruncate, xattrs, chmod, links, renames and utimensat, with short pauses
// so that operations fall on different clock ticks, then `sync`, a full stat manifest (mode, owner, size,
// nlink, mtime and ctime to the nanosecond), a remount, and the manifest again: every field must match.

@Suite(
    "Times across a remount", .enabled(if: E2E.fuseAvailable, "/dev/fuse is not usable"),
    .enabled(if: E2E.python != nil, "python3 drives the syscalls"))
struct RemountTimesTests {
    /// The issue's reproduction: 100 kB written, 10 ms, posix_fallocate(90000, 400000), close; 30 files.
    @Test func fallocateAfterAWriteKeepsItsTimes() throws {
        try roundTrip(label: "falloc", options: nil, program: RemountTimesScripts.fallocateAfterWrite, arguments: [])
    }

    @Test(arguments: [nil, "no_writeback_cache"])
    func randomOperationsKeepEveryStatField(options: String?) throws {
        let seed = UInt64.random(in: 1...1_000_000)
        try roundTrip(
            label: "times", options: options, program: RemountTimesScripts.randomOperations,
            arguments: ["\(seed)", "400"], seed: seed)
    }

    /// Runs `program` on a fresh mount, syncs, takes the manifest, remounts, and compares.
    func roundTrip(label: String, options: String?, program: String, arguments: [String], seed: UInt64? = nil) throws {
        let sb = try Sandbox(label)
        defer { sb.cleanup() }
        var env = ProcessInfo.processInfo.environment
        env["COFFER_STATE_DIR"] = sb.root + "/state"
        func mount() throws {
            var args = ["mount", sb.container, sb.mnt, "--passfile", sb.passfile]
            if let options { args += ["-o", options] }
            let m = E2E.run(E2E.coffer, args, environment: env)
            sb.noteDaemon()
            try #require(m.ok, "mount: \(m)")
        }
        func unmount() throws {
            let u = E2E.run(E2E.coffer, ["unmount", sb.mnt], environment: env)
            try #require(u.ok, "unmount: \(u)")
        }
        try #require(sb.initContainer().ok)
        try mount()
        let run = E2E.py(program, [sb.mnt] + arguments, timeout: 300)
        try #require(run.ok, "seed \(seed.map(String.init) ?? "-"): \(run)")
        let before = try manifest(sb.mnt)
        try #require(before.count > 2, "the program left too little to compare: \(before.count) paths")
        try unmount()
        try mount()
        let after = try manifest(sb.mnt)
        try unmount()

        var differences: [String] = []
        for path in Set(before.keys).union(after.keys).sorted() where before[path] != after[path] {
            differences.append("\(path): before \(before[path] ?? "missing"), after \(after[path] ?? "missing")")
        }
        #expect(
            differences.isEmpty,
            """
            seed \(seed.map(String.init) ?? "-"), options \(options ?? "default"): \(differences.count) of \(before.count) \
            paths changed across the remount:
            \(differences.prefix(20).joined(separator: "\n"))
            """)
    }

    /// `sync`, then path -> "mode uid gid size nlink mtime ctime" for every path (lstat, nanoseconds).
    func manifest(_ mnt: String) throws -> [String: String] {
        let r = E2E.py(RemountTimesScripts.manifest, [mnt])
        try #require(r.ok, "manifest: \(r)")
        var out: [String: String] = [:]
        for line in r.stdout.split(separator: "\n") {
            guard let tab = line.firstIndex(of: "\t") else { continue }
            out[String(line[..<tab])] = String(line[line.index(after: tab)...])
        }
        return out
    }
}

enum RemountTimesScripts {
    static let manifest = #"""
        import os, sys
        mnt = sys.argv[1]
        os.sync()
        for dirpath, dirnames, filenames in os.walk(mnt):
            for name in [""] + dirnames + filenames:
                if name == "" and dirpath != mnt:
                    continue
                p = os.path.join(dirpath, name) if name else dirpath
                st = os.lstat(p)
                print("%s\t%o %d %d %d %d %d %d" % (os.path.relpath(p, mnt), st.st_mode, st.st_uid, st.st_gid,
                      st.st_size, st.st_nlink, st.st_mtime_ns, st.st_ctime_ns))
        """#

    static let fallocateAfterWrite = #"""
        import os, sys, time
        mnt = sys.argv[1]
        for i in range(30):
            fd = os.open(os.path.join(mnt, "f%02d" % i), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.write(fd, os.urandom(100000))
            time.sleep(0.01)
            os.posix_fallocate(fd, 90000, 400000)
            os.close(fd)
        """#

    /// argv: mountpoint, seed, number of operations. Every operation must succeed (a failure is a test failure).
    static let randomOperations = #"""
        import ctypes, mmap, os, random, sys, time
        mnt, seed, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
        rng = random.Random(seed)
        libc = ctypes.CDLL(None, use_errno=True)
        libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]
        FALLOC_FL_KEEP_SIZE = 1
        for d in ("a", "b"):
            os.mkdir(os.path.join(mnt, d))
        files = []   # relative paths of regular files that exist
        serial = [0]

        def new_name():
            serial[0] += 1
            return "%s/f%03d" % (rng.choice(["a", "b"]), serial[0])

        def path(rel):
            return os.path.join(mnt, rel)

        def create():
            rel = new_name()
            with open(path(rel), "wb") as f:
                f.write(rng.randbytes(rng.randrange(0, 70000)))
            files.append(rel)

        def buffered_write():
            with open(path(rng.choice(files)), "r+b") as f:
                f.seek(rng.randrange(0, 200000))
                f.write(rng.randbytes(rng.randrange(1, 50000)))

        def append():
            with open(path(rng.choice(files)), "ab") as f:
                f.write(rng.randbytes(rng.randrange(1, 9000)))

        def mmap_write():
            rel = rng.choice(files)
            if os.path.getsize(path(rel)) == 0:
                os.truncate(path(rel), 4096)
            fd = os.open(path(rel), os.O_RDWR)
            size = os.fstat(fd).st_size
            m = mmap.mmap(fd, size)
            at = rng.randrange(0, size)
            n = min(size - at, rng.randrange(1, 5000))
            m[at:at + n] = rng.randbytes(n)
            if rng.random() < 0.5:
                m.flush()
            m.close()
            os.close(fd)

        def direct_write():
            fd = os.open(path(rng.choice(files)), os.O_RDWR | os.O_DIRECT)
            n = 4096 * rng.randrange(1, 4)
            buf = mmap.mmap(-1, n)   # page aligned
            buf.write(rng.randbytes(n))
            os.pwrite(fd, buf, 4096 * rng.randrange(0, 40))
            buf.close()
            os.close(fd)

        def copy_range():
            src, dst = rng.choice(files), rng.choice(files)
            size = os.path.getsize(path(src))
            if size == 0 or os.stat(path(src)).st_ino == os.stat(path(dst)).st_ino:
                return   # overlapping ranges of one file are EINVAL
            fi, fo = os.open(path(src), os.O_RDONLY), os.open(path(dst), os.O_WRONLY)
            at = rng.randrange(0, size)
            os.copy_file_range(fi, fo, rng.randrange(1, size - at + 1), at, rng.randrange(0, 100000))
            os.close(fi)
            os.close(fo)

        def falloc():
            fd = os.open(path(rng.choice(files)), os.O_RDWR)
            off, length = rng.randrange(0, 300000), rng.randrange(1, 300000)
            if rng.random() < 0.7:
                os.posix_fallocate(fd, off, length)
            elif libc.fallocate(fd, FALLOC_FL_KEEP_SIZE, off, length) != 0:
                raise OSError(ctypes.get_errno(), "fallocate KEEP_SIZE")
            os.close(fd)

        def falloc_after_write():   # the issue's sequence
            fd = os.open(path(rng.choice(files)), os.O_RDWR)
            os.pwrite(fd, rng.randbytes(rng.randrange(1, 100000)), rng.randrange(0, 100000))
            time.sleep(0.01)
            os.posix_fallocate(fd, rng.randrange(0, 100000), rng.randrange(1, 400000))
            os.close(fd)

        def trunc():
            rel = rng.choice(files)
            size = rng.choice([0, os.path.getsize(path(rel)), rng.randrange(0, 300000)])
            if rng.random() < 0.5:
                os.truncate(path(rel), size)
            else:
                fd = os.open(path(rel), os.O_RDWR)
                os.ftruncate(fd, size)
                os.close(fd)

        def xattr():
            target = path(rng.choice(files + ["a", "b"]))
            name = "user.k%d" % rng.randrange(3)
            if rng.random() < 0.7:
                os.setxattr(target, name, rng.randbytes(rng.randrange(0, 100)))
            elif name in os.listxattr(target):
                os.removexattr(target, name)

        def chmod():
            os.chmod(path(rng.choice(files)), rng.choice([0o600, 0o644, 0o640, 0o755]))

        def link():
            src, rel = rng.choice(files), new_name()
            os.link(path(src), path(rel))
            files.append(rel)

        def unlink():
            if len(files) > 3:
                rel = rng.choice(files)
                os.unlink(path(rel))
                files.remove(rel)

        def rename():
            src = rng.choice(files)
            if rng.random() < 0.3 and len(files) > 3:
                dst = rng.choice([f for f in files if f != src])   # over an existing file
                files.remove(dst)
            else:
                dst = new_name()
            os.rename(path(src), path(dst))
            files[files.index(src)] = dst

        def utime():
            t = rng.randrange(10**18, 2 * 10**18)
            os.utime(path(rng.choice(files)), ns=(t, t + rng.randrange(10**9)))

        ops = [(create, 2), (buffered_write, 5), (append, 2), (mmap_write, 3), (direct_write, 2), (copy_range, 2),
               (falloc, 3), (falloc_after_write, 1), (trunc, 3), (xattr, 3), (chmod, 1), (link, 1), (unlink, 1),
               (rename, 2), (utime, 1)]
        weights = [w for _, w in ops]
        for _ in range(4):
            create()
        for i in range(count):
            op = rng.choices(ops, weights)[0][0]
            try:
                op()
            except OSError as e:
                sys.exit("operation %d (%s) failed: %s" % (i, op.__name__, e))
            if rng.random() < 0.3:
                time.sleep(rng.random() * 0.006)   # let the next operation fall on another clock tick
        """#
}
