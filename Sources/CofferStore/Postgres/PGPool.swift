import Foundation

/// A bounded stack of connections for the FUSE worker threads. A worker takes one for a call or a
/// transaction and gives it back; when all `maxConnections` are out, it waits for one. Idle
/// connections are checked on checkout without a round trip (`PGConnection.isAlive`), and a dead one
/// is reconnected for up to `reconnectWait` seconds (a restarting server) before the call fails
/// with a `.connection` error, so a server that is down makes calls fail after the bound, not hang.
public final class PGPool: @unchecked Sendable {  // state behind `condition`
    public let maxConnections: Int
    public let reconnectWait: Double
    private let conninfo: String
    private let condition = NSCondition()
    private var idle: [PGConnection] = []
    private var opened = 0
    private var closed = false

    /// Opens the first connection at once, so a wrong string, password or host fails here.
    public init(_ conninfo: String, maxConnections: Int = 4, reconnectWait: Double = 30) throws(PGError) {
        guard maxConnections >= 1 else { throw PGError(.usage, "a pool needs at least one connection") }
        self.conninfo = conninfo
        self.maxConnections = maxConnections
        self.reconnectWait = reconnectWait
        idle = [try PGConnection(conninfo)]
        opened = 1
    }

    /// Runs `body` on a connection of the pool. With `retryOnConnectionLoss`, a body that fails with
    /// a lost connection runs again on a reconnected one, until `reconnectWait` has passed since the
    /// first failure: only for work that is safe to repeat (reads, or a whole transaction whose
    /// COMMIT was not sent; a COMMIT lost in flight may have committed).
    @discardableResult
    public func withConnection<T>(retryOnConnectionLoss: Bool = false, _ body: (PGConnection) throws -> T) throws -> T {
        var deadline: Date?
        while true {
            let connection = try checkout()
            defer { checkin(connection) }
            do { return try body(connection) } catch let error as PGError where error.isConnectionLoss && retryOnConnectionLoss {
                let end = deadline ?? Date().addingTimeInterval(reconnectWait)
                deadline = end
                if Date() >= end { throw error }
            }
        }
    }

    /// Closes the idle connections; connections out now close when given back.
    public func close() {
        condition.lock()
        defer { condition.unlock() }
        closed = true
        opened -= idle.count
        idle.removeAll()
        condition.broadcast()
    }

    private func checkout() throws(PGError) -> PGConnection {
        condition.lock()
        while !closed && idle.isEmpty && opened >= maxConnections { condition.wait() }
        if closed {
            condition.unlock()
            throw PGError(.usage, "the connection pool is closed")
        }
        if let c = idle.popLast() {
            condition.unlock()
            if !c.isAlive {
                do { try c.reconnect(within: reconnectWait, store: true) } catch {
                    checkin(c)
                    throw error
                }
            }
            return c
        }
        opened += 1  // a new connection, made outside the lock
        condition.unlock()
        do {
            return try PGConnection.retrying(within: reconnectWait, server: conninfo) { () throws(PGError) in try PGConnection(conninfo) }
        } catch {
            condition.lock()
            opened -= 1
            condition.signal()
            condition.unlock()
            throw error
        }
    }

    /// Takes a connection back; one left inside a transaction is rolled back (or dropped if it can't be).
    private func checkin(_ c: PGConnection) {
        if c.inTransaction, c.isAlive { _ = try? c.execute("ROLLBACK") }
        if c.inTransaction { c.close() }  // reconnected at its next checkout
        condition.lock()
        defer { condition.unlock() }
        if closed { opened -= 1 } else { idle.append(c) }
        condition.signal()
    }
}
