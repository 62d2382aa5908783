/// Bounded binary encoding used by every transformer: big-endian integers and length-prefixed byte
/// strings. The reader never traps and never allocates more than the bytes it was given.

/// Why a value could not be decoded. Decoders return it for hostile or damaged bytes.
public enum DecodeError: Error, Equatable, CustomStringConvertible {
    case truncated
    case trailingBytes
    case unsupportedVersion(UInt8)
    case tooLong(field: String, length: Int, limit: Int)
    case invalidValue(String)

    public var description: String {
        switch self {
        case .truncated: return "value is truncated"
        case .trailingBytes: return "value has trailing bytes"
        case .unsupportedVersion(let v): return "unsupported encoding version \(v)"
        case .tooLong(let field, let length, let limit): return "\(field) is \(length) bytes, limit \(limit)"
        case .invalidValue(let why): return "invalid value: \(why)"
        }
    }
}

public struct ByteWriter {
    public private(set) var bytes: [UInt8] = []
    public init(capacity: Int = 64) { bytes.reserveCapacity(capacity) }

    public mutating func u8(_ v: UInt8) { bytes.append(v) }
    public mutating func u16(_ v: UInt16) { appendBigEndian(UInt64(v), count: 2) }
    public mutating func u32(_ v: UInt32) { appendBigEndian(UInt64(v), count: 4) }
    public mutating func u64(_ v: UInt64) { appendBigEndian(v, count: 8) }
    public mutating func i64(_ v: Int64) { appendBigEndian(UInt64(bitPattern: v), count: 8) }
    public mutating func raw<C: Collection>(_ b: C) where C.Element == UInt8 { bytes.append(contentsOf: b) }
    /// 16-bit length prefix; callers keep values under their field limits.
    public mutating func short<C: Collection>(_ b: C) where C.Element == UInt8 {
        u16(UInt16(truncatingIfNeeded: b.count))
        bytes.append(contentsOf: b)
    }
    /// 32-bit length prefix.
    public mutating func long<C: Collection>(_ b: C) where C.Element == UInt8 {
        u32(UInt32(truncatingIfNeeded: b.count))
        bytes.append(contentsOf: b)
    }
    private mutating func appendBigEndian(_ v: UInt64, count: Int) {
        for i in stride(from: count - 1, through: 0, by: -1) { bytes.append(UInt8(truncatingIfNeeded: v >> (UInt64(i) * 8))) }
    }
}

public struct ByteReader {
    private let bytes: [UInt8]
    private var position = 0
    public init(_ bytes: [UInt8]) { self.bytes = bytes }

    public var remaining: Int { bytes.count - position }

    public mutating func u8() throws(DecodeError) -> UInt8 { UInt8(try bigEndian(1)) }
    public mutating func u16() throws(DecodeError) -> UInt16 { UInt16(try bigEndian(2)) }
    public mutating func u32() throws(DecodeError) -> UInt32 { UInt32(try bigEndian(4)) }
    public mutating func u64() throws(DecodeError) -> UInt64 { try bigEndian(8) }
    public mutating func i64() throws(DecodeError) -> Int64 { Int64(bitPattern: try bigEndian(8)) }

    public mutating func raw(_ count: Int) throws(DecodeError) -> [UInt8] {
        guard count >= 0, count <= remaining else { throw .truncated }
        defer { position += count }
        return Array(bytes[position..<position + count])
    }
    public mutating func short(field: String, limit: Int) throws(DecodeError) -> [UInt8] {
        let n = Int(try u16())
        guard n <= limit else { throw .tooLong(field: field, length: n, limit: limit) }
        return try raw(n)
    }
    public mutating func long(field: String, limit: Int) throws(DecodeError) -> [UInt8] {
        let n = Int(try u32())
        guard n <= limit else { throw .tooLong(field: field, length: n, limit: limit) }
        return try raw(n)
    }
    /// Every decoder ends with this: extra bytes mean a value that is not ours.
    public func finish() throws(DecodeError) {
        guard position == bytes.count else { throw .trailingBytes }
    }
    private mutating func bigEndian(_ count: Int) throws(DecodeError) -> UInt64 {
        guard count <= remaining else { throw .truncated }
        var v: UInt64 = 0
        for i in 0..<count { v = (v << 8) | UInt64(bytes[position + i]) }
        position += count
        return v
    }
}

extension UInt64 {
    /// Big-endian bytes, for ids inside associated data and tags.
    @inlinable var bigEndianBytes: [UInt8] {
        (0..<8).map { UInt8(truncatingIfNeeded: self >> (UInt64(7 - $0) * 8)) }
    }
}
