import Synchronization
#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// An OpenSSL context pointer handed between threads. Each context is used by one thread at a
/// time: it is taken out of the pool under the lock and put back only after use.
struct ContextHandle: @unchecked Sendable {
    let pointer: OpaquePointer
}

/// A small pool of pre-keyed OpenSSL contexts so that keying (AES key schedule, HMAC pads)
/// happens once per context rather than once per message, while many threads work at once.
final class ContextPool: Sendable {
    private let idle = Mutex<[ContextHandle]>([])
    /// Set by `close()`: no context is made or kept after the key was wiped.
    private let closed = Atomic<Bool>(false)
    private let maxIdle: Int
    private let make: @Sendable () throws -> OpaquePointer
    private let destroy: @Sendable (OpaquePointer) -> Void

    /// Read once: sysconf opens /sys on every call, and a pool is made for every file's key.
    private static let defaultMaxIdle = min(64, max(4, 2 * sysconf(Int32(_SC_NPROCESSORS_ONLN))))

    init(make: @escaping @Sendable () throws -> OpaquePointer, destroy: @escaping @Sendable (OpaquePointer) -> Void) {
        self.maxIdle = Self.defaultMaxIdle
        self.make = make
        self.destroy = destroy
    }

    /// Runs `body` with an exclusive context. A context whose use threw is destroyed rather than
    /// reused, so a half-finished operation never leaks state into the next one.
    func withContext<R>(_ body: (OpaquePointer) throws -> R) throws -> R {
        guard !closed.load(ordering: .acquiring) else { throw CryptoError.invalidParameter("the key was wiped") }
        let context: OpaquePointer
        if let handle = idle.withLock({ $0.popLast() }) {
            context = handle.pointer
        } else {
            context = try make()
        }
        let result: R
        do {
            result = try body(context)
        } catch {
            destroy(context)
            throw error
        }
        let kept = idle.withLock { list -> Bool in
            guard list.count < maxIdle, !closed.load(ordering: .acquiring) else { return false }
            list.append(ContextHandle(pointer: context))
            return true
        }
        if !kept { destroy(context) }
        return result
    }

    /// Frees every idle context (OpenSSL cleanses their key schedules) and refuses new ones.
    func close() {
        closed.store(true, ordering: .releasing)
        drain()
    }

    deinit { drain() }

    private func drain() {
        let all = idle.withLock { list -> [ContextHandle] in
            let taken = list
            list.removeAll()
            return taken
        }
        for handle in all { destroy(handle.pointer) }
    }
}
