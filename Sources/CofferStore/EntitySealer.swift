import CofferCrypto

/// Seals and opens entities. The associated data binds the format version, the entity kind and the
/// entity's id, so a sealed value moved to another row, kind or position fails authentication.
public struct EntitySealer: Sendable {
    static let formatVersion: UInt8 = 1
    private static let prefix = Array("coffer".utf8)
    public let registry: TransformerRegistry

    public init(registry: TransformerRegistry) { self.registry = registry }

    public static func associatedData(kind: EntityKind, id: [UInt8]) -> [UInt8] {
        prefix + [formatVersion, kind.rawValue] + id
    }

    public func seal<T: EntityTransformer>(_ transformer: T, _ value: T.Value, id: [UInt8], cipher: AESGCM) throws(StoreError) -> [UInt8] {
        guard registry.transformerName(for: T.kind) == T.name else { throw .unknownTransformer(kind: T.kind.name, transformer: T.name) }
        do { return try cipher.seal(transformer.encode(value), aad: Self.associatedData(kind: T.kind, id: id)) } catch {
            throw .sealingFailed("\(error)")
        }
    }

    /// Opens a value that must be of `transformer`'s kind with this id. Hostile bytes give a typed error.
    public func open<T: EntityTransformer>(_ transformer: T, _ sealed: [UInt8], id: [UInt8], cipher: AESGCM, describe: @autoclosure () -> String)
        throws(StoreError) -> T.Value
    {
        guard registry.transformerName(for: T.kind) == T.name else { throw .unknownTransformer(kind: T.kind.name, transformer: T.name) }
        let plain: [UInt8]
        do { plain = try cipher.open(sealed, aad: Self.associatedData(kind: T.kind, id: id)) } catch {
            throw .authenticationFailed(kind: T.kind, entity: describe())
        }
        do { return try transformer.decode(plain) } catch { throw .malformed(kind: T.kind, entity: describe(), error) }
    }

    /// Chunk ids: content id and chunk index.
    public static func chunkId(file: UInt64, index: UInt64) -> [UInt8] { file.bigEndianBytes + index.bigEndianBytes }
}
