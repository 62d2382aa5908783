import CofferStore
import Glibc

/// The directory tree as the entries make it: walked from the root (and then from each unreachable
/// inode) with an explicit stack, so a hostile deep or cyclic tree neither overflows nor loops.
/// Keeps where each inode was reached, for the paths problems are reported with, and the link counts
/// the tree implies.
struct TreeWalk {
    let records: [UInt64: InodeRecord]
    let damaged: Set<UInt64>
    let groups: [UInt64: [Checker.Entry]]

    private(set) var reached = Set<UInt64>()
    private var visitedDirectories = Set<UInt64>()
    private var parentOf: [UInt64: UInt64] = [:]
    /// Where each inode was first reached: a path is built from it only for what a report names (every
    /// path kept as a string cost depth² bytes: a chain of 40,000 directories took fsck past 24 GB).
    private var places: [UInt64: Place] = [:]
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

    private enum Place {
        /// Where a walk started: "" for the root, a label for an unreachable inode.
        case start(String)
        case entry(parent: UInt64, name: [UInt8])
    }

    /// The path `ino` was first reached by (nil: not reached).
    func path(_ ino: UInt64) -> String? {
        var names: [[UInt8]] = []
        var x = ino
        // Each step goes to a place reached earlier, so this ends; the bound guards the reasoning.
        while names.count <= places.count, let place = places[x] {
            switch place {
            case .start(let label):
                if names.isEmpty { return label.isEmpty ? "/" : label }
                return names.reversed().reduce(into: label) { path, name in
                    path += "/"
                    path += String(decoding: name, as: UTF8.self)
                }
            case .entry(let parent, let name):
                names.append(name)
                x = parent
            }
        }
        return nil
    }

    /// The path of entry `name` of directory `dir`.
    private func path(_ dir: UInt64, _ name: [UInt8]) -> String {
        let d = path(dir) ?? "?"
        return (d == "/" ? "" : d) + "/" + String(decoding: name, as: UTF8.self)
    }

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
        places[start] = .start(path)
        var stack: [UInt64] = [start]
        while let dir = stack.popLast() {
            let entries = (groups[dir] ?? []).sorted { $0.record.name.lexicographicallyPrecedes($1.record.name) }
            for e in entries {
                let target = e.record.ino
                var childPath: String { self.path(dir, e.record.name) }
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
                                : "a second entry for a directory already reached as \(self.path(target) ?? "?")",
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
                    places[target] = .entry(parent: dir, name: e.record.name)
                    if dir == EntityStore.rootInode && e.record.name == Self.lostFoundName { lostFound = target }
                    stack.append(target)
                } else {
                    links[target, default: 0] += 1
                    reached.insert(target)
                    if places[target] == nil { places[target] = .entry(parent: dir, name: e.record.name) }
                }
            }
        }
    }

    /// Walks the inodes the root does not reach, starting from those no unreachable directory names,
    /// then from a member of each cycle of directories left (found by following who names a leftover
    /// directory until one repeats: a directory or file that hangs off a cycle is reached through it,
    /// not made a start of its own, which would give it a second name in /lost+found or split the
    /// tree), then from anything still left. Returns the starting points: what a repair links into
    /// /lost+found.
    mutating func walkUnreachable(_ unreachable: [UInt64]) -> [UInt64] {
        let set = Set(unreachable)
        let records = self.records
        let isDirectory = { (ino: UInt64) in records[ino].map(Checker.isDirectory) == true }
        var namer: [UInt64: UInt64] = [:]
        for d in unreachable where isDirectory(d) {
            for e in groups[d] ?? [] where set.contains(e.record.ino) && e.record.ino != d && namer[e.record.ino] == nil {
                namer[e.record.ino] = d
            }
        }
        var starts: [UInt64] = []
        func start(_ ino: UInt64) {
            starts.append(ino)
            let label = "<unreachable \(ino)>"
            if isDirectory(ino) {
                walk(from: ino, path: label)
            } else {
                reached.insert(ino)
                places[ino] = .start(label)
                links[ino] = 0
            }
        }
        for ino in unreachable where !reached.contains(ino) && namer[ino] == nil { start(ino) }
        for d in unreachable where !reached.contains(d) && isDirectory(d) {
            var x = d, seen: Set<UInt64> = []
            while seen.insert(x).inserted, let up = namer[x], !reached.contains(up) { x = up }
            start(x)
        }
        for ino in unreachable where !reached.contains(ino) { start(ino) }
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
