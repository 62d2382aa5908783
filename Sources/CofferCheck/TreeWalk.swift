import CofferStore
import Glibc

/// The directory tree as the entries make it: walked from the root (and then from each unreachable
/// inode) with an explicit stack, so a hostile deep or cyclic tree neither overflows nor loops.
/// Builds the paths problems are reported with and the link counts the tree implies.
struct TreeWalk {
    let records: [UInt64: InodeRecord]
    let damaged: Set<UInt64>
    let groups: [UInt64: [Checker.Entry]]

    private(set) var reached = Set<UInt64>()
    private var visitedDirectories = Set<UInt64>()
    private var parentOf: [UInt64: UInt64] = [:]
    private(set) var paths: [UInt64: String] = [:]
    /// Files: entries naming them; directories: 2 + subdirectories.
    private(set) var links: [UInt64: UInt32] = [:]
    private(set) var problems: [Problem] = []
    private(set) var dropEntries: [(parentTag: [UInt8], tag: [UInt8])] = []
    private(set) var rewriteEntries: [(parent: UInt64, record: DirectoryEntryRecord)] = []
    /// Where entries named inodes that fail authentication.
    private(set) var damagedPaths: [UInt64: String] = [:]
    /// /lost+found, when the root has a directory of that name.
    private(set) var lostFound: UInt64?

    static let lostFoundName = Array("lost+found".utf8)

    init(records: [UInt64: InodeRecord], damaged: Set<UInt64>, groups: [UInt64: [Checker.Entry]]) {
        self.records = records
        self.damaged = damaged
        self.groups = groups
    }

    /// Walks the subtree of directory `start`, shown as `path` ("" for the root).
    mutating func walk(from start: UInt64, path: String) {
        guard !visitedDirectories.contains(start) else { return }
        visitedDirectories.insert(start)
        reached.insert(start)
        links[start] = 2
        paths[start] = path.isEmpty ? "/" : path
        var stack: [(UInt64, String)] = [(start, path)]
        while let (dir, dirPath) = stack.popLast() {
            let entries = (groups[dir] ?? []).sorted { $0.record.name.lexicographicallyPrecedes($1.record.name) }
            for e in entries {
                let childPath = dirPath + "/" + String(decoding: e.record.name, as: UTF8.self)
                let target = e.record.ino
                if damaged.contains(target) {
                    problems.append(
                        Problem(
                            .entryToDamagedInode, path: childPath, inode: target, "the entry names an inode that fails authentication",
                            repair: "drop the entry"))
                    dropEntries.append((e.row.parentTag, e.row.tag))
                    if damagedPaths[target] == nil { damagedPaths[target] = childPath }
                    continue
                }
                guard let r = records[target] else {
                    problems.append(
                        Problem(
                            .danglingEntry, path: childPath, inode: target, "the entry names an inode that does not exist",
                            repair: "drop the entry"))
                    dropEntries.append((e.row.parentTag, e.row.tag))
                    continue
                }
                if Checker.isDirectory(r), visitedDirectories.contains(target) {
                    let cycle = target == EntityStore.rootInode || isAncestor(target, of: dir)
                    problems.append(
                        Problem(
                            cycle ? .cycle : .directoryLinkedTwice, path: childPath, inode: target,
                            cycle
                                ? "the entry names a directory above it (a cycle)"
                                : "a second entry for a directory already reached as \(paths[target] ?? "?")",
                            repair: "drop this entry"))
                    dropEntries.append((e.row.parentTag, e.row.tag))
                    continue
                }
                // Only for an entry that stays (a rewrite would bring a dropped one back).
                let type = r.mode & UInt32(S_IFMT)
                if e.record.type != type {
                    problems.append(
                        Problem(
                            .entryTypeMismatch, path: childPath, inode: target,
                            "the entry says type \(String(e.record.type, radix: 8)), the inode is \(String(type, radix: 8))",
                            repair: "rewrite the entry with the inode's type"))
                    rewriteEntries.append((dir, DirectoryEntryRecord(name: e.record.name, ino: target, type: type)))
                }
                if Checker.isDirectory(r) {
                    visitedDirectories.insert(target)
                    reached.insert(target)
                    parentOf[target] = dir
                    links[dir, default: 2] += 1
                    links[target] = 2
                    paths[target] = childPath
                    if dir == EntityStore.rootInode && e.record.name == Self.lostFoundName { lostFound = target }
                    stack.append((target, childPath))
                } else {
                    links[target, default: 0] += 1
                    reached.insert(target)
                    if paths[target] == nil { paths[target] = childPath }
                }
            }
        }
    }

    /// Walks the inodes the root does not reach, starting from those no unreachable directory names
    /// (then from any left, which sit in cycles of their own). Returns the starting points: what a
    /// repair links into /lost+found.
    mutating func walkUnreachable(_ unreachable: [UInt64]) -> [UInt64] {
        let set = Set(unreachable)
        var named = Set<UInt64>()
        for d in unreachable where records[d].map(Checker.isDirectory) == true {
            for e in groups[d] ?? [] where set.contains(e.record.ino) && e.record.ino != d { named.insert(e.record.ino) }
        }
        var starts: [UInt64] = []
        for pass in 0..<2 {
            for ino in unreachable where !reached.contains(ino) && (pass == 1 || !named.contains(ino)) {
                starts.append(ino)
                let label = "<unreachable \(ino)>"
                if records[ino].map(Checker.isDirectory) == true {
                    walk(from: ino, path: label)
                } else {
                    reached.insert(ino)
                    paths[ino] = label
                    links[ino] = 0
                }
            }
        }
        return starts
    }

    private func isAncestor(_ a: UInt64, of d: UInt64) -> Bool {
        var x: UInt64? = d
        while let y = x {
            if y == a { return true }
            x = parentOf[y]
        }
        return false
    }
}
