import CofferCrypto
import CofferStore

/// A file's chunk map in memory (docs/FORMAT.md, "The chunk map"): the tag of the current sealed
/// chunk at each position, pages loaded on demand and written back with the inode. Every content
/// read checks the rows it gets against it; every content write records the tags it stores.
/// Guarded by `meta`, like the rest of `InodeState`.
final class ChunkMap {
    static let perPage = UInt64(ChunkMapRoot.positionsPerPage)
    /// Clean pages kept per file beyond this are dropped (a 4 GiB file has 128 pages of 16 KiB).
    static let cachedPages = 64

    private let file: UInt64
    /// The root as the store has it now (updated by `flush`).
    private var root: ChunkMapRoot
    private var pages: [UInt64: [ChunkTag]] = [:]
    private var dirty = Set<UInt64>()
    /// Pages at or past this number were dropped by a truncation and must go from the store.
    private var droppedFrom: UInt64?

    init(file: UInt64, root: ChunkMapRoot) {
        self.file = file
        self.root = root
        if case .inline(let tags) = root { pages[0] = tags }
    }

    var isDirty: Bool { !dirty.isEmpty || droppedFrom != nil }

    /// How many pages the stored root names.
    private var storedPageCount: UInt64 {
        switch root {
        case .inline(let tags): return tags.isEmpty ? 0 : 1
        case .paged(let versions): return UInt64(versions.count)
        }
    }

    private func page(_ p: UInt64, store: EntityStore) throws(StoreError) -> [ChunkTag] {
        if let tags = pages[p] { return tags }
        var tags: [ChunkTag] = []
        if droppedFrom.map({ p < $0 }) ?? true {
            switch root {
            case .inline(let inline):
                if p == 0 { tags = inline }
            case .paged(let versions):
                if p < UInt64(versions.count), versions[Int(p)] != 0 {
                    guard let stored = try store.chunkMapPage(file: file, page: p, version: versions[Int(p)]) else {
                        throw .authenticationFailed(kind: .chunkMapPage, entity: "chunk map page \(p) of content \(file) is missing")
                    }
                    tags = stored
                }
            }
        }
        if pages.count >= Self.cachedPages {
            for key in pages.keys where !dirty.contains(key) { pages[key] = nil }
        }
        pages[p] = tags
        return tags
    }

    /// The tag recorded for one position (`.hole` for holes and positions past the map).
    func tag(at index: UInt64, store: EntityStore) throws(StoreError) -> ChunkTag {
        let tags = try page(index / Self.perPage, store: store)
        let i = Int(index % Self.perPage)
        return i < tags.count ? tags[i] : .hole
    }

    /// The tags of positions `first...last`, in order.
    func tags(_ first: UInt64, _ last: UInt64, store: EntityStore) throws(StoreError) -> [ChunkTag] {
        var out: [ChunkTag] = []
        out.reserveCapacity(Int(last - first + 1))
        var index = first
        while index <= last {
            let p = index / Self.perPage
            let tags = try page(p, store: store)
            let pageEnd = min(last, (p + 1) * Self.perPage - 1)
            for i in index ... pageEnd {
                let j = Int(i % Self.perPage)
                out.append(j < tags.count ? tags[j] : .hole)
            }
            index = pageEnd + 1
        }
        return out
    }

    /// Records the tag now stored at a position (`.hole` when its chunk was deleted).
    func set(_ index: UInt64, _ tag: ChunkTag, store: EntityStore) throws(StoreError) {
        let p = index / Self.perPage
        var tags = try page(p, store: store)
        let i = Int(index % Self.perPage)
        if i >= tags.count {
            if tag.isHole { return }
            tags.append(contentsOf: repeatElement(.hole, count: i + 1 - tags.count))
        }
        tags[i] = tag
        while let lastTag = tags.last, lastTag.isHole { tags.removeLast() }
        pages[p] = tags
        dirty.insert(p)
    }

    /// Forgets every position from `keep` on (truncation deleted their chunks).
    func truncate(keep: UInt64, store: EntityStore) throws(StoreError) {
        let p = keep / Self.perPage
        if keep % Self.perPage != 0 {
            var tags = try page(p, store: store)
            let i = Int(keep % Self.perPage)
            if i < tags.count { tags.removeSubrange(i...) }
            while let lastTag = tags.last, lastTag.isHole { tags.removeLast() }
            pages[p] = tags
            dirty.insert(p)
        }
        let firstDropped = keep % Self.perPage == 0 ? p : p + 1
        for key in pages.keys where key >= firstDropped { pages[key] = nil; dirty.remove(key) }
        if firstDropped < storedPageCount { droppedFrom = min(droppedFrom ?? firstDropped, firstDropped) }
    }

    /// Writes changed pages (each with a fresh version) and returns the root the inode must now
    /// carry. Call inside the group transaction that also writes the inode.
    func flush(store: EntityStore) throws(StoreError) -> ChunkMapRoot {
        guard isDirty else { return root }
        // The number of pages the map needs: up to the last page holding a tag.
        var versions: [UInt64]
        if case .paged(let v) = root { versions = v } else { versions = [] }
        if let from = droppedFrom, from < UInt64(versions.count) { versions.removeSubrange(Int(from)...) }
        var needed = UInt64(0)
        for (p, tags) in pages where !tags.isEmpty { needed = max(needed, p + 1) }
        for (p, v) in versions.enumerated() where v != 0 && pages[UInt64(p)] == nil { needed = max(needed, UInt64(p) + 1) }

        let newRoot: ChunkMapRoot
        if needed <= 1, try page(0, store: store).count <= ChunkMapRoot.inlineLimit {
            newRoot = .inline(try page(0, store: store))
            if storedPageCount > 0, case .paged = root { try store.deleteChunkMapPages(file: file) }
        } else {
            let wasInline: Bool
            if case .inline = root { wasInline = true } else { wasInline = false }
            if wasInline { dirty.insert(0) }
            if UInt64(versions.count) < needed { versions.append(contentsOf: repeatElement(0, count: Int(needed) - versions.count)) }
            if UInt64(versions.count) > needed { versions.removeSubrange(Int(needed)...) }
            for p in dirty.sorted() where p < needed {
                let tags = try page(p, store: store)
                if tags.isEmpty {
                    if versions[Int(p)] != 0 { try store.deleteChunkMapPage(file: file, page: p) }
                    versions[Int(p)] = 0
                } else {
                    let version = try Self.newVersion()
                    try store.putChunkMapPage(file: file, page: p, version: version, tags: tags)
                    versions[Int(p)] = version
                }
            }
            if !wasInline { try store.deleteChunkMapPages(file: file, from: needed) }
            newRoot = .paged(versions)
        }
        root = newRoot
        dirty.removeAll()
        droppedFrom = nil
        if case .paged = newRoot, pages.count > Self.cachedPages { pages.removeAll() }
        return newRoot
    }

    private static func newVersion() throws(StoreError) -> UInt64 {
        for _ in 0 ..< 4 {
            guard let v = try? Random.uint64() else { break }
            if v != 0 { return v }
        }
        throw .database("random generator failed")
    }
}
