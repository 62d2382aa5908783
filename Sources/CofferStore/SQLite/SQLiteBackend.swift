import Foundation
import Glibc
import GRDB
import GRDBSQLite
import Synchronization

/// The embedded engine: one SQLite database (WAL mode) inside the container directory.
///
/// Writes go to a single writer connection that keeps one transaction open and commits it in
/// groups (SQLiteTransactions.swift), so many small changes share one commit and a crash leaves the
/// last commit, never part of one. Only commits asked to be durable (fsync, unmount) wait for the
/// disk. Content that has no uncommitted change is read through reader pools, concurrently
/// (ChunkReaders.swift). Tuning: docs/MEASUREMENTS.md; schema: docs/FORMAT.md.
public final class SQLiteBackend: StoreBackend, @unchecked Sendable {
    public static let fileName = "store.db"

    public let readOnly: Bool
    public let path: String
    let pool: DatabasePool
    /// Committed content: a file's first `mappedChunks` chunks through connections that map the
    /// store, the rest through connections that pread (ChunkReaders).
    let mappedReaders: ChunkReaders, preadReaders: ChunkReaders
    static let mappedChunks: UInt64 = 32

    public var onRollback: (@Sendable (StoreError) -> Void)?

    /// The open group transaction: its age and volume (when to commit) and the files it changed
    /// (whose content must be read through the writer).
    struct Pending {
        var changes = 0
        /// Bytes of rows (they go to the WAL).
        var bytes = 0
        /// Bytes appended to segment files.
        var segmentBytes = 0
        /// Statements that add no bytes (deletes): they still dirty pages, which go to the WAL.
        var deletes = 0
        /// Where `isCommitDue` last looked at the disk (MiB written + 32-delete steps).
        var probed = 0
        var since: ContinuousClock.Instant?
        /// A commit since the last WAL fsync: its frames may still be only in the page cache.
        var unsynced = false
        var dirtyFiles = Set<UInt64>()

        mutating func clearTransaction() {
            since = nil
            changes = 0
            bytes = 0
            segmentBytes = 0
            deletes = 0
            probed = 0
            dirtyFiles.removeAll()
        }
    }
    let pending = Mutex(Pending())

    /// The connection of a `batch` running on the current thread, if any.
    let batchLock = NSLock()
    var batchThread: pthread_t?
    var batchDatabase: Database?

    private let closed = Atomic<Bool>(false)
    /// Copies committed WAL frames into the database file on its own connection and thread, so the
    /// writer never waits for a checkpoint.
    var checkpointer: Checkpointer?
    /// Space set aside for recovering from a full disk.
    var reserve: SpaceReserve?
    /// The database's page size (a WAL frame holds one page).
    private(set) var pageSize = 4096
    /// Created with `auto_vacuum = INCREMENTAL` (stores created since 2026-11-23): free pages
    /// can be given back to the disk (FreePages.swift).
    private(set) var vacuumsIncrementally = false
    /// Set up for writing (`startWriting`): only then does closing fold the WAL in.
    private var writing = false
    /// Large content chunks live in segment files beside the store (Segments.swift); `hasSegments`
    /// when its `chunks` table has the columns that point there.
    let segments: Segments
    var hasSegments = false
    /// Sealed chunks at least this long go to a segment (tests of content held in rows, as small chunks
    /// and stores made before segments hold it, raise it).
    var segmentThreshold = Segments.minimumLength
    let segmentPins = Mutex(SegmentPins())
    /// What `open` was told to do about schema objects Coffer never makes.
    private(set) var foreignPolicy = ForeignObjectPolicy.refuse

    private init(path: String, pool: DatabasePool, readOnly: Bool, location: String? = nil) {
        self.path = path
        self.pool = pool
        self.readOnly = readOnly
        self.mappedReaders = ChunkReaders(path: location ?? path, maps: true)
        self.preadReaders = ChunkReaders(path: location ?? path, maps: false)
        self.segments = Segments(directory: (path as NSString).deletingLastPathComponent + "/" + Segments.directoryName)
        mappedReaders.segments = segments
        preadReaders.segments = segments
    }

    // MARK: Opening

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
    /// for good (RSS 92 MiB, 73 MiB with the shrink; `ls -lR`, untar unchanged). 10 MiB with 8 MiB groups:
    /// a 4 GiB streaming write peaked at 63 MiB RSS instead of 74 with 20 MiB and 16 MiB groups (issue 19).
    static let writerCacheKiB = 10 * 1024, idleWriterCacheKiB = 2 * 1024

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
            // Statement journals (a chunk row's INSERT OR REPLACE journals ~64 KiB, its triggers make it
            // a multi-row change) and the temporary table of freed ranges stay in memory: by default
            // they went to temporary files, 544 MB of writes for a 256 MiB streaming write (issue 19).
            try db.execute(sql: "PRAGMA temp_store = MEMORY")
        }
    }

    /// Creates an empty store file with its tables (docs/FORMAT.md), open for writing.
    public static func create(at path: String, chunkSize: Int) throws(StoreError) -> SQLiteBackend {
        _ = exclusiveByDefault
        do {
            let pool = try DatabasePool(path: path, configuration: configuration(readOnly: false, pageSize: pageSize(forChunkSize: chunkSize)))
            try configureWriter(pool)
            try pool.write { db in
                try db.execute(
                    sql: """
                        CREATE TABLE coffer_meta(name TEXT PRIMARY KEY, value BLOB NOT NULL) WITHOUT ROWID;
                        CREATE TABLE coffer_kinds(kind INTEGER PRIMARY KEY, name TEXT NOT NULL, transformer TEXT NOT NULL);
                        CREATE TABLE inodes(id INTEGER PRIMARY KEY, value BLOB NOT NULL);
                        CREATE TABLE dirents(parent BLOB NOT NULL, tag BLOB NOT NULL, value BLOB NOT NULL, PRIMARY KEY(parent, tag)) WITHOUT ROWID;
                        CREATE TABLE chunks(file INTEGER NOT NULL, idx INTEGER NOT NULL, value BLOB NOT NULL, seg INTEGER, off INTEGER, len INTEGER,
                            PRIMARY KEY(file, idx));
                        CREATE TABLE xattrs(inode INTEGER NOT NULL, tag BLOB NOT NULL, value BLOB NOT NULL, PRIMARY KEY(inode, tag)) WITHOUT ROWID;
                        CREATE TABLE orphans(id INTEGER PRIMARY KEY);
                        CREATE TABLE chunkmaps(file INTEGER NOT NULL, page INTEGER NOT NULL, value BLOB NOT NULL, PRIMARY KEY(file, page));
                        """)
            }
            let backend = SQLiteBackend(path: path, pool: pool, readOnly: false)
            try backend.readSettings()
            try backend.setUpSegments()
            backend.writing = true
            return backend
        } catch { throw StoreError.sqlite(error) }
    }

    /// Opens an existing store file; read-only from a directory that cannot be written too. Objects in its
    /// schema that Coffer never makes are refused unless `foreign` says otherwise (StoreFileCheck.swift).
    public static func open(at path: String, readOnly: Bool = false, foreign: ForeignObjectPolicy = .refuse) throws(StoreError)
        -> SQLiteBackend
    {
        guard FileManager.default.fileExists(atPath: path) else { throw .notAStore("\(path) is missing") }
        let location = readOnly ? try readOnlyLocation(path) : path
        if !readOnly { _ = exclusiveByDefault }
        let pool: DatabasePool
        do { pool = try DatabasePool(path: location, configuration: configuration(readOnly: readOnly)) } catch {
            throw unopenable(error, path)
        }
        let backend = SQLiteBackend(path: path, pool: pool, readOnly: readOnly, location: location)
        backend.foreignPolicy = foreign
        do {
            // Before anything is written: a trigger would run on Coffer's first write.
            if foreign == .refuse { try backend.refuseForeignObjects() }
        } catch {
            backend.close()
            throw error
        }
        backend.hasSegments = (try? pool.unsafeRead { try hasSegmentColumns($0) }) ?? false
        return backend
    }

    /// Sets up writing, once the store is known to be the container's: writer settings, the
    /// checkpoint thread, the space reserve, and the WAL a crash left folded in.
    public func startWriting() throws(StoreError) {
        guard !readOnly, !writing else { return }
        do {
            try Self.configureWriter(pool)
            try readSettings()
        } catch { throw Self.unopenable(error, path) }
        if foreignPolicy == .repair { try repairStoreFile() }
        Self.keepSharedMemoryFile(path)
        checkpointer = Checkpointer(path: path)
        reserve = SpaceReserve(directory: (path as NSString).deletingLastPathComponent)
        writing = true
        foldInLeftoverWAL()
        do { try setUpSegments() } catch { throw .database("cannot set up the segment files: \(error)") }
    }

    /// On the writer: a reader opened next to a new store's first writes made them fail with
    /// "attempt to write a readonly database" under the unix-excl VFS.
    private func readSettings() throws {
        (pageSize, vacuumsIncrementally) = try pool.writeWithoutTransaction { db in
            (try Int.fetchOne(db, sql: "PRAGMA page_size") ?? 4096, try Int.fetchOne(db, sql: "PRAGMA auto_vacuum") == 2)
        }
    }

    public func readSchema() throws(StoreError) -> StoreSchema {
        do {
            return try pool.unsafeRead { db in
                let kinds = try Row.fetchAll(db, sql: "SELECT kind, name, transformer FROM coffer_kinds").map { row in
                    StoreSchema.Kind(
                        number: (try? row.decode(Int.self, atIndex: 0)) ?? -1,
                        name: (try? row.decode(String.self, atIndex: 1)) ?? "?",
                        transformer: (try? row.decode(String.self, atIndex: 2)) ?? "?")
                }
                var meta: [String: [UInt8]] = [:]
                for row in try Row.fetchAll(db, sql: "SELECT name, value FROM coffer_meta") {
                    guard let name = try? row.decode(String.self, atIndex: 0), let value = (try? row.decode(Data?.self, atIndex: 1)) ?? nil else {
                        continue
                    }
                    meta[name] = [UInt8](value)
                }
                return StoreSchema(kinds: kinds, meta: meta)
            }
        } catch { throw Self.unopenable(error, path) }
    }

    /// Why a store file cannot be opened: damaged, when SQLite says so (SQLITE_CORRUPT, SQLITE_NOTADB) of a
    /// file that starts as a SQLite database does (a truncated or overwritten one), else not a store at all.
    static func unopenable(_ error: any Error, _ path: String) -> StoreError {
        if let e = error as? DatabaseError, e.resultCode == .SQLITE_CORRUPT || e.resultCode == .SQLITE_NOTADB,
            let file = FileHandle(forReadingAtPath: path), let start = try? file.read(upToCount: 16),
            Array(start) == Array("SQLite format 3\0".utf8)
        {
            return .damagedFile(e.message ?? "\(e.resultCode)")
        }
        return .notAStore("\(error)")
    }

    public func initializeSchema(_ schema: StoreSchema) throws(StoreError) {
        try write { db in
            for kind in schema.kinds {
                try db.execute(
                    sql: "INSERT INTO coffer_kinds(kind, name, transformer) VALUES (?, ?, ?)",
                    arguments: [kind.number, kind.name, kind.transformer])
            }
            for (name, value) in schema.meta {
                try db.execute(sql: "INSERT OR REPLACE INTO coffer_meta(name, value) VALUES (?, ?)", arguments: [name, Data(value)])
            }
        }
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
        for attempt in 0..<2 {
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
                throw .database(
                    "the write-ahead log \(path)-wal holds commits that cannot be read without \(path)-shm in a directory that cannot be written; mount the container once where it can be written"
                )
            }
            return path
        }
        // Debian's SQLite takes URI file names (SQLITE_USE_URI); GRDB does not pass SQLITE_OPEN_URI.
        guard sqlite3_compileoption_used("USE_URI") != 0,
            let escaped = path.addingPercentEncoding(withAllowedCharacters: .urlPathAllowed.subtracting(CharacterSet(charactersIn: "?#%")))
        else {
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

    /// Folds the WAL back into the database file and closes. Later calls do nothing. A store closed
    /// cleanly leaves only `store.db` (a sync tool then uploads one file): the WAL when it is empty,
    /// the `-shm` kept for reading a crash's WAL, and the space reserve go.
    public func close() {
        guard !closed.exchange(true, ordering: .acquiringAndReleasing) else { return }
        checkpointer?.stop()
        checkpointer = nil
        mappedReaders.closeAll()
        preadReaders.closeAll()
        segments.closeAppender()
        segments.forgetAll()
        var folded = false
        // A snapshot's read transaction (beginSnapshot) ends here.
        if readOnly { try? pool.writeWithoutTransaction { db in if db.isInsideTransaction { try db.execute(sql: "ROLLBACK") } } }
        if writing { folded = (try? pool.writeWithoutTransaction { try $0.checkpoint(.truncate) }) != nil }
        try? pool.close()
        guard writing else { return }
        reserve?.remove()
        if folded, walSize() == 0 {
            unlink(path + "-wal")
            unlink(path + "-shm")
        }
    }

    /// Bytes on disk of the database, its WAL and its segments.
    public var sizeOnDisk: UInt64? { Self.sizeOnDisk(path: path) }

    /// The store file and its WAL, in bytes, and the space its segments take (also of a store another
    /// process holds).
    public static func sizeOnDisk(path: String) -> UInt64 {
        let files = [path, path + "-wal"].reduce(UInt64(0)) { total, p in
            var st = stat()
            return total + (stat(p, &st) == 0 ? UInt64(st.st_size) : 0)
        }
        return files + Segments.allocatedBytes(directory: (path as NSString).deletingLastPathComponent + "/" + Segments.directoryName)
    }
}
