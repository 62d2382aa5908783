import CofferCrypto
import Foundation
import Glibc
import Logging
import CofferTestSupport
import Testing
@testable import CofferFS
@testable import CofferStore
import CofferStoreTestSupport

let root: InodeNumber = 1
let caller = Caller(uid: 0, gid: 0)

func makeTempDir(_ prefix: String = "coffer-fs-test") throws -> String {
    var template = Array((NSTemporaryDirectory() as NSString).appendingPathComponent("\(prefix)-XXXXXX").utf8CString)
    guard let p = template.withUnsafeMutableBufferPointer({ mkdtemp($0.baseAddress!) }) else { throw TestFailure("mkdtemp: \(errno)") }
    return String(cString: p)
}

/// Runs `body` and returns the FSError it threw (nil if none).
func fsError(sourceLocation: SourceLocation = #_sourceLocation, _ body: () throws -> Void) -> FSError? {
    do {
        try body()
        return nil
    } catch let e as FSError { return e } catch {
        Issue.record("expected an FSError, got \(error)", sourceLocation: sourceLocation)
        return nil
    }
}

/// A filesystem over a real store (random keys: no KDF, fast): a SQLite file in a fresh temp dir, or
/// with `COFFER_TEST_ENGINE=postgres` a fresh schema in the tests' PostgreSQL cluster, so every test
/// runs on either engine. Tests of SQLite's own behaviour ask for `engine: .sqlite`.
final class Fixture {
    let dir: String
    let keys: ContainerKeys
    let chunkSize: Int
    let made: TestStore
    private(set) var store: EntityStore
    private(set) var fs: CofferFileSystem
    private var open = true
    var storePath: String { dir + "/" + SQLiteBackend.fileName }

    /// `registry: .wholeChunks` makes a store that seals chunks whole, as stores made before session 24.
    init(
        chunkSize: Int = 65536, options: CofferFileSystem.Options = .init(), engine: StoreEngine = .fromEnvironment,
        registry: TransformerRegistry = .standard
    ) throws {
        dir = try makeTempDir()
        self.chunkSize = chunkSize
        made = try TestStore.create(engine, in: dir, name: SQLiteBackend.fileName, chunkSize: chunkSize, registry: registry)
        keys = made.keys
        store = try made.open()
        fs = try CofferFileSystem(store: store, chunkSize: chunkSize, options: options, statfsPath: dir, logger: Logger(label: "test"))
    }

    /// Clean unmount and a fresh mount over the same store file.
    func remount(options: CofferFileSystem.Options = .init()) throws {
        if open { fs.shutdown() }
        store = try made.open(readOnly: options.readOnly)
        fs = try CofferFileSystem(store: store, chunkSize: chunkSize, options: options, statfsPath: dir, logger: Logger(label: "test"))
        open = true
    }

    /// A "crash": commit what is pending (as the group committer would have), then forget the
    /// filesystem without any release or shutdown, and mount a new one over a new store
    /// (`beforeMount` sees that store first).
    func crashAndRemount(options: CofferFileSystem.Options = .init(), beforeMount: (EntityStore) throws -> Void = { _ in }) throws {
        try fs.commit()
        store = try made.open(readOnly: options.readOnly)
        try beforeMount(store)
        fs = try CofferFileSystem(store: store, chunkSize: chunkSize, options: options, statfsPath: dir, logger: Logger(label: "test"))
        open = true
    }

    func cleanup() {
        if open {
            fs.shutdown()
            open = false
        }
        try? FileManager.default.removeItem(atPath: dir)
    }

    // MARK: Conveniences

    @discardableResult
    func create(_ name: String, in parent: InodeNumber = root, mode: UInt32 = 0o644, flags: Int32 = O_RDWR) throws -> (
        ino: InodeNumber, handle: HandleID
    ) {
        let (attr, open) = try fs.create(parent: parent, name: b(name), mode: mode, flags: flags, caller: caller)
        return (attr.ino, open.handle)
    }

    @discardableResult
    func write(_ ino: InodeNumber, _ handle: HandleID, at offset: UInt64, _ data: [UInt8]) throws -> Int {
        try data.withUnsafeBytes { try fs.write(ino, handle: handle, offset: offset, data: $0) }
    }

    /// Creates a file holding `content` and closes it.
    @discardableResult
    func file(_ name: String, in parent: InodeNumber = root, _ content: [UInt8] = []) throws -> InodeNumber {
        let (ino, h) = try create(name, in: parent)
        if !content.isEmpty { try write(ino, h, at: 0, content) }
        fs.release(ino, handle: h)
        return ino
    }

    /// The whole content, through a fresh read-only handle.
    func contents(_ ino: InodeNumber) throws -> [UInt8] {
        let h = try fs.open(ino, flags: O_RDONLY, caller: caller).handle
        defer { fs.release(ino, handle: h) }
        let size = try fs.getattr(ino).size
        return try fs.read(ino, handle: h, offset: 0, size: Int(size) + 1)
    }

    func ino(_ name: String, in parent: InodeNumber = root) throws -> InodeNumber {
        try fs.lookup(parent: parent, name: b(name)).ino
    }

    @discardableResult
    func mkdir(_ name: String, in parent: InodeNumber = root, mode: UInt32 = 0o755) throws -> InodeNumber {
        try fs.mkdir(parent: parent, name: b(name), mode: mode, caller: caller).ino
    }

    /// Names in a directory (without "." and ".."), read in pages of `page`.
    func list(_ dir: InodeNumber = root, page: Int = 1000) throws -> [String] {
        let h = try fs.opendir(dir, caller: caller)
        defer { fs.releasedir(dir, handle: h) }
        var out: [String] = []
        var offset: Int64 = 0
        while true {
            let batch = try fs.readdir(dir, handle: h, offset: offset, limit: page, plus: false)
            guard let last = batch.last else { break }
            out += batch.map { String(decoding: $0.name, as: UTF8.self) }
            offset = last.offset
        }
        return out.filter { $0 != "." && $0 != ".." }
    }

    /// What the store still holds of a removed file (inode, chunks, xattrs, orphan row): empty once it is gone.
    func leftovers(_ ino: InodeNumber, content cid: UInt64) throws -> [String] {
        var left: [String] = []
        if try store.inode(ino) != nil { left.append("inode") }
        if try !store.chunkIndices(file: cid).isEmpty { left.append("chunks") }
        if try !store.xattrs(ino).isEmpty { left.append("xattrs") }
        if try store.orphans().contains(ino) { left.append("orphan row") }
        return left
    }

    func contentId(_ ino: InodeNumber) -> UInt64? { fs.inodes[ino]?.record.contentId ?? (try? store.inode(ino))?.contentId }
}
