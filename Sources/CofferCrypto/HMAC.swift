import CCrypto

/// HMAC-SHA256 with a key fixed at init. Thread-safe and fast for many short messages
/// (name lookup tags): a pool of EVP_MAC contexts is keyed once, and each message only
/// re-initialises a context (`EVP_MAC_init` with a NULL key keeps the key).
public final class HMACSHA256: Sendable {
    public static let size = 32

    private let key: SecureBytes
    private let pool: ContextPool

    /// Copies the key into its own SecureBytes.
    public init(key: SecureBytes) {
        let own = SecureBytes(count: key.count)
        own.withUnsafeMutableBytes { destination in
            key.withUnsafeBytes { source in
                if source.count > 0 { destination.copyMemory(from: source) }
            }
        }
        self.key = own
        self.pool = ContextPool(make: { try HMACSHA256.makeContext(key: own) }, destroy: { EVP_MAC_CTX_free($0) })
    }

    /// Zeroes the key and frees the keyed contexts now (unmount). Call only once nothing
    /// authenticates any more: `authenticate` traps after it.
    public func wipe() {
        pool.close()
        key.wipe()
    }

    public func authenticate(_ message: UnsafeRawBufferPointer) -> [UInt8] {
        do {
            return try pool.withContext { ctx in try Self.compute(ctx, message) }
        } catch {
            // Only reachable if OpenSSL cannot allocate or lacks HMAC/SHA-256 altogether;
            // no input can cause it, and there is no safe tag to return instead.
            fatalError("HMAC-SHA256 unavailable: \(error)")
        }
    }

    public func authenticate(_ message: [UInt8]) -> [UInt8] {
        message.withUnsafeBytes { authenticate($0) }
    }

    /// One-shot form, for known-answer tests.
    public static func authenticate(key: [UInt8], message: [UInt8]) -> [UInt8] {
        HMACSHA256(key: SecureBytes(copying: key)).authenticate(message)
    }

    private static func makeContext(key: SecureBytes) throws -> OpaquePointer {
        guard let mac = EVP_MAC_fetch(nil, "HMAC", nil) else { throw CryptoError.fromOpenSSL("EVP_MAC_fetch(HMAC)") }
        defer { EVP_MAC_free(mac) }  // the context holds its own reference
        guard let ctx = EVP_MAC_CTX_new(mac) else { throw CryptoError.fromOpenSSL("EVP_MAC_CTX_new") }
        var placeholder: UInt8 = 0
        let ok = key.withUnsafeBytes { raw -> Int32 in
            withUnsafeMutablePointer(to: &placeholder) { empty -> Int32 in
                // A NULL key would mean "keep the previous key": an empty key needs a real address.
                let k = raw.baseAddress?.assumingMemoryBound(to: UInt8.self) ?? UnsafePointer(empty)
                var params = [
                    OSSL_PARAM_construct_utf8_string(coffer_param_digest(), coffer_digest_sha256(), 0),
                    OSSL_PARAM_construct_end()
                ]
                return params.withUnsafeMutableBufferPointer { EVP_MAC_init(ctx, k, raw.count, $0.baseAddress) }
            }
        }
        guard ok == 1 else {
            EVP_MAC_CTX_free(ctx)
            throw CryptoError.fromOpenSSL("HMAC init")
        }
        return ctx
    }

    private static func compute(_ ctx: OpaquePointer, _ message: UnsafeRawBufferPointer) throws -> [UInt8] {
        guard EVP_MAC_init(ctx, nil, 0, nil) == 1 else { throw CryptoError.fromOpenSSL("HMAC re-init") }
        if let base = message.baseAddress?.assumingMemoryBound(to: UInt8.self), message.count > 0 {
            guard EVP_MAC_update(ctx, base, message.count) == 1 else { throw CryptoError.fromOpenSSL("HMAC update") }
        }
        return try [UInt8](unsafeUninitializedCapacity: size) { buffer, initialized in
            var written = 0
            guard EVP_MAC_final(ctx, buffer.baseAddress, &written, size) == 1, written == size else {
                throw CryptoError.fromOpenSSL("HMAC final")
            }
            initialized = size
        }
    }
}
