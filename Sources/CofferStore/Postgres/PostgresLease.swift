import Foundation
import Glibc

/// Who uses a PostgreSQL container: a row per mount in the schema's `leases` table (a random holder
/// id, host name, pid, the machine's id, the purpose) until an expiry the server's clock sets. Any
/// number of mounts share a container (issue 17); `coffer fsck` takes it alone, so a mount is refused
/// while an fsck holds it and an fsck while any mount does. A database has no process to tie a lock
/// to, so each holder renews its row (`renew`, every `renewEvery` seconds) and a holder that is gone
/// lets it lapse; a dead process of this same machine (its pid is checked) lapses at once.
public final class PostgresLease: @unchecked Sendable {
    /// Who holds a container, for messages ("mounted by pid 12 on host").
    public struct Holder: Sendable, Equatable, CustomStringConvertible {
        public let holder: String, host: String, pid: Int32, machine: String, purpose: String
        /// Host and purpose come from the server: control characters (a terminal's escape sequences) are
        /// shown as `?`, so a hostile row cannot write to the terminal of whoever reads the message.
        public var description: String { "pid \(pid) on \(Self.printable(host)) (\(Self.printable(purpose)))" }
        static func printable(_ s: String) -> String {
            String(String.UnicodeScalarView(s.unicodeScalars.prefix(255).map { $0.properties.generalCategory == .control ? "?" : $0 }))
        }
        /// A holder of this machine whose process has ended: its lease can be taken over at once.
        public func isGone(machine: String) -> Bool { self.machine == machine && host == hostName() && !isAlive(pid) }
    }

    public enum Failure: Error, CustomStringConvertible {
        case held(Holder)
        /// The server cannot be reached (or the connection was lost): worth a retry.
        case unavailable(String)
        /// The server answered with an error (a missing table, a role without the right).
        case refused(String)
        public var description: String {
            switch self {
            case .held(let h): return "the container is already in use (\(h))"
            case .unavailable(let why), .refused(let why): return "cannot take the container's lease: \(why)"
            }
        }
    }

    /// How long a lease lasts without renewal: `COFFER_PG_LEASE_SECONDS` (tests), else 30 s.
    public static var duration: Int {
        ProcessInfo.processInfo.environment["COFFER_PG_LEASE_SECONDS"].flatMap(Int.init).map { max(2, $0) } ?? 30
    }
    /// Renewal period: a quarter of the duration, so three renewals can fail before the lease lapses.
    public static var renewEvery: Double { Double(duration) / 4 }

    public let location: PostgresLocation
    public let me: Holder
    private let connection: PGConnection
    private let sql: PostgresSQL
    private let lock = NSLock()
    private var released = false

    private init(_ location: PostgresLocation, me: Holder, connection: PGConnection) {
        self.location = location
        self.me = me
        self.connection = connection
        sql = PostgresSQL(schema: location.container)
    }

    /// Called when `renew` had to take the lease again (the mount joins again: `PostgresBackend.rejoin`).
    public var onRetaken: (@Sendable () -> Void)?

    /// Other live mounts when this lease was taken (a mount alone removes what crashed mounts left).
    public private(set) var othersAtStart = 0

    /// Takes a lease for this process (`purpose`: "mount", "fsck"), or throws `.held` naming a holder
    /// that excludes it (any live holder for an fsck, a live fsck for a mount). `machine`: this
    /// machine's id (`machineId(stateDirectory:)`).
    public static func take(_ location: PostgresLocation, purpose: String, machine: String) throws(Failure) -> PostgresLease {
        let me = Holder(holder: randomHex(16), host: hostName(), pid: getpid(), machine: machine, purpose: purpose)
        let c: PGConnection
        do { c = try PGConnection(location.conninfo) } catch {
            if let e = error as? PGError, e.loginRefused { throw .refused("\(error)") }
            throw .unavailable("\(error)")
        }
        let lease = PostgresLease(location, me: me, connection: c)
        // Containers made before several mounts were allowed get the table (a role that may not create it fails below).
        try? c.executeScript(lease.sql.createLeases)
        do {
            if let h = try lease.acquire() {
                c.close()
                throw Failure.held(h)
            }
        } catch let f as Failure { throw f } catch {
            c.close()
            if let e = error as? PGError, e.isConnectionLoss, !e.loginRefused { throw .unavailable("\(error)") }
            throw .refused("\(error)")
        }
        return lease
    }

    /// The live holders of a container (none when they cannot be read).
    public static func holders(_ location: PostgresLocation) -> [Holder] {
        guard let c = try? PGConnection(location.conninfo) else { return [] }
        defer { c.close() }
        let sql = PostgresSQL(schema: location.container)
        guard let r = try? c.execute(sql.leaseRows) else { return [] }
        return (0..<r.rowCount).compactMap { i in (try? r.bool(i, 5)) == true ? try? holder(r, i) : nil }
    }

    /// A live holder that keeps a new holder for `purpose` out, nil when there is none.
    public static func excluding(_ location: PostgresLocation, purpose: String, machine: String) -> Holder? {
        holders(location).first { !$0.isGone(machine: machine) && excludes($0, purpose) }
    }

    /// fsck runs alone; mounts share with each other but not with an fsck.
    static func excludes(_ h: Holder, _ purpose: String) -> Bool { purpose == "fsck" || h.purpose == "fsck" }

    /// One transaction, the table locked: lapsed rows and rows of this machine's dead processes
    /// removed, then ours added; the holder that keeps this process out when it may not.
    private func acquire() throws -> Holder? {
        try connection.transaction { c -> Holder? in
            try c.execute(sql.lockLeases)
            let r = try c.execute(sql.leaseRows)
            var others = 0
            for i in 0..<r.rowCount {
                let h = try Self.holder(r, i)
                guard h.holder != me.holder else { continue }
                let live = try r.bool(i, 5) ?? false
                // A lapsed row whose process still runs on this machine is a holder whose renewals are
                // late (a stuck server connection, a suspended machine): it still counts.
                let stillRunsHere = h.machine == me.machine && h.host == Self.hostName() && Self.isAlive(h.pid)
                if live ? h.isGone(machine: me.machine) : !stillRunsHere {
                    try c.execute(sql.deleteLease, [.text(h.holder)])
                    continue
                }
                if Self.excludes(h, me.purpose) { return h }
                others += 1
            }
            try c.execute(sql.putLease, params())
            othersAtStart = others
            return nil
        }
    }

    /// Extends the lease. The row is renewed whatever its expiry (a server that was away longer than
    /// the lease lost no holder); when it was removed meanwhile and an fsck now holds the container,
    /// throws `.held`.
    public func renew() throws(Failure) {
        lock.lock()
        defer { lock.unlock() }
        guard !released else { return }
        do {
            if !connection.isAlive { try connection.reconnect(within: 1) }
            if try connection.execute(sql.renewLease, [.text(me.holder), .int4(Int32(clamping: Self.duration))]).affectedRows == 1 { return }
            // The row lapsed and was removed (this machine was cut off longer than the lease): take it
            // again unless an fsck holds the container now, and have the mount announce itself again.
            if let h = try acquire() { throw Failure.held(h) }
            onRetaken?()
        } catch let f as Failure { throw f } catch { throw .unavailable("\(error)") }
    }

    /// Deletes the row (the next mount need not wait for the expiry) and ends the connection.
    public func release() {
        lock.lock()
        defer { lock.unlock() }
        guard !released else { return }
        released = true
        if !connection.isAlive { try? connection.reconnect(within: 5) }
        _ = try? connection.execute(sql.deleteLease, [.text(me.holder)])
        connection.close()
    }

    deinit { release() }

    private func params() -> [PGValue] {
        [.text(me.holder), .text(me.host), .int4(me.pid), .text(me.machine), .text(me.purpose), .int4(Int32(clamping: Self.duration))]
    }

    private static func holder(_ r: PGResult, _ row: Int) throws -> Holder {
        Holder(
            holder: try r.text(row, 0) ?? "", host: try r.text(row, 1) ?? "?", pid: Int32(truncatingIfNeeded: try r.int64(row, 2) ?? 0),
            machine: try r.text(row, 3) ?? "", purpose: try r.text(row, 4) ?? "mount")
    }

    /// A process of this machine that still runs (LocalProcess.isRunning).
    static func isAlive(_ pid: Int32) -> Bool { LocalProcess.isRunning(pid) }

    public static func hostName() -> String {
        var buf = [CChar](repeating: 0, count: 256)
        guard gethostname(&buf, 255) == 0 else { return "?" }
        return String(decoding: buf.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }

    static func randomHex(_ bytes: Int) -> String {
        var g = SystemRandomNumberGenerator()
        return (0..<bytes).map { _ in String(format: "%02x", UInt8.random(in: 0...255, using: &g)) }.joined()
    }

    /// This machine's id for leases: a random id kept in the state directory (made on first use),
    /// so a dead mount of this machine is recognised; the host name when it cannot be kept.
    public static func machineId(stateDirectory: String) -> String {
        let path = stateDirectory + "/machine-id"
        if let text = try? String(contentsOfFile: path, encoding: .utf8), text.count >= 16 {
            return text.trimmingCharacters(in: .whitespacesAndNewlines)
        }
        let id = randomHex(16)
        try? FileManager.default.createDirectory(atPath: stateDirectory, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        return (try? (id + "\n").write(toFile: path, atomically: true, encoding: .utf8)) != nil ? id : hostName()
    }
}
