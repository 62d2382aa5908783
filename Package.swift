// swift-tools-version:6.0
// Coffer: an encrypted document filesystem. One module per layer (see docs/ARCHITECTURE.md):
// coffer (CLI) -> CofferFUSE -> CofferFS -> CofferStore -> CofferCrypto -> C libraries.
import PackageDescription

let package = Package(
    name: "Coffer",
    platforms: [.macOS(.v14)],
    products: [
        .executable(name: "coffer", targets: ["coffer"])
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-argument-parser", from: "1.8.2"),
        .package(url: "https://github.com/apple/swift-log", from: "1.16.2"),
        .package(url: "https://github.com/groue/GRDB.swift", from: "7.10.0")
    ],
    targets: [
        // System libraries: thin module maps over Debian's -dev packages.
        .systemLibrary(name: "CCrypto", pkgConfig: "libcrypto", providers: [.apt(["libssl-dev"])]),
        .systemLibrary(name: "CArgon2", pkgConfig: "libargon2", providers: [.apt(["libargon2-dev"])]),
        .systemLibrary(name: "CFuse3", pkgConfig: "fuse3", providers: [.apt(["libfuse3-dev"])]),
        .systemLibrary(name: "CPostgres", pkgConfig: "libpq", providers: [.apt(["libpq-dev"])]),

        // Beside the system libraries: a SIGBUS guard for memory-mapped store reads (C: a signal handler).
        .target(name: "CMappedFault"),
        // Beside the system libraries: hole punching, early writeback and O_DIRECT for segment files (GNU calls).
        .target(name: "CFileSpace"),
        // Beside libfuse 3.14: FUSE over io_uring (liburing), which that libfuse does not know.
        .target(name: "CFuseRing", linkerSettings: [.linkedLibrary("uring")]),
        // Beside the system libraries: a mount's SIGINT/SIGTERM/SIGHUP handler, which only writes to a pipe (C: a signal handler).
        .target(name: "CStopSignals"),

        // Layer 5: crypto primitives and locked key memory.
        .target(name: "CofferCrypto", dependencies: ["CCrypto", "CArgon2"]),
        // Layer 4: container header, key slots, transformers, the sealed entity store.
        .target(
            name: "CofferStore",
            dependencies: [
                "CofferCrypto", "CMappedFault", "CFileSpace", "CPostgres",
                .product(name: "GRDB", package: "GRDB.swift"),
                .product(name: "GRDBSQLite", package: "GRDB.swift"),
                .product(name: "Logging", package: "swift-log")
            ]),
        // Layer 3: POSIX filesystem semantics over the store, testable without FUSE.
        .target(
            name: "CofferFS",
            dependencies: [
                "CofferStore",
                .product(name: "Logging", package: "swift-log")
            ]),
        // Beside CofferFS: `coffer fsck`'s checker and repairer, over the store alone.
        .target(name: "CofferCheck", dependencies: ["CofferStore", "CofferCrypto"]),
        // Layer 2: libfuse3 low-level adapter.
        .target(
            name: "CofferFUSE",
            dependencies: [
                "CofferFS", "CFuse3", "CFuseRing", "CStopSignals",
                .product(name: "Logging", package: "swift-log")
            ]),
        // Layer 1: the `coffer` command.
        .executableTarget(
            name: "coffer",
            dependencies: [
                "CofferFUSE", "CofferFS", "CofferStore", "CofferCrypto", "CofferCheck",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "Logging", package: "swift-log")
            ]),

        // Helpers the test targets share (expectations, seeded generator); only tests depend on it.
        .target(name: "CofferTestSupport", path: "Tests/CofferTestSupport"),
        // Raw row access for tamper and replay tests, through the engine seam.
        .target(
            name: "CofferStoreTestSupport", dependencies: ["CofferStore", "CofferCrypto", "CofferTestSupport"], path: "Tests/CofferStoreTestSupport"),
        .testTarget(name: "CofferCryptoTests", dependencies: ["CofferCrypto"]),
        .testTarget(
            name: "CofferStoreTests", dependencies: ["CofferStore", "CofferCrypto", "CofferTestSupport", "CofferStoreTestSupport", "CFileSpace"]),
        .testTarget(name: "CofferFSTests", dependencies: ["CofferFS", "CofferStore", "CofferCrypto", "CofferTestSupport", "CofferStoreTestSupport"]),
        .testTarget(
            name: "CofferCheckTests",
            dependencies: [
                "CofferCheck", "CofferTestSupport", "CofferStoreTestSupport", "CofferFS", "CofferStore", "CofferCrypto",
                .product(name: "GRDB", package: "GRDB.swift"),
                .product(name: "Logging", package: "swift-log")
            ]),
        // The PostgreSQL client plumbing against a private cluster the tests start (needs postgresql).
        .testTarget(name: "CofferPostgresTests", dependencies: ["CofferStore", "CofferTestSupport"]),
        .testTarget(name: "CofferFUSETests", dependencies: ["CofferFUSE", "CofferFS"]),
        // Drives the built `coffer` binary: CLI and real FUSE mounts.
        .testTarget(name: "CofferCLITests", dependencies: ["coffer", "CofferFUSE", "CofferTestSupport", "CFileSpace"])
    ],
    swiftLanguageModes: [.v6]
)
