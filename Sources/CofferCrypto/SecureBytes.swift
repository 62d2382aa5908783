import CCrypto
import Synchronization
#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// Key material in memory the process controls: anonymous mappings of its own, locked with
/// mlock so they are not swapped, excluded from core dumps, and zeroed (OPENSSL_cleanse, which
/// the compiler may not elide) on `wipe()` and on deinit, before the memory is given back.
/// Up to `SecureSlab.slotSize` bytes (every key) take a slot of a shared locked page (a file's key
/// is made on each open: four system calls per key would cost more than the key); larger buffers
/// get whole pages of their own, so mlock/munlock never touch a neighbour's memory.
///
/// `description`/`debugDescription` print "SecureBytes(N bytes)" only, never the bytes.
/// Sendable because the storage address and size never change; concurrent *writes* through
/// `withUnsafeMutableBytes` are the caller's to coordinate (keys are written once, then read).
public final class SecureBytes: @unchecked Sendable, CustomStringConvertible, CustomDebugStringConvertible {
    private let base: UnsafeMutableRawPointer
    /// Usable length: a slab slot, or `count` rounded up to whole pages (at least one page).
    private let capacity: Int
    /// The storage is a slot of `SecureSlab.shared`, not a mapping of its own.
    private let inSlab: Bool
    public let count: Int
    /// Whether mlock succeeded (it can fail for an unprivileged user over RLIMIT_MEMLOCK).
    public let isLocked: Bool

    /// Zero-filled (fresh anonymous pages are zero).
    public init(count: Int) {
        precondition(count >= 0, "SecureBytes count must not be negative")
        if count <= SecureSlab.slotSize {
            let slot = SecureSlab.shared.allocate()
            self.base = slot.pointer
            self.capacity = SecureSlab.slotSize
            self.count = count
            self.isLocked = slot.locked
            self.inSlab = true
            return
        }
        let page = SecureBytes.pageSize
        let pages = max(count, 1) / page + (max(count, 1) % page == 0 ? 0 : 1)
        let (length, overflow) = pages.multipliedReportingOverflow(by: page)
        precondition(!overflow, "SecureBytes count too large")
        let (mapped, locked) = SecureBytes.mapLockedPages(length)
        self.base = mapped
        self.capacity = length
        self.count = count
        self.isLocked = locked
        self.inSlab = false
    }

    /// Fresh zeroed pages of our own, out of core dumps, locked if mlock allows it.
    static func mapLockedPages(_ length: Int) -> (pointer: UnsafeMutableRawPointer, locked: Bool) {
        let mapped = mmap(nil, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)
        guard let mapped, mapped != UnsafeMutableRawPointer(bitPattern: -1) else {
            // Like any allocation failure in Swift: there is no memory to continue with.
            fatalError("SecureBytes: mmap of \(length) bytes failed (errno \(errno))")
        }
        #if os(Linux)
            _ = madvise(mapped, length, MADV_DONTDUMP)
        #endif
        return (mapped, mlock(mapped, length) == 0)
    }

    public convenience init<C: Collection>(copying bytes: C) where C.Element == UInt8 {
        self.init(count: bytes.count)
        withUnsafeMutableBytes { destination in
            let copied = bytes.withContiguousStorageIfAvailable { source -> Bool in
                if let from = source.baseAddress, let to = destination.baseAddress {
                    to.copyMemory(from: from, byteCount: min(source.count, destination.count))
                }
                return true
            }
            if copied == nil {
                var index = 0
                for byte in bytes where index < destination.count {
                    destination[index] = byte
                    index += 1
                }
            }
        }
    }

    /// Fresh random key material straight into locked memory (never via an ordinary array).
    public static func random(count: Int) throws -> SecureBytes {
        guard count >= 0 else { throw CryptoError.invalidParameter("negative key length") }
        let bytes = SecureBytes(count: count)
        try bytes.withUnsafeMutableBytes { try Random.fill($0) }
        return bytes
    }

    deinit {
        let watched = SecureBytes.releaseWatches.withLock { $0.isEmpty ? false : $0[address] != nil }
        let hadData = watched && !SecureBytes.isZero(base, count)
        OPENSSL_cleanse(base, capacity)
        if watched {
            // Read the real storage after zeroing and before it is unmapped.
            let zeroed = SecureBytes.isZero(base, capacity)
            SecureBytes.releaseWatches.withLock { watches in
                if let record = watches[address], !record.released {
                    watches[address] = ReleaseRecord(released: true, hadDataBeforeRelease: hadData, zeroedAtRelease: zeroed)
                }
            }
        }
        if inSlab {
            SecureSlab.shared.release(base, locked: isLocked)
        } else {
            if isLocked { _ = munlock(base, capacity) }
            _ = munmap(base, capacity)
        }
    }

    public func withUnsafeBytes<R>(_ body: (UnsafeRawBufferPointer) throws -> R) rethrows -> R {
        try body(UnsafeRawBufferPointer(start: base, count: count))
    }

    public func withUnsafeMutableBytes<R>(_ body: (UnsafeMutableRawBufferPointer) throws -> R) rethrows -> R {
        try body(UnsafeMutableRawBufferPointer(start: base, count: count))
    }

    /// Zeroes the whole storage now; idempotent. The object stays usable (all zeros).
    public func wipe() {
        OPENSSL_cleanse(base, capacity)
    }

    /// Constant-time in the contents (CRYPTO_memcmp); differing lengths are unequal at once.
    public func constantTimeEquals(_ other: SecureBytes) -> Bool {
        guard count == other.count else { return false }
        if count == 0 { return true }
        return CRYPTO_memcmp(base, other.base, count) == 0
    }

    /// Copies out into a plain array: only for wrapping/transport where unavoidable,
    /// since the copy is neither locked nor wiped.
    public func unsafeCopyBytes() -> [UInt8] {
        withUnsafeBytes { Array($0) }
    }

    public var description: String { "SecureBytes(\(count) bytes)" }
    public var debugDescription: String { description }

    // MARK: - internals

    private var address: UInt { UInt(bitPattern: base) }

    static let pageSize: Int = {
        let size = sysconf(Int32(_SC_PAGESIZE))
        return size > 0 ? size : 4096
    }()

    private static func isZero(_ pointer: UnsafeRawPointer, _ length: Int) -> Bool {
        let bytes = UnsafeRawBufferPointer(start: pointer, count: length)
        var accumulator: UInt8 = 0
        for byte in bytes { accumulator |= byte }
        return accumulator == 0
    }

    fileprivate struct ReleaseRecord: Sendable {
        var released: Bool
        var hadDataBeforeRelease: Bool
        var zeroedAtRelease: Bool
    }

    /// Storage addresses whose release a test asked to audit (empty in production).
    fileprivate static let releaseWatches = Mutex<[UInt: ReleaseRecord]>([:])
}

/// Test hook proving that released memory is zeroed. A test registers an instance; its deinit
/// then reads the instance's real storage just before zeroing (to show it held data) and just
/// after zeroing, before unmapping, and records both findings under the storage address.
@_spi(Testing)
public extension SecureBytes {
    /// What a watched instance's deinit saw.
    struct ReleaseAudit: Sendable, Equatable {
        public let hadDataBeforeRelease: Bool
        public let zeroedAtRelease: Bool
    }

    /// Opaque token for one watched storage region.
    struct ReleaseWatch: Sendable, Hashable {
        fileprivate let address: UInt
    }

    static func watchRelease(of bytes: SecureBytes) -> ReleaseWatch {
        let address = bytes.address
        releaseWatches.withLock {
            $0[address] = ReleaseRecord(released: false, hadDataBeforeRelease: false, zeroedAtRelease: false)
        }
        return ReleaseWatch(address: address)
    }

    /// nil while the instance is alive; removes the watch once it reports.
    static func releaseAudit(_ watch: ReleaseWatch) -> ReleaseAudit? {
        releaseWatches.withLock { watches -> ReleaseAudit? in
            guard let record = watches[watch.address], record.released else { return nil }
            watches[watch.address] = nil
            return ReleaseAudit(hadDataBeforeRelease: record.hadDataBeforeRelease, zeroedAtRelease: record.zeroedAtRelease)
        }
    }
}
