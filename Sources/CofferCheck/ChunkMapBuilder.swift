import CofferCrypto
import CofferStore

/// Writes a file's chunk map from scratch (docs/FORMAT.md, "The chunk map"): up to 8 positions
/// inline in the inode, else the pages of 1024 positions that hold a tag, each sealed with a fresh
/// random version and listed in ascending order. Old page rows of the file go first, so none
/// survives under a stale version.
enum ChunkMapBuilder {
    static func write(_ tags: [UInt64: ChunkTag], file: UInt64, store: EntityStore) throws -> ChunkMapRoot {
        try store.backend.deleteAllChunkMapRows(file: file)
        let present = tags.filter { !$0.value.isHole }
        guard let last = present.keys.max() else { return .empty }
        if last < UInt64(ChunkMapRoot.inlineLimit) {
            return .inline((0...last).map { present[$0] ?? .hole })
        }
        let perPage = UInt64(ChunkMapRoot.positionsPerPage)
        var byPage: [UInt64: [UInt64: ChunkTag]] = [:]
        for (i, t) in present { byPage[i / perPage, default: [:]][i % perPage] = t }
        var refs: [ChunkMapPageRef] = []
        for (page, entries) in byPage.sorted(by: { $0.key < $1.key }) {
            guard let top = entries.keys.max() else { continue }
            refs.append(try store.writeChunkMapPage(file: file, page: page, tags: (0...top).map { entries[$0] ?? .hole }))
        }
        return .paged(refs)
    }
}
