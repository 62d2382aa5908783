import CofferStore
import Glibc
import Logging

/// The filesystem as one of several mounts of a shared container (PostgreSQL; docs/ARCHITECTURE.md,
/// "Several mounts at once"). It wraps a `CofferFileSystem` opened `coherent` and adds what sharing
/// needs, so that a mount alone on its disk keeps every shortcut of the single-mount design:
///
/// - Every change (a namespace operation, a write, setattr, xattrs, fallocate) runs inside a group
///   transaction that holds what it decides on: the inode it changes or makes a name in (a group of
///   inodes, beside other mounts' groups of other inodes), or the container's writer lock (links,
///   removals, renames). So it is decided on the committed state of every mount (two creates of one
///   name: one EEXIST; rmdir of a directory just filled: ENOTEMPTY), and mounts busy in different
///   directories do not wait for each other.
///   The group spans changes, as on a mount of its own, and ends (commits, not durably: fsync does)
///   after `sharedCommitInterval` (a second when no other mount is there), or sooner when another
///   mount asks for the lock, once this one had its `writerSlice`: at once for an open or lookup
///   waiting, for a writer once this mount pauses. A busy mount beside idle ones keeps its speed,
///   and busy mounts take turns of `sharedCommitInterval`.
/// - Records read before another mount's commit are read again before use (`CofferFileSystem.state`).
/// - Close-to-open: every OPEN (and OPENDIR, and a lookup that finds nothing) first waits for a
///   group open on another mount that changes that inode (the directory, for the last two), which is
///   asked to end (`EntityStore.catchUp(of:)`), and reads the
///   server's state; a file changed elsewhere since the kernel last saw it is opened with the
///   kernel's pages and attributes dropped.
/// - A read whose chunks changed under it (a commit between the map and the rows) reads again.
/// - The kernel keeps entries and attributes 1 s and no negative entries: the bound on how late
///   another mount's changes show in `ls` and `stat` (docs; README "Several machines").
/// - With `locks`, flock and POSIX record locks are decided in the container's lock table, so every
///   mount sees them (`sharesLocks`); without, they stay the kernel's, per mount.
public final class SharedMount: FileSystemOperations, @unchecked Sendable {
    public let fs: CofferFileSystem
    private let locks: PostgresLocks?
    /// What this mount holds in the lock table (only this mount adds rows under its holder id): a close
    /// or release with nothing here costs no round trip. Under `lockBook`.
    private var held = Set<LockKey>()
    /// POSIX owners that locked through each open file (an OFD lock's owner is its open file).
    private var ownersByHandle: [HandleID: Set<UInt64>] = [:]
    private var lastHandle: HandleID = 0
    private let lockBook = Lock()

    private struct LockKey: Hashable {
        let ino: InodeNumber, kind: FileLockKind, owner: UInt64
    }

    public init(_ fs: CofferFileSystem, locks: PostgresLocks? = nil) {
        self.fs = fs
        self.locks = locks
    }

    public var cacheTimeouts: CacheTimeouts { CacheTimeouts(entry: 1, attributes: 1, negativeEntry: 0) }
    public func onChangedElsewhere(_ handler: @escaping @Sendable ([InodeNumber]) -> Void) { fs.onChangedElsewhere(handler) }
    public func kernelNames(_ inodes: [InodeNumber]) -> [(parent: InodeNumber, name: [UInt8])] { fs.kernelNames(inodes) }
    public var isReadOnly: Bool { fs.isReadOnly }
    /// OPEN must reach us (close-to-open), and the kernel must not keep listings (opendir answered).
    public var opensWithoutHandles: Bool { false }

    /// Runs one change inside a group that holds what it decides on (see above), one change at a time
    /// on this mount; `durable` (fsync) commits and waits for the server's disk.
    /// `scope`: what the change decides on and writes (`GroupScope`): its inode, or the parent a name is
    /// made in; the container for changes whose decisions span several inodes.
    func change<T>(_ scope: GroupScope, durable: Bool = false, _ body: () throws(FSError) -> T) throws(FSError) -> T {
        try fs.checkWritable()
        return try fs.groupGate.withLock { () throws(FSError) -> T in
            try fs.beginGroup(scope)
            defer { fs.changeEnded() }
            let result = try body()
            // The committer ends groups too, but it must win `groupGate` from the workers: a busy mount
            // checks here, between its changes, whether its interval says so (another mount's wait does not
            // end a group whose mount is busy: the committer yields it once this mount pauses).
            if durable { try fs.commitGroup(durable: true) } else { try fs.commitIfDue() }
            return result
        }
    }

    /// Waits for a group open on another mount and reads the state it left (close-to-open); a group
    /// of this mount's own already sees everything.
    private func awaitGroupsElsewhere(changing inode: InodeNumber) throws(FSError) {
        do { try fs.store.catchUp(of: inode) } catch { throw fs.fsError(error) }
    }

    /// Reads again when the chunks changed under the read (another mount committed between the file's
    /// map and its rows): every record is then read anew. A store that stays wrong stays EIO.
    func rereading<T>(_ body: () throws(FSError) -> T) throws(FSError) -> T {
        var attempt = 0
        defer { Self.setRereadPending(false) }
        while true {
            // Damage met on an attempt that is not the last is logged at debug level only.
            Self.setRereadPending(attempt < 2)
            do throws(FSError) { return try body() } catch  where error == .io && attempt < 2 {
                attempt += 1
                _ = try? fs.store.catchUp()
                fs.forgetCachedRecords()
            }
        }
    }

    /// Whether the calling thread is in a read that `rereading` tries again on EIO.
    static var rereadPending: Bool { rereadKey.map { pthread_getspecific($0) != nil } ?? false }
    private static let rereadKey: pthread_key_t? = {
        var key = pthread_key_t()
        return pthread_key_create(&key, nil) == 0 ? key : nil
    }()
    private static func setRereadPending(_ on: Bool) {
        if let key = rereadKey { pthread_setspecific(key, on ? UnsafeRawPointer(bitPattern: 1) : nil) }
    }

    // MARK: Names

    /// A name not found may be one another mount just made and closed, still in its open group: that
    /// group is waited for, and the name looked up again if the store changed meanwhile.
    public func lookup(parent: InodeNumber, name: [UInt8]) throws(FSError) -> Attributes {
        let epoch = fs.storeEpoch.load(ordering: .acquiring)
        do { return try fs.lookup(parent: parent, name: name) } catch  where error == .notFound {
            try awaitGroupsElsewhere(changing: parent)
            guard fs.storeEpoch.load(ordering: .acquiring) != epoch else { throw error }
            return try fs.lookup(parent: parent, name: name)
        }
    }
    public func forget(_ ino: InodeNumber, lookups: UInt64) { fs.forget(ino, lookups: lookups) }
    public func getattr(_ ino: InodeNumber) throws(FSError) -> Attributes { try fs.getattr(ino) }
    public func setattr(_ ino: InodeNumber, changes: AttributeChanges, handle: HandleID?, caller: Caller) throws(FSError) -> Attributes {
        try change(.inode(ino)) { () throws(FSError) in try fs.setattr(ino, changes: changes, handle: handle.map { _ in .none }, caller: caller) }
    }
    public func readlink(_ ino: InodeNumber) throws(FSError) -> [UInt8] { try fs.readlink(ino) }
    @discardableResult public func clearSetID(_ ino: InodeNumber) throws(FSError) -> Bool {
        try change(.inode(ino)) { () throws(FSError) in try fs.clearSetID(ino) }
    }
    public func mknod(parent: InodeNumber, name: [UInt8], mode: UInt32, rdev: UInt64, caller: Caller) throws(FSError) -> Attributes {
        try change(.inode(parent)) { () throws(FSError) in try fs.mknod(parent: parent, name: name, mode: mode, rdev: rdev, caller: caller) }
    }
    public func mkdir(parent: InodeNumber, name: [UInt8], mode: UInt32, caller: Caller) throws(FSError) -> Attributes {
        try change(.inode(parent)) { () throws(FSError) in try fs.mkdir(parent: parent, name: name, mode: mode, caller: caller) }
    }
    public func symlink(parent: InodeNumber, name: [UInt8], target: [UInt8], caller: Caller) throws(FSError) -> Attributes {
        try change(.inode(parent)) { () throws(FSError) in try fs.symlink(parent: parent, name: name, target: target, caller: caller) }
    }
    public func link(_ ino: InodeNumber, newParent: InodeNumber, newName: [UInt8]) throws(FSError) -> Attributes {
        try change(.container) { () throws(FSError) in try fs.link(ino, newParent: newParent, newName: newName) }
    }
    public func unlink(parent: InodeNumber, name: [UInt8]) throws(FSError) {
        try change(.container) { () throws(FSError) in try fs.unlink(parent: parent, name: name) }
    }
    public func rmdir(parent: InodeNumber, name: [UInt8]) throws(FSError) {
        try change(.container) { () throws(FSError) in try fs.rmdir(parent: parent, name: name) }
    }
    public func rename(parent: InodeNumber, name: [UInt8], newParent: InodeNumber, newName: [UInt8], flags: RenameFlags) throws(FSError) {
        try change(.container) { () throws(FSError) in try fs.rename(parent: parent, name: name, newParent: newParent, newName: newName, flags: flags)
        }
    }

    // MARK: Content

    /// Close-to-open: the server's state first (one round trip), then the file as it is now.
    public func open(_ ino: InodeNumber, flags: Int32, caller: Caller) throws(FSError) -> OpenResult {
        try awaitGroupsElsewhere(changing: ino)
        if flags & O_TRUNC != 0 && !isReadOnly {
            return handed(try change(.inode(ino)) { () throws(FSError) in try fs.open(ino, flags: flags, caller: caller) })
        }
        return handed(try fs.open(ino, flags: flags, caller: caller))
    }
    /// A name another machine made since this kernel looked it up (and found nothing) is, without O_EXCL,
    /// an open of that machine's file: ESTALE has the kernel look the name up again and open what it finds
    /// (`do_filp_open` retries once with LOOKUP_REVAL), as NFS does. EEXIST would fail a plain `>>` or
    /// `touch` that lost such a race (a tester: 9 opens of 200).
    public func create(parent: InodeNumber, name: [UInt8], mode: UInt32, flags: Int32, caller: Caller) throws(FSError) -> (Attributes, OpenResult) {
        do {
            let (attributes, result) = try change(.inode(parent)) { () throws(FSError) in
                try fs.create(parent: parent, name: name, mode: mode, flags: flags, caller: caller)
            }
            return (attributes, handed(result))
        } catch {
            if error == .exists && flags & O_EXCL == 0 { throw FSError(ESTALE) }
            throw error
        }
    }

    /// With shared locks every open file gets a handle of its own (the filesystem below needs none, and
    /// gets `.none`): the open file an OFD lock belongs to is known at its RELEASE by it.
    private func handed(_ result: OpenResult) -> OpenResult {
        guard locks != nil else { return result }
        var r = result
        r.handle = lockBook.withLock {
            lastHandle += 1
            return lastHandle
        }
        return r
    }
    public func read(_ ino: InodeNumber, handle: HandleID, offset: UInt64, size: Int) throws(FSError) -> [UInt8] {
        try rereading { () throws(FSError) in try fs.read(ino, handle: .none, offset: offset, size: size) }
    }
    public func readChunks(_ ino: InodeNumber, handle: HandleID, offset: UInt64, size: Int) throws(FSError) -> ChunkRead {
        try rereading { () throws(FSError) in try fs.readChunks(ino, handle: .none, offset: offset, size: size) }
    }
    public func write(_ ino: InodeNumber, handle: HandleID, offset: UInt64, data: UnsafeRawBufferPointer) throws(FSError) -> Int {
        try change(.inode(ino)) { () throws(FSError) in try fs.write(ino, handle: .none, offset: offset, data: data) }
    }
    /// Other machines append too: this kernel's idea of the size may be behind (a tester's `>>` from two
    /// machines in turn kept only one machine's lines), so O_APPEND writes go to the end this machine finds
    /// under the file's lock, which every other machine's commits of it are in.
    public var placesAppends: Bool { true }
    public func append(_ ino: InodeNumber, handle: HandleID, data: UnsafeRawBufferPointer) throws(FSError) -> Int {
        try change(.inode(ino)) { () throws(FSError) in try fs.append(ino, handle: .none, data: data) }
    }
    public func release(_ ino: InodeNumber, handle: HandleID) { fs.release(ino, handle: .none) }
    /// Durable: a commit that waits for the server's disk, which covers every earlier commit too.
    public func fsync(_ ino: InodeNumber, handle: HandleID?, dataOnly: Bool) throws(FSError) {
        guard !isReadOnly else { return }
        do { try change(.nothing, durable: true) { () throws(FSError) in try fs.checkWriteError(ino) } } catch {
            fs.heardLoss(ino)
            throw error
        }
    }
    public func fallocate(_ ino: InodeNumber, handle: HandleID, mode: Int32, offset: UInt64, length: UInt64) throws(FSError) {
        try change(.inode(ino)) { () throws(FSError) in try fs.fallocate(ino, handle: .none, mode: mode, offset: offset, length: length) }
    }
    public func seek(_ ino: InodeNumber, offset: UInt64, whence: Int32) throws(FSError) -> UInt64 {
        try rereading { () throws(FSError) in try fs.seek(ino, offset: offset, whence: whence) }
    }

    // MARK: Directories

    /// Close-to-open for listings too: what another mount did before this opendir is listed.
    public func opendir(_ ino: InodeNumber, caller: Caller) throws(FSError) -> HandleID {
        try awaitGroupsElsewhere(changing: ino)
        return try fs.opendir(ino, caller: caller)
    }
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
        try change(.inode(ino)) { () throws(FSError) in try fs.setxattr(ino, name: name, value: value, flags: flags) }
    }
    public func getxattr(_ ino: InodeNumber, name: [UInt8]) throws(FSError) -> [UInt8] { try fs.getxattr(ino, name: name) }
    public func listxattr(_ ino: InodeNumber) throws(FSError) -> [[UInt8]] { try fs.listxattr(ino) }
    public func removexattr(_ ino: InodeNumber, name: [UInt8]) throws(FSError) {
        try change(.inode(ino)) { () throws(FSError) in try fs.removexattr(ino, name: name) }
    }

    // MARK: Locks

    public var sharesLocks: Bool { locks != nil }

    public func testLock(_ ino: InodeNumber, owner: UInt64, lock: FileLock) throws(FSError) -> FileLock? {
        let table = try lockTable()
        let c: FileLockConflict?
        do {
            c = try table.test(
                inode: Int64(bitPattern: ino), kind: .posix, owner: Int64(bitPattern: owner), type: Self.storeType(lock.type),
                start: Self.offset(lock.start), end: Self.offset(lock.end))
        } catch { throw lockFailure(error) }
        return c.map {
            FileLock(type: $0.range.type == .read ? .read : .write, start: UInt64($0.range.start), end: UInt64($0.range.end), pid: $0.pid)
        }
    }

    public func setLock(
        _ ino: InodeNumber, handle: HandleID, owner: UInt64, type: FileLock.LockType?, start: UInt64, end: UInt64, pid: Int32
    ) throws(FSError) -> Bool {
        let stale = try set(LockKey(ino: ino, kind: .posix, owner: owner), type: type, start: start, end: end, pid: pid)
        if type != nil {
            _ = lockBook.withLock { ownersByHandle[handle, default: []].insert(owner) }
        }
        return stale
    }

    public func flock(_ ino: InodeNumber, handle: HandleID, owner: UInt64, type: FileLock.LockType?, pid: Int32) throws(FSError) -> Bool {
        try set(LockKey(ino: ino, kind: .flock, owner: owner), type: type, start: 0, end: FileLock.toEnd, pid: pid)
    }

    public func flush(_ ino: InodeNumber, handle: HandleID, owner: UInt64) {
        _ = try? set(LockKey(ino: ino, kind: .posix, owner: owner), type: nil, start: 0, end: FileLock.toEnd, pid: 0)
    }

    public func releaseLocks(_ ino: InodeNumber, handle: HandleID, flockOwner: UInt64?) {
        if let flockOwner { _ = try? set(LockKey(ino: ino, kind: .flock, owner: flockOwner), type: nil, start: 0, end: FileLock.toEnd, pid: 0) }
        let owners = lockBook.withLock { ownersByHandle.removeValue(forKey: handle) } ?? []
        for owner in owners {
            _ = try? set(LockKey(ino: ino, kind: .posix, owner: owner), type: nil, start: 0, end: FileLock.toEnd, pid: 0)
        }
    }

    /// One change of an owner's locks in the table; an unlock of nothing this mount holds costs nothing.
    /// True: a lock was taken on a file whose kernel pages are stale (`setLock`).
    private func set(_ key: LockKey, type: FileLock.LockType?, start: UInt64, end: UInt64, pid: Int32) throws(FSError) -> Bool {
        if type == nil && !lockBook.withLock({ held.contains(key) }) { return false }
        let table = try lockTable()
        let result: (conflict: FileLockConflict?, held: Bool)
        do {
            result = try table.set(
                inode: Int64(bitPattern: key.ino), kind: key.kind, owner: Int64(bitPattern: key.owner), type: type.map(Self.storeType),
                start: Self.offset(start), end: Self.offset(end), pid: pid)
        } catch { throw lockFailure(error) }
        lockBook.withLock {
            if result.held { held.insert(key) } else { held.remove(key) }
        }
        if result.conflict != nil { throw FSError(EAGAIN) }
        guard type != nil else { return false }
        // A lock just taken: what the last holder committed is read from the server, not from records
        // cached before (the listener's word on it may still be on its way), nor from the kernel's pages.
        _ = try? fs.store.catchUp(of: key.ino)
        return fs.takeChangedElsewhere(key.ino)
    }

    private func lockTable() throws(FSError) -> PostgresLocks {
        guard let locks else { throw FSError(ENOSYS) }
        return locks
    }

    private func lockFailure(_ error: any Error) -> FSError {
        fs.logger.warning("file lock: the lock table cannot be reached: \(error)")
        return FSError(ENOLCK)
    }

    private static func storeType(_ t: FileLock.LockType) -> FileLockType { t == .read ? .read : .write }
    private static func offset(_ o: UInt64) -> Int64 { Int64(min(o, FileLock.toEnd)) }

    /// This mount's locks go first (the other mounts get them at once), then the filesystem.
    public func shutdown() {
        if let locks {
            locks.releaseAll()
            locks.close()
        }
        fs.shutdown()
    }
    public func writebackCacheGranted(_ granted: Bool) { fs.writebackCacheGranted(granted) }
}
