import CofferCrypto
import Glibc
import Synchronization

/// The keys of an unlocked container: the master key and the subkeys derived from it with
/// HKDF-SHA256 (salt = container id), one per purpose, so that no key serves two jobs.
public final class ContainerKeys: Sendable {
    public let containerId: [UInt8]
    let master: SecureBytes
    /// Seals inodes, directory entries, xattrs and store state.
    public let metadata: AESGCM
    /// Keyed tags for directory lookups and xattr names.
    public let lookup: HMACSHA256
    /// Authenticates the header file.
    let headerMAC: HMACSHA256
    /// Root of the per-file content keys.
    private let contentRoot: SecureBytes
    /// HMAC keyed with the content root: HKDF-Expand of per-file keys in one MAC.
    private let fileKeys: HMACSHA256

    public init(master: SecureBytes, containerId: [UInt8]) throws {
        self.master = master.withUnsafeBytes { SecureBytes(copying: $0) }
        self.containerId = containerId
        metadata = try AESGCM(key: try Self.derive(master, containerId, "metadata"))
        lookup = HMACSHA256(key: try Self.derive(master, containerId, "lookup"))
        headerMAC = HMACSHA256(key: try Self.derive(master, containerId, "header-mac"))
        contentRoot = try Self.derive(master, containerId, "content")
        fileKeys = HMACSHA256(key: contentRoot)
    }

    /// The AEAD for one file's content chunks: a key of its own, derived from the content root
    /// and the file's random content id.
    /// HKDF-Expand(content root, "coffer/v1/file" || id, 32) = HMAC(content root, info || 0x01)
    /// (docs/FORMAT.md): one MAC instead of a full HKDF per file.
    public func fileCipher(contentId: UInt64) throws -> AESGCM {
        var okm = fileKeys.authenticate(Self.fileInfoPrefix + contentId.bigEndianBytes + [0x01])
        defer { okm.withUnsafeMutableBytes { if let p = $0.baseAddress { _ = memset(p, 0, $0.count) } } }
        return try okm.withUnsafeBytes { try AESGCM(keyBytes: $0) }
    }
    private static let fileInfoPrefix = Array("coffer/v1/file".utf8)

    /// A keyed tag (truncated HMAC) over a domain byte and parts; the only plain lookup keys in the store.
    public func tag(_ domain: UInt8, _ parts: [UInt8]...) -> [UInt8] {
        var message = [domain]
        for p in parts { message += p }
        return Array(lookup.authenticate(message).prefix(16))
    }

    /// Zeroes the master key, every subkey and their OpenSSL contexts now (unmount, every exit
    /// path of a command that unlocked). Nothing may use these keys afterwards.
    public func wipe() {
        master.wipe()
        contentRoot.wipe()
        metadata.wipe()
        lookup.wipe()
        headerMAC.wipe()
        fileKeys.wipe()
    }

    func copyMaster() -> SecureBytes { master.withUnsafeBytes { SecureBytes(copying: $0) } }

    private static func derive(_ master: SecureBytes, _ id: [UInt8], _ purpose: String) throws -> SecureBytes {
        try HKDF.deriveKey(from: master, salt: id, info: Array("coffer/v1/\(purpose)".utf8), count: 32)
    }
}
