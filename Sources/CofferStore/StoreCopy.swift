import Foundation
import Glibc

/// `coffer copy`: a container's header and sealed rows moved as they are between engines (no key is
/// used, so the copy is the same container: same id, same keys). The source is read in one snapshot
/// (`beginSnapshot`); the destination gets its rows table by table in batches, each committed with a
/// progress record (`setCopyProgress`), so an interrupted copy goes on where it stopped. The header
/// comes last: until then the destination is no container, only an unfinished copy.
public final class StoreCopy {
    /// The progress record (JSON): whose copy, of which source state, and how far it got.
    struct Progress: Codable {
        var source: String  // container id (hex)
        var state: String  // the source's sealed store state (hex): the snapshot copied
        var step = 0  // Step.rawValue
        var done = 0  // rows (chunks: files) of the step already copied
        var index: Int64?  // chunks: the last index copied of file `done`
        var copied = 0  // rows copied in all

        /// The record is read back from the destination, where anyone may have edited it: a step that
        /// does not exist or counts that would index out of range or overflow make it unreadable.
        var isSane: Bool { Step(rawValue: step) != nil && done >= 0 && copied >= 0 && copied < 1 << 52 }
    }

    enum Step: Int { case inodes, entries, xattrs, maps, orphans, chunks, finished }

    /// Rows per batch at most, and sealed bytes per batch (`COFFER_COPY_TEST_BATCH_BYTES` in the CLI).
    public var batchRows = 4096
    public var batchBytes = 8 << 20
    /// Called with (rows copied, rows in all) after every batch.
    public var progress: (Int, Int) -> Void = { _, _ in }
    /// Called with the number of batches committed so far (the CLI's interruption hook); with 0 once the
    /// new destination store is made, before its first commit.
    public var afterBatch: (Int) -> Void = { _ in }
    /// One line for the user (resuming, starting over).
    public var notice: (String) -> Void = { _ in }

    let source: CopySource
    let destination: ContainerLocation
    private var dest: (any StoreBackend)?
    private var p: Progress
    private var batches = 0, pendingRows = 0, pendingBytes = 0, total = 0

    public init(from source: CopySource, to destination: ContainerLocation) {
        self.source = source
        self.destination = destination
        p = Progress(source: source.containerId.hexString, state: source.state.hexString)
    }

    /// Copies (or finishes an unfinished copy). Returns the rows copied by this run and whether it
    /// resumed an earlier one.
    public func run() throws -> (rows: Int, resumed: Bool) {
        let c = try source.backend.counts()
        total = c.inodes + c.entries + c.xattrs + c.chunkMapPages + c.chunks + (try source.backend.orphans().count)
        let resumed = try openDestination()
        guard let dest else { throw StoreError.database("no destination") }
        defer { dest.close() }
        let before = p.copied
        progress(p.copied, total)
        try copyRows(dest)
        try finish(dest)
        return (p.copied - before, resumed)
    }

    // MARK: Rows

    private func copyRows(_ d: any StoreBackend) throws {
        let s = source.backend
        while let step = Step(rawValue: p.step), step != .finished {
            switch step {
            case .inodes:
                try each(s.allInodeRows().sorted { $0.id < $1.id }) {
                    try d.putInode($0.id, sealed: $0.sealed)
                    return $0.sealed.count
                }
            case .entries:
                try each(s.allEntryRows().sorted { ($0.parentTag, $0.tag) < ($1.parentTag, $1.tag) }) {
                    _ = try d.putEntry(parentTag: $0.parentTag, tag: $0.tag, sealed: $0.sealed, replace: true)
                    return $0.sealed.count
                }
            case .xattrs:
                try each(s.allXattrRows().sorted { ($0.inode, $0.tag) < ($1.inode, $1.tag) }) {
                    try d.putXattr(inode: $0.inode, tag: $0.tag, sealed: $0.sealed)
                    return $0.sealed.count
                }
            case .maps:
                try each(s.allChunkMapRows().sorted { ($0.file, $0.page) < ($1.file, $1.page) }) {
                    try d.putChunkMapPage(file: $0.file, page: $0.page, sealed: $0.sealed)
                    return $0.sealed.count
                }
            case .orphans:
                try each(s.orphans().sorted()) {
                    try d.addOrphan($0)
                    return 8
                }
            case .chunks:
                try copyChunks(d)
            case .finished: break
            }
            p.step += 1
            p.done = 0
            p.index = nil
            try checkpoint(d)
        }
    }

    /// Copies `rows[p.done...]`; `put` returns the bytes it wrote.
    private func each<R>(_ rows: [R], _ put: (R) throws -> Int) throws {
        guard let d = dest else { return }
        while p.done < rows.count {
            count(bytes: try put(rows[p.done]))
            p.done += 1
            if isBatchFull { try checkpoint(d) }
        }
    }

    /// Files in id order, each file's rows in index order; a file is resumed after `p.index`.
    private func copyChunks(_ d: any StoreBackend) throws {
        let files = try source.backend.chunkFileSummaries().map(\.file).sorted()
        while p.done < files.count {
            let file = files[p.done]
            let after = p.index
            var rows: [(index: UInt64, sealed: [UInt8])] = []
            func flush() throws {
                guard let last = rows.last else { return }
                try d.putChunks(file: file, rows)
                p.index = Int64(bitPattern: last.index)
                rows.removeAll(keepingCapacity: true)
            }
            try source.backend.forEachChunkRow(file: file) { index, sealed in
                if let after, Int64(bitPattern: index) <= after { return }
                rows.append((index, Array(sealed)))
                count(bytes: sealed.count)
                if isBatchFull {
                    try flush()
                    try checkpoint(d)
                }
            }
            try flush()
            p.done += 1
            p.index = nil
            if isBatchFull { try checkpoint(d) }
        }
    }

    private func count(bytes: Int) {
        pendingRows += 1
        pendingBytes += bytes
        p.copied += 1
    }

    private var isBatchFull: Bool { pendingRows >= batchRows || pendingBytes >= batchBytes }

    /// Commits the batch with the progress that counts it (one transaction), and the source's state
    /// row as it is (the engine writes it with every commit).
    private func checkpoint(_ d: any StoreBackend) throws {
        try commitProgress(d)
        batchCommitted()
    }

    private func commitProgress(_ d: any StoreBackend) throws {
        try d.setCopyProgress(try JSONEncoder().encode(p).map { $0 })
        _ = try d.commit(durable: p.step == Step.finished.rawValue) { () throws(StoreError) -> [UInt8] in source.state }
    }

    private func batchCommitted() {
        pendingRows = 0
        pendingBytes = 0
        batches += 1
        progress(p.copied, total)
        afterBatch(batches)
    }

    // MARK: The destination

    /// The header, then the progress record goes: a directory's `coffer.json` is written (again,
    /// after every resume) before the record is dropped; PostgreSQL's header row and the drop are one
    /// transaction.
    private func finish(_ d: any StoreBackend) throws {
        switch destination {
        case .directory(let path):
            try FileIO.writeAtomically(Data(source.header), to: path + "/" + ContainerHeader.fileName, mode: 0o600)
        case .postgres:
            guard let pg = d as? PostgresBackend else { throw StoreError.database("not a PostgreSQL store") }
            try pg.putHeader(source.header)
        }
        try d.setCopyProgress(nil)
        _ = try d.commit(durable: true) { () throws(StoreError) -> [UInt8] in source.state }
    }

    /// Creates the destination, or reopens an unfinished copy of this source (true). Anything else
    /// there is refused, never overwritten.
    private func openDestination() throws -> Bool {
        switch destination {
        case .directory(let path):
            if let store = try CopyDestination.openDirectory(path, source: source) {
                return try resume(store) { CopyDestination.removeStore(path) }
            }
        case .postgres(let location):
            if let store = try CopyDestination.openPostgres(location, source: source) {
                return try resume(store) { try PostgresBackend.dropUnfinishedCopy(location) }
            }
        }
        try create()
        return false
    }

    /// An unfinished copy of this source: resumed when it copies the same source state, started over
    /// (after `discard`) when the source changed since.
    private func resume(_ store: any StoreBackend, discard: () throws -> Void) throws -> Bool {
        guard let bytes = try store.copyProgress(), let record = try? JSONDecoder().decode(Progress.self, from: Data(bytes)), record.isSane else {
            store.close()
            throw CopyRefusal("\(destination): the copy's progress record cannot be read; remove it and copy again")
        }
        guard record.source == p.source else {
            store.close()
            throw CopyRefusal("\(destination) is an unfinished copy of a different container (id \(record.source)): refusing to overwrite it")
        }
        if record.state == p.state {
            p = record
            dest = store
            notice("resuming an interrupted copy: \(p.copied) of \(total) rows were copied")
            return true
        }
        store.close()
        notice("the source changed since the interrupted copy: starting over")
        try discard()
        try create()
        return false
    }

    /// A new, empty store of the destination's engine with the source's schema rows and the first
    /// progress record, in one transaction. A directory's store is made under a temporary name and
    /// renamed to `store.db` only then: a copy killed before leaves no `store.db` without a progress
    /// record (which would be refused as someone else's), only that name, cleared by the next run
    /// (CopyDestination.openDirectory). PostgreSQL's schema, tables and first record are one transaction.
    private func create() throws {
        switch destination {
        case .directory(let path):
            let temporary = path + "/" + CopyDestination.newStoreName, final = path + "/" + SQLiteBackend.fileName
            let store = try SQLiteBackend.create(at: temporary, chunkSize: source.chunkSize)
            chmod(temporary, 0o600)
            afterBatch(0)
            try store.initializeSchema(source.schema)
            try commitProgress(store)
            store.close()
            // Its WAL was folded in (close removes an empty one): the record is in the file renamed.
            guard access(temporary + "-wal", F_OK) != 0 else { throw StoreError.database("\(temporary): the new store's WAL was not folded in") }
            guard rename(temporary, final) == 0 else { throw StoreError.database("\(final): \(String(cString: strerror(errno)))") }
            let reopened = try SQLiteBackend.open(at: final, readOnly: false)
            dest = reopened
            // startWriting keeps the -shm, so that another process can read what a killed copy committed
            // (SQLiteBackend.keepSharedMemoryFile).
            try reopened.startWriting()
        case .postgres(let location):
            let store = try PostgresBackend.create(location, header: nil)
            dest = store
            afterBatch(0)
            try store.initializeSchema(source.schema)
            try commitProgress(store)
        }
        batchCommitted()
    }
}

/// Why a destination is refused (it exists and is not an unfinished copy of this source).
public struct CopyRefusal: Error, CustomStringConvertible {
    public let description: String
    init(_ message: String) { description = message }
}

private func < (a: ([UInt8], [UInt8]), b: ([UInt8], [UInt8])) -> Bool {
    a.0 != b.0 ? a.0.lexicographicallyPrecedes(b.0) : a.1.lexicographicallyPrecedes(b.1)
}

private func < (a: (UInt64, [UInt8]), b: (UInt64, [UInt8])) -> Bool {
    a.0 != b.0 ? a.0 < b.0 : a.1.lexicographicallyPrecedes(b.1)
}
