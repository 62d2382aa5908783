import CFuse3
import CStopSignals
import CofferFS
import Foundation
import Glibc
import Logging
import Synchronization

/// One libfuse3 low-level session serving a `FileSystemOperations` at a mountpoint.
///
/// `init` checks the mountpoint and /dev/fuse; `run` mounts, serves until unmounted or asked to exit, then
/// unmounts. Once `run` has been entered, the filesystem's `shutdown()` is called exactly once before `run`
/// returns or throws (also when the mount itself fails); if `init` throws, the filesystem is untouched.
public final class FUSEMount: @unchecked Sendable {
    // @unchecked: mutable state lives in `state` (a Mutex); the rest is immutable.
    private let filesystem: any FileSystemOperations
    /// The mountpoint as an absolute, resolved path.
    public let mountpoint: String
    private let options: FUSEMountOptions
    let logger: Logger

    enum Phase { case idle, starting, running, finished }
    /// How far a stop signal's unmount went: `unmounting` (flushing, then unmounting), `detached` (lazily: programs
    /// still use the mount), `unmounted` (the kernel ends the connection once nothing holds the mount).
    enum Stop { case none, unmounting, detached, unmounted }
    /// The session pointer, shared with requestExit and the watcher only under `state`'s lock.
    struct SessionRef: @unchecked Sendable { let pointer: OpaquePointer }
    struct State {
        var phase: Phase = .idle
        var session: SessionRef?
        var exitRequested = false
        var stop = Stop.none
        /// The thread in the session loop, interrupted to wake it once the path no longer leads to this mount.
        var loopThread: pthread_t?
        /// A second stop signal ended the loop while programs still used the mount.
        var endedInUse = false
        /// Why the session ended on its own (`fail`): a failure of the FUSE transport.
        var failure: String?
        /// The mount's device, once a stat of the mountpoint reached this session (the idle watcher's check that
        /// the path still leads here).
        var device: UInt?
        /// The idle watcher is trying an unmount (`FUSEMount+Idle`): a stop signal waits for it; `idleUnmounted`:
        /// it succeeded, and the loop ends as on fusermount3 -u.
        var idleProbe = false
        var idleUnmounted = false
        /// How the loop's workers wait for requests, while it runs (`requestExit` interrupts their waits).
        var reader: RequestReader?
    }
    let state = Mutex(State())

    /// libfuse's signal handlers point at one global session: only one mount per process installs them.
    private static let signalHandlerOwner = Mutex<ObjectIdentifier?>(nil)

    public init(
        filesystem: any FileSystemOperations, mountpoint: String, options: FUSEMountOptions,
        logger: Logger
    ) throws {
        self.filesystem = filesystem
        self.options = options
        self.logger = logger

        let fd = Glibc.open("/dev/fuse", O_RDWR | O_CLOEXEC)
        if fd < 0 {
            throw FUSEMountError.fuseDeviceUnavailable(reason: String(cString: strerror(errno)))
        }
        Glibc.close(fd)

        var st = stat()
        if stat(mountpoint, &st) != 0 {
            let err = errno
            if err == ENOENT { throw FUSEMountError.mountpointMissing(path: mountpoint) }
            if err == ENOTDIR { throw FUSEMountError.mountpointNotDirectory(path: mountpoint) }
            throw FUSEMountError.mountpointInaccessible(path: mountpoint, reason: String(cString: strerror(err)))
        }
        guard st.st_mode & S_IFMT == S_IFDIR else { throw FUSEMountError.mountpointNotDirectory(path: mountpoint) }
        guard let resolved = realpath(mountpoint, nil) else {
            throw FUSEMountError.mountpointInaccessible(path: mountpoint, reason: String(cString: strerror(errno)))
        }
        self.mountpoint = String(cString: resolved)
        free(resolved)

        if !options.allowsNonEmpty {
            guard let dir = opendir(self.mountpoint) else {
                throw FUSEMountError.mountpointInaccessible(path: self.mountpoint, reason: String(cString: strerror(errno)))
            }
            defer { closedir(dir) }
            while let entry = readdir(dir) {
                let isDot = withUnsafeBytes(of: entry.pointee.d_name) { raw in
                    (raw[0] == 0x2E && raw[1] == 0) || (raw[0] == 0x2E && raw[1] == 0x2E && raw[2] == 0)
                }
                if !isDot { throw FUSEMountError.mountpointNotEmpty(path: self.mountpoint) }
            }
        }
        if options.maxWrite > 1 << 20 {
            logger.info("FUSE max_write above 1 MiB is not supported; using 1 MiB", metadata: ["requested": "\(options.maxWrite)"])
        }
    }

    /// True when a second SIGINT/SIGTERM/SIGHUP ended the loop while programs still used the mount: what they
    /// had written but the kernel had not yet handed over may be lost.
    public var endedWhileInUse: Bool { state.withLock { $0.endedInUse } }

    /// True once a stop signal has been received (the mount is being unmounted, or detached, waiting for its users)
    /// or the session is ending on a failure of its own (`fail`: flushing first).
    public var isStopping: Bool { state.withLock { $0.stop != .none || $0.exitRequested || $0.failure != nil } }

    /// Why the session ended on its own (a failure of the FUSE transport, not an unmount or a signal), if it did.
    public var failure: String? { state.withLock { $0.failure } }

    /// How long a failing session waits for the kernel's cached writes before it ends (`fail`).
    static let failureFlushWait: DispatchTimeInterval = .seconds(10)

    /// Ends the session on a failure of its own (`failure` says why). What still serves (the other ring
    /// entries) first takes the kernel's cached writes (syncfs, waited for at most `failureFlushWait`: it
    /// may hang on what failed), then the loop ends as on `requestExit`. Never blocks its caller (an
    /// entry's thread).
    func fail(_ why: String) {
        let first = state.withLock { s -> Bool in
            guard s.failure == nil else { return false }
            s.failure = why
            return true
        }
        guard first else { return }
        let path = mountpoint
        let flushed = DispatchSemaphore(value: 0)
        Thread.detachNewThread {
            let fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
            if fd >= 0 {
                _ = coffer_syncfs(fd)
                close(fd)
            }
            flushed.signal()
        }
        Thread.detachNewThread { [self] in
            if flushed.wait(timeout: .now() + Self.failureFlushWait) == .timedOut {
                logger.error("FUSE: the kernel's cached writes could not all be taken before the session ends")
            }
            requestExit()
        }
    }

    /// Asks the loop to end at once (as a second SIGTERM). Safe from any thread, before, during or after `run`.
    public func requestExit() {
        let wake: Bool = state.withLock { s in
            s.exitRequested = true
            if s.phase == .running, let se = s.session {
                fuse_session_exit(se.pointer)
                // The workers waiting on /dev/fuse end at once (with io_uring no request would reach them).
                s.reader?.interrupt()
                return true
            }
            return false
        }
        if wake { wakeLoop() }
    }

    /// libfuse 3.14's loops only notice the exit flag after a request or an interrupted wait: send one request
    /// that always reaches the daemon (statfs is never cached), from a helper thread.
    private func wakeLoop() {
        let path = mountpoint
        Thread.detachNewThread {
            var s = statvfs()
            _ = statvfs(path, &s)
        }
        interruptLoop()
    }

    /// Once a stop signal has unmounted (or detached) the mount, the path leads elsewhere, and with io_uring a
    /// statfs goes to a ring entry, not to the loop: interrupt the loop's thread's wait as well. Under the lock,
    /// so the thread is still in `run`.
    private func interruptLoop() {
        state.withLock { s in
            if s.phase == .running, let thread = s.loopThread { _ = coffer_stop_signals_wake(thread) }
        }
    }

    /// Mounts, serves (multi-threaded unless `singleThreaded`) and blocks until unmounted (fusermount3 -u),
    /// SIGINT/SIGTERM/SIGHUP (which unmount as `coffer unmount` does: `stopOnSignal`) or `requestExit()`.
    /// `onReady` is called once, from another thread, once a stat(2) of the mountpoint has been answered by
    /// this session. `onStopping` is called once the loop has ended (unmount
    /// begins; the service manager hears STOPPING=1 before the final commit). On return the mountpoint is
    /// unmounted, the session destroyed and `shutdown()` called.
    public func run(onReady: @escaping @Sendable () -> Void, onStopping: (@Sendable () -> Void)? = nil) throws {
        let canStart = state.withLock { s -> Bool in
            guard s.phase == .idle else { return false }
            s.phase = .starting
            return true
        }
        guard canStart else { throw FUSEMountError.alreadyRunning }
        defer {
            state.withLock {
                $0.phase = .finished
                $0.session = nil
                $0.reader = nil
            }
        }

        // Arguments: argv[0], -o options, -d. libfuse may replace argv while parsing; we free what we allocated.
        let argvStrings = options.fuseArguments(filesystemReadOnly: filesystem.isReadOnly)
        let optionSummary = argvStrings.dropFirst().joined(separator: " ")
        if !options.droppedOptions.isEmpty {
            logger.info(
                "FUSE: ignoring mount options libfuse does not support",
                metadata: ["options": "\(options.droppedOptions.joined(separator: ","))"])
        }
        let ownArgv = UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>.allocate(capacity: argvStrings.count + 1)
        for (i, s) in argvStrings.enumerated() { ownArgv[i] = strdup(s) }
        ownArgv[argvStrings.count] = nil
        var args = fuse_args(argc: Int32(argvStrings.count), argv: ownArgv, allocated: 0)
        defer {
            if args.argv != ownArgv { fuse_opt_free_args(&args) }
            for i in 0..<argvStrings.count { free(ownArgv[i]) }
            ownArgv.deallocate()
        }

        var connOptions: OpaquePointer?
        var context: FUSEContext?
        defer {
            // Whatever happened after entering run: the filesystem is shut down exactly once.
            if let context { context.shutdownOnce() } else { filesystem.shutdown() }
            if let connOptions { free(UnsafeMutableRawPointer(connOptions)) }
        }

        // Connection options (max_write=, writeback_cache, ...) are not fuse_session_new options.
        guard let parsed = fuse_parse_conn_info_opts(&args) else {
            logger.error("FUSE: invalid connection options", metadata: ["options": "\(optionSummary)"])
            throw FUSEMountError.invalidOptions(optionSummary)
        }
        connOptions = parsed
        let ctx = FUSEContext(
            fs: filesystem, logger: logger, maxWrite: min(options.maxWrite, 1 << 20),
            writebackRequested: options.writebackCache, connOptions: parsed,
            killPrivV2: options.killPrivV2, ioUring: options.ioUring, countsActivity: options.idleUnmount != nil)
        context = ctx

        var ops = LowLevelOps.make(sharesLocks: filesystem.sharesLocks)
        let userdata = Unmanaged.passRetained(ctx)
        defer { userdata.release() }
        guard let se = fuse_session_new(&args, &ops, MemoryLayout<fuse_lowlevel_ops>.size, userdata.toOpaque()) else {
            logger.error("FUSE: could not create the session", metadata: ["options": "\(optionSummary)"])
            throw FUSEMountError.sessionCreationFailed(options: optionSummary)
        }
        var mounted = false
        var ownsSignals = false
        var signalPipe: Int32 = -1
        defer {
            if ownsSignals {
                coffer_stop_signals_remove()
                fuse_remove_signal_handlers(se)
                Self.signalHandlerOwner.withLock { $0 = nil }
            }
            if signalPipe >= 0 { close(signalPipe) }  // watchStopSignals reads the end of it and returns
            let stop = state.withLock { s -> Stop in
                s.phase = .finished
                s.session = nil
                return s.stop
            }
            // Parked lock requests are answered (EINTR) while the session still exists.
            ctx.lockWaiters.stop()
            if mounted && stop != .none {
                // Unmounted (or being unmounted) by a stop signal: the path may hold another mount by now, and
                // must not be unmounted again.
                Self.endConnection(se)
            } else if mounted {
                fuse_session_unmount(se)
            }
            // A store (or a lock's page drop) blocked on a page a READ holds (no worker answers it now) ends
            // when the connection does; if it has not, the session must outlive it (the process is about to exit).
            let pagesDropped = ctx.lockWaiters.detach(), entriesDropped = ctx.kernelNotifier.stop()
            let repliesEnded = ctx.pageDropReplies.stop(timeout: 2)
            if ctx.pageFiller?.stop() == false || !pagesDropped || !entriesDropped || !repliesEnded {
                logger.error("FUSE: a page-cache store did not end; the session is left to the exit")
                ctx.shutdownOnce()
            } else {
                fuse_session_destroy(se)  // calls the destroy op (shutdown) if init happened
            }
            if mounted { logger.info("Unmounted \(mountpoint)") }
        }

        ownsSignals = Self.signalHandlerOwner.withLock { owner -> Bool in
            guard owner == nil else { return false }
            owner = ObjectIdentifier(self)
            return true
        }
        if ownsSignals {
            // A process started in the background inherits SIGINT ignored; libfuse only replaces SIG_DFL.
            // Same for SIGTERM and SIGHUP, so that libfuse's handlers always go in.
            for sig in [SIGINT, SIGTERM, SIGHUP] { _ = signal(sig, SIG_DFL) }
            // libfuse's handlers (SIGPIPE ignored), then ours over them for the three stop signals.
            var fds: [Int32] = [-1, -1]
            let installed =
                fuse_set_signal_handlers(se) == 0 && pipe(&fds) == 0 && fcntl(fds[0], F_SETFD, FD_CLOEXEC) == 0
                && fcntl(fds[1], F_SETFD, FD_CLOEXEC) == 0 && fcntl(fds[1], F_SETFL, O_NONBLOCK) == 0 && coffer_stop_signals_install(fds[1]) == 0
            if !installed {
                for fd in fds where fd >= 0 { close(fd) }
                fuse_remove_signal_handlers(se)
                Self.signalHandlerOwner.withLock { $0 = nil }
                ownsSignals = false
                logger.error("FUSE: could not install signal handlers")
                throw FUSEMountError.signalHandlersFailed
            }
            signalPipe = fds[1]
            let readEnd = fds[0]
            Thread.detachNewThread { [self] in watchStopSignals(readEnd) }
        } else {
            logger.debug("FUSE: another mount in this process owns the signal handlers")
        }

        var before = stat()
        let deviceBefore: UInt? = stat(mountpoint, &before) == 0 ? before.st_dev : nil

        guard fuse_session_mount(se, mountpoint) == 0 else {
            logger.error("FUSE: mount failed", metadata: ["mountpoint": "\(mountpoint)"])
            throw FUSEMountError.mountFailed(path: mountpoint)
        }
        mounted = true
        // All /dev/fuse traffic through KillPrivHook (it passes through when killPrivV2 is off). Before the
        // loop starts, so the INIT request is seen; on failure the kernel keeps its own set-id handling.
        var io = KillPrivHook.customIO
        let ioResult = fuse_session_custom_io(se, &io, fuse_session_fd(se))
        if ioResult != 0 {
            logger.info(
                "FUSE: custom io refused; security.capability stays asked on every write",
                metadata: ["error": "\(String(cString: strerror(-ioResult)))"])
        }
        state.withLock { s in
            s.session = SessionRef(pointer: se)
            s.loopThread = pthread_self()
            s.reader = ctx.reader
            s.phase = .running
            if s.exitRequested {
                fuse_session_exit(se)
                ctx.reader.interrupt()
            }
        }
        logger.info(
            "Mounted \(options.fsName) at \(mountpoint)",
            metadata: [
                "type": "fuse.\(options.subtype)", "readOnly": "\(options.readOnly || filesystem.isReadOnly)"
            ])

        // A ring entry that failed once the rings serve: end the session rather than leave its queue's callers waiting.
        ctx.onRingFailure.withLock { $0 = { [weak self] in self?.fail($0) } }
        ctx.pageFiller?.start(session: se)
        ctx.lockWaiters.attach(se)
        ctx.kernelNotifier.start(session: se, fs: ctx.fs)
        ctx.pageDropReplies.start(session: se)
        ctx.session.withLock { $0 = FUSEContext.SessionPointer(pointer: se) }
        startWatcher(deviceBefore: deviceBefore, context: ctx, onReady: onReady)
        if let idle = options.idleUnmount { startIdleWatcher(idle, context: ctx) }

        let result: Int32
        if options.singleThreaded {
            result = fuse_session_loop(se)
        } else {
            guard let config = fuse_loop_cfg_create() else {
                logger.error("FUSE: could not allocate the loop configuration")
                throw FUSEMountError.loopFailed(errno: ENOMEM)
            }
            fuse_loop_cfg_set_clone_fd(config, 0)
            fuse_loop_cfg_set_max_threads(config, max(1, options.maxThreads))
            result = fuse_session_loop_mt(se, config)
            fuse_loop_cfg_destroy(config)
        }
        // Stop answering (parked lock requests get EINTR: the workers are gone, nothing parks again; a ring entry
        // still sends those answers), then stop the ring entries, then unmount and destroy (deferred above).
        ctx.lockWaiters.stop()
        ctx.pageDropReplies.stop(timeout: 1)
        ctx.stopRing()
        ctx.session.withLock { $0 = nil }
        state.withLock {
            $0.phase = .finished
            $0.session = nil
            $0.reader = nil
        }
        onStopping?()
        if result < 0 {
            logger.error("FUSE loop failed", metadata: ["error": "\(String(cString: strerror(-result)))"])
        } else if result > 0 {
            logger.info("FUSE loop ended by signal \(result)")  // libfuse's handler records the signal number
        }
        if result < 0 { throw FUSEMountError.loopFailed(errno: -result) }
    }

    /// One helper thread: first waits until a stat(2) of the mountpoint is answered by this session
    /// (then relaxes the writeback limits if the kernel granted the writeback cache, and calls
    /// `onReady`), then watches for an exit flag set by a signal that reached a thread
    /// which libfuse's loop does not watch, and wakes the loop.
    private func startWatcher(deviceBefore: UInt?, context: FUSEContext, onReady: @escaping @Sendable () -> Void) {
        let path = mountpoint
        let log = logger
        Thread.detachNewThread { [self] in
            var ready = false
            while !ready && isRunning {
                var st = stat()
                if stat(path, &st) == 0 {
                    if deviceBefore == nil || st.st_dev != deviceBefore {
                        ready = true
                        state.withLock { $0.device = st.st_dev }
                        if context.writebackGranted.load(ordering: .acquiring) {
                            WritebackLimits.relax(device: st.st_dev, logger: log)
                        }
                        onReady()
                    } else {
                        usleep(5_000)
                    }
                } else {
                    let err = errno
                    if isRunning {
                        log.error("FUSE: the mountpoint does not answer", metadata: ["error": "\(String(cString: strerror(err)))"])
                    }
                    break
                }
            }
            var sinceWake = 0
            while true {
                let (running, exited) = state.withLock { s -> (Bool, Bool) in
                    guard s.phase == .running, let se = s.session else { return (false, false) }
                    return (true, fuse_session_exited(se.pointer) != 0)
                }
                if !running { return }
                if exited {
                    if sinceWake == 0 {
                        var s = statvfs()
                        _ = statvfs(path, &s)
                        interruptLoop()
                    }
                    sinceWake = (sinceWake + 1) % 5
                }
                usleep(200_000)
            }
        }
    }

    var isRunning: Bool { state.withLock { $0.phase == .running } }

    /// Reads the stop signals' pipe until `run` closes its other end. The first signal unmounts, on a thread of
    /// its own (flushing can take long); the same signal again ends the loop at once, as libfuse's handler did.
    private func watchStopSignals(_ fd: Int32) {
        defer { close(fd) }
        var first: Int32 = 0
        while true {
            var byte: UInt8 = 0
            let n = read(fd, &byte, 1)
            if n < 0 && errno == EINTR { continue }
            if n <= 0 { return }
            let sig = Int32(byte)
            if first == 0 {
                first = sig
                Thread.detachNewThread { [self] in stopOnSignal(sig) }
            } else if sig == first {
                endOnRepeatedSignal(sig)
            } else {
                logger.notice("\(Self.name(sig)) ignored while unmounting: send \(Self.name(first)) again to end at once")
            }
        }
    }

    /// A stop signal unmounts as `coffer unmount` does, never dropping what the kernel holds: the kernel's dirty
    /// pages are flushed through the running loop (syncfs), then a normal unmount lets the kernel end the
    /// connection, which ends the loop. A mount in use (open files, a working directory) is detached instead, as
    /// `coffer unmount --lazy`, and served until the last program lets go.
    private func stopOnSignal(_ sig: Int32) {
        let name = Self.name(sig)
        let mounted = state.withLock { s -> Bool in
            guard s.phase == .running, !s.exitRequested, s.stop == .none else { return false }
            s.stop = .unmounting
            return true
        }
        guard mounted else {
            // Not mounted yet (or already ending): nothing to flush.
            logger.info("\(name): ending")
            requestExit()
            return
        }
        // An idle unmount being tried finishes first (a moment: one umount2 or fusermount3); if it unmounted, the
        // loop is ending as on fusermount3 -u and there is nothing left to do.
        while state.withLock({ $0.idleProbe }) { usleep(1_000) }
        if state.withLock({ $0.idleUnmounted }) {
            logger.info("\(name): \(mountpoint) is already unmounted (idle)")
            return
        }
        logger.info("\(name): unmounting \(mountpoint) (the kernel's cached writes are written first)")
        let fd = open(mountpoint, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        if fd < 0 || coffer_syncfs(fd) != 0 {
            logger.warning("\(name): cannot flush \(mountpoint) before unmounting: \(String(cString: strerror(errno)))")
        }
        if fd >= 0 { close(fd) }
        var result = Self.unmount(mountpoint, lazy: false)
        var lazy = false
        if case .busy = result, state.withLock({ $0.phase == .running && !$0.exitRequested }) {
            lazy = true
            result = Self.unmount(mountpoint, lazy: true)
        }
        switch result {
        case .done:
            let ending = state.withLock { s -> Bool in
                if s.stop == .unmounting { s.stop = lazy ? .detached : .unmounted }
                return s.exitRequested
            }
            if lazy && !ending {
                logger.notice(
                    "\(mountpoint) is in use: detached; serving the programs that still use it until the last one lets go (\(name) again ends at once, losing what they have not written)"
                )
            }
        case .busy, .failed:
            if !isRunning { return }
            logger.error("\(name): cannot unmount \(mountpoint) (\(result)); ending the session")
            state.withLock { $0.stop = .none }
            requestExit()
        }
    }

    /// The same stop signal again: the loop ends now, and any program still using the mount loses what the kernel
    /// had not handed over yet (said in the log, and by `endedWhileInUse`).
    private func endOnRepeatedSignal(_ sig: Int32) {
        let inUse = state.withLock { s -> Bool in
            guard s.phase == .running, s.stop == .unmounting || s.stop == .detached else { return false }
            s.endedInUse = true
            return true
        }
        if inUse {
            logger.error(
                "\(Self.name(sig)) again: ending now while programs still use \(mountpoint); changes they have not fsynced may be lost")
        } else {
            logger.notice("\(Self.name(sig)) again: ending now")
        }
        requestExit()
    }

    enum UnmountResult: CustomStringConvertible, Equatable {
        case done, busy
        case failed(String)
        var description: String {
            switch self {
            case .done: "done"
            case .busy: "busy"
            case .failed(let why): why
            }
        }
    }

    /// Unmounts `path` as `coffer unmount [--lazy]` does: umount2 as root, else fusermount3 -u [-z].
    static func unmount(_ path: String, lazy: Bool) -> UnmountResult {
        if geteuid() == 0 {
            if umount2(path, (lazy ? Int32(MNT_DETACH) : 0) | Int32(UMOUNT_NOFOLLOW)) == 0 { return .done }
            let err = errno
            return err == EBUSY ? .busy : .failed(String(cString: strerror(err)))
        }
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/bin/fusermount3")
        process.arguments = ["-u"] + (lazy ? ["-z"] : []) + [path]
        let errPipe = Pipe()
        process.standardError = errPipe
        do { try process.run() } catch { return .failed("\(error)") }
        let why = String(decoding: errPipe.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        process.waitUntilExit()
        if process.terminationStatus == 0 { return .done }
        return why.contains("busy") ? .busy : .failed(why.trimmingCharacters(in: .whitespacesAndNewlines))
    }

    /// Ends the connection without unmounting by path (what `fuse_session_unmount` does after closing the device):
    /// the session's descriptor is replaced by /dev/null, so the device's last close ends the connection now and
    /// `fuse_session_destroy` closes /dev/null.
    private static func endConnection(_ se: OpaquePointer) {
        let null = open("/dev/null", O_RDWR | O_CLOEXEC)
        guard null >= 0 else { return }
        let fd = fuse_session_fd(se)
        if dup2(null, fd) == fd { _ = fcntl(fd, F_SETFD, FD_CLOEXEC) }
        close(null)
    }

    private static func name(_ sig: Int32) -> String {
        switch sig {
        case SIGINT: "SIGINT"
        case SIGTERM: "SIGTERM"
        case SIGHUP: "SIGHUP"
        default: "signal \(sig)"
        }
    }
}
