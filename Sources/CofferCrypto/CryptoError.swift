import CCrypto

/// Every failure CofferCrypto reports. Messages never carry key material.
public enum CryptoError: Error, Equatable, CustomStringConvertible {
    /// AEAD tag mismatch, or a sealed box too short to hold nonce and tag.
    case authenticationFailed
    case invalidKeyLength(expected: Int, actual: Int)
    /// Bad arguments (e.g. KDF parameters); never contains key bytes.
    case invalidParameter(String)
    case kdfFailed(String)
    case randomFailed
    /// Wraps the text of OpenSSL's error queue.
    case openssl(String)

    public var description: String {
        switch self {
        case .authenticationFailed: return "authentication failed"
        case let .invalidKeyLength(expected, actual): return "invalid key length: expected \(expected) bytes, got \(actual)"
        case let .invalidParameter(message): return "invalid parameter: \(message)"
        case let .kdfFailed(message): return "key derivation failed: \(message)"
        case .randomFailed: return "random number generator failed"
        case let .openssl(message): return "OpenSSL error: \(message)"
        }
    }

    /// Drains this thread's OpenSSL error queue into an `.openssl` error, so stale
    /// entries never leak into a later, unrelated report.
    static func fromOpenSSL(_ context: String) -> CryptoError {
        let messages = drainOpenSSLErrors()
        return .openssl(messages.isEmpty ? context : context + ": " + messages.joined(separator: "; "))
    }
}

/// Empties the calling thread's OpenSSL error queue, returning its entries as text.
@discardableResult
func drainOpenSSLErrors() -> [String] {
    var messages: [String] = []
    while true {
        let code = ERR_get_error()
        if code == 0 { break }
        var buffer = [CChar](repeating: 0, count: 256)
        buffer.withUnsafeMutableBufferPointer { ERR_error_string_n(code, $0.baseAddress, $0.count) }
        let bytes = buffer.prefix(while: { $0 != 0 }).map { UInt8(bitPattern: $0) }
        messages.append(String(decoding: bytes, as: UTF8.self))
    }
    return messages
}
