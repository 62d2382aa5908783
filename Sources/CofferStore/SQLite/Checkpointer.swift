import Foundation
import GRDB

/// Folds the WAL back into the database file on a dedicated connection and thread.
///
/// Policy (docs/MEASUREMENTS.md): checkpoint once the writer has been quiet for `idle`, or at once
/// when the WAL outgrows `limit` or a quarter of the disk's free space (a checkpoint needs room
/// for the database file to take in what the WAL holds, so a filling disk makes it eager), or when
/// the store hit a full disk. A streaming write then costs one write of its data (into the
/// WAL) while it runs; the copy into the database file happens when the disk is free. SQLite lets a
/// passive checkpoint run beside the writer, so even a forced one does not stall commits.
final class Checkpointer: @unchecked Sendable {
    private let condition = NSCondition()
    private var lastActivity = ContinuousClock.now
    private var pendingFrames = false
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

    private func run() {
        while true {
            condition.lock()
            while !pendingFrames && !stopping { condition.wait() }
            if stopping {
                finished = true
                condition.broadcast()
                condition.unlock()
                return
            }
            let quietFor = ContinuousClock.now - lastActivity
            let wal = walSize()
            let due = urgent || quietFor >= idle || wal >= limit || wal >= freeSpace() / 4
            if due {
                pendingFrames = false
                urgent = false
            }
            condition.unlock()
            if due {
                _ = try? queue?.writeWithoutTransaction { try $0.checkpoint(.passive) }
            } else {
                condition.lock()
                _ = condition.wait(until: Date(timeIntervalSinceNow: 0.25))
                condition.unlock()
            }
        }
    }
}
