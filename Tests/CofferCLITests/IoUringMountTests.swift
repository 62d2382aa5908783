import Foundation
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// FUSE over io_uring (FUSERing): when the kernel's fuse module offers it (`enable_uring`, root only), a mount
/// takes its requests through ring entries, and what a user does works as through /dev/fuse: large writes and
/// reads (a whole payload buffer), names, listings, links, xattrs, renames, and `no_uring` keeps /dev/fuse.
/// `make test` also runs the mount suites with the knob on (its io_uring phase).
@Suite(
    "FUSE over io_uring", .serialized,
    .enabled(if: E2E.fuseAvailable && RingKnob.writable, "the kernel has no FUSE over io_uring, or this is not root"))
struct IoUringMountTests {
    /// Turns the kernel's knob on for `body` and puts back what it was.
    static func withRingsOffered<T>(_ body: () throws -> T) throws -> T {
        let knob = RingKnob.path
        let before = (try? String(contentsOfFile: knob, encoding: .utf8))?.trimmingCharacters(in: .whitespacesAndNewlines) ?? "N"
        try E2E.write(knob, "Y")
        defer { try? E2E.write(knob, before) }
        return try body()
    }

    static let workload = #"""
        import hashlib, os, sys
        m = sys.argv[1]
        big = os.urandom(3 * 1024 * 1024 + 12345)
        with open(m + "/big", "wb") as f: f.write(big)
        os.sync()
        with open(m + "/big", "rb") as f:
            if hashlib.sha256(f.read()).digest() != hashlib.sha256(big).digest(): sys.exit("big file differs")
        fd = os.open(m + "/big", os.O_RDONLY)
        for off in (0, 4096, 1 << 20, 3 << 20):
            if os.pread(fd, 5000, off) != big[off:off + 5000]: sys.exit(f"pread at {off} differs")
        os.close(fd)
        os.mkdir(m + "/d")
        for i in range(300):
            with open(f"{m}/d/f{i:03}", "w") as f: f.write(f"file {i}\n")
        if sorted(os.listdir(m + "/d")) != [f"f{i:03}" for i in range(300)]: sys.exit("listing differs")
        os.rename(m + "/d/f000", m + "/d/renamed")
        os.link(m + "/d/f001", m + "/hard")
        os.symlink("d/f002", m + "/sym")
        if open(m + "/sym").read() != "file 2\n": sys.exit("symlink read differs")
        os.setxattr(m + "/d/f003", "user.k", b"v" * 3000)
        if os.getxattr(m + "/d/f003", "user.k") != b"v" * 3000: sys.exit("xattr differs")
        os.unlink(m + "/d/f004")
        try:
            os.stat(m + "/d/f004"); sys.exit("unlinked file still there")
        except FileNotFoundError: pass
        print("ok")
        """#

    @Test func aMountServesThroughTheRingsAndEverythingWorks() throws {
        let sb = try Sandbox("uring")
        defer { sb.cleanup() }
        try #require(sb.initContainer().ok)
        try Self.withRingsOffered {
            let daemon = try sb.foregroundMount(logLevel: "info")
            defer { daemon.stop() }
            let python = try #require(E2E.python, "python3 is needed for the workload")
            let r = E2E.run(python, ["-c", Self.workload, sb.mnt], timeout: 120)
            #expect(r.ok && r.stdout.contains("ok"), "\(r)")
            #expect(sb.unmount().ok)
            #expect(daemon.waitForExit(30) == 0)
            #expect(daemon.stderr.contains("io_uring entries started"), "\(daemon.stderr.suffix(800))")
            let served = daemon.stderr.split(separator: "\n").first { $0.contains("requests came through io_uring") }
            let count = served.flatMap { line in line.split(separator: " ").compactMap { Int($0) }.first } ?? 0
            #expect(count > 1000, "requests through the rings: \(served ?? "no line") in \(daemon.stderr.suffix(800))")
        }
        // The same content through /dev/fuse, and fsck agrees.
        try #require(sb.mount().ok)
        #expect(E2E.sh("test \"$(cat \(sb.mnt)/d/renamed)\" = 'file 0' && test -L \(sb.mnt)/sym && test -f \(sb.mnt)/hard").ok)
        #expect(sb.unmount().ok)
        let fsck = E2E.coffer(["fsck", sb.container, "--passfile", sb.passfile])
        #expect(fsck.ok, "\(fsck)")
    }

    /// The kernel refuses entries whose buffers are smaller than the connection's limit (forced here with a
    /// test switch): it turns io_uring off for the connection, and the mount serves through /dev/fuse instead of
    /// leaving its callers waiting for entries that never come.
    @Test func aRefusedRegistrationFallsBackToDevFuse() throws {
        let sb = try Sandbox("uringrefused")
        defer { sb.cleanup() }
        try #require(sb.initContainer().ok)
        try Self.withRingsOffered {
            let daemon = try sb.foregroundMount(logLevel: "info", environment: ["COFFER_TEST_RING_PAYLOAD=4096"])
            defer { daemon.stop() }
            try E2E.write(sb.mnt + "/f", "through /dev/fuse after all")
            #expect(E2E.readText(sb.mnt + "/f") == "through /dev/fuse after all")
            #expect(sb.unmount().ok)
            #expect(daemon.waitForExit(30) == 0)
            #expect(daemon.stderr.contains("the kernel refused an io_uring entry"), "\(daemon.stderr.suffix(800))")
            #expect(daemon.stderr.contains(" 0 requests came through io_uring"), "\(daemon.stderr.suffix(800))")
        }
    }

    /// An entry that fails once the rings serve (a test switch: the one that takes request 3,000 handles it and
    /// does not commit its reply) ends the session, and nothing answered is lost: every file created before the
    /// failure is there, fsck is clean, and the daemon exits 1 saying why instead of ending quietly with 0. The
    /// other entries first take the kernel's cached writes (a syncfs, bounded at 10 s: it waits for the file whose
    /// request the failed entry holds), so a file still open and never fsynced is usually whole after a remount
    /// (it was empty before); it is always a prefix of what was written.
    @Test func anEntryThatFailsEndsTheSessionKeepingWhatWasWritten() throws {
        let python = try #require(E2E.python, "python3 is needed for the writer")
        let sb = try Sandbox("uringfail")
        defer { sb.cleanup() }
        try #require(sb.initContainer().ok)
        let data = E2E.randomBytes(3_000_000)
        try E2E.write(sb.root + "/src", data)
        try Self.withRingsOffered {
            let daemon = try sb.foregroundMount(environment: ["COFFER_TEST_RING_FAIL_AFTER=3000"])
            defer { daemon.stop() }
            let writer = #"""
                import os, sys, time
                m, src = sys.argv[1:3]
                held = os.open(m + "/held", os.O_WRONLY | os.O_CREAT, 0o644)
                data = memoryview(open(src, "rb").read())
                while data:
                    data = data[os.write(held, data):]
                made = 0
                for i in range(20000):
                    try:
                        with open(f"{m}/f{i}", "w") as f: f.write(str(i))
                    except OSError: break
                    made += 1
                print("made", made)
                try: os.close(held)
                except OSError: pass
                """#
            let r = E2E.run(python, ["-c", writer, sb.mnt, sb.root + "/src"], timeout: 120)
            let made = r.stdout.split(separator: " ").last.flatMap { Int($0.trimmingCharacters(in: .whitespacesAndNewlines)) } ?? 0
            #expect(made > 100 && made < 20000, "files made before the failure: \(r)")
            #expect(daemon.waitForExit(30) == 1, "\(daemon.stderr.suffix(800))")
            #expect(daemon.stderr.contains("ended: an io_uring entry failed"), "\(daemon.stderr.suffix(800))")
            #expect(E2E.wait(10) { !E2E.isMounted(sb.mnt) }, "still mounted after the session ended")
            try #require(sb.mount(options: "no_uring").ok)
            // The flush is bounded and best effort (under load about one run in eight kept only the 2 MiB the
            // kernel had written back before the failure); what is there is always what was written.
            let held = try #require(E2E.read(sb.mnt + "/held"))
            let prefix = held.count >= 2 << 20 && held.count <= data.count && held.elementsEqual(data.prefix(held.count))
            #expect(prefix, "the open file holds \(held.count) bytes that are not a prefix of the \(data.count) written")
            let missing = (0..<made).filter { E2E.readText(sb.mnt + "/f\($0)") != "\($0)" }
            #expect(missing.isEmpty, "files answered before the failure are missing or wrong: \(missing.prefix(10))")
            #expect(sb.unmount().ok)
        }
        let fsck = E2E.coffer(["fsck", sb.container, "--passfile", sb.passfile])
        #expect(fsck.ok, "\(fsck)")
    }

    @Test func noUringKeepsDevFuse() throws {
        let sb = try Sandbox("nouring")
        defer { sb.cleanup() }
        try #require(sb.initContainer().ok)
        try Self.withRingsOffered {
            let daemon = try sb.foregroundMount(options: "no_uring", logLevel: "info")
            defer { daemon.stop() }
            try E2E.write(sb.mnt + "/f", "through /dev/fuse")
            #expect(sb.unmount().ok)
            #expect(daemon.waitForExit(30) == 0)
            #expect(!daemon.stderr.contains("io_uring"), "\(daemon.stderr.suffix(800))")
        }
    }
}

/// The fuse module's switch for FUSE over io_uring (Linux 6.14+).
enum RingKnob {
    static let path = "/sys/module/fuse/parameters/enable_uring"
    static var writable: Bool { access(path, W_OK) == 0 }
}
