import CofferCrypto
import CofferStore
import CofferTestSupport
import Foundation

/// The store engines a test can run on. Tests that hold for every engine take one as an argument.
public enum StoreEngine: String, CaseIterable, Sendable, CustomStringConvertible {
    case sqlite, postgres
    public var description: String { rawValue }

    /// The engine the filesystem fixtures use: `COFFER_TEST_ENGINE=postgres` runs them over PostgreSQL.
    public static var fromEnvironment: StoreEngine {
        ProcessInfo.processInfo.environment["COFFER_TEST_ENGINE"].flatMap(StoreEngine.init(rawValue:)) ?? .sqlite
    }
}

/// One private cluster for the store and filesystem tests that leave the server running (a cluster
/// costs seconds to start), stopped at exit and by its watchdog if the runner dies. Every test
/// store is a container schema of its own in it.
public enum TestPostgres {
    static let setup: Result<PostgresCluster, any Error> = Result {
        let cluster = try PostgresCluster()
        atexit { if case .success(let c) = TestPostgres.setup { c.destroy() } }
        return cluster
    }

    public static func cluster() throws -> PostgresCluster { try setup.get() }

    /// A location no other test uses: a fresh schema name in the shared cluster.
    public static func freshLocation(in cluster: PostgresCluster? = nil) throws -> PostgresLocation {
        let c = try cluster ?? self.cluster()
        let name = "c_" + UUID().uuidString.replacingOccurrences(of: "-", with: "").lowercased()
        return try PostgresLocation(uri: c.superuserURI + "&container=" + name)
    }
}

/// A store created for a test, on either engine, that can be opened again (a remount).
public struct TestStore {
    public let engine: StoreEngine
    public let keys: ContainerKeys
    /// The SQLite file, or the PostgreSQL container.
    public let path: String
    public let location: PostgresLocation?

    /// Creates an empty store (random keys: no KDF) in `dir` or in a fresh schema.
    public static func create(
        _ engine: StoreEngine, in dir: String, name: String = "store.db", chunkSize: Int = 65536,
        cluster: PostgresCluster? = nil, registry: TransformerRegistry = .standard
    ) throws -> TestStore {
        let keys = try ContainerKeys(master: try SecureBytes.random(count: 32), containerId: try Random.bytes(16))
        switch engine {
        case .sqlite:
            let path = dir + "/" + name
            try EntityStore.create(at: path, keys: keys, registry: registry, chunkSize: chunkSize)
            return TestStore(engine: engine, keys: keys, path: path, location: nil)
        case .postgres:
            let location = try TestPostgres.freshLocation(in: cluster)
            let backend = try PostgresBackend.create(location, header: Array("{}".utf8))
            defer { backend.close() }
            try EntityStore.initialize(backend, keys: keys, registry: registry)
            return TestStore(engine: engine, keys: keys, path: location.display, location: location)
        }
    }

    public func open(readOnly: Bool = false, reconnectWait: Double = 30) throws -> EntityStore {
        guard let location else { return try EntityStore.open(at: path, keys: keys, readOnly: readOnly) }
        return try EntityStore.open(try PostgresBackend.open(location, readOnly: readOnly, reconnectWait: reconnectWait), keys: keys)
    }
}
