import CofferCrypto

/// One file's content cipher, as gocryptfs's contentenc: the file's own AEAD key and its content
/// id, and the associated data that binds each sealed chunk to (format version, kind, content id,
/// index), so a chunk moved to another file or position does not open (docs/FORMAT.md). The
/// filesystem holds one per file it reads or writes, never the container's keys.
public struct ContentCipher: Sendable {
    public let contentId: UInt64
    private let aead: AESGCM

    init(contentId: UInt64, aead: AESGCM) {
        self.contentId = contentId
        self.aead = aead
    }

    /// Bytes a sealed chunk adds to its plaintext (nonce and tag).
    public static let overhead = AESGCM.overhead

    /// Seals one chunk's plaintext for position `index` under a fresh random nonce.
    public func seal(_ plaintext: UnsafeRawBufferPointer, index: UInt64) throws(StoreError) -> [UInt8] {
        let aad = associatedData(index)
        do { return try aad.withUnsafeBytes { try aead.seal(plaintext, aad: $0) } } catch { throw .sealingFailed("\(error)") }
    }

    public func seal(_ plaintext: [UInt8], index: UInt64) throws(StoreError) -> [UInt8] {
        let aad = associatedData(index)
        do { return try aead.seal(plaintext, aad: aad) } catch { throw .sealingFailed("\(error)") }
    }

    /// Opens a chunk sealed for position `index` into `output` (at least chunk-size bytes); returns
    /// the plaintext length. Anything else (another file's, another position's, damaged) fails.
    public func open(_ sealed: UnsafeRawBufferPointer, index: UInt64, into output: UnsafeMutableRawBufferPointer) throws(StoreError) -> Int {
        guard sealed.count >= AESGCM.overhead, sealed.count - AESGCM.overhead <= output.count else {
            throw .authenticationFailed(kind: .contentChunk, entity: "chunk \(index) of content \(contentId)")
        }
        let aad = associatedData(index)
        do { return try aad.withUnsafeBytes { a in try aead.open(sealed, aad: a, into: output) } } catch {
            throw .authenticationFailed(kind: .contentChunk, entity: "chunk \(index) of content \(contentId)")
        }
    }

    public func open(_ sealed: [UInt8], index: UInt64, into output: UnsafeMutableRawBufferPointer) throws(StoreError) -> Int {
        var result: Result<Int, StoreError> = .success(0)
        sealed.withUnsafeBytes { s in
            do throws(StoreError) { result = .success(try open(s, index: index, into: output)) } catch { result = .failure(error) }
        }
        return try result.get()
    }

    /// Zeroes the key now (unmount). Nothing may use this cipher afterwards.
    public func wipe() { aead.wipe() }

    private func associatedData(_ index: UInt64) -> [UInt8] {
        EntitySealer.associatedData(kind: .contentChunk, id: EntitySealer.chunkId(file: contentId, index: index))
    }
}
