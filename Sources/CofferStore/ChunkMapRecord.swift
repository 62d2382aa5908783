/// The 16 bytes that end a chunk's sealed value (its AES-GCM tag when sealed whole, its seal id when sealed in
/// blocks): what a file's chunk map records for a position (docs/FORMAT.md, "The chunk map"). All zeros means a hole.
public struct ChunkTag: Hashable, Sendable, CustomStringConvertible {
    public var high: UInt64
    public var low: UInt64

    public static let hole = ChunkTag(high: 0, low: 0)
    public static let byteCount = 16

    public init(high: UInt64, low: UInt64) {
        self.high = high
        self.low = low
    }

    /// The tag of a sealed chunk (its last 16 bytes); nil if it is too short to be one.
    public init?(sealed: UnsafeRawBufferPointer) {
        guard sealed.count >= Self.byteCount else { return nil }
        let base = sealed.count - Self.byteCount
        high = UInt64(bigEndian: sealed.loadUnaligned(fromByteOffset: base, as: UInt64.self))
        low = UInt64(bigEndian: sealed.loadUnaligned(fromByteOffset: base + 8, as: UInt64.self))
    }

    public init?(sealed: [UInt8]) {
        guard let t = sealed.withUnsafeBytes({ ChunkTag(sealed: $0) }) else { return nil }
        self = t
    }

    public var isHole: Bool { high == 0 && low == 0 }
    public var description: String { isHole ? "hole" : String(high, radix: 16) + String(low, radix: 16) }

    func write(to w: inout ByteWriter) {
        w.u64(high)
        w.u64(low)
    }
    static func read(from r: inout ByteReader) throws(DecodeError) -> ChunkTag {
        ChunkTag(high: try r.u64(), low: try r.u64())
    }
}

/// One stored page of a paged chunk map, as the inode names it.
public struct ChunkMapPageRef: Equatable, Sendable {
    public var page: UInt64
    /// Random and non-zero, new on every rewrite of the page: an older copy does not open.
    public var version: UInt64
    public init(page: UInt64, version: UInt64) {
        self.page = page
        self.version = version
    }
}

/// Where a file's chunk map lives, as the sealed inode records it: inline (positions 0..<n, n ≤ 8)
/// or as pages of 1024 positions, listed sparsely (pages that are all holes are not stored).
public enum ChunkMapRoot: Equatable, Sendable {
    case inline([ChunkTag])
    /// Stored pages in ascending page order.
    case paged([ChunkMapPageRef])

    public static let empty = ChunkMapRoot.inline([])
    public static let inlineLimit = 8
    public static let positionsPerPage = 1024
    /// A dense file of 32 TiB at 32 KiB chunks; the inode then holds 16 MiB of page references.
    public static let maxPages = 1 << 20

    func write(to w: inout ByteWriter) {
        switch self {
        case .inline(let tags):
            w.u8(0)
            w.u8(UInt8(tags.count))
            for t in tags { t.write(to: &w) }
        case .paged(let pages):
            w.u8(1)
            w.u32(UInt32(pages.count))
            for p in pages {
                w.u64(p.page)
                w.u64(p.version)
            }
        }
    }

    static func read(from r: inout ByteReader) throws(DecodeError) -> ChunkMapRoot {
        switch try r.u8() {
        case 0:
            let n = Int(try r.u8())
            guard n <= inlineLimit else { throw .invalidValue("inline chunk map too long") }
            var tags: [ChunkTag] = []
            tags.reserveCapacity(n)
            for _ in 0..<n { tags.append(try ChunkTag.read(from: &r)) }
            return .inline(tags)
        case 1:
            let n = Int(try r.u32())
            guard n >= 1, n <= maxPages, n * 16 <= r.remaining else { throw .invalidValue("chunk map page count") }
            var pages: [ChunkMapPageRef] = []
            pages.reserveCapacity(n)
            for _ in 0..<n {
                let ref = ChunkMapPageRef(page: try r.u64(), version: try r.u64())
                guard ref.version != 0, pages.last.map({ $0.page < ref.page }) ?? true else {
                    throw .invalidValue("chunk map pages out of order")
                }
                pages.append(ref)
            }
            return .paged(pages)
        default:
            throw .invalidValue("chunk map form")
        }
    }
}

/// One page of a paged chunk map: the tags of up to 1024 positions (trailing holes trimmed).
public struct ChunkMapPageTransformer: EntityTransformer {
    public static let name = "coffer.chunkmap.v1"
    public static let kind = EntityKind.chunkMapPage
    public init() {}

    public func encode(_ tags: [ChunkTag]) -> [UInt8] {
        var w = ByteWriter(capacity: 3 + tags.count * ChunkTag.byteCount)
        w.u8(1)
        w.u16(UInt16(tags.count))
        for t in tags { t.write(to: &w) }
        return w.bytes
    }

    public func decode(_ bytes: [UInt8]) throws(DecodeError) -> [ChunkTag] {
        var r = ByteReader(bytes)
        let version = try r.u8()
        guard version == 1 else { throw .unsupportedVersion(version) }
        let n = Int(try r.u16())
        guard n <= ChunkMapRoot.positionsPerPage else { throw .invalidValue("chunk map page too long") }
        var tags: [ChunkTag] = []
        tags.reserveCapacity(n)
        for _ in 0..<n { tags.append(try ChunkTag.read(from: &r)) }
        try r.finish()
        return tags
    }

    /// Page ids: content id, page number and page version (so an older copy does not open).
    public static func id(file: UInt64, page: UInt64, version: UInt64) -> [UInt8] {
        file.bigEndianBytes + page.bigEndianBytes + version.bigEndianBytes
    }
}
