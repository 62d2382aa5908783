import Glibc

/// Inode number as the kernel sees it. 1 is the root directory.
public typealias InodeNumber = UInt64

/// An errno-style failure. The FUSE adapter replies with `-errno`.
public struct FSError: Error, Equatable, CustomStringConvertible {
    public let errno: Int32
    public init(_ errno: Int32) { self.errno = errno }
    public var description: String { String(cString: strerror(errno)) }

    public static let notFound = FSError(ENOENT)
    public static let exists = FSError(EEXIST)
    public static let notDirectory = FSError(ENOTDIR)
    public static let isDirectory = FSError(EISDIR)
    public static let notEmpty = FSError(ENOTEMPTY)
    public static let invalid = FSError(EINVAL)
    public static let io = FSError(EIO)
    public static let noSpace = FSError(ENOSPC)
    public static let permission = FSError(EPERM)
    public static let access = FSError(EACCES)
    public static let nameTooLong = FSError(ENAMETOOLONG)
    public static let noData = FSError(ENODATA)
    public static let range = FSError(ERANGE)
    public static let badHandle = FSError(EBADF)
    public static let notSupported = FSError(EOPNOTSUPP)
    public static let readOnly = FSError(EROFS)
    public static let crossDevice = FSError(EXDEV)
    public static let tooManyLinks = FSError(EMLINK)
    public static let fileTooBig = FSError(EFBIG)
}

/// Seconds and nanoseconds since the epoch.
public struct Timestamp: Equatable, Sendable {
    public var seconds: Int64
    public var nanoseconds: UInt32
    public init(seconds: Int64, nanoseconds: UInt32) {
        self.seconds = seconds
        self.nanoseconds = nanoseconds
    }
    /// The kernel's clock for file times (current_time(), the coarse realtime clock). With the writeback
    /// cache the kernel stamps mtime and ctime on writes itself; a finer clock here would make a write right
    /// after a create move them back, and would dirty the inode (one more SETATTR per created file).
    public static func now() -> Timestamp {
        var ts = timespec()
        clock_gettime(CLOCK_REALTIME_COARSE, &ts)
        return Timestamp(seconds: Int64(ts.tv_sec), nanoseconds: UInt32(ts.tv_nsec))
    }
}

/// What `getattr` and friends return; maps 1:1 onto `struct stat`.
public struct Attributes: Equatable, Sendable {
    public var ino: InodeNumber
    /// Full st_mode: file type bits and permission bits.
    public var mode: UInt32
    public var nlink: UInt32
    public var uid: UInt32
    public var gid: UInt32
    public var rdev: UInt64
    public var size: UInt64
    /// 512-byte blocks actually stored (chunks present).
    public var blocks: UInt64
    public var atime: Timestamp
    public var mtime: Timestamp
    public var ctime: Timestamp
    public init(
        ino: InodeNumber, mode: UInt32, nlink: UInt32, uid: UInt32, gid: UInt32, rdev: UInt64,
        size: UInt64, blocks: UInt64, atime: Timestamp, mtime: Timestamp, ctime: Timestamp
    ) {
        self.ino = ino
        self.mode = mode
        self.nlink = nlink
        self.uid = uid
        self.gid = gid
        self.rdev = rdev
        self.size = size
        self.blocks = blocks
        self.atime = atime
        self.mtime = mtime
        self.ctime = ctime
    }
}

/// Who asks: from `fuse_req_ctx`.
public struct Caller: Sendable {
    public var uid: UInt32
    public var gid: UInt32
    public var pid: Int32
    public var umask: UInt32
    public init(uid: UInt32, gid: UInt32, pid: Int32 = 0, umask: UInt32 = 0o022) {
        self.uid = uid
        self.gid = gid
        self.pid = pid
        self.umask = umask
    }
    public static let root = Caller(uid: 0, gid: 0)
}

/// The attribute changes of one `setattr` call; nil fields stay as they are.
public struct AttributeChanges: Sendable {
    public var mode: UInt32?
    public var uid: UInt32?
    public var gid: UInt32?
    public var size: UInt64?
    public var atime: TimeChange?
    public var mtime: TimeChange?
    public var ctime: Timestamp?
    /// Also clear set-user-ID, and set-group-ID when group-executable, after the other changes (the kernel asks
    /// for it on truncate by a caller without CAP_FSETID and on chown; see `FileSystemOperations.clearSetID`).
    public var clearSetID = false
    /// A change of the ctime alone (under the writeback cache) or of nothing (without it): what the kernel sends
    /// for chown(f, -1, -1), which changes no owner but still clears set-user-ID (and set-group-ID when
    /// group-executable) on Linux; with FUSE_HANDLE_KILLPRIV_V2 the kernel leaves that to the filesystem. (Its
    /// own time updates under the writeback cache always carry the mtime too.)
    public var isOwnerlessChown: Bool {
        mode == nil && uid == nil && gid == nil && size == nil && atime == nil && mtime == nil && !clearSetID
    }
    public init(
        mode: UInt32? = nil, uid: UInt32? = nil, gid: UInt32? = nil, size: UInt64? = nil,
        atime: TimeChange? = nil, mtime: TimeChange? = nil, ctime: Timestamp? = nil, clearSetID: Bool = false
    ) {
        self.mode = mode
        self.uid = uid
        self.gid = gid
        self.size = size
        self.atime = atime
        self.mtime = mtime
        self.ctime = ctime
        self.clearSetID = clearSetID
    }
}

public enum TimeChange: Sendable, Equatable {
    case now
    case set(Timestamp)
}

/// One directory entry as listed by readdir. `offset` is the cookie that resumes after this entry.
public struct DirectoryEntry: Sendable {
    public var name: [UInt8]
    public var ino: InodeNumber
    /// File type bits only (S_IFMT part of the mode).
    public var type: UInt32
    public var offset: Int64
    /// Filled only for readdirplus (and then the entry counts as a lookup).
    public var attributes: Attributes?
    public init(name: [UInt8], ino: InodeNumber, type: UInt32, offset: Int64, attributes: Attributes? = nil) {
        self.name = name
        self.ino = ino
        self.type = type
        self.offset = offset
        self.attributes = attributes
    }
}

public struct FileSystemStatistics: Sendable {
    public var blockSize: UInt64
    public var totalBlocks: UInt64
    public var freeBlocks: UInt64
    public var availableBlocks: UInt64
    public var totalFiles: UInt64
    public var freeFiles: UInt64
    public var maxNameLength: UInt64
    public init(
        blockSize: UInt64, totalBlocks: UInt64, freeBlocks: UInt64, availableBlocks: UInt64,
        totalFiles: UInt64, freeFiles: UInt64, maxNameLength: UInt64
    ) {
        self.blockSize = blockSize
        self.totalBlocks = totalBlocks
        self.freeBlocks = freeBlocks
        self.availableBlocks = availableBlocks
        self.totalFiles = totalFiles
        self.freeFiles = freeFiles
        self.maxNameLength = maxNameLength
    }
}

/// Flags for rename(2): RENAME_NOREPLACE = 1, RENAME_EXCHANGE = 2.
public struct RenameFlags: OptionSet, Sendable {
    public let rawValue: UInt32
    public init(rawValue: UInt32) { self.rawValue = rawValue }
    public static let noReplace = RenameFlags(rawValue: 1)
    public static let exchange = RenameFlags(rawValue: 2)
}

/// Handle of an open file or directory, as handed to the kernel in `fi->fh`.
public typealias HandleID = UInt64

extension HandleID {
    /// What reads and writes carry on a file the kernel opened without asking the filesystem
    /// (`FileSystemOperations.opensWithoutHandles`). A filesystem with handles starts them at 1.
    public static let none: HandleID = 0
}

/// Bytes of a file starting at `start`: what `readChunks` returns (at or before the offset asked for).
public struct ChunkRead: Sendable {
    public var start: UInt64
    public var bytes: [UInt8]
    public init(start: UInt64, bytes: [UInt8]) {
        self.start = start
        self.bytes = bytes
    }
}

/// What opening a file tells the kernel about its page cache.
public struct OpenResult: Sendable {
    public var handle: HandleID
    /// True when the file did not change since the kernel last cached it: keep its page cache.
    public var keepCache: Bool
    /// The file changed since the kernel last got its attributes (another mount changed it): the
    /// kernel's copy goes too, so that the open reads the new size.
    public var attributesChanged: Bool
    public init(handle: HandleID, keepCache: Bool, attributesChanged: Bool = false) {
        self.handle = handle
        self.keepCache = keepCache
        self.attributesChanged = attributesChanged
    }
}

/// Cache lifetimes the adapter should hand to the kernel (seconds). A mount alone on its store is the only
/// writer to it, so long timeouts stay correct; one of several mounts (`SharedMount`) keeps them short.
public struct CacheTimeouts: Sendable {
    public var entry: Double
    public var attributes: Double
    public var negativeEntry: Double
    public init(entry: Double = 1, attributes: Double = 1, negativeEntry: Double = 0) {
        self.entry = entry
        self.attributes = attributes
        self.negativeEntry = negativeEntry
    }
}

/// A file lock as the FUSE lock requests carry it: the range `start...end` (inclusive; `FileLock.toEnd`
/// reaches past any end of file), its type, and the process that asked (or, in an F_GETLK answer, that
/// holds it: 0 when it is held through a mount on another host).
public struct FileLock: Sendable, Equatable {
    public enum LockType: Sendable, Equatable {
        case read, write
    }
    public static let toEnd = UInt64(Int64.max)
    public var type: LockType
    public var start: UInt64
    public var end: UInt64
    public var pid: Int32

    public init(type: LockType, start: UInt64, end: UInt64, pid: Int32) {
        self.type = type
        self.start = start
        self.end = end
        self.pid = pid
    }
}
