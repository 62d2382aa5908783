import Foundation

/// The plain-text header file `coffer.json` (docs/FORMAT.md). Everything in it is public, and all of
/// it is authenticated by `mac`, an HMAC-SHA256 under a key derived from the master key.
public struct ContainerHeader: Codable, Equatable, Sendable {
    public static let fileName = "coffer.json"
    public static let formatName = "coffer-container"
    public static let currentVersion = 1
    public static let supportedCipher = "AES-256-GCM"

    public var format: String
    public var version: Int
    /// 16 random bytes, hex.
    public var containerId: String
    public var cipher: String
    /// Content chunk size in bytes.
    public var chunkSize: Int
    /// Where the entity store lives, through the container-relative path transformer.
    public var store: String
    /// Feature flags; unknown ones refuse to open.
    public var features: [String]
    public var slots: [KeySlot]
    /// HMAC over the canonical encoding with `mac` empty, base64.
    public var mac: String

    public static let knownFeatures: Set<String> = []
}

/// One way in: a key-encryption key derived from a secret wraps the master key.
public struct KeySlot: Codable, Equatable, Sendable {
    public enum Kind: String, Codable, Sendable { case password, keyfile, recovery }
    /// 8 random bytes, hex; bound into the wrapping.
    public var id: String
    public var kind: Kind
    public var label: String?
    public var kdf: KDFParameters
    /// AES-256-GCM(nonce || master key || tag) under the slot's key-encryption key, base64.
    public var wrappedKey: String
}

/// How a slot turns its secret into a key-encryption key.
public struct KDFParameters: Codable, Equatable, Sendable {
    /// "argon2id", "scrypt", or "hkdf" (recovery keys: already 256 random bits).
    public var algorithm: String
    public var salt: String
    public var iterations: UInt32?
    public var memoryKiB: UInt32?
    public var parallelism: UInt32?
    public var logN: UInt8?
    public var r: UInt32?
    public var p: UInt32?
}

extension KDFParameters {
    /// Numbers are read as Double, then made whole: JSONDecoder calls a number its type cannot hold "not valid
    /// JSON" without saying where, and a header asking for 2^40 KiB should name the field.
    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        func whole<T: FixedWidthInteger>(_ key: CodingKeys) throws -> T? {
            guard let v = try c.decodeIfPresent(Double.self, forKey: key) else { return nil }
            guard let n = T(exactly: v) else {
                let shown = v == v.rounded() && abs(v) < 1e18 ? "\(Int64(v))" : "\(v)"
                let why = "\(shown) is not a whole number from \(T.min) to \(T.max)"
                throw DecodingError.dataCorruptedError(forKey: key, in: c, debugDescription: why)
            }
            return n
        }
        algorithm = try c.decode(String.self, forKey: .algorithm)
        salt = try c.decode(String.self, forKey: .salt)
        iterations = try whole(.iterations)
        memoryKiB = try whole(.memoryKiB)
        parallelism = try whole(.parallelism)
        logN = try whole(.logN)
        r = try whole(.r)
        p = try whole(.p)
    }
}

/// The key-derivation choice at init or when adding a slot.
public enum KDFChoice: Equatable, Sendable, CustomStringConvertible {
    case argon2id(iterations: UInt32, memoryKiB: UInt32, parallelism: UInt32)
    case scrypt(logN: UInt8, r: UInt32, p: UInt32)

    /// Default: about half a second on the reference machine (docs/MEASUREMENTS.md).
    public static let standard = KDFChoice.argon2id(iterations: 3, memoryKiB: 131_072, parallelism: 2)
    /// The floor: never weaker than gocryptfs's scrypt N=2^16, r=8, p=1.
    public static let minimumArgon2Memory: UInt32 = 65_536
    public static let minimumArgon2Iterations: UInt32 = 2
    public static let minimumScryptLogN: UInt8 = 16
    public static let minimumScryptR: UInt32 = 8

    public var description: String {
        switch self {
        case let .argon2id(t, m, p): return "argon2id t=\(t) m=\(m) KiB p=\(p)"
        case let .scrypt(logN, r, p): return "scrypt N=2^\(logN) r=\(r) p=\(p)"
        }
    }

    /// Refuses parameters below the floor or beyond the ceiling, whether they came from the user or from a header.
    public func validate() throws(ContainerError) {
        switch self {
        case let .argon2id(t, m, p):
            guard p >= 1, p <= 16, m <= 4_194_304, t <= 64 else { throw .kdfOutOfRange(description) }
            guard m >= Self.minimumArgon2Memory, t >= Self.minimumArgon2Iterations else { throw .weakKDF(description) }
        case let .scrypt(logN, r, p):
            guard logN <= 24, r <= 64, p >= 1, p <= 16 else { throw .kdfOutOfRange(description) }
            guard logN >= Self.minimumScryptLogN, r >= Self.minimumScryptR else { throw .weakKDF(description) }
        }
    }
}

extension ContainerHeader {
    /// The bytes the MAC covers: sorted-key JSON of the header with an empty `mac`.
    func canonicalBytes() throws -> [UInt8] {
        var copy = self
        copy.mac = ""
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        return Array(try encoder.encode(copy))
    }

    /// What is written to disk: readable JSON.
    func fileBytes() throws -> Data {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .prettyPrinted, .withoutEscapingSlashes]
        var data = try encoder.encode(self)
        data.append(0x0A)
        return data
    }
}
