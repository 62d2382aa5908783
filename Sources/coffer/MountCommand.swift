import ArgumentParser
import CofferCrypto
import CofferFS
import CofferFUSE
import CofferStore
import Foundation
import Glibc
import Logging

struct MountCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "mount",
        abstract: "Mount a container on an empty directory.",
        discussion: """
            Returns once the mount answers, leaving the daemon in the background (-f: stay in the foreground; \
            SIGINT/SIGTERM unmount as `coffer unmount` does, detaching a mount in use; the same signal again ends at once). Unmount with `coffer unmount DIR`, which returns once everything is \
            committed, or `fusermount3 -u DIR`. The container and the mountpoint are checked before any \
            password is asked.

            Options (-o, comma-separated; also from mount(8) and fstab):
            \(MountOptionSet.helpText)

            --config FILE reads container, mountpoint, password source and options from FILE (`key = value` \
            lines: container, mountpoint, passfile, keyfile, extpass, credential, options; relative paths are \
            relative to FILE's directory). The coffer@NAME user service runs \
            `coffer mount -f --config ~/.config/coffer/NAME.conf`. Under a service manager (NOTIFY_SOCKET) it \
            reports READY=1 once the mount answers, STOPPING=1 when unmounting, and pings WATCHDOG=1.
            """)

    @Argument(help: "The container directory or postgresql:// URI (or give --config).")
    var container: String?

    @Argument(help: "The mountpoint: an existing empty directory that is not a mountpoint (or give --config).")
    var mountpoint: String?

    @Option(name: .customLong("config"), help: "Read container, mountpoint, password source and options from FILE.")
    var config: String?

    @OptionGroup var secret: SecretOptions

    @Flag(name: [.customShort("f"), .customLong("foreground")], help: "Stay in the foreground.")
    var foreground = false

    @Option(name: .customShort("o"), parsing: .singleValue, help: "Mount options, comma-separated (see above).")
    var options: [String] = []

    @Option(help: "Log level: trace, debug, info, notice, warning, error (file names appear only at debug and trace).")
    var logLevel: String = Logging.defaultLevel

    @Flag(help: "Mount even if the store is older than the newest this machine has seen (a rollback).")
    var allowRollback = false

    @Option(name: .customLong("ready-fd"), help: .hidden)
    var readyFD: Int32?

    func validate() throws {
        guard Logging.levels.contains(logLevel.lowercased()) else {
            throw ValidationError("unknown log level \"\(logLevel)\" (known: \(Logging.levels.joined(separator: ", ")))")
        }
        if config != nil {
            guard container == nil, mountpoint == nil else { throw ValidationError("give either --config FILE or CONTAINER MOUNTPOINT, not both") }
        } else {
            guard container != nil else { throw ValidationError("missing CONTAINER (or --config FILE)") }
            guard mountpoint != nil else { throw ValidationError("missing MOUNTPOINT") }
        }
    }

    /// What to mount, from the arguments or the config file; the config's options come before `-o`'s.
    struct Target {
        var container: String
        var mountpoint: String
        var options: [String]
        var secret: SecretOptions
    }

    func target() throws -> Target {
        guard let config else {
            return Target(container: container ?? "", mountpoint: mountpoint ?? "", options: options, secret: secret)
        }
        let c = try ServiceConfig.load(config)
        var s = secret
        if c.passfile != nil || c.keyfile != nil || c.extpass != nil, s.isGiven {
            throw CLIFailure(message: "the password source is given both in \(config) and on the command line", code: 64)
        }
        if s.passfile == nil { s.passfile = c.passfile }
        if s.keyfile == nil { s.keyfile = c.keyfile }
        if s.extpass == nil { s.extpass = c.extpass }
        return Target(container: c.container, mountpoint: c.mountpoint, options: (c.options.map { [$0] } ?? []) + options, secret: s)
    }

    func run() throws {
        // Read before anything starts a program: they must not inherit the manager's socket.
        let notifier = ServiceNotifier.fromEnvironment()
        let t: Target
        do { t = try target() } catch let f as CLIFailure {
            printErr("coffer: \(f.message)")
            notifier?.status("Refused: \(f.message)")
            throw ExitCode(f.code)
        }
        var opts = MountOptionSet()
        do { for o in t.options { try opts.parse(o) } } catch let f as CLIFailure {
            printErr("coffer: \(f.message)")
            throw ExitCode(f.code)
        }
        var secretOptions = t.secret
        if secretOptions.passfile == nil { secretOptions.passfile = opts.passfile }
        if secretOptions.extpass == nil { secretOptions.extpass = opts.extpass }
        if secretOptions.keyfile == nil { secretOptions.keyfile = opts.keyfile }
        if allowRollback { opts.allowRollback = true }
        try settleReadOnlyContainer(&opts, target: t)
        if foreground || readyFD != nil {
            try runDaemon(target: t, options: opts, secret: secretOptions, notifier: notifier)
        } else {
            notifier?.status("Starting the mount daemon")
            try reportingFailures {
                // The daemon checks all this again, but only after the launcher has asked for the secret.
                try checkBeforeSecrets(t, options: opts, secret: secretOptions)
                let pid = try Daemonizer.startInBackground(secret: secretOptions, arguments: backgroundArguments(t, readOnly: opts.readOnly))
                // The daemon is another process: the manager must watch it, not this launcher.
                notifier?.ready(mainPid: pid, status: "Mounted \(ContainerSource.argument(t.container)) on \(Container.absolutePath(t.mountpoint))")
            }
        }
    }

    /// The arguments for the background daemon: everything but the secret, which goes through a pipe.
    func backgroundArguments(_ t: Target, readOnly: Bool) -> [String] {
        var args = ["mount", ContainerSource.argument(t.container), Container.absolutePath(t.mountpoint), "--log-level", logLevel]
        if allowRollback { args.append("--allow-rollback") }
        for o in t.options { args += ["-o", o] }
        if readOnly { args += ["-o", "ro"] }
        return args
    }

    func runDaemon(target t: Target, options opts: MountOptionSet, secret: SecretOptions, notifier: ServiceNotifier?) throws {
        let ready = readyFD.map(ReadyPipe.init)
        let logger = Logging.makeLogger(level: opts.debug ? "debug" : logLevel, toSyslog: ready != nil)
        // Systemd counts watchdog time from the start: ping while unlocking too, then check the mount.
        let health = MountHealth()
        notifier?.startWatchdog { health.isHealthy() }
        DaemonExit.clearStale()
        Self.raiseOpenFileLimit()
        do {
            let mount = try prepare(target: t, options: opts, secret: secret, logger: logger, notifier: notifier)
            health.healthyWhile { mount.fuse.isStopping }
            let where_ = "\(mount.containerRoot) on \(mount.mountpoint)"
            try mount.run(
                onReady: {
                    health.watch(mount.mountpoint)
                    DaemonExit.recordRunning()
                    logger.notice("mounted \(where_)")
                    notifier?.ready(status: "Mounted \(where_)")
                    if ready != nil { Daemonizer.leaveWorkingDirectory() }
                    ready?.succeed()
                },
                onStopping: {
                    logger.info("unmounting \(mount.mountpoint): committing and closing the store")
                    notifier?.stopping(status: "Unmounting \(mount.mountpoint)")
                })
            try mount.finish()
            logger.notice("unmounted \(mount.mountpoint)")
            // Status 0 with a message: `coffer unmount` shows it as a warning.
            DaemonExit.record(status: 0, message: mount.fs.unmountWarning ?? "")
        } catch {
            let failure = CLIFailure.from(error)
            notifier?.stopWatchdog()
            notifier?.status("Refused: \(failure.message)")
            // One line: the log (stderr or syslog), plus the launcher's own line in daemon mode.
            if health.hasMounted {
                logger.error("mount ended with an error: \(failure.message)")
                DaemonExit.record(status: failure.code, message: failure.message)
            } else {
                logger.error("mount refused: \(failure.message)")
            }
            ready?.fail(failure)
            throw ExitCode(failure.code)
        }
    }

    /// The daemon keeps every segment file it has read open (and mapped): with the usual soft limit of 1,024
    /// descriptors, a container of more than about 60 GiB of large files would run out, and chunks would read
    /// as damage. The soft limit goes up to the hard one, as Go programs do.
    static func raiseOpenFileLimit() {
        var limit = rlimit()
        guard getrlimit(__rlimit_resource_t(RLIMIT_NOFILE.rawValue), &limit) == 0, limit.rlim_cur < limit.rlim_max else { return }
        limit.rlim_cur = limit.rlim_max
        _ = setrlimit(__rlimit_resource_t(RLIMIT_NOFILE.rawValue), &limit)
    }

    func prepare(target t: Target, options opts: MountOptionSet, secret: SecretOptions, logger: Logger, notifier: ServiceNotifier?) throws
        -> PreparedMount
    {
        let c = try Self.openContainer(t.container)
        notifier?.status("Opening the container \(c.root)")
        let mnt = Container.absolutePath(t.mountpoint)
        try Mountpoint.check(mnt, allowNonEmpty: opts.nonempty)
        let lock = try ContainerClaim.take(c, purpose: "mount")
        notifier?.status("Unlocking the container")
        let keys = try secret.unlock(c).keys
        do {
            notifier?.status("Opening the store")
            let store = try c.openStore(
                keys: keys, readOnly: opts.readOnly, reconnectWait: opts.reconnectWait, leaseHolder: lock.lease?.me.holder)
            let seen = GenerationLedger().lastSeen(containerId: c.header.containerId) ?? 0
            try checkRollback(store: store, containerId: c.header.containerId, allow: opts.allowRollback, readOnly: opts.readOnly, logger: logger)
            if !opts.readOnly { store.removeStrayFiles() }
            var fsOptions = CofferFileSystem.Options()
            fsOptions.readOnly = opts.readOnly
            fsOptions.symlinkRoot = mnt
            fsOptions.plainSymlinks = opts.plainSymlinks
            fsOptions.commitInterval = .milliseconds(Int(opts.commitInterval * 1000))
            // A PostgreSQL container may have other mounts (other machines) at any time: every mount of
            // one is coherent (SharedMount), and leaves unlinked-but-open files of a crashed session to a
            // mount that starts alone. The floor: a state below what this machine saw durable is a rollback.
            let shared = c.isShared
            if shared {
                store.shareWithOtherMounts(floor: min(seen, store.generation))
                lock.lease?.onRetaken = { [weak store] in store?.rejoin() }
                fsOptions.coherent = true
                // No writer page cache to bound here (the 8 MiB default is for SQLite's): fewer commits.
                fsOptions.commitVolume = 16 << 20
                // A group another mount began while it was alone ends before this mount reads anything.
                try store.awaitOtherGroups()
                // Orphans are removed only by a mount alone, then (counted under the writer lock): another
                // mount's may be open files.
                fsOptions.removesOrphans = (lock.lease?.othersAtStart ?? 0) == 0 && (opts.readOnly || store.isAlone)
            }
            // The root, read once here: a server gone at this moment is status 19, an entity that fails to open
            // names itself (13); the filesystem's own check below can only say that the root does not open.
            do { _ = try store.inode(EntityStore.rootInode) } catch {
                store.close()
                throw CLIFailure.from(error)
            }
            let fs: CofferFileSystem
            do {
                fs = try CofferFileSystem(
                    store: store, chunkSize: c.header.chunkSize, options: fsOptions, statfsPath: Self.statfsPath(c), logger: logger)
            } catch {
                store.close()
                throw CLIFailure(message: "the container's store is damaged: the root directory does not open", code: ExitStatus.storeDamaged)
            }
            // Locks every mount of the container sees (the lock table); kernel-local when it cannot be used.
            var sharedLocks: PostgresLocks?
            if shared, case .postgres(let p) = c.location, let holder = lock.lease?.me.holder {
                do { sharedLocks = try PostgresLocks(p, holder: holder) } catch {
                    logger.warning("file locks stay local to this mount: the container's lock table cannot be used: \(error)")
                }
            }
            let fuse: FUSEMount
            notifier?.status("Mounting on \(mnt)")
            do {
                var fuseOptions = opts.fuseOptions(fsName: c.root)
                // With the writeback cache the kernel keeps its own size of a file and never takes another mount's.
                if shared { fuseOptions.writebackCache = false }
                fuse = try FUSEMount(
                    filesystem: shared ? SharedMount(fs, locks: sharedLocks) : fs, mountpoint: mnt, options: fuseOptions, logger: logger)
            } catch {
                sharedLocks?.close()
                fs.shutdown()
                throw CLIFailure(message: "\(error)", code: ExitStatus.mountFailed)
            }
            if !opts.readOnly { fs.startCommitter() }
            lock.startRenewing(logger: logger) { why in
                logger.error("unmounting: \(why)")
                fuse.requestExit()
            }
            let prepared = PreparedMount(fuse: fuse, fs: fs, keys: keys, lock: lock, containerRoot: c.root, mountpoint: mnt)
            if case .directory = c.location {
                // `coffer copy` (everything written so far is committed, then copied sealed) and `coffer info`
                // of this mount: the store is the daemon's alone.
                prepared.control = ControlServer(
                    containerId: c.header.containerId, logger: logger,
                    snapshot: { [fs, store] path in
                        if !store.readOnly { try fs.commit() }
                        do { try store.snapshot(into: path) } catch StoreError.diskFull {
                            throw CLIFailure(message: ControlSocket.noRoomForSnapshot, code: ExitStatus.failure)
                        }
                    },
                    status: { [fs, store] in
                        let (generation, n) = try fs.committedCounts()
                        return "generation=\(generation) inodes=\(n.inodes) entries=\(n.entries) chunks=\(n.chunks) xattrs=\(n.xattrs)"
                            + " blocks=\(store.chunkSealing == .blocks ? 1 : 0)"
                    })
            }
            return prepared
        } catch {
            keys.wipe()
            throw error
        }
    }
}

extension MountCommand {
    /// Everything that can be refused without a secret is refused before one is asked (a prompt for a
    /// container that does not exist, or for a mount that cannot happen, wastes the user's time): the
    /// container, the mountpoint, the lock, and the password source.
    func checkBeforeSecrets(_ t: Target, options opts: MountOptionSet, secret: SecretOptions) throws {
        let c = try Self.openContainer(t.container)
        try Mountpoint.check(Container.absolutePath(t.mountpoint), allowNonEmpty: opts.nonempty)
        try ContainerClaim.checkFree(c)
        try secret.checkSource()
    }

    static func openContainer(_ source: String) throws -> Container { try ContainerSource.open(source) }

    /// statfs(2) of a directory container reports the disk it is on. A PostgreSQL container's server
    /// disk is not visible to a client: nil, and the mount reports a fixed large, empty capacity.
    static func statfsPath(_ c: Container) -> String? {
        if case .directory = c.location { return c.root }
        return nil
    }

    /// A container that cannot be written (read-only medium or bind mount, a directory or store without
    /// write permission) mounts read-only with one notice line, as users expect of read-only media; an
    /// explicit `-o rw` is refused. mount(8) passes `rw` whenever `ro` is not given, so in its argv form
    /// (`coffer SOURCE DIR -o ...`) `rw` is only that default.
    func settleReadOnlyContainer(_ opts: inout MountOptionSet, target t: Target) throws {
        guard !opts.readOnly, !ContainerURI.isURI(t.container), let c = try? Container.open(at: t.container), let store = try? c.storePath() else {
            return
        }
        let storeReadOnly = access(store, F_OK) == 0 && access(store, W_OK) != 0
        guard access(c.root, W_OK) != 0 || storeReadOnly else { return }
        let tokens = t.options.flatMap { $0.split(separator: ",") }
        if tokens.contains("rw"), CommandLine.arguments.dropFirst().first == "mount" {
            printErr(
                "coffer: \(c.root) cannot be written (read-only medium or directory): it cannot be mounted read-write; mount it without -o rw (or with -o ro) to read it"
            )
            throw ExitCode(ExitStatus.failure)
        }
        printErr("coffer: \(c.root) cannot be written (read-only medium or directory): mounting read-only")
        opts.readOnly = true
    }

    /// Refuses a store older than the newest this machine has seen, then keeps the ledger current.
    /// A read-only mount only checks: it may be of a copy (a backup, a snapshot), which must neither
    /// lower the recorded generation (with --allow-rollback) nor raise it.
    func checkRollback(store: EntityStore, containerId: String, allow: Bool, readOnly: Bool, logger: Logger) throws {
        let ledger = GenerationLedger()
        if let last = ledger.lastSeen(containerId: containerId), store.generation < last {
            guard allow else {
                store.close()
                throw CLIFailure(
                    message:
                        "the store is older than the one this machine last saw (generation \(store.generation) < \(last)): it was replaced by an older copy of itself (rollback) or restored from a backup, or a copy of it (`coffer copy`: the same container) was mounted and changed since; mount with --allow-rollback (-o allow_rollback) to accept it",
                    code: ExitStatus.rollback)
            }
            logger.warning("mounting a store older than the last seen (generation \(store.generation) < \(last)) as asked")
        }
        guard !readOnly else { return }
        // With --allow-rollback the user accepts this store: it becomes the newest seen.
        if !ledger.record(store.generation, containerId: containerId, replacingNewer: allow) {
            logger.warning("cannot record the store generation in \(ledger.directory): rollback detection is off for this mount")
        }
        store.onCommit = { generation in ledger.record(generation, containerId: containerId) }
    }
}

/// Everything a running mount holds; `finish` wipes the keys once the loop has ended.
final class PreparedMount: @unchecked Sendable {
    let fuse: FUSEMount
    let fs: CofferFileSystem
    let keys: ContainerKeys
    let lock: ContainerClaim
    let containerRoot: String
    let mountpoint: String
    /// A directory container's control socket (ControlServer); stopped before the store closes.
    var control: ControlServer?

    init(fuse: FUSEMount, fs: CofferFileSystem, keys: ContainerKeys, lock: ContainerClaim, containerRoot: String, mountpoint: String) {
        self.fuse = fuse
        self.fs = fs
        self.keys = keys
        self.lock = lock
        self.containerRoot = containerRoot
        self.mountpoint = mountpoint
    }

    func run(onReady: @escaping @Sendable () -> Void, onStopping: @escaping @Sendable () -> Void) throws {
        let control = self.control
        do {
            try fuse.run(
                onReady: onReady,
                onStopping: {
                    control?.stop()
                    onStopping()
                })
        } catch {
            control?.stop()
            keys.wipe()
            throw CLIFailure(message: "\(error)", code: ExitStatus.mountFailed)
        }
    }

    /// After the loop (the store is closed): the keys go, and a lease is given back. Fails when the last
    /// commit did, so that the daemon's status (and `coffer unmount`'s) says so.
    func finish() throws {
        control?.stop()
        keys.wipe()
        lock.release()
        if let why = fs.finalCommitFailure { throw CLIFailure(message: why, code: ExitStatus.failure) }
        if let why = fuse.failure {
            throw CLIFailure(
                message: "the mount of \(mountpoint) ended: \(why); mount it again (-o no_uring keeps it off io_uring)",
                code: ExitStatus.failure)
        }
        if fuse.endedWhileInUse {
            throw CLIFailure(
                message: "ended by a second signal while programs still used \(mountpoint): changes they had not fsynced may be lost",
                code: ExitStatus.failure)
        }
    }
}

/// The watchdog's check: once mounted, a statvfs (never answered from the kernel's cache) must reach
/// our session and the mountpoint must still be our filesystem. Before the mount exists, startup is
/// bounded by the manager's start timeout instead.
final class MountHealth: @unchecked Sendable {
    private let lock = NSLock()
    private var mountpoint: String?
    private var device: UInt?
    /// True while a stop signal's unmount waits for the mount's last users: the path no longer leads to the
    /// mount, and the watchdog must not kill what still serves them.
    private var stopping: @Sendable () -> Bool = { false }

    func healthyWhile(_ stopping: @escaping @Sendable () -> Bool) {
        lock.lock()
        self.stopping = stopping
        lock.unlock()
    }

    func watch(_ path: String) {
        var st = stat()
        let dev: UInt? = stat(path, &st) == 0 ? UInt(st.st_dev) : nil
        lock.lock()
        mountpoint = path
        device = dev
        lock.unlock()
    }

    /// True once the mount has answered (READY).
    var hasMounted: Bool {
        lock.lock()
        defer { lock.unlock() }
        return mountpoint != nil
    }

    func isHealthy() -> Bool {
        lock.lock()
        let path = mountpoint, dev = device, stopping = stopping
        lock.unlock()
        guard let path else { return true }
        if stopping() { return true }
        var vfs = statvfs()
        guard statvfs(path, &vfs) == 0 else { return false }
        var st = stat()
        return stat(path, &st) == 0 && UInt(st.st_dev) == dev
    }
}

enum Mountpoint {
    static func check(_ path: String, allowNonEmpty: Bool) throws {
        var st = stat()
        guard stat(path, &st) == 0 else {
            let e = errno
            // A FUSE mount whose daemon died (kill -9, a crash) stays in the mount table until unmounted.
            let hint = e == ENOTCONN ? " (the filesystem mounted there has ended: run fusermount3 -u '\(path)' first)" : ""
            throw CLIFailure(message: "mountpoint \(path): \(String(cString: strerror(e)))\(hint)", code: ExitStatus.badMountpoint)
        }
        guard (st.st_mode & S_IFMT) == S_IFDIR else {
            throw CLIFailure(message: "mountpoint \(path) is not a directory", code: ExitStatus.badMountpoint)
        }
        // Mounting over a mount hides it and stacks two filesystems on one path.
        if !allowNonEmpty, let under = MountTable.entry(at: path) {
            throw CLIFailure(
                message:
                    "mountpoint \(path) is already a mountpoint (\(under.source), \(under.type)); unmount it first (or use -o nonempty to mount over it anyway)",
                code: ExitStatus.badMountpoint)
        }
        if !allowNonEmpty, let items = try? FileManager.default.contentsOfDirectory(atPath: path), !items.isEmpty {
            throw CLIFailure(message: "mountpoint \(path) is not empty (use -o nonempty to mount over it anyway)", code: ExitStatus.badMountpoint)
        }
    }
}
