import CofferTestSupport
import Foundation
import Testing

#if canImport(Glibc)
    import Glibc
#endif

// Issue 3: a seeded random sequence of syscalls applied both to a real mount and to a plain directory on
// the local disk (the reference). Every operation's result (return value or errno, and what it read) must
// be the same on both sides, and at checkpoints (every `checkEvery` operations, before and after every
// remount, at the end) the two trees must match: names, types, modes, sizes, nlink, hard-link identity,
// symlink targets, user.* xattrs, file contents byte for byte, and mtimes to the nanosecond wherever the
// last thing that set them was utimensat (other mtimes are "now" on each side, at different instants).
//
// The operations work on a few names (8 names in 4 directories) so that they collide often: creates over
// existing names, renames over files and directories, into other directories and into themselves, links,
// unlinks of files that are still open (then read and written through the descriptor), rmdir of non-empty
// directories, symlinks (relative targets only: an absolute one inside the mount follows the mountpoint),
// chmod, utimensat with nanoseconds, xattrs, fsync, and remounts (which close every descriptor on both sides).
//
// Seeds: COFFER_MODEL_SEEDS (default 30) seeds starting at a random base (COFFER_MODEL_BASE sets it), each
// COFFER_MODEL_OPS (default 200) operations, all in one container, each seed in its own directory.
// COFFER_MODEL_SEED=S runs seed S alone (in a fresh container). A failure names the seed and the operation;
// COFFER_MODEL_CHECK_EVERY=1 (default 50) compares the trees after every operation without changing the
// sequence, which names the operation that made them differ.

/// The xattr calls of glibc, which the Glibc module does not show (sys/xattr.h), looked up with dlsym.
enum XattrCalls {
    typealias Set = @convention(c) (UnsafePointer<CChar>, UnsafePointer<CChar>, UnsafeRawPointer?, Int, Int32) -> Int32
    typealias Get = @convention(c) (UnsafePointer<CChar>, UnsafePointer<CChar>, UnsafeMutableRawPointer?, Int) -> Int
    typealias List = @convention(c) (UnsafePointer<CChar>, UnsafeMutablePointer<CChar>?, Int) -> Int
    typealias Remove = @convention(c) (UnsafePointer<CChar>, UnsafePointer<CChar>) -> Int32

    static func symbol<T>(_ name: String, _: T.Type) -> T {
        guard let sym = dlsym(nil, name) else { fatalError("no \(name) in libc") }
        return unsafeBitCast(sym, to: T.self)
    }

    static let set = symbol("setxattr", Set.self)
    static let get = symbol("getxattr", Get.self)
    static let lget = symbol("lgetxattr", Get.self)
    static let list = symbol("listxattr", List.self)
    static let llist = symbol("llistxattr", List.self)
    static let remove = symbol("removexattr", Remove.self)
}

/// What one syscall (or a short fixed sequence of them) gave: a return value or an errno, and what it read.
struct ModelOutcome: Equatable, CustomStringConvertible {
    var rc: Int
    var err: Int32
    var data: [UInt8]? = nil

    static func of(_ rc: Int, data: [UInt8]? = nil) -> ModelOutcome {
        rc < 0 ? ModelOutcome(rc: -1, err: errno) : ModelOutcome(rc: rc, err: 0, data: data)
    }

    static func errnoName(_ e: Int32) -> String {
        let names: [Int32: String] = [
            EPERM: "EPERM", ENOENT: "ENOENT", EIO: "EIO", EBADF: "EBADF", EACCES: "EACCES", EEXIST: "EEXIST",
            EXDEV: "EXDEV", ENOTDIR: "ENOTDIR", EISDIR: "EISDIR", EINVAL: "EINVAL", EFBIG: "EFBIG", ENOSPC: "ENOSPC",
            EROFS: "EROFS", EMLINK: "EMLINK", ENAMETOOLONG: "ENAMETOOLONG", ENOTEMPTY: "ENOTEMPTY", ELOOP: "ELOOP",
            ENODATA: "ENODATA", ERANGE: "ERANGE", ENOTCONN: "ENOTCONN", EBUSY: "EBUSY", ENOTSUP: "ENOTSUP",
            E2BIG: "E2BIG", ENXIO: "ENXIO", ETXTBSY: "ETXTBSY"
        ]
        return names[e] ?? "errno \(e)"
    }

    var description: String {
        if rc < 0 { return "-1 \(Self.errnoName(err))" }
        guard let data else { return "\(rc)" }
        if data.count <= 48, let text = String(bytes: data, encoding: .utf8), text.allSatisfy({ $0.isASCII && !$0.isNewline || $0 == "\n" }) {
            return "\(rc) \"\(text)\""
        }
        var h: UInt64 = 0xcbf2_9ce4_8422_2325
        for x in data { h = (h ^ UInt64(x)) &* 0x100_0000_01b3 }
        return "\(rc) [\(data.count) bytes, fnv \(String(h, radix: 16))]"
    }
}

/// One operation, with every parameter drawn beforehand, so that both sides get exactly the same call.
enum ModelOp: CustomStringConvertible {
    case open(String, flags: Int32, mode: mode_t)
    case close(Int)
    case writePath(String, offset: Int, data: [UInt8], create: Bool)
    case pwrite(Int, offset: Int, data: [UInt8])
    case pread(Int, offset: Int, count: Int)
    case readPath(String)
    case truncate(String, Int)
    case ftruncate(Int, Int)
    case rename(String, String)
    case link(String, String)
    case unlink(String)
    case mkdir(String, mode_t)
    case rmdir(String)
    case symlink(target: String, String)
    case readlink(String)
    case chmod(String, mode_t)
    case utimens(String, atime: timespec, mtime: timespec, nofollow: Bool)
    case setxattr(String, name: String, value: [UInt8], flags: Int32)
    case getxattr(String, name: String)
    case listxattr(String)
    case removexattr(String, name: String)
    case fsync(Int)
    case fsyncPath(String, directory: Bool)
    case fstat(Int)
    case lstat(String)
    case remount

    static func flagsText(_ f: Int32) -> String {
        var parts = [(f & O_ACCMODE) == O_RDONLY ? "O_RDONLY" : (f & O_ACCMODE) == O_WRONLY ? "O_WRONLY" : "O_RDWR"]
        for (bit, name) in [(O_CREAT, "O_CREAT"), (O_EXCL, "O_EXCL"), (O_TRUNC, "O_TRUNC"), (O_APPEND, "O_APPEND"), (O_DIRECTORY, "O_DIRECTORY")]
        where f & bit != 0 { parts.append(name) }
        return parts.joined(separator: "|")
    }

    static func timeText(_ t: timespec) -> String {
        t.tv_nsec == ModelRun.utimeOmit ? "OMIT" : t.tv_nsec == ModelRun.utimeNow ? "NOW" : "\(t.tv_sec).\(String(format: "%09d", t.tv_nsec))"
    }

    var description: String {
        switch self {
        case let .open(p, f, m): return "open(\(p), \(Self.flagsText(f)), 0\(String(m, radix: 8)))"
        case let .close(s): return "close(fd#\(s))"
        case let .writePath(p, o, d, c): return "write(\(p), offset \(o), \(d.count) bytes\(c ? ", O_CREAT" : ""))"
        case let .pwrite(s, o, d): return "pwrite(fd#\(s), offset \(o), \(d.count) bytes)"
        case let .pread(s, o, n): return "pread(fd#\(s), offset \(o), \(n) bytes)"
        case let .readPath(p): return "read(\(p))"
        case let .truncate(p, n): return "truncate(\(p), \(n))"
        case let .ftruncate(s, n): return "ftruncate(fd#\(s), \(n))"
        case let .rename(a, b): return "rename(\(a), \(b))"
        case let .link(a, b): return "link(\(a), \(b))"
        case let .unlink(p): return "unlink(\(p))"
        case let .mkdir(p, m): return "mkdir(\(p), 0\(String(m, radix: 8)))"
        case let .rmdir(p): return "rmdir(\(p))"
        case let .symlink(t, p): return "symlink(\(t), \(p))"
        case let .readlink(p): return "readlink(\(p))"
        case let .chmod(p, m): return "chmod(\(p), 0\(String(m, radix: 8)))"
        case let .utimens(p, a, m, n):
            return "utimensat(\(p), atime \(Self.timeText(a)), mtime \(Self.timeText(m))\(n ? ", AT_SYMLINK_NOFOLLOW" : ""))"
        case let .setxattr(p, n, v, f): return "setxattr(\(p), \(n), \(v.count) bytes, flags \(f))"
        case let .getxattr(p, n): return "getxattr(\(p), \(n))"
        case let .listxattr(p): return "listxattr(\(p))"
        case let .removexattr(p, n): return "removexattr(\(p), \(n))"
        case let .fsync(s): return "fsync(fd#\(s))"
        case let .fsyncPath(p, d): return "fsync(open(\(p)\(d ? ", O_DIRECTORY" : "")))"
        case let .fstat(s): return "fstat(fd#\(s))"
        case let .lstat(p): return "lstat(\(p))"
        case .remount: return "remount"
        }
    }
}

/// One seed's run: the operations, both sides' descriptors, and which mtimes utimensat set last.
final class ModelRun {
    static let utimeNow = (1 << 30) - 1
    static let utimeOmit = (1 << 30) - 2
    static let names = ["f0", "f1", "f2", "f3", "d0", "d1", "l0", "l1"]
    static let dirs = ["", "d0/", "d1/", "d0/d1/"]
    static let linkTargets = ["f0", "f1", "d0", "d1", "d0/f1", "d1/f2", "l0", "nowhere", "f0/x", "."]
    static let xattrNames = ["user.a", "user.b", "user.long.name.for.model", "user.d"]
    static let chunk = 32768

    let seed: UInt64
    let sandbox: Sandbox
    var roots: [String]  // [mount side, reference side]
    /// Several machines (SharedMountTests): the mount side moves between `mountRoots` every `every` operations.
    let mountRoots: [String]
    let every: Int
    let operations: Int
    let checkEvery: Int
    var rng: SplitMix64
    /// Open descriptors: [mount fd, reference fd] and the path each was opened with.
    var fds: [(fd: [Int32], path: String)] = []
    /// Reference inode numbers whose mtime was last set by utimensat (compared to the nanosecond).
    var pinned = Set<UInt64>()
    var history: [String] = []
    var remounts = 0
    var checks = 0

    init(
        seed: UInt64, sandbox: Sandbox, mountRoot: String, refRoot: String, operations: Int, checkEvery: Int = 50,
        otherMount: (root: String, every: Int)? = nil
    ) {
        self.seed = seed
        self.sandbox = sandbox
        self.roots = [mountRoot, refRoot]
        self.mountRoots = [mountRoot] + (otherMount.map { [$0.root] } ?? [])
        self.every = otherMount?.every ?? Int.max
        self.operations = operations
        self.checkEvery = checkEvery
        self.rng = SplitMix64(seed: seed)
    }

    // MARK: drawing

    func int(_ r: ClosedRange<Int>) -> Int { Int.random(in: r, using: &rng) }
    func chance(_ p: Double) -> Bool { Double(rng.next() >> 11) / Double(1 << 53) < p }
    func pick<T>(_ a: [T]) -> T { a[int(0...a.count - 1)] }

    /// A path, mostly of the kind `prefer` names (f, d or l), sometimes any.
    func path(_ prefer: Character? = nil) -> String {
        let names = prefer.map { p in Self.names.filter { $0.first == p } } ?? Self.names
        return pick(Self.dirs) + pick(chance(0.75) ? names : Self.names)
    }

    /// The size of the reference file at `rel` (0 when there is none).
    func refSize(_ rel: String) -> Int {
        var st = stat()
        return stat(roots[1] + "/" + rel, &st) == 0 ? Int(st.st_size) : 0
    }

    func refSize(fd: Int32) -> Int {
        var st = stat()
        return fstat(fd, &st) == 0 ? Int(st.st_size) : 0
    }

    /// Offsets near the end, past it (a hole), at chunk boundaries, anywhere.
    func offset(size: Int) -> Int {
        switch int(0...5) {
        case 0: return 0
        case 1: return int(0...size)
        case 2: return max(0, size + int(-200...200))
        case 3: return size + int(1...100_000)
        default: return max(0, Self.chunk * int(0...10) + int(-300...300))
        }
    }

    func length() -> Int {
        switch int(0...9) {
        case 0...3: return int(1...100)
        case 4...6: return int(1...5000)
        case 7, 8: return int(Self.chunk - 100...2 * Self.chunk + 100)
        default: return int(1...200_000)
        }
    }

    func truncateLength(size: Int) -> Int {
        switch int(0...4) {
        case 0: return 0
        case 1: return int(0...size)
        case 2: return size + int(1...80_000)
        default: return max(0, Self.chunk * int(0...8) + int(-2...2))
        }
    }

    func mode(directory: Bool) -> mode_t {
        pick(directory ? [0o755, 0o700, 0o1777, 0o2755, 0o555, 0o000] : [0o644, 0o600, 0o755, 0o4755, 0o2644, 0o444, 0o000, 0o7777])
    }

    func time() -> timespec {
        if chance(0.1) { return timespec(tv_sec: 0, tv_nsec: Self.utimeOmit) }
        if chance(0.05) { return timespec(tv_sec: 0, tv_nsec: Self.utimeNow) }
        let sec = chance(0.1) ? int(-2_000_000_000 ... -1) : int(0...4_000_000_000)
        let nsec = pick([0, 999_999_999, int(0...999_999_999)])
        return timespec(tv_sec: sec, tv_nsec: nsec)
    }

    func draw() -> ModelOp {
        let slot = fds.isEmpty ? nil : int(0...fds.count - 1)
        let r = int(0...999)
        switch r {
        case 0..<70:
            let flags = pick([
                O_RDWR | O_CREAT, O_RDWR | O_CREAT, O_RDWR | O_CREAT | O_EXCL, O_RDWR | O_CREAT | O_TRUNC,
                O_RDWR, O_RDWR | O_APPEND, O_WRONLY | O_CREAT, O_RDONLY
            ])
            return fds.count >= 4 ? .close(int(0...fds.count - 1)) : .open(path("f"), flags: flags, mode: mode(directory: false))
        case 70..<100:
            if let slot { return .close(slot) }
            return .lstat(path())
        case 100..<200:
            let p = path("f")
            return .writePath(p, offset: offset(size: refSize(p)), data: rng.bytes(length()), create: chance(0.6))
        case 200..<280:
            if let slot { return .pwrite(slot, offset: offset(size: refSize(fd: fds[slot].fd[1])), data: rng.bytes(length())) }
            return .writePath(path("f"), offset: 0, data: rng.bytes(length()), create: true)
        case 280..<330:
            if let slot { return .pread(slot, offset: offset(size: refSize(fd: fds[slot].fd[1])), count: length()) }
            return .readPath(path("f"))
        case 330..<360: return .readPath(path("f"))
        case 360..<400:
            let p = path("f")
            return .truncate(p, truncateLength(size: refSize(p)))
        case 400..<430:
            if let slot { return .ftruncate(slot, truncateLength(size: refSize(fd: fds[slot].fd[1]))) }
            return .truncate(path("f"), int(0...100_000))
        case 430..<520:
            let from = path(pick(["f", "d", "l"]))
            return .rename(from, chance(0.5) ? path(from.last == "/" ? nil : from.split(separator: "/").last!.first!) : path())
        case 520..<560: return .link(path("f"), path("f"))
        case 560..<620:
            if let slot, chance(0.5) { return .unlink(fds[slot].path) }
            return .unlink(path(chance(0.8) ? "f" : "l"))
        case 620..<670: return .mkdir(path("d"), mode(directory: true))
        case 670..<710: return .rmdir(path("d"))
        case 710..<750: return .symlink(target: pick(Self.linkTargets), path("l"))
        case 750..<765: return .readlink(path("l"))
        case 765..<800: return .chmod(path(), mode(directory: chance(0.3)))
        case 800..<850: return .utimens(path(), atime: time(), mtime: time(), nofollow: chance(0.3))
        case 850..<895:
            let v: [UInt8] = chance(0.1) ? [] : rng.bytes(chance(0.1) ? int(500...2000) : int(1...64))
            return .setxattr(path(), name: pick(Self.xattrNames), value: v, flags: pick([0, 0, 1, 2]))  // XATTR_CREATE 1, XATTR_REPLACE 2
        case 895..<915: return .getxattr(path(), name: pick(Self.xattrNames))
        case 915..<930: return .listxattr(path())
        case 930..<945: return .removexattr(path(), name: pick(Self.xattrNames))
        case 945..<965:
            if let slot { return .fsync(slot) }
            return .fsyncPath(path("f"), directory: false)
        case 965..<975: return .fsyncPath(pick(Self.dirs + ["d0", "d1"]), directory: true)
        case 975..<990:
            if let slot { return .fstat(slot) }
            return .lstat(path())
        default:
            return chance(0.25) ? .remount : .lstat(path())
        }
    }

    // MARK: applying

    func full(_ side: Int, _ rel: String) -> String { rel.isEmpty ? roots[side] : roots[side] + "/" + rel }

    static func statText(_ st: stat, size: Bool = true) -> String {
        let type = st.st_mode & S_IFMT
        let kind = type == S_IFDIR ? "dir" : type == S_IFREG ? "file" : type == S_IFLNK ? "link" : "type \(type)"
        return "\(kind) mode \(String(st.st_mode & 0o7777, radix: 8)) nlink \(st.st_nlink)" + (type != S_IFDIR && size ? " size \(st.st_size)" : "")
    }

    static func readAll(_ fd: Int32) -> ModelOutcome {
        var out: [UInt8] = []
        var buf = [UInt8](repeating: 0, count: 1 << 17)
        while true {
            let n = buf.withUnsafeMutableBytes { pread(fd, $0.baseAddress, $0.count, off_t(out.count)) }
            if n < 0 { return .of(-1) }
            if n == 0 { return ModelOutcome(rc: out.count, err: 0, data: out) }
            out += buf[0..<n]
        }
    }

    /// The operation on one side (0: the mount, 1: the reference).
    func apply(_ op: ModelOp, side: Int) -> ModelOutcome {
        func p(_ rel: String) -> String { full(side, rel) }
        errno = 0
        switch op {
        case let .open(rel, flags, mode):
            return .of(Int(open(p(rel), flags, mode)))
        case let .close(slot):
            return .of(Int(close(fds[slot].fd[side])))
        case let .writePath(rel, offset, data, create):
            let fd = open(p(rel), O_WRONLY | (create ? O_CREAT : 0), 0o644)
            if fd < 0 { return .of(-1) }
            let n = data.withUnsafeBytes { pwrite(fd, $0.baseAddress, $0.count, off_t(offset)) }
            let e = errno
            let c = close(fd)
            if n < 0 { return ModelOutcome(rc: -1, err: e) }
            return c == 0 ? .of(n) : .of(-1)
        case let .pwrite(slot, offset, data):
            return .of(data.withUnsafeBytes { pwrite(fds[slot].fd[side], $0.baseAddress, $0.count, off_t(offset)) })
        case let .pread(slot, offset, count):
            var buf = [UInt8](repeating: 0, count: count)
            let n = buf.withUnsafeMutableBytes { pread(fds[slot].fd[side], $0.baseAddress, $0.count, off_t(offset)) }
            return n < 0 ? .of(-1) : ModelOutcome(rc: n, err: 0, data: Array(buf[0..<n]))
        case let .readPath(rel):
            let fd = open(p(rel), O_RDONLY)
            if fd < 0 { return .of(-1) }
            defer { close(fd) }
            return Self.readAll(fd)
        case let .truncate(rel, n): return .of(Int(truncate(p(rel), off_t(n))))
        case let .ftruncate(slot, n): return .of(Int(ftruncate(fds[slot].fd[side], off_t(n))))
        case let .rename(a, b): return .of(Int(rename(p(a), p(b))))
        case let .link(a, b): return .of(Int(link(p(a), p(b))))
        case let .unlink(rel): return .of(Int(unlink(p(rel))))
        case let .mkdir(rel, mode): return .of(Int(mkdir(p(rel), mode)))
        case let .rmdir(rel): return .of(Int(rmdir(p(rel))))
        case let .symlink(target, rel): return .of(Int(symlink(target, p(rel))))
        case let .readlink(rel):
            var buf = [UInt8](repeating: 0, count: 4096)
            let n = buf.withUnsafeMutableBytes { readlink(p(rel), $0.baseAddress!.assumingMemoryBound(to: CChar.self), $0.count) }
            return n < 0 ? .of(-1) : ModelOutcome(rc: n, err: 0, data: Array(buf[0..<n]))
        case let .chmod(rel, mode): return .of(Int(chmod(p(rel), mode)))
        case let .utimens(rel, a, m, nofollow):
            let times = [a, m]
            return .of(Int(utimensat(AT_FDCWD, p(rel), times, nofollow ? AT_SYMLINK_NOFOLLOW : 0)))
        case let .setxattr(rel, name, value, flags):
            return .of(Int(value.withUnsafeBytes { XattrCalls.set(p(rel), name, $0.baseAddress, $0.count, flags) }))
        case let .getxattr(rel, name):
            var buf = [UInt8](repeating: 0, count: 65536)
            let n = buf.withUnsafeMutableBytes { XattrCalls.get(p(rel), name, $0.baseAddress, $0.count) }
            return n < 0 ? .of(-1) : ModelOutcome(rc: n, err: 0, data: Array(buf[0..<n]))
        case let .listxattr(rel):
            let names = Self.xattrList(p(rel), follow: true)
            return names.map { ModelOutcome(rc: $0.count, err: 0, data: Array($0.joined(separator: ",").utf8)) } ?? .of(-1)
        case let .removexattr(rel, name): return .of(Int(XattrCalls.remove(p(rel), name)))
        case let .fsync(slot): return .of(Int(fsync(fds[slot].fd[side])))
        case let .fsyncPath(rel, directory):
            let fd = open(p(rel), directory ? O_RDONLY | O_DIRECTORY : O_RDONLY)
            if fd < 0 { return .of(-1) }
            let r = fsync(fd)
            let e = errno
            close(fd)
            return r == 0 ? ModelOutcome(rc: 0, err: 0) : ModelOutcome(rc: -1, err: e)
        case let .fstat(slot):
            var st = stat()
            return fstat(fds[slot].fd[side], &st) == 0 ? ModelOutcome(rc: 0, err: 0, data: Array(Self.statText(st).utf8)) : .of(-1)
        case let .lstat(rel):
            var st = stat()
            return lstat(p(rel), &st) == 0 ? ModelOutcome(rc: 0, err: 0, data: Array(Self.statText(st).utf8)) : .of(-1)
        case .remount:
            return ModelOutcome(rc: 0, err: 0)
        }
    }

    /// user.* names of `path`, sorted (nil with errno set when listing fails).
    static func xattrList(_ path: String, follow: Bool) -> [String]? {
        var buf = [CChar](repeating: 0, count: 65536)
        let n = follow ? XattrCalls.list(path, &buf, buf.count) : XattrCalls.llist(path, &buf, buf.count)
        if n < 0 { return nil }
        let bytes = buf[0..<n].map { UInt8(bitPattern: $0) }
        return bytes.split(separator: 0).map { String(decoding: $0, as: UTF8.self) }.filter { $0.hasPrefix("user.") }.sorted()
    }

    // MARK: mtimes

    func refIno(_ rel: String, follow: Bool) -> UInt64? {
        var st = stat()
        let r = follow ? stat(full(1, rel), &st) : lstat(full(1, rel), &st)
        return r == 0 ? UInt64(st.st_ino) : nil
    }

    func parent(_ rel: String) -> String {
        guard let slash = rel.lastIndex(of: "/") else { return "" }
        return String(rel[..<slash])
    }

    func unpin(_ rel: String, follow: Bool = true) {
        if let i = refIno(rel, follow: follow) { pinned.remove(i) }
    }

    /// Forgets the pinned mtimes the operation may change (conservatively), before and after it runs.
    func unpinAround(_ op: ModelOp, after: Bool, succeeded: Bool) {
        switch op {
        case let .open(rel, _, _), let .writePath(rel, _, _, _), let .truncate(rel, _):
            unpin(parent(rel))
            unpin(rel)
            // Through a symbolic link, O_CREAT makes the file in the directory of the link's target.
            if after, let target = realpath(full(1, rel), nil) {
                defer { free(target) }
                unpin(
                    String(cString: target).replacingOccurrences(of: full(1, ""), with: "", options: .anchored).split(separator: "/").dropLast()
                        .joined(separator: "/"))
            }
        case let .pwrite(slot, _, _), let .ftruncate(slot, _):
            var st = stat()
            if fstat(fds[slot].fd[1], &st) == 0 { pinned.remove(UInt64(st.st_ino)) }
        case let .rename(a, b):
            unpin(parent(a))
            unpin(parent(b))
            unpin(a, follow: false)
            unpin(b, follow: false)
        case let .link(_, b), let .symlink(_, b), let .mkdir(b, _):
            unpin(parent(b))
            unpin(b, follow: false)
        case let .unlink(rel), let .rmdir(rel):
            unpin(parent(rel))
        case let .utimens(rel, _, m, nofollow):
            guard after, succeeded, let i = refIno(rel, follow: !nofollow) else { return }
            if m.tv_nsec == Self.utimeNow { pinned.remove(i) } else if m.tv_nsec != Self.utimeOmit { pinned.insert(i) }
        default: break
        }
    }

    // MARK: comparing

    /// Differences between the two trees (empty when they match).
    func compareTrees() -> [String] {
        var diffs: [String] = []
        var inodes: [UInt64: UInt64] = [:], back: [UInt64: UInt64] = [:]
        func visit(_ rel: String) {
            guard diffs.count < 20 else { return }
            var m = stat(), r = stat()
            let ms = lstat(full(0, rel), &m), me = errno
            let rs = lstat(full(1, rel), &r), re = errno
            let show = rel.isEmpty ? "." : rel
            guard ms == 0, rs == 0 else {
                diffs.append(
                    "\(show): lstat mount \(ms == 0 ? "ok" : ModelOutcome.errnoName(me)), reference \(rs == 0 ? "ok" : ModelOutcome.errnoName(re))")
                return
            }
            let mt = Self.statText(m), rt = Self.statText(r)
            if mt != rt { diffs.append("\(show): mount \(mt), reference \(rt)") }
            if pinned.contains(UInt64(r.st_ino)), m.st_mtim.tv_sec != r.st_mtim.tv_sec || m.st_mtim.tv_nsec != r.st_mtim.tv_nsec {
                diffs.append(
                    "\(show): mtime mount \(m.st_mtim.tv_sec).\(m.st_mtim.tv_nsec), reference \(r.st_mtim.tv_sec).\(r.st_mtim.tv_nsec) (set by utimensat)"
                )
            }
            // Hard links: the same reference inode is the same mount inode, and only that one.
            let mi = UInt64(m.st_ino), ri = UInt64(r.st_ino)
            if let known = inodes[ri], known != mi { diffs.append("\(show): reference inode \(ri) is mount inode \(mi) here and \(known) elsewhere") }
            if let known = back[mi], known != ri { diffs.append("\(show): mount inode \(mi) is reference inode \(ri) here and \(known) elsewhere") }
            inodes[ri] = mi
            back[mi] = ri
            let mx = Self.xattrList(full(0, rel), follow: false), rx = Self.xattrList(full(1, rel), follow: false)
            if mx != rx { diffs.append("\(show): xattrs mount \(mx ?? ["error"]), reference \(rx ?? ["error"])") }
            for name in rx ?? [] where mx?.contains(name) == true {
                let mv = Self.xattrValue(full(0, rel), name), rv = Self.xattrValue(full(1, rel), name)
                if mv != rv {
                    diffs.append(
                        "\(show): xattr \(name) mount \(mv.map { "\($0.count) bytes" } ?? "error"), reference \(rv.map { "\($0.count) bytes" } ?? "error")"
                    )
                }
            }
            guard (m.st_mode & S_IFMT) == (r.st_mode & S_IFMT) else { return }
            switch r.st_mode & S_IFMT {
            case S_IFREG:
                let mc = E2E.read(full(0, rel)), rc = E2E.read(full(1, rel))
                if mc != rc {
                    let first = zip(mc ?? [], rc ?? []).enumerated().first { $0.element.0 != $0.element.1 }?.offset
                    diffs.append(
                        "\(show): contents differ: mount \(mc.map { "\($0.count) bytes" } ?? "unreadable"), reference \(rc.map { "\($0.count) bytes" } ?? "unreadable"), first difference at \(first.map(String.init) ?? "the end")"
                    )
                }
            case S_IFLNK:
                let ml = try? FileManager.default.destinationOfSymbolicLink(atPath: full(0, rel))
                let rl = try? FileManager.default.destinationOfSymbolicLink(atPath: full(1, rel))
                if ml != rl { diffs.append("\(show): symlink mount -> \(ml ?? "?"), reference -> \(rl ?? "?")") }
            case S_IFDIR:
                let mn = ((try? FileManager.default.contentsOfDirectory(atPath: full(0, rel))) ?? ["<unlistable>"]).sorted()
                let rn = ((try? FileManager.default.contentsOfDirectory(atPath: full(1, rel))) ?? ["<unlistable>"]).sorted()
                if mn != rn { diffs.append("\(show)/: mount lists \(mn), reference \(rn)") }
                for name in rn where mn.contains(name) { visit(rel.isEmpty ? name : rel + "/" + name) }
            default: break
            }
        }
        visit("")
        return diffs
    }

    static func xattrValue(_ path: String, _ name: String) -> [UInt8]? {
        var buf = [UInt8](repeating: 0, count: 65536)
        let n = buf.withUnsafeMutableBytes { XattrCalls.lget(path, name, $0.baseAddress, $0.count) }
        return n < 0 ? nil : Array(buf[0..<n])
    }

    func closeAll() {
        for f in fds {
            close(f.fd[0])
            close(f.fd[1])
        }
        fds.removeAll()
    }

    // MARK: running

    /// Runs the seed; returns nil when everything matched, else what went wrong (with the operation index).
    func run() throws -> String? {
        for side in 0...1 {
            guard mkdir(roots[side], 0o755) == 0 else { return "mkdir \(roots[side]): \(ModelOutcome.errnoName(errno))" }
        }
        if mountRoots.count > 1 { usleep(1_100_000) }  // the other mount's kernel may have cached "no such directory"
        defer { closeAll() }
        func failure(_ index: Int, _ op: ModelOp, _ what: String) -> String {
            "seed \(seed), operation #\(index) \(op): \(what)\nlast operations:\n  " + history.suffix(25).joined(separator: "\n  ")
        }
        func compare(_ index: Int, _ op: ModelOp, _ when: String) -> String? {
            checks += 1
            let d = compareTrees()
            return d.isEmpty ? nil : failure(index, op, "trees differ\(when):\n  " + d.joined(separator: "\n  "))
        }
        // Checks come between operations and draw nothing: COFFER_MODEL_CHECK_EVERY does not change the sequence.
        for index in 0...operations {
            if mountRoots.count > 1, index > 0, index % every == 0 {
                // The other machine from here on, once what this one's kernel showed has expired there (1 s).
                // Descriptors stay with the machine that opened them: close them (on both sides).
                closeAll()
                roots[0] = mountRoots[(index / every) % mountRoots.count]
                history.append("(descriptors closed; now on \(roots[0]))")
                usleep(1_100_000)
            }
            let op: ModelOp = index == operations ? .remount : draw()
            history.append("#\(index) \(op)")
            if case .remount = op {
                if let f = compare(index, op, " before the remount") { return f }
                closeAll()
                try sandbox.remount()
                remounts += 1
                if let f = compare(index, op, " after the remount") { return f }
                continue
            }
            unpinAround(op, after: false, succeeded: false)
            let m = apply(op, side: 0)
            let r = apply(op, side: 1)
            if case let .close(slot) = op {
                fds.remove(at: slot)
            }
            if case let .open(rel, _, _) = op, m.rc >= 0 || r.rc >= 0 {
                if m.rc >= 0 && r.rc >= 0 {
                    fds.append((fd: [Int32(m.rc), Int32(r.rc)], path: rel))
                } else {
                    if m.rc >= 0 { close(Int32(m.rc)) }
                    if r.rc >= 0 { close(Int32(r.rc)) }
                }
            }
            unpinAround(op, after: true, succeeded: r.rc >= 0)
            // Descriptors are numbers that differ between the sides; only success or errno counts for open.
            let same: Bool
            if case .open = op { same = (m.rc >= 0) == (r.rc >= 0) && (m.rc >= 0 || m.err == r.err) } else { same = m == r }
            if !same {
                return failure(index, op, "mount gave \(m), the reference \(r)" + (E2E.isMounted(sandbox.mnt) ? "" : " (the mount is gone)"))
            }
            if (index + 1) % checkEvery == 0, index + 1 < operations, let f = compare(index, op, " after it") { return f }
        }
        return nil
    }
}

@Suite("Model: random operations, mount vs a plain directory", .enabled(if: E2E.fuseAvailable, "/dev/fuse is not usable"))
struct ModelTests {
    @Test func randomOperationsMatchAPlainDirectory() throws {
        let env = ProcessInfo.processInfo.environment
        let seeds: [UInt64]
        let base: UInt64?
        if let one = env["COFFER_MODEL_SEED"].flatMap({ UInt64($0) }) {
            seeds = [one]
            base = nil
        } else {
            let count = env["COFFER_MODEL_SEEDS"].flatMap { Int($0) } ?? 30
            let b = env["COFFER_MODEL_BASE"].flatMap { UInt64($0) } ?? UInt64.random(in: 1...999_999_999)
            seeds = (0..<count).map { b &+ UInt64($0) }
            base = b
        }
        let operations = env["COFFER_MODEL_OPS"].flatMap { Int($0) } ?? 200
        let checkEvery = max(1, env["COFFER_MODEL_CHECK_EVERY"].flatMap { Int($0) } ?? 50)
        print(
            "ModelTests: \(seeds.count) seeds\(base.map { " from \($0) (COFFER_MODEL_BASE=\($0) replays the run)" } ?? ""), \(operations) operations each"
        )
        let sb = try Sandbox("model")
        defer { sb.cleanup() }
        try sb.initAndMount()
        let refBase = sb.root + "/ref"
        try #require(mkdir(refBase, 0o755) == 0)
        let started = Date()
        var failed: [UInt64] = []
        var remounts = 0, checks = 0
        for seed in seeds {
            let run = ModelRun(
                seed: seed, sandbox: sb, mountRoot: sb.mnt + "/s\(seed)", refRoot: refBase + "/s\(seed)",
                operations: operations, checkEvery: checkEvery)
            let failure = try run.run()
            remounts += run.remounts
            checks += run.checks
            if let failure {
                failed.append(seed)
                print("ModelTests: FAILED \(failure)\nModelTests: COFFER_MODEL_SEED=\(seed) replays it")
                Issue.record("\(failure)\n(COFFER_MODEL_SEED=\(seed) replays it)")
            }
            guard E2E.isMounted(sb.mnt) else {
                Issue.record("the mount is gone after seed \(seed)")
                break
            }
        }
        print(
            "ModelTests: \(seeds.count) seeds × \(operations) operations in \(Int(Date().timeIntervalSince(started))) s, \(remounts) remounts, \(checks) tree comparisons; failed seeds: \(failed.isEmpty ? "none" : failed.map(String.init).joined(separator: " "))"
        )
    }
}
