import CofferStore
import Glibc

/// lseek(2)'s SEEK_DATA and SEEK_HOLE from the chunk map: a chunk the map records as a hole is a hole, any
/// stored chunk (and the plaintext tail not stored yet) is data, zeros inside it included, as POSIX allows.
/// `cp --sparse`, tar and rsync then skip a sparse file's holes instead of reading their zeros.
///
/// Only what the daemon holds is seen here: the caller (the FUSE layer) has the kernel write back the file's
/// dirty pages first, which FUSE_LSEEK does not do by itself under the writeback cache.
extension CofferFileSystem {
    public static let seekData: Int32 = 3, seekHole: Int32 = 4

    public func seek(_ ino: InodeNumber, offset: UInt64, whence: Int32) throws(FSError) -> UInt64 {
        guard whence == Self.seekData || whence == Self.seekHole else { throw .invalid }
        return try meta.withLock { () throws(FSError) -> UInt64 in
            let s = try state(ino)
            guard s.isRegular else { throw s.isDirectory ? .isDirectory : .invalid }
            let size = s.record.size
            guard offset < size else { throw FSError(ENXIO) }
            let cs = UInt64(chunkSize)
            let here = offset / cs, last = (size - 1) / cs
            let tail = s.tail.map(\.index).flatMap { $0 >= here && $0 <= last ? $0 : nil }
            do {
                if whence == Self.seekData {
                    let stored = try s.chunkMap.first(data: true, from: here, through: last, store: store)
                    guard let index = [stored, tail].compactMap({ $0 }).min() else { throw FSError(ENXIO) }
                    return max(offset, index * cs)
                }
                var from = here
                while from <= last {
                    guard let index = try s.chunkMap.first(data: false, from: from, through: last, store: store) else { break }
                    if index != tail { return max(offset, index * cs) }
                    from = index + 1
                }
                return size  // the hole every file has at its end
            } catch let e as FSError { throw e } catch { throw fsError(error, "inode \(ino)") }
        }
    }
}
