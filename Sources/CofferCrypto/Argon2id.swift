import CArgon2
#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// Argon2id (RFC 9106) through libargon2's `argon2_ctx`, version 0x13, for password-derived keys.
public enum Argon2id {
    /// memoryKiB, iterations and parallelism as in RFC 9106 (m, t, p). Output goes to locked memory.
    public static func deriveKey(
        password: SecureBytes, salt: [UInt8], iterations: UInt32, memoryKiB: UInt32,
        parallelism: UInt32, count: Int
    ) throws -> SecureBytes {
        try validate(salt: salt.count, iterations: iterations, memoryKiB: memoryKiB, parallelism: parallelism, count: count)
        let out = SecureBytes(count: count)
        do {
            try password.withUnsafeBytes { pwd in
                try salt.withUnsafeBytes { s in
                    try out.withUnsafeMutableBytes { o in
                        try run(
                            password: pwd, salt: s, secret: UnsafeRawBufferPointer(start: nil, count: 0),
                            associatedData: UnsafeRawBufferPointer(start: nil, count: 0),
                            iterations: iterations, memoryKiB: memoryKiB, parallelism: parallelism, out: o)
                    }
                }
            }
        } catch {
            out.wipe()
            throw error
        }
        return out
    }

    /// Full form with secret and associated data, for the RFC 9106 test vector.
    public static func derive(
        password: [UInt8], salt: [UInt8], secret: [UInt8], associatedData: [UInt8],
        iterations: UInt32, memoryKiB: UInt32, parallelism: UInt32, count: Int
    ) throws -> [UInt8] {
        try validate(salt: salt.count, iterations: iterations, memoryKiB: memoryKiB, parallelism: parallelism, count: count)
        return try [UInt8](unsafeUninitializedCapacity: count) { buffer, initialized in
            try password.withUnsafeBytes { pwd in
                try salt.withUnsafeBytes { s in
                    try secret.withUnsafeBytes { k in
                        try associatedData.withUnsafeBytes { x in
                            try run(
                                password: pwd, salt: s, secret: k, associatedData: x, iterations: iterations,
                                memoryKiB: memoryKiB, parallelism: parallelism, out: UnsafeMutableRawBufferPointer(buffer))
                        }
                    }
                }
            }
            initialized = count
        }
    }

    /// RFC 9106 bounds, checked here so the messages are clear (libargon2 checks them again).
    private static func validate(salt: Int, iterations: UInt32, memoryKiB: UInt32, parallelism: UInt32, count: Int) throws {
        guard count >= 4, count <= Int(UInt32.max) else { throw CryptoError.invalidParameter("Argon2 output must be at least 4 bytes") }
        guard salt >= 8 else { throw CryptoError.invalidParameter("Argon2 salt must be at least 8 bytes") }
        guard iterations >= 1 else { throw CryptoError.invalidParameter("Argon2 iterations must be at least 1") }
        guard parallelism >= 1, parallelism <= 0xFF_FFFF else {
            throw CryptoError.invalidParameter("Argon2 parallelism must be 1...16777215")
        }
        guard UInt64(memoryKiB) >= 8 * UInt64(parallelism) else {
            throw CryptoError.invalidParameter("Argon2 memory must be at least 8 KiB per lane")
        }
    }

    private static func run(
        password: UnsafeRawBufferPointer, salt: UnsafeRawBufferPointer, secret: UnsafeRawBufferPointer,
        associatedData: UnsafeRawBufferPointer, iterations: UInt32, memoryKiB: UInt32,
        parallelism: UInt32, out: UnsafeMutableRawBufferPointer
    ) throws {
        func length(_ b: UnsafeRawBufferPointer) throws -> UInt32 {
            guard let value = UInt32(exactly: b.count) else { throw CryptoError.invalidParameter("Argon2 input too long") }
            return value
        }
        // argon2_context takes non-const pointers; libargon2 only reads inputs unless the
        // CLEAR_* flags are set, and they are not.
        func bytes(_ b: UnsafeRawBufferPointer) -> UnsafeMutablePointer<UInt8>? {
            b.count == 0 ? nil : b.baseAddress.map { UnsafeMutablePointer(mutating: $0.assumingMemoryBound(to: UInt8.self)) }
        }
        guard let outLength = UInt32(exactly: out.count) else { throw CryptoError.invalidParameter("Argon2 output too long") }
        // Threads do not change the result (lanes do); more threads than CPUs only adds overhead.
        let cpus = UInt32(clamping: max(1, sysconf(Int32(_SC_NPROCESSORS_ONLN))))
        let threads = min(parallelism, cpus)
        var context = argon2_context(
            out: out.baseAddress?.assumingMemoryBound(to: UInt8.self), outlen: outLength,
            pwd: bytes(password), pwdlen: try length(password),
            salt: bytes(salt), saltlen: try length(salt),
            secret: bytes(secret), secretlen: try length(secret),
            ad: bytes(associatedData), adlen: try length(associatedData),
            t_cost: iterations, m_cost: memoryKiB, lanes: parallelism, threads: threads,
            version: UInt32(ARGON2_VERSION_13.rawValue),
            allocate_cbk: nil, free_cbk: nil, flags: 0)
        let result = argon2_ctx(&context, Argon2_id)
        guard result == ARGON2_OK.rawValue else {
            let message = argon2_error_message(result).map { String(cString: $0) } ?? "error \(result)"
            throw CryptoError.kdfFailed("Argon2id: \(message)")
        }
    }
}
