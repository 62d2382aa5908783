import CofferStore

/// Everything a repair will change, worked out by the check (which already read every row), so the
/// repair writes without reading again. Pure data: applied by `Repairer` in one group transaction.
struct RepairPlan: Sendable {
    /// Entry rows to drop: damaged, stray, dangling, to damaged inodes, extra directory links.
    var deleteEntries: [(parentTag: [UInt8], tag: [UInt8])] = []
    /// Entries rewritten with their inode's real file type.
    var rewriteEntries: [(parent: UInt64, record: DirectoryEntryRecord)] = []
    /// Inode rows that fail authentication: dropped with their xattrs.
    var deleteInodes: [UInt64] = []
    /// The root inode is missing or damaged: a fresh root directory takes its place (its entries,
    /// keyed by the root's number, come back with it).
    var recreateRoot = false
    var deleteXattrRows: [(inode: UInt64, tag: [UInt8])] = []
    /// Inode numbers without an inode row whose xattrs go.
    var deleteXattrsOf: [UInt64] = []
    /// Content ids no inode owns: their chunk rows and map pages go.
    var deleteContent: [UInt64] = []
    /// Files whose chunk map is rebuilt from the chunks that passed, by inode number.
    var contentFixes: [UInt64: ContentFix] = [:]
    /// Inodes to link into /lost+found (unreachable ones, and files that lost chunks).
    var lostFoundLinks: [LostFoundLink] = []
    /// Every opened inode record (the root's replacement included when recreated).
    var records: [UInt64: InodeRecord] = [:]
    /// Link counts as the tree has them (files: entries naming them; directories: 2 + subdirectories).
    var links: [UInt64: UInt32] = [:]
    /// An existing /lost+found directory and the names already in it.
    var lostFound: UInt64?
    var lostFoundNames: Set<[UInt8]> = []
}

/// A file's content after repair: the positions whose chunks passed (their tags), the rows to drop, and the
/// plaintext of damaged chunks sealed in blocks whose other blocks were kept (sealed again by the repair).
struct ContentFix: Sendable {
    let file: UInt64
    let tags: [UInt64: ChunkTag]
    let deleteRows: [UInt64]
    let reseal: [UInt64: [UInt8]]
    let lost: [Range<UInt64>]
    let path: String?
}

struct LostFoundLink: Sendable {
    let ino: UInt64
    /// A name it was known by (from an entry that had to go, or its path), if any.
    let nameHint: [UInt8]?
    let isDirectory: Bool
}
