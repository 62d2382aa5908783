import Foundation
import Synchronization

/// Hears the other mounts of a container: a connection of its own runs LISTEN on the container's
/// channel. Every commit sends a notification naming its mount's lease holder, and a mount that waits
/// for the writer lock sends one naming it after `PostgresSQL.wantPrefix` (PostgresTransactions.swift).
/// Another mount's commit, or a reconnect (some may have gone unheard meanwhile), calls `heard` on
/// this thread, and the store above rereads what it cached; another mount's wait calls `wanted`.
final class PostgresListener: @unchecked Sendable {
    private let stopped = Atomic<Bool>(false)

    init(conninfo: String, channel: String, ignoring me: String, heard: @escaping @Sendable () -> Void, wanted: @escaping @Sendable () -> Void) {
        let myWant = PostgresSQL.wantPrefix + me
        let thread = Thread { [self] in
            var connection: PGConnection?
            var first = true
            while !stopped.load(ordering: .acquiring) {
                do {
                    let c: PGConnection
                    if let connection {
                        c = connection
                    } else {
                        c = try PGConnection(conninfo)
                        try c.execute("LISTEN " + PostgresIdentifier.quoted(channel))
                        connection = c
                        if !first {  // commits and requests made while this connection was away went unheard
                            heard()
                            wanted()
                        }
                        first = false
                    }
                    // A short wait, so that `stop` is seen soon.
                    let payloads = try c.notifications(timeout: 0.25)
                    if payloads.contains(where: { $0.hasPrefix(PostgresSQL.wantPrefix) && $0 != myWant }) { wanted() }
                    if payloads.contains(where: { !$0.hasPrefix(PostgresSQL.wantPrefix) && $0 != me }) { heard() }
                } catch {
                    connection?.close()
                    connection = nil
                    first = false
                    Thread.sleep(forTimeInterval: 0.5)
                }
            }
            connection?.close()
        }
        thread.name = "coffer-listen"
        thread.start()
    }

    /// Ends the thread within a quarter of a second (it closes its own connection).
    func stop() { stopped.store(true, ordering: .releasing) }
}
