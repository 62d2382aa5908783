import Foundation
import Glibc

/// The container a copy reads: its header bytes and its store in one snapshot (`beginSnapshot`).
/// A directory container must not be mounted (the daemon holds its store): the CLI holds its lock, or
/// reads a snapshot its daemon wrote (`open(directory:snapshot:)`).
public final class CopySource {
    public let header: [UInt8]
    public let containerId: [UInt8]
    let chunkSize: Int
    let backend: any StoreBackend
    let schema: StoreSchema
    let state: [UInt8]

    /// Segment files of the source that its rows point into and that are missing or short: a copy would
    /// carry their chunks as damage (the rows are copied, not opened), so it is refused.
    public func missingContent() throws -> [String] { try backend.segmentFileCheck() }

    private init(header: [UInt8], backend: any StoreBackend) throws {
        self.header = header
        self.backend = backend
        let h = try Container.decodeHeader(Data(header))
        containerId = [UInt8](hex: h.containerId) ?? []
        chunkSize = h.chunkSize
        schema = try backend.readSchema()
        guard schema.meta["format"] == Array(EntityStore.formatVersion.utf8) else { throw StoreError.notAStore("unknown store format") }
        guard schema.meta["container"] == containerId else { throw StoreError.wrongContainer }
        guard let state = schema.meta["state"] else { throw StoreError.notAStore("no store state") }
        self.state = state
    }

    /// Opens the source read-only and takes the snapshot.
    public static func open(_ location: ContainerLocation) throws -> CopySource {
        switch location {
        case .directory(let path):
            let c = try Container.open(at: path)
            guard let header = FileManager.default.contents(atPath: c.headerPath) else {
                throw ContainerError.unreadable(path, ContainerHeader.fileName)
            }
            // A copy takes only Coffer's tables: it is also how to get a clean store out of an edited one.
            let backend = try SQLiteBackend.open(at: try c.storePath(), readOnly: true, foreign: .tolerate)
            return try opened([UInt8](header), backend)
        case .postgres(let p):
            let backend = try PostgresBackend.open(p, readOnly: true)
            do {
                try backend.beginSnapshot()
                guard let header = try backend.headerBytes() else { throw ContainerError.headerDamaged("the header row is missing") }
                return try CopySource(header: header, backend: backend)
            } catch {
                backend.close()
                throw error
            }
        }
    }

    /// The header of the container at `path` with the rows of `store`, a snapshot of its store.
    public static func open(directory path: String, snapshot store: String) throws -> CopySource {
        let c = try Container.open(at: path)
        guard let header = FileManager.default.contents(atPath: c.headerPath) else {
            throw ContainerError.unreadable(path, ContainerHeader.fileName)
        }
        return try opened([UInt8](header), try SQLiteBackend.open(at: store, readOnly: true, foreign: .tolerate))
    }

    private static func opened(_ header: [UInt8], _ backend: SQLiteBackend) throws -> CopySource {
        do {
            try backend.beginSnapshot()
            return try CopySource(header: header, backend: backend)
        } catch {
            backend.close()
            throw error
        }
    }

    public func close() { backend.close() }
}

/// What is at the destination: nothing yet (nil: the copy creates it), an unfinished copy (its store,
/// open for writing), or something else, refused.
enum CopyDestination {
    static func openDirectory(_ path: String, source: CopySource) throws -> (any StoreBackend)? {
        var st = stat()
        guard stat(path, &st) == 0 else {
            guard errno == ENOENT, mkdir(path, 0o700) == 0 else { throw ContainerError.io("\(path): \(String(cString: strerror(errno)))") }
            return nil
        }
        guard (st.st_mode & S_IFMT) == S_IFDIR else { throw CopyRefusal("\(path) exists and is not a directory: refusing to overwrite it") }
        let entries = (try? FileManager.default.contentsOfDirectory(atPath: path)) ?? ["?"]
        if entries.isEmpty { return nil }
        if holdsOnlyLeftovers(path, entries) {
            removeStore(path)
            return nil
        }
        let headerId = headerIdIn(path)
        if let headerId, headerId != source.containerId.hexString { throw refusal(path, headerId: headerId, source: source) }
        let storePath = path + "/" + SQLiteBackend.fileName
        guard entries.contains(SQLiteBackend.fileName) else { throw refusal(path, headerId: headerId, source: source) }
        // Read-only first: a writable open of someone else's SQLite file would turn it to WAL mode.
        let look = try? SQLiteBackend.open(at: storePath, readOnly: true)
        let record = try? look?.copyProgress()
        look?.close()
        guard record != nil else { throw refusal(path, headerId: headerId, source: source) }
        let store = try SQLiteBackend.open(at: storePath, readOnly: false)
        do { try store.startWriting() } catch {
            store.close()
            throw error
        }
        return store
    }

    static func openPostgres(_ location: PostgresLocation, source: CopySource) throws -> (any StoreBackend)? {
        guard try PostgresHeader.exists(location) else { return nil }
        let store = try PostgresBackend.open(location, readOnly: false)
        do {
            if try store.copyProgress() == nil {
                let id = try store.headerBytes().flatMap { try? Container.decodeHeader(Data($0)).containerId }
                throw refusal(location.display, headerId: id, source: source)
            }
        } catch {
            store.close()
            throw error
        }
        return store
    }

    /// The name a new store is made under until it holds its first progress record (StoreCopy.create).
    static let newStoreName = SQLiteBackend.fileName + ".new"
    /// The files beside either store (SQLite's journal, WAL and shared memory) and the space reserve.
    private static let leftoverFiles =
        [SpaceReserve.fileName] + ["-journal", "-wal", "-shm"].flatMap { [SQLiteBackend.fileName + $0, newStoreName + $0] }

    /// What a copy killed before its store held a progress record leaves (StoreCopy.create), or one killed
    /// while an unfinished copy was removed (`removeStore`): the store under its temporary name, the files
    /// beside a store, and the segments directory, empty unless that store is there (a removal under way).
    /// No container and nobody's data: the copy starts afresh there.
    private static func holdsOnlyLeftovers(_ path: String, _ entries: [String]) -> Bool {
        let ours = Set([newStoreName] + leftoverFiles)
        let segments = try? FileManager.default.contentsOfDirectory(atPath: path + "/" + Segments.directoryName)
        return entries.allSatisfy { name in
            ours.contains(name) || (name == Segments.directoryName && segments.map { $0.isEmpty || entries.contains(newStoreName) } == true)
        }
    }

    /// An unfinished copy started over: its files go, the header first (it must not be mounted half-copied),
    /// then the store, renamed to its temporary name so that a copy killed on the way leaves either a store
    /// with its progress record or leftovers only (`holdsOnlyLeftovers`), which goes last.
    static func removeStore(_ path: String) {
        unlink(path + "/" + ContainerHeader.fileName)
        rename(path + "/" + SQLiteBackend.fileName, path + "/" + newStoreName)
        let segments = path + "/" + Segments.directoryName
        for f in (try? FileManager.default.contentsOfDirectory(atPath: segments)) ?? [] { unlink(segments + "/" + f) }
        rmdir(segments)
        for f in leftoverFiles + [newStoreName] { unlink(path + "/" + f) }
    }

    private static func headerIdIn(_ path: String) -> String? {
        guard let data = FileManager.default.contents(atPath: path + "/" + ContainerHeader.fileName) else { return nil }
        return (try? Container.decodeHeader(data))?.containerId ?? "unreadable"
    }

    static func refusal(_ dest: String, headerId: String?, source: CopySource) -> CopyRefusal {
        guard let headerId else { return CopyRefusal("\(dest) exists and is not an unfinished copy of this container: refusing to overwrite it") }
        if headerId == source.containerId.hexString {
            return CopyRefusal("\(dest) is already a complete copy of this container (id \(headerId)): refusing to overwrite it; copy to a new place")
        }
        return CopyRefusal("\(dest) is a different container (id \(headerId)): refusing to overwrite it")
    }
}
