import CofferStore

/// Raw access to a store's rows for tests that tamper with them or replay old copies: through the
/// engine seam (`StoreBackend`), as an attacker who holds the store would, without any key.
extension EntityStore {
    /// Sealed chunks `first...last` that exist, copied out.
    public func sealedChunks(file: UInt64, first: UInt64, last: UInt64) throws -> [(index: UInt64, sealed: [UInt8])] {
        var out: [(index: UInt64, sealed: [UInt8])] = []
        try backend.forEachChunk(file: file, first: first, last: last) { out.append(($0, Array($1))) }
        return out
    }

    public func putChunk(file: UInt64, index: UInt64, sealed: [UInt8]) throws {
        try backend.putChunks(file: file, [(index, sealed)])
    }

    /// A chunk map page row's sealed bytes as stored.
    public func rawChunkMapPage(file: UInt64, page: UInt64) throws -> [UInt8]? {
        try backend.chunkMapPage(file: file, page: page)
    }

    public func putRawChunkMapPage(file: UInt64, page: UInt64, sealed: [UInt8]) throws {
        try backend.putChunkMapPage(file: file, page: page, sealed: sealed)
    }

    /// The SQLite engine under this store (every test store is one).
    public var sqlite: SQLiteBackend {
        guard let engine = backend as? SQLiteBackend else { fatalError("not a SQLite store") }
        return engine
    }
}
