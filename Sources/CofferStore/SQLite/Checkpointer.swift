import Foundation
import GRDB
import GRDBSQLite

/// Folds the WAL back into the database file on a dedicated connection and thread.
///
/// Policy (docs/MEASUREMENTS.md): checkpoint once the writer has been quiet for `idle`, or at once
/// when the WAL outgrows `limit` or a quarter of the disk's free space (a checkpoint needs room
/// for the database file to take in what the WAL holds, so a filling disk makes it eager), or when
/// the store hit a full disk. A streaming write then costs one write of its data (into the
/// WAL) while it runs; the copy into the database file happens when the disk is free. SQLite lets a
/// passive checkpoint run beside the writer, so even a forced one does not stall commits. A quiet
/// checkpoint that folded everything in also cuts the WAL file to nothing (`truncateIfIdle`).
final class Checkpointer: @unchecked Sendable {
    private let condition = NSCondition()
    private var lastActivity = ContinuousClock.now
    private var pendingFrames = false
    /// A checkpoint ran before the writer went quiet (the WAL outgrew `limit`): the WAL file is still at its
    /// largest, so a quiet pass must come to cut it, even if nothing is committed after (issue 19: five
    /// seconds after a 1 GiB write the container still held it twice, WAL and database file).
    private var foldedWhileBusy = false
    private var urgent = false
    private var stopping = false
    private var finished = false
    private let queue: DatabaseQueue?
    private let walPath: String
    private let idle: Duration
    private let limit: Int64

    init(path: String, idle: Duration = .seconds(1), limit: Int64 = 1 << 30) {
        walPath = path + "-wal"
        self.idle = idle
        self.limit = limit
        var config = Configuration()
        config.busyMode = .timeout(10)
        queue = try? DatabaseQueue(path: path, configuration: config)
        let thread = Thread { [self] in run() }
        thread.name = "coffer-checkpoint"
        thread.start()
    }

    /// Called after each commit: there are frames to fold in.
    func committed() {
        condition.lock()
        pendingFrames = true
        lastActivity = .now
        condition.signal()
        condition.unlock()
    }

    /// Checkpoint now (the disk filled up): committed frames move into the database file, and the
    /// WAL can start over in the space it already has.
    func checkpointSoon() {
        condition.lock()
        pendingFrames = true
        urgent = true
        condition.signal()
        condition.unlock()
    }

    /// Waits for a running checkpoint to end; the thread exits.
    func stop() {
        condition.lock()
        stopping = true
        condition.broadcast()
        while !finished { condition.wait() }
        condition.unlock()
        try? queue?.close()
    }

    private func walSize() -> Int64 {
        var st = stat()
        return stat(walPath, &st) == 0 ? Int64(st.st_size) : 0
    }

    private func freeSpace() -> Int64 {
        var st = statvfs()
        return statvfs(walPath, &st) == 0 ? Int64(st.f_bavail) * Int64(st.f_frsize) : Int64.max
    }

    /// Cuts the WAL file to nothing once everything in it is in the database file and the writer is
    /// quiet: SQLite otherwise keeps the file at its largest until the next write wraps it (and then
    /// at `journal_size_limit`), so after an untar the container held the tree twice while mounted
    /// (issue 19: store.db 441 MB and store.db-wal 504 MB). TRUNCATE waits for the writer's open
    /// transaction; it is given 50 ms, and a writer that comes meanwhile wins (the next quiet moment
    /// tries again).
    private static func truncateIfIdle(_ db: Database) {
        sqlite3_busy_timeout(db.sqliteConnection, 50)
        defer { sqlite3_busy_timeout(db.sqliteConnection, 10_000) }
        _ = try? db.checkpoint(.truncate)
    }

    private func run() {
        while true {
            condition.lock()
            while !pendingFrames && !foldedWhileBusy && !stopping { condition.wait() }
            if stopping {
                finished = true
                condition.broadcast()
                condition.unlock()
                return
            }
            let quietFor = ContinuousClock.now - lastActivity
            let wal = walSize()
            let quiet = !urgent && quietFor >= idle
            let overLimit = pendingFrames && !urgent && wal >= limit
            let due = quiet || (pendingFrames && (urgent || wal >= limit || wal >= freeSpace() / 4))
            let cutDue = quiet && foldedWhileBusy
            if due {
                pendingFrames = false
                urgent = false
                // Only a fold forced by the size asks for a later cut: after a full disk's (urgent) one the WAL
                // starts over in the space it has (checkpointSoon).
                foldedWhileBusy = !quiet && overLimit
            }
            condition.unlock()
            if due {
                _ = try? queue?.writeWithoutTransaction { db in
                    let folded = try db.checkpoint(.passive)
                    if quiet, folded.checkpointedFrameCount == folded.walFrameCount, walSize() > 0 { Self.truncateIfIdle(db) }
                }
                if cutDue, walSize() > 0 {
                    // A reader's snapshot kept frames in, or the writer came within the cut's 50 ms: try again
                    // after another quiet `idle`, unless a commit has set off its own pass meanwhile.
                    condition.lock()
                    if !pendingFrames {
                        foldedWhileBusy = true
                        lastActivity = .now
                    }
                    condition.unlock()
                }
            } else {
                condition.lock()
                _ = condition.wait(until: Date(timeIntervalSinceNow: 0.25))
                condition.unlock()
            }
        }
    }
}
