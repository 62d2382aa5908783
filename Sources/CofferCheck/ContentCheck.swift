import CofferCrypto
import CofferStore

/// One file's content against its chunk map (docs/FORMAT.md, "The chunk map"): every page the inode
/// names opens with its version, every position the map names has the row with that tag and it opens
/// under the file key, no row sits at a hole or past the end, and the chunk count is the map's.
/// Positions of a page that is lost keep the rows that open under the file key (authentic content of
/// this file at that position, possibly older: the report says so).
struct ContentCheck {
    let store: EntityStore
    let chunkSize: Int
    let tick: () -> Void
    private var scratch: [UInt8]

    static let perPage = UInt64(ChunkMapRoot.positionsPerPage)

    init(store: EntityStore, chunkSize: Int, tick: @escaping () -> Void) {
        self.store = store
        self.chunkSize = chunkSize
        self.tick = tick
        scratch = [UInt8](repeating: 0, count: chunkSize)
    }

    struct Outcome {
        var problems: [Problem] = []
        var fix: ContentFix?
    }

    /// `path` is asked only when a problem is reported (a file's path costs its depth to build).
    mutating func check(ino: UInt64, record r: InodeRecord, path shownPath: () -> String?, pages: [UInt64: ChunkMapRow]) throws -> Outcome {
        lazy var path = shownPath()
        var out = Outcome()
        func problem(_ kind: ProblemKind, _ detail: String, _ repair: String) {
            out.problems.append(Problem(kind, path: path, inode: ino, detail, repair: repair))
        }
        let cs = UInt64(chunkSize)
        let file = r.contentId
        let end = r.size == 0 ? 0 : (r.size - 1) / cs + 1

        // The map as stored: non-hole positions only (a hostile root cannot make us allocate more
        // than the rows that exist).
        var map: [UInt64: ChunkTag] = [:]
        var lostPages = Set<UInt64>()
        var namedPages = Set<UInt64>()
        var outOfRange = 0
        switch r.chunkMap {
        case .inline(let tags):
            for (i, t) in tags.enumerated() where !t.isHole { map[UInt64(i)] = t }
        case .paged(let refs):
            for ref in refs {
                let page = ref.page
                namedPages.insert(page)
                let tags: [ChunkTag]
                if let row = pages[page] {
                    do { tags = try store.openChunkMapRow(row, version: ref.version) } catch {
                        lostPages.insert(page)
                        problem(
                            .chunkMapPageDamaged, "chunk map page \(page) fails authentication against the inode's version",
                            "keep the chunks of its range that open under the file key, drop the rest, rewrite the map")
                        continue
                    }
                } else {
                    lostPages.insert(page)
                    problem(
                        .chunkMapPageDamaged, "chunk map page \(page) is missing",
                        "keep the chunks of its range that open under the file key, drop the rest, rewrite the map")
                    continue
                }
                // A page number no position can have (only with the key): its tags are past any size.
                let (base, overflow) = page.multipliedReportingOverflow(by: Self.perPage)
                guard !overflow, base <= UInt64.max - Self.perPage else {
                    outOfRange += tags.count
                    continue
                }
                for (i, t) in tags.enumerated() where !t.isHole { map[base + UInt64(i)] = t }
            }
        }
        let extraPages = pages.keys.filter { !namedPages.contains($0) }.sorted()
        if !extraPages.isEmpty {
            problem(.unreferencedMapPage, "map page row(s) \(Self.list(extraPages)) that the inode does not name", "drop them")
        }
        if lostPages.isEmpty, r.chunkCount != UInt64(map.count + outOfRange) {
            problem(
                .chunkCountWrong, "the inode counts \(r.chunkCount) stored chunks, its map names \(map.count + outOfRange)",
                "set it to the chunks kept")
        }
        let beyond = map.keys.filter { $0 >= end }.sorted()
        if !beyond.isEmpty || outOfRange > 0 {
            problem(
                .mapPastSize,
                "the map names chunk position(s) \(Self.list(beyond))\(outOfRange > 0 ? " and \(outOfRange) beyond any file" : "") past the size (\(r.size) bytes)",
                "drop those positions and their rows")
        }

        // The rows, in index order, each checked against the map and opened.
        let cipher = try store.contentCipher(contentId: file)
        // Per-file keys do not outlive their file's check.
        defer { cipher.wipe() }
        var kept: [UInt64: ChunkTag] = [:]
        // Chunks sealed in blocks that are the map's (seal id) but fail in some blocks: the blocks that open, with
        // zeros for the others, to seal again; the byte ranges of the blocks that failed.
        var salvaged: [UInt64: [UInt8]] = [:], lostBlocks: [Range<UInt64>] = []
        var seen = Set<UInt64>()
        var drop: [UInt64] = [], lost: [UInt64] = []
        var pastEnd: [UInt64] = [], atHole: [UInt64] = [], replaced: [UInt64] = [], broken: [UInt64] = []
        var adopted = 0
        var scratch = self.scratch
        try store.backend.forEachChunkRow(file: file) { idx, sealed in
            tick()
            guard idx < end else {
                pastEnd.append(idx)
                drop.append(idx)
                return
            }
            let opens = scratch.withUnsafeMutableBytes { buffer in
                (try? cipher.open(sealed, index: idx, into: buffer)) != nil
            }
            if lostPages.contains(idx / Self.perPage) {
                if opens, let tag = ChunkTag(sealed: sealed) {
                    kept[idx] = tag
                    adopted += 1
                } else {
                    broken.append(idx)
                    drop.append(idx)
                    lost.append(idx)
                }
                return
            }
            guard let expected = map[idx] else {
                atHole.append(idx)
                drop.append(idx)
                return
            }
            seen.insert(idx)
            guard ChunkTag(sealed: sealed) == expected else {
                replaced.append(idx)
                drop.append(idx)
                lost.append(idx)
                return
            }
            guard opens else {
                broken.append(idx)
                if let (plain, failed) = Self.salvage(sealed, index: idx, cipher: cipher) {
                    salvaged[idx] = plain
                    lostBlocks += failed.map { idx * cs + UInt64($0.lowerBound)..<idx * cs + UInt64($0.upperBound) }
                    return
                }
                drop.append(idx)
                lost.append(idx)
                return
            }
            kept[idx] = expected
        }
        let missing = map.keys.filter { $0 < end && !seen.contains($0) }.sorted()
        lost += missing

        let ranges = Self.merged(Self.byteRanges(lost, chunkSize: cs, size: r.size) + lostBlocks, size: r.size)
        let rangeText = ranges.map { "\($0.lowerBound)-\($0.upperBound)" }.joined(separator: ", ")
        if !missing.isEmpty {
            problem(
                .chunkMissing, "chunk(s) \(Self.list(missing)) named by the map have no row (deleted)",
                "make them holes (zeros); the report lists the bytes lost")
        }
        if !replaced.isEmpty {
            problem(
                .chunkReplaced, "chunk row(s) \(Self.list(replaced)) are not the ones the map names (an older or foreign copy)",
                "drop them and make those positions holes (zeros)")
        }
        if !broken.isEmpty {
            problem(
                .chunkDamaged, "chunk row(s) \(Self.list(broken)) fail authentication under the file key",
                salvaged.isEmpty
                    ? "drop them and make those positions holes (zeros)"
                    : "keep the 4 KiB blocks that open, make the others zeros, and seal those chunks again; drop the rest")
        }
        if !atHole.isEmpty {
            problem(.chunkAtHole, "chunk row(s) \(Self.list(atHole)) are stored where the map has a hole", "drop them")
        }
        if !pastEnd.isEmpty {
            problem(.chunkPastEnd, "chunk row(s) \(Self.list(pastEnd)) lie past the end of the file (\(r.size) bytes)", "drop them")
        }
        if !ranges.isEmpty, let last = out.problems.lastIndex(where: { [.chunkMissing, .chunkReplaced, .chunkDamaged].contains($0.kind) }) {
            let p = out.problems[last]
            out.problems[last] = Problem(p.kind, path: p.path, inode: p.inode, p.detail + "; unreadable bytes: \(rangeText)", repair: p.repair)
        }
        if adopted > 0 {
            out.problems.append(
                Problem(
                    .chunkMapPageDamaged, path: path, inode: ino,
                    "\(adopted) chunk(s) in the lost page range open under the file key but cannot be told from older copies",
                    repair: "keep them (verify the file's content)"))
        }
        if !out.problems.isEmpty || !drop.isEmpty {
            out.fix = ContentFix(file: file, tags: kept, deleteRows: drop, reseal: salvaged, lost: ranges, path: path)
        }
        return out
    }

    /// What can be kept of a chunk sealed in blocks that fails as a whole but is the one the map names: its
    /// plaintext with the blocks that fail as zeros, and their offsets in the chunk; nil when it is sealed whole,
    /// its layout is not one a seal has, or no block opens.
    static func salvage(_ sealed: UnsafeRawBufferPointer, index: UInt64, cipher: ContentCipher) -> ([UInt8], [Range<Int>])? {
        guard cipher.sealing == .blocks, let length = cipher.plaintextLength(sealed) else { return nil }
        var plain = [UInt8](repeating: 0, count: length)
        var failed: [Range<Int>] = []
        for from in stride(from: 0, to: length, by: ContentCipher.blockSize) {
            let block = from..<min(length, from + ContentCipher.blockSize)
            let opened = plain.withUnsafeMutableBytes { p in
                (try? cipher.open(sealed, index: index, bytes: block, into: UnsafeMutableRawBufferPointer(rebasing: p[block]))) != nil
            }
            if !opened {
                plain.replaceSubrange(block, with: repeatElement(0, count: block.count))
                failed.append(block)
            }
        }
        return failed.count < ContentCipher.blockCount(length) ? (plain, failed) : nil
    }

    /// Byte ranges sorted, merged where they touch, and cut at the file's size.
    static func merged(_ ranges: [Range<UInt64>], size: UInt64) -> [Range<UInt64>] {
        var out: [Range<UInt64>] = []
        for r in ranges.sorted(by: { $0.lowerBound < $1.lowerBound }) {
            let r = r.lowerBound..<min(r.upperBound, size)
            guard !r.isEmpty else { continue }
            if let last = out.last, last.upperBound >= r.lowerBound {
                out[out.count - 1] = last.lowerBound..<max(last.upperBound, r.upperBound)
            } else {
                out.append(r)
            }
        }
        return out
    }

    /// Chunk positions as byte ranges of the file, cut at its size (`merged` joins them).
    static func byteRanges(_ positions: [UInt64], chunkSize cs: UInt64, size: UInt64) -> [Range<UInt64>] {
        positions.compactMap { i in
            let (start, overflow) = i.multipliedReportingOverflow(by: cs)
            return overflow || start >= size ? nil : start..<min(size, start + cs)
        }
    }

    /// The first few numbers of a list, for a report line.
    static func list(_ xs: [UInt64]) -> String {
        let shown = xs.prefix(8).map(String.init).joined(separator: ", ")
        return xs.count > 8 ? shown + " and \(xs.count - 8) more" : shown
    }
}
