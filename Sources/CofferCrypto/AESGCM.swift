import CCrypto

/// AES-256-GCM with a fresh random 96-bit nonce per seal.
/// Sealed layout: nonce(12) || ciphertext || tag(16). Chunks sealed in blocks use the calls that take a
/// nonce the caller derives (`seal(_:aad:nonce:into:)`, `open(ciphertextAndTag:aad:nonce:into:)`).
///
/// Thread-safe: keeps small pools of pre-keyed EVP_CIPHER_CTX (one for sealing, one for
/// opening). The key is set once per context; per message only the IV, which is what makes
/// OpenSSL's GCM run at full speed. Random 96-bit nonces are safe up to about 2^32 seals per key.
public final class AESGCM: Sendable {
    public static let keySize = 32, nonceSize = 12, tagSize = 16, overhead = 28

    private let key: SecureBytes
    private let sealers: ContextPool
    private let openers: ContextPool

    /// Copies the key into its own SecureBytes, so the caller may wipe theirs.
    public convenience init(key: SecureBytes) throws {
        // SecureBytes keeps its storage at one address for its whole life, and `key` outlives this call.
        let bytes = key.withUnsafeBytes { UnsafeRawBufferPointer($0) }
        try self.init(keyBytes: bytes)
        withExtendedLifetime(key) {}
    }

    /// Copies the key into locked memory of its own. Contexts are keyed lazily, on first use, so
    /// a file that is only written never pays for an opening context.
    public init(keyBytes: UnsafeRawBufferPointer) throws {
        guard keyBytes.count == Self.keySize else {
            throw CryptoError.invalidKeyLength(expected: Self.keySize, actual: keyBytes.count)
        }
        let own = SecureBytes(count: Self.keySize)
        own.withUnsafeMutableBytes { destination in destination.copyMemory(from: keyBytes) }
        self.key = own
        self.sealers = ContextPool(
            make: { try AESGCM.makeContext(key: own, encrypt: true) },
            destroy: { EVP_CIPHER_CTX_free($0) })
        self.openers = ContextPool(
            make: { try AESGCM.makeContext(key: own, encrypt: false) },
            destroy: { EVP_CIPHER_CTX_free($0) })
    }

    /// Zeroes the key and frees the keyed contexts now (unmount): later use fails, it does not
    /// run with a zero key.
    public func wipe() {
        sealers.close()
        openers.close()
        key.wipe()
    }

    // MARK: seal

    public func seal(_ plaintext: UnsafeRawBufferPointer, aad: UnsafeRawBufferPointer) throws -> [UInt8] {
        let (total, overflow) = plaintext.count.addingReportingOverflow(Self.overhead)
        guard !overflow else { throw CryptoError.invalidParameter("plaintext too large") }
        return try [UInt8](unsafeUninitializedCapacity: total) { buffer, initialized in
            let out = UnsafeMutableRawBufferPointer(buffer)
            let nonce = UnsafeMutableRawBufferPointer(rebasing: out[0..<Self.nonceSize])
            try Random.fill(nonce)
            try sealCore(
                plaintext, aad: aad, nonce: UnsafeRawBufferPointer(nonce),
                into: UnsafeMutableRawBufferPointer(rebasing: out[Self.nonceSize...]))
            initialized = total
        }
    }

    public func seal(_ plaintext: [UInt8], aad: [UInt8]) throws -> [UInt8] {
        try plaintext.withUnsafeBytes { p in try aad.withUnsafeBytes { a in try seal(p, aad: a) } }
    }

    /// Writes ciphertext || tag into `out` (exactly plaintext.count + 16 bytes). Internal, not
    /// private: the known-answer tests seal under the published vectors' fixed nonces through it.
    func sealCore(
        _ plaintext: UnsafeRawBufferPointer, aad: UnsafeRawBufferPointer,
        nonce: UnsafeRawBufferPointer, into out: UnsafeMutableRawBufferPointer
    ) throws {
        guard let outBase = out.baseAddress?.assumingMemoryBound(to: UInt8.self),
            let iv = nonce.baseAddress?.assumingMemoryBound(to: UInt8.self),
            nonce.count == Self.nonceSize, out.count == plaintext.count + Self.tagSize
        else {
            throw CryptoError.invalidParameter("bad seal buffers")
        }
        try sealers.withContext { ctx in
            guard EVP_EncryptInit_ex2(ctx, nil, nil, iv, nil) == 1 else { throw CryptoError.fromOpenSSL("GCM set IV") }
            try Self.update(ctx, encrypt: true, input: aad, output: nil)
            try Self.update(ctx, encrypt: true, input: plaintext, output: outBase)
            let tag = outBase + plaintext.count
            var written: Int32 = 0
            guard EVP_EncryptFinal_ex(ctx, tag, &written) == 1, written == 0 else {
                throw CryptoError.fromOpenSSL("GCM final")
            }
            guard EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_GET_TAG, Int32(Self.tagSize), tag) == 1 else {
                throw CryptoError.fromOpenSSL("GCM get tag")
            }
        }
    }

    // MARK: open

    /// Opens into caller memory (hot read path); returns the plaintext length.
    /// `output.count` must be >= sealed.count - 28. On authentication failure the bytes
    /// already written to `output` are zeroed, so unauthenticated plaintext never escapes.
    public func open(
        _ sealed: UnsafeRawBufferPointer, aad: UnsafeRawBufferPointer,
        into output: UnsafeMutableRawBufferPointer
    ) throws -> Int {
        guard sealed.count >= Self.overhead, let sealedBase = sealed.baseAddress else {
            throw CryptoError.authenticationFailed
        }
        let length = sealed.count - Self.overhead
        guard output.count >= length else {
            throw CryptoError.invalidParameter("output buffer holds \(output.count) bytes, need \(length)")
        }
        try openCore(
            UnsafeRawBufferPointer(start: sealedBase + Self.nonceSize, count: sealed.count - Self.nonceSize), aad: aad,
            nonce: UnsafeRawBufferPointer(start: sealedBase, count: Self.nonceSize), into: output)
        return length
    }

    /// Seals under a nonce the caller chose, writing ciphertext || tag into `out` (exactly plaintext.count + 16
    /// bytes): for values sealed in blocks whose nonces derive from one random nonce (ContentCipher). The
    /// caller must never use a nonce twice under this key.
    public func seal(
        _ plaintext: UnsafeRawBufferPointer, aad: UnsafeRawBufferPointer, nonce: UnsafeRawBufferPointer,
        into out: UnsafeMutableRawBufferPointer
    ) throws {
        try sealCore(plaintext, aad: aad, nonce: nonce, into: out)
    }

    /// Opens ciphertext || tag sealed under `nonce` into `output` (at least ciphertextAndTag.count - 16 bytes);
    /// returns the plaintext length. On failure the bytes written to `output` are zeroed.
    public func open(
        ciphertextAndTag: UnsafeRawBufferPointer, aad: UnsafeRawBufferPointer, nonce: UnsafeRawBufferPointer,
        into output: UnsafeMutableRawBufferPointer
    ) throws -> Int {
        guard nonce.count == Self.nonceSize else { throw CryptoError.invalidParameter("nonce of \(nonce.count) bytes") }
        guard ciphertextAndTag.count >= Self.tagSize else { throw CryptoError.authenticationFailed }
        guard output.count >= ciphertextAndTag.count - Self.tagSize else {
            throw CryptoError.invalidParameter("output buffer holds \(output.count) bytes, need \(ciphertextAndTag.count - Self.tagSize)")
        }
        try openCore(ciphertextAndTag, aad: aad, nonce: nonce, into: output)
        return ciphertextAndTag.count - Self.tagSize
    }

    /// Decrypts and checks ciphertext || tag (`body`, at least 16 bytes) into `output`, which the caller sized.
    private func openCore(
        _ body: UnsafeRawBufferPointer, aad: UnsafeRawBufferPointer, nonce: UnsafeRawBufferPointer,
        into output: UnsafeMutableRawBufferPointer
    ) throws {
        guard let bodyBase = body.baseAddress, let iv = nonce.baseAddress?.assumingMemoryBound(to: UInt8.self) else {
            throw CryptoError.authenticationFailed
        }
        let length = body.count - Self.tagSize
        let ciphertext = UnsafeRawBufferPointer(start: bodyBase, count: length)
        let tag = UnsafeMutableRawPointer(mutating: bodyBase + length)
        let outBase = output.baseAddress?.assumingMemoryBound(to: UInt8.self)
        try openers.withContext { ctx in
            guard EVP_DecryptInit_ex2(ctx, nil, nil, iv, nil) == 1 else { throw CryptoError.fromOpenSSL("GCM set IV") }
            try Self.update(ctx, encrypt: false, input: aad, output: nil)
            try Self.update(ctx, encrypt: false, input: ciphertext, output: outBase)
            guard EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_SET_TAG, Int32(Self.tagSize), tag) == 1 else {
                throw CryptoError.fromOpenSSL("GCM set tag")
            }
            var scratch: UInt8 = 0  // GCM's final writes nothing, but wants a valid pointer.
            var written: Int32 = 0
            guard EVP_DecryptFinal_ex(ctx, &scratch, &written) == 1 else {
                drainOpenSSLErrors()
                if let outBase, length > 0 { OPENSSL_cleanse(outBase, length) }
                throw CryptoError.authenticationFailed
            }
        }
    }

    /// CryptoError.authenticationFailed on any mismatch (nonce, ciphertext, tag, AAD) or short input.
    public func open(_ sealed: UnsafeRawBufferPointer, aad: UnsafeRawBufferPointer) throws -> [UInt8] {
        guard sealed.count >= Self.overhead else { throw CryptoError.authenticationFailed }
        let length = sealed.count - Self.overhead
        return try [UInt8](unsafeUninitializedCapacity: length) { buffer, initialized in
            initialized = try open(sealed, aad: aad, into: UnsafeMutableRawBufferPointer(buffer))
        }
    }

    public func open(_ sealed: [UInt8], aad: [UInt8]) throws -> [UInt8] {
        try sealed.withUnsafeBytes { s in try aad.withUnsafeBytes { a in try open(s, aad: a) } }
    }

    // MARK: helpers

    private static func makeContext(key: SecureBytes, encrypt: Bool) throws -> OpaquePointer {
        guard let ctx = EVP_CIPHER_CTX_new() else { throw CryptoError.fromOpenSSL("EVP_CIPHER_CTX_new") }
        let ok = key.withUnsafeBytes { raw -> Int32 in
            let k = raw.baseAddress?.assumingMemoryBound(to: UInt8.self)
            return encrypt
                ? EVP_EncryptInit_ex2(ctx, EVP_aes_256_gcm(), k, nil, nil)
                : EVP_DecryptInit_ex2(ctx, EVP_aes_256_gcm(), k, nil, nil)
        }
        guard ok == 1 else {
            EVP_CIPHER_CTX_free(ctx)
            throw CryptoError.fromOpenSSL("AES-256-GCM init")
        }
        return ctx
    }

    /// Feeds `input` in Int32-sized chunks; `output == nil` means the input is AAD.
    private static func update(
        _ ctx: OpaquePointer, encrypt: Bool, input: UnsafeRawBufferPointer,
        output: UnsafeMutablePointer<UInt8>?
    ) throws {
        guard var source = input.baseAddress?.assumingMemoryBound(to: UInt8.self), input.count > 0 else { return }
        var destination = output
        var remaining = input.count
        while remaining > 0 {
            let chunk = min(remaining, 1 << 30)
            var written: Int32 = 0
            let ok =
                encrypt
                ? EVP_EncryptUpdate(ctx, destination, &written, source, Int32(chunk))
                : EVP_DecryptUpdate(ctx, destination, &written, source, Int32(chunk))
            guard ok == 1, destination == nil || Int(written) == chunk else {
                throw CryptoError.fromOpenSSL(encrypt ? "GCM encrypt" : "GCM decrypt")
            }
            source += chunk
            destination = destination.map { $0 + chunk }
            remaining -= chunk
        }
    }
}
