import CofferCrypto
import Foundation
import CofferTestSupport
import Testing
@testable import CofferStore

/// Returns the DecodeError thrown by `body`, or nil if it returned.
func decodeError<T>(sourceLocation: SourceLocation = #_sourceLocation, _ body: () throws -> T) -> DecodeError? {
    do {
        _ = try body()
        return nil
    } catch let e as DecodeError { return e } catch {
        Issue.record("expected a DecodeError, got \(error)", sourceLocation: sourceLocation)
        return nil
    }
}

@Suite("Transformers: round trips and hostile bytes")
struct TransformerTests {
    static let times: [StoredTime] = [
        StoredTime(seconds: 0, nanoseconds: 0),
        StoredTime(seconds: -1, nanoseconds: 999_999_999),
        StoredTime(seconds: Int64.min, nanoseconds: 1),
        StoredTime(seconds: Int64.max, nanoseconds: 500)
    ]

    static let inodes: [InodeRecord] = [
        sampleInode(),
        InodeRecord(mode: 0, uid: 0, gid: 0, nlink: 0, atime: times[0], mtime: times[0], ctime: times[0]),
        InodeRecord(
            mode: UInt32.max, uid: UInt32.max, gid: UInt32.max, nlink: UInt32.max, size: UInt64(Int64.max),
            rdev: UInt64.max, atime: times[1], mtime: times[2], ctime: times[3], contentId: UInt64.max),
        InodeRecord(
            mode: 0o100600, uid: 1, gid: 1, nlink: 1, size: 100_000, atime: times[0], mtime: times[0], ctime: times[0],
            contentId: 7, chunkCount: 2, chunkMap: .inline([ChunkTag(high: 1, low: 2), .hole, ChunkTag(high: .max, low: .max)])),
        InodeRecord(
            mode: 0o100600, uid: 1, gid: 1, nlink: 1, size: 1 << 40, atime: times[0], mtime: times[0], ctime: times[0],
            contentId: 9, chunkCount: 5, chunkMap: .paged([ChunkMapPageRef(page: 0, version: 42), ChunkMapPageRef(page: 1 << 40, version: .max)])),
        sampleInode(mode: 0o120777, target: .relative([])),
        sampleInode(mode: 0o120777, target: .relative(b("docs/a b/ü.txt"))),
        sampleInode(mode: 0o120777, target: .verbatim(b("../../etc/passwd"))),
        sampleInode(mode: 0o120777, target: .verbatim(b("/absolute/outside"))),
        sampleInode(mode: 0o120777, target: .verbatim([UInt8](repeating: UInt8(ascii: "x"), count: 4096))),
        sampleInode(mode: 0o120777, target: .relative([UInt8](repeating: UInt8(ascii: "y"), count: 4096))),
        sampleInode(mode: 0o120777, target: .verbatim([0xFF, 0xFE, 0x80]))  // not UTF-8: paths are bytes
    ]

    @Test(arguments: inodes)
    func inodeRoundTrip(_ record: InodeRecord) throws {
        let t = InodeTransformer()
        let bytes = t.encode(record)
        #expect(try t.decode(bytes) == record)
        // Every strict prefix is truncated, every extension has trailing bytes.
        for n in 0..<bytes.count {
            expectSomeError(DecodeError.self, "prefix \(n) of \(bytes.count) decoded") { try t.decode(Array(bytes.prefix(n))) }
        }
        expectError(DecodeError.trailingBytes) { try t.decode(bytes + [0]) }
        var wrongVersion = bytes
        wrongVersion[0] = 1
        expectError(DecodeError.unsupportedVersion(1)) { try t.decode(wrongVersion) }
    }

    @Test func chunkMapRootsAndPagesRefuseHostileShapes() throws {
        let t = InodeTransformer()
        let base = Array(t.encode(sampleInode()).dropLast(2))  // without the empty inline map
        func withMap(_ tail: (inout ByteWriter) -> Void) -> [UInt8] {
            var w = ByteWriter()
            w.raw(base)
            tail(&w)
            return w.bytes
        }
        let tooLongInline = withMap { w in
            w.u8(0)
            w.u8(9)
            for _ in 0..<9 {
                w.u64(1)
                w.u64(1)
            }
        }
        expectError(DecodeError.invalidValue("inline chunk map too long")) { try t.decode(tooLongInline) }
        let noPages = withMap { w in
            w.u8(1)
            w.u32(0)
        }
        expectError(DecodeError.invalidValue("chunk map page count")) { try t.decode(noPages) }
        // A page count far beyond the bytes present is refused before anything is allocated.
        let hugeCount = withMap { w in
            w.u8(1)
            w.u32(UInt32.max)
            w.u64(1)
        }
        expectError(DecodeError.invalidValue("chunk map page count")) { try t.decode(hugeCount) }
        let outOfOrder = withMap { w in
            w.u8(1)
            w.u32(2)
            w.u64(5)
            w.u64(1)
            w.u64(5)
            w.u64(2)
        }
        expectError(DecodeError.invalidValue("chunk map pages out of order")) { try t.decode(outOfOrder) }
        let zeroVersion = withMap { w in
            w.u8(1)
            w.u32(1)
            w.u64(5)
            w.u64(0)
        }
        expectError(DecodeError.invalidValue("chunk map pages out of order")) { try t.decode(zeroVersion) }
        let badForm = withMap { w in w.u8(7) }
        expectError(DecodeError.invalidValue("chunk map form")) { try t.decode(badForm) }

        let pages = ChunkMapPageTransformer()
        let tags = (0..<1024).map { ChunkTag(high: UInt64($0), low: UInt64($0) &* 31) }
        let encoded = pages.encode(tags)
        #expect(try pages.decode(encoded) == tags)
        #expect(try pages.decode(pages.encode([])) == [])
        var tooMany = ByteWriter()
        tooMany.u8(1)
        tooMany.u16(1025)
        expectError(DecodeError.invalidValue("chunk map page too long")) { try pages.decode(tooMany.bytes) }
        expectError(DecodeError.trailingBytes) { try pages.decode(encoded + [0]) }
        expectError(DecodeError.truncated) { try pages.decode(Array(encoded.dropLast())) }
    }

    @Test func inodeDecoderRefusesOutOfRangeValues() throws {
        let t = InodeTransformer()
        let good = t.encode(sampleInode())
        // size > Int64.max
        var w = ByteWriter()
        w.u8(2)
        w.u32(0o100644)
        w.u32(0)
        w.u32(0)
        w.u32(1)
        w.u64(UInt64(Int64.max) + 1)
        w.u64(0)
        for _ in 0..<3 {
            w.i64(0)
            w.u32(0)
        }
        w.u64(0)
        w.u8(0)
        w.u64(0)
        w.u8(0)
        w.u8(0)
        expectError(DecodeError.invalidValue("size out of range")) { try t.decode(w.bytes) }
        // nanoseconds >= 1e9 (atime's nanoseconds start at 1 + 16 + 16 + 8)
        var badNs = good
        for i in 0..<4 { badNs[41 + i] = [0x3B, 0x9A, 0xCA, 0x00][i] }  // 1_000_000_000
        expectError(DecodeError.invalidValue("nanoseconds out of range")) { try t.decode(badNs) }
        // symlink flag other than 0/1 (it sits before the u64 chunk count and the 2-byte empty inline map)
        var badFlag = good
        badFlag[badFlag.count - 11] = 2
        expectError(DecodeError.invalidValue("symlink flag")) { try t.decode(badFlag) }
        // symlink target that escapes its root, or holds NUL
        for hostile in [StoredPath.relative(b("../x")), .relative(b("/etc/passwd")), .relative(b("a/../../b")), .verbatim(b("a\0b"))] {
            var w = ByteWriter()
            w.raw(good.dropLast(11))
            w.u8(1)
            ContainerPathTransformer.encode(hostile, into: &w)
            w.u64(0)
            w.u8(0)
            w.u8(0)
            if case .invalidValue? = decodeError({ try t.decode(w.bytes) }) {
            } else {
                Issue.record("inode with hostile symlink target \(hostile) was not refused")
            }
        }
    }

    static let entries: [DirectoryEntryRecord] = [
        DirectoryEntryRecord(name: b("a"), ino: 0, type: 0),
        DirectoryEntryRecord(name: b("file.txt"), ino: 1, type: 0o100000),
        DirectoryEntryRecord(name: [UInt8](repeating: 0x41, count: 255), ino: UInt64.max, type: UInt32.max),
        DirectoryEntryRecord(name: (1...255).map { UInt8($0) }.filter { $0 != UInt8(ascii: "/") }, ino: 99, type: 0o040000),
        DirectoryEntryRecord(name: b("..."), ino: 5, type: 0o120000)
    ]

    @Test(arguments: entries)
    func directoryEntryRoundTrip(_ record: DirectoryEntryRecord) throws {
        let t = DirectoryEntryTransformer()
        let bytes = t.encode(record)
        #expect(try t.decode(bytes) == record)
        for n in 0..<bytes.count {
            expectSomeError(DecodeError.self, "prefix \(n) decoded") { try t.decode(Array(bytes.prefix(n))) }
        }
        expectError(DecodeError.trailingBytes) { try t.decode(bytes + [1, 2]) }
    }

    @Test func directoryEntryDecoderRefusesBadNames() {
        let t = DirectoryEntryTransformer()
        func encoded(_ name: [UInt8]) -> [UInt8] {
            var w = ByteWriter()
            w.u8(1)
            w.short(name)
            w.u64(2)
            w.u32(0o100000)
            return w.bytes
        }
        expectError(DecodeError.invalidValue("entry name")) { try t.decode(encoded([])) }
        expectError(DecodeError.invalidValue("entry name")) { try t.decode(encoded(b("a/b"))) }
        expectError(DecodeError.invalidValue("entry name")) { try t.decode(encoded(b("a\0b"))) }
        expectError(DecodeError.tooLong(field: "name", length: 256, limit: 255)) { try t.decode(encoded([UInt8](repeating: 0x61, count: 256))) }
        expectError(DecodeError.tooLong(field: "name", length: 65535, limit: 255)) { try t.decode([1, 0xFF, 0xFF]) }
        expectError(DecodeError.truncated) { try t.decode([1, 0, 200, 0x61]) }
    }

    static let xattrs: [ExtendedAttributeRecord] = [
        ExtendedAttributeRecord(name: b("user.a"), value: []),
        ExtendedAttributeRecord(name: [], value: [0]),
        ExtendedAttributeRecord(name: [UInt8](repeating: 0x62, count: 255), value: [UInt8](repeating: 0xAB, count: 65536)),
        ExtendedAttributeRecord(name: b("user.mime_type"), value: b("text/plain\0with nul"))
    ]

    @Test(arguments: xattrs)
    func extendedAttributeRoundTrip(_ record: ExtendedAttributeRecord) throws {
        let t = ExtendedAttributeTransformer()
        let bytes = t.encode(record)
        #expect(try t.decode(bytes) == record)
        for n in Set([0, 1, 2, 3, 4, 5, 6, bytes.count / 2, bytes.count - 1]) where n < bytes.count {
            expectSomeError(DecodeError.self, "prefix \(n) decoded") { try t.decode(Array(bytes.prefix(n))) }
        }
        expectError(DecodeError.trailingBytes) { try t.decode(bytes + [0]) }
    }

    @Test func extendedAttributeLimits() {
        let t = ExtendedAttributeTransformer()
        var w = ByteWriter()
        w.u8(1)
        w.short([UInt8](repeating: 1, count: 256))
        w.long([UInt8]())
        expectError(DecodeError.tooLong(field: "xattr name", length: 256, limit: 255)) { try t.decode(w.bytes) }
        w = ByteWriter()
        w.u8(1)
        w.short(b("user.x"))
        w.long([UInt8](repeating: 1, count: 65537))
        expectError(DecodeError.tooLong(field: "xattr value", length: 65537, limit: 65536)) { try t.decode(w.bytes) }
        // A length field claiming 4 GiB on a tiny value: refused before any allocation.
        expectError(DecodeError.tooLong(field: "xattr value", length: 0xFFFF_FFFF, limit: 65536)) {
            try t.decode([1, 0, 1, 0x61, 0xFF, 0xFF, 0xFF, 0xFF])
        }
        expectError(DecodeError.truncated) { try t.decode([1, 0, 1, 0x61, 0x00, 0x01, 0x00, 0x00]) }
    }

    static let states: [StoreStateRecord] = [
        StoreStateRecord(generation: 0, containerId: []),
        StoreStateRecord(generation: 1, containerId: [UInt8](repeating: 9, count: 16)),
        StoreStateRecord(generation: UInt64.max, containerId: [UInt8](repeating: 0xFF, count: 64))
    ]

    @Test(arguments: states)
    func storeStateRoundTrip(_ record: StoreStateRecord) throws {
        let t = StoreStateTransformer()
        let bytes = t.encode(record)
        #expect(try t.decode(bytes) == record)
        for n in 0..<bytes.count {
            expectSomeError(DecodeError.self, "prefix \(n) decoded") { try t.decode(Array(bytes.prefix(n))) }
        }
        expectError(DecodeError.trailingBytes) { try t.decode(bytes + [0]) }
        var v = bytes
        v[0] = 0
        expectError(DecodeError.unsupportedVersion(0)) { try t.decode(v) }
    }

    @Test func storeStateLimit() {
        let t = StoreStateTransformer()
        var w = ByteWriter()
        w.u8(1)
        w.u64(3)
        w.short([UInt8](repeating: 1, count: 65))
        expectError(DecodeError.tooLong(field: "container id", length: 65, limit: 64)) { try t.decode(w.bytes) }
    }

    @Test func chunkRoundTripAndLimit() throws {
        let t = ChunkTransformer()
        for size in [0, 1, 4096, 65536, ChunkTransformer.maxChunkSize] {
            let data = (0..<size).map { UInt8(truncatingIfNeeded: $0 &* 31) }
            #expect(try t.decode(t.encode(data)) == data)
        }
        let tooBig = [UInt8](repeating: 0, count: ChunkTransformer.maxChunkSize + 1)
        expectError(DecodeError.tooLong(field: "chunk", length: ChunkTransformer.maxChunkSize + 1, limit: ChunkTransformer.maxChunkSize)) {
            try t.decode(tooBig)
        }
    }

    @Test func registryNamesAreStableAndDistinct() {
        let r = TransformerRegistry.standard
        #expect(r.registeredKinds == EntityKind.allCases)
        #expect(r.transformerName(for: .inode) == "coffer.inode.v1")
        #expect(r.transformerName(for: .directoryEntry) == "coffer.dirent.v1")
        #expect(r.transformerName(for: .contentChunk) == "coffer.chunk.v2")
        #expect(r.accepts("coffer.chunk.v1", for: .contentChunk) && r.accepts("coffer.chunk.v2", for: .contentChunk))
        #expect(!r.accepts("coffer.chunk.v1", for: .inode) && !r.accepts("coffer.chunk.v3", for: .contentChunk))
        #expect(TransformerRegistry.wholeChunks.transformerName(for: .contentChunk) == "coffer.chunk.v1")
        #expect(r.transformerName(for: .extendedAttribute) == "coffer.xattr.v1")
        #expect(r.transformerName(for: .storeState) == "coffer.state.v1")
        #expect(Set(EntityKind.allCases.map(\.name)).count == EntityKind.allCases.count)
        for k in EntityKind.allCases { #expect(EntityKind(name: k.name) == k) }
        #expect(EntityKind(name: "bogus") == nil)
        #expect(TransformerRegistry().registeredKinds.isEmpty)
    }

    @Test func sealerBindsKindAndId() throws {
        let cipher = try AESGCM(key: try SecureBytes.random(count: 32))
        let sealer = EntitySealer(registry: .standard)
        let record = sampleInode(size: 10)
        let sealed = try sealer.seal(InodeTransformer(), record, id: UInt64(7).bigEndianBytes, cipher: cipher)
        #expect(try sealer.open(InodeTransformer(), sealed, id: UInt64(7).bigEndianBytes, cipher: cipher, describe: "inode 7") == record)
        // Another id: refused.
        expectAuthFailure(.inode) { _ = try sealer.open(InodeTransformer(), sealed, id: UInt64(8).bigEndianBytes, cipher: cipher, describe: "x") }
        // Another kind with the same id: refused (as the kind it was asked for).
        expectAuthFailure(.directoryEntry) {
            _ = try sealer.open(DirectoryEntryTransformer(), sealed, id: UInt64(7).bigEndianBytes, cipher: cipher, describe: "x")
        }
        // Another key: refused.
        let other = try AESGCM(key: try SecureBytes.random(count: 32))
        expectAuthFailure(.inode) { _ = try sealer.open(InodeTransformer(), sealed, id: UInt64(7).bigEndianBytes, cipher: other, describe: "x") }
        // Every single-bit flip is refused.
        for i in 0..<sealed.count {
            var bad = sealed
            bad[i] ^= 0x10
            expectAuthFailure(.inode) { _ = try sealer.open(InodeTransformer(), bad, id: UInt64(7).bigEndianBytes, cipher: cipher, describe: "x") }
        }
        // Short values.
        for n in [0, 1, 27, 28] {
            expectSomeError(StoreError.self) {
                _ = try sealer.open(InodeTransformer(), Array(sealed.prefix(n)), id: UInt64(7).bigEndianBytes, cipher: cipher, describe: "x")
            }
        }
        // A value that authenticates but does not decode is `malformed`, not a crash.
        let junk = try cipher.seal([9, 9, 9], aad: EntitySealer.associatedData(kind: .inode, id: UInt64(7).bigEndianBytes))
        expectError(StoreError.malformed(kind: .inode, entity: "inode 7", .unsupportedVersion(9))) {
            _ = try sealer.open(InodeTransformer(), junk, id: UInt64(7).bigEndianBytes, cipher: cipher, describe: "inode 7")
        }
        // Two seals of the same value differ (fresh nonce).
        #expect(try sealer.seal(InodeTransformer(), record, id: UInt64(7).bigEndianBytes, cipher: cipher) != sealed)
    }

    @Test func sealerRefusesUnregisteredTransformers() throws {
        let cipher = try AESGCM(key: try SecureBytes.random(count: 32))
        let empty = EntitySealer(registry: TransformerRegistry())
        expectError(StoreError.unknownTransformer(kind: "inode", transformer: "coffer.inode.v1")) {
            _ = try empty.seal(InodeTransformer(), sampleInode(), id: [1], cipher: cipher)
        }
        let sealed = try EntitySealer(registry: .standard).seal(InodeTransformer(), sampleInode(), id: [1], cipher: cipher)
        expectError(StoreError.unknownTransformer(kind: "inode", transformer: "coffer.inode.v1")) {
            _ = try empty.open(InodeTransformer(), sealed, id: [1], cipher: cipher, describe: "x")
        }
    }
}

extension InodeRecord: CustomTestStringConvertible {
    public var testDescription: String {
        "inode(mode \(String(mode, radix: 8)), size \(size), target \(String(describing: symlinkTarget).prefix(40)))"
    }
}
extension DirectoryEntryRecord: CustomTestStringConvertible {
    public var testDescription: String { "entry(\(name.count)-byte name, ino \(ino))" }
}
extension ExtendedAttributeRecord: CustomTestStringConvertible {
    public var testDescription: String { "xattr(\(name.count)-byte name, \(value.count)-byte value)" }
}
extension StoreStateRecord: CustomTestStringConvertible {
    public var testDescription: String { "state(gen \(generation), id \(containerId.count) bytes)" }
}
