import CofferStore
import Glibc

/// The filesystem as one of several mounts of a shared container (PostgreSQL; docs/ARCHITECTURE.md,
/// "Several mounts at once"). It wraps a `CofferFileSystem` opened `coherent` and adds what sharing
/// needs, so that a mount alone on its disk keeps every shortcut of the single-mount design:
///
/// - Each change (a namespace operation, a write, setattr, xattrs, fallocate) is a group transaction
///   of its own: begun with the container's writer lock, so it is decided on the committed state of
///   every mount (two creates of one name: one EEXIST; rmdir of a directory just filled: ENOTEMPTY),
///   and committed at its end (not durably: fsync is), so the lock is never held between requests and
///   the other mounts see it at once.
/// - Records read before another mount's commit are read again before use (`CofferFileSystem.state`).
/// - Close-to-open: every OPEN asks the server for its state first, and a file changed elsewhere
///   since the kernel last saw it is opened with the kernel's pages and attributes dropped.
/// - A read whose chunks changed under it (a commit between the map and the rows) reads again.
/// - The kernel keeps entries and attributes 1 s and no negative entries: the bound on how late
///   another mount's changes show in `ls` and `stat` (docs; README "Several machines").
public final class SharedMount: FileSystemOperations, @unchecked Sendable {
    public let fs: CofferFileSystem
    /// One change at a time on this mount: its group is the one open transaction of the store.
    private let changes = Lock()

    public init(_ fs: CofferFileSystem) { self.fs = fs }

    public var cacheTimeouts: CacheTimeouts { CacheTimeouts(entry: 1, attributes: 1, negativeEntry: 0) }
    public var isReadOnly: Bool { fs.isReadOnly }
    /// OPEN must reach us (close-to-open), and the kernel must not keep listings (opendir answered).
    public var opensWithoutHandles: Bool { false }

    /// Runs one change as a group of its own (see above); `durable` for fsync.
    func change<T>(durable: Bool = false, _ body: () throws(FSError) -> T) throws(FSError) -> T {
        try fs.checkWritable()
        return try changes.withLock { () throws(FSError) -> T in
            try fs.beginGroup()
            let result: T
            do throws(FSError) { result = try body() } catch {
                try? fs.commitGroup(durable: false)  // what the failed change did write (nothing, usually) goes as one
                throw error
            }
            try fs.commitGroup(durable: durable)
            return result
        }
    }

    /// Reads again when the chunks changed under the read (another mount committed between the file's
    /// map and its rows): every record is then read anew. A store that stays wrong stays EIO.
    func rereading<T>(_ body: () throws(FSError) -> T) throws(FSError) -> T {
        var attempt = 0
        while true {
            do throws(FSError) { return try body() } catch  where error == .io && attempt < 2 {
                attempt += 1
                _ = try? fs.store.catchUp()
                fs.forgetCachedRecords()
            }
        }
    }

    // MARK: Names

    public func lookup(parent: InodeNumber, name: [UInt8]) throws(FSError) -> Attributes { try fs.lookup(parent: parent, name: name) }
    public func forget(_ ino: InodeNumber, lookups: UInt64) { fs.forget(ino, lookups: lookups) }
    public func getattr(_ ino: InodeNumber) throws(FSError) -> Attributes { try fs.getattr(ino) }
    public func setattr(_ ino: InodeNumber, changes: AttributeChanges, handle: HandleID?, caller: Caller) throws(FSError) -> Attributes {
        try change { () throws(FSError) in try fs.setattr(ino, changes: changes, handle: handle, caller: caller) }
    }
    public func readlink(_ ino: InodeNumber) throws(FSError) -> [UInt8] { try fs.readlink(ino) }
    public func clearSetID(_ ino: InodeNumber) throws(FSError) { try change { () throws(FSError) in try fs.clearSetID(ino) } }
    public func mknod(parent: InodeNumber, name: [UInt8], mode: UInt32, rdev: UInt64, caller: Caller) throws(FSError) -> Attributes {
        try change { () throws(FSError) in try fs.mknod(parent: parent, name: name, mode: mode, rdev: rdev, caller: caller) }
    }
    public func mkdir(parent: InodeNumber, name: [UInt8], mode: UInt32, caller: Caller) throws(FSError) -> Attributes {
        try change { () throws(FSError) in try fs.mkdir(parent: parent, name: name, mode: mode, caller: caller) }
    }
    public func symlink(parent: InodeNumber, name: [UInt8], target: [UInt8], caller: Caller) throws(FSError) -> Attributes {
        try change { () throws(FSError) in try fs.symlink(parent: parent, name: name, target: target, caller: caller) }
    }
    public func link(_ ino: InodeNumber, newParent: InodeNumber, newName: [UInt8]) throws(FSError) -> Attributes {
        try change { () throws(FSError) in try fs.link(ino, newParent: newParent, newName: newName) }
    }
    public func unlink(parent: InodeNumber, name: [UInt8]) throws(FSError) {
        try change { () throws(FSError) in try fs.unlink(parent: parent, name: name) }
    }
    public func rmdir(parent: InodeNumber, name: [UInt8]) throws(FSError) {
        try change { () throws(FSError) in try fs.rmdir(parent: parent, name: name) }
    }
    public func rename(parent: InodeNumber, name: [UInt8], newParent: InodeNumber, newName: [UInt8], flags: RenameFlags) throws(FSError) {
        try change { () throws(FSError) in try fs.rename(parent: parent, name: name, newParent: newParent, newName: newName, flags: flags) }
    }

    // MARK: Content

    /// Close-to-open: the server's state first (one round trip), then the file as it is now.
    public func open(_ ino: InodeNumber, flags: Int32, caller: Caller) throws(FSError) -> OpenResult {
        do { try fs.store.catchUp() } catch { throw fs.fsError(error) }
        if flags & O_TRUNC != 0 && !isReadOnly {
            return try change { () throws(FSError) in try fs.open(ino, flags: flags, caller: caller) }
        }
        return try fs.open(ino, flags: flags, caller: caller)
    }
    public func create(parent: InodeNumber, name: [UInt8], mode: UInt32, flags: Int32, caller: Caller) throws(FSError) -> (Attributes, OpenResult) {
        try change { () throws(FSError) in try fs.create(parent: parent, name: name, mode: mode, flags: flags, caller: caller) }
    }
    public func read(_ ino: InodeNumber, handle: HandleID, offset: UInt64, size: Int) throws(FSError) -> [UInt8] {
        try rereading { () throws(FSError) in try fs.read(ino, handle: handle, offset: offset, size: size) }
    }
    public func readChunks(_ ino: InodeNumber, handle: HandleID, offset: UInt64, size: Int) throws(FSError) -> ChunkRead {
        try rereading { () throws(FSError) in try fs.readChunks(ino, handle: handle, offset: offset, size: size) }
    }
    public func write(_ ino: InodeNumber, handle: HandleID, offset: UInt64, data: UnsafeRawBufferPointer) throws(FSError) -> Int {
        try change { () throws(FSError) in try fs.write(ino, handle: handle, offset: offset, data: data) }
    }
    public func release(_ ino: InodeNumber, handle: HandleID) { fs.release(ino, handle: handle) }
    /// Durable: a commit that waits for the server's disk, which covers every earlier commit too.
    public func fsync(_ ino: InodeNumber, handle: HandleID?, dataOnly: Bool) throws(FSError) {
        guard !isReadOnly else { return }
        try change(durable: true) { () throws(FSError) in try fs.checkWriteError(ino) }
    }
    public func fallocate(_ ino: InodeNumber, handle: HandleID, mode: Int32, offset: UInt64, length: UInt64) throws(FSError) {
        try change { () throws(FSError) in try fs.fallocate(ino, handle: handle, mode: mode, offset: offset, length: length) }
    }

    // MARK: Directories

    public func opendir(_ ino: InodeNumber, caller: Caller) throws(FSError) -> HandleID { try fs.opendir(ino, caller: caller) }
    public func readdir(_ ino: InodeNumber, handle: HandleID, offset: Int64, limit: Int, plus: Bool) throws(FSError) -> [DirectoryEntry] {
        try fs.readdir(ino, handle: handle, offset: offset, limit: limit, plus: plus)
    }
    public func releasedir(_ ino: InodeNumber, handle: HandleID) { fs.releasedir(ino, handle: handle) }
    public func fsyncdir(_ ino: InodeNumber, handle: HandleID, dataOnly: Bool) throws(FSError) {
        try fsync(ino, handle: nil, dataOnly: dataOnly)
    }

    public func statfs() throws(FSError) -> FileSystemStatistics { try fs.statfs() }

    // MARK: Extended attributes

    public func setxattr(_ ino: InodeNumber, name: [UInt8], value: [UInt8], flags: Int32) throws(FSError) {
        try change { () throws(FSError) in try fs.setxattr(ino, name: name, value: value, flags: flags) }
    }
    public func getxattr(_ ino: InodeNumber, name: [UInt8]) throws(FSError) -> [UInt8] { try fs.getxattr(ino, name: name) }
    public func listxattr(_ ino: InodeNumber) throws(FSError) -> [[UInt8]] { try fs.listxattr(ino) }
    public func removexattr(_ ino: InodeNumber, name: [UInt8]) throws(FSError) {
        try change { () throws(FSError) in try fs.removexattr(ino, name: name) }
    }

    public func shutdown() { fs.shutdown() }
    public func writebackCacheGranted(_ granted: Bool) { fs.writebackCacheGranted(granted) }
}
