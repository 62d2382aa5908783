import CofferCrypto
import CofferStore

/// What a repair did, line by line, and the bytes that became zeros.
public struct RepairSummary: Sendable {
    public var actions: [String] = []
    public var lostRanges: [LostRange] = []
}

/// A repair pass, or the check after one, failed: what the passes before it did stays (each pass is one
/// transaction, and the failed one was rolled back).
public struct RepairFailure: Error {
    public let done: RepairSummary
    public let error: any Error
    public let inCheck: Bool
}

/// Applies a check's repair plan in the store's group transaction and commits once at the end, so
/// a repair interrupted by a crash leaves the container as it was. Never deletes what still opens
/// except rows the authenticated maps and tree say are not part of any file.
public enum Repairer {
    /// Repairs, checks again, and repairs again while problems it can repair are left, `passes` repairs at most: a
    /// repair can bring out what the check before it could not see (the chunk of a mistyped row it dropped is then
    /// missing; an entry dropped with its damaged inode leaves a count to fix). `open` opens the store for one repair.
    /// A pass that fails is rolled back (`RepairFailure` carries what the passes before it did).
    public static func repairInPasses(
        _ first: CheckResult, passes: Int = 3, open: () throws -> EntityStore, check: () throws -> CheckResult
    ) throws(RepairFailure) -> (summary: RepairSummary, remaining: CheckResult) {
        var summary = RepairSummary()
        var result = first
        for _ in 0..<passes {
            do {
                let store = try open()
                do {
                    let pass = try repair(result, store: store)
                    store.close()
                    summary.actions += pass.actions
                    summary.lostRanges += pass.lostRanges
                } catch {
                    store.abandon()
                    throw error
                }
            } catch { throw RepairFailure(done: summary, error: error, inCheck: false) }
            do { result = try check() } catch { throw RepairFailure(done: summary, error: error, inCheck: true) }
            if !result.problems.contains(where: \.isRepairable) { break }
        }
        return (summary, result)
    }

    public static func repair(_ result: CheckResult, store: EntityStore) throws -> RepairSummary {
        let plan = result.plan
        var summary = RepairSummary()
        var records = plan.records
        var changed = Set<UInt64>()
        var extraLinks: [UInt64: UInt32] = [:]
        var links = plan.links

        // Done when the store was opened for the repair (ForeignObjectPolicy.repair), before anything was written.
        // The plan was made without the rows that gave back: the next pass checks again and repairs the rest.
        let foreign = result.problems.filter { $0.kind == .foreignSchemaObject }.count
        if foreign > 0 { summary.actions.append("dropped \(foreign) object(s) Coffer never makes from the store file's schema") }
        if result.problems.contains(where: { $0.kind == .mistypedRow }) {
            summary.actions.append("gave the mistyped rows their type back, or dropped them")
        }
        if result.problems.contains(where: \.isInTheStoreFile) { return summary }

        for e in plan.deleteEntries { try store.backend.deleteEntry(parentTag: e.parentTag, tag: e.tag) }
        if !plan.deleteEntries.isEmpty {
            summary.actions.append("dropped \(plan.deleteEntries.count) directory entr\(plan.deleteEntries.count == 1 ? "y" : "ies")")
        }
        for e in plan.rewriteEntries { try store.putEntry(parent: e.parent, e.record) }
        if !plan.rewriteEntries.isEmpty {
            summary.actions.append("rewrote \(plan.rewriteEntries.count) entr\(plan.rewriteEntries.count == 1 ? "y" : "ies") with their inode's type")
        }
        for id in plan.deleteInodes {
            try store.deleteXattrs(id)
            try store.deleteInode(id)
            summary.actions.append("dropped inode \(id), which failed authentication")
        }
        if plan.recreateRoot {
            changed.insert(EntityStore.rootInode)
            summary.actions.append("put a fresh root directory in place of the damaged one")
        }
        for x in plan.deleteXattrRows { _ = try store.backend.deleteXattr(inode: x.inode, tag: x.tag) }
        if !plan.deleteXattrRows.isEmpty { summary.actions.append("dropped \(plan.deleteXattrRows.count) damaged extended attribute(s)") }
        for ino in plan.deleteXattrsOf { try store.deleteXattrs(ino) }
        if !plan.deleteXattrsOf.isEmpty { summary.actions.append("dropped the extended attributes of \(plan.deleteXattrsOf.count) missing inode(s)") }
        for file in plan.deleteContent {
            try store.backend.deleteAllChunkRows(file: file)
            try store.backend.deleteAllChunkMapRows(file: file)
        }
        if !plan.deleteContent.isEmpty {
            summary.actions.append("dropped the chunks and map pages of \(plan.deleteContent.count) content id(s) no inode owns")
        }

        for (ino, fix) in plan.contentFixes.sorted(by: { $0.key < $1.key }) {
            guard var r = records[ino] else { continue }
            for idx in fix.deleteRows { try store.backend.deleteChunkRow(file: fix.file, index: idx) }
            var tags = fix.tags
            if !fix.reseal.isEmpty {
                let cipher = try store.contentCipher(contentId: fix.file)
                defer { cipher.wipe() }
                for (idx, plain) in fix.reseal.sorted(by: { $0.key < $1.key }) {
                    let sealed = try cipher.seal(plain, index: idx)
                    guard let tag = ChunkTag(sealed: sealed) else { continue }
                    try store.putChunks(file: fix.file, [(idx, sealed)])
                    tags[idx] = tag
                }
            }
            r.chunkMap = try ChunkMapBuilder.write(tags, file: fix.file, store: store)
            r.chunkCount = UInt64(tags.count)
            records[ino] = r
            changed.insert(ino)
            let at = fix.path ?? "inode \(ino)"
            if fix.lost.isEmpty {
                summary.actions.append("\(at): rewrote the chunk map (\(fix.deleteRows.count) row(s) dropped, no content lost)")
            } else {
                summary.lostRanges.append(LostRange(path: fix.path, inode: ino, ranges: fix.lost))
                let text = fix.lost.map { "\($0.lowerBound)-\($0.upperBound)" }.joined(separator: ", ")
                summary.actions.append(
                    "\(at): damaged \(fix.reseal.isEmpty ? "chunks are" : "chunks (or their damaged 4 KiB blocks) are") now zeros; bytes lost: \(text)"
                )
            }
        }

        if !plan.lostFoundLinks.isEmpty {
            let (lf, created) = try lostFound(plan: plan, records: &records, store: store)
            if created {
                links[lf] = 2
                extraLinks[EntityStore.rootInode, default: 0] += 1
                changed.insert(EntityStore.rootInode)
                summary.actions.append("created /lost+found")
            }
            var names = plan.lostFoundNames
            for link in plan.lostFoundLinks {
                guard let r = records[link.ino] else { continue }
                let name = uniqueName(hint: link.nameHint, ino: link.ino, taken: names)
                names.insert(name)
                try store.putEntry(parent: lf, DirectoryEntryRecord(name: name, ino: link.ino, type: r.mode & 0o170000))
                if link.isDirectory { extraLinks[lf, default: 0] += 1 } else { extraLinks[link.ino, default: 0] += 1 }
                changed.insert(lf)
                changed.insert(link.ino)
                summary.actions.append("linked inode \(link.ino) into /lost+found as \"\(String(decoding: name, as: UTF8.self))\"")
            }
        }

        // Link counts: as the tree has them, plus the links this repair added.
        var fixedLinks = 0
        for (id, var r) in records {
            guard let counted = links[id] else { continue }
            let (want, overflow) = counted.addingReportingOverflow(extraLinks[id] ?? 0)
            let nlink = overflow ? UInt32.max : want
            if r.nlink != nlink {
                r.nlink = nlink
                records[id] = r
                changed.insert(id)
                fixedLinks += 1
            }
        }
        if fixedLinks > 0 { summary.actions.append("set the link count of \(fixedLinks) inode(s)") }
        for id in changed.sorted() {
            guard let r = records[id] else { continue }
            try store.putInode(id, r)
        }
        try store.commit()
        return summary
    }

    /// The /lost+found directory: the existing one, or a new 0700 directory owned by the owner of
    /// the tree's root (a container mounted by a user is that user's to repair).
    private static func lostFound(plan: RepairPlan, records: inout [UInt64: InodeRecord], store: EntityStore) throws -> (UInt64, Bool) {
        if let lf = plan.lostFound { return (lf, false) }
        let id = try store.newInodeId()
        var record = Checker.freshDirectory(mode: 0o040700)
        if let root = records[EntityStore.rootInode] ?? (try? store.inode(EntityStore.rootInode)) ?? nil {
            record.uid = root.uid
            record.gid = root.gid
        }
        try store.putInode(id, record)
        var name = TreeWalk.lostFoundName
        var n = 0
        // A non-directory called lost+found keeps its name; ours takes the next free one.
        while try store.entry(parent: EntityStore.rootInode, name: name) != nil {
            n += 1
            name = TreeWalk.lostFoundName + Array(".\(n)".utf8)
        }
        try store.putEntry(parent: EntityStore.rootInode, DirectoryEntryRecord(name: name, ino: id, type: 0o040000))
        records[id] = record
        return (id, true)
    }

    /// "name#ino" (or "#ino"), shortened to fit, with ".N" added while taken.
    static func uniqueName(hint: [UInt8]?, ino: UInt64, taken: Set<[UInt8]>) -> [UInt8] {
        let suffix = Array("#\(ino)".utf8)
        var n = 0
        while true {
            let tail = suffix + (n == 0 ? [] : Array(".\(n)".utf8))
            let room = DirectoryEntryRecord.maxNameLength - tail.count
            let name = Array((hint ?? []).prefix(max(0, room))) + tail
            if !taken.contains(name) { return name }
            n += 1
        }
    }
}
