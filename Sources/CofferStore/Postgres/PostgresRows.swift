/// The rows of each entity kind in the container's schema (PostgresSQL.swift): ids as int8 with
/// SQLite's bit patterns, tags and sealed values as bytea. Every statement is prepared once per
/// session; a read or a write whose answer is needed is one round trip, a write whose answer nothing
/// waits for goes with the next one (`later`). Metadata goes through the writer (it must see the open group).
extension PostgresBackend {
    static func id(_ v: UInt64) -> PGValue { .int8(Int64(bitPattern: v)) }

    /// One bytea value of the first row, or nil when there is none.
    func value(_ statement: String, _ params: [PGValue]) throws(StoreError) -> [UInt8]? {
        try read { c in
            let r = try c.execute(statement, params, prepared: true)
            return r.rowCount == 0 ? nil : try r.bytes(0, 0)
        }
    }

    func exists(_ statement: String, _ params: [PGValue]) throws(StoreError) -> Bool {
        try read { c in try c.execute(statement, params, prepared: true).bool(0, 0) ?? false }
    }

    /// A write; returns the rows it touched.
    @discardableResult
    func change(_ statement: String, _ params: [PGValue], bytes: Int = 0, file: UInt64? = nil) throws(StoreError) -> Int {
        try write(bytes: bytes, file: file) { c in try c.execute(statement, params, prepared: true).affectedRows }
    }

    /// (bytea, bytea) rows: a tag and a sealed value.
    func tagged(_ statement: String, _ params: [PGValue]) throws(StoreError) -> [(tag: [UInt8], sealed: [UInt8])] {
        try read { c in
            let r = try c.execute(statement, params, prepared: true)
            return try (0..<r.rowCount).map { i in (try r.bytes(i, 0) ?? [], try r.bytes(i, 1) ?? []) }
        }
    }

    func ids(_ statement: String, _ params: [PGValue]) throws(StoreError) -> [UInt64] {
        try read { c in
            let r = try c.execute(statement, params, prepared: true)
            return try (0..<r.rowCount).map { i in UInt64(bitPattern: try r.int64(i, 0) ?? 0) }
        }
    }

    // MARK: Inodes

    public func inode(_ id: UInt64) throws(StoreError) -> [UInt8]? { try value(sql.inode, [Self.id(id)]) }
    public func inodes(_ ids: [UInt64]) throws(StoreError) -> [UInt64: [UInt8]] {
        guard !ids.isEmpty else { return [:] }
        return try read { c in
            let r = try c.execute(sql.inodesAmong, [.int8Array(ids.map { Int64(bitPattern: $0) })], prepared: true)
            let asked = Set(ids)
            var out: [UInt64: [UInt8]] = [:]
            for i in 0..<r.rowCount {
                guard let id = try r.int64(i, 0).map({ UInt64(bitPattern: $0) }), asked.contains(id), let value = try r.bytes(i, 1) else { continue }
                out[id] = value
            }
            return out
        }
    }
    public func putInode(_ id: UInt64, sealed: [UInt8]) throws(StoreError) {
        try later(sql.putInode, [Self.id(id), .bytea(sealed)], bytes: sealed.count, inode: id)
    }
    public func deleteInode(_ id: UInt64) throws(StoreError) {
        try later(sql.deleteInode, [Self.id(id)], inode: id)
    }

    // MARK: Directory entries

    public func entry(parentTag: [UInt8], tag: [UInt8]) throws(StoreError) -> [UInt8]? { try value(sql.entry, [.bytea(parentTag), .bytea(tag)]) }

    public func putEntry(parentTag: [UInt8], tag: [UInt8], sealed: [UInt8], replace: Bool) throws(StoreError) -> Bool {
        // A replacing put always lands; only an adding one must be answered (EEXIST).
        guard !replace else {
            try later(sql.replaceEntry, [.bytea(parentTag), .bytea(tag), .bytea(sealed)], bytes: sealed.count)
            return true
        }
        return try change(sql.addEntry, [.bytea(parentTag), .bytea(tag), .bytea(sealed)], bytes: sealed.count) == 1
    }

    public func deleteEntry(parentTag: [UInt8], tag: [UInt8]) throws(StoreError) { try later(sql.deleteEntry, [.bytea(parentTag), .bytea(tag)]) }

    /// bytea compares bytewise, as SQLite's BLOB does: the same tag order in both engines.
    public func entryPage(parentTag: [UInt8], from: [UInt8], limit: Int) throws(StoreError) -> [(tag: [UInt8], sealed: [UInt8])] {
        try tagged(sql.entryPage, [.bytea(parentTag), .bytea(from), .int8(limit < 0 ? Int64.max : Int64(limit))])
    }

    public func hasEntries(parentTag: [UInt8]) throws(StoreError) -> Bool { try exists(sql.hasEntries, [.bytea(parentTag)]) }

    /// One statement per directory, all in one pipeline.
    public func entries(parentTags: [[UInt8]]) throws(StoreError) -> [[(tag: [UInt8], sealed: [UInt8])]] {
        guard !parentTags.isEmpty else { return [] }
        return try read { c in
            let all = [PGValue.bytea([]), .int8(Int64.max)]
            let r = try c.pipeline(parentTags.map { PGStatement(sql.entryPage, [.bytea($0)] + all, prepared: true) })
            guard r.count == parentTags.count else { throw PGError(.unexpectedResult, "a pipeline of \(parentTags.count) answered \(r.count)") }
            return try r.map { page in try (0..<page.rowCount).map { i in (try page.bytes(i, 0) ?? [], try page.bytes(i, 1) ?? []) } }
        }
    }

    // MARK: Chunk map pages

    public func chunkMapPage(file: UInt64, page: UInt64) throws(StoreError) -> [UInt8]? { try value(sql.chunkMap, [Self.id(file), Self.id(page)]) }
    public func putChunkMapPage(file: UInt64, page: UInt64, sealed: [UInt8]) throws(StoreError) {
        try later(sql.putChunkMap, [Self.id(file), Self.id(page), .bytea(sealed)], bytes: sealed.count)
    }
    public func deleteChunkMapPages(file: UInt64, from: UInt64) throws(StoreError) {
        try later(sql.deleteChunkMapsFrom, [Self.id(file), Self.id(from)])
    }
    public func deleteChunkMapPage(file: UInt64, page: UInt64) throws(StoreError) { try later(sql.deleteChunkMap, [Self.id(file), Self.id(page)]) }

    // MARK: Extended attributes

    public func xattr(inode: UInt64, tag: [UInt8]) throws(StoreError) -> [UInt8]? { try value(sql.xattr, [Self.id(inode), .bytea(tag)]) }
    public func xattrs(inode: UInt64) throws(StoreError) -> [(tag: [UInt8], sealed: [UInt8])] { try tagged(sql.xattrs, [Self.id(inode)]) }
    public func putXattr(inode: UInt64, tag: [UInt8], sealed: [UInt8]) throws(StoreError) {
        try later(sql.putXattr, [Self.id(inode), .bytea(tag), .bytea(sealed)], bytes: sealed.count)
    }
    public func deleteXattr(inode: UInt64, tag: [UInt8]) throws(StoreError) -> Bool { try change(sql.deleteXattr, [Self.id(inode), .bytea(tag)]) > 0 }
    public func deleteXattrs(inode: UInt64) throws(StoreError) { try later(sql.deleteXattrs, [Self.id(inode)]) }

    // MARK: Orphans

    public func addOrphan(_ id: UInt64) throws(StoreError) { try later(sql.addOrphan, [Self.id(id)]) }
    public func removeOrphan(_ id: UInt64) throws(StoreError) { try later(sql.removeOrphan, [Self.id(id)]) }
    public func orphans() throws(StoreError) -> [UInt64] { try ids(sql.orphans, []) }
}
