import CofferTestSupport
import Foundation
#if canImport(Glibc)
    import Glibc
#endif

/// Which engine the sandboxes' containers use: `COFFER_TEST_ENGINE=postgres` puts each in a schema of
/// one private PostgreSQL cluster per test process (started on first use, stopped at exit), so the
/// mount suites run unchanged over either engine. A missing PostgreSQL fails the sandbox (never skips).
enum TestEngine {
    static let isPostgres = ProcessInfo.processInfo.environment["COFFER_TEST_ENGINE"] == "postgres"

    static let setup: Result<PostgresCluster, any Error> = Result {
        let cluster = try PostgresCluster()
        atexit { if case .success(let c) = TestEngine.setup { c.destroy() } }
        return cluster
    }

    static func cluster() throws -> PostgresCluster { try setup.get() }

    /// A URI for a container no other test uses (superuser over the private socket: no password).
    static func freshURI() throws -> String {
        try cluster().superuserURI + "&container=c_" + UUID().uuidString.replacingOccurrences(of: "-", with: "").lowercased().prefix(20)
    }

    /// A second cluster, for the suites of several mounts (SharedMountTests, SharedLocksTests): the
    /// shared one is restarted under its mounts by PostgresCLITests, which may run at the same time.
    static let quietSetup: Result<PostgresCluster, any Error> = Result {
        let cluster = try PostgresCluster()
        atexit { if case .success(let c) = TestEngine.quietSetup { c.destroy() } }
        return cluster
    }

    /// A URI for a fresh container on the quiet cluster.
    static func quietURI() throws -> String {
        try quietSetup.get().superuserURI + "&container=c_" + UUID().uuidString.replacingOccurrences(of: "-", with: "").lowercased().prefix(20)
    }

    static func isURI(_ s: String) -> Bool { s.hasPrefix("postgresql://") || s.hasPrefix("postgres://") }

    /// The live `coffer` process serving `uri` (the daemon: its argv names the container and the mount).
    static func daemonPid(uri: String) -> pid_t? {
        let pids = ((try? FileManager.default.contentsOfDirectory(atPath: "/proc")) ?? []).compactMap { pid_t($0) }
        return pids.first { pid in
            let args = E2E.cmdline(pid)
            return args.count > 2 && args[1] == "mount" && args.contains(uri) && E2E.isAlive(pid)
                && (args.contains("--ready-fd") || args.contains("-f") || args.contains("--foreground"))
        }
    }
}
