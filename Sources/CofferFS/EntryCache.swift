/// Names this mount read from the store (listings and lookups), so that a LOOKUP after the kernel let
/// its own entry expire costs no round trip to a database server: `find` then `cat` of every file
/// (the kernel keeps entries 1 s on shared mounts) looked each name up again.
///
/// Only coherent mounts keep it, and only while nothing could have changed a name: it is good for one
/// store epoch (another mount's commits end it) and one count of this mount's own entry writes
/// (`EntityStore.entryChanges`), and is dropped with a dropped group. Names that were not found are
/// not kept. Call under `meta`.
struct EntryCache {
    private struct Key: Hashable {
        let parent: InodeNumber
        let name: [UInt8]
    }
    private var inos: [Key: InodeNumber] = [:]
    private var mark: (epoch: UInt64, entryChanges: UInt64)?
    /// About 10 MiB of names at most: a larger tree is simply looked up again.
    static let limit = 65_536

    /// The inode `name` in `parent` named when the cache was last good, if it still is.
    mutating func inode(parent: InodeNumber, name: [UInt8], epoch: UInt64, entryChanges: UInt64) -> InodeNumber? {
        guard let mark, mark == (epoch, entryChanges) else {
            clear()
            return nil
        }
        return inos[Key(parent: parent, name: name)]
    }

    /// Keeps a name read from the store at `epoch` with `entryChanges` (a mark that moved since empties
    /// the cache first).
    mutating func keep(parent: InodeNumber, name: [UInt8], ino: InodeNumber, epoch: UInt64, entryChanges: UInt64) {
        if let mark, mark != (epoch, entryChanges) { clear() }
        if inos.count >= Self.limit { inos.removeAll(keepingCapacity: true) }
        mark = (epoch, entryChanges)
        inos[Key(parent: parent, name: name)] = ino
    }

    mutating func clear() {
        inos.removeAll()
        mark = nil
    }
}
