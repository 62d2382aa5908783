import CofferStore
import CofferTestSupport
import Foundation
import Testing

/// The figures behind the libpq choice (docs/MEASUREMENTS.md), printed by a cheap run that also checks
/// the answers. COFFER_PG_ROUNDS multiplies the work for a steadier reading.
@Suite("PostgreSQL round trips") struct PGRoundTripFigures {
    static let scale = Int(ProcessInfo.processInfo.environment["COFFER_PG_ROUNDS"] ?? "") ?? 1

    @Test func roundTripFigures() throws {
        let cluster = try Shared.cluster()
        for (name, conninfo) in [("socket", cluster.superuserURI), ("tcp", try Shared.passwordConninfo())] {
            let c = try PGConnection(conninfo)
            let t = try freshTable(c, "id int8 PRIMARY KEY, v bytea")
            try c.execute("INSERT INTO \(t) SELECT g, '\\x0102'::bytea FROM generate_series(0, 999) g")
            let selects = 2000 * Self.scale
            var start = Date()
            for prepared in [false, true] {
                start = Date()
                for i in 0..<selects {
                    let r = try c.execute("SELECT v FROM \(t) WHERE id = $1", [.int8(Int64(i % 1000))], prepared: prepared)
                    #expect(try r.bytes(0, 0) == [1, 2])
                }
                let perSelect = Date().timeIntervalSince(start) / Double(selects)
                print(String(format: "pg %@: SELECT by key%@ %.1f µs (%.0f/s)", name, prepared ? " (prepared)" : "", perSelect * 1e6, 1 / perSelect))
            }
            var rng = SplitMix64(seed: 1)
            for size in [32 * 1024, 100] {
                let value = rng.bytes(size)
                let batches = 10 * Self.scale
                var id: Int64 = 10_000 + Int64(size) * 1_000_000
                func batch() -> [PGStatement] {
                    (0..<100).map { _ in
                        id += 1
                        return PGStatement("INSERT INTO \(t) VALUES ($1, $2)", [.int8(id), .bytea(value)], prepared: true)
                    }
                }
                start = Date()
                for _ in 0..<batches { _ = try c.pipeline([PGStatement("BEGIN")] + batch() + [PGStatement("COMMIT")]) }
                let pipelined = Date().timeIntervalSince(start) / Double(batches)
                start = Date()
                for _ in 0..<batches {
                    let statements = batch()
                    try c.transaction { c in for s in statements { try c.execute(s.sql, s.params, prepared: true) } }
                }
                let oneByOne = Date().timeIntervalSince(start) / Double(batches)
                print(
                    String(
                        format: "pg %@: 100 x %d B INSERT + COMMIT: pipelined %.1f ms, one by one %.1f ms", name, size, pipelined * 1e3,
                        oneByOne * 1e3))
            }
            #expect(try count(c, t) == Int64(1000 + 400 * 10 * Self.scale))
        }
        print(String(format: "thread hop (a synchronous caller waiting on another thread, as over an event loop): %.1f µs", Self.threadHop() * 1e6))
    }

    /// What a synchronous FUSE worker pays per call to reach an event-loop client (PostgresNIO) and
    /// back, without any database work: hand a request to another thread and wait for its answer.
    static func threadHop() -> Double {
        let request = DispatchSemaphore(value: 0), reply = DispatchSemaphore(value: 0)
        let rounds = 20_000
        Thread {
            for _ in 0..<rounds {
                request.wait()
                reply.signal()
            }
        }.start()
        let start = Date()
        for _ in 0..<rounds {
            request.signal()
            reply.wait()
        }
        return Date().timeIntervalSince(start) / Double(rounds)
    }
}
