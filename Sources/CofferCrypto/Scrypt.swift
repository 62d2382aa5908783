import CCrypto

/// scrypt (RFC 7914) through EVP_PBE_scrypt, for password-derived key-encryption keys.
public enum Scrypt {
    /// Derives `count` bytes into locked memory.
    ///
    /// Refuses N that is not a power of two above 1, r or p of 0, and — unless `allowWeak`
    /// (the RFC 7914 vectors are weaker) — anything below N=2^16, r=8 (gocryptfs' default).
    /// OpenSSL's default memory cap (32 MiB) is raised to what the parameters need,
    /// 128*r*(N+p+2) bytes, plus slack.
    public static func deriveKey(
        password: SecureBytes, salt: [UInt8], n: UInt64, r: UInt64, p: UInt64,
        count: Int, allowWeak: Bool = false
    ) throws -> SecureBytes {
        guard n >= 2, n & (n - 1) == 0 else {
            throw CryptoError.invalidParameter("scrypt N must be a power of two greater than 1, not \(n)")
        }
        guard r >= 1, p >= 1 else { throw CryptoError.invalidParameter("scrypt r and p must be at least 1") }
        guard count >= 1 else { throw CryptoError.invalidParameter("scrypt output length must be at least 1") }
        if !allowWeak, n < 1 << 16 || r < 8 {
            throw CryptoError.invalidParameter("scrypt parameters N=\(n), r=\(r), p=\(p) are weaker than N=2^16, r=8, p=1")
        }
        let (np, o1) = n.addingReportingOverflow(p)
        let (np2, o2) = np.addingReportingOverflow(2)
        let (perR, o3) = np2.multipliedReportingOverflow(by: 128)
        let (needed, o4) = perR.multipliedReportingOverflow(by: r)
        let (maxmem, o5) = needed.addingReportingOverflow(1 << 20)
        guard !(o1 || o2 || o3 || o4 || o5) else {
            throw CryptoError.invalidParameter("scrypt parameters need more memory than can be addressed")
        }

        let out = SecureBytes(count: count)
        var placeholder: UInt8 = 0
        let ok = password.withUnsafeBytes { pass in
            salt.withUnsafeBytes { saltBytes in
                out.withUnsafeMutableBytes { key in
                    withUnsafeMutablePointer(to: &placeholder) { empty -> Int32 in
                        EVP_PBE_scrypt(
                            (pass.baseAddress ?? UnsafeRawPointer(empty)).assumingMemoryBound(to: CChar.self), pass.count,
                            (saltBytes.baseAddress ?? UnsafeRawPointer(empty)).assumingMemoryBound(to: UInt8.self), saltBytes.count,
                            n, r, p, maxmem,
                            key.baseAddress?.assumingMemoryBound(to: UInt8.self), key.count)
                    }
                }
            }
        }
        guard ok == 1 else {
            out.wipe()
            let detail = drainOpenSSLErrors()
            throw CryptoError.kdfFailed("scrypt N=\(n), r=\(r), p=\(p)" + (detail.isEmpty ? "" : ": " + detail.joined(separator: "; ")))
        }
        return out
    }
}
