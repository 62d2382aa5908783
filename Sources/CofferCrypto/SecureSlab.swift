import Synchronization

/// Locked, dump-excluded pages cut into fixed slots for small secrets (keys). SecureBytes takes
/// its storage here when it fits: one mmap + madvise + mlock per page of slots instead of per key.
///
/// Slots come back zeroed (SecureBytes cleanses before releasing) and are reused; pages are kept
/// for the life of the process, so locked memory is bounded by the most keys alive at once.
final class SecureSlab: Sendable {
    static let slotSize = 64
    static let shared = SecureSlab()

    struct Slot: @unchecked Sendable {
        let pointer: UnsafeMutableRawPointer
        /// Whether its page is mlocked (mlock can fail for an unprivileged user over RLIMIT_MEMLOCK).
        let locked: Bool
    }

    private let free = Mutex<[Slot]>([])

    /// A zero-filled slot of `slotSize` bytes.
    func allocate() -> Slot {
        if let slot = free.withLock({ $0.popLast() }) { return slot }
        let page = SecureBytes.pageSize
        let (mapped, locked) = SecureBytes.mapLockedPages(page)
        let slots = (0..<(page / Self.slotSize)).map { Slot(pointer: mapped + $0 * Self.slotSize, locked: locked) }
        free.withLock { $0.append(contentsOf: slots.dropFirst()) }
        return slots[0]
    }

    /// Takes back a slot its owner has already zeroed.
    func release(_ pointer: UnsafeMutableRawPointer, locked: Bool) {
        free.withLock { $0.append(Slot(pointer: pointer, locked: locked)) }
    }
}
