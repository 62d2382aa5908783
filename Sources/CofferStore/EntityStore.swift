import CofferCrypto
import Foundation
import Glibc
import GRDB
import GRDBSQLite
import Synchronization

/// The sealed entity store: one SQLite database (WAL mode) inside the container.
///
/// Plain columns hold random ids and keyed tags only; every value is sealed on its own
/// (docs/FORMAT.md). Writes go to a single writer connection that keeps one transaction open and
/// commits it in groups (`commit()` on fsync, after a time or a volume of changes), so many small
/// changes share one commit and a crash leaves the last commit, never part of one. Only commits
/// asked to be durable (fsync, unmount) wait for the disk; the others are atomic but not yet synced.
/// Content that has no uncommitted change is read through the reader pool, concurrently.
public final class EntityStore: @unchecked Sendable {
    public static let fileName = "store.db"
    static let formatVersion = "1"

    public let keys: ContainerKeys
    public let sealer: EntitySealer
    public let readOnly: Bool
    public let path: String
    let pool: DatabasePool
    /// Committed content: a file's first `mappedChunks` chunks through connections that map the
    /// store, the rest through connections that pread (ChunkReaders).
    let mappedReaders: ChunkReaders, preadReaders: ChunkReaders
    static let mappedChunks: UInt64 = 32

    /// Called (on the writer) when SQLite dropped the open transaction (e.g. the disk filled up):
    /// everything since the last commit is gone and caches above must be reloaded.
    public var onRollback: (@Sendable () -> Void)?

    /// Called after every durable commit with the new generation (the rollback ledger listens).
    public var onCommit: (@Sendable (UInt64) -> Void)?

    /// The open group transaction: its age and volume (when to commit), the files it changed (whose
    /// content must be read through the writer), and the generation of the last commit.
    private struct Pending {
        var generation: UInt64 = 0
        var changes = 0
        var bytes = 0
        /// Statements that add no bytes (deletes): they still dirty pages, which go to the WAL.
        var deletes = 0
        /// Where `isCommitDue` last looked at the disk (MiB written + 32-delete steps).
        var probed = 0
        var since: ContinuousClock.Instant?
        /// A commit since the last WAL fsync: its frames may still be only in the page cache.
        var unsynced = false
        var dirtyFiles = Set<UInt64>()
    }
    private let pending = Mutex(Pending())

    // MARK: Opening

    private init(path: String, pool: DatabasePool, keys: ContainerKeys, registry: TransformerRegistry, readOnly: Bool,
                 location: String? = nil) {
        self.path = path; self.pool = pool; self.keys = keys
        self.mappedReaders = ChunkReaders(path: location ?? path, maps: true)
        self.preadReaders = ChunkReaders(path: location ?? path, maps: false)
        self.sealer = EntitySealer(registry: registry); self.readOnly = readOnly
    }

    static func configuration(readOnly: Bool, pageSize: Int? = nil) -> Configuration {
        var config = Configuration()
        config.readonly = readOnly
        config.allowsUnsafeTransactions = true
        config.busyMode = .timeout(10)
        config.maximumReaderCount = 4
        config.prepareDatabase { db in
            // Only take effect when the file is created (docs/MEASUREMENTS.md: fewer, larger WAL frames;
            // FreePages.swift: the space of deleted files goes back to the disk).
            if let pageSize {
                try db.execute(sql: "PRAGMA page_size = \(pageSize)")
                try db.execute(sql: "PRAGMA auto_vacuum = INCREMENTAL")
            }
            try db.execute(sql: "PRAGMA cache_size = -8192")
        }
        return config
    }

    /// The writer's page cache while a group transaction is open: a little more than the group-commit
    /// volume, so pages are written to the WAL once, at commit, instead of being spilled and rewritten
    /// (docs/MEASUREMENTS.md). Between transactions it shrinks to `idleWriterCacheKiB`: metadata reads
    /// go through the writer, and `ls -l` of 100,000 files filled it to the full 20 MiB of resident memory
    /// for good (RSS 92 MiB, 73 MiB with the shrink; `ls -lR`, untar unchanged).
    static let writerCacheKiB = 20 * 1024, idleWriterCacheKiB = 2 * 1024

    /// Page size for a new store: large enough that a content chunk spans few pages.
    static func pageSize(forChunkSize chunkSize: Int) -> Int { chunkSize >= 16384 ? 16384 : 4096 }

    /// Writer settings, applied after GRDB has switched to WAL. synchronous = NORMAL: a commit is
    /// atomic (WAL frames are checksummed; a torn tail is ignored) but SQLite does not fsync it;
    /// `commit(durable: true)` fsyncs the WAL itself, so only fsync and unmount wait for the disk,
    /// not the group commits in between (docs/MEASUREMENTS.md). Checkpoints run on their own thread
    /// (and in NORMAL mode sync the WAL before and the database file after).
    static func configureWriter(_ pool: DatabasePool) throws {
        try pool.writeWithoutTransaction { db in
            try db.execute(sql: "PRAGMA synchronous = NORMAL")
            try db.execute(sql: "PRAGMA cache_size = -\(idleWriterCacheKiB)")
            try db.execute(sql: "PRAGMA wal_autocheckpoint = 0")
            // Debian builds SQLite with SECURE_DELETE: freed pages would be rewritten with zeros,
            // i.e. a deleted file costs as much WAL as writing it. Everything in them is sealed.
            try db.execute(sql: "PRAGMA secure_delete = OFF")
            try db.execute(sql: "PRAGMA journal_size_limit = \(64 << 20)")
        }
    }

    /// Creates an empty store with the root directory.
    static func create(at path: String, keys: ContainerKeys, registry: TransformerRegistry, chunkSize: Int) throws {
        _ = exclusiveByDefault
        let pool = try DatabasePool(path: path, configuration: configuration(readOnly: false, pageSize: pageSize(forChunkSize: chunkSize)))
        try configureWriter(pool)
        try pool.write { db in
            try db.execute(sql: """
                CREATE TABLE coffer_meta(name TEXT PRIMARY KEY, value BLOB NOT NULL) WITHOUT ROWID;
                CREATE TABLE coffer_kinds(kind INTEGER PRIMARY KEY, name TEXT NOT NULL, transformer TEXT NOT NULL);
                CREATE TABLE inodes(id INTEGER PRIMARY KEY, value BLOB NOT NULL);
                CREATE TABLE dirents(parent BLOB NOT NULL, tag BLOB NOT NULL, value BLOB NOT NULL, PRIMARY KEY(parent, tag)) WITHOUT ROWID;
                CREATE TABLE chunks(file INTEGER NOT NULL, idx INTEGER NOT NULL, value BLOB NOT NULL, PRIMARY KEY(file, idx));
                CREATE TABLE xattrs(inode INTEGER NOT NULL, tag BLOB NOT NULL, value BLOB NOT NULL, PRIMARY KEY(inode, tag)) WITHOUT ROWID;
                CREATE TABLE orphans(id INTEGER PRIMARY KEY);
                CREATE TABLE chunkmaps(file INTEGER NOT NULL, page INTEGER NOT NULL, value BLOB NOT NULL, PRIMARY KEY(file, page));
                """)
            for kind in registry.registeredKinds {
                try db.execute(sql: "INSERT INTO coffer_kinds(kind, name, transformer) VALUES (?, ?, ?)",
                               arguments: [Int(kind.rawValue), kind.name, registry.transformerName(for: kind)])
            }
            try db.execute(sql: "INSERT INTO coffer_meta(name, value) VALUES ('format', ?), ('container', ?)",
                           arguments: [Data(formatVersion.utf8), Data(keys.containerId)])
        }
        let store = EntityStore(path: path, pool: pool, keys: keys, registry: registry, readOnly: false)
        let now = StoredTime(seconds: Int64(Date().timeIntervalSince1970), nanoseconds: 0)
        try store.putInode(rootInode, InodeRecord(mode: 0o040755, uid: getuid(), gid: getgid(), nlink: 2, size: 0,
                                                  atime: now, mtime: now, ctime: now))
        try store.commit()
        try pool.close()
    }

    public static let rootInode: UInt64 = 1

    /// Opens an existing store after checking that it is ours and that every kind and transformer it
    /// names is registered.
    public static func open(at path: String, keys: ContainerKeys, registry: TransformerRegistry = .standard,
                            readOnly: Bool = false) throws(StoreError) -> EntityStore {
        guard FileManager.default.fileExists(atPath: path) else { throw .notAStore("\(path) is missing") }
        let location = readOnly ? try readOnlyLocation(path) : path
        if !readOnly { _ = exclusiveByDefault }
        let pool: DatabasePool
        do { pool = try DatabasePool(path: location, configuration: configuration(readOnly: readOnly)) } catch {
            throw .notAStore("\(error)")
        }
        let store = EntityStore(path: path, pool: pool, keys: keys, registry: registry, readOnly: readOnly, location: location)
        try store.checkSchema(registry: registry)
        if !readOnly {
            do {
                try configureWriter(pool)
                (store.pageSize, store.vacuumsIncrementally) = try pool.read { db in
                    (try Int.fetchOne(db, sql: "PRAGMA page_size") ?? 4096, try Int.fetchOne(db, sql: "PRAGMA auto_vacuum") == 2)
                }
            } catch { throw .database("\(error)") }
            keepSharedMemoryFile(path)
            store.checkpointer = Checkpointer(path: path)
            store.reserve = SpaceReserve(directory: (path as NSString).deletingLastPathComponent)
            store.foldInLeftoverWAL()
        }
        return store
    }

    /// Folds a WAL left by a crash into the database file before the first write. After a crash,
    /// SQLite rebuilds the WAL index from the WAL file and no longer knows that those frames were
    /// already copied into the database file (its backfill count starts at 0), so the first
    /// transaction would be appended after all of them instead of rewriting the WAL from its start,
    /// and the WAL file would have to grow. On a full disk that commit fails and takes its whole
    /// group with it, deletes included, although the frames it skips are already in the database: a
    /// daemon killed right after a large group commit leaves a WAL that fills its file to the end
    /// (KilledOnAFullDiskTests). After this checkpoint the next transaction writes from the WAL's
    /// start, in space the file already has. If the database file must grow to take the frames in
    /// and the disk has no room, the reserve is given back and the checkpoint tried again (the disk
    /// is full). It runs on the writer before any transaction, so the open waits for it: a copy of
    /// what the crash left in the WAL, which the checkpoint thread would otherwise write moments later.
    private func foldInLeftoverWAL() {
        guard walSize() > 0 else { return }
        for attempt in 0 ..< 2 {
            do {
                try pool.writeWithoutTransaction { _ = try $0.checkpoint(.restart) }
                return
            } catch let e as DatabaseError where e.resultCode == .SQLITE_FULL && attempt == 0 && reserve?.isHeld == true {
                reserve?.release()
            } catch {
                // Not fatal: the frames stay in the WAL and the first commit appends after them.
                return
            }
        }
    }

    /// Where SQLite opens a read-only store. In a directory that cannot be written (read-only medium or
    /// bind mount) SQLite cannot create the -shm/-wal files WAL mode reads through, even read-only. With
    /// no frames in the WAL (a clean unmount truncates it) the database file is the whole store, and the
    /// URI form `immutable=1` reads it without them; frames left by a crash are read through an existing
    /// -shm (SQLite then keeps the shared memory on the heap), and without one they cannot be read at all.
    static func readOnlyLocation(_ path: String) throws(StoreError) -> String {
        guard access((path as NSString).deletingLastPathComponent, W_OK) != 0 else { return path }
        var st = stat()
        if stat(path + "-wal", &st) == 0, st.st_size > 0 {
            guard access(path + "-shm", R_OK) == 0 else {
                throw .database("the write-ahead log \(path)-wal holds commits that cannot be read without \(path)-shm in a directory that cannot be written; mount the container once where it can be written")
            }
            return path
        }
        // Debian's SQLite takes URI file names (SQLITE_USE_URI); GRDB does not pass SQLITE_OPEN_URI.
        guard sqlite3_compileoption_used("USE_URI") != 0,
              let escaped = path.addingPercentEncoding(withAllowedCharacters: .urlPathAllowed.subtracting(CharacterSet(charactersIn: "?#%"))) else {
            throw .database("this SQLite cannot open a store in a directory that cannot be written (no URI file names)")
        }
        return "file:" + escaped + "?immutable=1"
    }

    /// Makes SQLite open files through its `unix-excl` VFS in this process, before a store is opened for
    /// writing. That VFS takes the database file's lock once for the whole process and keeps the WAL index
    /// on the heap (never in the `-shm` file): connections of this process still lock each other in memory,
    /// but a transaction no longer costs fcntl(2) calls. Reading every file of the benchmark tree made
    /// 107,000 of them, and took 7 % longer (docs/MEASUREMENTS.md). No other process can open the store
    /// meanwhile, which the container lock (one mount at a time) already asks of it. Read-only connections
    /// lock as before. It is the default VFS rather than a `vfs=` URI because GRDB looks for `PATH-wal`
    /// to decide whether to write at open, and a URI made it write every time, also after a crash, before
    /// `foldInLeftoverWAL`. False if this SQLite has no such VFS (then nothing changes).
    static let exclusiveByDefault: Bool = {
        guard let vfs = sqlite3_vfs_find("unix-excl") else { return false }
        return sqlite3_vfs_register(vfs, 1) == SQLITE_OK
    }()

    /// Makes sure a `-shm` file exists beside a store opened through `unix-excl`, which never uses it:
    /// SQLite reads the commits in a WAL where nothing can be written (a snapshot or copy taken while
    /// mounted, a crashed container on read-only media) only if a `-shm` file exists; it then rebuilds the
    /// index on the heap from the WAL, whatever the file holds.
    static func keepSharedMemoryFile(_ path: String) {
        let fd = Glibc.open(path + "-shm", O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0o600)
        if fd >= 0 { Glibc.close(fd) }
    }

    private func checkSchema(registry: TransformerRegistry) throws(StoreError) {
        let (kinds, format, container, state): ([Row], Data?, Data?, Data?)
        do {
            (kinds, format, container, state) = try pool.unsafeRead { db in
                (try Row.fetchAll(db, sql: "SELECT kind, name, transformer FROM coffer_kinds"),
                 try Data.fetchOne(db, sql: "SELECT value FROM coffer_meta WHERE name = 'format'"),
                 try Data.fetchOne(db, sql: "SELECT value FROM coffer_meta WHERE name = 'container'"),
                 try Data.fetchOne(db, sql: "SELECT value FROM coffer_meta WHERE name = 'state'"))
            }
        } catch { throw .notAStore("\(error)") }
        guard format == Data(Self.formatVersion.utf8) else { throw .notAStore("unknown store format") }
        guard let container, constantTimeEqual([UInt8](container), keys.containerId) else { throw .wrongContainer }
        var seen = Set<EntityKind>()
        for row in kinds {
            let name: String = (try? row.decode(String.self, atIndex: 1)) ?? "?"
            let transformer: String = (try? row.decode(String.self, atIndex: 2)) ?? "?"
            let number: Int = (try? row.decode(Int.self, atIndex: 0)) ?? -1
            guard let kind = EntityKind(name: name), Int(kind.rawValue) == number else { throw .unknownKind(name) }
            guard registry.transformerName(for: kind) == transformer else { throw .unknownTransformer(kind: name, transformer: transformer) }
            seen.insert(kind)
        }
        for kind in registry.registeredKinds where !seen.contains(kind) { throw .missingKind(kind.name) }
        guard let state else { throw .notAStore("no store state") }
        let record = try sealer.open(StoreStateTransformer(), [UInt8](state), id: Array("state".utf8), cipher: keys.metadata, describe: "store state")
        guard constantTimeEqual(record.containerId, keys.containerId) else { throw .wrongContainer }
        pending.withLock { $0.generation = record.generation }
    }

    /// Commits, folds the WAL back into the database file, and closes. Later calls do nothing.
    public func close() {
        guard !closed.exchange(true, ordering: .acquiringAndReleasing) else { return }
        try? commit()
        checkpointer?.stop()
        checkpointer = nil
        mappedReaders.closeAll()
        preadReaders.closeAll()
        if !readOnly { _ = try? pool.writeWithoutTransaction { try $0.checkpoint(.truncate) } }
        try? pool.close()
    }

    private let closed = Atomic<Bool>(false)
    /// Copies committed WAL frames into the database file on its own connection and thread, so the
    /// writer never waits for a checkpoint.
    private var checkpointer: Checkpointer?
    /// Space set aside for recovering from a full disk.
    private var reserve: SpaceReserve?
    /// The database's page size (a WAL frame holds one page).
    private(set) var pageSize = 4096
    /// Created with `auto_vacuum = INCREMENTAL` (stores created since 2026-11-23): free pages
    /// can be given back to the disk (FreePages.swift).
    private(set) var vacuumsIncrementally = false

    /// The commit generation: grows by one with every commit.
    public var generation: UInt64 { pending.withLock { $0.generation } }

    // MARK: Writer plumbing

    /// Runs `body` on the writer connection inside the open group transaction.
    func write<T>(bytes: Int = 0, file: UInt64? = nil, _ body: (Database) throws -> T) throws(StoreError) -> T {
        guard !readOnly else { throw .readOnly }
        return try writer { db in
            if !db.isInsideTransaction {
                try db.execute(sql: "PRAGMA cache_size = -\(Self.writerCacheKiB)")
                try db.execute(sql: "BEGIN IMMEDIATE")
                pending.withLock { $0.since = .now }
            }
            let result = try body(db)
            pending.withLock { p in
                p.changes += 1; p.bytes += bytes
                if bytes == 0 { p.deletes += 1 }
                if let file { p.dirtyFiles.insert(file) }
            }
            return result
        }
    }

    /// The connection of a `batch` running on the current thread, if any.
    private let batchLock = NSLock()
    private var batchThread: pthread_t?
    private var batchDatabase: Database?

    private func currentBatchDatabase() -> Database? {
        batchLock.lock(); defer { batchLock.unlock() }
        guard let t = batchThread, pthread_equal(t, pthread_self()) != 0 else { return nil }
        return batchDatabase
    }

    /// Runs several store calls in one visit to the writer connection (one queue hop instead of
    /// one per call). Store calls made by `body` on this thread run directly on that connection.
    public func batch<T>(_ body: () throws -> T) throws -> T {
        if currentBatchDatabase() != nil { return try body() }
        // The body's own errors (e.g. EEXIST from the filesystem) come back unchanged.
        var bodyError: (any Error)?
        let result: T? = try writer { db in
            batchLock.lock(); batchThread = pthread_self(); batchDatabase = db; batchLock.unlock()
            defer { batchLock.lock(); batchThread = nil; batchDatabase = nil; batchLock.unlock() }
            do { return try body() } catch { bodyError = error; return nil }
        }
        if let bodyError { throw bodyError }
        guard let result else { throw StoreError.database("batch produced no result") }
        return result
    }

    /// Runs `body` on the writer connection (sees uncommitted changes), mapping errors.
    func writer<T>(_ body: (Database) throws -> T) throws(StoreError) -> T {
        if let db = currentBatchDatabase() {
            do { return try body(db) } catch let e as StoreError { throw e } catch is NoRoomToGrow { throw .diskFull } catch let e as DatabaseError {
                if e.resultCode == .SQLITE_FULL { throw .diskFull }
                throw .database(e.message ?? "\(e.resultCode)")
            } catch { throw .database("\(error)") }
        }
        do {
            return try pool.writeWithoutTransaction { db in
                do { return try body(db) } catch {
                    if !db.isInsideTransaction, pending.withLock({ $0.since != nil }) { droppedTransaction() }
                    throw error
                }
            }
        } catch let e as StoreError {
            if e == .diskFull { reserve?.release() }
            throw e
        } catch is NoRoomToGrow {
            throw .diskFull
        } catch let e as DatabaseError {
            if e.resultCode == .SQLITE_FULL { reserve?.release(); throw .diskFull }
            if e.resultCode == .SQLITE_READONLY { throw .readOnly }
            throw .database(e.message ?? "\(e.resultCode)")
        } catch { throw .database("\(error)") }
    }

    private func droppedTransaction() {
        pending.withLock { p in p.since = nil; p.changes = 0; p.bytes = 0; p.deletes = 0; p.probed = 0; p.dirtyFiles.removeAll() }
        checkpointer?.checkpointSoon()
        onRollback?()
    }

    /// Commits everything written so far in one atomic commit, bumping the generation. With
    /// `durable` (fsync, fsyncdir, unmount) it returns only once this commit and every earlier one
    /// are on disk; a group commit (`durable: false`) leaves the syncing to the next durable commit
    /// or checkpoint. The rollback ledger hears only of durable generations, so a power cut that
    /// takes unsynced commits with it is not mistaken for a rollback.
    public func commit(durable: Bool = true) throws(StoreError) {
        guard !readOnly else { return }
        try writer { db in
            if db.isInsideTransaction {
                let next = pending.withLock { $0.generation } + 1
                let sealed = try sealer.seal(StoreStateTransformer(), StoreStateRecord(generation: next, containerId: keys.containerId),
                                             id: Array("state".utf8), cipher: keys.metadata)
                let low = isLowOnSpace()
                do {
                    try db.execute(sql: "INSERT OR REPLACE INTO coffer_meta(name, value) VALUES ('state', ?)", arguments: [Data(sealed)])
                    if low { try refuseGrowthWithoutRoom(db) }
                    try db.execute(sql: "COMMIT")
                    try? db.execute(sql: "PRAGMA cache_size = -\(Self.idleWriterCacheKiB)")
                } catch {
                    if db.isInsideTransaction { try? db.execute(sql: "ROLLBACK") }
                    try? db.execute(sql: "PRAGMA cache_size = -\(Self.idleWriterCacheKiB)")
                    droppedTransaction()
                    if (error as? DatabaseError)?.resultCode == .SQLITE_FULL { makeRoom(db) }
                    throw error
                }
                pending.withLock { p in
                    p.generation = next; p.since = nil; p.changes = 0; p.bytes = 0; p.deletes = 0; p.probed = 0; p.dirtyFiles.removeAll()
                    p.unsynced = true
                }
                if low { _ = try? db.checkpoint(.passive) }
                // Taken back once the disk has room for it and a little more (deletes free pages inside
                // the database file, not on the disk, so on a disk the container fills this may take
                // space freed elsewhere).
                if let reserve, !reserve.isHeld, freeSpace() >= Int64(reserve.size + (1 << 20)) { reserve.take() }
            }
            if durable, pending.withLock({ $0.unsynced }) {
                try syncWAL()
                pending.withLock { $0.unsynced = false }
            }
        }
        checkpointer?.committed()
        if durable, let onCommit { onCommit(generation) }
    }

    /// fsync of the WAL file: every frame committed so far reaches the disk (what SQLite's
    /// synchronous = FULL does at each commit). Called on the writer, so no commit runs meanwhile.
    private func syncWAL() throws(StoreError) {
        let fd = Glibc.open(path + "-wal", O_RDONLY | O_CLOEXEC)
        // No WAL file: nothing was committed since the last checkpoint, which synced the database.
        guard fd >= 0 else { if errno == ENOENT { return }; throw .database("WAL: \(String(cString: strerror(errno)))") }
        defer { Glibc.close(fd) }
        guard fsync(fd) == 0 else {
            if errno == ENOSPC || errno == EDQUOT { throw .diskFull }
            throw .database("fsync of the WAL: \(String(cString: strerror(errno)))")
        }
    }

    /// The disk filled up under a commit (now rolled back): give the reserve back to the disk and
    /// fold the WAL into the database file at once, with RESTART so the next transaction writes the
    /// WAL from its start, in space the file already has. Until that checkpoint completes, every
    /// transaction, even a delete, appends to the WAL and needs new room. On the writer, outside
    /// a transaction.
    private func makeRoom(_ db: Database) {
        reserve?.release()
        _ = try? db.checkpoint(.restart)
    }

    /// Thrown by `refuseGrowthWithoutRoom`: reported as a full disk, without releasing the reserve.
    private struct NoRoomToGrow: Error {}

    /// Low on space, a commit may make the database file longer only by what the disk can still
    /// take. Its frames fit in the WAL, but the checkpoint that copies them into the database file
    /// must grow the file; when it cannot, the WAL can never start over and every later
    /// transaction, deletes included, needs new room: the container is stuck until space is freed
    /// elsewhere. The growth is the transaction's page count beyond the file's length (which also
    /// counts what committed frames still owe); the WAL's own growth is estimated from the pending
    /// bytes beyond the WAL's length. A released reserve's space is owed, not free: it is for
    /// deletes and checkpoints. Deletes and writes into freed pages do not grow the file and pass.
    private func refuseGrowthWithoutRoom(_ db: Database) throws {
        let pageSize = Int64(pageSize)
        let pages = Int64(try Int.fetchOne(db, sql: "PRAGMA page_count") ?? 0)
        var st = stat()
        guard stat(path, &st) == 0 else { return }
        let growth = pages * pageSize - Int64(st.st_size)
        guard growth > 0 else { return }
        let walGrowth = max(0, Int64(pending.withLock { $0.bytes }) + 16 * pageSize - walSize())
        if growth + walGrowth > freeSpace() - (reserve?.owed ?? 0) { throw NoRoomToGrow() }
    }

    /// True when the open transaction is older than `age` or holds more than `volume` bytes, or
    /// more than an eighth of the disk's free space (a filling disk commits in smaller groups).
    ///
    /// Deletes add no bytes but dirty pages all the same (332 unlinks in one group dirtied from 21
    /// to more than the 145 pages a 2.4 MB WAL holds, depending on the order), and a full disk has no room for a WAL
    /// longer than the one it has. So when space is short, deletes commit in pieces, each small
    /// enough (a page per statement, against half the WAL's length plus the free space) to be
    /// written over the WAL from its start once the previous piece was checkpointed.
    public func isCommitDue(age: Duration = .seconds(1), volume: Int = 64 << 20) -> Bool {
        guard let (since, bytes, deletes, look) = pending.withLock({ p -> (ContinuousClock.Instant, Int, Int, Bool)? in
            guard let since = p.since else { return nil }
            // Called on every write and unlink: look at the disk (statvfs, stat) once per MiB
            // written or 32 deletes more, not on each call.
            let step = p.bytes >> 20 + p.deletes / 32
            defer { p.probed = step }
            return (since, p.bytes, p.deletes, step != p.probed)
        }) else { return false }
        if bytes >= volume || ContinuousClock.now - since >= age { return true }
        guard look else { return false }
        if bytes >= 1 << 20 && Int64(bytes) >= freeSpace() / 8 { return true }
        guard deletes >= 32 else { return false }
        let room = walSize() + freeSpace() - (reserve?.owed ?? 0)
        return isLowOnSpace() && Int64(deletes) * Int64(pageSize) >= room / 2
    }

    /// Bytes available to us on the container's disk.
    func freeSpace() -> Int64 {
        var st = statvfs()
        return statvfs(path, &st) == 0 ? Int64(st.f_bavail) * Int64(st.f_frsize) : Int64.max
    }

    func walSize() -> Int64 {
        var st = stat()
        return stat(path + "-wal", &st) == 0 ? Int64(st.st_size) : 0
    }

    /// A checkpoint needs room for the database file to take in what the WAL holds. When the disk
    /// runs low, fold the WAL in right after each commit, so the WAL never holds more than the disk
    /// can absorb and a full disk stays recoverable by deleting files.
    public func isLowOnSpace() -> Bool {
        freeSpace() < 4 * walSize() + (64 << 20)
    }

    public var hasPendingChanges: Bool { pending.withLock { $0.since != nil } }

    // MARK: Inodes

    public func inode(_ id: UInt64) throws(StoreError) -> InodeRecord? {
        let sealed = try writer { db in try Data.fetchOne(db.cachedStatement(sql: "SELECT value FROM inodes WHERE id = ?"), arguments: [Int64(bitPattern: id)]) }
        guard let sealed else { return nil }
        return try sealer.open(InodeTransformer(), [UInt8](sealed), id: id.bigEndianBytes, cipher: keys.metadata, describe: "inode \(id)")
    }

    public func putInode(_ id: UInt64, _ record: InodeRecord) throws(StoreError) {
        let sealed = try sealer.seal(InodeTransformer(), record, id: id.bigEndianBytes, cipher: keys.metadata)
        try write(bytes: sealed.count) { db in
            try db.cachedStatement(sql: "INSERT OR REPLACE INTO inodes(id, value) VALUES (?, ?)").execute(arguments: [Int64(bitPattern: id), Data(sealed)])
        }
    }

    public func deleteInode(_ id: UInt64) throws(StoreError) {
        try write { db in try db.cachedStatement(sql: "DELETE FROM inodes WHERE id = ?").execute(arguments: [Int64(bitPattern: id)]) }
    }

    /// A fresh random inode number (63 bits, never 0 or 1) not in use.
    public func newInodeId() throws(StoreError) -> UInt64 {
        for _ in 0 ..< 16 {
            guard let r = try? Random.uint64() else { throw .database("random generator failed") }
            let id = r & 0x7FFF_FFFF_FFFF_FFFF
            if id <= 1 { continue }
            let taken = try writer { db in try Bool.fetchOne(db.cachedStatement(sql: "SELECT 1 FROM inodes WHERE id = ?"), arguments: [Int64(bitPattern: id)]) ?? false }
            if !taken { return id }
        }
        throw .database("could not find a free inode number")
    }

    public static func newContentId() throws(StoreError) -> UInt64 {
        guard let r = try? Random.uint64() else { throw .database("random generator failed") }
        return (r & 0x7FFF_FFFF_FFFF_FFFF) | 1
    }

    // MARK: Directory entries

    func parentTag(_ parent: UInt64) -> [UInt8] { keys.tag(0x50, parent.bigEndianBytes) }
    func nameTag(_ parent: UInt64, _ name: [UInt8]) -> [UInt8] { keys.tag(0x4E, parent.bigEndianBytes, name) }

    public func entry(parent: UInt64, name: [UInt8]) throws(StoreError) -> DirectoryEntryRecord? {
        let ptag = parentTag(parent), tag = nameTag(parent, name)
        let sealed = try writer { db in
            try Data.fetchOne(db.cachedStatement(sql: "SELECT value FROM dirents WHERE parent = ? AND tag = ?"), arguments: [Data(ptag), Data(tag)])
        }
        guard let sealed else { return nil }
        let record = try sealer.open(DirectoryEntryTransformer(), [UInt8](sealed), id: ptag + tag, cipher: keys.metadata,
                                     describe: "entry in directory \(parent)")
        // The sealed name must be the name looked up (it is, unless the key is compromised).
        guard record.name == name else { throw .authenticationFailed(kind: .directoryEntry, entity: "entry in directory \(parent)") }
        return record
    }

    /// Writes an entry, replacing one by the same name.
    public func putEntry(parent: UInt64, _ record: DirectoryEntryRecord) throws(StoreError) {
        _ = try insertEntry(parent: parent, record, onConflict: "REPLACE")
    }

    /// Adds a new entry; false (and nothing changed) when the directory has one by that name already.
    /// One statement instead of a lookup and a write: creating a file asks the store once.
    public func addEntry(parent: UInt64, _ record: DirectoryEntryRecord) throws(StoreError) -> Bool {
        try insertEntry(parent: parent, record, onConflict: "IGNORE")
    }

    /// `onConflict`: SQLite's conflict clause (REPLACE or IGNORE). True when a row was written.
    private func insertEntry(parent: UInt64, _ record: DirectoryEntryRecord, onConflict: StaticString) throws(StoreError) -> Bool {
        let ptag = parentTag(parent), tag = nameTag(parent, record.name)
        let sealed = try sealer.seal(DirectoryEntryTransformer(), record, id: ptag + tag, cipher: keys.metadata)
        return try write(bytes: sealed.count) { db in
            try db.cachedStatement(sql: "INSERT OR \(onConflict) INTO dirents(parent, tag, value) VALUES (?, ?, ?)")
                .execute(arguments: [Data(ptag), Data(tag), Data(sealed)])
            return db.changesCount == 1
        }
    }

    public func deleteEntry(parent: UInt64, name: [UInt8]) throws(StoreError) {
        let ptag = parentTag(parent), tag = nameTag(parent, name)
        try write { db in
            try db.cachedStatement(sql: "DELETE FROM dirents WHERE parent = ? AND tag = ?").execute(arguments: [Data(ptag), Data(tag)])
        }
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
    public func entryPage(parent: UInt64, from: [UInt8], limit: Int,
                          damaged: (StoreError) -> Void = { _ in }) throws(StoreError) -> [(tag: [UInt8], record: DirectoryEntryRecord?)] {
        let ptag = parentTag(parent)
        let rows = try writer { db in
            try Row.fetchAll(db.cachedStatement(sql: "SELECT tag, value FROM dirents WHERE parent = ? AND tag >= ? ORDER BY tag LIMIT ?"),
                             arguments: [Data(ptag), Data(from), limit])
        }
        var result: [(tag: [UInt8], record: DirectoryEntryRecord?)] = []
        result.reserveCapacity(rows.count)
        for row in rows {
            guard let tagData = row[0] as Data?, let value = row[1] as Data? else { continue }
            let tag = [UInt8](tagData)
            do {
                let record = try sealer.open(DirectoryEntryTransformer(), [UInt8](value), id: ptag + tag, cipher: keys.metadata,
                                             describe: "entry in directory \(parent)")
                result.append((tag, record))
            } catch {
                damaged(error)
                result.append((tag, nil))
            }
        }
        return result
    }

    public func hasEntries(parent: UInt64) throws(StoreError) -> Bool {
        let ptag = parentTag(parent)
        return try writer { db in
            try Bool.fetchOne(db.cachedStatement(sql: "SELECT 1 FROM dirents WHERE parent = ? LIMIT 1"), arguments: [Data(ptag)]) ?? false
        }
    }

    // MARK: Content chunks

    public func sealChunk(_ plaintext: UnsafeRawBufferPointer, file: UInt64, index: UInt64, cipher: AESGCM) throws(StoreError) -> [UInt8] {
        let aad = EntitySealer.associatedData(kind: .contentChunk, id: EntitySealer.chunkId(file: file, index: index))
        do { return try aad.withUnsafeBytes { try cipher.seal(plaintext, aad: $0) } } catch { throw .database("sealing failed: \(error)") }
    }

    /// Opens a chunk into `output` (at least chunk-size bytes); returns the plaintext length.
    public func openChunk(_ sealed: UnsafeRawBufferPointer, file: UInt64, index: UInt64, cipher: AESGCM, into output: UnsafeMutableRawBufferPointer) throws(StoreError) -> Int {
        let aad = EntitySealer.associatedData(kind: .contentChunk, id: EntitySealer.chunkId(file: file, index: index))
        guard sealed.count >= AESGCM.overhead, sealed.count - AESGCM.overhead <= output.count else {
            throw .authenticationFailed(kind: .contentChunk, entity: "chunk \(index) of content \(file)")
        }
        do {
            return try aad.withUnsafeBytes { a in try cipher.open(sealed, aad: a, into: output) }
        } catch { throw .authenticationFailed(kind: .contentChunk, entity: "chunk \(index) of content \(file)") }
    }

    public func openChunk(_ sealed: [UInt8], file: UInt64, index: UInt64, cipher: AESGCM, into output: UnsafeMutableRawBufferPointer) throws(StoreError) -> Int {
        do { return try sealed.withUnsafeBytes { s in try openChunk(s, file: file, index: index, cipher: cipher, into: output) } } catch let e as StoreError { throw e } catch { throw .database("\(error)") }
    }

    /// Calls `body` with each stored chunk `first...last` of a file, in index order, with the sealed
    /// bytes straight from SQLite's buffer (valid only during the call). Committed content goes
    /// through a reader pool, concurrently: small files and the start of large ones through mapped
    /// connections, reads further into a large file (streaming, random access) through preads. A
    /// file with uncommitted changes goes through the writer.
    public func forEachChunk(file: UInt64, first: UInt64, last: UInt64,
                             _ body: (UInt64, UnsafeRawBufferPointer) throws -> Void) throws {
        let dirty = readOnly ? false : pending.withLock { $0.dirtyFiles.contains(file) }
        if dirty {
            try writer { db in
                let stmt = try db.cachedStatement(sql: ChunkReaders.selectRange).sqliteStatement
                RawSQLite.bindRange(stmt, file: file, first: first, last: last)
                try RawSQLite.forEachRow(stmt, body)
            }
        } else {
            try (first < Self.mappedChunks ? mappedReaders : preadReaders).with { c in
                RawSQLite.bindRange(c.select, file: file, first: first, last: last)
                try RawSQLite.forEachRow(c.select) { index, sealed in
                    c.bytesSinceMap += sealed.count
                    try body(index, sealed)
                }
            }
        }
    }

    /// Sealed chunks `first...last` that exist, copied out (tests and tools).
    public func sealedChunks(file: UInt64, first: UInt64, last: UInt64) throws(StoreError) -> [(index: UInt64, sealed: [UInt8])] {
        var out: [(index: UInt64, sealed: [UInt8])] = []
        do { try forEachChunk(file: file, first: first, last: last) { out.append(($0, Array($1))) } } catch let e as StoreError { throw e } catch {
            throw .database("\(error)")
        }
        return out
    }

    public func putChunk(file: UInt64, index: UInt64, sealed: [UInt8]) throws(StoreError) {
        try putChunks(file: file, [(index, sealed)])
    }

    /// Writes several chunks of one file in one writer visit, binding the sealed bytes in place.
    public func putChunks(file: UInt64, _ chunks: [(index: UInt64, sealed: [UInt8])]) throws(StoreError) {
        let total = chunks.reduce(0) { $0 + $1.sealed.count }
        try write(bytes: total, file: file) { db in
            let stmt = try db.cachedStatement(sql: "INSERT OR REPLACE INTO chunks(file, idx, value) VALUES (?, ?, ?)").sqliteStatement
            for c in chunks {
                sqlite3_reset(stmt)
                sqlite3_bind_int64(stmt, 1, Int64(bitPattern: file))
                sqlite3_bind_int64(stmt, 2, Int64(bitPattern: c.index))
                let rc = c.sealed.withUnsafeBytes { sqlite3_bind_blob(stmt, 3, $0.baseAddress, Int32($0.count), nil) }
                guard rc == SQLITE_OK else { throw StoreError.from(code: rc, stmt) }
                let step = sqlite3_step(stmt)
                // Reset before unbinding (binding a statement that is still running is a misuse): the
                // sealed buffer was bound without a copy and is gone after this iteration.
                sqlite3_reset(stmt)
                sqlite3_bind_null(stmt, 3)
                guard step == SQLITE_DONE else { throw StoreError.from(code: step, stmt) }
            }
        }
    }

    /// Deletes chunks with index >= `from` (truncate, unlink); returns how many there were.
    @discardableResult
    public func deleteChunks(file: UInt64, from: UInt64 = 0) throws(StoreError) -> Int {
        try write(file: file) { db in
            try db.cachedStatement(sql: "DELETE FROM chunks WHERE file = ? AND idx >= ?").execute(arguments: [Int64(bitPattern: file), Int64(bitPattern: from)])
            return db.changesCount
        }
    }

    /// Which chunks `first...last` of a file are stored (the index alone; no values are read).
    public func chunkIndices(file: UInt64, first: UInt64, last: UInt64) throws(StoreError) -> Set<UInt64> {
        try writer { db in
            Set(try Int64.fetchAll(db.cachedStatement(sql: "SELECT idx FROM chunks WHERE file = ? AND idx BETWEEN ? AND ?"),
                                   arguments: [Int64(bitPattern: file), Int64(bitPattern: first), Int64(bitPattern: last)])
                .map { UInt64(bitPattern: $0) })
        }
    }

    /// How many chunks of a file are stored (the index alone).
    public func storedChunkCount(file: UInt64) throws(StoreError) -> UInt64 {
        try writer { db in
            UInt64(try Int.fetchOne(db.cachedStatement(sql: "SELECT count(*) FROM chunks WHERE file = ?"), arguments: [Int64(bitPattern: file)]) ?? 0)
        }
    }

    public func chunkIndices(file: UInt64) throws(StoreError) -> [UInt64] {
        try writer { db in
            try Int64.fetchAll(db.cachedStatement(sql: "SELECT idx FROM chunks WHERE file = ? ORDER BY idx"), arguments: [Int64(bitPattern: file)])
                .map { UInt64(bitPattern: $0) }
        }
    }

    // MARK: Chunk map pages

    /// A page of a file's chunk map, which must carry `version` (the inode names it); nil if the row
    /// is missing.
    public func chunkMapPage(file: UInt64, page: UInt64, version: UInt64) throws(StoreError) -> [ChunkTag]? {
        let sealed = try writer { db in
            try Data.fetchOne(db.cachedStatement(sql: "SELECT value FROM chunkmaps WHERE file = ? AND page = ?"),
                              arguments: [Int64(bitPattern: file), Int64(bitPattern: page)])
        }
        guard let sealed else { return nil }
        return try sealer.open(ChunkMapPageTransformer(), [UInt8](sealed), id: ChunkMapPageTransformer.id(file: file, page: page, version: version),
                               cipher: keys.metadata, describe: "chunk map page \(page) of content \(file)")
    }

    public func putChunkMapPage(file: UInt64, page: UInt64, version: UInt64, tags: [ChunkTag]) throws(StoreError) {
        let sealed = try sealer.seal(ChunkMapPageTransformer(), tags, id: ChunkMapPageTransformer.id(file: file, page: page, version: version),
                                     cipher: keys.metadata)
        try write(bytes: sealed.count) { db in
            try db.cachedStatement(sql: "INSERT OR REPLACE INTO chunkmaps(file, page, value) VALUES (?, ?, ?)")
                .execute(arguments: [Int64(bitPattern: file), Int64(bitPattern: page), Data(sealed)])
        }
    }

    /// Deletes a file's chunk map pages numbered `from` and up (truncate, unlink, back to inline).
    public func deleteChunkMapPages(file: UInt64, from: UInt64 = 0) throws(StoreError) {
        try write { db in
            try db.cachedStatement(sql: "DELETE FROM chunkmaps WHERE file = ? AND page >= ?")
                .execute(arguments: [Int64(bitPattern: file), Int64(bitPattern: from)])
        }
    }

    /// A page row's sealed bytes as stored (tests replay old rows with it).
    func rawChunkMapPage(file: UInt64, page: UInt64) throws(StoreError) -> [UInt8]? {
        try writer { db in
            try Data.fetchOne(db.cachedStatement(sql: "SELECT value FROM chunkmaps WHERE file = ? AND page = ?"),
                              arguments: [Int64(bitPattern: file), Int64(bitPattern: page)]).map { [UInt8]($0) }
        }
    }

    func putRawChunkMapPage(file: UInt64, page: UInt64, sealed: [UInt8]) throws(StoreError) {
        try write(bytes: sealed.count) { db in
            try db.cachedStatement(sql: "INSERT OR REPLACE INTO chunkmaps(file, page, value) VALUES (?, ?, ?)")
                .execute(arguments: [Int64(bitPattern: file), Int64(bitPattern: page), Data(sealed)])
        }
    }

    /// Deletes one page (it became all holes).
    public func deleteChunkMapPage(file: UInt64, page: UInt64) throws(StoreError) {
        try write { db in
            try db.cachedStatement(sql: "DELETE FROM chunkmaps WHERE file = ? AND page = ?")
                .execute(arguments: [Int64(bitPattern: file), Int64(bitPattern: page)])
        }
    }

    // MARK: Extended attributes

    func xattrTag(_ ino: UInt64, _ name: [UInt8]) -> [UInt8] { keys.tag(0x58, ino.bigEndianBytes, name) }

    public func xattr(_ ino: UInt64, name: [UInt8]) throws(StoreError) -> [UInt8]? {
        let tag = xattrTag(ino, name)
        let sealed = try writer { db in
            try Data.fetchOne(db.cachedStatement(sql: "SELECT value FROM xattrs WHERE inode = ? AND tag = ?"), arguments: [Int64(bitPattern: ino), Data(tag)])
        }
        guard let sealed else { return nil }
        let record = try sealer.open(ExtendedAttributeTransformer(), [UInt8](sealed), id: ino.bigEndianBytes + tag, cipher: keys.metadata,
                                     describe: "xattr of inode \(ino)")
        return record.value
    }

    public func putXattr(_ ino: UInt64, name: [UInt8], value: [UInt8]) throws(StoreError) {
        let tag = xattrTag(ino, name)
        let sealed = try sealer.seal(ExtendedAttributeTransformer(), ExtendedAttributeRecord(name: name, value: value),
                                     id: ino.bigEndianBytes + tag, cipher: keys.metadata)
        try write(bytes: sealed.count) { db in
            try db.cachedStatement(sql: "INSERT OR REPLACE INTO xattrs(inode, tag, value) VALUES (?, ?, ?)")
                .execute(arguments: [Int64(bitPattern: ino), Data(tag), Data(sealed)])
        }
    }

    @discardableResult
    public func deleteXattr(_ ino: UInt64, name: [UInt8]) throws(StoreError) -> Bool {
        let tag = xattrTag(ino, name)
        return try write { db in
            try db.cachedStatement(sql: "DELETE FROM xattrs WHERE inode = ? AND tag = ?").execute(arguments: [Int64(bitPattern: ino), Data(tag)])
            return db.changesCount > 0
        }
    }

    public func xattrs(_ ino: UInt64) throws(StoreError) -> [ExtendedAttributeRecord] {
        let rows = try writer { db in
            try Row.fetchAll(db.cachedStatement(sql: "SELECT tag, value FROM xattrs WHERE inode = ?"), arguments: [Int64(bitPattern: ino)])
        }
        var out: [ExtendedAttributeRecord] = []
        for row in rows {
            guard let tag = row[0] as Data?, let value = row[1] as Data? else { continue }
            out.append(try sealer.open(ExtendedAttributeTransformer(), [UInt8](value), id: ino.bigEndianBytes + [UInt8](tag),
                                       cipher: keys.metadata, describe: "xattr of inode \(ino)"))
        }
        return out
    }

    public func deleteXattrs(_ ino: UInt64) throws(StoreError) {
        try write { db in try db.cachedStatement(sql: "DELETE FROM xattrs WHERE inode = ?").execute(arguments: [Int64(bitPattern: ino)]) }
    }

    // MARK: Orphans (unlinked while open: deleted at last close, or at the next mount after a crash)

    public func addOrphan(_ id: UInt64) throws(StoreError) {
        try write { db in try db.execute(sql: "INSERT OR IGNORE INTO orphans(id) VALUES (?)", arguments: [Int64(bitPattern: id)]) }
    }
    public func removeOrphan(_ id: UInt64) throws(StoreError) {
        try write { db in try db.execute(sql: "DELETE FROM orphans WHERE id = ?", arguments: [Int64(bitPattern: id)]) }
    }
    public func orphans() throws(StoreError) -> [UInt64] {
        try writer { db in try Int64.fetchAll(db, sql: "SELECT id FROM orphans").map { UInt64(bitPattern: $0) } }
    }

    // MARK: Information

    public struct Counts: Sendable {
        public var inodes = 0, entries = 0, chunks = 0, xattrs = 0, chunkMapPages = 0
    }

    public func counts() throws(StoreError) -> Counts {
        try writer { db in
            var c = Counts()
            c.inodes = try Int.fetchOne(db, sql: "SELECT count(*) FROM inodes") ?? 0
            c.entries = try Int.fetchOne(db, sql: "SELECT count(*) FROM dirents") ?? 0
            c.chunks = try Int.fetchOne(db, sql: "SELECT count(*) FROM chunks") ?? 0
            c.xattrs = try Int.fetchOne(db, sql: "SELECT count(*) FROM xattrs") ?? 0
            c.chunkMapPages = try Int.fetchOne(db, sql: "SELECT count(*) FROM chunkmaps") ?? 0
            return c
        }
    }

    /// Bytes on disk of the database and its WAL.
    public var sizeOnDisk: UInt64 {
        [path, path + "-wal"].reduce(0) { total, p in
            let size = (try? FileManager.default.attributesOfItem(atPath: p)[.size] as? NSNumber)?.uint64Value ?? 0
            return total + size
        }
    }
}
