import CofferStore
import CofferTestSupport
import Foundation
import Testing

@Suite("PostgreSQL pool") struct PGPoolTests {
    @Test func workerThreadsShareABoundedPool() throws {
        let cluster = try Shared.cluster()
        let pool = try PGPool(cluster.superuserURI + "&application_name=pooltest", maxConnections: 3)
        defer { pool.close() }
        let t = try pool.withConnection { c in try freshTable(c, "id int8 PRIMARY KEY, backend int8") }
        let failures = Locked(0)
        let done = DispatchGroup()
        for w in 0..<8 {
            done.enter()
            Thread {
                defer { done.leave() }
                for i in 0..<25 {
                    do {
                        try pool.withConnection { c in
                            try c.execute("INSERT INTO \(t) VALUES ($1, pg_backend_pid())", [.int8(Int64(w * 100 + i))])
                        }
                    } catch { failures.update { $0 += 1 } }
                }
            }.start()
        }
        done.wait()
        #expect(failures.value == 0)
        let rows = try pool.withConnection { c in try count(c, t) }
        let backends = try pool.withConnection { c in try c.execute("SELECT count(DISTINCT backend) FROM \(t)").int64(0, 0) }
        #expect(rows == 200)
        #expect(backends ?? 99 <= 3)
    }

    @Test func leftoverTransactionIsRolledBackAtCheckin() throws {
        let pool = try PGPool(try Shared.cluster().superuserURI, maxConnections: 1)
        let t = try pool.withConnection { c in try freshTable(c, "id int8") }
        try pool.withConnection { c in
            try c.execute("BEGIN")
            try c.execute("INSERT INTO \(t) VALUES (1)")
        }
        let (open, rows) = try pool.withConnection { c in (c.inTransaction, try count(c, t)) }
        #expect(!open)
        #expect(rows == 0)
    }
}

/// A value behind a lock, for counting across threads.
final class Locked<T>: @unchecked Sendable {
    private var v: T
    private let lock = NSLock()
    init(_ v: T) { self.v = v }
    var value: T {
        lock.lock()
        defer { lock.unlock() }
        return v
    }
    func update(_ f: (inout T) -> Void) {
        lock.lock()
        f(&v)
        lock.unlock()
    }
}
