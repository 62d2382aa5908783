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

    /// `sole`: told true while this listener holds the sole lock (no other mount has a lease row; docs/FORMAT.md,
    /// "A mount alone"), tried once `joined` says so and then every second while not held; told false before
    /// the lock is let go: when a mount joins, another mount's commit is heard, or the connection is lost.
    init(
        conninfo: String, sql: PostgresSQL, ignoring me: String, sole: @escaping @Sendable (Bool) -> Void, joined: @escaping @Sendable () -> Bool,
        heard: @escaping @Sendable () -> Void, wanted: @escaping @Sendable () -> Void
    ) {
        let myWant = PostgresSQL.wantPrefix + me, myJoin = PostgresSQL.joinPrefix + me
        let channel = sql.channel, schema = [PGValue.text(sql.schema)]
        let thread = Thread { [self] in
            var connection: PGConnection?
            var first = true
            var holdsSole = false
            var nextTry = ContinuousClock.now
            while !stopped.load(ordering: .acquiring) {
                do {
                    let c: PGConnection
                    if let connection {
                        c = connection
                    } else {
                        c = try PGConnection(conninfo)
                        try c.execute("LISTEN " + PostgresIdentifier.quoted(channel))
                        // A machine that vanishes (no FIN) loses the sole lock in about 11 s, not hours.
                        try c.executeScript("SET tcp_keepalives_idle = 5; SET tcp_keepalives_interval = 2; SET tcp_keepalives_count = 3")
                        connection = c
                        if !first {  // commits and requests made while this connection was away went unheard
                            heard()
                            wanted()
                        }
                        first = false
                    }
                    // A short wait, so that `stop` is seen soon.
                    let payloads = try c.notifications(timeout: 0.25)
                    let joining = payloads.contains { $0.hasPrefix(PostgresSQL.joinPrefix) && $0 != myJoin }
                    let committed = payloads.contains {
                        !$0.hasPrefix(PostgresSQL.wantPrefix) && !$0.hasPrefix(PostgresSQL.joinPrefix) && $0 != me
                    }
                    if joining || committed {
                        sole(false)  // before the lock goes: see `PostgresBackend.isSole`
                        if holdsSole { _ = try c.execute(sql.soleUnlock, schema) }
                        holdsSole = false
                        nextTry = .now + .seconds(1)
                    }
                    if payloads.contains(where: { $0.hasPrefix(PostgresSQL.wantPrefix) && $0 != myWant }) { wanted() }
                    if committed { heard() }
                    if !holdsSole, joined(), ContinuousClock.now >= nextTry {
                        nextTry = .now + .seconds(1)
                        let r = try c.pipeline([PGStatement(sql.trySoleLock, schema), PGStatement(sql.otherLeases, [.text(me)])])
                        if r.count == 2, try r[0].bool(0, 0) == true {
                            if try r[1].int64(0, 0) == 0 {
                                holdsSole = true
                                sole(true)
                            } else {
                                _ = try c.execute(sql.soleUnlock, schema)
                            }
                        }
                    }
                } catch {
                    sole(false)
                    holdsSole = false
                    connection?.close()
                    connection = nil
                    first = false
                    Thread.sleep(forTimeInterval: 0.5)
                }
            }
            sole(false)
            connection?.close()
        }
        thread.name = "coffer-listen"
        thread.start()
    }

    /// Ends the thread within a quarter of a second (it closes its own connection).
    func stop() { stopped.store(true, ordering: .releasing) }
}
