import Foundation
import Synchronization

/// Hears the commits of the other mounts of a container: a connection of its own runs LISTEN on the
/// container's channel, and every commit sends a notification naming its mount's lease holder
/// (PostgresTransactions.swift). A notification of another mount, or a reconnect (some may have gone
/// unheard meanwhile), calls `heard` on this thread; the store above then rereads what it cached.
final class PostgresListener: @unchecked Sendable {
    private let stopped = Atomic<Bool>(false)

    init(conninfo: String, channel: String, ignoring me: String, heard: @escaping @Sendable () -> Void) {
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
                        if !first { heard() }  // commits made while this connection was away went unheard
                        first = false
                    }
                    // A short wait, so that `stop` is seen soon.
                    if try c.notifications(timeout: 0.25).contains(where: { $0 != me }) { heard() }
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
