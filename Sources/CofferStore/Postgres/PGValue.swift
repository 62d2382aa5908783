import CPostgres

/// A statement parameter, always sent in binary (no text escaping, bytea at its real size).
public enum PGValue: Sendable, Equatable {
    case null
    case bool(Bool)
    case int4(Int32)
    case int8(Int64)
    case bytea([UInt8])
    case text(String)
    /// A one-dimensional int8[] without NULLs (`= ANY($1)`: a batch of ids in one prepared statement).
    case int8Array([Int64])

    /// Type OIDs from pg_type (stable across releases).
    enum OID {
        static let bool: Oid = 16, bytea: Oid = 17, name: Oid = 19, int8: Oid = 20, int2: Oid = 21
        static let int4: Oid = 23, text: Oid = 25, bpchar: Oid = 1042, varchar: Oid = 1043, int8Array: Oid = 1016
    }

    var oid: Oid {
        switch self {
        case .null: return 0  // let the server infer it from the statement
        case .bool: return OID.bool
        case .int4: return OID.int4
        case .int8: return OID.int8
        case .bytea: return OID.bytea
        case .text: return OID.text
        case .int8Array: return OID.int8Array
        }
    }

    /// The value's binary wire form (network byte order for integers); nil for NULL.
    var byteCount: Int? {
        switch self {
        case .null: return nil
        case .bool: return 1
        case .int4: return 4
        case .int8: return 8
        case .bytea(let b): return b.count
        case .text(let s): return s.utf8.count
        case .int8Array(let v): return v.isEmpty ? 12 : 20 + 12 * v.count
        }
    }

    func write(to p: UnsafeMutableRawPointer) {
        switch self {
        case .null: break
        case .bool(let v): p.storeBytes(of: v ? 1 : 0, as: UInt8.self)
        case .int4(let v): p.storeBytes(of: v.bigEndian, toByteOffset: 0, as: Int32.self)
        case .int8(let v): p.storeBytes(of: v.bigEndian, toByteOffset: 0, as: Int64.self)
        case .bytea(let b): b.withUnsafeBytes { if let s = $0.baseAddress { p.copyMemory(from: s, byteCount: $0.count) } }
        case .text(let s):
            var s = s
            s.withUTF8 { if let b = $0.baseAddress { p.copyMemory(from: b, byteCount: $0.count) } }
        case .int8Array(let v):
            // The binary array form (array_send): dimensions, has-NULLs flag, element type, then the
            // dimension's length and lower bound, then each element as its length and its bytes.
            var header: [Int32] = [1, 0, Int32(bitPattern: OID.int8), Int32(v.count), 1]
            if v.isEmpty { header = [0, 0, Int32(bitPattern: OID.int8)] }
            var at = 0
            for h in header {
                p.storeBytes(of: h.bigEndian, toByteOffset: at, as: Int32.self)
                at += 4
            }
            for e in v {
                p.storeBytes(of: Int32(8).bigEndian, toByteOffset: at, as: Int32.self)
                p.storeBytes(of: e.bigEndian, toByteOffset: at + 4, as: Int64.self)
                at += 12
            }
        }
    }
}

/// The four parallel arrays libpq takes for parameters, over one buffer holding every value.
struct PGParameterArrays: ~Copyable {
    let count: Int32
    let types: [Oid]
    let lengths: [Int32]
    let formats: [Int32]
    private let buffer: UnsafeMutableRawPointer
    let values: [UnsafePointer<CChar>?]

    /// What the server would refuse anyway, checked before anything is sent.
    static func validate(_ params: [PGValue]) throws(PGError) {
        guard params.count <= Int(UInt16.max) else { throw PGError(.usage, "more than 65535 parameters") }
        for p in params where (p.byteCount ?? 0) >= Int(Int32.max) {
            throw PGError(.usage, "a parameter of \(p.byteCount ?? 0) bytes is over 2 GiB")
        }
    }

    init(_ params: [PGValue]) throws(PGError) {
        try Self.validate(params)
        let lengths = params.map { Int32($0.byteCount ?? 0) }
        let total = lengths.reduce(0) { $0 + Int($1) }
        // One byte at least: a non-NULL empty value needs a non-null pointer.
        buffer = UnsafeMutableRawPointer.allocate(byteCount: max(total, 1), alignment: 8)
        var values: [UnsafePointer<CChar>?] = []
        values.reserveCapacity(params.count)
        var offset = 0
        for (i, p) in params.enumerated() {
            if p.byteCount == nil {
                values.append(nil)
                continue
            }
            let at = buffer + offset
            p.write(to: at)
            values.append(UnsafePointer(at.assumingMemoryBound(to: CChar.self)))
            offset += Int(lengths[i])
        }
        self.count = Int32(params.count)
        self.types = params.map(\.oid)
        self.lengths = lengths
        self.formats = [Int32](repeating: 1, count: params.count)
        self.values = values
    }

    deinit { buffer.deallocate() }

    /// The arrays as the C pointers `PQexecParams` and `PQsendQueryParams` take.
    func withPointers<R>(
        _ body: (
            Int32, UnsafePointer<Oid>?, UnsafePointer<UnsafePointer<CChar>?>?,
            UnsafePointer<Int32>?, UnsafePointer<Int32>?
        ) -> R
    ) -> R {
        types.withUnsafeBufferPointer { t in
            values.withUnsafeBufferPointer { v in
                lengths.withUnsafeBufferPointer { l in
                    formats.withUnsafeBufferPointer { f in body(count, t.baseAddress, v.baseAddress, l.baseAddress, f.baseAddress) }
                }
            }
        }
    }
}
