import CofferCrypto

/// How a store seals content chunks: the transformer its `coffer_kinds` row names for the chunk kind
/// (docs/FORMAT.md, "Content chunks sealed in blocks").
public enum ChunkSealing: Sendable, Equatable {
    /// `coffer.chunk.v1`: one AES-GCM seal per chunk.
    case whole
    /// `coffer.chunk.v2`: 4 KiB blocks, each its own seal, tied together by the chunk's seal id.
    case blocks

    public init?(transformerName: String) {
        switch transformerName {
        case ChunkTransformer.name: self = .whole
        case ChunkBlocksTransformer.name: self = .blocks
        default: return nil
        }
    }
}

/// One file's content cipher, as gocryptfs's contentenc: the file's own AEAD key and its content
/// id, and the associated data that binds each sealed chunk to (format version, kind, content id,
/// index), so a chunk moved to another file or position does not open (docs/FORMAT.md). The
/// filesystem holds one per file it reads or writes, never the container's keys.
public struct ContentCipher: Sendable {
    public let contentId: UInt64
    public let sealing: ChunkSealing
    private let aead: AESGCM

    init(contentId: UInt64, aead: AESGCM, sealing: ChunkSealing) {
        self.contentId = contentId
        self.aead = aead
        self.sealing = sealing
    }

    /// Plaintext bytes per block of a chunk sealed in blocks.
    public static let blockSize = 4096
    static let tagSize = AESGCM.tagSize, sealIdSize = 16

    /// Seals one chunk's plaintext for position `index` under a fresh random nonce.
    public func seal(_ plaintext: UnsafeRawBufferPointer, index: UInt64) throws(StoreError) -> [UInt8] {
        do {
            switch sealing {
            case .whole: return try associatedData(index).withUnsafeBytes { try aead.seal(plaintext, aad: $0) }
            case .blocks: return try sealBlocks(plaintext, index: index)
            }
        } catch { throw .sealingFailed("\(error)") }
    }

    public func seal(_ plaintext: [UInt8], index: UInt64) throws(StoreError) -> [UInt8] {
        var result: Result<[UInt8], StoreError> = .success([])
        plaintext.withUnsafeBytes { p in
            do throws(StoreError) { result = .success(try seal(p, index: index)) } catch { result = .failure(error) }
        }
        return try result.get()
    }

    /// Opens a whole chunk sealed for position `index` into `output` (at least its plaintext length); returns
    /// the plaintext length. Anything else (another file's, another position's, damaged) fails.
    public func open(_ sealed: UnsafeRawBufferPointer, index: UInt64, into output: UnsafeMutableRawBufferPointer) throws(StoreError) -> Int {
        guard let length = plaintextLength(sealed), length <= output.count else {
            throw .authenticationFailed(kind: .contentChunk, entity: "chunk \(index) of content \(contentId)")
        }
        return try open(sealed, index: index, bytes: 0..<length, into: output)
    }

    public func open(_ sealed: [UInt8], index: UInt64, into output: UnsafeMutableRawBufferPointer) throws(StoreError) -> Int {
        var result: Result<Int, StoreError> = .success(0)
        sealed.withUnsafeBytes { s in
            do throws(StoreError) { result = .success(try open(s, index: index, into: output)) } catch { result = .failure(error) }
        }
        return try result.get()
    }

    /// Opens bytes `bytes` of a chunk (offsets inside it) into the start of `output` (at least
    /// `bytes.count`); returns the chunk's plaintext length L, so the caller knows that only
    /// `bytes ∩ 0..<L` were written. Sealed in blocks, only the blocks that hold those bytes are
    /// decrypted (a 4 KiB read of a 32 KiB chunk opens one block); sealed whole, all of it is (into a buffer of
    /// its own unless `bytes` and `output` take the whole chunk). When it throws, `output` may still hold
    /// authentic bytes of blocks opened before the one that failed (never unauthenticated ones): discard it.
    public func open(
        _ sealed: UnsafeRawBufferPointer, index: UInt64, bytes: Range<Int>, into output: UnsafeMutableRawBufferPointer
    ) throws(StoreError) -> Int {
        do {
            guard let length = plaintextLength(sealed), bytes.lowerBound >= 0,
                output.count >= min(bytes.count, max(0, length - bytes.lowerBound))
            else { throw CryptoError.authenticationFailed }
            switch sealing {
            case .whole:
                let aad = associatedData(index)
                if bytes.lowerBound == 0, bytes.upperBound >= length, output.count >= length {
                    return try aad.withUnsafeBytes { try aead.open(sealed, aad: $0, into: output) }
                }
                var chunk = [UInt8](repeating: 0, count: length)
                try chunk.withUnsafeMutableBytes { c in
                    defer { c.initializeMemory(as: UInt8.self, repeating: 0) }
                    _ = try aad.withUnsafeBytes { try aead.open(sealed, aad: $0, into: c) }
                    let a = bytes.lowerBound, b = min(bytes.upperBound, length)
                    guard a < b else { return }
                    UnsafeMutableRawBufferPointer(rebasing: output[0..<(b - a)]).copyMemory(from: UnsafeRawBufferPointer(rebasing: c[a..<b]))
                }
                return length
            case .blocks:
                try openBlocks(sealed, length: length, index: index, bytes: bytes, into: output)
                return length
            }
        } catch let error as StoreError {
            throw error
        } catch {
            throw .authenticationFailed(kind: .contentChunk, entity: "chunk \(index) of content \(contentId)")
        }
    }

    /// The plaintext length a sealed chunk states (nil when its length cannot be one this form writes);
    /// authenticated only once it is opened.
    public func plaintextLength(_ sealed: UnsafeRawBufferPointer) -> Int? {
        switch sealing {
        case .whole:
            let length = sealed.count - AESGCM.overhead
            return length >= 0 && length <= ChunkTransformer.maxChunkSize ? length : nil
        case .blocks:
            guard sealed.count >= Self.tagSize + Self.sealIdSize else { return nil }
            let length = Int(UInt32(bigEndian: sealed.loadUnaligned(fromByteOffset: sealed.count - 4, as: UInt32.self)))
            return length <= ChunkTransformer.maxChunkSize && sealedLength(length) == sealed.count ? length : nil
        }
    }

    /// Sealed length of a chunk of `plaintextLength` bytes.
    public func sealedLength(_ plaintextLength: Int) -> Int { Self.sealedLength(plaintextLength, sealing: sealing) }

    public static func sealedLength(_ plaintextLength: Int, sealing: ChunkSealing) -> Int {
        switch sealing {
        case .whole: return plaintextLength + AESGCM.overhead
        case .blocks: return plaintextLength + Self.blockCount(plaintextLength) * Self.tagSize + Self.sealIdSize
        }
    }

    /// Zeroes the key now (unmount). Nothing may use this cipher afterwards.
    public func wipe() { aead.wipe() }

    // MARK: Blocks (coffer.chunk.v2)

    /// Blocks of a chunk of `length` bytes (at least one: every chunk carries a tag).
    public static func blockCount(_ length: Int) -> Int { max(1, (length + blockSize - 1) / blockSize) }

    private func sealBlocks(_ plaintext: UnsafeRawBufferPointer, index: UInt64) throws -> [UInt8] {
        guard plaintext.count <= ChunkTransformer.maxChunkSize else { throw CryptoError.invalidParameter("chunk too large") }
        let length = plaintext.count, total = sealedLength(length)
        return try [UInt8](unsafeUninitializedCapacity: total) { buffer, initialized in
            let out = UnsafeMutableRawBufferPointer(buffer)
            let sealId = UnsafeMutableRawBufferPointer(rebasing: out[(total - Self.sealIdSize)...])
            let nonce = UnsafeMutableRawBufferPointer(rebasing: sealId[0..<AESGCM.nonceSize])
            repeat { try Random.fill(nonce) } while nonce.allSatisfy { $0 == 0 }  // all zeros would read as a hole's tag
            sealId.storeBytes(of: UInt32(length).bigEndian, toByteOffset: AESGCM.nonceSize, as: UInt32.self)
            try withBlockParameters(index: index, sealId: UnsafeRawBufferPointer(sealId)) { block in
                for j in 0..<Self.blockCount(length) {
                    let (nonce, aad) = block(j)
                    let from = j * Self.blockSize, to = min(length, from + Self.blockSize)
                    let at = j * (Self.blockSize + Self.tagSize)
                    try aead.seal(
                        UnsafeRawBufferPointer(rebasing: plaintext[from..<to]), aad: aad, nonce: nonce,
                        into: UnsafeMutableRawBufferPointer(rebasing: out[at..<at + (to - from) + Self.tagSize]))
                }
            }
            initialized = total
        }
    }

    /// `length`: what `plaintextLength` found for `sealed` (its layout is checked there).
    private func openBlocks(
        _ sealed: UnsafeRawBufferPointer, length: Int, index: UInt64, bytes: Range<Int>, into output: UnsafeMutableRawBufferPointer
    ) throws {
        let sealId = UnsafeRawBufferPointer(rebasing: sealed[(sealed.count - Self.sealIdSize)...])
        // The blocks the asked bytes lie in; none when they all lie past L (they read as zeros), but then the last
        // block is still opened, so a value cut short (which states a smaller L only if its seal id was forged) fails.
        let end = min(bytes.upperBound, length)
        let firstBlock = bytes.lowerBound < end ? bytes.lowerBound / Self.blockSize : Self.blockCount(length) - 1
        let lastBlock = bytes.lowerBound < end ? (end - 1) / Self.blockSize : firstBlock
        try withBlockParameters(index: index, sealId: sealId) { block in
            try withUnsafeTemporaryAllocation(byteCount: Self.blockSize, alignment: 16) { scratch in
                defer { scratch.initializeMemory(as: UInt8.self, repeating: 0) }
                for j in firstBlock...lastBlock {
                    let (nonce, aad) = block(j)
                    let from = j * Self.blockSize, to = min(length, from + Self.blockSize)
                    let at = j * (Self.blockSize + Self.tagSize)
                    let body = UnsafeRawBufferPointer(rebasing: sealed[at..<at + (to - from) + Self.tagSize])
                    // Straight into the output when the block lies wholly inside the asked bytes.
                    if from >= bytes.lowerBound, to <= bytes.upperBound {
                        let dst = UnsafeMutableRawBufferPointer(rebasing: output[(from - bytes.lowerBound)..<(to - bytes.lowerBound)])
                        _ = try aead.open(ciphertextAndTag: body, aad: aad, nonce: nonce, into: dst)
                        continue
                    }
                    _ = try aead.open(ciphertextAndTag: body, aad: aad, nonce: nonce, into: scratch)
                    let a = max(from, bytes.lowerBound), b = min(to, bytes.upperBound)
                    guard a < b else { continue }
                    UnsafeMutableRawBufferPointer(rebasing: output[(a - bytes.lowerBound)..<(b - bytes.lowerBound)])
                        .copyMemory(from: UnsafeRawBufferPointer(rebasing: scratch[(a - from)..<(b - from)]))
                }
            }
        }
    }

    /// Calls `body` with a function that gives block j's nonce (N with j XORed into its last four bytes) and
    /// associated data (the chunk's, then the seal id, then j), both in one reused stack buffer.
    private func withBlockParameters<T>(
        index: UInt64, sealId: UnsafeRawBufferPointer, _ body: ((Int) -> (UnsafeRawBufferPointer, UnsafeRawBufferPointer)) throws -> T
    ) throws -> T {
        let chunk = associatedData(index)
        let aadLength = chunk.count + Self.sealIdSize + 4
        return try withUnsafeTemporaryAllocation(byteCount: AESGCM.nonceSize + aadLength, alignment: 8) { buffer in
            let nonce = UnsafeMutableRawBufferPointer(rebasing: buffer[0..<AESGCM.nonceSize])
            let aad = UnsafeMutableRawBufferPointer(rebasing: buffer[AESGCM.nonceSize...])
            chunk.withUnsafeBytes { aad.copyMemory(from: $0) }
            UnsafeMutableRawBufferPointer(rebasing: aad[chunk.count..<chunk.count + Self.sealIdSize]).copyMemory(from: sealId)
            return try body { j in
                let n = UInt32(truncatingIfNeeded: j)
                nonce.copyMemory(from: UnsafeRawBufferPointer(rebasing: sealId[0..<AESGCM.nonceSize]))
                let last = nonce.loadUnaligned(fromByteOffset: 8, as: UInt32.self)
                nonce.storeBytes(of: last ^ n.bigEndian, toByteOffset: 8, as: UInt32.self)
                aad.storeBytes(of: n.bigEndian, toByteOffset: aadLength - 4, as: UInt32.self)
                return (UnsafeRawBufferPointer(nonce), UnsafeRawBufferPointer(aad))
            }
        }
    }

    private func associatedData(_ index: UInt64) -> [UInt8] {
        EntitySealer.associatedData(kind: .contentChunk, id: EntitySealer.chunkId(file: contentId, index: index))
    }
}
