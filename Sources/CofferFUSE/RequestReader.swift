import CFuse3  // sys/eventfd.h
import Glibc
import Synchronization

/// How the worker threads take requests from /dev/fuse: one thread at a time reads, and while requests
/// come close together it spins on non-blocking reads for a moment before it sleeps.
///
/// A request from a serial client (`tar -x`: one system call after the other) wakes a sleeping worker,
/// and on a virtual machine that wake-up and the context switches around it cost more than most requests
/// themselves (docs/MEASUREMENTS.md: about half the daemon's CPU time, and half the client's, were
/// scheduler paths). A worker that is still spinning when the next request comes takes it without any
/// wake-up: `tar -x` of the benchmark corpus ran in 6.3–7.2 s instead of 8.7–9.8 s. `ls -lR` pays for it
/// (0.98–1.12 s instead of 0.89 s): its requests come just far enough apart that spinning often misses.
///
/// - Only the reader waits in the kernel's queue; the other workers park on an eventfd, so a request
///   never wakes more than one thread.
/// - The reader spins only while requests have been coming less than `spin` apart (a moving average of
///   the gaps), and yields the processor on each turn: a client that reads many small files with work
///   of its own in between (`find | xargs cat`) must not lose its processor to a spinner.
/// - A worker that finds the place taken still takes a request that is waiting, and a worker that takes
///   one while more wait, or a READ (readahead sends several at once), wakes a parked one: parallel
///   clients and streaming reads keep every worker busy.
/// - Otherwise a parked worker looks again after `busyLook` while the reader is busy, or `idleLook`
///   while it sleeps, and takes the place if it is free: a long request holds up another caller's for
///   at most that long (most long requests hold the filesystem's lock anyway), and an idle mount wakes
///   a thread only a few times a second.
/// - With one processor there is no spinning: the spinner would only keep the client from running.
final class RequestReader: Sendable {
    /// How long the reader spins after its last request before it sleeps.
    static let spin: Duration = .microseconds(50)
    /// How often a parked worker looks whether the reader's place is free (milliseconds).
    static let busyLook: Int32 = 1, idleLook: Int32 = 100

    private enum Place: Int {
        case free = 0
        case spinning = 1
        case sleeping = 2
    }

    private let spinNanoseconds: Int64
    /// Who reads now (`Place`).
    private let place = Atomic<Int>(Place.free.rawValue)
    /// Workers parked on `wake`.
    private let parked = Atomic<Int>(0)
    private let madeNonBlocking = Atomic<Bool>(false)
    /// Moving average of the time from the reader's return to its next request (ns).
    private let gap = Atomic<Int64>(0)
    /// An eventfd (semaphore mode, non-blocking) that parked workers poll.
    private let wake: Int32
    /// Set by `interrupt`: every read returns EINTR from then on, so libfuse's workers look at the session's
    /// exit flag and end. `interrupted` is an eventfd every waiting worker polls as well (it stays readable).
    private let stopped = Atomic<Bool>(false)
    private let interrupted: Int32

    init(spinning: Bool = sysconf(Int32(_SC_NPROCESSORS_ONLN)) > 1) {
        let (seconds, attoseconds) = Self.spin.components
        spinNanoseconds = spinning ? seconds * 1_000_000_000 + attoseconds / 1_000_000_000 : 0
        wake = eventfd(0, Int32(EFD_SEMAPHORE | EFD_NONBLOCK | EFD_CLOEXEC))
        interrupted = eventfd(0, Int32(EFD_NONBLOCK | EFD_CLOEXEC))
    }

    deinit {
        if wake >= 0 { close(wake) }
        if interrupted >= 0 { close(interrupted) }
    }

    /// Wakes every worker waiting for a request and makes each read return EINTR from now on, so that libfuse's
    /// loop sees the session's exit flag (`FUSEMount.requestExit`). With FUSE over io_uring no request reaches
    /// /dev/fuse to wake them, and a signal to the loop's thread does not arrive where the caller's thread
    /// blocks signals (a dispatch queue's thread does).
    func interrupt() {
        stopped.store(true, ordering: .releasing)
        var one: UInt64 = 1
        if interrupted >= 0 { _ = Glibc.write(interrupted, &one, 8) }
    }

    /// Polls `fd` and the interrupt eventfd; false once interrupted, or when a signal cut the wait short.
    private func waitFor(_ fd: Int32, timeout: Int32) -> Bool {
        // On the stack: every sleep of a worker passes here.
        let cut = withUnsafeTemporaryAllocation(of: pollfd.self, capacity: 2) { p in
            p[0] = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
            p[1] = pollfd(fd: interrupted, events: Int16(POLLIN), revents: 0)
            return poll(p.baseAddress, interrupted >= 0 ? 2 : 1, timeout) < 0 && errno == EINTR
        }
        return !cut && !stopped.load(ordering: .acquiring)
    }

    /// One request into `buf`, as read(2) returns it. Blocks until one comes (or the device fails).
    func read(_ fd: Int32, _ buf: UnsafeMutableRawPointer?, _ len: Int) -> Int {
        Self.nameWorkerThread()
        guard spinNanoseconds > 0, wake >= 0 else {
            guard waitFor(fd, timeout: -1) else { return Self.interruptedRead() }
            return Glibc.read(fd, buf, len)
        }
        if !madeNonBlocking.load(ordering: .relaxed) {
            _ = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK)
            madeNonBlocking.store(true, ordering: .relaxed)
        }
        while true {
            if stopped.load(ordering: .acquiring) { return Self.interruptedRead() }
            let n: Int, error: Int32
            if place.compareExchange(
                expected: Place.free.rawValue, desired: Place.spinning.rawValue,
                ordering: .acquiringAndReleasing
            ).exchanged {
                (n, error) = take(fd, buf, len)
                place.store(Place.free.rawValue, ordering: .releasing)
            } else {
                // The place is taken: still take a request that is waiting (parallel clients keep every
                // worker busy), and park only when there is none.
                n = Glibc.read(fd, buf, len)
                error = n < 0 ? errno : 0
                if n < 0 && error == EAGAIN {
                    park()
                    continue
                }
            }
            if parked.load(ordering: .acquiring) > 0 && (n < 0 || Self.isRead(buf, n) || Self.pending(fd)) { handOver() }
            errno = error
            return n
        }
    }

    /// Worker threads are called `coffer-fuse` (top -H, perf, and the idle-CPU test tell them from
    /// other threads by it). Named on a thread's first read: a thread-specific flag, no system call after.
    static let workerThreadName = "coffer-fuse"
    private static let named: pthread_key_t? = {
        var key = pthread_key_t()
        return pthread_key_create(&key, nil) == 0 ? key : nil
    }()

    private static func nameWorkerThread() {
        guard let named, pthread_getspecific(named) == nil else { return }
        coffer_name_this_thread(workerThreadName)
        _ = pthread_setspecific(named, UnsafeRawPointer(bitPattern: 1))
    }

    /// Spins on non-blocking reads (while requests come close together), then sleeps in poll(2) until a
    /// request comes. Returns read(2)'s result and its errno.
    private func take(_ fd: Int32, _ buf: UnsafeMutableRawPointer?, _ len: Int) -> (Int, Int32) {
        let start = Self.now()
        let spinning = gap.load(ordering: .relaxed) < spinNanoseconds
        var slept = false
        defer {
            // Time to this request, counted as at most twice the spin: one idle spell must not stop spinning for long.
            let took = min(Self.now() - start, 2 * spinNanoseconds)
            gap.store((gap.load(ordering: .relaxed) * 7 + took) / 8, ordering: .relaxed)
        }
        while true {
            let n = Glibc.read(fd, buf, len)
            if n >= 0 { return (n, 0) }
            let error = errno
            guard error == EAGAIN else { return (n, error) }
            if spinning && !slept && Self.now() - start < spinNanoseconds {
                sched_yield()
                continue
            }
            if !slept {
                slept = true
                place.store(Place.sleeping.rawValue, ordering: .releasing)
            }
            if !waitFor(fd, timeout: -1) { return (-1, EINTR) }
        }
    }

    /// Waits until handed the place, or for `busyLook` (`idleLook` while the reader sleeps).
    private func park() {
        parked.add(1, ordering: .acquiringAndReleasing)
        defer { parked.subtract(1, ordering: .acquiringAndReleasing) }
        let idle = place.load(ordering: .acquiring) == Place.sleeping.rawValue
        if waitFor(wake, timeout: idle ? Self.idleLook : Self.busyLook) {
            var token: UInt64 = 0
            _ = Glibc.read(wake, &token, 8)  // one token each (EFD_SEMAPHORE); EAGAIN if another took it
        }
    }

    private func handOver() {
        var one: UInt64 = 1
        _ = Glibc.write(wake, &one, 8)
    }

    /// READ: the kernel's readahead sends several at once, and each is worth a core (decrypting), so the
    /// next reader is woken at once rather than when the queue shows them (streaming reads fell from
    /// 810–890 to 640–690 MB/s without this). Not WRITE: `tar -x` flushes one per file, and waking a
    /// worker for each cost it a tenth; streaming writes keep both cores busy without it.
    private static func isRead(_ buf: UnsafeMutableRawPointer?, _ n: Int) -> Bool {
        guard let buf, n >= 8 else { return false }
        return buf.loadUnaligned(fromByteOffset: 4, as: UInt32.self) == 15  // fuse_in_header.opcode: FUSE_READ
    }

    /// Whether another request is already waiting on the device.
    private static func pending(_ fd: Int32) -> Bool {
        var p = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
        return poll(&p, 1, 0) > 0
    }

    private static func interruptedRead() -> Int {
        errno = EINTR
        return -1
    }

    private static func now() -> Int64 {
        var t = timespec()
        clock_gettime(CLOCK_MONOTONIC, &t)
        return Int64(t.tv_sec) * 1_000_000_000 + Int64(t.tv_nsec)
    }
}
