import Foundation
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// Random reads through a real mount always return the current bytes: after writes, truncates and punched
/// holes (compared with a plain copy on the local disk), with and without the writeback cache, and on a
/// read-only mount, where the rest of each decrypted chunk goes to the kernel's page cache (PageCacheFiller).
@Suite("Random reads through a mount", .enabled(if: E2E.fuseAvailable, "/dev/fuse is not usable"))
struct RandomReadMountTests {
    /// argv: local, mounted, mode (mutate | read), seed. Every read compares the two files.
    static let program = #"""
        import ctypes, os, random, sys
        local, mounted, mode, seed = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
        rng = random.Random(seed)
        libc = ctypes.CDLL(None, use_errno=True)
        PUNCH = 0x02 | 0x01  # FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE
        fds = [os.open(p, os.O_RDWR if mode == "mutate" else os.O_RDONLY) for p in (local, mounted)]
        def check(what):
            size = os.fstat(fds[0]).st_size
            if os.fstat(fds[1]).st_size != size: sys.exit(f"{what}: size {os.fstat(fds[1]).st_size} != {size}")
            for _ in range(40):
                off = rng.randrange(0, size + 4096) // 4096 * 4096 if rng.random() < 0.7 else rng.randrange(0, size + 100)
                n = rng.choice([1, 100, 4096, 4096, 5000, 40000])
                a, b = os.pread(fds[0], n, off), os.pread(fds[1], n, off)
                if a != b: sys.exit(f"{what}: pread({n}, {off}) differs (size {size})")
        for step in range(150 if mode == "mutate" else 1):
            size = os.fstat(fds[0]).st_size
            if mode == "mutate":
                op = rng.choice(["write", "write", "write", "truncate", "punch"])
                if op == "write":
                    off, data = rng.randrange(0, size + 70000), os.urandom(rng.choice([1, 300, 4096, 8192, 33000, 70000]))
                    for fd in fds: os.pwrite(fd, data, off)
                elif op == "truncate":
                    n = rng.randrange(0, 1_200_000)
                    for fd in fds: os.ftruncate(fd, n)
                else:
                    off, n = rng.randrange(0, size + 1), rng.randrange(1, 100_000)
                    for fd in fds:
                        if libc.fallocate(fd, PUNCH, ctypes.c_long(off), ctypes.c_long(n)) != 0: sys.exit(f"fallocate: errno {ctypes.get_errno()}")
                check(f"step {step} after {op}")
            else:
                for _ in range(50): check("read-only")
        """#

    /// argv: mounted file, chunk index. Reads the chunk's fourth page, then waits for all its pages to be in the
    /// kernel's page cache (mincore on a mapping of the file); readahead never brings the pages before a read.
    static let residentProgram = #"""
        import ctypes, mmap, os, sys, time
        path, chunk = sys.argv[1], int(sys.argv[2])
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
        fd = os.open(path, os.O_RDONLY)
        size = os.fstat(fd).st_size
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        pages = (size + 4095) // 4096
        vec = (ctypes.c_ubyte * pages)()
        def resident():
            if libc.mincore(ctypes.c_void_p(addr), ctypes.c_size_t(size), vec) != 0: sys.exit(f"mincore: errno {ctypes.get_errno()}")
            return [i for i in range(pages) if vec[i] & 1]
        if resident(): sys.exit(f"pages resident before any read: {resident()}")
        os.pread(fd, 4096, chunk * 32768 + 3 * 4096)
        want = list(range(chunk * 8, chunk * 8 + 8))
        for _ in range(200):
            if set(want) <= set(resident()): sys.exit(0)
            time.sleep(0.01)
        sys.exit(f"resident pages {resident()}, expected {want}")
        """#

    @Test(arguments: [nil, "no_writeback_cache"] as [String?])
    func randomReadsAfterChangesMatchTheLocalDisk(options: String?) throws {
        guard E2E.python != nil else {
            Issue.record("python3 missing (make test-deps installs it)")
            return
        }
        let sb = try Sandbox("randread")
        defer { sb.cleanup() }
        try sb.initAndMount(options: options)
        let plain = sb.root + "/plain"
        try #require(mkdir(plain, 0o755) == 0)
        let local = plain + "/f", mounted = sb.mnt + "/f"
        try #require(E2E.run("/bin/dd", ["if=/dev/urandom", "of=\(local)", "bs=65536", "count=16", "status=none"]).ok)
        try #require(E2E.run("/bin/cp", [local, mounted]).ok)
        for seed in 1...2 {
            let r = E2E.py(Self.program, [local, mounted, "mutate", "\(seed)"])
            #expect(r.ok, "seed \(seed): \(r)")
        }
        // Read-only: the same file through a mount that fills the page cache, still the current bytes.
        try sb.remount(options: "ro")
        let r = E2E.py(Self.program, [local, mounted, "read", "3"])
        #expect(r.ok, "read-only: \(r)")
        #expect(E2E.run("/usr/bin/cmp", [local, mounted]).ok)
    }

    @Test func aReadOnlyMountHandsTheRestOfTheChunkToThePageCache() throws {
        guard E2E.python != nil else {
            Issue.record("python3 missing (make test-deps installs it)")
            return
        }
        let sb = try Sandbox("pagefill")
        defer { sb.cleanup() }
        try sb.initAndMount()
        try #require(E2E.run("/bin/dd", ["if=/dev/urandom", "of=\(sb.mnt)/f", "bs=65536", "count=4", "status=none"]).ok)
        try sb.remount(options: "ro")
        let r = E2E.py(Self.residentProgram, [sb.mnt + "/f", "2"])
        #expect(r.ok, "\(r)")
    }
}
