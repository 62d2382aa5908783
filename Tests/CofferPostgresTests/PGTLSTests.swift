import CofferStore
import CofferTestSupport
import Foundation
import Testing

/// libpq's TLS settings through PGConnection against a cluster that speaks TLS: a verified session is
/// encrypted, and a server those settings refuse is a refused login (`loginRefused`: not worth waiting
/// for), where a server that is not there stays a connection loss to wait for.
@Suite("PostgreSQL over TLS", .serialized) struct PGTLSTests {
    private static let role = "tls_role"
    private static let password = "Tls-Pw-\(UUID().uuidString.prefix(8))"

    private static let setup: Result<(PostgresCluster, TestCertificates), any Error> = Result {
        let certificates = try TestCertificates(hostNames: ["localhost"])
        let cluster = try PostgresCluster(settings: certificates.serverSettings)
        atexit {
            if case .success(let (c, t)) = PGTLSTests.setup {
                c.destroy()
                t.remove()
            }
        }
        try cluster.psql("CREATE ROLE \(role) LOGIN PASSWORD '\(password)'")
        try "*:\(cluster.port):*:\(role):\(password)\n".write(toFile: cluster.root + "/pgpass", atomically: true, encoding: .utf8)
        chmod(cluster.root + "/pgpass", 0o600)
        return (cluster, certificates)
    }

    private static func conninfo(host: String = "localhost", _ tls: String) throws -> String {
        let (cluster, _) = try setup.get()
        return "host=\(host) port=\(cluster.port) dbname=\(cluster.database) user=\(role) passfile=\(cluster.root)/pgpass \(tls)"
    }

    @Test func verifyFullGivesAnEncryptedSession() throws {
        let (_, certificates) = try Self.setup.get()
        let c = try PGConnection(try Self.conninfo("sslmode=verify-full sslrootcert=\(certificates.authority)"))
        #expect(try c.execute("SELECT ssl::text FROM pg_stat_ssl WHERE pid = pg_backend_pid()").text(0, 0) == "true")
    }

    @Test func aServerTheSettingsRefuseIsARefusedLogin() throws {
        let (cluster, certificates) = try Self.setup.get()
        let refused = [
            (try Self.conninfo("sslmode=verify-full sslrootcert=\(certificates.otherAuthority)"), "certificate verify failed"),
            (try Self.conninfo(host: "127.0.0.1", "sslmode=verify-full sslrootcert=\(certificates.authority)"), "does not match host name"),
            (try Self.conninfo("sslmode=verify-ca sslrootcert=\(cluster.root)/none.crt"), "does not exist")
        ]
        for (conninfo, reason) in refused {
            let e = pgError { _ = try PGConnection(conninfo) }
            #expect(e?.kind == .connection && e?.loginRefused == true && e?.message.contains(reason) == true, "\(String(describing: e))")
        }
        // A server without TLS where the string requires it (the shared cluster has none).
        let plain = try Shared.cluster()
        let e = pgError { _ = try PGConnection(plain.tcpConninfo(user: Shared.role, "passfile=\(Shared.passfile(plain)) sslmode=require")) }
        #expect(e?.loginRefused == true && e?.message.contains("SSL was required") == true, "\(String(describing: e))")
    }

    @Test func noServerWithTheSameSettingsIsStillAway() throws {
        let (_, certificates) = try Self.setup.get()
        let e = pgError {
            _ = try PGConnection("host=localhost port=1 dbname=x user=\(Self.role) sslmode=verify-full sslrootcert=\(certificates.authority)")
        }
        #expect(e?.kind == .connection && e?.loginRefused == false, "\(String(describing: e))")
    }
}
