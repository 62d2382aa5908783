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

    /// Whether `wanted` is one of the directories below `dir` (every level read from the store).
    private func directories(below dir: InodeNumber, contain wanted: InodeNumber) throws(FSError) -> Bool {
        var pending = [dir], seen: Set<InodeNumber> = [dir]
        while let d = pending.popLast() {
            let entries: [DirectoryEntryRecord]
            do { entries = try store.entries(parent: d) } catch { throw fsError(error, "the entries of directory \(d)") }
            for e in entries where e.type & UInt32(S_IFMT) == UInt32(S_IFDIR) {
                if e.ino == wanted { return true }
                if seen.insert(e.ino).inserted { pending.append(e.ino) }
            }
        }
        return false
    }
}
