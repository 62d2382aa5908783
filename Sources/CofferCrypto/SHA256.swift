import CCrypto

/// SHA-256 one-shot hash (EVP_Digest), for content checks and test vectors.
public enum SHA256 {
    public static let size = 32

    public static func hash(_ data: [UInt8]) -> [UInt8] {
        var placeholder: UInt8 = 0
        return [UInt8](unsafeUninitializedCapacity: size) { buffer, initialized in
            var written: UInt32 = 0
            let ok = data.withUnsafeBytes { raw -> Int32 in
                withUnsafeMutablePointer(to: &placeholder) { empty in
                    EVP_Digest(raw.baseAddress ?? UnsafeRawPointer(empty), raw.count, buffer.baseAddress, &written, EVP_sha256(), nil)
                }
            }
            // EVP_Digest with the built-in SHA-256 only fails if OpenSSL cannot allocate; no input causes it.
            guard ok == 1, written == UInt32(size) else { fatalError("SHA-256 unavailable: \(CryptoError.fromOpenSSL("EVP_Digest"))") }
            initialized = size
        }
    }
}
