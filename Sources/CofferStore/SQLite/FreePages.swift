import GRDB

/// Giving the pages of deleted content back to the disk.
///
/// SQLite keeps a deleted row's pages on its freelist and the database file never shrinks; later
/// inserts take free pages wherever they lie, so a tree written after a large delete is scattered over
/// the file (reading every file of the benchmark corpus took 3.0–3.5 s instead of 2.6 s,
/// docs/MEASUREMENTS.md). Stores are created with `auto_vacuum = INCREMENTAL`, and while the
/// filesystem is quiet the free pages beyond a margin are removed a piece at a time
/// (`PRAGMA incremental_vacuum`): SQLite moves pages from the end of the file into free slots and
/// cuts the end off, so the file shrinks at the next checkpoint and new content is appended in order.
/// The margin keeps a little room for files that are rewritten in place over and over.
extension SQLiteBackend {
    /// Free pages kept for reuse: a sixteenth of the file, and at least 8 MiB.
    func freePagesToKeep(pageCount: Int) -> Int { max(pageCount / 16, (8 << 20) / pageSize) }

    /// Removes up to `limit` free pages beyond the margin, inside the group transaction. Returns how
    /// many (0: nothing to give back, a store made before incremental vacuum, a read-only store, or a
    /// disk short of space, where the moved pages' WAL frames would need room the disk may not have).
    ///
    /// The pieces are small because each holds the writer, which lookups wait for, and a free page at the
    /// end of the file costs SQLite a walk through the freelist: after `rm` of 1 GiB, pieces of 256 pages
    /// made ~70 lookups wait over 20 ms (p99 25 ms); pieces of 32, two (p99 4.7 ms), in the same total
    /// time (docs/MEASUREMENTS.md).
    public func reclaimSpace(limit: Int) throws(StoreError) -> Int {
        guard !readOnly, vacuumsIncrementally, !isLowOnSpace() else { return 0 }
        let excess = try writer { db in
            let free = try Int.fetchOne(db, sql: "PRAGMA freelist_count") ?? 0
            let pages = try Int.fetchOne(db, sql: "PRAGMA page_count") ?? 0
            return free - freePagesToKeep(pageCount: pages)
        }
        guard excess > 0 else { return 0 }
        let n = min(limit, excess)
        try write(bytes: n * pageSize) { db in try db.execute(sql: "PRAGMA incremental_vacuum(\(n))") }
        return n
    }

    /// Pages on the freelist (committed or not), and all pages.
    public func pageCounts() throws(StoreError) -> (free: Int, total: Int) {
        try writer { db in
            (try Int.fetchOne(db, sql: "PRAGMA freelist_count") ?? 0, try Int.fetchOne(db, sql: "PRAGMA page_count") ?? 0)
        }
    }
}
