import CCrypto

/// Cryptographically secure random bytes from OpenSSL's DRBG (`RAND_bytes`).
public enum Random {
    public static func bytes(_ count: Int) throws -> [UInt8] {
        guard count >= 0 else { throw CryptoError.invalidParameter("negative random byte count") }
        return try [UInt8](unsafeUninitializedCapacity: count) { buffer, initialized in
            try fill(UnsafeMutableRawBufferPointer(buffer))
            initialized = count
        }
    }

    /// Fills caller memory; RAND_bytes takes an Int32 length, so large buffers go in chunks.
    public static func fill(_ buffer: UnsafeMutableRawBufferPointer) throws {
        guard var pointer = buffer.baseAddress?.assumingMemoryBound(to: UInt8.self) else { return }
        var remaining = buffer.count
        while remaining > 0 {
            let chunk = min(remaining, Int(Int32.max))
            guard RAND_bytes(pointer, Int32(chunk)) == 1 else {
                drainOpenSSLErrors()
                throw CryptoError.randomFailed
            }
            pointer += chunk
            remaining -= chunk
        }
    }

    public static func uint64() throws -> UInt64 {
        var value: UInt64 = 0
        try withUnsafeMutableBytes(of: &value) { try fill($0) }
        return value
    }
}
