import CCrypto

/// Constant-time comparison of two byte arrays (CRYPTO_memcmp), for tags and MACs.
/// Only the contents are compared in constant time; differing lengths return false at once
/// (lengths are public in every use here).
public func constantTimeEqual(_ a: [UInt8], _ b: [UInt8]) -> Bool {
    guard a.count == b.count else { return false }
    if a.isEmpty { return true }
    return a.withUnsafeBytes { pa in
        b.withUnsafeBytes { pb in
            guard let x = pa.baseAddress, let y = pb.baseAddress else { return false }
            return CRYPTO_memcmp(x, y, pa.count) == 0
        }
    }
}
