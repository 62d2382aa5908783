/// A name in a directory. Stored under keyed tags of (parent) and (parent, name); the name, the
/// inode it points to and its type are only inside the sealed value.
public struct DirectoryEntryRecord: Equatable, Sendable {
    public static let maxNameLength = 255
    public var name: [UInt8]
    public var ino: UInt64
    /// File type bits (S_IFMT part of the mode), so readdir needs no inode reads.
    public var type: UInt32
    public init(name: [UInt8], ino: UInt64, type: UInt32) {
        self.name = name
        self.ino = ino
        self.type = type
    }
}

public struct DirectoryEntryTransformer: EntityTransformer {
    public static let name = "coffer.dirent.v1"
    public static let kind = EntityKind.directoryEntry
    public init() {}

    public func encode(_ v: DirectoryEntryRecord) -> [UInt8] {
        var w = ByteWriter(capacity: v.name.count + 16)
        w.u8(1)
        w.short(v.name)
        w.u64(v.ino)
        w.u32(v.type)
        return w.bytes
    }
    public func decode(_ bytes: [UInt8]) throws(DecodeError) -> DirectoryEntryRecord {
        var r = ByteReader(bytes)
        let version = try r.u8()
        guard version == 1 else { throw .unsupportedVersion(version) }
        let name = try r.short(field: "name", limit: DirectoryEntryRecord.maxNameLength)
        guard !name.isEmpty, !name.contains(0), !name.contains(UInt8(ascii: "/")) else { throw .invalidValue("entry name") }
        let ino = try r.u64(), type = try r.u32()
        try r.finish()
        return DirectoryEntryRecord(name: name, ino: ino, type: type)
    }
}

/// One extended attribute: name and value, both sealed.
public struct ExtendedAttributeRecord: Equatable, Sendable {
    public static let maxNameLength = 255
    public static let maxValueLength = 65536
    public var name: [UInt8]
    public var value: [UInt8]
    public init(name: [UInt8], value: [UInt8]) {
        self.name = name
        self.value = value
    }
}

public struct ExtendedAttributeTransformer: EntityTransformer {
    public static let name = "coffer.xattr.v1"
    public static let kind = EntityKind.extendedAttribute
    public init() {}
    public func encode(_ v: ExtendedAttributeRecord) -> [UInt8] {
        var w = ByteWriter(capacity: v.name.count + v.value.count + 8)
        w.u8(1)
        w.short(v.name)
        w.long(v.value)
        return w.bytes
    }
    public func decode(_ bytes: [UInt8]) throws(DecodeError) -> ExtendedAttributeRecord {
        var r = ByteReader(bytes)
        let version = try r.u8()
        guard version == 1 else { throw .unsupportedVersion(version) }
        let name = try r.short(field: "xattr name", limit: ExtendedAttributeRecord.maxNameLength)
        let value = try r.long(field: "xattr value", limit: ExtendedAttributeRecord.maxValueLength)
        try r.finish()
        return ExtendedAttributeRecord(name: name, value: value)
    }
}

/// Store metadata: the commit generation (grows with every commit) and the container it belongs to.
public struct StoreStateRecord: Equatable, Sendable {
    public var generation: UInt64
    public var containerId: [UInt8]
    public init(generation: UInt64, containerId: [UInt8]) {
        self.generation = generation
        self.containerId = containerId
    }
}

public struct StoreStateTransformer: EntityTransformer {
    public static let name = "coffer.state.v1"
    public static let kind = EntityKind.storeState
    public init() {}
    public func encode(_ v: StoreStateRecord) -> [UInt8] {
        var w = ByteWriter()
        w.u8(1)
        w.u64(v.generation)
        w.short(v.containerId)
        return w.bytes
    }
    public func decode(_ bytes: [UInt8]) throws(DecodeError) -> StoreStateRecord {
        var r = ByteReader(bytes)
        let version = try r.u8()
        guard version == 1 else { throw .unsupportedVersion(version) }
        let generation = try r.u64()
        let id = try r.short(field: "container id", limit: 64)
        try r.finish()
        return StoreStateRecord(generation: generation, containerId: id)
    }
}

/// A content chunk's plaintext. The chunk index and file are bound through the associated data,
/// not stored inside; the plaintext is the chunk's bytes (at most the chunk size).
public struct ChunkTransformer: EntityTransformer {
    public static let name = "coffer.chunk.v1"
    public static let kind = EntityKind.contentChunk
    public static let maxChunkSize = 1 << 20
    public init() {}
    public func encode(_ v: [UInt8]) -> [UInt8] { v }
    public func decode(_ bytes: [UInt8]) throws(DecodeError) -> [UInt8] {
        guard bytes.count <= ChunkTransformer.maxChunkSize else {
            throw .tooLong(field: "chunk", length: bytes.count, limit: ChunkTransformer.maxChunkSize)
        }
        return bytes
    }
}

/// Content chunks sealed in 4 KiB blocks (`coffer.chunk.v2`, ChunkSealing.blocks): the same plaintext as
/// ChunkTransformer; only the seal's layout differs (ContentCipher).
public struct ChunkBlocksTransformer: EntityTransformer {
    public static let name = "coffer.chunk.v2"
    public static let kind = EntityKind.contentChunk
    public init() {}
    public func encode(_ v: [UInt8]) -> [UInt8] { ChunkTransformer().encode(v) }
    public func decode(_ bytes: [UInt8]) throws(DecodeError) -> [UInt8] { try ChunkTransformer().decode(bytes) }
}
