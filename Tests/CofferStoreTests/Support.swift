import CofferCrypto
import Foundation
import GRDB
import Glibc
import CofferTestSupport
import Testing
@testable import CofferStore
import CofferStoreTestSupport

/// The cheapest KDF the floor allows (about 0.15 s).
let testKDF = KDFChoice.scrypt(logN: 16, r: 8, p: 1)
let testPassword = "correct horse battery staple"

func fastOptions(recovery: Bool = true, chunkSize: Int = 65536) -> Container.CreateOptions {
    var o = Container.CreateOptions()
    o.kdf = testKDF
    o.withRecoveryKey = recovery
    o.chunkSize = chunkSize
    return o
}

func secure(_ s: String) -> SecureBytes { SecureBytes(copying: Array(s.utf8)) }
func passwordSecret(_ s: String) -> Secret { Secret(kind: .password, bytes: secure(s)) }

/// A fresh private directory, removed when `body` returns (or throws).
func withTempDir<T>(_ body: (String) throws -> T) throws -> T {
    var template = Array((NSTemporaryDirectory() as NSString).appendingPathComponent("coffer-store-test-XXXXXX").utf8CString)
    guard let p = template.withUnsafeMutableBufferPointer({ mkdtemp($0.baseAddress!) }) else {
        throw TestFailure("mkdtemp failed: \(errno)")
    }
    let path = String(cString: p)
    defer { try? FileManager.default.removeItem(atPath: path) }
    return try body(path)
}

struct MadeContainer {
    let root: String
    let container: Container
    let keys: ContainerKeys
    let recoveryKey: String?
}

func makeContainer(
    in dir: String, name: String = "vault", password: String = testPassword,
    recovery: Bool = true, chunkSize: Int = 65536
) throws -> MadeContainer {
    let root = dir + "/" + name
    let made = try Container.create(at: root, password: secure(password), options: fastOptions(recovery: recovery, chunkSize: chunkSize))
    return MadeContainer(root: root, container: made.container, keys: made.keys, recoveryKey: made.recoveryKey)
}

func fileBytes(_ path: String) -> [UInt8] {
    FileManager.default.contents(atPath: path).map { [UInt8]($0) } ?? []
}

/// Reads, edits and rewrites a container header file (as an attacker with a text editor would).
func editHeader(_ root: String, _ edit: (inout ContainerHeader) -> Void) throws {
    let path = root + "/" + ContainerHeader.fileName
    guard let data = FileManager.default.contents(atPath: path) else { throw TestFailure("no header at \(path)") }
    var header = try JSONDecoder().decode(ContainerHeader.self, from: data)
    edit(&header)
    let encoder = JSONEncoder()
    encoder.outputFormatting = [.sortedKeys, .prettyPrinted, .withoutEscapingSlashes]
    try encoder.encode(header).write(to: URL(fileURLWithPath: path))
}

func readHeader(_ root: String) throws -> ContainerHeader {
    guard let data = FileManager.default.contents(atPath: root + "/" + ContainerHeader.fileName) else { throw TestFailure("no header") }
    return try JSONDecoder().decode(ContainerHeader.self, from: data)
}

/// Runs `body` and returns the ContainerError it threw (nil if none; any other error is recorded).
func containerError(sourceLocation: SourceLocation = #_sourceLocation, _ body: () throws -> Void) -> ContainerError? {
    do {
        try body()
        return nil
    } catch let e as ContainerError { return e } catch {
        Issue.record("expected a ContainerError, got \(error)", sourceLocation: sourceLocation)
        return nil
    }
}

/// Runs `body` and returns the StoreError it threw (nil if none; any other error is recorded).
func storeError(sourceLocation: SourceLocation = #_sourceLocation, _ body: () throws -> Void) -> StoreError? {
    do {
        try body()
        return nil
    } catch let e as StoreError { return e } catch {
        Issue.record("expected a StoreError, got \(error)", sourceLocation: sourceLocation)
        return nil
    }
}

extension StoreError {
    /// The kind named by an authentication failure, nil for any other error.
    var authenticationFailureKind: EntityKind? {
        if case let .authenticationFailed(kind, _) = self { return kind }
        return nil
    }
}

/// A test store with random keys (no KDF: fast), created in `dir`.
func makeStore(in dir: String, name: String = "store.db") throws -> (store: EntityStore, keys: ContainerKeys, path: String) {
    let keys = try ContainerKeys(master: try SecureBytes.random(count: 32), containerId: try Random.bytes(16))
    let path = dir + "/" + name
    try EntityStore.create(at: path, keys: keys, registry: .standard, chunkSize: 65536)
    return (try EntityStore.open(at: path, keys: keys), keys, path)
}

extension EntityStore {
    /// Puts (uncommitted) `count` sealed 64 KiB chunks of `file`, chunk i filled with `seed &+ i`.
    func putTestChunks(file: UInt64, count: Int, seed: UInt8, keys: ContainerKeys) throws {
        let cipher = try contentCipher(contentId: file)
        for i in 0..<count {
            let plain = [UInt8](repeating: seed &+ UInt8(i & 0xFF), count: 65536)
            try putChunk(file: file, index: UInt64(i), sealed: try cipher.seal(plain, index: UInt64(i)))
        }
    }
}

/// Checks that `file` holds exactly chunks 0..<count as `putTestChunks` wrote them with `seed`.
func expectTestChunks(_ store: EntityStore, file: UInt64, count: Int, seed: UInt8, sourceLocation: SourceLocation = #_sourceLocation) throws {
    let cipher = try store.contentCipher(contentId: file)
    let chunks = try store.sealedChunks(file: file, first: 0, last: UInt64(count))
    #expect(chunks.map(\.index) == (0..<UInt64(count)).map { $0 }, sourceLocation: sourceLocation)
    var out = [UInt8](repeating: 0, count: 65536)
    for c in chunks {
        let n = try out.withUnsafeMutableBytes { try cipher.open(c.sealed, index: c.index, into: $0) }
        #expect(n == 65536 && out.allSatisfy { $0 == seed &+ UInt8(c.index & 0xFF) }, "chunk \(c.index) differs", sourceLocation: sourceLocation)
    }
}

func sampleInode(size: UInt64 = 0, contentId: UInt64 = 0, mode: UInt32 = 0o100644, target: StoredPath? = nil) -> InodeRecord {
    let t = StoredTime(seconds: 1_700_000_000, nanoseconds: 123_456_789)
    return InodeRecord(
        mode: mode, uid: 1000, gid: 1000, nlink: 1, size: size, rdev: 0, atime: t, mtime: t, ctime: t,
        contentId: contentId, symlinkTarget: target)
}

// MARK: Error expectations (the shared ones are in CofferTestSupport)

func expectAuthFailure<T>(
    _ kind: EntityKind, _ comment: Comment? = nil, sourceLocation: SourceLocation = #_sourceLocation,
    _ body: () throws -> T
) {
    do {
        _ = try body()
        Issue.record(
            "expected an authentication failure of a \(kind), nothing was thrown\(comment.map { " (\($0))" } ?? "")", sourceLocation: sourceLocation)
    } catch let e as StoreError {
        if e.authenticationFailureKind != kind {
            Issue.record(
                "expected an authentication failure of a \(kind), got \(e)\(comment.map { " (\($0))" } ?? "")", sourceLocation: sourceLocation)
        }
    } catch {
        Issue.record("expected a StoreError, got \(error)", sourceLocation: sourceLocation)
    }
}

/// A test store on `engine` (random keys), and what opens it again.
func makeStore(_ engine: StoreEngine, in dir: String) throws -> (store: EntityStore, keys: ContainerKeys, made: TestStore) {
    let made = try TestStore.create(engine, in: dir)
    return (try made.open(), made.keys, made)
}

/// Runs `sql` on the closed SQLite store at `path` behind its back, as damage or an attacker would.
func editStoreFile(_ path: String, _ sql: String, _ arguments: StatementArguments = []) throws {
    let queue = try DatabaseQueue(path: path)
    try queue.write { db in try db.execute(sql: sql, arguments: arguments) }
    try queue.close()
}
