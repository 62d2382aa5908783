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
