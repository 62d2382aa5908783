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
            Returns once the mount answers, leaving the daemon in the background (-f: stay in the
            foreground; SIGINT/SIGTERM unmount). Unmount with `coffer unmount DIR` or `fusermount3 -u DIR`.
            Options (-o, comma-separated): passfile=FILE, extpass=CMD, keyfile=FILE, ro, allow_other,
            default_permissions (always on), debug, auto_unmount, nonempty, plain_symlinks (store absolute
            symlink targets inside the mount as given), writeback_cache, and the mount flags noatime, nodev,
            nosuid, noexec (and their opposites).
            """)

    @Argument(help: "The container directory.")
    var container: String

    @Argument(help: "The mountpoint: an existing empty directory.")
    var mountpoint: String

    @OptionGroup var secret: SecretOptions

    @Flag(name: [.customShort("f"), .customLong("foreground")], help: "Stay in the foreground.")
    var foreground = false

    @Option(name: .customShort("o"), parsing: .singleValue, help: "Mount options, comma-separated (see above).")
    var options: [String] = []

    @Option(help: "Log level: error, warning, info, debug.")
    var logLevel: String = "info"

    @Flag(help: "Mount even if the store is older than the newest this machine has seen (a rollback).")
    var allowRollback = false

    @Option(name: .customLong("ready-fd"), help: .hidden)
    var readyFD: Int32?

    func run() throws {
        var opts = MountOptionSet()
        do { for o in options { try opts.parse(o) } } catch let f as CLIFailure {
            printErr("coffer: \(f.message)"); throw ExitCode(f.code)
        }
        var secretOptions = secret
        if secretOptions.passfile == nil { secretOptions.passfile = opts.passfile }
        if secretOptions.extpass == nil { secretOptions.extpass = opts.extpass }
        if secretOptions.keyfile == nil { secretOptions.keyfile = opts.keyfile }
        if allowRollback { opts.allowRollback = true }
        if foreground || readyFD != nil {
            try runDaemon(options: opts, secret: secretOptions)
        } else {
            try reportingFailures { try Daemonizer.startInBackground(secret: secretOptions, arguments: backgroundArguments(opts)) }
        }
    }

    /// The arguments for the background daemon: everything but the secret, which goes through a pipe.
    func backgroundArguments(_ opts: MountOptionSet) -> [String] {
        var args = ["mount", Container.absolutePath(container), Container.absolutePath(mountpoint), "--log-level", logLevel]
        if allowRollback { args.append("--allow-rollback") }
        for o in options { args += ["-o", o] }
        return args
    }

    func runDaemon(options opts: MountOptionSet, secret: SecretOptions) throws {
        let ready = readyFD.map(ReadyPipe.init)
        let logger = Logging.makeLogger(level: opts.debug ? "debug" : logLevel, toSyslog: ready != nil)
        do {
            let mount = try prepare(options: opts, secret: secret, logger: logger)
            try mount.run(onReady: {
                logger.info("mounted \(mount.containerRoot) on \(mount.mountpoint)")
                ready?.succeed()
            })
            logger.info("unmounted \(mount.mountpoint)")
            mount.finish()
        } catch {
            let failure = CLIFailure.from(error)
            logger.error("mount failed: \(failure.message)")
            if let ready { ready.fail(failure) } else { printErr("coffer: \(failure.message)") }
            throw ExitCode(failure.code)
        }
    }

    func prepare(options opts: MountOptionSet, secret: SecretOptions, logger: Logger) throws -> PreparedMount {
        let c = try Container.open(at: container)
        let mnt = Container.absolutePath(mountpoint)
        try Mountpoint.check(mnt, allowNonEmpty: opts.nonempty)
        let lock = try ContainerLock(root: c.root)
        let s = try secret.secret()
        let unlocked: (keys: ContainerKeys, slotId: String)
        do { unlocked = try c.unlock(s) } catch { s.bytes.wipe(); throw error }
        s.bytes.wipe()
        let keys = unlocked.keys
        do {
            let store = try EntityStore.open(at: try c.storePath(), keys: keys, readOnly: opts.readOnly)
            try checkRollback(store: store, containerId: c.header.containerId, allow: opts.allowRollback, logger: logger)
            var fsOptions = CofferFileSystem.Options()
            fsOptions.readOnly = opts.readOnly
            fsOptions.symlinkRoot = mnt
            fsOptions.plainSymlinks = opts.plainSymlinks
            let fs: CofferFileSystem
            do { fs = try CofferFileSystem(store: store, chunkSize: c.header.chunkSize, options: fsOptions, statfsPath: c.root, logger: logger) } catch {
                store.close()
                throw CLIFailure(message: "the container's store is damaged: the root directory does not open", code: ExitStatus.storeDamaged)
            }
            let fuse: FUSEMount
            do {
                fuse = try FUSEMount(filesystem: fs, mountpoint: mnt, options: opts.fuseOptions(fsName: c.root), logger: logger)
            } catch {
                fs.shutdown()
                throw CLIFailure(message: "\(error)", code: ExitStatus.mountFailed)
            }
            if !opts.readOnly { fs.startCommitter() }
            return PreparedMount(fuse: fuse, fs: fs, keys: keys, lock: lock, containerRoot: c.root, mountpoint: mnt)
        } catch {
            keys.wipe()
            throw error
        }
    }
}

extension MountCommand {
    /// Refuses a store older than the newest this machine has seen, then keeps the ledger current.
    func checkRollback(store: EntityStore, containerId: String, allow: Bool, logger: Logger) throws {
        let ledger = GenerationLedger()
        if let last = ledger.lastSeen(containerId: containerId), store.generation < last {
            guard allow else {
                store.close()
                throw CLIFailure(message: "the store is older than the one this machine last saw (generation \(store.generation) < \(last)): it was replaced by an older copy of itself (rollback) or restored from a backup; mount with --allow-rollback (-o allow_rollback) to accept it", code: ExitStatus.rollback)
            }
            logger.warning("mounting a store older than the last seen (generation \(store.generation) < \(last)) as asked")
        }
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
    let lock: ContainerLock
    let containerRoot: String
    let mountpoint: String

    init(fuse: FUSEMount, fs: CofferFileSystem, keys: ContainerKeys, lock: ContainerLock, containerRoot: String, mountpoint: String) {
        self.fuse = fuse; self.fs = fs; self.keys = keys; self.lock = lock; self.containerRoot = containerRoot; self.mountpoint = mountpoint
    }

    func run(onReady: @escaping @Sendable () -> Void) throws {
        do { try fuse.run(onReady: onReady) } catch {
            keys.wipe()
            throw CLIFailure(message: "\(error)", code: ExitStatus.mountFailed)
        }
    }

    func finish() { keys.wipe() }
}

enum Mountpoint {
    static func check(_ path: String, allowNonEmpty: Bool) throws {
        var st = stat()
        guard stat(path, &st) == 0 else {
            throw CLIFailure(message: "mountpoint \(path): \(String(cString: strerror(errno)))", code: ExitStatus.badMountpoint)
        }
        guard (st.st_mode & S_IFMT) == S_IFDIR else { throw CLIFailure(message: "mountpoint \(path) is not a directory", code: ExitStatus.badMountpoint) }
        if !allowNonEmpty, let items = try? FileManager.default.contentsOfDirectory(atPath: path), !items.isEmpty {
            throw CLIFailure(message: "mountpoint \(path) is not empty (use -o nonempty to mount over it anyway)", code: ExitStatus.badMountpoint)
        }
    }
}

extension Container {
    static func absolutePath(_ p: String) -> String {
        var path = p
        if !path.hasPrefix("/") { path = FileManager.default.currentDirectoryPath + "/" + path }
        return (path as NSString).standardizingPath
    }
}
