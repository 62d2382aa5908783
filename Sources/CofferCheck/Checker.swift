import CofferCrypto
import CofferStore
import Glibc

/// What a check found: the problems, what was looked at, and the repair it would make.
public struct CheckResult: Sendable {
    public let problems: [Problem]
    public let counts: CheckCounts
    let plan: RepairPlan
    public var isClean: Bool { problems.isEmpty }
}

/// Checks a whole store offline (docs/FORMAT.md is the reference): opens every inode, entry, xattr,
/// chunk map page and chunk under its own binding, compares chunks with the maps, walks the tree
/// from the root, and works out the repair. Reads only; hostile rows become problems, never traps.
public final class Checker {
    let store: EntityStore
    let chunkSize: Int
    let progress: ((_ done: Int, _ total: Int) -> Void)?
    var done = 0
    var total = 0
    /// A chunk row costs about this many metadata rows (it is decrypted): progress counts in these units.
    static let chunkWeight = 4

    public init(store: EntityStore, chunkSize: Int, progress: ((_ done: Int, _ total: Int) -> Void)? = nil) {
        self.store = store
        self.chunkSize = chunkSize
        self.progress = progress
    }

    func tick(_ n: Int = 1) {
        done += n
        progress?(done, total)
    }

    /// An opened entry and the row it came from.
    struct Entry {
        let row: EntryRow
        let record: DirectoryEntryRecord
    }

    public func run() throws -> CheckResult {
        let below = try storeFileProblems()
        do { return try checkRows(below) } catch let error where below.contains(where: { $0.kind == .storeFileDamaged }) {
            // The damage SQLite found stops the reading of rows: that is the finding.
            let stop = Problem(.storeFileDamaged, "reading the rows stopped at the damage: \(error)", repair: Self.pageRepair)
            return CheckResult(problems: below + [stop], counts: CheckCounts(), plan: RepairPlan())
        }
    }

    /// The result for a store file SQLite cannot open for its damage: nothing else can be checked.
    public static func unopenable(_ why: String) -> CheckResult {
        CheckResult(
            problems: [Problem(.storeFileDamaged, "SQLite cannot open it: \(why)", repair: pageRepair)], counts: CheckCounts(), plan: RepairPlan())
    }
    static let pageRepair = "none: SQLite cannot mend a damaged page; restore a backup (coffer copy), or copy out the files that still read"

    /// Below the sealed rows: the store file itself. SQLite's own check first: on a damaged file the scans for
    /// foreign objects and mistyped rows may stop at the damage, which is then the finding.
    func storeFileProblems() throws -> [Problem] {
        var problems = try store.backend.fileCheck(limit: 20).map { Problem(.storeFileDamaged, "SQLite's check: \($0)", repair: Self.pageRepair) }
        let damaged = !problems.isEmpty
        func scan(_ body: () throws -> Void) throws {
            do { try body() } catch  where damaged {}
        }
        try scan {
            for o in try store.backend.foreignObjects() {
                let runs = o.type == "trigger" ? " (it runs its own SQL on Coffer's writes)" : ""
                problems.append(Problem(.foreignSchemaObject, "\(o) in the store file, which Coffer never makes\(runs)", repair: "drop it"))
            }
        }
        try scan {
            for line in try store.backend.segmentFileCheck() {
                problems.append(
                    Problem(
                        .segmentFileDamaged, line,
                        repair: "none in place: restore it from a backup (coffer copy) before --repair, which makes its chunks holes"))
            }
        }
        try scan {
            for (table, n) in try store.backend.mistypedRows() {
                problems.append(
                    Problem(
                        .mistypedRow, "\(n) row(s) of \(table) with a key or value of another type than Coffer writes",
                        repair: "give them back their type where the bytes allow, else drop them"))
            }
        }
        return problems
    }

    /// Every sealed row, then the tree; `found` are the problems found below the rows.
    func checkRows(_ found: [Problem]) throws -> CheckResult {
        let c = try store.counts()
        total = c.inodes + c.entries + Self.chunkWeight * c.chunks + c.xattrs + c.chunkMapPages
        done = 0
        progress?(0, total)
        var problems = found
        var plan = RepairPlan()
        var counts = CheckCounts()

        // Inodes: each must open bound to its number.
        var records: [UInt64: InodeRecord] = [:]
        var damaged = Set<UInt64>()
        for row in try store.backend.allInodeRows() {
            do { records[row.id] = try store.openInodeRow(row) } catch { damaged.insert(row.id) }
            tick()
        }
        counts.inodes = records.count + damaged.count
        let orphans = Set(try store.backend.orphans())

        // Entries: grouped by the directory their parent tag belongs to.
        var owner: [[UInt8]: UInt64] = [:]
        for id in records.keys { owner[store.parentTag(id)] = id }
        for id in damaged { owner[store.parentTag(id)] = id }
        owner[store.parentTag(EntityStore.rootInode)] = EntityStore.rootInode
        var groups: [UInt64: [Entry]] = [:]
        var nameHints: [UInt64: [UInt8]] = [:]
        var damagedEntries: [UInt64: Int] = [:]
        var strayGroups: [UInt64?: (count: Int, why: String)] = [:]
        let entryRows = try store.backend.allEntryRows()
        counts.entries = entryRows.count
        for row in entryRows {
            tick()
            let parent = owner[row.parentTag]
            let record: DirectoryEntryRecord
            do { record = try store.openEntryRow(row) } catch {
                plan.deleteEntries.append((row.parentTag, row.tag))
                if let parent { damagedEntries[parent, default: 0] += 1 } else { strayGroups[nil, default: (0, "")].count += 1 }
                continue
            }
            guard let parent else {
                plan.deleteEntries.append((row.parentTag, row.tag))
                nameHints[record.ino] = nameHints[record.ino] ?? record.name
                strayGroups[nil, default: (0, "")].count += 1
                continue
            }
            guard constantTimeEqual(store.nameTag(parent, record.name), row.tag) else {
                plan.deleteEntries.append((row.parentTag, row.tag))
                problems.append(
                    Problem(
                        .entryNameMismatch, inode: parent, "an entry of directory \(parent) does not carry the tag of its sealed name",
                        repair: "drop the entry"))
                continue
            }
            let isDirectory = parent == EntityStore.rootInode || records[parent].map(Self.isDirectory) == true
            guard isDirectory else {
                plan.deleteEntries.append((row.parentTag, row.tag))
                nameHints[record.ino] = nameHints[record.ino] ?? record.name
                let why = damaged.contains(parent) ? "its directory (inode \(parent)) fails authentication" : "inode \(parent) is not a directory"
                strayGroups[parent, default: (0, why)].count += 1
                continue
            }
            groups[parent, default: []].append(Entry(row: row, record: record))
        }
        for (parent, g) in strayGroups.sorted(by: { ($0.key ?? 0) < ($1.key ?? 0) }) {
            let why = parent == nil ? "their parent tag belongs to no inode" : g.why
            problems.append(
                Problem(
                    .strayEntry, inode: parent, "\(g.count) entr\(g.count == 1 ? "y" : "ies") without a directory: \(why)",
                    repair: "drop the entries; what they named goes to /lost+found"))
        }

        // The root.
        var root = records[EntityStore.rootInode]
        if root.map(Self.isDirectory) != true {
            let why = damaged.contains(EntityStore.rootInode) ? "fails authentication" : root == nil ? "is missing" : "is not a directory"
            problems.append(
                Problem(
                    .rootDamaged, path: "/", inode: EntityStore.rootInode, "the root directory's inode \(why)",
                    repair: "put a fresh root directory (mode 0755, owner root) in its place; its entries come back with it"))
            plan.recreateRoot = true
            damaged.remove(EntityStore.rootInode)
            let fresh = Self.freshDirectory(mode: 0o040755)
            root = fresh
            records[EntityStore.rootInode] = fresh
        }

        // The tree.
        var walk = TreeWalk(records: records, damaged: damaged, groups: groups)
        walk.walk(from: EntityStore.rootInode, path: "")
        let unreachable = records.keys.filter { id in
            !walk.reached.contains(id) && !(orphans.contains(id) && (records[id]?.nlink ?? 0) == 0)
        }.sorted()
        let lostRoots = walk.walkUnreachable(unreachable)
        problems += walk.problems
        plan.deleteEntries += walk.dropEntries
        plan.rewriteEntries += walk.rewriteEntries
        plan.links = walk.links
        if let lf = walk.lostFound {
            plan.lostFound = lf
            plan.lostFoundNames = Set((groups[lf] ?? []).map(\.record.name))
        }
        for ino in lostRoots {
            guard let r = records[ino] else { continue }
            let hint = nameHints[ino]
            let kind = Self.isDirectory(r) ? "directory" : "file"
            let known = hint.map { ", last known as \"\(String(decoding: $0, as: UTF8.self))\"" } ?? ""
            problems.append(
                Problem(
                    .unreachable, path: walk.path(ino), inode: ino, "a \(kind) no entry reaches from the root\(known)",
                    repair: "link it into /lost+found"))
            plan.lostFoundLinks.append(LostFoundLink(ino: ino, nameHint: hint, isDirectory: Self.isDirectory(r)))
        }
        for (parent, n) in damagedEntries.sorted(by: { $0.key < $1.key }) {
            problems.append(
                Problem(
                    .entryDamaged, path: walk.path(parent) ?? (parent == EntityStore.rootInode ? "/" : nil), inode: parent,
                    "\(n) entr\(n == 1 ? "y" : "ies") of this directory fail\(n == 1 ? "s" : "") authentication (name unknown)",
                    repair: "drop the entries; what they named goes to /lost+found"))
        }
        for id in damaged.sorted() {
            let at = walk.damagedPaths[id]
            problems.append(
                Problem(
                    .inodeDamaged, path: at, inode: id, "the inode fails authentication and cannot be recovered",
                    repair: "drop the inode row, its xattrs and the entries naming it"))
            plan.deleteInodes.append(id)
        }
        // Link counts, for inodes the tree reaches (unreachable roots get theirs from the repair).
        let lostRootSet = Set(lostRoots)
        for (id, r) in records.sorted(by: { $0.key < $1.key }) where walk.reached.contains(id) && !lostRootSet.contains(id) {
            let expected = walk.links[id] ?? 0
            if Self.isDirectory(r) { counts.directories += 1 } else { counts.files += 1 }
            if r.nlink != expected && !(plan.recreateRoot && id == EntityStore.rootInode) {
                problems.append(
                    Problem(
                        .nlinkWrong, path: walk.path(id), inode: id, "link count is \(r.nlink), the tree has \(expected)",
                        repair: "set it to \(expected)"))
            }
        }
        plan.records = records

        // Xattrs.
        var xattrOrphans: [UInt64: Int] = [:]
        let xattrRows = try store.backend.allXattrRows()
        counts.xattrs = xattrRows.count
        for row in xattrRows {
            tick()
            if damaged.contains(row.inode) { continue }
            guard records[row.inode] != nil else {
                xattrOrphans[row.inode, default: 0] += 1
                continue
            }
            let ok: Bool
            if let x = try? store.openXattrRow(row) {
                ok = constantTimeEqual(store.xattrTag(row.inode, x.name), row.tag)
            } else {
                ok = false
            }
            if !ok {
                plan.deleteXattrRows.append((row.inode, row.tag))
                problems.append(
                    Problem(
                        .xattrDamaged, path: walk.path(row.inode), inode: row.inode,
                        "an extended attribute fails authentication (name unknown)", repair: "drop the attribute"))
            }
        }
        for (ino, n) in xattrOrphans.sorted(by: { $0.key < $1.key }) {
            plan.deleteXattrsOf.append(ino)
            problems.append(
                Problem(
                    .unreferencedXattr, inode: ino, "\(n) extended attribute(s) of an inode that does not exist",
                    repair: "drop them"))
        }

        // Content: every regular file's map and chunks; then rows of no file.
        var pages: [UInt64: [UInt64: ChunkMapRow]] = [:]
        let pageRows = try store.backend.allChunkMapRows()
        counts.chunkMapPages = pageRows.count
        for row in pageRows {
            pages[row.file, default: [:]][row.page] = row
            tick()
        }
        var owned = Set<UInt64>()
        var contentCheck = ContentCheck(store: store, chunkSize: chunkSize, tick: { [unowned self] in self.tick(Self.chunkWeight) })
        for (id, r) in records.sorted(by: { $0.key < $1.key }) where Self.isRegular(r) && r.contentId != 0 {
            owned.insert(r.contentId)
            if orphans.contains(id) && r.nlink == 0 { continue }
            let outcome = try contentCheck.check(ino: id, record: r, path: { walk.path(id) }, pages: pages[r.contentId] ?? [:])
            problems += outcome.problems
            if let fix = outcome.fix {
                plan.contentFixes[id] = fix
                if !fix.lost.isEmpty && !lostRootSet.contains(id) {
                    let base = walk.path(id).flatMap { $0.split(separator: "/").last }.map { Array($0.utf8) }
                    plan.lostFoundLinks.append(LostFoundLink(ino: id, nameHint: base, isDirectory: false))
                }
            }
        }
        var unowned: [UInt64: (chunks: Int, pages: Int)] = [:]
        for s in try store.backend.chunkFileSummaries() {
            counts.chunks += s.rows
            guard !owned.contains(s.file) else { continue }
            unowned[s.file, default: (0, 0)].chunks = s.rows
            tick(Self.chunkWeight * s.rows)
        }
        for (file, rows) in pages where !owned.contains(file) { unowned[file, default: (0, 0)].pages = rows.count }
        for (file, n) in unowned.sorted(by: { $0.key < $1.key }) {
            plan.deleteContent.append(file)
            problems.append(
                Problem(
                    .unreferencedContent,
                    "\(n.chunks) chunk row(s) and \(n.pages) map page(s) of content id \(String(file, radix: 16)) belong to no inode",
                    repair: "drop them"))
        }
        progress?(total, total)
        return CheckResult(problems: problems, counts: counts, plan: plan)
    }

    static func isDirectory(_ r: InodeRecord) -> Bool { r.mode & UInt32(S_IFMT) == UInt32(S_IFDIR) }
    static func isRegular(_ r: InodeRecord) -> Bool { r.mode & UInt32(S_IFMT) == UInt32(S_IFREG) }

    /// A new directory owned by root, times now (the root's replacement, /lost+found).
    static func freshDirectory(mode: UInt32) -> InodeRecord {
        var ts = timespec()
        clock_gettime(CLOCK_REALTIME, &ts)
        let now = StoredTime(seconds: Int64(ts.tv_sec), nanoseconds: UInt32(ts.tv_nsec))
        return InodeRecord(mode: mode, uid: 0, gid: 0, nlink: 2, atime: now, mtime: now, ctime: now)
    }
}
