import CofferStore
import CofferTestSupport
import Foundation
import Testing

/// The server goes away under the client: each test has a cluster of its own, stopped in teardown.
@Suite("PostgreSQL faults", .serialized) struct PGFaultTests {
    @Test(arguments: ["fast", "immediate"])
    func idlePoolReconnectsAfterARestart(mode: String) throws {
        let cluster = try PostgresCluster()
        defer { cluster.destroy() }
        let pool = try PGPool(cluster.superuserURI, maxConnections: 2, reconnectWait: 20)
        let t = try pool.withConnection { c in try freshTable(c, "id int8") }
        // Two connections open and idle.
        try pool.withConnection { a in
            try pool.withConnection { b in
                _ = try a.execute("SELECT 1")
                _ = try b.execute("SELECT 1")
            }
        }
        try pool.withConnection { c in try c.execute("SELECT $1::int8", [.int8(1)], prepared: true) }
        try cluster.restart(mode: mode)
        let start = Date()
        // The new session has no prepared statements: prepared again, not "does not exist".
        try pool.withConnection { c in try c.execute("SELECT $1::int8", [.int8(1)], prepared: true) }
        try pool.withConnection { c in try c.execute("INSERT INTO \(t) VALUES (1)") }
        let counts = try pool.withConnection { a in try pool.withConnection { b in [try count(a, t), try count(b, t)] } }
        #expect(counts == [1, 1])
        #expect(Date().timeIntervalSince(start) < 20)
    }

    @Test func stoppedServerFailsAfterTheBoundNotAHang() throws {
        let cluster = try PostgresCluster()
        defer { cluster.destroy() }
        let pool = try PGPool(cluster.superuserURI, reconnectWait: 2)
        try pool.withConnection { c in _ = try c.execute("SELECT 1") }
        try cluster.stop()
        let start = Date()
        let e = pgError { try pool.withConnection { c in _ = try c.execute("SELECT 1") } }
        let waited = Date().timeIntervalSince(start)
        #expect(e?.isConnectionLoss == true)
        #expect(e?.message.contains("no connection within 2") == true, "\(String(describing: e))")
        #expect(waited >= 1.0 && waited < 10, "waited \(waited) s")
    }

    @Test func connectionLostMidStatementIsAConnectionError() throws {
        let cluster = try PostgresCluster()
        defer { cluster.destroy() }
        let pool = try PGPool(cluster.superuserURI, reconnectWait: 20)
        let stopper = Thread {
            Thread.sleep(forTimeInterval: 1)
            try? cluster.restart(mode: "fast")
        }
        stopper.start()
        let e = pgError { try pool.withConnection { c in _ = try c.execute("SELECT pg_sleep(30)") } }
        #expect(e?.isConnectionLoss == true, "\(String(describing: e))")
        while !stopper.isFinished { Thread.sleep(forTimeInterval: 0.1) }
        // The same pool goes on, and a retried read runs again on a fresh connection.
        #expect(try pool.withConnection(retryOnConnectionLoss: true) { c in try c.execute("SELECT 2::int8").int64(0, 0) } == 2)
    }
}
