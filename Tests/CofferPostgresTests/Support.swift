import CofferStore
import CofferTestSupport
import Foundation
import Testing

/// One cluster for the tests that do not stop the server (a cluster costs seconds to start); stopped
/// at exit (and by its watchdog if the runner dies). Tests use tables of their own.
enum Shared {
    static let password = "Pw-7f3kQz!x9"
    static let role = "coffer_pw"

    static let setup: Result<PostgresCluster, any Error> = Result {
        let cluster = try PostgresCluster()
        atexit { if case .success(let c) = Shared.setup { c.destroy() } }
        try cluster.psql("CREATE ROLE \(role) LOGIN PASSWORD '\(password)'; GRANT ALL ON SCHEMA public TO \(role)")
        try "127.0.0.1:\(cluster.port):*:\(role):\(password)\n".write(toFile: passfile(cluster), atomically: true, encoding: .utf8)
        chmod(passfile(cluster), 0o600)  // libpq ignores a passfile others can read
        return cluster
    }

    static func cluster() throws -> PostgresCluster { try setup.get() }
    static func passfile(_ c: PostgresCluster) -> String { c.root + "/pgpass" }

    /// A connection as the password role, the password coming from a passfile (never the string).
    static func passwordConninfo() throws -> String {
        let c = try cluster()
        return c.tcpConninfo(user: role, "passfile=\(passfile(c))")
    }
}

/// A fresh table name, so tests sharing the cluster do not see each other's rows.
func freshTable(_ c: PGConnection, _ columns: String) throws -> String {
    let name = "t_" + UUID().uuidString.replacingOccurrences(of: "-", with: "").lowercased()
    try c.executeScript("CREATE TABLE \(name) (\(columns))")
    return name
}

func count(_ c: PGConnection, _ table: String) throws -> Int64 {
    try required(try c.execute("SELECT count(*) FROM \(table)").int64(0, 0))
}

/// The error `body` throws, as a PGError (a test failure when it throws nothing or something else).
func pgError(_ body: () throws -> Void, sourceLocation: SourceLocation = #_sourceLocation) -> PGError? {
    do { try body() } catch let e as PGError { return e } catch {
        Issue.record("expected a PGError, got \(type(of: error)): \(error)", sourceLocation: sourceLocation)
        return nil
    }
    Issue.record("expected a PGError, nothing was thrown", sourceLocation: sourceLocation)
    return nil
}
