import Foundation
import Glibc
import GRDB
import GRDBSQLite

/// The group transaction on the writer connection: one transaction stays open across many calls
/// and is committed in groups; a full disk is survived by giving the reserve back, folding the WAL
/// in and refusing to grow the file into space that is not there.
extension SQLiteBackend {
    /// Runs `body` on the writer connection inside the open group transaction (begun here when
    /// none is open). `bytes` is what the statement adds to the WAL (0 and no `outsideWAL`: a delete),
    /// `outsideWAL` what it appends to segment files; `file` marks content whose reads must go through
    /// the writer until the commit.
    func write<T>(bytes: Int = 0, outsideWAL: Int = 0, file: UInt64? = nil, _ body: (Database) throws -> T) throws(StoreError) -> T {
        guard !readOnly else { throw .readOnly }
        return try writer { db in
            if !db.isInsideTransaction {
                try db.execute(sql: "PRAGMA cache_size = -\(Self.writerCacheKiB)")
                try db.execute(sql: "BEGIN IMMEDIATE")
                pending.withLock { $0.since = .now }
            }
            let result = try body(db)
            pending.withLock { p in
                p.changes += 1
                p.bytes += bytes
                p.segmentBytes += outsideWAL
                if bytes == 0 && outsideWAL == 0 { p.deletes += 1 }
                if let file { p.dirtyFiles.insert(file) }
            }
            return result
        }
    }

    private func currentBatchDatabase() -> Database? {
        batchLock.lock()
        defer { batchLock.unlock() }
        guard let t = batchThread, pthread_equal(t, pthread_self()) != 0 else { return nil }
        return batchDatabase
    }

    public func batch<T>(_ body: () throws -> T) throws -> T {
        if currentBatchDatabase() != nil { return try body() }
        // The body's own errors (e.g. EEXIST from the filesystem) come back unchanged, after the
        // check that SQLite did not drop the transaction under it.
        var bodyError: (any Error)?
        let result: T? = try writer { db in
            batchLock.lock()
            batchThread = pthread_self()
            batchDatabase = db
            batchLock.unlock()
            defer {
                batchLock.lock()
                batchThread = nil
                batchDatabase = nil
                batchLock.unlock()
            }
            do { return try body() } catch {
                bodyError = error
                return nil
            }
        }
        if let bodyError { throw bodyError }
        guard let result else { throw StoreError.database("batch produced no result") }
        return result
    }

    /// Runs `body` on the writer connection (sees uncommitted changes). Every error leaves here as
    /// a `StoreError` (one mapping, `StoreError.sqlite`), and a transaction SQLite rolled back by
    /// itself (a full disk, an I/O error, RAISE(ROLLBACK)) is noticed on every path, batched or not.
    func writer<T>(_ body: (Database) throws -> T) throws(StoreError) -> T {
        if let db = currentBatchDatabase() { return try run(body, on: db) }
        do {
            return try pool.writeWithoutTransaction { db throws(StoreError) in try run(body, on: db) }
        } catch let e as StoreError {
            throw e
        } catch { throw StoreError.sqlite(error) }
    }

    private func run<T>(_ body: (Database) throws -> T, on db: Database) throws(StoreError) -> T {
        let result: T
        do { result = try body(db) } catch {
            let e = StoreError.sqlite(error)
            noticeDroppedTransaction(db, e)
            if e == .diskFull, !(error is NoRoomToGrow) { reserve?.release() }
            throw e
        }
        noticeDroppedTransaction(db, .database("SQLite ended the transaction"))
        return result
    }

    /// SQLite ends a transaction by itself on some errors; the group it held is gone.
    private func noticeDroppedTransaction(_ db: Database, _ error: StoreError) {
        if !db.isInsideTransaction, pending.withLock({ $0.since != nil }) { droppedTransaction(error) }
    }

    public func dropOpenGroup(_ error: StoreError) {
        let rollback: (Database) throws -> Void = { db in if db.isInsideTransaction { try db.execute(sql: "ROLLBACK") } }
        if let db = currentBatchDatabase() { try? rollback(db) } else { try? pool.writeWithoutTransaction(rollback) }
        droppedTransaction(error)
    }

    /// Rolls the open group back without telling anyone: its owner closes the store next (a repair pass that failed).
    public func rollBackOpenGroup() {
        try? pool.writeWithoutTransaction { db in if db.isInsideTransaction { try db.execute(sql: "ROLLBACK") } }
        pending.withLock { $0.clearTransaction() }
        segmentsRolledBack()
    }

    func droppedTransaction(_ error: StoreError) {
        pending.withLock { $0.clearTransaction() }
        segmentsRolledBack()
        checkpointer?.checkpointSoon()
        onRollback?(error)
    }

    /// Commits everything written so far in one atomic commit, with the sealed store state. With
    /// `durable` (fsync, fsyncdir, unmount) it returns only once this commit and every earlier one
    /// are on disk; a group commit (`durable: false`) leaves the syncing to the next durable commit
    /// or checkpoint.
    public func commit(durable: Bool, state: () throws(StoreError) -> [UInt8]) throws(StoreError) -> Bool {
        guard !readOnly else { return false }
        let committed = try writer { db in
            var committed = false
            if db.isInsideTransaction {
                let sealed = try state()
                let low = isLowOnSpace()
                let freed: FreedSegmentSpace
                do {
                    try db.execute(sql: "INSERT OR REPLACE INTO coffer_meta(name, value) VALUES ('state', ?)", arguments: [Data(sealed)])
                    freed = try segmentsBeforeCommit(db)
                    if low {
                        try refuseGrowthWithoutRoom(db)
                        releaseReserveIfWALCannotGrow()
                    }
                    try db.execute(sql: "COMMIT")
                    try? db.execute(sql: "PRAGMA cache_size = -\(Self.idleWriterCacheKiB)")
                } catch {
                    if db.isInsideTransaction { try? db.execute(sql: "ROLLBACK") }
                    try? db.execute(sql: "PRAGMA cache_size = -\(Self.idleWriterCacheKiB)")
                    droppedTransaction(StoreError.sqlite(error))
                    if (error as? DatabaseError)?.resultCode == .SQLITE_FULL { makeRoom(db) }
                    throw error
                }
                pending.withLock { p in
                    p.clearTransaction()
                    p.unsynced = true
                }
                committed = true
                // Freed segment space goes only once no state the disk may still come back to names it.
                if segmentsCommitted(freed) { pending.withLock { $0.unsynced = false } }
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
            return committed
        }
        checkpointer?.committed()
        return committed
    }

    /// fsync of the WAL file: every frame committed so far reaches the disk (what SQLite's
    /// synchronous = FULL does at each commit). Called on the writer, so no commit runs meanwhile.
    func syncWAL() throws(StoreError) {
        let fd = Glibc.open(path + "-wal", O_RDONLY | O_CLOEXEC)
        // No WAL file: nothing was committed since the last checkpoint, which synced the database.
        guard fd >= 0 else {
            let e = errno
            if e == ENOENT { return }
            throw .database("WAL: \(String(cString: strerror(e)))")
        }
        defer { Glibc.close(fd) }
        guard fsync(fd) == 0 else {
            let e = errno
            if e == ENOSPC || e == EDQUOT { throw .diskFull }
            throw .database("fsync of the WAL: \(String(cString: strerror(e)))")
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

    /// On a disk this full the commit's WAL frames may not fit: the reserve goes back to the disk before the
    /// COMMIT, not after it failed. SQLite rolls a transaction back whole when its COMMIT cannot write the
    /// WAL, so the group would be lost, and with it, on a full disk, the very unlink meant to free space
    /// (a killed daemon's container remounted with not one byte free kept its deleted file in 6 rounds of 13
    /// under load: the WAL it had left held 8 frames, the unlink's commit needed 9). The estimate does not
    /// count on the WAL's length (frames go after the old ones when a checkpoint could not finish) and counts
    /// a page per delete: when in doubt the reserve goes, which on a disk this full is what it is for. The
    /// space stays owed (`refuseGrowthWithoutRoom` lets no commit grow the database file into it).
    private func releaseReserveIfWALCannotGrow() {
        guard let reserve, reserve.isHeld else { return }
        let (bytes, deletes) = pending.withLock { ($0.bytes, $0.deletes) }
        if Int64(bytes) + Int64(16 + deletes) * Int64(pageSize) > freeSpace() { reserve.release() }
    }

    /// Bytes appended to segments count this much less toward a group's volume than rows: they need no
    /// room in the writer's page cache (what the volume bounds), and each commit costs an fdatasync of
    /// them. Streaming 1 GiB: 271-311 MB/s against 227-254 with every byte counted (docs/MEASUREMENTS.md).
    static let segmentBytesPerGroupByte = 4

    /// True when the open transaction is older than `age` or holds more than `volume` bytes of rows
    /// (segment bytes count a quarter), or
    /// more than an eighth of the disk's free space (a filling disk commits in smaller groups).
    ///
    /// Deletes add no bytes but dirty pages all the same (332 unlinks in one group dirtied from 21
    /// to more than the 145 pages a 2.4 MB WAL holds, depending on the order), and a full disk has no room for a WAL
    /// longer than the one it has. So when space is short, deletes commit in pieces, each small
    /// enough (a page per statement, against half the WAL's length plus the free space) to be
    /// written over the WAL from its start once the previous piece was checkpointed.
    public func isCommitDue(age: Duration, volume: Int) -> Bool {
        guard
            let (since, bytes, grouped, deletes, look) = pending.withLock({ p -> (ContinuousClock.Instant, Int, Int, Int, Bool)? in
                guard let since = p.since else { return nil }
                // Called on every write and unlink: look at the disk (statvfs, stat) once per MiB
                // written or 32 deletes more, not on each call.
                let bytes = p.bytes + p.segmentBytes
                let step = bytes >> 20 + p.deletes / 32
                defer { p.probed = step }
                return (since, bytes, p.bytes + p.segmentBytes / Self.segmentBytesPerGroupByte, p.deletes, step != p.probed)
            })
        else { return false }
        if grouped >= volume || ContinuousClock.now - since >= age { return true }
        guard look else { return false }
        if bytes >= 1 << 20 && Int64(bytes) >= freeSpace() / 8 { return true }
        guard deletes >= 32 else { return false }
        let room = walSize() + freeSpace() - (reserve?.owed ?? 0)
        return isLowOnSpace() && Int64(deletes) * Int64(pageSize) >= room / 2
    }

    /// Free space less the released reserve (owed to deletes and checkpoints) and the rows waiting in the
    /// open group (the database file or the WAL may grow by them at its commit). A chunk shorter than the
    /// segment threshold is a row and may also take the database's free pages (deleted small files leave
    /// those, not free space on the disk): counted, on the writer, only when the disk alone is short.
    public func hasRoom(forWrite bytes: Int, more: Int64) -> Bool {
        let needed = Int64(bytes) + more
        let room = freeSpace() - (reserve?.owed ?? 0) - Int64(pending.withLock { $0.bytes })
        if room >= needed { return true }
        guard !hasSegments || bytes < segmentThreshold, let free = try? pageCounts().free else { return false }
        return room + Int64(free) * Int64(pageSize) >= needed
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
}

/// Thrown by `refuseGrowthWithoutRoom`: reported as a full disk, without releasing the reserve.
struct NoRoomToGrow: Error {}
