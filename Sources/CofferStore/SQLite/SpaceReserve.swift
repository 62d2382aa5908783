import Glibc

/// A few MiB kept aside in the container (`coffer.reserve`) for the day the disk fills up.
///
/// In WAL mode even a delete needs room: new WAL frames, and a checkpoint that copies them into the
/// database file. When a transaction fails for lack of space, the reserve is released so the user
/// can delete files and the store can fold its WAL in; it is taken again once there is room.
/// While released its size stays owed (`owed`): the store lets no commit grow the database into
/// it, or the writer that filled the disk would fill the reserve too and nothing would be left
/// for deletes. Not needed to open a container.
final class SpaceReserve: @unchecked Sendable {
    static let fileName = "coffer.reserve"
    private let path: String
    let size: Int
    private var lock = pthread_mutex_t()
    private var held = false
    private var released = false

    init(directory: String, size: Int = 8 << 20) {
        path = directory + "/" + Self.fileName
        self.size = size
        pthread_mutex_init(&lock, nil)
        take()
    }
    deinit { pthread_mutex_destroy(&lock) }

    /// Allocates the reserve when the disk has room for it and a margin.
    func take() {
        pthread_mutex_lock(&lock)
        defer { pthread_mutex_unlock(&lock) }
        guard !held else { return }
        let fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0o600)
        guard fd >= 0 else { return }
        defer { close(fd) }
        held = posix_fallocate(fd, 0, off_t(size)) == 0
        if held { released = false } else { ftruncate(fd, 0) }
    }

    /// Gives the reserved space back to the filesystem (after a transaction failed for lack of it).
    func release() {
        pthread_mutex_lock(&lock)
        defer { pthread_mutex_unlock(&lock) }
        guard held else { return }
        let fd = open(path, O_WRONLY | O_CLOEXEC)
        if fd >= 0 {
            ftruncate(fd, 0)
            close(fd)
        }
        held = false
        released = true
    }

    /// Deletes the reserve file (a clean close: it is not needed to open the store).
    func remove() {
        pthread_mutex_lock(&lock)
        defer { pthread_mutex_unlock(&lock) }
        unlink(path)
        held = false
    }

    var isHeld: Bool {
        pthread_mutex_lock(&lock)
        defer { pthread_mutex_unlock(&lock) }
        return held
    }

    /// Bytes of free space that belong to the reserve: its size after `release` until it is taken
    /// again (not when it could not be taken at mount: then there is no reserve to keep).
    var owed: Int64 {
        pthread_mutex_lock(&lock)
        defer { pthread_mutex_unlock(&lock) }
        return released ? Int64(size) : 0
    }
}
