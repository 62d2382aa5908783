import Foundation
import Synchronization

/// Hears the other mounts of a container: a connection of its own runs LISTEN on the container's
/// channel. Every commit sends a notification naming its mount's lease holder, and a mount that waits
/// for the writer lock sends one naming it after `PostgresSQL.wantPrefix` (PostgresTransactions.swift).
/// Another mount's commit, or a reconnect (some may have gone unheard meanwhile), calls `heard` on
/// this thread, and the store above rereads what it cached; another mount's wait calls `wanted`. It
/// also keeps the sole lock of a mount alone (`PostgresBackend.isSole`).
final class PostgresListener: @unchecked Sendable {
    private let stopped = Atomic<Bool>(false)

    /// `sole`: told the instant this listener last knew it held the sole lock with no other mount's lease
    /// row (docs/FORMAT.md, "A mount alone"; the instant its check was sent), or nil once it may not. The
    /// lock is tried once `joined` says so, then every second while not held; while held, the lease rows are
    /// counted again every second (a mount cut off from the server stops being told, so it stops trusting
    /// the lock within `PostgresBackend.soleValidity`). Nil is told before the lock is let go: when a mount
    /// joins, another mount's commit is heard, a lease row appears, or the connection is lost.
    init(
        conninfo: String, sql: PostgresSQL, ignoring me: String,
        sole: @escaping @Sendable (ContinuousClock.Instant?) -> Void, joined: @escaping @Sendable () -> Bool,
        heard: @escaping @Sendable () -> Void, changed: @escaping @Sendable ([UInt64]) -> Void,
        wanted: @escaping @Sendable (_ byReader: Bool) -> Void
    ) {
        let myWant = PostgresSQL.wantPrefix + me, myReaderWant = PostgresSQL.readerWantPrefix + me, myJoin = PostgresSQL.joinPrefix + me
        let channel = sql.channel, schema = [PGValue.text(sql.schema)]
        let thread = Thread { [self] in
            var connection: PGConnection?
            var first = true
            var holdsSole = false
            var nextTry = ContinuousClock.now
            /// Tells `heard` (then `changed`, with the inodes the commits named) and `wanted`; true when the
            /// payloads say this mount is not alone (any more).
            func handle(_ payloads: [String]) -> Bool {
                let joining = payloads.contains { $0.hasPrefix(PostgresSQL.joinPrefix) && $0 != myJoin }
                let commits = payloads.map(PostgresSQL.parsePayload).filter {
                    !$0.holder.hasPrefix(PostgresSQL.wantPrefix) && !$0.holder.hasPrefix(PostgresSQL.joinPrefix) && $0.holder != me
                }
                let asks = payloads.filter { $0.hasPrefix(PostgresSQL.wantPrefix) && $0 != myWant && $0 != myReaderWant }
                if !asks.isEmpty { wanted(asks.contains { $0.hasPrefix(PostgresSQL.readerWantPrefix) }) }
                if !commits.isEmpty {
                    heard()
                    let named = commits.flatMap { $0.inodes ?? [] }
                    if !named.isEmpty { changed(named) }
                }
                return joining || !commits.isEmpty
            }
            func letGo(_ c: PGConnection) throws {
                sole(nil)  // before the lock goes: a mount that joins must find this mount checking again
                if holdsSole { _ = try c.execute(sql.soleUnlock, schema) }
                holdsSole = false
                nextTry = .now + .seconds(1)
            }
            while !stopped.load(ordering: .acquiring) {
                do {
                    let c: PGConnection
                    if let connection {
                        c = connection
                    } else {
                        c = try PGConnection(conninfo)
                        try c.execute("LISTEN " + PostgresIdentifier.quoted(channel))
                        // Named after this mount's lease, as its writer: a mount that joins while this one is
                        // stopped alone ends the session once the lease lapsed (`PostgresSQL.endLapsedSole`).
                        if !me.isEmpty { try c.execute(PostgresSQL.nameSession, [.text(PostgresSQL.writerPrefix + me)]) }
                        // A machine that vanishes (no FIN) loses the sole lock in about 11 s, not hours.
                        try c.executeScript("SET tcp_keepalives_idle = 5; SET tcp_keepalives_interval = 2; SET tcp_keepalives_count = 3")
                        connection = c
                        if !first {  // commits and requests made while this connection was away went unheard
                            heard()
                            wanted(false)  // a reader's then waits for this mount's pause, once
                        }
                        first = false
                    }
                    // A short wait, so that `stop` is seen soon.
                    if handle(try c.notifications(timeout: 0.25)) || (holdsSole && !joined()) { try letGo(c) }
                    guard joined(), ContinuousClock.now >= nextTry else { continue }
                    nextTry = .now + .seconds(1)
                    let sent = ContinuousClock.now
                    var others: Int64?
                    if holdsSole {
                        others = try c.execute(sql.otherLeases, [.text(me)]).int64(0, 0)
                    } else {
                        let r = try c.pipeline([PGStatement(sql.trySoleLock, schema), PGStatement(sql.otherLeases, [.text(me)])])
                        guard r.count == 2, try r[0].bool(0, 0) == true else { continue }
                        holdsSole = true
                        others = try r[1].int64(0, 0)
                    }
                    // What was heard while the count ran (a commit just before its mount left) counts too.
                    let notAlone = handle(try c.notifications(timeout: 0))
                    if others == 0 && !notAlone { sole(sent) } else { try letGo(c) }
                } catch {
                    sole(nil)
                    holdsSole = false
                    connection?.close()
                    connection = nil
                    first = false
                    Thread.sleep(forTimeInterval: 0.5)
                }
            }
            sole(nil)
            connection?.close()
        }
        thread.name = "coffer-listen"
        thread.start()
    }

    /// Ends the thread within a quarter of a second (it closes its own connection).
    func stop() { stopped.store(true, ordering: .releasing) }
}
