import CFuse3
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
    private let logger: Logger

    private enum Phase { case idle, starting, running, finished }
    /// The session pointer, shared with requestExit and the watcher only under `state`'s lock.
    private struct SessionRef: @unchecked Sendable { let pointer: OpaquePointer }
    private struct State {
        var phase: Phase = .idle
        var session: SessionRef?
        var exitRequested = false
    }
    private let state = Mutex(State())

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

    /// Asks the loop to end (like SIGTERM). Safe from any thread, before, during or after `run`.
    public func requestExit() {
        let wake: Bool = state.withLock { s in
            s.exitRequested = true
            if s.phase == .running, let se = s.session {
                fuse_session_exit(se.pointer)
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
    }

    /// Mounts, serves (multi-threaded unless `singleThreaded`) and blocks until unmounted (fusermount3 -u),
    /// SIGINT/SIGTERM/SIGHUP or `requestExit()`. `onReady` is called once, from another thread, once a stat(2) of
    /// the mountpoint has been answered by this session. `onStopping` is called once the loop has ended (unmount
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
            killPrivV2: options.killPrivV2, ioUring: options.ioUring)
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
        defer {
            if ownsSignals {
                fuse_remove_signal_handlers(se)
                Self.signalHandlerOwner.withLock { $0 = nil }
            }
            state.withLock {
                $0.phase = .finished
                $0.session = nil
            }
            // Parked lock requests are answered (EINTR) while the session still exists.
            ctx.lockWaiters.stop()
            if mounted { fuse_session_unmount(se) }
            // A store (or a lock's page drop) blocked on a page a READ holds (no worker answers it now) ends
            // when the connection does; if it has not, the session must outlive it (the process is about to exit).
            let pagesDropped = ctx.lockWaiters.detach(), entriesDropped = ctx.kernelNotifier.stop()
            if ctx.pageFiller?.stop() == false || !pagesDropped || !entriesDropped {
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
            if fuse_set_signal_handlers(se) != 0 {
                Self.signalHandlerOwner.withLock { $0 = nil }
                ownsSignals = false
                logger.error("FUSE: could not install signal handlers")
                throw FUSEMountError.signalHandlersFailed
            }
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
            s.phase = .running
            if s.exitRequested { fuse_session_exit(se) }
        }
        logger.info(
            "Mounted \(options.fsName) at \(mountpoint)",
            metadata: [
                "type": "fuse.\(options.subtype)", "readOnly": "\(options.readOnly || filesystem.isReadOnly)"
            ])

        let detached = mountpoint
        ctx.onRingFailure.withLock {
            $0 = {
                let p = Process()
                p.executableURL = URL(fileURLWithPath: "/bin/fusermount3")
                p.arguments = ["-u", "-z", detached]
                if (try? p.run()) != nil { p.waitUntilExit() }
            }
        }
        ctx.pageFiller?.start(session: se)
        ctx.lockWaiters.attach(se)
        ctx.kernelNotifier.start(session: se, fs: ctx.fs)
        ctx.session.withLock { $0 = FUSEContext.SessionPointer(pointer: se) }
        startWatcher(deviceBefore: deviceBefore, context: ctx, onReady: onReady)

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
        ctx.stopRing()
        // Stop answering (parked lock requests get EINTR: the workers are gone, nothing parks again),
        // then unmount and destroy (deferred above), which calls shutdown.
        ctx.lockWaiters.stop()
        ctx.session.withLock { $0 = nil }
        state.withLock {
            $0.phase = .finished
            $0.session = nil
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
                    }
                    sinceWake = (sinceWake + 1) % 5
                }
                usleep(200_000)
            }
        }
    }

    private var isRunning: Bool { state.withLock { $0.phase == .running } }
}
