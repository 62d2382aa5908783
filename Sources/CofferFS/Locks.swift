import Glibc

/// A reader-writer lock: many readers of a file's content at once, one writer.
final class ReadWriteLock: @unchecked Sendable {
    private var lock = pthread_rwlock_t()
    init() { pthread_rwlock_init(&lock, nil) }
    deinit { pthread_rwlock_destroy(&lock) }
    func withReadLock<T, E: Error>(_ body: () throws(E) -> T) throws(E) -> T {
        pthread_rwlock_rdlock(&lock); defer { pthread_rwlock_unlock(&lock) }
        return try body()
    }
    func withWriteLock<T, E: Error>(_ body: () throws(E) -> T) throws(E) -> T {
        pthread_rwlock_wrlock(&lock); defer { pthread_rwlock_unlock(&lock) }
        return try body()
    }
}

/// A plain mutex with typed-throws friendly `withLock`.
final class Lock: @unchecked Sendable {
    private var mutex = pthread_mutex_t()
    init() { pthread_mutex_init(&mutex, nil) }
    deinit { pthread_mutex_destroy(&mutex) }
    func withLock<T, E: Error>(_ body: () throws(E) -> T) throws(E) -> T {
        pthread_mutex_lock(&mutex); defer { pthread_mutex_unlock(&mutex) }
        return try body()
    }
}

/// A fixed set of content locks shared by all inodes. Only one content lock is ever held at a time,
/// so two inodes sharing a stripe can wait for each other but never deadlock.
enum ContentLocks {
    static let stripes: [ReadWriteLock] = (0 ..< 256).map { _ in ReadWriteLock() }
    static func lock(for ino: UInt64) -> ReadWriteLock {
        stripes[Int(truncatingIfNeeded: (ino ^ (ino >> 17)) & 255)]
    }
}

/// glibc's malloc_trim (not exported to Swift), looked up once.
enum MemoryTrim {
    private typealias Trim = @convention(c) (Int) -> Int32
    private static let function: Trim? = {
        guard let handle = dlopen(nil, RTLD_NOW), let symbol = dlsym(handle, "malloc_trim") else { return nil }
        return unsafeBitCast(symbol, to: Trim.self)
    }()
    static func trim() { _ = function?(0) }
}
