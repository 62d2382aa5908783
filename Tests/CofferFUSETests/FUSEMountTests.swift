import CFuse3  // sys/xattr.h (setxattr, getxattr, ...), which Glibc does not export
import CofferFS
import CofferFUSE
import Dispatch
import Foundation
import Glibc
import Logging
import Synchronization
import Testing

// MARK: - Harness

let fuseAvailable = access("/dev/fuse", R_OK | W_OK) == 0
let utimeNow = (1 << 30) - 1  // UTIME_NOW, not exported to Swift

struct HarnessError: Error, CustomStringConvertible {
    let description: String
}

/// A temp dir with an empty mountpoint inside it.
func makeTempMountpoint() throws -> (parent: String, mountpoint: String) {
    var template = Array("/tmp/coffer-fuse-test-XXXXXX".utf8CString)
    guard let made = mkdtemp(&template) else { throw HarnessError(description: "mkdtemp failed") }
    let parent = String(cString: made)
    let mountpoint = parent + "/mnt"
    guard Glibc.mkdir(mountpoint, 0o755) == 0 else { throw HarnessError(description: "mkdir mountpoint failed") }
    return (parent, mountpoint)
}

func removeTree(_ path: String) {
    try? FileManager.default.removeItem(atPath: path)
}

/// The /proc/mounts line whose mountpoint is `path`, split into fields.
func procMountsEntry(_ path: String) -> [String]? {
    guard let text = try? String(contentsOfFile: "/proc/mounts", encoding: .utf8) else { return nil }
    for line in text.split(separator: "\n") {
        let fields = line.split(separator: " ").map(String.init)
        if fields.count >= 4 && fields[1] == path { return fields }
    }
    return nil
}

func deviceOf(_ path: String) -> UInt? {
    var st = stat()
    return stat(path, &st) == 0 ? st.st_dev : nil
}

func runFusermountLazy(_ path: String) {
    let p = Process()
    p.executableURL = URL(fileURLWithPath: "/usr/bin/fusermount3")
    p.arguments = ["-uz", path]
    try? p.run()
    p.waitUntilExit()
}

/// One mounted MemoryFileSystem served by FUSEMount on a background thread.
final class MountedFS: Sendable {
    let fs: MemoryFileSystem
    let parent: String
    let mountpoint: String
    let mount: FUSEMount
    private let ready = DispatchSemaphore(value: 0)
    private let finished = DispatchSemaphore(value: 0)
    private let runError = Mutex<String?>(nil)
    private let readyCount = Atomic<Int>(0)
    private let ended = Atomic<Bool>(false)

    init(fs: MemoryFileSystem = MemoryFileSystem(), configure: (inout FUSEMountOptions) -> Void = { _ in }) throws {
        self.fs = fs
        (parent, mountpoint) = try makeTempMountpoint()
        var options = FUSEMountOptions(fsName: "memfs-test")
        configure(&options)
        var logger = Logger(label: "coffer.fuse.test")
        logger.logLevel = .info
        do {
            mount = try FUSEMount(filesystem: fs, mountpoint: mountpoint, options: options, logger: logger)
        } catch {
            removeTree(parent)
            throw error
        }
    }

    /// Starts `run` on a thread and waits for onReady.
    func start(timeout: Double = 20) throws {
        Thread.detachNewThread { [self] in
            do {
                try mount.run {
                    self.readyCount.add(1, ordering: .relaxed)
                    self.ready.signal()
                }
            } catch {
                runError.withLock { $0 = "\(error)" }
            }
            ended.store(true, ordering: .releasing)
            finished.signal()
        }
        let deadline = Date().addingTimeInterval(timeout)
        while ready.wait(timeout: .now() + 0.05) == .timedOut {
            if ended.load(ordering: .acquiring) || Date() > deadline {
                let err = runError.withLock { $0 } ?? "no error"
                throw HarnessError(
                    description: "mount did not become ready (run \(ended.load(ordering: .acquiring) ? "ended" : "still running"): \(err))")
            }
        }
    }

    /// Asks the loop to end and waits; falls back to `fusermount3 -uz`. Returns true when `run` returned.
    @discardableResult
    func stop(timeout: Double = 20) -> Bool {
        mount.requestExit()
        let ended = finished.wait(timeout: .now() + timeout) == .success
        if !ended || procMountsEntry(mountpoint) != nil {
            runFusermountLazy(mountpoint)
        }
        if ended { finished.signal() }  // keep it signalled for later calls
        return ended
    }

    /// Waits for `run` to return by itself (no requestExit).
    func waitForEnd(timeout: Double) -> Bool {
        let deadline = Date().addingTimeInterval(timeout)
        while !ended.load(ordering: .acquiring) {
            if Date() > deadline { return false }
            usleep(10_000)
        }
        return true
    }

    var error: String? { runError.withLock { $0 } }
    var readyCalls: Int { readyCount.load(ordering: .relaxed) }

    func cleanup() {
        stop()
        removeTree(parent)
    }

    func path(_ name: String) -> String { mountpoint + "/" + name }
}

/// Mounts, runs `body`, and always unmounts; then checks the mount is gone and shutdown ran once.
func withMount(
    fs: MemoryFileSystem = MemoryFileSystem(), configure: (inout FUSEMountOptions) -> Void = { _ in },
    _ body: (MountedFS) throws -> Void
) throws {
    let m = try MountedFS(fs: fs, configure: configure)
    defer { m.cleanup() }
    try m.start()
    #expect(m.readyCalls == 1)
    #expect(procMountsEntry(m.mountpoint) != nil, "mounted after onReady")
    #expect(deviceOf(m.mountpoint) != deviceOf(m.parent), "mountpoint is a different filesystem while mounted")
    try body(m)
    #expect(m.stop(), "run() returned after requestExit")
    #expect(m.error == nil, "run() did not throw: \(m.error ?? "")")
    #expect(procMountsEntry(m.mountpoint) == nil, "no longer in /proc/mounts")
    #expect(deviceOf(m.mountpoint) == deviceOf(m.parent), "mountpoint back on its parent's filesystem")
    #expect(fs.shutdownCount == 1, "shutdown called exactly once")
    #expect(m.readyCalls == 1)
}

/// User and system clock ticks of this process's FUSE worker threads (named by RequestReader), from
/// /proc/self/task/*/stat; fails if there are none (the name is what tells them apart).
func workerCPUTicks() throws -> Int {
    var total = 0, workers = 0
    for tid in try FileManager.default.contentsOfDirectory(atPath: "/proc/self/task") {
        guard let stat = try? String(contentsOfFile: "/proc/self/task/\(tid)/stat", encoding: .utf8),
            let open = stat.firstIndex(of: "("), let close = stat.lastIndex(of: ")")
        else { continue }
        guard stat[stat.index(after: open)..<close] == "coffer-fuse" else { continue }  // RequestReader.workerThreadName
        // Fields after the name: state is the 3rd of the line, utime the 14th, stime the 15th.
        let fields = stat[stat.index(after: close)...].split(separator: " ")
        guard fields.count > 12, let user = Int(fields[11]), let system = Int(fields[12]) else { continue }
        total += user + system
        workers += 1
    }
    try #require(workers > 0, "no coffer-fuse worker threads found")
    return total
}

// MARK: - POSIX helpers

/// Runs a shell command as the user nobody (runuser); its exit status.
func asNobody(_ command: String) throws -> Int32 {
    let p = Process()
    p.executableURL = URL(fileURLWithPath: "/usr/sbin/runuser")
    p.arguments = ["-u", "nobody", "--", "/bin/sh", "-c", command]
    try p.run()
    p.waitUntilExit()
    return p.terminationStatus
}

func writeFile(_ path: String, _ bytes: [UInt8], flags: Int32 = O_WRONLY | O_CREAT | O_TRUNC) throws {
    let fd = open(path, flags, 0o644)
    guard fd >= 0 else { throw HarnessError(description: "open \(path): \(String(cString: strerror(errno)))") }
    defer { close(fd) }
    var done = 0
    while done < bytes.count {
        let n = bytes.withUnsafeBytes { write(fd, $0.baseAddress! + done, bytes.count - done) }
        guard n > 0 else { throw HarnessError(description: "write: \(String(cString: strerror(errno)))") }
        done += n
    }
}

func readFile(_ path: String) throws -> [UInt8] {
    let fd = open(path, O_RDONLY)
    guard fd >= 0 else { throw HarnessError(description: "open \(path): \(String(cString: strerror(errno)))") }
    defer { close(fd) }
    var out: [UInt8] = []
    var chunk = [UInt8](repeating: 0, count: 256 * 1024)
    while true {
        let n = chunk.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
        guard n >= 0 else { throw HarnessError(description: "read: \(String(cString: strerror(errno)))") }
        if n == 0 { break }
        out += chunk[0..<n]
    }
    return out
}

func statOf(_ path: String) -> stat? {
    var st = stat()
    return lstat(path, &st) == 0 ? st : nil
}

func listDirectory(_ path: String) throws -> [String] {
    guard let dir = opendir(path) else { throw HarnessError(description: "opendir: \(String(cString: strerror(errno)))") }
    defer { closedir(dir) }
    var names: [String] = []
    while let entry = readdir(dir) {
        let name = withUnsafeBytes(of: entry.pointee.d_name) { raw in
            String(decoding: raw.prefix(while: { $0 != 0 }), as: UTF8.self)
        }
        names.append(name)
    }
    return names
}

/// True when SIGTERM has a real handler (neither SIG_DFL nor SIG_IGN).
func sigtermHandlerInstalled() -> Bool {
    var sa = sigaction()
    guard sigaction(SIGTERM, nil, &sa) == 0 else { return false }
    let raw = unsafeBitCast(sa.__sigaction_handler.sa_handler, to: Int.self)
    return raw != 0 && raw != 1
}

func randomBytes(_ count: Int) -> [UInt8] {
    var g = SystemRandomNumberGenerator()
    return (0..<count).map { _ in UInt8.random(in: 0...255, using: &g) }
}

// MARK: - Tests

@Suite("FUSE mount", .serialized, .enabled(if: fuseAvailable, "/dev/fuse is not available: skipping real-mount tests"))
struct FUSEMountTests {
    @Test("create, write, read (also 3 MiB), O_TRUNC, ftruncate, utimens")
    func fileIO() throws {
        let fs = MemoryFileSystem()
        try withMount(fs: fs) { m in
            let small = Array("hello, coffer\n".utf8)
            try writeFile(m.path("hello.txt"), small)
            #expect(try readFile(m.path("hello.txt")) == small)
            #expect(fs.contents(of: ["hello.txt"]) == small)
            #expect(fs.count("create") == 1)

            let big = randomBytes(3 << 20)
            try writeFile(m.path("big.bin"), big)
            #expect(fs.contents(of: ["big.bin"]) == big, "the filesystem received all 3 MiB")
            let st = try #require(statOf(m.path("big.bin")))
            #expect(st.st_size == 3 << 20)
            #expect(st.st_blksize == 4096)
            #expect(st.st_blocks == (3 << 20) / 512)
            // Drop the page cache for this file so the read goes through FUSE.
            let fd = open(m.path("big.bin"), O_RDONLY)
            #expect(fd >= 0)
            _ = posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED)
            close(fd)
            let readsBefore = fs.count("read")
            #expect(try readFile(m.path("big.bin")) == big)
            #expect(fs.count("read") > readsBefore, "reads reached the filesystem")

            // Atomic O_TRUNC: open carries O_TRUNC, no setattr.
            let setattrsBefore = fs.count("setattr") + fs.count("setattr-handle")
            try writeFile(m.path("hello.txt"), Array("x".utf8), flags: O_WRONLY | O_TRUNC)
            #expect(fs.contents(of: ["hello.txt"]) == Array("x".utf8))
            #expect(fs.openFlagsSeen.contains { $0 & O_TRUNC != 0 })
            #expect(fs.count("setattr") + fs.count("setattr-handle") == setattrsBefore)

            // ftruncate goes through setattr with the handle.
            let tfd = open(m.path("hello.txt"), O_RDWR)
            #expect(tfd >= 0)
            #expect(ftruncate(tfd, 1000) == 0)
            close(tfd)
            #expect(fs.count("setattr-handle") >= 1)
            #expect(statOf(m.path("hello.txt"))?.st_size == 1000)
            #expect(truncate(m.path("hello.txt"), 10) == 0)
            #expect(fs.contents(of: ["hello.txt"])?.count == 10)

            // Explicit times and chmod.
            var times = [
                timespec(tv_sec: 1_000_000_000, tv_nsec: 123_456_789),
                timespec(tv_sec: 1_200_000_000, tv_nsec: 987_654_321)
            ]
            #expect(utimensat(AT_FDCWD, m.path("hello.txt"), &times, 0) == 0)
            let after = try #require(statOf(m.path("hello.txt")))
            #expect(after.st_atim.tv_sec == 1_000_000_000 && after.st_atim.tv_nsec == 123_456_789)
            #expect(after.st_mtim.tv_sec == 1_200_000_000 && after.st_mtim.tv_nsec == 987_654_321)
            #expect(chmod(m.path("hello.txt"), 0o600) == 0)
            #expect(statOf(m.path("hello.txt")).map { $0.st_mode & 0o7777 } == 0o600)
            // UTIME_NOW
            var now = [timespec(tv_sec: 0, tv_nsec: utimeNow), timespec(tv_sec: 0, tv_nsec: utimeNow)]
            #expect(utimensat(AT_FDCWD, m.path("hello.txt"), &now, 0) == 0)
            #expect((statOf(m.path("hello.txt"))?.st_mtim.tv_sec ?? 0) > 1_600_000_000)

            // fsync and fallocate reach the filesystem.
            let ffd = open(m.path("hello.txt"), O_RDWR)
            #expect(fsync(ffd) == 0)
            #expect(posix_fallocate(ffd, 0, 8192) == 0)
            close(ffd)
            #expect(fs.count("fsync") >= 1)
            #expect(fs.contents(of: ["hello.txt"])?.count == 8192)
        }
        #expect(fs.violations.isEmpty, "lookup counting: \(fs.violations)")
    }

    @Test("mkdir and readdir of 2000 entries (paging), readdirplus lookup counting")
    func directories() throws {
        // Long entry timeouts: the kernel does not re-look-up, so lookup counts are exact.
        let fs = MemoryFileSystem(timeouts: CacheTimeouts(entry: 60, attributes: 60, negativeEntry: 0))
        try withMount(fs: fs) { m in
            #expect(Glibc.mkdir(m.path("big"), 0o755) == 0)
            var expected = Set([".", ".."])
            for i in 0..<2000 {
                let name = String(format: "entry-%04d-%@", i, String(repeating: "x", count: i % 40))
                expected.insert(name)
                let fd = open(m.path("big/" + name), O_WRONLY | O_CREAT, 0o644)
                #expect(fd >= 0)
                close(fd)
            }
            let calls = fs.count("readdir") + fs.count("readdirplus")
            let names = try listDirectory(m.path("big"))
            #expect(names.count == 2002, "no entry lost or repeated")
            #expect(expected.subtracting(names).isEmpty, "missing: \(expected.subtracting(names).sorted().prefix(5))")
            #expect(fs.count("readdir") + fs.count("readdirplus") - calls > 2, "several readdir calls (paging)")
            // Listing again gives the same result.
            let again = try listDirectory(m.path("big"))
            #expect(again.count == 2002 && Set(again) == expected, "second listing: \(again.count) names")
            #expect(fs.count("readdirplus") > 0, "the kernel used readdirplus")

            // "." and ".." from readdirplus are not kernel lookups: the adapter must give them back.
            #expect(Glibc.mkdir(m.path("dotcheck"), 0o755) == 0)
            let dotIno = try #require(fs.inode(of: ["dotcheck"]))
            #expect(fs.lookupCount(dotIno) == 1)
            #expect(Set(try listDirectory(m.path("dotcheck"))) == [".", ".."])
            #expect(fs.lookupCount(dotIno) == 1, "lookup count unchanged by listing the directory itself")

            #expect(rmdir(m.path("big")) == -1 && errno == ENOTEMPTY)
            #expect(rmdir(m.path("dotcheck")) == 0)
            #expect(statOf(m.path("dotcheck")) == nil)
        }
        #expect(fs.violations.isEmpty, "lookup counting: \(fs.violations)")
    }

    @Test("rename, symlink, link, xattrs, unlink, statfs")
    func namespaceAndXattrs() throws {
        let fs = MemoryFileSystem()
        try withMount(fs: fs) { m in
            try writeFile(m.path("a"), Array("A".utf8))
            #expect(Glibc.rename(m.path("a"), m.path("b")) == 0)
            #expect(statOf(m.path("a")) == nil)
            #expect(try readFile(m.path("b")) == Array("A".utf8))
            #expect(Glibc.mkdir(m.path("d"), 0o700) == 0)
            #expect(Glibc.rename(m.path("b"), m.path("d/c")) == 0)
            #expect(try readFile(m.path("d/c")) == Array("A".utf8))
            #expect(fs.count("rename") == 2)

            #expect(Glibc.symlink("d/c", m.path("ln")) == 0)
            var buf = [CChar](repeating: 0, count: 256)
            let n = readlink(m.path("ln"), &buf, buf.count)
            #expect(n == 3)
            #expect(String(decoding: buf[0..<max(0, n)].map { UInt8(bitPattern: $0) }, as: UTF8.self) == "d/c")
            #expect(statOf(m.path("ln")).map { $0.st_mode & S_IFMT } == S_IFLNK)
            #expect(try readFile(m.path("ln")) == Array("A".utf8), "following the symlink")

            #expect(Glibc.link(m.path("d/c"), m.path("hard")) == 0)
            #expect(statOf(m.path("hard"))?.st_nlink == 2)

            // xattrs
            let value = Array("value-123".utf8)
            #expect(setxattr(m.path("hard"), "user.test", value, value.count, 0) == 0)
            #expect(setxattr(m.path("hard"), "user.two", "", 0, 0) == 0)
            #expect(setxattr(m.path("hard"), "user.test", value, value.count, Int32(XATTR_CREATE)) == -1 && errno == EEXIST)
            #expect(getxattr(m.path("hard"), "user.test", nil, 0) == value.count, "size probe")
            var small = [UInt8](repeating: 0, count: 3)
            #expect(getxattr(m.path("hard"), "user.test", &small, small.count) == -1 && errno == ERANGE)
            var full = [UInt8](repeating: 0, count: 64)
            let got = getxattr(m.path("hard"), "user.test", &full, full.count)
            #expect(got == value.count)
            #expect(Array(full[0..<max(0, got)]) == value)
            let listed = Array("user.test\0user.two\0".utf8)
            #expect(listxattr(m.path("hard"), nil, 0) == listed.count)
            var list = [CChar](repeating: 0, count: 128)
            let ln = listxattr(m.path("hard"), &list, list.count)
            #expect(ln == listed.count)
            #expect(list[0..<max(0, ln)].map { UInt8(bitPattern: $0) } == listed)
            var tiny = [CChar](repeating: 0, count: 4)
            #expect(listxattr(m.path("hard"), &tiny, tiny.count) == -1 && errno == ERANGE)
            #expect(removexattr(m.path("hard"), "user.test") == 0)
            #expect(getxattr(m.path("hard"), "user.test", nil, 0) == -1 && errno == ENODATA)

            // unlink
            #expect(unlink(m.path("hard")) == 0)
            #expect(statOf(m.path("hard")) == nil)
            #expect(statOf(m.path("d/c"))?.st_nlink == 1)
            #expect(unlink(m.path("nope")) == -1 && errno == ENOENT)
            #expect(unlink(m.path("d")) == -1 && errno == EISDIR)

            // statfs
            var sv = statvfs()
            #expect(statvfs(m.mountpoint, &sv) == 0)
            #expect(sv.f_bsize == 4096)
            #expect(sv.f_blocks == 123_456)
            #expect(sv.f_bavail == 99_000)
            #expect(sv.f_files == 1_000_000)
            #expect(sv.f_namemax == 255)
        }
        #expect(fs.violations.isEmpty, "lookup counting: \(fs.violations)")
    }

    @Test("fsname with a comma, subtype and passthrough options show in /proc/mounts; max_write= applies")
    func options() throws {
        let fs = MemoryFileSystem()
        try withMount(
            fs: fs,
            configure: {
                $0.fsName = "/srv/box,one\\two"
                $0.passthrough = ["noatime", "nodev,nosuid", "max_write=65536", "relatime"]
            }
        ) { m in
            let entry = try #require(procMountsEntry(m.mountpoint))
            #expect(entry[0] == "/srv/box,one\\134two", "comma and backslash survive libfuse's option parser")
            #expect(entry[2] == "fuse.coffer")
            let flags = entry[3].split(separator: ",").map(String.init)
            #expect(flags.contains("noatime"))
            #expect(flags.contains("nodev"))
            #expect(flags.contains("nosuid"))
            #expect(flags.contains("rw"))
            try writeFile(m.path("f"), randomBytes(1 << 20))
            #expect(fs.largestWrite > 0 && fs.largestWrite <= 65536, "largest write \(fs.largestWrite)")
        }
    }

    @Test("writeback cache: write-only opens reach the filesystem as read-write")
    func writebackCache() throws {
        let fs = MemoryFileSystem()
        try withMount(
            fs: fs,
            configure: {
                $0.writebackCache = true
                $0.singleThreaded = true
            }
        ) { m in
            try writeFile(m.path("w"), Array("hello".utf8), flags: O_WRONLY | O_CREAT | O_APPEND)
            let fd = open(m.path("w"), O_WRONLY | O_APPEND)
            #expect(fd >= 0)
            close(fd)
            #expect(fs.openFlagsSeen.last.map { $0 & O_ACCMODE } == O_RDWR)
            #expect(fs.openFlagsSeen.last.map { $0 & O_APPEND } == 0)
            #expect(try readFile(m.path("w")) == Array("hello".utf8))
            #expect(fs.contents(of: ["w"]) == Array("hello".utf8))
        }
    }

    @Test(
        "Opens without handles: OPEN, OPENDIR and CREATE answered ENOSYS once, then none of them or their releases; creates, reads, writes, O_TRUNC and listings work"
    )
    func opensWithoutHandles() throws {
        let fs = MemoryFileSystem(opensWithoutHandles: true)
        try withMount(fs: fs) { m in
            try writeFile(m.path("f"), Array("hello world".utf8))  // CREATE answered ENOSYS: MKNOD
            #expect(fs.count("create") == 0 && fs.count("mknod") == 1)
            // O_EXCL still holds on the MKNOD path.
            let excl = Glibc.open(m.path("f"), O_WRONLY | O_CREAT | O_EXCL, 0o644)
            #expect(excl == -1 && errno == EEXIST)
            let fresh = Glibc.open(m.path("g"), O_WRONLY | O_CREAT | O_EXCL, 0o640)
            #expect(fresh >= 0)
            close(fresh)
            #expect(statOf(m.path("g")).map { $0.st_mode } == UInt32(Glibc.S_IFREG) | 0o640)
            #expect(unlink(m.path("g")) == 0)
            for _ in 0..<20 { #expect(try readFile(m.path("f")) == Array("hello world".utf8)) }
            // Reopened for writing, in place and at the end.
            let fd = open(m.path("f"), O_WRONLY)
            #expect(fd >= 0)
            #expect(Array("J".utf8).withUnsafeBytes { pwrite(fd, $0.baseAddress, 1, 6) } == 1)
            close(fd)
            try writeFile(m.path("f"), Array("!".utf8), flags: O_WRONLY | O_APPEND)
            #expect(try readFile(m.path("f")) == Array("hello Jorld!".utf8))
            // O_TRUNC without an OPEN request: the kernel truncates through setattr.
            try writeFile(m.path("f"), [], flags: O_WRONLY | O_TRUNC)
            #expect(try readFile(m.path("f")).isEmpty)
            usleep(200_000)  // time for any (wrong) background RELEASE to arrive
            #expect(fs.count("open") == 0, "the filesystem's open was never called")
            #expect(fs.count("release") == 0, "no RELEASE for handle-less opens and creates")
            #expect(fs.count("read") >= 1)
            // Directories too: listings (large ones in several READDIRs, and again after a change) come
            // without OPENDIR or RELEASEDIR, each name once.
            #expect(mkdir(m.path("d"), 0o755) == 0)
            for i in 0..<500 { try writeFile(m.path("d/entry-\(i)"), [UInt8(i & 0xFF)]) }
            let names = try FileManager.default.contentsOfDirectory(atPath: m.path("d"))
            #expect(names.count == 500 && Set(names) == Set((0..<500).map { "entry-\($0)" }))
            #expect(unlink(m.path("d/entry-7")) == 0)
            #expect(try FileManager.default.contentsOfDirectory(atPath: m.path("d")).count == 499)
            #expect(try FileManager.default.contentsOfDirectory(atPath: m.mountpoint).sorted() == ["d", "f"])
            #expect(fs.count("create") == 0 && fs.count("mknod") == 502)
            #expect(fs.count("readdir") + fs.count("readdirplus") >= 3)
            #expect(fs.count("opendir") == 0 && fs.count("releasedir") == 0, "no OPENDIR or RELEASEDIR reached the filesystem")
        }
    }

    @Test(
        "KILLPRIV_V2: 100 writes ask GETXATTR(security.capability) at most once; without the hook, every time",
        arguments: [true, false])
    func killPrivNoCapabilityProbe(hook: Bool) throws {
        let fs = MemoryFileSystem()
        try withMount(fs: fs, configure: { $0.killPrivV2 = hook }) { m in
            try writeFile(m.path("f"), [1])
            let before = fs.count("getxattr")
            let fd = open(m.path("f"), O_WRONLY)
            #expect(fd >= 0)
            defer { close(fd) }
            let block = [UInt8](repeating: 7, count: 4096)
            for i in 0..<100 {
                #expect(block.withUnsafeBytes { pwrite(fd, $0.baseAddress, 4096, off_t(i * 4096)) } == 4096)
            }
            let probes = fs.count("getxattr") - before
            // With the flag the kernel asks once per inode (then sets S_NOSEC until its attributes are refreshed).
            if hook {
                #expect(probes <= 1, "GETXATTR per write with KILLPRIV_V2: \(probes)")
            } else {
                #expect(probes == 100, "GETXATTR without the hook: \(probes)")
            }
            #expect(fs.count("write") >= 100)
            #expect(fs.count("clearSetID") == 0, "root writes carry no kill mark")
        }
    }

    @Test(
        "KILLPRIV_V2: an unprivileged writer's writes and O_TRUNC reach the filesystem as clearSetID; root's do not",
        .enabled(if: getuid() == 0 && access("/usr/sbin/runuser", X_OK) == 0, "needs root and runuser"))
    func killPrivMarks() throws {
        let fs = MemoryFileSystem()
        try withMount(
            fs: fs,
            configure: {
                $0.allowOther = true
                $0.defaultPermissions = true
            }
        ) { m in
            chmod(m.parent, 0o755)  // mkdtemp made it 0700: nobody must reach the mountpoint
            try writeFile(m.path("f"), [1])
            #expect(chmod(m.path("f"), 0o6777) == 0)
            try writeFile(m.path("f"), [2], flags: O_WRONLY)
            #expect(statOf(m.path("f")).map { $0.st_mode & 0o7777 } == 0o6777, "root's write keeps the set-id bits")
            #expect(try asNobody("printf x >> '\(m.path("f"))'") == 0)
            #expect(fs.count("clearSetID") >= 1, "the write's FUSE_WRITE_KILL_SUIDGID reached the filesystem")
            #expect(statOf(m.path("f")).map { $0.st_mode & 0o7777 } == 0o0777)
            #expect(chmod(m.path("f"), 0o6777) == 0)
            #expect(try asNobody("printf y > '\(m.path("f"))'") == 0)
            #expect(statOf(m.path("f")).map { $0.st_mode & 0o7777 } == 0o0777, "O_TRUNC by nobody clears the bits")
            #expect(fs.contents(of: ["f"]) == Array("y".utf8))
        }
    }

    @Test(
        "max_threads bounds the requests served at once; the default is one thread more than cores",
        arguments: [UInt32(1), 2, 4])
    func maxThreadsBoundsConcurrency(limit: UInt32) throws {
        #expect(FUSEMountOptions.defaultMaxThreads == UInt32(sysconf(Int32(_SC_NPROCESSORS_ONLN))) + 1)
        let fs = MemoryFileSystem(statfsPauseMicroseconds: 200_000)
        // /dev/fuse's workers only: ring entries (when the kernel offers io_uring) are not bounded by max_threads.
        try withMount(
            fs: fs,
            configure: {
                $0.maxThreads = limit
                $0.ioUring = false
            }
        ) { m in
            // Eight callers at once; the filesystem holds each statfs for 0.2 s.
            let done = DispatchGroup()
            for _ in 0..<8 {
                done.enter()
                Thread {
                    var st = statvfs()
                    _ = statvfs(m.mountpoint, &st)
                    done.leave()
                }.start()
            }
            #expect(done.wait(timeout: .now() + 30) == .success, "statfs callers finished")
            #expect(fs.statfsMostAtOnce == Int(limit), "served at once: \(fs.statfsMostAtOnce), max_threads \(limit)")
        }
    }

    @Test("a long request does not hold up another caller's request (the reader hands its place on)")
    func longRequestDoesNotHoldUpOthers() throws {
        let fs = MemoryFileSystem(statfsPauseMicroseconds: 3_000_000)
        try withMount(fs: fs, configure: { $0.ioUring = false }) { m in  // the /dev/fuse reader's hand-over
            try writeFile(m.path("f"), [1])
            let done = DispatchSemaphore(value: 0)
            Thread {
                var st = statvfs()
                _ = statvfs(m.mountpoint, &st)
                done.signal()
            }.start()
            let deadline = ContinuousClock.now + .seconds(5)
            while fs.count("statfs") == 0 && ContinuousClock.now < deadline { usleep(10_000) }
            #expect(fs.count("statfs") == 1, "the slow statfs started")
            // getxattr is never cached: it is a request, served while the statfs still runs.
            let start = ContinuousClock.now
            var value = [UInt8](repeating: 0, count: 8)
            _ = getxattr(m.path("f"), "user.none", &value, value.count)
            let took = ContinuousClock.now - start
            #expect(took < .seconds(1), "getxattr waited \(took) behind a 3 s statfs")
            #expect(done.wait(timeout: .now() + 10) == .success)
        }
    }

    @Test("an idle mount uses no CPU (the reader sleeps once its spin is over)")
    func idleMountSleeps() throws {
        try withMount(configure: { $0.ioUring = false }) { m in  // the /dev/fuse reader's sleep
            for i in 0..<200 { try writeFile(m.path("f\(i % 10)"), [UInt8(i % 256)]) }
            usleep(100_000)
            // Only the mount's worker threads count: other suites run in this process at the same time.
            let before = try workerCPUTicks()
            sleep(1)
            let used = Double(try workerCPUTicks() - before) / Double(sysconf(Int32(_SC_CLK_TCK)))
            #expect(used < 0.05, "CPU seconds used by an idle mount's workers in 1 s: \(used)")
        }
    }

    @Test("read-only mount")
    func readOnly() throws {
        let fs = MemoryFileSystem()
        try withMount(fs: fs, configure: { $0.readOnly = true }) { m in
            let entry = try #require(procMountsEntry(m.mountpoint))
            #expect(entry[3].split(separator: ",").contains("ro"))
            #expect(open(m.path("new"), O_WRONLY | O_CREAT, 0o644) == -1 && errno == EROFS)
            #expect(Glibc.mkdir(m.path("dir"), 0o755) == -1 && errno == EROFS)
            #expect(try listDirectory(m.mountpoint).sorted() == [".", ".."])
        }
        #expect(fs.count("create") == 0 && fs.count("mkdir") == 0)
    }

    @Test("requestExit before run: run returns at once, unmounted, shutdown once, onReady not called")
    func exitBeforeRun() throws {
        let fs = MemoryFileSystem()
        let m = try MountedFS(fs: fs)
        defer { m.cleanup() }
        m.mount.requestExit()
        let started = Date()
        #expect(throws: (any Error).self) { try m.start(timeout: 3) }  // never becomes ready
        #expect(m.stop(timeout: 10))
        #expect(Date().timeIntervalSince(started) < 15)
        #expect(m.readyCalls == 0)
        #expect(procMountsEntry(m.mountpoint) == nil)
        #expect(fs.shutdownCount == 1)
        #expect(throws: FUSEMountError.alreadyRunning) { try m.mount.run {} }
    }

    @Test("external unmount (fusermount3 -u) ends run")
    func externalUnmount() throws {
        let fs = MemoryFileSystem()
        let m = try MountedFS(fs: fs)
        defer { m.cleanup() }
        try m.start()
        let p = Process()
        p.executableURL = URL(fileURLWithPath: "/usr/bin/fusermount3")
        p.arguments = ["-u", m.mountpoint]
        try p.run()
        p.waitUntilExit()
        #expect(p.terminationStatus == 0)
        #expect(m.waitForEnd(timeout: 10), "run returned after the external unmount")
        #expect(m.error == nil)
        #expect(procMountsEntry(m.mountpoint) == nil)
        #expect(fs.shutdownCount == 1)
    }

    @Test("SIGTERM ends run (an idle mount is unmounted, whichever thread gets the signal)")
    func sigterm() throws {
        let fs = MemoryFileSystem()
        let m = try MountedFS(fs: fs)
        defer { m.cleanup() }
        try m.start()
        // Only signal when a handler is in place: otherwise SIGTERM would end the test process.
        try #require(sigtermHandlerInstalled(), "run() installed its signal handlers")
        #expect(kill(getpid(), SIGTERM) == 0)
        #expect(m.waitForEnd(timeout: 10), "run returned after SIGTERM")
        #expect(m.error == nil)
        #expect(procMountsEntry(m.mountpoint) == nil)
        #expect(fs.shutdownCount == 1)
        #expect(!sigtermHandlerInstalled(), "handlers removed after run")
    }

    @Test("a non-empty mountpoint is refused unless -o nonempty")
    func nonEmptyMountpoint() throws {
        let (parent, mountpoint) = try makeTempMountpoint()
        defer { removeTree(parent) }
        try writeFile(mountpoint + "/occupied", [1, 2, 3])
        let logger = Logger(label: "test")
        #expect(throws: FUSEMountError.mountpointNotEmpty(path: mountpoint)) {
            try FUSEMount(
                filesystem: MemoryFileSystem(), mountpoint: mountpoint,
                options: FUSEMountOptions(fsName: "x"), logger: logger)
        }
        #expect(procMountsEntry(mountpoint) == nil)
        var options = FUSEMountOptions(fsName: "x")
        options.passthrough = ["nonempty"]
        #expect(throws: Never.self) {
            _ = try FUSEMount(filesystem: MemoryFileSystem(), mountpoint: mountpoint, options: options, logger: logger)
        }
    }

    @Test("nonempty really mounts over a non-empty directory")
    func nonEmptyMounts() throws {
        let fs = MemoryFileSystem()
        let m = try MountedFS(fs: fs, configure: { $0.passthrough = ["nonempty"] })
        defer { m.cleanup() }
        // Fill the mountpoint after the check (the check happened in init): mount anyway with nonempty.
        try writeFile(m.mountpoint + "/hidden", [9])
        try m.start()
        #expect(statOf(m.path("hidden")) == nil, "the underlying file is hidden by the mount")
        #expect(m.stop())
        #expect(m.error == nil)
        #expect(statOf(m.path("hidden")) != nil, "visible again after unmount")
    }

    @Test("a missing mountpoint or a file is refused")
    func missingMountpoint() throws {
        let (parent, _) = try makeTempMountpoint()
        defer { removeTree(parent) }
        let logger = Logger(label: "test")
        #expect(throws: FUSEMountError.mountpointMissing(path: parent + "/absent")) {
            try FUSEMount(
                filesystem: MemoryFileSystem(), mountpoint: parent + "/absent",
                options: FUSEMountOptions(fsName: "x"), logger: logger)
        }
        try writeFile(parent + "/file", [1])
        #expect(throws: FUSEMountError.mountpointNotDirectory(path: parent + "/file")) {
            try FUSEMount(
                filesystem: MemoryFileSystem(), mountpoint: parent + "/file",
                options: FUSEMountOptions(fsName: "x"), logger: logger)
        }
        let message = FUSEMountError.mountpointMissing(path: "/nowhere").description
        #expect(message.contains("/nowhere") && message.contains("does not exist"))
    }

    @Test("unknown options fail session creation cleanly")
    func badOption() throws {
        let fs = MemoryFileSystem()
        let m = try MountedFS(fs: fs, configure: { $0.passthrough = ["definitely_not_an_option"] })
        defer { m.cleanup() }
        #expect(throws: (any Error).self) { try m.start(timeout: 5) }
        #expect(m.stop(timeout: 10))
        #expect(m.error?.contains("could not create the FUSE session") == true, "\(m.error ?? "nil")")
        #expect(procMountsEntry(m.mountpoint) == nil)
        #expect(fs.shutdownCount == 1)
    }
}
