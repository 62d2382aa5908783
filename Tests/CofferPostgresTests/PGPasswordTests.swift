import CofferStore
import CofferTestSupport
import Foundation
import Testing

/// The database password reaches libpq only: it is never part of an error text, whatever failed.
@Suite("PostgreSQL passwords") struct PGPasswordTests {
    @Test func passfileRoleConnectsOverTCP() throws {
        let c = try PGConnection(try Shared.passwordConninfo())
        #expect(try c.execute("SELECT current_user::text").text(0, 0) == Shared.role)
    }

    @Test func errorsNeverShowThePassword() throws {
        let cluster = try Shared.cluster()
        let wrong = "Wr0ng-Secret-4711"
        let strings = [
            // Wrong password in the URI and in key=value form.
            "postgresql://\(Shared.role):\(wrong)@127.0.0.1:\(cluster.port)/\(cluster.database)",
            cluster.tcpConninfo(user: Shared.role, "password=\(wrong)"),
            cluster.tcpConninfo(user: Shared.role, "password='\(wrong) x'"),
            // Malformed strings libpq quotes back (a bad percent-escape inside the password).
            "postgresql://\(Shared.role):\(wrong)%zz@127.0.0.1:\(cluster.port)/\(cluster.database)",
            "host=127.0.0.1 password=\(wrong) port",
            // Nobody listening.
            "postgresql://\(Shared.role):\(wrong)@127.0.0.1:1/db"
        ]
        for s in strings {
            let e = pgError { _ = try PGConnection(s) }
            #expect(e?.kind == .connection)
            let text = e.map { "\($0) \($0.message)" } ?? ""
            #expect(!text.contains(wrong) && !text.contains("Wr0ng"), "password in: \(text)")
            #expect(!text.isEmpty)
        }
    }

    @Test func poolErrorsNeverShowThePassword() throws {
        let cluster = try PostgresCluster()
        defer { cluster.destroy() }
        let secret = "Another-S3cret"
        try cluster.psql("CREATE ROLE r LOGIN PASSWORD '\(secret)'")
        let pool = try PGPool(cluster.tcpConninfo(user: "r", "password=\(secret)"), reconnectWait: 0.5)
        try cluster.stop()
        let e = pgError { try pool.withConnection { c in _ = try c.execute("SELECT 1") } }
        #expect(e?.isConnectionLoss == true)
        #expect(!"\(String(describing: e))".contains(secret))
    }
}
