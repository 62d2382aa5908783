/// Names this mount read from the store (listings and lookups), so that a LOOKUP after the kernel let
/// its own entry expire costs no round trip to a database server: `find` then `cat` of every file
/// (the kernel keeps entries 1 s on shared mounts) looked each name up again.
///
/// Only coherent mounts keep it, and only while nothing could have changed a name: it is good for one
/// store epoch (another mount's commits end it, as heard by the listener or seen at an open) and one
/// count of this mount's own entry writes (`EntityStore.entryChanges`), and is dropped with a dropped
/// group; at most `maxAge` in any case, so a listener that went deaf (a half-open connection) makes
/// names stale for that long at most. Names that were not found are not kept. Call under `meta`.
struct EntryCache {
    private struct Key: Hashable {
        let parent: InodeNumber
        let name: [UInt8]
    }
    private var inos: [Key: InodeNumber] = [:]
    private var mark: (epoch: UInt64, entryChanges: UInt64)?
    private var markedAt = ContinuousClock.now
    /// At most 65,536 names (about 20 MiB with names of 255 bytes, a few MiB with usual ones): a larger
    /// tree is simply looked up again.
    static let limit = 65_536
    static let maxAge: Duration = .seconds(5)

    /// The inode `name` in `parent` named when the cache was last good, if it still is.
    mutating func inode(parent: InodeNumber, name: [UInt8], epoch: UInt64, entryChanges: UInt64) -> InodeNumber? {
        guard let mark, mark == (epoch, entryChanges), ContinuousClock.now - markedAt <= Self.maxAge else {
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
        if mark == nil { markedAt = .now }
        mark = (epoch, entryChanges)
        inos[Key(parent: parent, name: name)] = ino
    }

    mutating func clear() {
        inos.removeAll()
        mark = nil
    }
}
