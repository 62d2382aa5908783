import CofferStore
import Glibc

/// A directory is never moved below itself (rename's EINVAL) on mounts that share the container.
extension CofferFileSystem {
    /// EINVAL when `newParent` is the directory `dir` or below it, as the kernel answers a move of a
    /// directory below itself. On one mount the kernel checks that on its own cache, which is the tree;
    /// with several mounts its cache may be behind another machine's moves (two machines each moving
    /// one of two directories into the other made a cycle no path reaches: a tester's find), so it is
    /// checked here on the committed tree, in the group. The names this mount found each directory
    /// under lead up to the root, each looked at again; where one is gone (moved elsewhere since), the
    /// directories below `dir` are searched instead. Call under `meta`.
    func refuseMoveBelowItself(_ dir: InodeNumber, into newParent: InodeNumber) throws(FSError) {
        guard options.coherent else { return }
        var current = newParent, steps = 0
        while current != EntityStore.rootInode {
            if current == dir { throw .invalid }
            guard steps < 4096, let (parent, name) = inodes[current]?.location, try existingEntry(parent: parent, name: name)?.ino == current
            else {
                if try directories(below: dir, contain: newParent) { throw .invalid }
                return
            }
            current = parent
            steps += 1
        }
    }

    /// Whether `wanted` is one of the directories below `dir`: read a level at a time, each level's
    /// directories in one round trip (a few hundred at a time), since this runs under the writer lock.
    private func directories(below dir: InodeNumber, contain wanted: InodeNumber) throws(FSError) -> Bool {
        var level = [dir], seen: Set<InodeNumber> = [dir]
        while !level.isEmpty {
            var next: [InodeNumber] = []
            for start in stride(from: 0, to: level.count, by: 256) {
                let batch = Array(level[start..<min(start + 256, level.count)])
                let entries: [UInt64: [DirectoryEntryRecord]]
                do { entries = try store.entries(parents: batch) } catch { throw fsError(error, "the entries of \(batch.count) directories") }
                for e in entries.values.joined() where e.type & UInt32(S_IFMT) == UInt32(S_IFDIR) {
                    if e.ino == wanted { return true }
                    if seen.insert(e.ino).inserted { next.append(e.ino) }
                }
            }
            level = next
        }
        return false
    }
}
