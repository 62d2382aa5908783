/// Seconds and nanoseconds since the epoch, as stored.
public struct StoredTime: Equatable, Sendable {
    public var seconds: Int64
    public var nanoseconds: UInt32
    public init(seconds: Int64, nanoseconds: UInt32) {
        self.seconds = seconds
        self.nanoseconds = nanoseconds
    }
}

/// An inode: everything `stat` shows plus where its content lives. Sealed under the metadata key,
/// bound to its inode number.
public struct InodeRecord: Equatable, Sendable {
    /// Full st_mode (type and permission bits).
    public var mode: UInt32
    public var uid: UInt32
    public var gid: UInt32
    public var nlink: UInt32
    public var size: UInt64
    public var rdev: UInt64
    public var atime: StoredTime
    public var mtime: StoredTime
    public var ctime: StoredTime
    /// Random id of the file's content: names its chunks and derives its per-file key. 0 = none.
    public var contentId: UInt64
    /// Symlink target through the container-relative path transformer.
    public var symlinkTarget: StoredPath?
    /// Content chunks actually stored (holes excluded): what `st_blocks` reports.
    public var chunkCount: UInt64
    /// Which sealed chunk is current at each position (docs/FORMAT.md, "The chunk map").
    public var chunkMap: ChunkMapRoot

    public init(
        mode: UInt32, uid: UInt32, gid: UInt32, nlink: UInt32, size: UInt64 = 0, rdev: UInt64 = 0,
        atime: StoredTime, mtime: StoredTime, ctime: StoredTime, contentId: UInt64 = 0,
        symlinkTarget: StoredPath? = nil, chunkCount: UInt64 = 0, chunkMap: ChunkMapRoot = .empty
    ) {
        self.mode = mode
        self.uid = uid
        self.gid = gid
        self.nlink = nlink
        self.size = size
        self.rdev = rdev
        self.atime = atime
        self.mtime = mtime
        self.ctime = ctime
        self.contentId = contentId
        self.symlinkTarget = symlinkTarget
        self.chunkCount = chunkCount
        self.chunkMap = chunkMap
    }
}

public struct InodeTransformer: EntityTransformer {
    public static let name = "coffer.inode.v1"
    public static let kind = EntityKind.inode
    /// 2 since the chunk map joined the inode (1 had none).
    static let encodingVersion: UInt8 = 2
    public init() {}

    public func encode(_ v: InodeRecord) -> [UInt8] {
        var w = ByteWriter(capacity: 104)
        w.u8(Self.encodingVersion)
        w.u32(v.mode)
        w.u32(v.uid)
        w.u32(v.gid)
        w.u32(v.nlink)
        w.u64(v.size)
        w.u64(v.rdev)
        for t in [v.atime, v.mtime, v.ctime] {
            w.i64(t.seconds)
            w.u32(t.nanoseconds)
        }
        w.u64(v.contentId)
        if let target = v.symlinkTarget {
            w.u8(1)
            ContainerPathTransformer.encode(target, into: &w)
        } else {
            w.u8(0)
        }
        w.u64(v.chunkCount)
        v.chunkMap.write(to: &w)
        return w.bytes
    }

    public func decode(_ bytes: [UInt8]) throws(DecodeError) -> InodeRecord {
        var r = ByteReader(bytes)
        let version = try r.u8()
        guard version == Self.encodingVersion else { throw .unsupportedVersion(version) }
        let mode = try r.u32(), uid = try r.u32(), gid = try r.u32(), nlink = try r.u32()
        let size = try r.u64(), rdev = try r.u64()
        var times: [StoredTime] = []
        for _ in 0..<3 {
            let s = try r.i64(), ns = try r.u32()
            guard ns < 1_000_000_000 else { throw .invalidValue("nanoseconds out of range") }
            times.append(StoredTime(seconds: s, nanoseconds: ns))
        }
        let contentId = try r.u64()
        var target: StoredPath?
        switch try r.u8() {
        case 0: target = nil
        case 1: target = try ContainerPathTransformer.decode(from: &r)
        default: throw .invalidValue("symlink flag")
        }
        let chunkCount = try r.u64()
        let chunkMap = try ChunkMapRoot.read(from: &r)
        try r.finish()
        guard size <= UInt64(Int64.max) else { throw .invalidValue("size out of range") }
        return InodeRecord(
            mode: mode, uid: uid, gid: gid, nlink: nlink, size: size, rdev: rdev,
            atime: times[0], mtime: times[1], ctime: times[2], contentId: contentId,
            symlinkTarget: target, chunkCount: chunkCount, chunkMap: chunkMap)
    }
}
