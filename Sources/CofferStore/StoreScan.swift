/// Opening the rows of a whole-store scan (`StoreBackend`'s scan API) as the lookups do, for
/// `coffer fsck`: the same keys, ids and transformers, so a row that opens here opens in the mount.
extension EntityStore {
    public func openInodeRow(_ row: InodeRow) throws(StoreError) -> InodeRecord { try openInode(id: row.id, row.sealed) }

    public func openEntryRow(_ row: EntryRow) throws(StoreError) -> DirectoryEntryRecord {
        try openEntry(row.parentTag + row.tag, row.sealed, describe: "directory entry")
    }

    public func openXattrRow(_ row: XattrRow) throws(StoreError) -> ExtendedAttributeRecord { try openXattr(row) }

    public func openChunkMapRow(_ row: ChunkMapRow, version: UInt64) throws(StoreError) -> [ChunkTag] {
        try openChunkMapPage(row, version: version)
    }
}
