import CofferCrypto
import Foundation
import Glibc
import GRDB
import Logging
import CofferTestSupport
import Testing
@testable import CofferCheck
@testable import CofferFS
@testable import CofferStore

// Small stores made through CofferFS (as a mount would), then damaged through the store's own
// APIs and raw SQL on the writer connection, then checked and repaired as `coffer fsck` does.

let caller = Caller(uid: 0, gid: 0)
let rootIno: InodeNumber = 1

/// A store in a temp dir with a filesystem over it (random keys, no KDF). `unmount()` ends the
/// filesystem; `check()` and `repair()` then work on the store file as `coffer fsck` does.
final class CheckFixture {
    let dir: String
    let keys: ContainerKeys
    let chunkSize: Int
    private(set) var fs: CofferFileSystem?
    var storePath: String { dir + "/" + SQLiteBackend.fileName }

    convenience init(chunkSize: Int = 4096) throws {
        try self.init(chunkSize: chunkSize, keys: try ContainerKeys(master: try SecureBytes.random(count: 32), containerId: try Random.bytes(16)))
    }

    init(chunkSize: Int, keys: ContainerKeys) throws {
        var template = Array((NSTemporaryDirectory() as NSString).appendingPathComponent("coffer-check-test-XXXXXX").utf8CString)
        guard let p = template.withUnsafeMutableBufferPointer({ mkdtemp($0.baseAddress!) }) else { throw TestFailure("mkdtemp: \(errno)") }
        dir = String(cString: p)
        self.chunkSize = chunkSize
        self.keys = keys
        try EntityStore.create(at: storePath, keys: keys, registry: .standard, chunkSize: chunkSize)
        try mount()
    }

    func mount() throws {
        let store = try EntityStore.open(at: storePath, keys: keys)
        fs = try CofferFileSystem(store: store, chunkSize: chunkSize, options: .init(), statfsPath: dir, logger: Logger(label: "test"))
    }

    func unmount() {
        fs?.shutdown()
        fs = nil
    }

    /// A daemon killed now: what is committed stays, nothing is released or shut down.
    func crash() throws {
        try fs?.commit()
        fs = nil
    }

    func cleanup() {
        unmount()
        try? FileManager.default.removeItem(atPath: dir)
    }

    var mounted: CofferFileSystem {
        get throws { try required(fs, "the filesystem is not mounted") }
    }

    /// Opens the store (read-write) for damage or inspection, commits and closes it.
    func edit<T>(_ body: (EntityStore) throws -> T) throws -> T {
        let store = try EntityStore.open(at: storePath, keys: keys)
        defer { store.close() }
        let result = try body(store)
        try store.commit()
        return result
    }

    func check() throws -> CheckResult {
        let store = try EntityStore.open(at: storePath, keys: keys, readOnly: true, foreign: .tolerate)
        defer { store.close() }
        return try Checker(store: store, chunkSize: chunkSize).run()
    }

    /// As `coffer fsck --repair`: passes of repair and check while repairable problems are left.
    func repair(_ result: CheckResult) throws -> RepairSummary {
        try Repairer.repairInPasses(result, open: { try EntityStore.open(at: storePath, keys: keys, foreign: .repair) }, check: check).summary
    }

    /// Check, repair, check again: the second check must be clean.
    @discardableResult
    func repairAndRecheck(_ result: CheckResult, sourceLocation: SourceLocation = #_sourceLocation) throws -> RepairSummary {
        let summary = try repair(result)
        let after = try check()
        let leftover = after.problems.map(\.description)
        #expect(leftover.isEmpty, "problems left after the repair: \(leftover)", sourceLocation: sourceLocation)
        return summary
    }

    // MARK: Building content through the filesystem

    @discardableResult
    func file(_ name: String, in parent: InodeNumber = rootIno, _ content: [UInt8] = []) throws -> InodeNumber {
        let fs = try mounted
        let (attr, open) = try fs.create(parent: parent, name: b(name), mode: 0o644, flags: O_RDWR, caller: caller)
        if !content.isEmpty { _ = try content.withUnsafeBytes { try fs.write(attr.ino, handle: open.handle, offset: 0, data: $0) } }
        fs.release(attr.ino, handle: open.handle)
        return attr.ino
    }

    @discardableResult
    func mkdir(_ name: String, in parent: InodeNumber = rootIno) throws -> InodeNumber {
        try mounted.mkdir(parent: parent, name: b(name), mode: 0o755, caller: caller).ino
    }

    /// Follows a path from the root.
    func ino(_ path: String) throws -> InodeNumber {
        var ino = rootIno
        for part in path.split(separator: "/") { ino = try mounted.lookup(parent: ino, name: b(String(part))).ino }
        return ino
    }

    func contents(_ path: String) throws -> [UInt8] {
        let fs = try mounted
        let ino = try ino(path)
        let h = try fs.open(ino, flags: O_RDONLY, caller: caller).handle
        defer { fs.release(ino, handle: h) }
        let size = try fs.getattr(ino).size
        return try fs.read(ino, handle: h, offset: 0, size: Int(size) + 1)
    }

    func names(_ path: String) throws -> [String] {
        let fs = try mounted
        let dir = try ino(path)
        let h = try fs.opendir(dir, caller: caller)
        defer { fs.releasedir(dir, handle: h) }
        let batch = try fs.readdir(dir, handle: h, offset: 0, limit: 10_000, plus: false)
        return batch.map { String(decoding: $0.name, as: UTF8.self) }.filter { $0 != "." && $0 != ".." }
    }
}

// MARK: Damage

extension EntityStore {
    /// Runs raw SQL inside the group transaction (tests only: the damage an attacker makes).
    func execute(_ sql: String, _ arguments: StatementArguments = StatementArguments()) throws {
        try sqlite.write { db in try db.execute(sql: sql, arguments: arguments) }
    }

    /// Flips one byte of a sealed value in place.
    func flip(table: String, value: [UInt8], where condition: String) throws {
        var bytes = value
        guard !bytes.isEmpty else { throw TestFailure("empty value") }
        bytes[bytes.count / 2] ^= 0x40
        try execute("UPDATE \(table) SET value = ? WHERE \(condition)", [Data(bytes)])
    }
}

// MARK: Looking at results

func has(_ r: CheckResult, _ kind: ProblemKind, path: String? = nil, inode: UInt64? = nil) -> Bool {
    r.problems.contains { p in p.kind == kind && (path == nil || p.path == path) && (inode == nil || p.inode == inode) }
}

func kinds(_ r: CheckResult) -> [String] { r.problems.map(\.description) }

extension CheckFixture {
    /// A second fixture over a copy of this one's store file (same keys); this one must be unmounted.
    func copy() throws -> CheckFixture {
        try CheckFixture(copying: self)
    }

    convenience init(copying other: CheckFixture) throws {
        try self.init(chunkSize: other.chunkSize, keys: other.keys)
        unmount()
        try FileManager.default.removeItem(atPath: storePath)
        for suffix in ["-wal", "-shm"] { try? FileManager.default.removeItem(atPath: storePath + suffix) }
        try FileManager.default.copyItem(atPath: other.storePath, toPath: storePath)
    }

    func write(_ path: String, at offset: UInt64, _ bytes: [UInt8]) throws {
        let fs = try mounted
        let ino = try ino(path)
        let h = try fs.open(ino, flags: O_RDWR, caller: caller).handle
        defer { fs.release(ino, handle: h) }
        _ = try bytes.withUnsafeBytes { try fs.write(ino, handle: h, offset: offset, data: $0) }
    }

    /// Every regular file under `path` read whole (errors propagate), by path.
    func readAll(_ path: String = "/") throws -> [String: [UInt8]] {
        let fs = try mounted
        var out: [String: [UInt8]] = [:]
        var stack = [(try ino(path), path == "/" ? "" : path)]
        var seen = Set<InodeNumber>()
        while let (dir, dirPath) = stack.popLast() {
            guard seen.insert(dir).inserted else { continue }
            let h = try fs.opendir(dir, caller: caller)
            defer { fs.releasedir(dir, handle: h) }
            for e in try fs.readdir(dir, handle: h, offset: 0, limit: 100_000, plus: false) where e.name != b(".") && e.name != b("..") {
                let p = dirPath + "/" + String(decoding: e.name, as: UTF8.self)
                let attr = try fs.lookup(parent: dir, name: e.name)
                if attr.mode & UInt32(S_IFMT) == UInt32(S_IFDIR) {
                    stack.append((attr.ino, p))
                    continue
                }
                guard attr.mode & UInt32(S_IFMT) == UInt32(S_IFREG) else { continue }
                out[p] = try contents(p)
            }
        }
        return out
    }
}

extension [UInt8] {
    var hex: String { map { String($0, radix: 16).count == 1 ? "0" + String($0, radix: 16) : String($0, radix: 16) }.joined() }
}
