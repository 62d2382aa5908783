import CofferCrypto
import CofferStore
import Glibc

/// What the filesystem keeps in memory about an inode the kernel knows: its decoded record (the
/// authority while mounted; written back lazily) and the kernel's lookup count.
final class InodeState: @unchecked Sendable {
    let ino: InodeNumber
    var record: InodeRecord
    /// References the kernel holds (lookup, create, readdirplus...), dropped by forget.
    var lookups: UInt64 = 0
    /// The record changed in memory and is not yet in the store.
    var dirty = false
    /// The inode row was deleted (nlink 0, no kernel reference); kept only for the kernel's last references.
    var deleted = false
    /// Changes to this file were lost when the store rolled back (disk full): the next fsync says so.
    var writeError: FSError?
    /// A write past the stored end was refused for want of room (ENOSPC) at this offset. While the disk stays
    /// low, later writes that start past the stored end are refused too: the kernel's writeback sends a file's
    /// pages in any order after write(2) returned, and a later page that still fit would grow the file over
    /// the refused ones, leaving zeros where the program wrote data. The file stays a prefix instead, as on a
    /// local disk, which refuses the write(2) itself.
    var refusedFrom: UInt64?
    /// Unlinked while the kernel still holds it (it may be open): listed in the store's orphans until its forget.
    var orphaned = false
    /// Serializes content changes; reads share it. Striped (one of a fixed set by inode number)
    /// rather than one per inode: 100,000 known inodes must not mean 100,000 locks.
    var content: ReadWriteLock { ContentLocks.lock(for: ino) }
    /// Where the kernel last found this inode (directory and name): only to name a damaged file
    /// in debug-level log lines (names are never logged above debug).
    var location: (parent: InodeNumber, name: [UInt8])?
    /// Coherent mounts: the store change count (`CofferFileSystem.storeEpoch`) when the record was
    /// last read; `changedElsewhere`: another mount changed it since the kernel was last told
    /// (the next open drops the kernel's pages and attributes); `goneElsewhere`: another mount removed it,
    /// or it was created in a dropped transaction (ESTALE from then on);
    /// `unlinkedElsewhere`: another mount removed its last name (its record stays while that mount's kernel
    /// holds it): an open by a name this kernel still caches is ESTALE, so the kernel looks the name up again.
    var epoch: UInt64 = 0
    var changedElsewhere = false
    var goneElsewhere = false
    var unlinkedElsewhere = false
    /// The last chunk while it is being appended to (see TailChunk).
    var tail: TailChunk?
    private var cachedCipher: ContentCipher?
    private var loadedChunkMap: ChunkMap?

    init(ino: InodeNumber, record: InodeRecord) {
        self.ino = ino
        self.record = record
    }

    var fileType: UInt32 { record.mode & UInt32(S_IFMT) }
    var isDirectory: Bool { fileType == UInt32(S_IFDIR) }
    var isRegular: Bool { fileType == UInt32(S_IFREG) }
    var isSymlink: Bool { fileType == UInt32(S_IFLNK) }

    /// The per-file content cipher, derived once per inode while it is in memory. Call under the meta lock.
    func cipher(_ store: EntityStore) throws(FSError) -> ContentCipher {
        if let c = cachedCipher { return c }
        guard let c = try? store.contentCipher(contentId: record.contentId) else { throw .io }
        cachedCipher = c
        return c
    }

    /// Zeroes the per-file key (unmount).
    func wipeCipher() {
        cachedCipher?.wipe()
        cachedCipher = nil
    }

    /// The file's chunk map, set up from the record on first use. Call under the meta lock.
    var chunkMap: ChunkMap {
        if let m = loadedChunkMap { return m }
        let m = ChunkMap(file: record.contentId, root: record.chunkMap)
        loadedChunkMap = m
        return m
    }

    /// Writes changed map pages and puts the map's root into the record (before the record is written).
    func flushChunkMap(_ store: EntityStore) throws(StoreError) {
        guard let m = loadedChunkMap, m.isDirty else { return }
        record.chunkMap = try m.flush(store: store)
    }

    /// Forgets the map in memory (the record was reread after the store dropped a transaction).
    func dropChunkMap() {
        loadedChunkMap = nil
        tail = nil
    }
}
