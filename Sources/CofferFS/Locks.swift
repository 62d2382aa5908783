import Glibc

/// A reader-writer lock: many readers of a file's content at once, one writer.
final class ReadWriteLock: @unchecked Sendable {
    private var lock = pthread_rwlock_t()
    init() { pthread_rwlock_init(&lock, nil) }
    deinit { pthread_rwlock_destroy(&lock) }
    func withReadLock<T, E: Error>(_ body: () throws(E) -> T) throws(E) -> T {
        pthread_rwlock_rdlock(&lock)
        defer { pthread_rwlock_unlock(&lock) }
        return try body()
    }
    func withWriteLock<T, E: Error>(_ body: () throws(E) -> T) throws(E) -> T {
        pthread_rwlock_wrlock(&lock)
        defer { pthread_rwlock_unlock(&lock) }
        return try body()
    }
}

/// A plain mutex with typed-throws friendly `withLock`.
final class Lock: @unchecked Sendable {
    private var mutex = pthread_mutex_t()
    init() { pthread_mutex_init(&mutex, nil) }
    deinit { pthread_mutex_destroy(&mutex) }
    func withLock<T, E: Error>(_ body: () throws(E) -> T) throws(E) -> T {
        pthread_mutex_lock(&mutex)
        defer { pthread_mutex_unlock(&mutex) }
        return try body()
    }
    /// For code that holds the store's writer and needs the lock too: everywhere else the order is this
    /// lock, then the writer, so such code may only try (and give up), never wait.
    func tryLock() -> Bool { pthread_mutex_trylock(&mutex) == 0 }
    func unlock() { pthread_mutex_unlock(&mutex) }
}

/// A fixed set of content locks shared by all inodes. Only one content lock is ever held at a time,
/// so two inodes sharing a stripe can wait for each other but never deadlock.
enum ContentLocks {
    static let stripes: [ReadWriteLock] = (0..<256).map { _ in ReadWriteLock() }
    static func lock(for ino: UInt64) -> ReadWriteLock {
        stripes[Int(truncatingIfNeeded: (ino ^ (ino >> 17)) & 255)]
    }
}
