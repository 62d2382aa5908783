import CofferCrypto
import Foundation
import Glibc
import Synchronization

/// The sealed entity store: typed entities over the rows of a store engine (`StoreBackend`).
///
/// This is the one place that knows what a row means: which key seals it, which keyed tag names it,
/// what associated data binds it (EntitySealer), which transformer encodes it, and the sealed store
/// generation that every commit bumps. Engines keep the rows (docs/ARCHITECTURE.md); every value is
/// sealed on its own and plain columns hold random ids and keyed tags only (docs/FORMAT.md).
/// Writes join the engine's open group transaction until `commit`.
public final class EntityStore: @unchecked Sendable {
    static let formatVersion = "1"
    public static let rootInode: UInt64 = 1

    public let backend: any StoreBackend
    /// The container's keys: only this type seals and opens with them.
    let keys: ContainerKeys
    public let sealer: EntitySealer
    public var readOnly: Bool { backend.readOnly }
    /// How this store seals content chunks (its `coffer_kinds` row): set once while opening, before it is shared.
    public private(set) var chunkSealing: ChunkSealing = .blocks

    /// The generation of the last commit: grows by one with every commit.
    private let committedGeneration = Mutex<UInt64>(0)
    public var generation: UInt64 { committedGeneration.withLock { $0 } }
    /// The newest generation known to be in the store: read from it, or committed. Below `generation` after a
    /// commit failed once its state was sealed (that one may or may not have landed): a durable commit with
    /// nothing to write reports this one to the ledger, never the uncertain one (a disk that filled up made the
    /// next mount a false rollback). On PostgreSQL it may be another mount's commit, which that mount had not
    /// yet made durable when this one read it: a server crash right then can still look like a rollback here.
    private let landedGeneration = Mutex<UInt64>(0)

    /// Called after every durable commit with the new generation (the rollback ledger listens).
    public var onCommit: (@Sendable (UInt64) -> Void)?

    /// Called when the engine dropped the open transaction (e.g. the disk filled up): everything
    /// since the last commit is gone and caches above must be reloaded.
    public var onRollback: (@Sendable (StoreError) -> Void)? {
        get { backend.onRollback }
        set { backend.onRollback = newValue }
    }

    private let closed = Atomic<Bool>(false)

    /// The newest generation this machine saw durable (the rollback ledger's, then every durable
    /// commit's): a state below it, met while mounted, is a rollback and is refused.
    private let durableFloor = Mutex<UInt64>(0)
    /// A generation sealed into a COMMIT whose answer was lost: the server may or may not have it.
    private let uncertainGeneration = Mutex<UInt64>(0)
    /// The last generation this mount committed (or sealed for a COMMIT whose answer was lost): a state
    /// below it at a group begin means the server lost commits of this mount's (`observe`). Not the
    /// newest generation seen: looks beside a group of inodes raise that in any order.
    private let ownGeneration = Mutex<UInt64>(0)
    /// Called when the store changed under this mount (another mount committed, or the server lost
    /// commits that were not yet durable): what the layers above cached must be read again. Set
    /// while the listener may already call it: behind a lock.
    public var onForeignChange: (@Sendable () -> Void)? {
        get { handlers.withLock { $0.foreignChange } }
        set { handlers.withLock { $0.foreignChange = newValue } }
    }
    /// Called (on the engine's thread, after `onForeignChange`) with the inodes whose records another
    /// mount's commit wrote, when its announcement named them.
    public var onForeignInodes: (@Sendable ([UInt64]) -> Void)? {
        get { handlers.withLock { $0.foreignInodes } }
        set { handlers.withLock { $0.foreignInodes = newValue } }
    }
    private struct Handlers {
        var foreignChange: (@Sendable () -> Void)?
        var foreignInodes: (@Sendable ([UInt64]) -> Void)?
        var othersWaiting: (@Sendable () -> Void)?
    }
    private let handlers = Mutex(Handlers())
    /// Called when the server shows a generation below this mount's last commit but not below the
    /// durable floor: it lost commits that were not durable yet (it crashed). What changed since the
    /// last durable commit may be gone: the next fsync of such a file must say so.
    public var onLostCommits: (@Sendable () -> Void)?

    private init(backend: any StoreBackend, keys: ContainerKeys, registry: TransformerRegistry) {
        self.backend = backend
        self.keys = keys
        self.sealer = EntitySealer(registry: registry)
        // What a new store gets; an opened store's own row says (checkSchema).
        if let name = registry.transformerName(for: .contentChunk), let sealing = ChunkSealing(transformerName: name) { chunkSealing = sealing }
    }

    // MARK: Opening

    /// Writes the schema and the root directory into a new, empty engine, and commits.
    public static func initialize(_ backend: any StoreBackend, keys: ContainerKeys, registry: TransformerRegistry) throws(StoreError) {
        let store = EntityStore(backend: backend, keys: keys, registry: registry)
        let kinds = registry.registeredKinds.map {
            StoreSchema.Kind(number: Int($0.rawValue), name: $0.name, transformer: registry.transformerName(for: $0) ?? "?")
        }
        try backend.initializeSchema(StoreSchema(kinds: kinds, meta: ["format": Array(formatVersion.utf8), "container": keys.containerId]))
        let now = StoredTime(seconds: Int64(Date().timeIntervalSince1970), nanoseconds: 0)
        try store.putInode(
            rootInode,
            InodeRecord(
                mode: 0o040755, uid: getuid(), gid: getgid(), nlink: 2, size: 0,
                atime: now, mtime: now, ctime: now))
        try store.commit()
    }

    /// Opens the sealed store over an open engine after checking that it is ours and that every
    /// kind and transformer it names is registered.
    public static func open(_ backend: any StoreBackend, keys: ContainerKeys, registry: TransformerRegistry = .standard) throws(StoreError)
        -> EntityStore
    {
        let store = EntityStore(backend: backend, keys: keys, registry: registry)
        do {
            try store.checkSchema(registry: registry)
            if !backend.readOnly { try backend.startWriting() }
        } catch {
            backend.close()
            throw error
        }
        return store
    }

    /// Creates the embedded engine's store file (SQLite) with the schema and the root directory.
    public static func create(at path: String, keys: ContainerKeys, registry: TransformerRegistry, chunkSize: Int) throws(StoreError) {
        let backend = try SQLiteBackend.create(at: path, chunkSize: chunkSize)
        defer { backend.close() }
        try initialize(backend, keys: keys, registry: registry)
    }

    /// Opens the embedded engine's store file (SQLite) and the sealed store over it.
    public static func open(
        at path: String, keys: ContainerKeys, registry: TransformerRegistry = .standard,
        readOnly: Bool = false, foreign: ForeignObjectPolicy = .refuse
    ) throws(StoreError) -> EntityStore {
        try open(try SQLiteBackend.open(at: path, readOnly: readOnly, foreign: foreign), keys: keys, registry: registry)
    }

    private func checkSchema(registry: TransformerRegistry) throws(StoreError) {
        let schema = try backend.readSchema()
        guard schema.meta["format"] == Array(Self.formatVersion.utf8) else { throw .notAStore("unknown store format") }
        guard let container = schema.meta["container"], constantTimeEqual(container, keys.containerId) else { throw .wrongContainer }
        var seen = Set<EntityKind>()
        for k in schema.kinds {
            guard let kind = EntityKind(name: k.name), Int(kind.rawValue) == k.number else { throw .unknownKind(k.name) }
            guard registry.accepts(k.transformer, for: kind) else { throw .unknownTransformer(kind: k.name, transformer: k.transformer) }
            if kind == .contentChunk, let sealing = ChunkSealing(transformerName: k.transformer) { chunkSealing = sealing }
            seen.insert(kind)
        }
        for kind in registry.registeredKinds where !seen.contains(kind) { throw .missingKind(kind.name) }
        guard let state = schema.meta["state"] else { throw .notAStore("no store state") }
        // A `coffer copy` that has not finished: its rows are the source's, but not all of them yet.
        if try backend.copyProgress() != nil { throw .notAStore("an unfinished coffer copy (run the same coffer copy again to finish it)") }
        let record = try sealer.open(StoreStateTransformer(), state, id: Self.stateId, cipher: keys.metadata, describe: "store state")
        guard constantTimeEqual(record.containerId, keys.containerId) else { throw .wrongContainer }
        committedGeneration.withLock { $0 = record.generation }
        landedGeneration.withLock { $0 = record.generation }
    }

    /// Drops the open group (`StoreBackend.dropOpenGroup`): everything since the last commit is lost, and
    /// `onRollback` says so.
    public func dropOpenGroup(_ error: StoreError) {
        guard backend.hasPendingChanges else { return }  // the engine dropped it already
        backend.dropOpenGroup(error)
    }

    /// Closes the engine without committing what the open group holds (PostgreSQL rolls back at close).
    public func abandon() {
        guard !closed.exchange(true, ordering: .acquiringAndReleasing) else { return }
        (backend as? SQLiteBackend)?.rollBackOpenGroup()
        backend.close()
    }

    /// Commits, then closes the engine. Later calls do nothing.
    public func close() {
        guard !closed.exchange(true, ordering: .acquiringAndReleasing) else { return }
        try? commit()
        backend.close()
    }

    // MARK: Group transactions

    private static let stateId = Array("state".utf8)

    /// Commits everything written so far in one atomic commit that bumps the sealed generation.
    /// With `durable` (fsync, fsyncdir, unmount) it returns only once this commit and every earlier
    /// one are on stable storage. The rollback ledger hears only of durable generations, so a power
    /// cut that takes unsynced commits with it is not mistaken for a rollback.
    public func commit(durable: Bool = true) throws(StoreError) {
        guard !readOnly else { return }
        // Read when the state is sealed: an inode group's commit first adopts the generation the server holds.
        var next = generation + 1
        var sealedNext = false
        let committed: Bool
        do {
            committed = try backend.commit(durable: durable) { () throws(StoreError) -> [UInt8] in
                next = generation + 1
                sealedNext = true
                return try sealer.seal(
                    StoreStateTransformer(), StoreStateRecord(generation: next, containerId: keys.containerId),
                    id: Self.stateId, cipher: keys.metadata)
            }
        } catch {
            // The commit may have happened (a COMMIT whose answer was lost with the connection): never
            // seal this generation over another state. Generations must grow, not be contiguous.
            if sealedNext {
                committedGeneration.withLock { $0 = max($0, next) }
                ownGeneration.withLock { $0 = max($0, next) }
                uncertainGeneration.withLock { $0 = next }
            }
            throw error
        }
        if committed {
            committedGeneration.withLock { $0 = next }
            ownGeneration.withLock { $0 = next }
            landedGeneration.withLock { $0 = next }
        }
        if durable {
            let sure = committed ? next : landedGeneration.withLock { $0 }
            durableFloor.withLock { $0 = max($0, sure) }
            onCommit?(sure)
        }
    }

    // MARK: Several mounts (CoherentBackend)

    /// Makes the store one of several mounts of a coherent engine's container: every group begins by
    /// checking the state read under the writer lock (`observe`), and other mounts' commits call
    /// `onForeignChange` as they are heard. `floor`: the newest generation this machine saw durable.
    public func shareWithOtherMounts(floor: UInt64) {
        durableFloor.withLock { $0 = max($0, floor) }
        guard let backend = backend as? CoherentBackend else { return }
        backend.onGroupBegin = { [weak self] sealed, reconnected throws(StoreError) in
            try self?.observe(sealed, reconnected: reconnected)
        }
        // Beside other mounts' commits: the generation only grows (a look, as `catchUp`'s).
        backend.onStateInGroup = { [weak self] sealed throws(StoreError) in
            try self?.observe(sealed, atGroupBegin: false)
        }
        backend.listen(
            heard: { [weak self] in self?.onForeignChange?() }, changed: { [weak self] in self?.onForeignInodes?($0) },
            wanted: { [weak self] in self?.onOthersWaiting?() })
    }

    /// Called (on the engine's thread) when another mount asks for the writer lock.
    public var onOthersWaiting: (@Sendable () -> Void)? {
        get { handlers.withLock { $0.othersWaiting } }
        set { handlers.withLock { $0.othersWaiting = newValue } }
    }

    /// Another mount waits for the writer lock: the open group should end soon (`CoherentBackend`;
    /// always false on an engine without several mounts).
    public var othersWaiting: Bool { (backend as? CoherentBackend)?.othersWaiting ?? false }
    /// Another mount waits to open or look up (close-to-open).
    public var readersWaiting: Bool { (backend as? CoherentBackend)?.readersWaiting ?? false }

    /// Begins a group transaction now (the writer lock held, every other mount's commits seen), so
    /// that what the caller decides next is decided on the committed state. Nothing on other engines.
    public func beginGroup() throws(StoreError) {
        guard !readOnly, let backend = backend as? CoherentBackend else { return }
        try backend.beginGroup()
    }

    /// Makes the open group cover a change of `scope` (`CoherentBackend.beginGroup(_:)`); false: commit the
    /// open group first, then ask again. True at once on other engines.
    public func beginGroup(_ scope: GroupScope) throws(StoreError) -> Bool {
        guard !readOnly, let backend = backend as? CoherentBackend else { return true }
        return try backend.beginGroup(scope)
    }

    /// The open group holds inodes, not the container (`CoherentBackend.holdsInodeGroup`): writes of
    /// other inodes wait for a group of their own.
    public var holdsInodeGroup: Bool { (backend as? CoherentBackend)?.holdsInodeGroup ?? false }

    /// No other mount of the container held a lease when the last group began (always false on an
    /// engine without several mounts: a mount of its own never asks).
    public var isAlone: Bool { (backend as? CoherentBackend)?.isAlone ?? false }

    /// A new mount makes every mount alone stop skipping its checks (`CoherentBackend.join`), then waits
    /// for every group open elsewhere (one that began while this mount was not there yet may span several
    /// changes): it takes the writer lock once, writing nothing.
    public func awaitOtherGroups() throws(StoreError) {
        guard !readOnly, let backend = backend as? CoherentBackend else { return }
        try backend.join()
        try beginGroup()
        try commit(durable: false)
    }

    /// This mount's lease had lapsed and was taken again: it announces itself again before its next group
    /// (`CoherentBackend.rejoin`), since a mount alone may meanwhile have started trusting that it is.
    public func rejoin() { (backend as? CoherentBackend)?.rejoin() }

    /// Looks at the state committed on the server now (one round trip), once no group elsewhere changes
    /// `inode` (nil: once no group of the container is open elsewhere), and reports, through
    /// `onForeignChange`, a change since this mount last looked. True when there was one.
    @discardableResult
    public func catchUp(of inode: UInt64? = nil) throws(StoreError) -> Bool {
        // The floor as it was before the look: a commit of this mount's own may raise it while the look
        // is on its way (beside a group of inodes it runs on another connection), and is no rollback.
        let floor = durableFloor.withLock { $0 }
        guard let backend = backend as? CoherentBackend, let sealed = try backend.committedState(of: inode) else { return false }
        return try observe(sealed, atGroupBegin: false, floor: floor)
    }

    /// Opens a state row the server served and adopts its generation (the next commit writes one more).
    /// Below the durable floor: a rollback, refused. Another generation than this mount's own: the store
    /// changed under it (`onForeignChange`). Only a state read at a group begin, under the writer lock,
    /// can lower the generation: below this mount's last commit (`ownGeneration`), the server lost commits
    /// that were not durable yet (`onLostCommits`), unless it is the one below a COMMIT whose answer was
    /// lost (that commit did not land). With `reconnected` (the engine reconnected since the last group),
    /// those commits are reported as possibly lost whatever the generation: others may have committed past
    /// them. A look taken outside the lock (`catchUp`; `floor`: the durable floor before it was taken), or
    /// inside a group of inodes, beside other mounts' commits, may be older than one taken since, and only
    /// raises it.
    @discardableResult
    func observe(_ sealed: [UInt8]?, atGroupBegin: Bool = true, reconnected: Bool = false, floor seenFloor: UInt64? = nil) throws(StoreError)
        -> Bool
    {
        guard let sealed else { throw .notAStore("no store state") }
        let record = try sealer.open(StoreStateTransformer(), sealed, id: Self.stateId, cipher: keys.metadata, describe: "store state")
        guard constantTimeEqual(record.containerId, keys.containerId) else { throw .wrongContainer }
        let floor = seenFloor ?? durableFloor.withLock { $0 }
        guard record.generation >= floor else { throw .rolledBack(seen: floor, served: record.generation) }
        var uncertain: UInt64 = 0
        if atGroupBegin {
            uncertain = uncertainGeneration.withLock { u in
                defer { u = 0 }
                return u
            }
        }
        let own = ownGeneration.withLock { $0 }
        let (changed, lost) = committedGeneration.withLock { g -> (Bool, Bool) in
            guard atGroupBegin || record.generation > g else { return (false, false) }
            // After a reconnect the generation alone cannot tell: other mounts may have committed past
            // commits of this one that a crash lost. Those that were durable are not reported (the
            // layers above mark only what changed since the last durable commit).
            let lost = reconnected || (record.generation < own && !(uncertain == own && record.generation == own - 1))
            defer { g = record.generation }
            return (record.generation != g, lost)
        }
        // What the server serves is in the store; a look outside the writer lock may be older than one since.
        landedGeneration.withLock { $0 = atGroupBegin ? record.generation : max($0, record.generation) }
        if lost { onLostCommits?() }
        if changed { onForeignChange?() }
        return changed
    }

    /// A consistent copy of the committed store (sealed rows only) in a new SQLite file at `path`; only
    /// the embedded engine has one (a PostgreSQL source is read in a snapshot transaction instead).
    public func snapshot(into path: String) throws(StoreError) {
        guard let sqlite = backend as? SQLiteBackend else { throw .database("only an embedded store is snapshotted into a file") }
        try sqlite.snapshot(into: path)
    }

    /// Removes the engine's files that no row names (segment files of a group a crash cut off). Only once
    /// the store is known to be the newest state this machine saw (after the rollback check): in a store
    /// replaced by an older copy, they are the newer state's. Nothing for other engines.
    public func removeStrayFiles() {
        (backend as? SQLiteBackend)?.removeUnlistedSegments()
    }

    /// Runs several store calls in one visit to the engine's writer.
    public func batch<T>(_ body: () throws -> T) throws -> T { try backend.batch(body) }

    public var hasPendingChanges: Bool { backend.hasPendingChanges }

    public func isCommitDue(age: Duration = .seconds(1), volume: Int = 64 << 20) -> Bool {
        backend.isCommitDue(age: age, volume: volume)
    }

    public func isLowOnSpace() -> Bool { backend.isLowOnSpace() }
    /// Whether the disk can take a write of `bytes` and `more` bytes besides (true: the engine cannot tell).
    public func hasRoom(forWrite bytes: Int, more: Int64) -> Bool { backend.hasRoom(forWrite: bytes, more: more) }

    /// Gives free space back to the disk, a piece at a time (SQLite: FreePages.swift).
    public func giveBackFreePages(limit: Int = 32) throws(StoreError) -> Int { try backend.reclaimSpace(limit: limit) }

    // MARK: Inodes

    public func inode(_ id: UInt64) throws(StoreError) -> InodeRecord? {
        guard let sealed = try backend.inode(id) else { return nil }
        return try openInode(id: id, sealed)
    }

    /// The records of those of `ids` that exist and open, in one visit to the engine. A row that does
    /// not open is left out: its own `inode(_:)` call reports it.
    public func inodes(_ ids: [UInt64]) throws(StoreError) -> [UInt64: InodeRecord] {
        var out: [UInt64: InodeRecord] = [:]
        for (id, sealed) in try backend.inodes(ids) {
            if let record = try? openInode(id: id, sealed) { out[id] = record }
        }
        return out
    }

    public func putInode(_ id: UInt64, _ record: InodeRecord) throws(StoreError) {
        try covered(id)
        try backend.putInode(id, sealed: try sealer.seal(InodeTransformer(), record, id: id.bigEndianBytes, cipher: keys.metadata))
    }

    public func deleteInode(_ id: UInt64) throws(StoreError) {
        try covered(id)
        try backend.deleteInode(id)
    }

    /// Refuses a write of `inode`'s rows that the open group does not hold (`CoherentBackend.covers`).
    /// The group is dropped with it (reported as any lost group is): a refusal left in it would fail every
    /// later commit of the group, and hold what it locked meanwhile.
    private func covered(_ inode: UInt64) throws(StoreError) {
        guard let backend = backend as? CoherentBackend, !backend.covers(inode) else { return }
        let error = StoreError.database("inode \(inode) is written in a group that does not hold it")
        backend.dropOpenGroup(error)
        throw error
    }

    /// A fresh random inode number (63 bits, never 0 or 1) not in use. Numbers are checked free in
    /// batches of `freeIdBatch` in one store call and handed out one by one: a create on a remote
    /// engine costs no round trip of its own for its number.
    public func newInodeId() throws(StoreError) -> UInt64 {
        for _ in 0..<16 {
            if let id = freeIds.withLock({ $0.popLast() }) {
                // Made in the open group: it holds the new inode without a lock (nobody else knows it yet).
                (backend as? CoherentBackend)?.madeInGroup(id)
                return id
            }
            var candidates: [UInt64] = []
            for _ in 0..<Self.freeIdBatch {
                guard let r = try? Random.uint64() else { throw .randomFailed }
                let id = r & 0x7FFF_FFFF_FFFF_FFFF
                if id > 1 { candidates.append(id) }
            }
            let taken = try backend.inodes(candidates)
            freeIds.withLock { $0 = candidates.filter { taken[$0] == nil } }
        }
        throw .database("could not find a free inode number")
    }
    static let freeIdBatch = 32
    /// Numbers found free by the last batch and not handed out yet.
    private let freeIds = Mutex<[UInt64]>([])

    public static func newContentId() throws(StoreError) -> UInt64 {
        guard let r = try? Random.uint64() else { throw .randomFailed }
        return (r & 0x7FFF_FFFF_FFFF_FFFF) | 1
    }

    func openInode(id: UInt64, _ sealed: [UInt8]) throws(StoreError) -> InodeRecord {
        try sealer.open(InodeTransformer(), sealed, id: id.bigEndianBytes, cipher: keys.metadata, describe: "inode \(id)")
    }

    // MARK: Directory entries

    /// The keyed tags that name entries and xattrs (docs/FORMAT.md).
    public func parentTag(_ parent: UInt64) -> [UInt8] { keys.tag(0x50, parent.bigEndianBytes) }
    public func nameTag(_ parent: UInt64, _ name: [UInt8]) -> [UInt8] { keys.tag(0x4E, parent.bigEndianBytes, name) }

    public func entry(parent: UInt64, name: [UInt8]) throws(StoreError) -> DirectoryEntryRecord? {
        let ptag = parentTag(parent), tag = nameTag(parent, name)
        guard let sealed = try backend.entry(parentTag: ptag, tag: tag) else { return nil }
        let record = try openEntry(ptag + tag, sealed, describe: "entry in directory \(parent)")
        // The sealed name must be the name looked up (it is, unless the key is compromised).
        guard record.name == name else { throw .authenticationFailed(kind: .directoryEntry, entity: "entry in directory \(parent)") }
        return record
    }

    /// Writes an entry, replacing one by the same name.
    public func putEntry(parent: UInt64, _ record: DirectoryEntryRecord) throws(StoreError) {
        _ = try insertEntry(parent: parent, record, replace: true)
    }

    /// Adds a new entry; false (and nothing changed) when the directory has one by that name already.
    /// One statement instead of a lookup and a write: creating a file asks the store once.
    public func addEntry(parent: UInt64, _ record: DirectoryEntryRecord) throws(StoreError) -> Bool {
        try insertEntry(parent: parent, record, replace: false)
    }

    /// Counts this store's entry writes and deletes (attempted, committed or not): a cache of names
    /// taken when it had one value is good only while it has it (`CofferFileSystem`'s entry cache).
    public var entryChanges: UInt64 { entryChangeCount.load(ordering: .acquiring) }
    private let entryChangeCount = Atomic<UInt64>(0)

    private func insertEntry(parent: UInt64, _ record: DirectoryEntryRecord, replace: Bool) throws(StoreError) -> Bool {
        try covered(parent)
        entryChangeCount.add(1, ordering: .acquiringAndReleasing)
        let ptag = parentTag(parent), tag = nameTag(parent, record.name)
        let sealed = try sealer.seal(DirectoryEntryTransformer(), record, id: ptag + tag, cipher: keys.metadata)
        return try backend.putEntry(parentTag: ptag, tag: tag, sealed: sealed, replace: replace)
    }

    public func deleteEntry(parent: UInt64, name: [UInt8]) throws(StoreError) {
        try covered(parent)
        entryChangeCount.add(1, ordering: .acquiringAndReleasing)
        try backend.deleteEntry(parentTag: parentTag(parent), tag: nameTag(parent, name))
    }

    /// All entries of each directory (one round trip on a remote engine); damaged ones are skipped.
    public func entries(parents: [UInt64]) throws(StoreError) -> [UInt64: [DirectoryEntryRecord]] {
        let tags = parents.map(parentTag)
        var out: [UInt64: [DirectoryEntryRecord]] = [:]
        let lists = try backend.entries(parentTags: tags)
        guard lists.count == parents.count else { throw .database("asked the entries of \(parents.count) directories, got \(lists.count)") }
        for (i, rows) in lists.enumerated() {
            out[parents[i]] = rows.compactMap { row in try? openEntry(tags[i] + row.tag, row.sealed, describe: "entry in directory \(parents[i])") }
        }
        return out
    }

    /// All entries of a directory. A damaged entry is reported through `damaged` and skipped, so one
    /// bad entry does not hide its siblings.
    public func entries(parent: UInt64, damaged: (StoreError) -> Void = { _ in }) throws(StoreError) -> [DirectoryEntryRecord] {
        try entryPage(parent: parent, from: [], limit: -1, damaged: damaged).compactMap(\.record)
    }

    /// Up to `limit` entries (-1: all) of a directory in tag order, from the first whose tag is at least `from` (a
    /// prefix of a tag is enough): a listing that resumes from a position alone, with no open directory.
    /// A damaged entry comes back with a nil record (and is reported through `damaged`), so that it
    /// still holds its place in the order.
    public func entryPage(
        parent: UInt64, from: [UInt8], limit: Int,
        damaged: (StoreError) -> Void = { _ in }
    ) throws(StoreError) -> [(tag: [UInt8], record: DirectoryEntryRecord?)] {
        let ptag = parentTag(parent)
        var result: [(tag: [UInt8], record: DirectoryEntryRecord?)] = []
        for row in try backend.entryPage(parentTag: ptag, from: from, limit: limit) {
            do { result.append((row.tag, try openEntry(ptag + row.tag, row.sealed, describe: "entry in directory \(parent)"))) } catch {
                damaged(error)
                result.append((row.tag, nil))
            }
        }
        return result
    }

    public func hasEntries(parent: UInt64) throws(StoreError) -> Bool { try backend.hasEntries(parentTag: parentTag(parent)) }

    func openEntry(_ id: [UInt8], _ sealed: [UInt8], describe: @autoclosure () -> String) throws(StoreError) -> DirectoryEntryRecord {
        try sealer.open(DirectoryEntryTransformer(), sealed, id: id, cipher: keys.metadata, describe: describe())
    }

    // MARK: Content chunks

    /// The cipher of one file's content (its key is derived from the content root and the id).
    public func contentCipher(contentId: UInt64) throws(StoreError) -> ContentCipher {
        do { return ContentCipher(contentId: contentId, aead: try keys.fileCipher(contentId: contentId), sealing: chunkSealing) } catch {
            throw .sealingFailed("deriving a file key: \(error)")
        }
    }

    /// Sealed chunks `first...last` of a file as committed, fetched ahead of a reader: nil on an engine
    /// that reads in process (nothing to gain) or for a file with changes in the open group.
    public func committedChunks(file: UInt64, first: UInt64, last: UInt64) throws(StoreError) -> [(index: UInt64, sealed: [UInt8])]? {
        guard let backend = backend as? CoherentBackend else { return nil }
        return try backend.committedChunks(file: file, first: first, last: last)
    }

    /// Calls `body` with each stored chunk `first...last` of a file, in index order, with the sealed
    /// bytes straight from the engine's buffer (valid only during the call).
    public func forEachChunk(file: UInt64, first: UInt64, last: UInt64, _ body: (UInt64, UnsafeRawBufferPointer) throws -> Void) throws {
        try backend.forEachChunk(file: file, first: first, last: last, body)
    }

    /// Writes several sealed chunks of one file in one visit to the writer.
    public func putChunks(file: UInt64, _ chunks: [(index: UInt64, sealed: [UInt8])]) throws(StoreError) {
        try backend.putChunks(file: file, chunks)
    }

    /// Deletes chunks with index >= `from` (truncate, unlink); returns how many there were.
    @discardableResult
    public func deleteChunks(file: UInt64, from: UInt64 = 0) throws(StoreError) -> Int {
        try backend.deleteChunks(file: file, from: from)
    }

    /// Deletes chunks `first...last` (punching a hole); returns how many there were.
    @discardableResult
    public func deleteChunks(file: UInt64, first: UInt64, last: UInt64) throws(StoreError) -> Int {
        try backend.deleteChunks(file: file, first: first, last: last)
    }

    /// Which chunks `first...last` of a file are stored (the index alone; no values are read).
    public func chunkIndices(file: UInt64, first: UInt64 = 0, last: UInt64 = UInt64(Int64.max)) throws(StoreError) -> [UInt64] {
        try backend.chunkIndices(file: file, first: first, last: last)
    }

    // MARK: Chunk map pages

    /// A page of a file's chunk map, which must carry `version` (the inode names it); nil if the row
    /// is missing.
    public func chunkMapPage(file: UInt64, page: UInt64, version: UInt64) throws(StoreError) -> [ChunkTag]? {
        guard let sealed = try backend.chunkMapPage(file: file, page: page) else { return nil }
        return try openChunkMapPage(ChunkMapRow(file: file, page: page, sealed: sealed), version: version)
    }

    /// Seals and writes a page of a file's chunk map under a fresh random version, which the inode
    /// must then name (an older copy of the page no longer opens). The one page writer, for the
    /// mount and for fsck's repair.
    public func writeChunkMapPage(file: UInt64, page: UInt64, tags: [ChunkTag]) throws(StoreError) -> ChunkMapPageRef {
        let version = try Self.newPageVersion()
        let sealed = try sealer.seal(
            ChunkMapPageTransformer(), tags, id: ChunkMapPageTransformer.id(file: file, page: page, version: version),
            cipher: keys.metadata)
        try backend.putChunkMapPage(file: file, page: page, sealed: sealed)
        return ChunkMapPageRef(page: page, version: version)
    }

    /// Deletes a file's chunk map pages numbered `from` and up (truncate, unlink, back to inline).
    public func deleteChunkMapPages(file: UInt64, from: UInt64 = 0) throws(StoreError) {
        try backend.deleteChunkMapPages(file: file, from: from)
    }

    /// Deletes one page (it became all holes).
    public func deleteChunkMapPage(file: UInt64, page: UInt64) throws(StoreError) {
        try backend.deleteChunkMapPage(file: file, page: page)
    }

    func openChunkMapPage(_ row: ChunkMapRow, version: UInt64) throws(StoreError) -> [ChunkTag] {
        try sealer.open(
            ChunkMapPageTransformer(), row.sealed, id: ChunkMapPageTransformer.id(file: row.file, page: row.page, version: version),
            cipher: keys.metadata, describe: "chunk map page \(row.page) of content \(row.file)")
    }

    private static func newPageVersion() throws(StoreError) -> UInt64 {
        for _ in 0..<4 {
            guard let v = try? Random.uint64() else { break }
            if v != 0 { return v }
        }
        throw .randomFailed
    }

    // MARK: Extended attributes

    public func xattrTag(_ ino: UInt64, _ name: [UInt8]) -> [UInt8] { keys.tag(0x58, ino.bigEndianBytes, name) }

    public func xattr(_ ino: UInt64, name: [UInt8]) throws(StoreError) -> [UInt8]? {
        let tag = xattrTag(ino, name)
        guard let sealed = try backend.xattr(inode: ino, tag: tag) else { return nil }
        return try openXattr(XattrRow(inode: ino, tag: tag, sealed: sealed)).value
    }

    public func putXattr(_ ino: UInt64, name: [UInt8], value: [UInt8]) throws(StoreError) {
        try covered(ino)
        let tag = xattrTag(ino, name)
        let sealed = try sealer.seal(
            ExtendedAttributeTransformer(), ExtendedAttributeRecord(name: name, value: value),
            id: ino.bigEndianBytes + tag, cipher: keys.metadata)
        try backend.putXattr(inode: ino, tag: tag, sealed: sealed)
    }

    @discardableResult
    public func deleteXattr(_ ino: UInt64, name: [UInt8]) throws(StoreError) -> Bool {
        try covered(ino)
        return try backend.deleteXattr(inode: ino, tag: xattrTag(ino, name))
    }

    public func xattrs(_ ino: UInt64) throws(StoreError) -> [ExtendedAttributeRecord] {
        var out: [ExtendedAttributeRecord] = []
        for row in try backend.xattrs(inode: ino) { out.append(try openXattr(XattrRow(inode: ino, tag: row.tag, sealed: row.sealed))) }
        return out
    }

    /// How many xattrs an inode has, none of them opened.
    public func xattrCount(_ ino: UInt64) throws(StoreError) -> Int { try backend.xattrs(inode: ino).count }

    public func deleteXattrs(_ ino: UInt64) throws(StoreError) {
        try covered(ino)
        try backend.deleteXattrs(inode: ino)
    }

    func openXattr(_ row: XattrRow) throws(StoreError) -> ExtendedAttributeRecord {
        try sealer.open(
            ExtendedAttributeTransformer(), row.sealed, id: row.inode.bigEndianBytes + row.tag, cipher: keys.metadata,
            describe: "xattr of inode \(row.inode)")
    }

    // MARK: Orphans (unlinked while the kernel held them: removed at the forget, or at the next mount after a crash)

    public func addOrphan(_ id: UInt64) throws(StoreError) {
        try covered(id)
        try backend.addOrphan(id)
    }
    public func removeOrphan(_ id: UInt64) throws(StoreError) {
        try covered(id)
        try backend.removeOrphan(id)
    }
    public func orphans() throws(StoreError) -> [UInt64] { try backend.orphans() }

    // MARK: Information

    public func counts() throws(StoreError) -> StoreCounts { try backend.counts() }

    /// The counts of the last commit (an embedded store: never the open group's rows).
    public func committedCounts() throws(StoreError) -> StoreCounts {
        guard let sqlite = backend as? SQLiteBackend else { return try backend.counts() }
        return try sqlite.committedCounts()
    }

    /// Bytes the store takes on disk (0 when the engine cannot tell).
    public var sizeOnDisk: UInt64 { backend.sizeOnDisk ?? 0 }
}
