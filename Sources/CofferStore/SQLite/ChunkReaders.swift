import CMappedFault
import GRDB
import GRDBSQLite
import Glibc
import Synchronization

/// The content hot path on SQLite's C API: reads step a prepared statement and hand the sealed bytes
/// to the caller straight from SQLite's buffer, writes bind the sealed bytes without copying.
/// GRDB's row and pool machinery cost more than the query itself here (docs/MEASUREMENTS.md).
enum RawSQLite {
    /// Steps `stmt` (bound by the caller; columns idx, value, seg, off, len) and calls `body` for each
    /// row with its sealed bytes: the row's value, or the range of a segment file it points at.
    /// `heldInRow` learns the length of each value read from the row itself (what a mapping pages in).
    static func forEachRow(
        _ stmt: OpaquePointer, segments: Segments?, mapping: Bool = true, heldInRow: (Int) -> Void = { _ in },
        _ body: (UInt64, UnsafeRawBufferPointer) throws -> Void
    ) throws {
        defer { sqlite3_reset(stmt) }
        while true {
            let rc = sqlite3_step(stmt)
            if rc == SQLITE_DONE { return }
            guard rc == SQLITE_ROW else { throw StoreError.sqlite(code: rc, stmt) }
            let idx = UInt64(bitPattern: sqlite3_column_int64(stmt, 0))
            if let segments, sqlite3_column_type(stmt, 2) != SQLITE_NULL {
                try segments.read(
                    sqlite3_column_int64(stmt, 2), offset: sqlite3_column_int64(stmt, 3), length: sqlite3_column_int64(stmt, 4), mapping: mapping
                ) {
                    try body(idx, $0)
                }
                continue
            }
            let n = Int(sqlite3_column_bytes(stmt, 1))
            heldInRow(n)
            guard let p = sqlite3_column_blob(stmt, 1) else {
                try body(idx, UnsafeRawBufferPointer(start: nil, count: 0))
                continue
            }
            try body(idx, UnsafeRawBufferPointer(start: p, count: n))
        }
    }

    static func bindRange(_ stmt: OpaquePointer, file: UInt64, first: UInt64, last: UInt64) {
        sqlite3_reset(stmt)
        sqlite3_bind_int64(stmt, 1, Int64(bitPattern: file))
        sqlite3_bind_int64(stmt, 2, Int64(bitPattern: first))
        sqlite3_bind_int64(stmt, 3, Int64(bitPattern: last))
    }
}

/// A small pool of read-only connections for content reads that need no uncommitted data, so
/// several FUSE threads read (and then decrypt) at once.
///
/// A pool made with `maps` maps the whole database file: memory-mapped I/O spares a pread and a copy per
/// page (reading every file of the benchmark tree took 2.25 s instead of 2.46 s with the first
/// 64 MiB mapped and 2.56 s with none, docs/MEASUREMENTS.md). Every page read through a mapping
/// counts in the daemon's resident size, although it is only page cache, so a connection maps the
/// file afresh once it has read `remapAfter` bytes. A remap costs about 2 ms (munmap) and the page
/// faults after it, which made random 4 KiB reads in a large file a fifth slower: the store sends
/// only the first chunks of each file through the mapped pool (`SQLiteBackend.forEachChunk`).
final class ChunkReaders: @unchecked Sendable {
    static func rangeQuery(_ columns: String) -> String {
        "SELECT \(columns) FROM chunks WHERE file = ? AND idx BETWEEN ? AND ? ORDER BY idx"
    }
    /// A store made before segments, opened read-only, has no segment columns.
    static let selectRange = rangeQuery("idx, value, seg, off, len"), selectRangeWithoutSegments = rangeQuery("idx, value, NULL, NULL, NULL")
    /// The mapping asked for, and the other size a remap switches to (below SQLITE_MAX_MMAP_SIZE,
    /// 2 GiB less 64 KiB by default, which would cap both to one value; pages beyond are read with pread).
    static let mapLimit: Int64 = 2047 << 20, otherMapLimit: Int64 = 2046 << 20
    static let remapAfter = 8 << 20

    final class Connection {
        let db: OpaquePointer
        let select: OpaquePointer
        /// Bytes read through the current mapping.
        var bytesSinceMap = 0
        private var limit = ChunkReaders.mapLimit
        init(db: OpaquePointer, select: OpaquePointer) {
            self.db = db
            self.select = select
        }
        deinit {
            sqlite3_finalize(select)
            sqlite3_close_v2(db)
        }

        /// A new limit makes SQLite unmap the file and map it again, untouched (the call writes the
        /// old limit back into its argument, hence the copy).
        func remapIfDue() -> Bool {
            guard bytesSinceMap >= ChunkReaders.remapAfter else { return false }
            bytesSinceMap = 0
            limit = limit == ChunkReaders.mapLimit ? ChunkReaders.otherMapLimit : ChunkReaders.mapLimit
            var argument = limit
            return sqlite3_file_control(db, "main", SQLITE_FCNTL_MMAP_SIZE, &argument) == SQLITE_OK
        }
    }

    private let path: String
    private let maps: Bool
    /// Where rows that hold no bytes point (set once, before the first read).
    var segments: Segments?
    /// Remaps so far (tests look).
    let remaps = Atomic<Int>(0)
    private var idle: [Connection] = []
    private var lock = pthread_mutex_t()

    init(path: String, maps: Bool) {
        self.path = path
        // Only with the SIGBUS guard: a store truncated under the mapping (by another process) must make
        // the read fail, not kill the daemon (the handler maps zeros over the lost page; SQLite reports it
        // damaged).
        self.maps = maps && coffer_mapped_fault_install() == 0
        pthread_mutex_init(&lock, nil)
    }

    /// Pages past the end of a truncated store that the SIGBUS guard replaced with zeros, in this process.
    static var faultsRepaired: Int { Int(coffer_mapped_fault_count()) }
    deinit { pthread_mutex_destroy(&lock) }

    func with<T>(_ body: (Connection) throws -> T) throws -> T {
        pthread_mutex_lock(&lock)
        let reused = idle.popLast()
        pthread_mutex_unlock(&lock)
        let connection = try reused ?? open()
        defer {
            if maps, connection.remapIfDue() { remaps.add(1, ordering: .relaxed) }
            pthread_mutex_lock(&lock)
            if idle.count < 8 { idle.append(connection) }
            pthread_mutex_unlock(&lock)
        }
        return try body(connection)
    }

    /// Closes the idle connections (at store close).
    func closeAll() {
        pthread_mutex_lock(&lock)
        idle.removeAll()
        pthread_mutex_unlock(&lock)
    }

    private func open() throws -> Connection {
        var db: OpaquePointer?
        let rc = sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY | SQLITE_OPEN_NOMUTEX, nil)
        guard rc == SQLITE_OK, let db else {
            if let db { sqlite3_close_v2(db) }
            throw StoreError.database("cannot open a reader: SQLite error \(rc)")
        }
        sqlite3_busy_timeout(db, 10_000)
        sqlite3_exec(db, "PRAGMA mmap_size = \(maps ? Self.mapLimit : 0)", nil, nil, nil)
        var stmt: OpaquePointer?
        let prepared = [Self.selectRange, Self.selectRangeWithoutSegments].contains { (sql: String) -> Bool in
            sqlite3_prepare_v3(db, sql, -1, UInt32(SQLITE_PREPARE_PERSISTENT), &stmt, nil) == SQLITE_OK
        }
        guard prepared, let stmt else {
            sqlite3_close_v2(db)
            throw StoreError.database("cannot prepare the chunk reader")
        }
        return Connection(db: db, select: stmt)
    }
}
