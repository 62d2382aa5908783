import Foundation

/// A file lock's type: shared (F_RDLCK, LOCK_SH) or exclusive (F_WRLCK, LOCK_EX).
public enum FileLockType: Int32, Sendable {
    case read = 0
    case write = 1
}

/// Which lock space: POSIX record locks (fcntl, lockf, OFD locks) or flock(2) locks, which never
/// conflict with each other (as on Linux).
public enum FileLockKind: Int32, Sendable {
    case posix = 0
    case flock = 1
}

/// A range of bytes `start...end` (inclusive; `end == FileLockRange.toEnd` reaches past any end of file)
/// locked with one type.
public struct FileLockRange: Sendable, Equatable, CustomStringConvertible {
    public static let toEnd = Int64.max
    public var type: FileLockType
    public var start: Int64
    public var end: Int64

    public init(_ type: FileLockType, _ start: Int64, _ end: Int64) {
        self.type = type
        self.start = start
        self.end = end
    }

    public func overlaps(_ start: Int64, _ end: Int64) -> Bool { self.start <= end && start <= self.end }
    public var description: String { "\(type == .read ? "R" : "W")\(start)-\(end == Self.toEnd ? "EOF" : String(end))" }

    /// One owner's ranges after `start...end` is set to `type` (nil: unlocked), as fcntl(F_SETLK) does:
    /// the new range replaces what it covers (a range it cuts is split), and touching or overlapping
    /// ranges of one type are merged. The result is sorted by start, without overlaps.
    public static func applying(_ held: [FileLockRange], type: FileLockType?, start: Int64, end: Int64) -> [FileLockRange] {
        var out: [FileLockRange] = []
        for r in held {
            guard r.overlaps(start, end) else {
                out.append(r)
                continue
            }
            if r.start < start { out.append(FileLockRange(r.type, r.start, start - 1)) }
            if r.end > end { out.append(FileLockRange(r.type, end + 1, r.end)) }
        }
        if let type { out.append(FileLockRange(type, start, end)) }
        out.sort { $0.start < $1.start }
        var merged: [FileLockRange] = []
        for r in out {
            if var last = merged.last, last.type == r.type, last.end != toEnd, last.end + 1 >= r.start {
                last.end = max(last.end, r.end)
                merged[merged.count - 1] = last
            } else {
                merged.append(r)
            }
        }
        return merged
    }
}

/// A lock that keeps a request out: its range, type and process (the pid on the holder's machine;
/// 0 when that machine is another host, where the pid means nothing here).
public struct FileLockConflict: Sendable, Equatable {
    public let range: FileLockRange
    public let pid: Int32
}

/// File locks shared by every mount of a PostgreSQL container (docs/FORMAT.md, "locks"): one row per
/// locked range of a lock owner (the kernel's `lock_owner`) of a mount (its lease holder id). Each
/// change is one transaction under the container's lock-table advisory lock (its own key space: a lock
/// never waits for a commit, nor a commit for a lock), decided against the rows of holders whose lease
/// lives; rows of lapsed or removed leases are deleted on the way. A dedicated connection, one
/// operation at a time; nothing here ever waits for a lock (the caller retries).
public final class PostgresLocks: @unchecked Sendable {
    public let holder: String
    private let location: PostgresLocation
    private let sql: PostgresSQL
    private let host = PostgresLease.hostName()
    private let lock = NSLock()
    private var connection: PGConnection?

    /// Opens the connection and makes the table when the container predates it.
    public init(_ location: PostgresLocation, holder: String) throws {
        self.location = location
        self.holder = holder
        sql = PostgresSQL(schema: location.container)
        let c = try PGConnection(location.conninfo)
        do { try c.executeScript(sql.createLocks) } catch {
            c.close()
            throw error
        }
        connection = c
    }

    /// Sets `start...end` of `owner`'s locks on `inode` to `type` (nil: unlocks it) unless a lock of
    /// another owner (of any mount) conflicts: then nothing changes and that lock is returned.
    /// flock locks take the whole file (`start` 0, `end` toEnd). Returns whether `owner` still holds
    /// anything on the inode in `held`.
    public func set(
        inode: Int64, kind: FileLockKind, owner: Int64, type: FileLockType?, start: Int64, end: Int64, pid: Int32
    ) throws -> (conflict: FileLockConflict?, held: Bool) {
        try run { c in
            let rows = try self.rows(c, inode: inode, kind: kind)
            var mine: [FileLockRange] = []
            var rowPid = pid
            for r in rows {
                if r.holder == holder && r.owner == owner {
                    mine.append(r.range)
                    if pid == 0 { rowPid = r.storedPid }  // an unlock carries no pid: the holder's stays
                } else if let type, r.range.overlaps(start, end), type == .write || r.range.type == .write {
                    return (FileLockConflict(range: r.range, pid: r.pid), rowsOf(rows, owner))
                }
            }
            let next = FileLockRange.applying(mine, type: type, start: start, end: end)
            guard next != mine else { return (nil, !next.isEmpty) }
            try c.execute(sql.deleteOwnerLocks, [.int8(inode), .int4(kind.rawValue), .text(holder), .int8(owner)], prepared: true)
            for r in next {
                try c.execute(
                    sql.putLock,
                    [
                        .int8(inode), .int4(kind.rawValue), .text(holder), .int8(owner), .int4(r.type.rawValue), .int8(r.start), .int8(r.end),
                        .int4(rowPid)
                    ],
                    prepared: true)
            }
            return (nil, !next.isEmpty)
        }
    }

    /// The lock of another owner that would keep `type` on `start...end` out (F_GETLK), nil when none.
    public func test(inode: Int64, kind: FileLockKind, owner: Int64, type: FileLockType, start: Int64, end: Int64) throws -> FileLockConflict? {
        try run { c in
            try self.rows(c, inode: inode, kind: kind).first {
                !($0.holder == holder && $0.owner == owner) && $0.range.overlaps(start, end) && (type == .write || $0.range.type == .write)
            }.map { FileLockConflict(range: $0.range, pid: $0.pid) }
        }
    }

    /// Removes every lock of this mount (unmount). Rows of a mount that ends without this go when its
    /// lease does.
    public func releaseAll() {
        lock.lock()
        defer { lock.unlock() }
        guard let c = connection else { return }
        if !c.isAlive { try? c.reconnect(within: 2) }
        _ = try? c.execute(sql.deleteHolderLocks, [.text(holder)])
    }

    /// Ends the connection; every later call throws.
    public func close() {
        lock.lock()
        defer { lock.unlock() }
        connection?.close()
        connection = nil
    }

    private func rowsOf(_ rows: [Row], _ owner: Int64) -> Bool { rows.contains { $0.holder == holder && $0.owner == owner } }

    private struct Row {
        let holder: String, owner: Int64, range: FileLockRange, pid: Int32, storedPid: Int32
    }

    private func rows(_ c: PGConnection, inode: Int64, kind: FileLockKind) throws -> [Row] {
        try c.execute(sql.dropLapsedLocks, [.int8(inode)], prepared: true)
        let r = try c.execute(sql.locksOfInode, [.int8(inode), .int4(kind.rawValue)], prepared: true)
        return try (0..<r.rowCount).map { i in
            let h = try r.text(i, 0) ?? ""
            let type: FileLockType = (try r.int64(i, 2) ?? 1) == 0 ? .read : .write
            // A row the server made up cannot make a range the kernel refuses (or a negative offset).
            let start = max(0, try r.int64(i, 3) ?? 0)
            let range = FileLockRange(type, start, max(start, try r.int64(i, 4) ?? FileLockRange.toEnd))
            let pid = Int32(truncatingIfNeeded: try r.int64(i, 5) ?? 0)
            let sameHost = (try r.text(i, 6)) == host
            return Row(holder: h, owner: try r.int64(i, 1) ?? 0, range: range, pid: sameHost ? pid : 0, storedPid: pid)
        }
    }

    /// One transaction under the lock-table lock, on a connection that reconnects (briefly) when lost.
    private func run<T>(_ body: (PGConnection) throws -> T) throws -> T {
        lock.lock()
        defer { lock.unlock() }
        guard let c = connection else { throw PGError(.usage, "the lock table's connection is closed") }
        if !c.isAlive { try c.reconnect(within: 1) }
        return try c.transaction { c in
            try c.execute(sql.locksLock, [.text(location.container)], prepared: true)
            return try body(c)
        }
    }
}
