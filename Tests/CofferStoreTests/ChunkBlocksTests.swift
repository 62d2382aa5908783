import CofferCrypto
import CofferStoreTestSupport
import CofferTestSupport
import Foundation
import Testing

@testable import CofferStore

/// Content chunks sealed in 4 KiB blocks (`coffer.chunk.v2`, docs/FORMAT.md "Content chunks sealed in blocks"):
/// a read of some bytes opens only their blocks, and every way of editing a sealed chunk still fails where it
/// is read. Whole seals (`coffer.chunk.v1`) answer the same ranged reads.
@Suite("Chunks sealed in blocks")
struct ChunkBlocksTests {
    let key: AESGCM

    init() throws { key = try [UInt8](repeating: 7, count: 32).withUnsafeBytes { try AESGCM(keyBytes: $0) } }

    func cipher(_ sealing: ChunkSealing, file: UInt64 = 0x51) -> ContentCipher {
        ContentCipher(contentId: file, aead: key, sealing: sealing)
    }

    /// Opens `bytes` of a sealed chunk; the bytes written and the length returned. Nothing past `bytes ∩ 0..<L`
    /// may be written (a reader's output is zeros there).
    func read(
        _ c: ContentCipher, _ sealed: [UInt8], index: UInt64 = 3, _ bytes: Range<Int>, sourceLocation: SourceLocation = #_sourceLocation
    ) throws -> ([UInt8], Int) {
        var out = [UInt8](repeating: 0xEE, count: bytes.count)
        let n = try sealed.withUnsafeBytes { s in try out.withUnsafeMutableBytes { try c.open(s, index: index, bytes: bytes, into: $0) } }
        let written = max(0, min(bytes.upperBound, n) - bytes.lowerBound)
        #expect(out[written...].allSatisfy { $0 == 0xEE }, "bytes past the chunk's end were written", sourceLocation: sourceLocation)
        return (Array(out.prefix(written)), n)
    }

    /// The layout pinned by hand from docs/FORMAT.md (not through the code that seals): block j opens under N with
    /// j XORed into its last four bytes, with the chunk's associated data, the seal id and j (u32, big-endian).
    @Test func blocksOpenAsFormatMdDescribesThem() throws {
        let c = cipher(.blocks, file: 0x0102_0304_0506_0708)
        var g = SplitMix64(seed: 0xD0C)
        let plain = g.bytes(9000)  // blocks of 4096, 4096 and 808 bytes
        let sealed = try c.seal(plain, index: 0x0A0B)
        #expect(sealed.count == 9000 + 3 * 16 + 16)
        let sealId = Array(sealed.suffix(16))
        #expect(Array(sealId.suffix(4)) == [0, 0, 0x23, 0x28], "L = 9000, big-endian")
        let chunkAD = Array("coffer".utf8) + [1, 3] + [1, 2, 3, 4, 5, 6, 7, 8] + [0, 0, 0, 0, 0, 0, 0x0A, 0x0B]
        for (j, range) in [(0, 0..<4096), (1, 4096..<8192), (2, 8192..<9000)] {
            var nonce = Array(sealId.prefix(12))
            nonce[11] ^= UInt8(j)
            let aad = chunkAD + sealId + [0, 0, 0, UInt8(j)]
            let at = j * 4112
            let body = Array(sealed[at..<at + range.count + 16])
            var out = [UInt8](repeating: 0, count: range.count)
            let n = try body.withUnsafeBytes { b in
                try aad.withUnsafeBytes { a in
                    try nonce.withUnsafeBytes { nn in
                        try out.withUnsafeMutableBytes { try key.open(ciphertextAndTag: b, aad: a, nonce: nn, into: $0) }
                    }
                }
            }
            #expect(n == range.count && out == Array(plain[range]), "block \(j)")
        }
    }

    @Test(arguments: [ChunkSealing.blocks, .whole])
    func rangedReadsReturnTheAskedBytesAndTheLength(_ sealing: ChunkSealing) throws {
        let c = cipher(sealing)
        var g = SplitMix64(seed: 0xB10C)
        for length in [0, 1, 100, 4095, 4096, 4097, 8192, 20_000, 32768] {
            let plain = g.bytes(length)
            let sealed = try c.seal(plain, index: 3)
            #expect(sealed.count == c.sealedLength(length))
            if sealing == .blocks {
                let blocks = max(1, (length + 4095) / 4096)
                #expect(sealed.count == length + 16 * blocks + 16)
                #expect(Array(sealed.suffix(4)) == UInt32(length).bigEndianBytes, "the seal id ends with L")
            }
            for bytes in [0..<length, 0..<min(length, 10), (length / 2)..<length, 4000..<4200, 4096..<8192, 30_000..<32768, 0..<32768] {
                let (got, n) = try read(c, sealed, bytes)
                #expect(n == length)
                let a = min(bytes.lowerBound, length), b = min(bytes.upperBound, length)
                #expect(got == Array(plain[a..<b]), "\(sealing) L=\(length) bytes \(bytes)")
            }
            var whole = [UInt8](repeating: 0, count: 32768)
            #expect(try whole.withUnsafeMutableBytes { try c.open(sealed, index: 3, into: $0) } == length)
            #expect(Array(whole.prefix(length)) == plain)
        }
    }

    @Test func twoSealsOfTheSameBytesShareNoNonceOrBlock() throws {
        let c = cipher(.blocks)
        let plain = [UInt8](repeating: 0x41, count: 32768)
        let a = try c.seal(plain, index: 0), b = try c.seal(plain, index: 0)
        #expect(a.suffix(16) != b.suffix(16), "each seal draws its own seal id")
        // Equal plaintext blocks inside one seal encrypt differently: each block has its own nonce.
        let blocks = (0..<8).map { Array(a[($0 * 4112)..<($0 * 4112 + 4096)]) }
        #expect(Set(blocks.map { $0.prefix(32) }).count == 8)
    }

    @Test func anEditedByteFailsTheReadsOfItsBlockOnly() throws {
        let c = cipher(.blocks)
        var g = SplitMix64(seed: 0xF11B)
        let plain = g.bytes(20_000)  // blocks of 4096, the last one 3,616 bytes
        let sealed = try c.seal(plain, index: 3)
        for position in [0, 4095, 4096, 4111, 4112, 2 * 4112 + 17, 4 * 4112 + 3615, 4 * 4112 + 3616 + 15] {
            var edited = sealed
            edited[position] ^= 0x01
            let block = position / 4112
            expectAuthFailure(.contentChunk, "byte \(position)") { try read(c, edited, (block * 4096)..<(block * 4096 + 10)) }
            expectAuthFailure(.contentChunk, "whole, byte \(position)") { try read(c, edited, 0..<32768) }
            // Another block of the same chunk still reads, and only authentic bytes.
            let other = block == 0 ? 1 : 0
            #expect(try read(c, edited, (other * 4096)..<(other * 4096 + 100)).0 == Array(plain[(other * 4096)..<(other * 4096 + 100)]))
        }
        // The seal id: its nonce part or its length, every block fails.
        for position in [sealed.count - 16, sealed.count - 5, sealed.count - 1] {
            var edited = sealed
            edited[position] ^= 0x01
            for block in 0..<5 {
                expectAuthFailure(.contentChunk, "seal id byte \(position)") { try read(c, edited, (block * 4096)..<(block * 4096 + 1)) }
            }
        }
    }

    @Test func blocksMovedMixedOrCutDoNotOpen() throws {
        let c = cipher(.blocks)
        var g = SplitMix64(seed: 0x5AA9)
        let plain = g.bytes(16384)
        let a = try c.seal(plain, index: 3), b = try c.seal(g.bytes(16384), index: 3)
        let id = Array(a.suffix(16))
        func blocks(_ s: [UInt8]) -> [[UInt8]] { (0..<4).map { Array(s[($0 * 4112)..<($0 * 4112 + 4112)]) } }
        let ba = blocks(a), bb = blocks(b)
        // Two blocks swapped.
        let swapped = ba[1] + ba[0] + ba[2] + ba[3] + id
        expectAuthFailure(.contentChunk) { try read(c, swapped, 0..<10) }
        expectAuthFailure(.contentChunk) { try read(c, swapped, 4096..<4106) }
        // A block of another seal of the same chunk, under this seal's id.
        let mixed = ba[0] + bb[1] + ba[2] + ba[3] + id
        expectAuthFailure(.contentChunk) { try read(c, mixed, 4096..<4106) }
        // Cut to three blocks, the id kept: its length no longer matches what the id states.
        expectAuthFailure(.contentChunk) { try read(c, ba[0] + ba[1] + ba[2] + id, 0..<10) }
        // Cut to three blocks with the id's length edited to match: the blocks were sealed under the old id.
        var shorter = id
        shorter.replaceSubrange(12..<16, with: UInt32(12288).bigEndianBytes)
        expectAuthFailure(.contentChunk) { try read(c, ba[0] + ba[1] + ba[2] + shorter, 0..<10) }
        expectAuthFailure(.contentChunk, "a read past the stated end still checks the last block") {
            try read(c, ba[0] + ba[1] + ba[2] + shorter, 14000..<14010)
        }
        // Another position, another file, a whole seal read as blocks.
        expectAuthFailure(.contentChunk) { try read(c, a, index: 4, 0..<10) }
        expectAuthFailure(.contentChunk) { try read(cipher(.blocks, file: 0x53), a, 0..<10) }
        expectAuthFailure(.contentChunk) { try read(c, try cipher(.whole).seal(plain, index: 3), 0..<10) }
        expectAuthFailure(.contentChunk) { try read(cipher(.whole), a, 0..<10) }
        // Lengths no seal has.
        for bad in [[], Array(a.prefix(31)), a + [0], Array(a.dropFirst())] { expectAuthFailure(.contentChunk) { try read(c, bad, 0..<10) } }
        // A length past the largest chunk, with a value exactly as long as that length needs: refused by its length.
        let huge = 2 << 20
        var hugeId = id
        hugeId.replaceSubrange(12..<16, with: UInt32(huge).bigEndianBytes)
        let hugeValue = [UInt8](repeating: 0, count: huge + (huge / 4096) * 16) + hugeId
        #expect(hugeValue.withUnsafeBytes { c.plaintextLength($0) } == nil)
        expectAuthFailure(.contentChunk) { try read(c, hugeValue, 0..<10) }
        // The same for a whole seal: a value longer than the largest chunk is not opened.
        let hugeWhole = [UInt8](repeating: 0, count: huge + 28)
        #expect(hugeWhole.withUnsafeBytes { cipher(.whole).plaintextLength($0) } == nil)
        expectAuthFailure(.contentChunk) { try read(cipher(.whole), hugeWhole, 0..<10) }
    }

    @Test func aWholeOpenNeedsRoomForTheChunk() throws {
        for sealing in [ChunkSealing.blocks, .whole] {
            let c = cipher(sealing)
            let sealed = try c.seal([UInt8](repeating: 1, count: 5000), index: 0)
            var small = [UInt8](repeating: 0, count: 4096)
            expectAuthFailure(.contentChunk) { try small.withUnsafeMutableBytes { try c.open(sealed, index: 0, into: $0) } }
            #expect(small.allSatisfy { $0 == 0 })
        }
    }

    @Test(arguments: [ChunkSealing.blocks, .whole])
    func aStoreSealsAsItsKindsRowSays(_ sealing: ChunkSealing) throws {
        try withTempDir { dir in
            let made = try TestStore.create(
                .sqlite, in: dir, chunkSize: 32768, registry: sealing == .blocks ? .standard : .wholeChunks)
            // Opened with the standard registry either way: old stores keep their form.
            let store = try made.open()
            #expect(store.chunkSealing == sealing)
            let c = try store.contentCipher(contentId: 7)
            #expect(c.sealing == sealing)
            // What the store holds has the form's layout, and reads back through a new cipher of the store.
            try store.putChunks(file: 7, [(0, try c.seal([UInt8](repeating: 9, count: 20_000), index: 0))])
            try store.commit()
            let stored = try #require(try store.sealedChunks(file: 7, first: 0, last: 0).first?.sealed)
            #expect(stored.count == (sealing == .blocks ? 20_000 + 5 * 16 + 16 : 20_000 + 28))
            #expect(try read(try store.contentCipher(contentId: 7), stored, index: 0, 12_000..<12_010).0 == [UInt8](repeating: 9, count: 10))
            store.close()
        }
    }
}

extension UInt32 {
    fileprivate var bigEndianBytes: [UInt8] { withUnsafeBytes(of: self.bigEndian) { Array($0) } }
}
