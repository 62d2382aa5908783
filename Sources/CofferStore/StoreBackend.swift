/// The seam between the sealed store and the engine that keeps its rows (docs/ARCHITECTURE.md).
///
/// An engine knows rows of sealed bytes addressed by random ids and keyed tags, and group
/// transactions; it never sees a key, a plaintext or an associated-data layout. Everything that
/// gives the rows a meaning (keys, tags, sealing, transformers, chunk maps, the store generation)
/// lives above it in `EntityStore`, once for every engine, so a row means the same thing in every
/// engine and fsck works on any of them.
///
/// Writes go into one open group transaction that the engine begins on the first write and ends at
/// `commit`. When the engine loses that transaction by itself (a full disk, a lost connection), it
/// calls `onRollback`: everything since the last commit is gone and caches above must be reloaded.
/// Reads see the open transaction's writes.
public protocol StoreBackend: AnyObject, Sendable {
    var readOnly: Bool { get }

    // MARK: Store metadata

    /// The schema rows written at creation: entity kinds with their transformer names, and named
    /// metadata values (format, container id, the sealed store state).
    func readSchema() throws(StoreError) -> StoreSchema
    /// Writes the kinds and metadata of a new, empty store (inside the group transaction).
    func initializeSchema(_ schema: StoreSchema) throws(StoreError)
    /// Called once the schema showed the store is the container's, before the first write of a
    /// writable store: whatever the engine sets up for writing (nothing is written before).
    func startWriting() throws(StoreError)

    // MARK: Group transactions

    /// Runs several calls in one visit to the engine's writer (one hop instead of one per call).
    /// Calls made by `body` on this thread join it. The body's own errors come back unchanged.
    func batch<T>(_ body: () throws -> T) throws -> T
    /// Commits the open group transaction, if any, with the sealed store state `state()` returns
    /// (called only when there is something to commit) written in it. With `durable`, returns only once
    /// this commit and every earlier one are on stable storage. True when a transaction was committed.
    func commit(durable: Bool, state: () throws(StoreError) -> [UInt8]) throws(StoreError) -> Bool
    /// Rolls the open group back and tells `onRollback`, as when the engine drops it: a change was left half
    /// made (rows stored without the map that names them), and no commit may take it.
    func dropOpenGroup(_ error: StoreError)
    /// Called when the engine dropped the open transaction by itself, with why.
    var onRollback: (@Sendable (StoreError) -> Void)? { get set }
    var hasPendingChanges: Bool { get }
    /// Whether the open transaction is old or large enough to commit now.
    func isCommitDue(age: Duration, volume: Int) -> Bool
    /// The engine's storage is short of space: commit in smaller groups, delete at once.
    func isLowOnSpace() -> Bool
    /// Whether the engine's disk can take a write of `bytes` and `more` bytes besides (free space less what
    /// is owed to deletes and to rows waiting for the commit, plus free room inside the store where such a
    /// write would go). True when the engine cannot tell.
    func hasRoom(forWrite bytes: Int, more: Int64) -> Bool
    /// Gives up to `limit` units of free space back while nothing else is written; 0 when there is
    /// nothing to give back (or the engine has no such thing).
    func reclaimSpace(limit: Int) throws(StoreError) -> Int
    /// Commits nothing more; ends the engine's threads and connections. Later calls do nothing.
    func close()

    // MARK: Inodes (by id)

    func inode(_ id: UInt64) throws(StoreError) -> [UInt8]?
    /// The rows of those of `ids` that exist, in one visit (a listing with attributes reads a page of
    /// inodes at once: one round trip instead of one per entry on a remote engine).
    func inodes(_ ids: [UInt64]) throws(StoreError) -> [UInt64: [UInt8]]
    func putInode(_ id: UInt64, sealed: [UInt8]) throws(StoreError)
    func deleteInode(_ id: UInt64) throws(StoreError)

    // MARK: Directory entries (by parent tag and name tag)

    func entry(parentTag: [UInt8], tag: [UInt8]) throws(StoreError) -> [UInt8]?
    /// Writes an entry; with `replace` false, leaves an existing one alone and returns false.
    func putEntry(parentTag: [UInt8], tag: [UInt8], sealed: [UInt8], replace: Bool) throws(StoreError) -> Bool
    func deleteEntry(parentTag: [UInt8], tag: [UInt8]) throws(StoreError)
    /// Up to `limit` entries (-1: all) in tag order, from the first whose tag is at least `from`.
    func entryPage(parentTag: [UInt8], from: [UInt8], limit: Int) throws(StoreError) -> [(tag: [UInt8], sealed: [UInt8])]
    func hasEntries(parentTag: [UInt8]) throws(StoreError) -> Bool
    /// Every entry of each directory, in the order asked (one round trip on a remote engine).
    func entries(parentTags: [[UInt8]]) throws(StoreError) -> [[(tag: [UInt8], sealed: [UInt8])]]

    // MARK: Content chunks (by content id and index)

    /// Calls `body` with each stored chunk `first...last` in index order; the bytes are valid only
    /// during the call (engines hand out their own buffers).
    func forEachChunk(file: UInt64, first: UInt64, last: UInt64, _ body: (UInt64, UnsafeRawBufferPointer) throws -> Void) throws
    func putChunks(file: UInt64, _ chunks: [(index: UInt64, sealed: [UInt8])]) throws(StoreError)
    /// Deletes chunks with index >= `from`; returns how many there were.
    func deleteChunks(file: UInt64, from: UInt64) throws(StoreError) -> Int
    /// Deletes chunks `first...last`; returns how many there were.
    func deleteChunks(file: UInt64, first: UInt64, last: UInt64) throws(StoreError) -> Int
    func chunkIndices(file: UInt64, first: UInt64, last: UInt64) throws(StoreError) -> [UInt64]

    // MARK: Chunk map pages (by content id and page)

    func chunkMapPage(file: UInt64, page: UInt64) throws(StoreError) -> [UInt8]?
    func putChunkMapPage(file: UInt64, page: UInt64, sealed: [UInt8]) throws(StoreError)
    /// Deletes pages numbered `from` and up.
    func deleteChunkMapPages(file: UInt64, from: UInt64) throws(StoreError)
    func deleteChunkMapPage(file: UInt64, page: UInt64) throws(StoreError)

    // MARK: Extended attributes (by inode and name tag)

    func xattr(inode: UInt64, tag: [UInt8]) throws(StoreError) -> [UInt8]?
    func xattrs(inode: UInt64) throws(StoreError) -> [(tag: [UInt8], sealed: [UInt8])]
    func putXattr(inode: UInt64, tag: [UInt8], sealed: [UInt8]) throws(StoreError)
    /// True when there was one.
    func deleteXattr(inode: UInt64, tag: [UInt8]) throws(StoreError) -> Bool
    func deleteXattrs(inode: UInt64) throws(StoreError)

    // MARK: Orphans (inodes unlinked while held: removed at the next mount after a crash)

    func addOrphan(_ id: UInt64) throws(StoreError)
    func removeOrphan(_ id: UInt64) throws(StoreError)
    func orphans() throws(StoreError) -> [UInt64]

    // MARK: Whole-store scans (fsck, info): every row, also those no lookup reaches

    func counts() throws(StoreError) -> StoreCounts
    /// Bytes the store takes on disk, when the engine can tell.
    var sizeOnDisk: UInt64? { get }
    func allInodeRows() throws(StoreError) -> [InodeRow]
    func allEntryRows() throws(StoreError) -> [EntryRow]
    func allXattrRows() throws(StoreError) -> [XattrRow]
    func allChunkMapRows() throws(StoreError) -> [ChunkMapRow]
    /// One summary per content id that has chunk rows (no values are read).
    func chunkFileSummaries() throws(StoreError) -> [ChunkFileSummary]
    /// Every chunk row of a file, any index (negative ones of a hostile store as their bit pattern).
    func forEachChunkRow(file: UInt64, _ body: (UInt64, UnsafeRawBufferPointer) throws -> Void) throws
    /// Deletes one chunk row (repair).
    func deleteChunkRow(file: UInt64, index: UInt64) throws(StoreError)
    /// Deletes every chunk row of a file, whatever its index.
    func deleteAllChunkRows(file: UInt64) throws(StoreError)
    /// Deletes every map page row of a file, whatever its page number.
    func deleteAllChunkMapRows(file: UInt64) throws(StoreError)

    // MARK: Copies (`coffer copy`: rows moved as they are, StoreCopy.swift)

    /// Reads from here on see one state of the store whatever others commit meanwhile (SQLite: one
    /// read transaction; PostgreSQL: one REPEATABLE READ transaction), until `close`. Read-only stores.
    func beginSnapshot() throws(StoreError)
    /// The progress record of an unfinished copy into this store; nil when there is none (a finished
    /// copy, or a store made by `coffer init`).
    func copyProgress() throws(StoreError) -> [UInt8]?
    /// Writes the progress record in the open group transaction, so it commits with the rows it
    /// counts; nil removes it (with its table).
    func setCopyProgress(_ progress: [UInt8]?) throws(StoreError)

    // MARK: Below the sealed rows (`coffer fsck`)

    /// Schema objects Coffer never makes (StoreFileCheck.swift).
    func foreignObjects() throws(StoreError) -> [SchemaObject]
    /// Rows with a column of another type than Coffer writes, counted by table (an engine with typed columns has none).
    func mistypedRows() throws(StoreError) -> [(table: String, count: Int)]
    /// The engine's own check of its files: its first `limit` complaints, empty when sound.
    func fileCheck(limit: Int) throws(StoreError) -> [String]
    /// Files beside the store that rows point into and that are missing or too short (an engine that
    /// keeps content in segment files): one line each, empty when every row's bytes are there.
    func segmentFileCheck() throws(StoreError) -> [String]
}

/// A PostgreSQL server keeps its own files and schema: a hostile one can do anything a trigger could,
/// and what it serves is checked row by row above this seam.
extension StoreBackend {
    public func entries(parentTags: [[UInt8]]) throws(StoreError) -> [[(tag: [UInt8], sealed: [UInt8])]] {
        var out: [[(tag: [UInt8], sealed: [UInt8])]] = []
        for p in parentTags { out.append(try entryPage(parentTag: p, from: [], limit: -1)) }
        return out
    }
    public func foreignObjects() throws(StoreError) -> [SchemaObject] { [] }
    public func mistypedRows() throws(StoreError) -> [(table: String, count: Int)] { [] }
    public func fileCheck(limit: Int) throws(StoreError) -> [String] { [] }
    public func segmentFileCheck() throws(StoreError) -> [String] { [] }
}

/// What a store declares about itself (the schema rows every engine keeps).
public struct StoreSchema: Sendable {
    public struct Kind: Sendable, Equatable {
        public var number: Int
        public var name: String
        public var transformer: String
        public init(number: Int, name: String, transformer: String) {
            self.number = number
            self.name = name
            self.transformer = transformer
        }
    }
    public var kinds: [Kind]
    /// Named values: `format`, `container` (the container id) and `state` (sealed).
    public var meta: [String: [UInt8]]
    public init(kinds: [Kind], meta: [String: [UInt8]]) {
        self.kinds = kinds
        self.meta = meta
    }
}

/// Row counts of a store (coffer info, fsck, tests).
public struct StoreCounts: Sendable, Equatable {
    public var inodes = 0, entries = 0, chunks = 0, xattrs = 0, chunkMapPages = 0
    public init() {}
}

// Rows as a whole-store scan returns them: plain keys and sealed values, opened by `EntityStore`.
public struct InodeRow: Sendable {
    public let id: UInt64
    public let sealed: [UInt8]
    public init(id: UInt64, sealed: [UInt8]) {
        self.id = id
        self.sealed = sealed
    }
}
public struct EntryRow: Sendable {
    public let parentTag: [UInt8]
    public let tag: [UInt8]
    public let sealed: [UInt8]
    public init(parentTag: [UInt8], tag: [UInt8], sealed: [UInt8]) {
        self.parentTag = parentTag
        self.tag = tag
        self.sealed = sealed
    }
}
public struct XattrRow: Sendable {
    public let inode: UInt64
    public let tag: [UInt8]
    public let sealed: [UInt8]
    public init(inode: UInt64, tag: [UInt8], sealed: [UInt8]) {
        self.inode = inode
        self.tag = tag
        self.sealed = sealed
    }
}
public struct ChunkMapRow: Sendable {
    public let file: UInt64
    public let page: UInt64
    public let sealed: [UInt8]
    public init(file: UInt64, page: UInt64, sealed: [UInt8]) {
        self.file = file
        self.page = page
        self.sealed = sealed
    }
}
/// The chunk rows of one content id: how many and the highest index (as stored, signed).
public struct ChunkFileSummary: Sendable {
    public let file: UInt64
    public let rows: Int
    public let maxIndex: Int64
    public init(file: UInt64, rows: Int, maxIndex: Int64) {
        self.file = file
        self.rows = rows
        self.maxIndex = maxIndex
    }
}
