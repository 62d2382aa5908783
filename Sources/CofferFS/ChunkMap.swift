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
    /// The inline tags as the store has them (when the map is inline).
    private var storedInline: [ChunkTag]?
    /// The stored pages and their versions (when the map is paged).
    private var storedPages: [UInt64: UInt64] = [:]
    private var pages: [UInt64: [ChunkTag]] = [:]
    private var dirty = Set<UInt64>()
    /// Pages at or past this number were dropped by a truncation and must go from the store.
    private var droppedFrom: UInt64?

    init(file: UInt64, root: ChunkMapRoot) {
        self.file = file
        adopt(root)
    }

    private func adopt(_ root: ChunkMapRoot) {
        switch root {
        case .inline(let tags):
            storedInline = tags
            storedPages = [:]
        case .paged(let refs):
            storedInline = nil
            storedPages = Dictionary(refs.map { ($0.page, $0.version) }, uniquingKeysWith: { a, _ in a })
        }
    }

    var isDirty: Bool { !dirty.isEmpty || droppedFrom != nil }

    /// Whether chunks `first...last` can be recorded: a map lists at most `ChunkMapRoot.maxPages` pages,
    /// and a page it lists already always fits. Counted from above (listed and loaded pages, some perhaps
    /// emptied since), so a file at the limit may be refused a page early.
    /// `tail`: the position of a buffered chunk not recorded yet (its page may have left the cache).
    func fits(_ first: UInt64, _ last: UInt64, tail: UInt64? = nil) -> Bool {
        guard last >= first else { return true }
        // Every write asks: far from the limit (always, but for a file of terabytes) nothing is counted.
        let span = last / Self.perPage - first / Self.perPage + 2  // the range's pages and the tail's
        if span < UInt64(ChunkMapRoot.maxPages), storedPages.count + pages.count + Int(span) <= ChunkMapRoot.maxPages { return true }
        let touched = Set(first / Self.perPage...last / Self.perPage).union(tail.map { [$0 / Self.perPage] } ?? [])
        let new = touched.filter { storedPages[$0] == nil && pages[$0] == nil }
        return new.isEmpty || storedPages.count + pages.count + new.count <= ChunkMapRoot.maxPages
    }

    private func page(_ p: UInt64, store: EntityStore) throws(StoreError) -> [ChunkTag] {
        if let tags = pages[p] { return tags }
        var tags: [ChunkTag] = []
        if droppedFrom.map({ p < $0 }) ?? true {
            if let inline = storedInline {
                if p == 0 { tags = inline }
            } else if let version = storedPages[p] {
                guard let stored = try store.chunkMapPage(file: file, page: p, version: version) else {
                    throw .authenticationFailed(kind: .chunkMapPage, entity: "chunk map page \(p) of content \(file) (missing)")
                }
                tags = stored
            }
        }
        if pages.count >= Self.cachedPages {
            for key in pages.keys where !dirty.contains(key) { pages[key] = nil }
        }
        pages[p] = tags
        return tags
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
            for i in index...pageEnd {
                let j = Int(i % Self.perPage)
                out.append(j < tags.count ? tags[j] : .hole)
            }
            index = pageEnd + 1
        }
        return out
    }

    /// The first position of `from...last` that holds a chunk (`data`) or is a hole (`!data`); nil when there is
    /// none. A page the map does not list holds only holes and is not read, so a huge hole costs nothing.
    func first(data: Bool, from: UInt64, through last: UInt64, store: EntityStore) throws(StoreError) -> UInt64? {
        var index = from
        while index <= last {
            let p = index / Self.perPage
            let pageEnd = min(last, p * Self.perPage + (Self.perPage - 1))
            if isListed(p) {
                let tags = try page(p, store: store)
                for i in index...pageEnd {
                    let j = Int(i % Self.perPage)
                    if (j < tags.count && !tags[j].isHole) == data { return i }
                }
            } else if !data {
                return index
            }
            guard pageEnd < last else { return nil }
            index = pageEnd + 1
        }
        return nil
    }

    /// Whether page `p` may hold a tag: loaded, or stored and not dropped by a truncation.
    private func isListed(_ p: UInt64) -> Bool {
        if pages[p] != nil { return true }
        if let from = droppedFrom, p >= from { return false }
        return storedInline != nil ? p == 0 : storedPages[p] != nil
    }

    /// Records the tag now stored at a position (`.hole` when its chunk was deleted); returns the
    /// tag it replaces.
    @discardableResult
    func set(_ index: UInt64, _ tag: ChunkTag, store: EntityStore) throws(StoreError) -> ChunkTag {
        let p = index / Self.perPage
        var tags = try page(p, store: store)
        let i = Int(index % Self.perPage)
        if i >= tags.count {
            if tag.isHole { return .hole }
            tags.append(contentsOf: repeatElement(.hole, count: i + 1 - tags.count))
        }
        let previous = tags[i]
        tags[i] = tag
        while let lastTag = tags.last, lastTag.isHole { tags.removeLast() }
        pages[p] = tags
        dirty.insert(p)
        return previous
    }

    /// Records holes at positions `first...last` (a punched range whose chunks were deleted),
    /// visiting only the pages that can hold a tag, so a huge sparse range costs nothing.
    func clear(_ first: UInt64, _ last: UInt64, store: EntityStore) throws(StoreError) {
        var candidates = Set(pages.keys)
        if storedInline != nil { candidates.insert(0) } else { candidates.formUnion(storedPages.keys) }
        if let from = droppedFrom { candidates = candidates.filter { $0 < from || pages[$0] != nil } }
        for p in candidates.sorted() where p >= first / Self.perPage && p <= last / Self.perPage {
            var tags = try page(p, store: store)
            let base = p * Self.perPage
            let lo = Int(max(first, base) - base), hi = Int(min(last, base + Self.perPage - 1) - base)
            guard lo < tags.count else { continue }
            for i in lo...min(hi, tags.count - 1) { tags[i] = .hole }
            while let lastTag = tags.last, lastTag.isHole { tags.removeLast() }
            pages[p] = tags
            dirty.insert(p)
        }
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
        for key in pages.keys where key >= firstDropped {
            pages[key] = nil
            dirty.remove(key)
        }
        droppedFrom = min(droppedFrom ?? firstDropped, firstDropped)
    }

    /// Writes changed pages (each with a fresh version) and returns the root the inode must now
    /// carry. Call inside the group transaction that also writes the inode.
    func flush(store: EntityStore) throws(StoreError) -> ChunkMapRoot {
        // The stored pages that survive a truncation, then the loaded pages over them.
        var kept = storedPages
        if let from = droppedFrom { kept = kept.filter { $0.key < from } }
        var nonEmpty = Set(kept.keys)
        for (p, tags) in pages { if tags.isEmpty { nonEmpty.remove(p) } else { nonEmpty.insert(p) } }

        let root: ChunkMapRoot
        if nonEmpty.allSatisfy({ $0 == 0 }), try page(0, store: store).count <= ChunkMapRoot.inlineLimit {
            root = .inline(try page(0, store: store))
            if !storedPages.isEmpty { try store.deleteChunkMapPages(file: file) }
        } else {
            // Going from inline to pages, page 0 must be written as a page.
            if storedInline != nil && !(pages[0] ?? []).isEmpty { dirty.insert(0) }
            if let from = droppedFrom, storedPages.keys.contains(where: { $0 >= from }) {
                try store.deleteChunkMapPages(file: file, from: from)
            }
            for p in dirty.sorted() {
                let tags = try page(p, store: store)
                if tags.isEmpty {
                    if kept[p] != nil { try store.deleteChunkMapPage(file: file, page: p) }
                    kept[p] = nil
                } else {
                    kept[p] = try store.writeChunkMapPage(file: file, page: p, tags: tags).version
                }
            }
            root = .paged(kept.sorted { $0.key < $1.key }.map { ChunkMapPageRef(page: $0.key, version: $0.value) })
        }
        adopt(root)
        dirty.removeAll()
        droppedFrom = nil
        if pages.count > Self.cachedPages { pages.removeAll() }
        return root
    }
}
