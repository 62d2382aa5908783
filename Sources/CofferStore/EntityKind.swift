/// The kinds of entity the store holds. The raw value is written into every sealed value's
/// associated data, so a value sealed as one kind never opens as another.
public enum EntityKind: UInt8, CaseIterable, Sendable, CustomStringConvertible {
    case inode = 1
    case directoryEntry = 2
    case contentChunk = 3
    case extendedAttribute = 4
    case storeState = 5
    case chunkMapPage = 6

    /// The stable name recorded in the store's `coffer_kinds` table.
    public var name: String {
        switch self {
        case .inode: return "inode"
        case .directoryEntry: return "dirent"
        case .contentChunk: return "chunk"
        case .extendedAttribute: return "xattr"
        case .storeState: return "state"
        case .chunkMapPage: return "chunkmap"
        }
    }
    public init?(name: String) {
        guard let k = EntityKind.allCases.first(where: { $0.name == name }) else { return nil }
        self = k
    }
    public var description: String { name }
}

/// The only code that turns an entity value into bytes and back. Decoders get untrusted bytes (after
/// authentication, but from a store that may have been written by a buggy or older version): they
/// return `DecodeError` for anything unexpected and never trap or allocate beyond their input.
public protocol EntityTransformer: Sendable {
    associatedtype Value
    /// Stable, versioned name recorded in the store, e.g. "coffer.inode.v1".
    static var name: String { get }
    static var kind: EntityKind { get }
    func encode(_ value: Value) -> [UInt8]
    func decode(_ bytes: [UInt8]) throws(DecodeError) -> Value
}

/// Which transformer handles each entity kind. Filled before a store opens; a store whose
/// `coffer_kinds` table names a kind or transformer missing here refuses to open.
public struct TransformerRegistry: Sendable {
    private var names: [EntityKind: String] = [:]
    /// Older transformers of a kind that stores made before may still name (read and written as they say).
    private var older: [EntityKind: Set<String>] = [:]

    public init() {}

    /// Registers `transformer` as what new stores name for its kind.
    public mutating func register<T: EntityTransformer>(_ transformer: T.Type) {
        names[T.kind] = T.name
    }
    /// Lets a store name `transformer` for its kind too (an earlier form the code still reads and writes).
    public mutating func accept<T: EntityTransformer>(_ transformer: T.Type) {
        older[T.kind, default: []].insert(T.name)
    }
    public func transformerName(for kind: EntityKind) -> String? { names[kind] }
    public func accepts(_ name: String, for kind: EntityKind) -> Bool { names[kind] == name || older[kind]?.contains(name) == true }
    public var registeredKinds: [EntityKind] { EntityKind.allCases.filter { names[$0] != nil } }

    /// Coffer's transformers, format version 1 (chunks sealed in blocks; whole ones still read and written).
    public static let standard: TransformerRegistry = {
        var r = TransformerRegistry()
        r.register(InodeTransformer.self)
        r.register(DirectoryEntryTransformer.self)
        r.register(ChunkBlocksTransformer.self)
        r.accept(ChunkTransformer.self)
        r.register(ExtendedAttributeTransformer.self)
        r.register(StoreStateTransformer.self)
        r.register(ChunkMapPageTransformer.self)
        return r
    }()
}

extension TransformerRegistry {
    /// The standard registry as before session 24: new stores seal chunks whole (`coffer.chunk.v1`). Tests make
    /// such stores to keep that form working.
    public static let wholeChunks: TransformerRegistry = {
        var r = TransformerRegistry.standard
        r.register(ChunkTransformer.self)
        r.accept(ChunkBlocksTransformer.self)
        return r
    }()
}
