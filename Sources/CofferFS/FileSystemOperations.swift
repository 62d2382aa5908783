import Glibc

/// The filesystem surface the FUSE adapter calls, one method per low-level operation.
///
/// Errors are thrown as `FSError` (errno). Names are raw bytes (Linux names need not be UTF-8),
/// at most 255 bytes, never containing "/" or NUL. Every method is safe to call from many threads.
/// Lookup counting follows libfuse: every successful `lookup`, `create`, `mknod`, `mkdir`, `symlink`,
/// `link` and each readdirplus entry adds one reference that `forget` later removes.
public protocol FileSystemOperations: AnyObject, Sendable {
    var cacheTimeouts: CacheTimeouts { get }
    /// True when mounted read-only: every mutation throws EROFS.
    var isReadOnly: Bool { get }
    /// True when reading and writing a file, and listing a directory, need no handle: the adapter
    /// then answers OPEN and OPENDIR with ENOSYS once, the kernel stops sending OPEN, RELEASE,
    /// OPENDIR and RELEASEDIR (two round trips fewer per open, as `cat` or `grep -r` do on every
    /// file, and per directory listed), and reads, writes and readdir carry `HandleID.none` (readdir
    /// resumes from its offset alone). O_TRUNC then arrives as a setattr. The adapter answers CREATE
    /// with ENOSYS too: the kernel then creates files with `mknod`, and `create` is not called.
    var opensWithoutHandles: Bool { get }

    func lookup(parent: InodeNumber, name: [UInt8]) throws(FSError) -> Attributes
    func forget(_ ino: InodeNumber, lookups: UInt64)
    func getattr(_ ino: InodeNumber) throws(FSError) -> Attributes
    /// `handle` is set when called on an open file (ftruncate, futimens).
    func setattr(_ ino: InodeNumber, changes: AttributeChanges, handle: HandleID?, caller: Caller) throws(FSError) -> Attributes
    func readlink(_ ino: InodeNumber) throws(FSError) -> [UInt8]
    /// Clears set-user-ID, and set-group-ID when group-executable, of a regular file — what the kernel does
    /// before a write or O_TRUNC by a caller without CAP_FSETID. Under FUSE_HANDLE_KILLPRIV_V2 the kernel leaves
    /// this to the filesystem and marks the requests that need it; writes themselves never clear set-id bits.
    /// True when the mode changed: the kernel's cached mode is then stale (exec would still honour the bits).
    @discardableResult func clearSetID(_ ino: InodeNumber) throws(FSError) -> Bool

    func mknod(parent: InodeNumber, name: [UInt8], mode: UInt32, rdev: UInt64, caller: Caller) throws(FSError) -> Attributes
    func mkdir(parent: InodeNumber, name: [UInt8], mode: UInt32, caller: Caller) throws(FSError) -> Attributes
    func symlink(parent: InodeNumber, name: [UInt8], target: [UInt8], caller: Caller) throws(FSError) -> Attributes
    func link(_ ino: InodeNumber, newParent: InodeNumber, newName: [UInt8]) throws(FSError) -> Attributes
    func unlink(parent: InodeNumber, name: [UInt8]) throws(FSError)
    func rmdir(parent: InodeNumber, name: [UInt8]) throws(FSError)
    func rename(parent: InodeNumber, name: [UInt8], newParent: InodeNumber, newName: [UInt8], flags: RenameFlags) throws(FSError)

    /// `flags` are open(2) flags (O_ACCMODE, O_TRUNC, O_APPEND, ...).
    func open(_ ino: InodeNumber, flags: Int32, caller: Caller) throws(FSError) -> OpenResult
    func create(parent: InodeNumber, name: [UInt8], mode: UInt32, flags: Int32, caller: Caller) throws(FSError) -> (Attributes, OpenResult)
    /// Reads up to `size` bytes; fewer only at end of file.
    func read(_ ino: InodeNumber, handle: HandleID, offset: UInt64, size: Int) throws(FSError) -> [UInt8]
    /// Like `read`, but may return more around the asked bytes (`start` at or before `offset`): what the
    /// filesystem decrypted anyway, for the adapter to hand to the kernel's page cache.
    func readChunks(_ ino: InodeNumber, handle: HandleID, offset: UInt64, size: Int) throws(FSError) -> ChunkRead
    /// Returns the number of bytes written (all of them unless an error is thrown).
    func write(_ ino: InodeNumber, handle: HandleID, offset: UInt64, data: UnsafeRawBufferPointer) throws(FSError) -> Int
    /// Whether O_APPEND writes are placed here, at the end of the file as the filesystem sees it, rather than
    /// by the kernel: where other mounts change files, the kernel's idea of a file's size may be behind, and an
    /// append placed by it would overwrite what another machine appended and closed.
    var placesAppends: Bool { get }
    /// Appends `data` at the file's end (`placesAppends`); returns the bytes written.
    func append(_ ino: InodeNumber, handle: HandleID, data: UnsafeRawBufferPointer) throws(FSError) -> Int
    func release(_ ino: InodeNumber, handle: HandleID)
    func fsync(_ ino: InodeNumber, handle: HandleID?, dataOnly: Bool) throws(FSError)
    /// mode: 0 or FALLOC_FL_KEEP_SIZE (1); others give EOPNOTSUPP.
    func fallocate(_ ino: InodeNumber, handle: HandleID, mode: Int32, offset: UInt64, length: UInt64) throws(FSError)
    /// lseek's SEEK_DATA (3) or SEEK_HOLE (4) from `offset`: where the next data or hole begins; ENXIO at or past
    /// the end. ENOSYS (the default) leaves both to the kernel: data everywhere, one hole at the end.
    func seek(_ ino: InodeNumber, offset: UInt64, whence: Int32) throws(FSError) -> UInt64

    func opendir(_ ino: InodeNumber, caller: Caller) throws(FSError) -> HandleID
    /// Entries after cookie `offset` (0 = from the start, "." and ".." included), at most `limit` of them.
    /// With `plus`, each entry carries attributes and counts as a lookup.
    func readdir(_ ino: InodeNumber, handle: HandleID, offset: Int64, limit: Int, plus: Bool) throws(FSError) -> [DirectoryEntry]
    func releasedir(_ ino: InodeNumber, handle: HandleID)
    func fsyncdir(_ ino: InodeNumber, handle: HandleID, dataOnly: Bool) throws(FSError)

    func statfs() throws(FSError) -> FileSystemStatistics

    func setxattr(_ ino: InodeNumber, name: [UInt8], value: [UInt8], flags: Int32) throws(FSError)
    func getxattr(_ ino: InodeNumber, name: [UInt8]) throws(FSError) -> [UInt8]
    /// Names, each without terminator (the adapter joins them with NULs).
    func listxattr(_ ino: InodeNumber) throws(FSError) -> [[UInt8]]
    func removexattr(_ ino: InodeNumber, name: [UInt8]) throws(FSError)

    /// Commits everything and stops accepting work (unmount).
    func shutdown()

    // MARK: Locks shared with other mounts

    /// True when this filesystem decides flock and POSIX record locks itself (several mounts of one
    /// container see each other's locks): the adapter then has the kernel send every lock request, and
    /// FLUSH at every close. False (the default): the kernel keeps locks, per mount, and the lock
    /// methods below are never called.
    var sharesLocks: Bool { get }
    /// The lock of another owner that keeps `lock` out (F_GETLK), nil when there is none.
    func testLock(_ ino: InodeNumber, owner: UInt64, lock: FileLock) throws(FSError) -> FileLock?
    /// Sets `owner`'s POSIX lock on `start...end` (`type` nil: unlocks it), splitting and merging the
    /// owner's ranges as fcntl does. Never waits: EAGAIN when another owner's lock conflicts (the
    /// adapter retries blocking requests). `handle`: the open file it came through (an OFD lock's owner
    /// is its open file, so its locks go at `releaseLocks`). Returns true when a lock was taken on a file
    /// another mount changed since the kernel cached it: the adapter has the kernel drop its pages before
    /// answering (what the last holder wrote is then read, as NFS does at a lock).
    func setLock(_ ino: InodeNumber, handle: HandleID, owner: UInt64, type: FileLock.LockType?, start: UInt64, end: UInt64, pid: Int32)
        throws(FSError) -> Bool
    /// flock(2) on the whole file for `owner` (the open file); `type` nil unlocks. EWOULDBLOCK when held
    /// elsewhere. Returns as `setLock` does.
    func flock(_ ino: InodeNumber, handle: HandleID, owner: UInt64, type: FileLock.LockType?, pid: Int32) throws(FSError) -> Bool
    /// A close(2): `owner`'s POSIX locks on the inode go (POSIX: any close by the process drops them).
    func flush(_ ino: InodeNumber, handle: HandleID, owner: UInt64)
    /// The last close of an open file: its flock lock (`flockOwner`, when the kernel says it took one)
    /// and the locks of owners that locked through it (OFD locks) go. Before `release`.
    func releaseLocks(_ ino: InodeNumber, handle: HandleID, flockOwner: UInt64?)

    /// Called once the kernel has answered INIT, with whether it keeps the writeback cache. With it, the
    /// kernel owns a regular file's mtime and ctime: it stamps them itself on write(2), mmap writes,
    /// truncate and fallocate, and sends them in a SETATTR, which may come before the WRITEs of the same
    /// data (those leave its page cache later, in the background).
    func writebackCacheGranted(_ granted: Bool)

    /// Mounts that share their container: `handler` is called (on the engine's listener thread, which it
    /// must not hold up) with the inodes another mount's commit wrote, so the kernel can drop what it
    /// cached of them. A filesystem alone on its store never calls it.
    func onChangedElsewhere(_ handler: @escaping @Sendable ([InodeNumber]) -> Void)
    /// The directory and name the kernel last found each of `inodes` by, for those it may still hold.
    func kernelNames(_ inodes: [InodeNumber]) -> [(parent: InodeNumber, name: [UInt8])]
}

extension FileSystemOperations {
    public func seek(_ ino: InodeNumber, offset: UInt64, whence: Int32) throws(FSError) -> UInt64 { throw FSError(ENOSYS) }
    public func onChangedElsewhere(_ handler: @escaping @Sendable ([InodeNumber]) -> Void) {}
    public func kernelNames(_ inodes: [InodeNumber]) -> [(parent: InodeNumber, name: [UInt8])] { [] }
    public var opensWithoutHandles: Bool { false }
    public var sharesLocks: Bool { false }
    public var placesAppends: Bool { false }
    public func append(_ ino: InodeNumber, handle: HandleID, data: UnsafeRawBufferPointer) throws(FSError) -> Int { throw FSError(ENOSYS) }
    public func testLock(_ ino: InodeNumber, owner: UInt64, lock: FileLock) throws(FSError) -> FileLock? { throw FSError(ENOSYS) }
    public func setLock(
        _ ino: InodeNumber, handle: HandleID, owner: UInt64, type: FileLock.LockType?, start: UInt64, end: UInt64, pid: Int32
    ) throws(FSError) -> Bool { throw FSError(ENOSYS) }
    public func flock(_ ino: InodeNumber, handle: HandleID, owner: UInt64, type: FileLock.LockType?, pid: Int32) throws(FSError) -> Bool {
        throw FSError(ENOSYS)
    }
    public func flush(_ ino: InodeNumber, handle: HandleID, owner: UInt64) {}
    public func releaseLocks(_ ino: InodeNumber, handle: HandleID, flockOwner: UInt64?) {}
    public func writebackCacheGranted(_ granted: Bool) {}
    public func readChunks(_ ino: InodeNumber, handle: HandleID, offset: UInt64, size: Int) throws(FSError) -> ChunkRead {
        ChunkRead(start: offset, bytes: try read(ino, handle: handle, offset: offset, size: size))
    }
}
