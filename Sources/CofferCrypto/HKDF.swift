import CCrypto

/// HKDF-SHA256 (RFC 5869) through OpenSSL's EVP_KDF "HKDF", for deriving subkeys from a master key.
public enum HKDF {
    /// Largest output RFC 5869 allows for SHA-256: 255 * HashLen.
    static let maxOutput = 255 * 32

    /// Derives straight into locked memory; the input key never leaves its SecureBytes.
    public static func deriveKey(from ikm: SecureBytes, salt: [UInt8], info: [UInt8], count: Int) throws -> SecureBytes {
        try validate(count)
        let out = SecureBytes(count: count)
        try ikm.withUnsafeBytes { k in
            try salt.withUnsafeBytes { s in
                try info.withUnsafeBytes { i in
                    try out.withUnsafeMutableBytes { o in try derive(ikm: k, salt: s, info: i, into: o) }
                }
            }
        }
        return out
    }

    /// Plain-array form, for known-answer tests.
    public static func derive(ikm: [UInt8], salt: [UInt8], info: [UInt8], count: Int) throws -> [UInt8] {
        try validate(count)
        return try [UInt8](unsafeUninitializedCapacity: count) { buffer, initialized in
            try ikm.withUnsafeBytes { k in
                try salt.withUnsafeBytes { s in
                    try info.withUnsafeBytes { i in
                        try derive(ikm: k, salt: s, info: i, into: UnsafeMutableRawBufferPointer(buffer))
                    }
                }
            }
            initialized = count
        }
    }

    private static func validate(_ count: Int) throws {
        guard count >= 1, count <= maxOutput else {
            throw CryptoError.invalidParameter("HKDF-SHA256 output must be 1...\(maxOutput) bytes, not \(count)")
        }
    }

    /// OSSL_PARAM records keep pointers to names and values: the names are static C literals
    /// from the shim, the values are buffers the caller keeps alive for this whole call.
    private static func derive(
        ikm: UnsafeRawBufferPointer, salt: UnsafeRawBufferPointer,
        info: UnsafeRawBufferPointer, into out: UnsafeMutableRawBufferPointer
    ) throws {
        guard let outBase = out.baseAddress?.assumingMemoryBound(to: UInt8.self) else {
            throw CryptoError.invalidParameter("empty HKDF output")
        }
        guard let kdf = EVP_KDF_fetch(nil, "HKDF", nil) else { throw CryptoError.fromOpenSSL("EVP_KDF_fetch(HKDF)") }
        defer { EVP_KDF_free(kdf) }
        guard let ctx = EVP_KDF_CTX_new(kdf) else { throw CryptoError.fromOpenSSL("EVP_KDF_CTX_new") }
        defer { EVP_KDF_CTX_free(ctx) }

        // OpenSSL treats a NULL key as "missing"; an empty buffer needs a real (if unread) address.
        var placeholder: UInt8 = 0
        let ok = withUnsafeMutablePointer(to: &placeholder) { empty -> Int32 in
            func pointer(_ b: UnsafeRawBufferPointer) -> UnsafeMutableRawPointer {
                b.baseAddress.map { UnsafeMutableRawPointer(mutating: $0) } ?? UnsafeMutableRawPointer(empty)
            }
            var params: [OSSL_PARAM] = [
                OSSL_PARAM_construct_utf8_string(coffer_param_digest(), coffer_digest_sha256(), 0),
                OSSL_PARAM_construct_octet_string(coffer_param_key(), pointer(ikm), ikm.count),
                OSSL_PARAM_construct_octet_string(coffer_param_salt(), pointer(salt), salt.count),
                OSSL_PARAM_construct_octet_string(coffer_param_info(), pointer(info), info.count),
                OSSL_PARAM_construct_end()
            ]
            return params.withUnsafeMutableBufferPointer { EVP_KDF_derive(ctx, outBase, out.count, $0.baseAddress) }
        }
        guard ok == 1 else {
            OPENSSL_cleanse(outBase, out.count)
            throw CryptoError.fromOpenSSL("HKDF derive")
        }
    }
}
