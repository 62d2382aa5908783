import CofferStore
import CofferTestSupport
import Foundation
import Testing

@Suite("PostgreSQL connection") struct PGConnectionTests {
    @Test func missingServerIsAFailureThatSaysWhy() {
        do {
            _ = try PostgresCluster(serverBin: "/nonexistent/postgresql/bin")
            Issue.record("a cluster started without a server")
        } catch {
            #expect("\(error)".contains("PostgreSQL is not installed") && "\(error)".contains("make test"))
        }
    }

    @Test func connectsOverTheSocket() throws {
        let c = try PGConnection(try Shared.cluster().superuserURI)
        #expect(c.serverVersion >= 140000)  // pipeline mode needs 14+
        #expect(c.isAlive)
        #expect(try c.execute("SELECT 'ok'::text").text(0, 0) == "ok")
    }

    /// A connection that fails the same way on every try is a refused login (not worth waiting for: the user
    /// unit would retry it every 5 s without end); one that reaches no server, or a server not taking
    /// connections yet, is a connection loss to wait for.
    @Test func onlyAServerAwayIsWorthWaitingFor() throws {
        let cluster = try Shared.cluster()
        let uri = "postgresql://\(Shared.role)@127.0.0.1:\(cluster.port)/\(cluster.database)?passfile=\(Shared.passfile(cluster))"
        let refused = [
            (uri + "&foo=bar", "invalid URI query parameter"), (uri + "&sslmode=bogus", "invalid sslmode value"),
            (uri + "&service=nosuchservice", "definition of service"),
            ("postgresql://no_such_role@/\(cluster.database)?host=\(cluster.socketDirectory)&port=\(cluster.port)", "does not exist"),
            (cluster.superuserURI.replacingOccurrences(of: "/\(cluster.database)?", with: "/no_such_db?"), "does not exist")
        ]
        for (conninfo, reason) in refused {
            let e = pgError { _ = try PGConnection(conninfo) }
            #expect(e?.kind == .connection && e?.loginRefused == true && e?.message.contains(reason) == true, "\(String(describing: e))")
        }
        for away in ["postgresql://u@127.0.0.1:1/db", "postgresql:///db?host=/nonexistent-socket-dir&port=5432"] {
            let e = pgError { _ = try PGConnection(away) }
            #expect(e?.kind == .connection && e?.loginRefused == false, "\(String(describing: e))")
        }
    }

    @Test func int8RoundTripsInBinary() throws {
        let c = try PGConnection(try Shared.cluster().superuserURI)
        let t = try freshTable(c, "id int8 PRIMARY KEY, v int8")
        let values: [Int64] = [0, 1, -1, 255, 256, 0x0102_0304_0506_0708, .min, .max]
        for (i, v) in values.enumerated() { try c.execute("INSERT INTO \(t) VALUES ($1, $2)", [.int8(Int64(i)), .int8(v)]) }
        try c.execute("INSERT INTO \(t) VALUES ($1, $2)", [.int8(99), .null])
        let r = try c.execute("SELECT v FROM \(t) ORDER BY id")
        #expect(r.rowCount == values.count + 1)
        for (i, v) in values.enumerated() { #expect(try r.int64(i, 0) == v) }
        #expect(try r.int64(values.count, 0) == nil)
        // The server agrees on the encoding: big-endian on the wire, not our own mirror image.
        #expect(try c.execute("SELECT $1::int8 = 72623859790382856", [.int8(0x0102_0304_0506_0708)]).bool(0, 0) == true)
    }

    @Test func byteaRoundTripsAtEverySize() throws {
        let c = try PGConnection(try Shared.cluster().superuserURI)
        let t = try freshTable(c, "id int8 PRIMARY KEY, v bytea")
        var rng = SplitMix64(seed: 16)
        let values: [[UInt8]] = [[], [0], [0, 0, 0], rng.bytes(32 * 1024), rng.bytes(1 << 20)]
        for (i, v) in values.enumerated() { try c.execute("INSERT INTO \(t) VALUES ($1, $2)", [.int8(Int64(i)), .bytea(v)]) }
        let r = try c.execute("SELECT v, length(v)::int8 FROM \(t) ORDER BY id")
        for (i, v) in values.enumerated() {
            #expect(try r.bytes(i, 0) == v, "value \(i)")
            #expect(try r.int64(i, 1) == Int64(v.count))  // the server stored the real size
        }
        #expect(try r.isNull(0, 0) == false)  // empty is not NULL
        let sum = try r.withBytes(4, 0) { $0.reduce(0) { $0 &+ Int($1) } }
        #expect(sum == values[4].reduce(0) { $0 &+ Int($1) })
    }

    @Test func wrongTypesAndRangesAreErrorsNotTraps() throws {
        let c = try PGConnection(try Shared.cluster().superuserURI)
        let r = try c.execute("SELECT 'x'::text, 7::int8")
        #expect(pgError { _ = try r.int64(0, 0) }?.kind == .unexpectedResult)
        #expect(pgError { _ = try r.bytes(0, 1) }?.kind == .unexpectedResult)
        #expect(pgError { _ = try r.int64(1, 1) }?.kind == .usage)
        #expect(pgError { _ = try r.int64(0, 2) }?.kind == .usage)
        #expect(pgError { _ = try r.int64(-1, 0) }?.kind == .usage)
        // A count a hostile server sends is clamped: never negative, never big enough to overflow a sum.
        let counts = try c.execute("SELECT -5::int8, 9223372036854775807::int8, 12::int8, NULL::int8")
        #expect(try (0..<4).map { try counts.count(0, $0) } == [0, 1 << 48, 12, 0])
    }

    /// Statements queued ahead go in the round trip of the next call, before its own statement; only
    /// the call's own results come back, and a failure ahead fails the call.
    @Test func statementsAheadGoWithTheNextCall() throws {
        let c = try PGConnection(try Shared.cluster().superuserURI)
        let t = try freshTable(c, "id int8 PRIMARY KEY, v bytea")
        c.ahead = (0..<3).map { PGStatement("INSERT INTO \(t) VALUES ($1, $2)", [.int8(Int64($0)), .bytea([1])], prepared: true) }
        #expect(try c.execute("SELECT count(*) FROM \(t)").int64(0, 0) == 3)
        #expect(c.ahead.isEmpty)
        c.ahead = [PGStatement("INSERT INTO \(t) VALUES (10, ''::bytea)")]
        let r = try c.pipeline([PGStatement("SELECT count(*) FROM \(t)"), PGStatement("SELECT max(id) FROM \(t)")])
        #expect(r.count == 2)
        #expect(try r[0].int64(0, 0) == 4 && r[1].int64(0, 0) == 10)
        c.ahead = [PGStatement("INSERT INTO \(t) VALUES (0, ''::bytea)")]  // duplicate key
        #expect(pgError { _ = try c.execute("SELECT 1") }?.sqlState == .uniqueViolation)
        #expect(c.ahead.isEmpty && c.isAlive)
        c.ahead = [PGStatement("INSERT INTO \(t) VALUES (11, ''::bytea)")]
        #expect(try c.pipeline([]).isEmpty)
        #expect(try count(c, t) == 5)
    }

    /// A batch sent without waiting (`send`) is answered before the next call runs: that call sees its
    /// rows, or throws its error instead of running, and the session stays usable either way.
    @Test func aSentBatchIsSettledByTheNextCall() throws {
        let c = try PGConnection(try Shared.cluster().superuserURI)
        let t = try freshTable(c, "id int8 PRIMARY KEY, v bytea")
        let big = [UInt8](repeating: 7, count: 1 << 20)  // larger than a socket buffer: sending must not block on answers
        try c.send((0..<4).map { PGStatement("INSERT INTO \(t) VALUES ($1, $2)", [.int8(Int64($0)), .bytea(big)], prepared: true) })
        #expect(try count(c, t) == 4)
        try c.send([PGStatement("INSERT INTO \(t) VALUES (0, ''::bytea)")])  // duplicate key
        #expect(pgError { _ = try c.execute("INSERT INTO \(t) VALUES (5, ''::bytea)") }?.sqlState == .uniqueViolation)
        #expect(try count(c, t) == 4, "the call that met the error did not run")
        try c.send([PGStatement("INSERT INTO \(t) VALUES (6, ''::bytea)")])
        try c.settle()
        try c.settle()  // nothing left: a no-op
        #expect(c.isAlive)
        #expect(try count(c, t) == 5)
        // `send` does not wait for the server to run the batch: here the batch waits for a row lock that
        // this thread lets go only after `send` returned (were it waited for, the lock would time out).
        let other = try PGConnection(try Shared.cluster().superuserURI)
        defer { other.close() }
        try other.execute("BEGIN")
        try other.execute("UPDATE \(t) SET v = 'a'::bytea WHERE id = 6")
        try c.execute("SET lock_timeout = '5s'")
        try c.send([PGStatement("UPDATE \(t) SET v = 'b'::bytea WHERE id = 6")])
        try other.execute("COMMIT")
        try c.settle()
        #expect(try c.execute("SELECT v FROM \(t) WHERE id = 6").bytes(0, 0) == Array("b".utf8))
    }

    /// An int8[] parameter in binary: `= ANY($1)` finds exactly the listed ids, none for an empty array.
    @Test func int8ArrayParameter() throws {
        let c = try PGConnection(try Shared.cluster().superuserURI)
        let t = try freshTable(c, "id int8 PRIMARY KEY")
        let ids: [Int64] = [.min, -1, 0, 7, 1 << 40, .max]
        for id in ids + [8, 9] { try c.execute("INSERT INTO \(t) VALUES ($1)", [.int8(id)]) }
        let r = try c.execute("SELECT id FROM \(t) WHERE id = ANY($1) ORDER BY id", [.int8Array(ids + [12345])], prepared: true)
        #expect(try (0..<r.rowCount).map { try r.int64($0, 0) } == ids)
        #expect(try c.execute("SELECT count(*) FROM \(t) WHERE id = ANY($1)", [.int8Array([])], prepared: true).int64(0, 0) == 0)
    }

    @Test func pipelinedBatchIsOneImplicitTransaction() throws {
        let c = try PGConnection(try Shared.cluster().superuserURI)
        let t = try freshTable(c, "id int8 PRIMARY KEY, v bytea")
        let chunk = [UInt8](repeating: 7, count: 32 * 1024)
        var batch = (0..<100).map { PGStatement("INSERT INTO \(t) VALUES ($1, $2)", [.int8(Int64($0)), .bytea(chunk)]) }
        batch.append(PGStatement("SELECT count(*) FROM \(t)"))
        let results = try c.pipeline(batch)
        #expect(results.count == 101)
        #expect(results[0].affectedRows == 1)
        #expect(try results[100].int64(0, 0) == 100)
        // A failing statement in the middle: the first error is thrown, the batch leaves nothing.
        let failing = [
            PGStatement("INSERT INTO \(t) VALUES (1000, ''::bytea)"),
            PGStatement("INSERT INTO \(t) VALUES (5, ''::bytea)"),  // duplicate key
            PGStatement("INSERT INTO \(t) VALUES (1001, ''::bytea)")
        ]
        #expect(pgError { _ = try c.pipeline(failing) }?.sqlState == .uniqueViolation)
        #expect(try count(c, t) == 100)
        #expect(c.isAlive)  // the connection left pipeline mode and works
        #expect(try c.pipeline([]).isEmpty)
        // Prepared statements in a batch and alone: prepared once, then only bound.
        let again = (200..<210).map { PGStatement("INSERT INTO \(t) VALUES ($1, $2)", [.int8(Int64($0)), .bytea([1])], prepared: true) }
        _ = try c.pipeline(again)
        try c.execute("INSERT INTO \(t) VALUES ($1, $2)", [.int8(300), .bytea([])], prepared: true)
        #expect(try c.execute("SELECT count(*) FROM pg_prepared_statements").int64(0, 0) == 1)
        #expect(try count(c, t) == 111)
    }

    @Test func rolledBackTransactionLeavesNothing() throws {
        let c = try PGConnection(try Shared.cluster().superuserURI)
        let t = try freshTable(c, "id int8 PRIMARY KEY")
        #expect(throws: TestFailure.self) {
            try c.transaction { c in
                try c.execute("INSERT INTO \(t) VALUES (1), (2)")
                throw TestFailure("abandon")
            }
        }
        #expect(!c.inTransaction)
        #expect(try count(c, t) == 0)
        try c.transaction { c in try c.execute("INSERT INTO \(t) VALUES (3)") }
        #expect(try count(c, t) == 1)
        // A failed statement swallowed inside the body: COMMIT becomes a rollback, which must throw.
        let e = pgError {
            try c.transaction { c in
                try c.execute("INSERT INTO \(t) VALUES (4)")
                _ = try? c.execute("INSERT INTO \(t) VALUES (3)")
            }
        }
        #expect(e?.kind == .server)
        #expect(try count(c, t) == 1)
    }

    @Test func uniqueViolationHasItsSQLState() throws {
        let c = try PGConnection(try Shared.cluster().superuserURI)
        let t = try freshTable(c, "id int8 PRIMARY KEY")
        try c.execute("INSERT INTO \(t) VALUES ($1)", [.int8(1)])
        let e = pgError { try c.execute("INSERT INTO \(t) VALUES ($1)", [.int8(1)]) }
        #expect(e?.sqlState == .uniqueViolation)
        #expect(e?.kind == .server)
        #expect(e?.isConnectionLoss == false)
        #expect(try count(c, t) == 1)
    }

    @Test func concurrentUpdateIsASerializationFailure() throws {
        let uri = try Shared.cluster().superuserURI
        let a = try PGConnection(uri), b = try PGConnection(uri)
        let t = try freshTable(a, "id int8 PRIMARY KEY, v int8")
        try a.execute("INSERT INTO \(t) VALUES (1, 0)")
        try a.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        _ = try a.execute("SELECT v FROM \(t) WHERE id = 1")
        try b.execute("UPDATE \(t) SET v = 1 WHERE id = 1")
        let e = pgError { try a.execute("UPDATE \(t) SET v = 2 WHERE id = 1") }
        #expect(e?.sqlState == .serializationFailure)
        #expect(e?.isRetryableTransaction == true)
        try a.execute("ROLLBACK")
    }
}
