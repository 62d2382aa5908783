import CFuse3
import CofferFS
import Glibc
import Logging
import Synchronization

/// What every low-level op reaches through `fuse_req_userdata`: the filesystem and a few settings fixed at mount time.
final class FUSEContext: @unchecked Sendable {
    // @unchecked: `connOptions` is an opaque C pointer, written once before the session starts and only read
    // (in init) afterwards; everything else is immutable or atomic.
    let fs: any FileSystemOperations
    let timeouts: CacheTimeouts
    let logger: Logger
    let maxWrite: UInt32
    let writebackRequested: Bool
    let connOptions: OpaquePointer?
    /// Set in init when the kernel granted the writeback cache.
    let writebackGranted = Atomic<Bool>(false)
    /// The /dev/fuse hook that negotiates FUSE_HANDLE_KILLPRIV_V2 and reports its per-request marks.
    let killPriv: KillPrivHook
    /// How the workers take requests from /dev/fuse (spin briefly, one reader at a time).
    let reader = RequestReader()
    /// Hands the rest of each decrypted chunk to the kernel's page cache; read-only mounts only (PageCacheFiller).
    let pageFiller: PageCacheFiller?
    /// Drops what the kernel cached of inodes another mount changed (filesystems that share their store).
    let kernelNotifier = KernelNotifier()
    /// Blocking lock requests parked off the workers (filesystems that share locks only).
    let lockWaiters = LockWaiters()
    /// SEEK_DATA and SEEK_HOLE under the writeback cache and some direct writes, answered off the workers
    /// after a page drop.
    let pageDropReplies = PageDropReplies()
    /// Whether requests are counted in `activity` (only when a mount unmounts itself when idle: `-o idle=`).
    let countsActivity: Bool
    /// Requests that were use, answered so far (`LowLevelOps.serve`); read by `FUSEMount`'s idle watcher.
    let activity = Atomic<UInt64>(0)
    /// This process: its own requests (the watchdog's checks) are not use.
    let ownPid = getpid()
    private let shutdownDone = Atomic<Bool>(false)
    /// The io_uring entries, once the kernel agreed to them in INIT (FUSERing); nil: all through /dev/fuse.
    private let ringSlot = Mutex<FUSERing?>(nil)
    /// Whether `ringSlot` holds a ring: every reply asks for `ring`, and a mount without rings answers it
    /// with one atomic load instead of a lock.
    private let hasRing = Atomic<Bool>(false)
    var ring: FUSERing? { hasRing.load(ordering: .acquiring) ? ringSlot.withLock { $0 } : nil }

    /// Makes the ring entries before the INIT reply asks for io_uring (`KillPrivHook`): once the kernel has agreed,
    /// it holds every request until each CPU queue has an entry, so a ring that cannot be made must not be asked
    /// for. False: answer without the flag (requests keep coming through /dev/fuse).
    func makeRing(fd: Int32, payloadSize: Int) -> Bool {
        guard ring == nil, let made = FUSERing.make(fd: fd, payloadSize: payloadSize, context: self) else { return false }
        ringSlot.withLock { $0 = made }
        hasRing.store(true, ordering: .releasing)
        return true
    }

    /// After the INIT reply that asked for io_uring was written: starts the entries, which register themselves.
    /// If the reply could not be written, drops the ring instead.
    func startRing(replyWritten: Bool) {
        guard let r = ring else { return }
        guard replyWritten else {
            hasRing.store(false, ordering: .releasing)
            ringSlot.withLock { $0 = nil }
            r.stop()
            return
        }
        let error = r.run()
        if error != 0 {
            // Entries that did start register, and a queue without one holds its callers: end the session.
            logger.error("FUSE: io_uring entries could not all start", metadata: ["error": "\(String(cString: strerror(error)))"])
            ringFailed(error)
            return
        }
        logger.info("FUSE: io_uring entries started", metadata: ["entriesPerQueue": "\(FUSERing.entriesPerQueue)"])
    }

    /// What ends the session when ring entries fail, told why (set by `FUSEMount`: `fail`).
    let onRingFailure = Mutex<(@Sendable (String) -> Void)?>(nil)

    /// An entry's command failed (`error`, an errno). A refused registration puts the kernel back on /dev/fuse
    /// (it turns io_uring off for the connection); a failure once the rings serve leaves that entry's queue
    /// short, and a queue with no entry left would hold its callers forever, so the session ends.
    func ringFailed(_ error: Int32, registering: Bool = false) {
        if registering {
            logger.warning(
                "FUSE: the kernel refused an io_uring entry; requests come through /dev/fuse",
                metadata: ["error": "\(String(cString: strerror(error)))"])
            return
        }
        let why = String(cString: strerror(error))
        logger.error("FUSE: an io_uring entry failed; ending the session", metadata: ["error": "\(why)"])
        onRingFailure.withLock { $0 }?("an io_uring entry failed (\(why))")
    }

    /// Stops the ring entries (the session loop is over, lock waiters answered). The ring stays reachable until its
    /// threads have ended, so a handler still running replies through it; its memory lives as long as `FUSERing`.
    func stopRing() {
        guard let r = ring else { return }
        let served = r.requests
        r.stop()
        hasRing.store(false, ordering: .releasing)
        ringSlot.withLock { $0 = nil }
        logger.info("FUSE: \(served) requests came through io_uring")
    }

    /// The session while its loop runs: for telling the kernel what changed elsewhere (`dropAttributes`).
    let session = Mutex<SessionPointer?>(nil)
    struct SessionPointer: @unchecked Sendable { let pointer: OpaquePointer }

    /// Drops the kernel's attributes of an inode (not its pages: an open without keep_cache does that),
    /// so that the next read asks for the size (or stat and exec for the mode). Safe inside any request,
    /// even a WRITE or an O_TRUNC OPEN that holds the inode's lock and pages in the kernel: with a negative
    /// offset the kernel only marks the attributes stale (fuse_reverse_inval_inode takes no inode or page
    /// lock). An offset of 0 or more would wait for the pages such a request holds: a deadlock.
    func dropAttributes(_ ino: UInt64) {
        session.withLock { s in
            guard let s else { return }
            _ = fuse_lowlevel_notify_inval_inode(s.pointer, ino, -1, 0)
        }
    }

    init(
        fs: any FileSystemOperations, logger: Logger, maxWrite: UInt32, writebackRequested: Bool,
        connOptions: OpaquePointer?, killPrivV2: Bool = true, ioUring: Bool = true, countsActivity: Bool = false
    ) {
        self.countsActivity = countsActivity
        self.fs = fs
        self.timeouts = fs.cacheTimeouts
        self.logger = logger
        self.maxWrite = maxWrite
        self.writebackRequested = writebackRequested
        self.connOptions = connOptions
        self.killPriv = KillPrivHook(enabled: killPrivV2, ringEnabled: ioUring)
        self.pageFiller = fs.isReadOnly ? PageCacheFiller() : nil
    }

    /// Calls `fs.shutdown()` exactly once, whoever asks first (libfuse's destroy or the end of `run`).
    func shutdownOnce() {
        if !shutdownDone.exchange(true, ordering: .acquiringAndReleasing) {
            fs.shutdown()
        }
    }

    var didShutdown: Bool { shutdownDone.load(ordering: .acquiring) }
}

// MARK: - Conversions

extension Timestamp {
    init(_ ts: timespec) {
        self.init(seconds: Int64(ts.tv_sec), nanoseconds: UInt32(clamping: max(0, min(ts.tv_nsec, 999_999_999))))
    }

    var timespecValue: timespec {
        timespec(tv_sec: Int(truncatingIfNeeded: seconds), tv_nsec: Int(min(nanoseconds, 999_999_999)))
    }
}

extension Attributes {
    /// `struct stat` as the kernel wants it (st_blksize 4096).
    var statValue: stat {
        var st = stat()
        st.st_ino = UInt(truncatingIfNeeded: ino)  // fuse_ino_t is UInt64, st_ino is UInt
        st.st_mode = mode
        st.st_nlink = UInt(nlink)
        st.st_uid = uid
        st.st_gid = gid
        st.st_rdev = UInt(truncatingIfNeeded: rdev)
        st.st_size = Int(clamping: size)
        st.st_blksize = 4096
        st.st_blocks = Int(clamping: blocks)
        st.st_atim = atime.timespecValue
        st.st_mtim = mtime.timespecValue
        st.st_ctim = ctime.timespecValue
        return st
    }
}

extension FUSEContext {
    func entryParam(_ attributes: Attributes) -> fuse_entry_param {
        var e = fuse_entry_param()
        e.ino = attributes.ino
        e.generation = 0
        e.attr = attributes.statValue
        e.attr_timeout = timeouts.attributes
        e.entry_timeout = timeouts.entry
        return e
    }
}

/// Copies a NUL-terminated C name into bytes; nil for a nil pointer.
@inline(__always)
func nameBytes(_ p: UnsafePointer<CChar>?) -> [UInt8]? {
    guard let p else { return nil }
    let n = strlen(p)
    return [UInt8](UnsafeRawBufferPointer(start: p, count: n))
}

/// Bytes plus a terminating NUL, for C calls; nil when the bytes contain a NUL (not a valid C string).
@inline(__always)
func cString(_ bytes: [UInt8]) -> [CChar]? {
    if bytes.contains(0) { return nil }
    var out = [CChar]()
    out.reserveCapacity(bytes.count + 1)
    for b in bytes { out.append(CChar(bitPattern: b)) }
    out.append(0)
    return out
}
