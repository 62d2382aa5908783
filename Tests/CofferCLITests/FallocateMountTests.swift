import Foundation
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// fallocate(1) through a real mount: punching holes, digging holes and zeroing ranges give the
/// same bytes as on the local disk, and the punched space is given back (fewer blocks).
@Suite("fallocate through a mount", .enabled(if: E2E.fuseAvailable, "/dev/fuse is not usable"))
struct FallocateMountTests {
    @Test func punchDigAndZeroMatchTheLocalDisk() throws {
        let fallocate = try #require(E2E.which("fallocate"), "fallocate (util-linux) is not installed")
        let sb = try Sandbox("fallocate")
        defer { sb.cleanup() }
        try sb.initAndMount()
        let plain = sb.root + "/plain"
        try #require(mkdir(plain, 0o755) == 0)
        let local = plain + "/f", mounted = sb.mnt + "/f"
        try #require(E2E.run("/bin/dd", ["if=/dev/urandom", "of=\(local)", "bs=65536", "count=32", "status=none"]).ok)
        try #require(E2E.run("/bin/cp", [local, mounted]).ok)
        try #require(E2E.run("/bin/sync", [mounted]).ok)
        let blocksBefore = try #require(E2E.statOf(mounted)?.st_blocks)

        func both(_ args: [String], _ what: String) {
            for path in [local, mounted] {
                let r = E2E.run(fallocate, args + [path])
                #expect(r.ok, "\(what) on \(path): \(r)")
            }
            let cmp = E2E.run("/usr/bin/cmp", [local, mounted])
            #expect(cmp.ok, "after \(what): \(cmp)")
        }
        both(["--punch-hole", "--offset", "100000", "--length", "300000"], "punch-hole")
        both(["--zero-range", "--offset", "700000", "--length", "5000"], "zero-range")
        both(["--zero-range", "--offset", "2000000", "--length", "100000"], "zero-range past the end")
        for path in [local, mounted] {
            let r = E2E.run("/bin/dd", ["if=/dev/zero", "of=\(path)", "bs=65536", "count=4", "seek=12", "conv=notrunc", "status=none"])
            #expect(r.ok, "\(r)")
        }
        both(["--dig-holes"], "dig-holes")
        try #require(E2E.run("/bin/sync", [mounted]).ok)
        #expect(E2E.statOf(mounted)?.st_size == E2E.statOf(local)?.st_size)

        try sb.remount()
        let cmp = E2E.run("/usr/bin/cmp", [local, mounted])
        #expect(cmp.ok, "after a remount: \(cmp)")
        let blocksAfter = try #require(E2E.statOf(mounted)?.st_blocks)
        // At least the punched 300,000 bytes and the dug 256 KiB came back (whole 32 KiB chunks).
        #expect(
            blocksAfter + Int((300_000 - 65_536 + 196_608) / 512) <= blocksBefore,
            "blocks before \(blocksBefore), after \(blocksAfter)")
    }

    /// SEEK_DATA and SEEK_HOLE through a mount: a sparse file's hole is skipped (a tester found `cp --sparse` of a
    /// file with data at 5 GiB reading 5 GiB of zeros), and data written a moment ago, still in the kernel's
    /// writeback cache, is data: FUSE_LSEEK does not write it back by itself, so a copy that trusted the
    /// daemon's holes alone would leave it out. Over io_uring the kernel answers (data everywhere, a hole at the
    /// end), which is checked too.
    @Test func seekDataAndHoleSkipHolesAndSeeWhatIsNotWrittenBackYet() throws {
        let sb = try Sandbox("seekhole")
        defer { sb.cleanup() }
        let rings = (try? String(contentsOfFile: RingKnob.path, encoding: .utf8))?.hasPrefix("Y") == true
        try sb.initAndMount()
        let script = sb.root + "/seek.py"
        try E2E.write(
            script,
            """
            import os, sys
            os.chdir(sys.argv[1])
            with open("sparse", "wb") as f:
                f.truncate(1 << 30)
                f.seek(1 << 30)
                f.write(b"x")
            fd = os.open("sparse", os.O_RDONLY)
            print(os.lseek(fd, 0, os.SEEK_DATA), os.lseek(fd, 0, os.SEEK_HOLE), os.lseek(fd, 1 << 30, os.SEEK_HOLE))
            try:
                os.lseek(fd, (1 << 30) + 1, os.SEEK_DATA)
                print("no ENXIO")
            except OSError as e:
                print(e.strerror)
            os.close(fd)
            fd = os.open("fresh", os.O_CREAT | os.O_RDWR, 0o644)
            os.ftruncate(fd, 512 << 20)
            os.pwrite(fd, b"y" * 5000, 100 << 20)
            print(os.lseek(fd, 0, os.SEEK_DATA), os.lseek(fd, 100 << 20, os.SEEK_HOLE))
            os.close(fd)
            """)
        let r = E2E.sh("python3 '\(script)' '\(sb.mnt)'")
        let lines = r.stdout.split(separator: "\n").map(String.init)
        #expect(r.ok && lines.count == 3, "\(r)")
        #expect(lines.first == (rings ? "0 1073741825 1073741825" : "1073741824 0 1073741825"), "the sparse file: \(lines)")
        #expect(lines.dropFirst().first == "No such device or address", "SEEK_DATA past the data: \(lines)")
        #expect(lines.last == (rings ? "0 536870912" : "104857600 104890368"), "data not written back yet is data: \(lines)")
        let copy = sb.root + "/fresh.copy"
        let cp = E2E.run("/bin/cp", ["--sparse=always", sb.mnt + "/fresh", copy])
        #expect(cp.ok, "\(cp)")
        #expect(E2E.run("/usr/bin/cmp", [sb.mnt + "/fresh", copy]).ok, "the sparse copy has every byte")
    }

    /// Seeks on files whose written pages the kernel still holds, by more processes at once than the mount has
    /// workers: each seek has the kernel write those pages back first, and the WRITEs that takes must find a
    /// worker. A tester froze the mount for good with three (the default workers on two cores) when the seeks
    /// waited on the workers.
    @Test func manySeeksAtOnceOnFilesNotWrittenBackDoNotFreezeTheMount() throws {
        let sb = try Sandbox("seekmany")
        defer { sb.cleanup() }
        try sb.initAndMount(options: "max_threads=2")
        let script = sb.root + "/seeks.py"
        try E2E.write(
            script,
            """
            import os, sys
            mnt, n = sys.argv[1], int(sys.argv[2])
            r, w = os.pipe()
            kids = []
            for k in range(n):
                pid = os.fork()
                if pid == 0:
                    os.close(w)
                    fd = os.open(os.path.join(mnt, "f%d" % k), os.O_CREAT | os.O_RDWR | os.O_TRUNC, 0o644)
                    os.pwrite(fd, b"x" * (4 << 20), 1 << 20)
                    os.read(r, 1)
                    at = os.lseek(fd, 0, os.SEEK_DATA)
                    os._exit(0 if at <= 1 << 20 else 1)
                kids.append(pid)
            os.close(r)
            os.write(w, b"g" * n)
            bad = sum(1 for p in kids if os.waitpid(p, 0)[1] != 0)
            print("bad", bad)
            """)
        for round in 1...3 {
            let r = E2E.sh("timeout 60 python3 '\(script)' '\(sb.mnt)' 8", timeout: 90)
            #expect(r.ok && r.stdout.contains("bad 0"), "round \(round): \(r)")
            if !r.ok { break }
        }
    }

    /// On a container whose disk cannot hold the range, fallocate fails with ENOSPC as on a local disk and
    /// changes nothing (the size stays); a range that fits is taken, with or without KEEP_SIZE, and
    /// the file then holds what is written into it. Ranges inside the file need no room.
    @Test(
        .enabled(if: E2E.isRoot, "a tmpfs of fixed size needs root"),
        .enabled(if: !TestEngine.isPostgres, "the room checked is the local disk's; a server's disk is not the client's"))
    func allocationTheDiskCannotHoldIsRefused() throws {
        let fallocate = try #require(E2E.which("fallocate"), "fallocate (util-linux) is not installed")
        let sb = try Sandbox("fallocatefull")
        defer { sb.cleanup() }
        let container = try sb.smallDisk("48m") + "/c"
        try #require(sb.initContainer(container: container).ok)
        try #require(sb.mount(container: container).ok)
        let f = sb.mnt + "/f"
        try E2E.write(f, "head")
        let tooBig = E2E.run(fallocate, ["--length", "200MiB", f])
        #expect(!tooBig.ok && tooBig.stderr.contains("No space left"), "\(tooBig)")
        #expect(E2E.statOf(f)?.st_size == 4, "a refused fallocate changed the size")
        let keepSize = E2E.run(fallocate, ["--keep-size", "--offset", "4", "--length", "1GiB", f])
        #expect(!keepSize.ok && keepSize.stderr.contains("No space left"), "\(keepSize)")
        let fits = E2E.run(fallocate, ["--length", "8MiB", f])
        #expect(fits.ok, "\(fits)")
        #expect(E2E.statOf(f)?.st_size == 8 << 20)
        let inside = E2E.run(fallocate, ["--offset", "0", "--length", "1MiB", f])
        #expect(inside.ok, "\(inside)")
        let data = E2E.randomBytes(1 << 20)
        let h = try #require(FileHandle(forWritingAtPath: f))
        try h.seek(toOffset: 3 << 20)
        try h.write(contentsOf: Data(data))
        try h.synchronize()
        try h.close()
        #expect(sb.unmount().ok)
        try #require(sb.mount(container: container).ok)
        let back = try #require(E2E.read(f))
        #expect(back.count == 8 << 20 && back[(3 << 20)..<(4 << 20)].elementsEqual(data) && back.prefix(4).elementsEqual(Array("head".utf8)))
        #expect(sb.unmount().ok)
    }
}
