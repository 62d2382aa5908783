/// What `coffer fsck` can find wrong in a container, one case per kind of damage. The raw values
/// are the stable names scripts see in `--json`.
public enum ProblemKind: String, Sendable, CaseIterable {
    /// The root directory's inode is missing, damaged or not a directory.
    case rootDamaged = "root-damaged"
    /// An inode row fails authentication (or is malformed): it cannot be recovered.
    case inodeDamaged = "inode-damaged"
    /// A directory entry fails authentication: its name and target are unknown.
    case entryDamaged = "entry-damaged"
    /// An entry opens but its sealed name does not give the row's tag.
    case entryNameMismatch = "entry-name-mismatch"
    /// Entries whose directory is not a directory inode (missing, damaged or another type).
    case strayEntry = "stray-entry"
    /// An entry names an inode that does not exist.
    case danglingEntry = "dangling-entry"
    /// An entry names an inode that fails authentication.
    case entryToDamagedInode = "entry-to-damaged-inode"
    /// An entry's file type is not its inode's.
    case entryTypeMismatch = "entry-type-mismatch"
    /// A directory is reachable through a second entry.
    case directoryLinkedTwice = "directory-linked-twice"
    /// An entry names one of its own ancestors (or the root).
    case cycle
    /// An inode no entry reaches from the root (and not an open-unlinked orphan the next mount removes).
    case unreachable
    case nlinkWrong = "nlink-wrong"
    case chunkCountWrong = "chunk-count-wrong"
    /// A page of a file's chunk map is missing or fails authentication against the inode's version.
    case chunkMapPageDamaged = "chunk-map-page-damaged"
    /// The map names a chunk that has no row (deleted).
    case chunkMissing = "chunk-missing"
    /// A row is not the chunk the map names (an older or foreign copy).
    case chunkReplaced = "chunk-replaced"
    /// A row carries the map's tag but does not open under the file key.
    case chunkDamaged = "chunk-damaged"
    /// Rows where the map has a hole.
    case chunkAtHole = "chunk-at-hole"
    /// Rows past the end of the file.
    case chunkPastEnd = "chunk-past-end"
    /// The map names positions past the file's size.
    case mapPastSize = "map-past-size"
    /// Map page rows of a file that its inode does not name.
    case unreferencedMapPage = "unreferenced-map-page"
    /// Chunk rows or map pages of a content id no inode owns.
    case unreferencedContent = "unreferenced-content"
    case xattrDamaged = "xattr-damaged"
    /// Extended attributes of an inode that does not exist.
    case unreferencedXattr = "unreferenced-xattr"
    /// A trigger, view, index or table in the store file that Coffer never makes (a trigger runs on every write).
    case foreignSchemaObject = "foreign-schema-object"
    /// Rows with a key or value of another type than Coffer writes (SQLite keeps any type): no lookup finds them.
    case mistypedRow = "mistyped-row"
    /// The engine's own check of its file fails (SQLite's quick_check: a damaged page).
    case storeFileDamaged = "store-file-damaged"
    /// A segment file the rows point into is missing or too short: restoring it mends every chunk in it.
    case segmentFileDamaged = "segment-file-damaged"
}

/// One problem: its kind, where (a path when the tree gives one, else the inode number), what was
/// seen, and what `--repair` does about it.
public struct Problem: Sendable, CustomStringConvertible {
    public let kind: ProblemKind
    public let path: String?
    public let inode: UInt64?
    public let detail: String
    public let repair: String

    public init(_ kind: ProblemKind, path: String? = nil, inode: UInt64? = nil, _ detail: String, repair: String) {
        self.kind = kind
        self.path = path
        self.inode = inode
        self.detail = detail
        self.repair = repair
    }

    /// "path (inode N)", whichever is known.
    public var location: String {
        switch (path, inode) {
        case let (p?, i?): return "\(p) (inode \(i))"
        case let (p?, nil): return p
        case let (nil, i?): return "inode \(i)"
        case (nil, nil): return "store"
        }
    }

    public var description: String { "\(kind.rawValue): \(location): \(detail)" }

    /// Whether `--repair` does anything about it (a damaged page of the store file it cannot mend).
    public var isRepairable: Bool { kind != .storeFileDamaged && kind != .segmentFileDamaged }

    /// Problems that the store file's own repair sets right when it is opened for a repair
    /// (ForeignObjectPolicy.repair): a plan made beside them was made without the rows it gives back.
    public var isInTheStoreFile: Bool { kind == .foreignSchemaObject || kind == .mistypedRow }
}

/// Bytes of a file that a repair turned into zeros because their chunks were missing or damaged.
public struct LostRange: Sendable, Equatable {
    public let path: String?
    public let inode: UInt64
    /// Half-open byte ranges [start, end), merged and in order.
    public let ranges: [Range<UInt64>]
}

/// How much was looked at.
public struct CheckCounts: Sendable, Equatable {
    public var inodes = 0, directories = 0, files = 0, entries = 0, chunks = 0, chunkMapPages = 0, xattrs = 0
    public init() {}
}
