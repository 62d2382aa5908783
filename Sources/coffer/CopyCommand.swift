import ArgumentParser
import CofferCheck
import CofferStore
import Foundation
import Glibc

/// `coffer copy SRC DEST`: the header and sealed rows as they are (StoreCopy), between a directory
/// and PostgreSQL either way; resumable; `--verify` opens every entity of the copy with a secret.
struct CopyCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "copy",
        abstract: "Copy a container (header and sealed rows, no password needed) to a new directory or PostgreSQL schema.",
        discussion: """
            The copy is the same container (same id and keys): a backup, or a move between engines. The source is read \
            in one snapshot: an unmounted directory container under its lock, a mounted one from a snapshot its mount \
            daemon writes (through its control socket) beside DEST and removed afterwards, a PostgreSQL one in one \
            REPEATABLE READ transaction, mounted or not. DEST must not exist (or be an empty directory): \
            anything else is refused, except an unfinished copy of the same source, which is continued where it stopped \
            (started over if the source changed since). With --verify the copy is unlocked with the secret and every \
            entity is opened and checked as `coffer fsck` does (status 13 on a problem).
            """)

    @Argument(help: "The container to copy (directory or postgresql:// URI).")
    var source: String

    @Argument(help: "Where the copy goes (a new directory or postgresql:// URI).")
    var destination: String

    @Flag(help: "Afterwards unlock the copy and open every entity (needs a secret).")
    var verify = false

    @OptionGroup var secret: SecretOptions

    func validate() throws {
        if secret.isGiven && !verify { throw ValidationError("a secret is only used with --verify") }
    }

    func run() throws {
        try reportingFailures {
            let src = try ContainerSource.location(source), dst = try ContainerSource.location(destination)
            if case .directory(let a) = src, case .directory(let b) = dst {
                // Paths compared as bytes, as the kernel does (Swift's String equality is canonical equivalence).
                let (x, y) = (Array((Container.absolutePath(a) + "/").utf8), Array((Container.absolutePath(b) + "/").utf8))
                if x == y { throw CLIFailure(message: "SRC and DEST are the same place", code: ExitStatus.usage) }
                // One container's directory inside the other's: the copy would become a stray file of the source
                // (or, under segments/, something its cleanup would trip on), or be copied into itself.
                if x.starts(with: y) || y.starts(with: x) {
                    throw CLIFailure(message: "SRC and DEST must not lie one inside the other", code: ExitStatus.usage)
                }
            }
            if verify { try secret.checkSource() }
            // Before any secret is asked, and so that a source that cannot be read says why as `coffer info` does
            // (a refused login, no such container: 10, a server away: 19), not as a store that is damaged.
            _ = try Container.open(src)
            var given: Secret?
            defer { given?.bytes.wipe() }
            if verify {
                // A wrong secret is refused before the copy, not after it (the copy has the source's slots).
                let secret = try secret.secret()
                given = secret
                try Container.open(src).unlock(secret).keys.wipe()
            }
            // From before a snapshot is asked for until it is gone: a signal removes it first.
            let signals = DaemonSnapshot.removeOnSignals()
            defer {
                signals.forEach { $0.cancel() }
                [SIGINT, SIGTERM, SIGHUP].forEach { signal($0, SIG_DFL) }
            }
            let (sourceLock, snapshot) = try Self.lockOrSnapshot(src, dst)
            defer { snapshot?.taken.remove() }
            try withExtendedLifetime(sourceLock) {
                let copySource = try snapshot.map { s in try CopySource.open(directory: s.root, snapshot: s.taken.storePath) } ?? CopySource.open(src)
                defer { copySource.close() }
                if let first = try copySource.missingContent().first {
                    throw CLIFailure(
                        message: "SRC is damaged: \(first); a copy would carry the damage (run coffer fsck SRC, and restore that file first)",
                        code: ExitStatus.storeDamaged)
                }
                if case .directory(let path) = dst, mkdir(path, 0o700) != 0, errno != EEXIST {
                    throw CLIFailure(message: "\(path): cannot create: \(String(cString: strerror(errno)))", code: ExitStatus.failure)
                }
                let destLock = try Self.lockIfDirectory(dst, what: "DEST")
                defer { withExtendedLifetime(destLock) {} }
                let (rows, resumed) = try Self.copy(copySource, to: dst)
                print("coffer copy: \(resumed ? "finished the copy" : "copied") \(src) to \(dst) (\(rows) rows\(resumed ? " this time" : ""))")
            }
            if let given { try Self.verify(dst, given) }
        }
    }

    private static func copy(_ source: CopySource, to dst: ContainerLocation) throws -> (rows: Int, resumed: Bool) {
        let copier = StoreCopy(from: source, to: dst)
        let bar = ProgressBar("copying")
        defer { bar.finish() }
        copier.progress = { bar.update(done: $0, total: $1) }
        copier.notice = {
            bar.finish()
            printErr("coffer copy: \($0)")
        }
        // Test hooks: small batches, and a SIGKILL after N of them (an interrupted copy).
        let env = ProcessInfo.processInfo.environment
        if let b = env["COFFER_COPY_TEST_BATCH_BYTES"].flatMap(Int.init) { copier.batchBytes = b }
        if let n = env["COFFER_COPY_TEST_KILL_AFTER"].flatMap(Int.init) {
            let sig = env["COFFER_COPY_TEST_KILL_SIGNAL"].flatMap(Int32.init) ?? SIGKILL
            copier.afterBatch = { if $0 == n { kill(getpid(), sig) } }  // once: a signal that ends the copy ends it
        }
        do { return try copier.run() } catch let e as CopyRefusal {
            throw CLIFailure(message: e.description, code: ExitStatus.failure)
        } catch let e as StoreError where e == .diskFull {
            // Only DEST is written (the source is read in a snapshot): its disk is the full one, and no store is damaged.
            let disk = if case .directory = dst { "its disk" } else { "its server's disk" }
            throw CLIFailure(message: "DEST \(dst): no space left on \(disk); make room and run the same command again", code: ExitStatus.failure)
        }
    }

    /// A mounted directory source is read from a snapshot its daemon writes near the destination (its
    /// parent directory, or $TMPDIR for PostgreSQL); any other source is locked or read as it is.
    private static func lockOrSnapshot(_ src: ContainerLocation, _ dst: ContainerLocation) throws
        -> (ContainerLock?, (root: String, taken: DaemonSnapshot)?)
    {
        do { return (try lockIfDirectory(src, what: "SRC"), nil) } catch let f as CLIFailure where f.code == ExitStatus.alreadyMounted {
            guard case .directory(let path) = src else { throw f }
            let root = Container.absolutePath(path)
            let id = try Container.open(at: root).header.containerId
            var near = ProcessInfo.processInfo.environment["TMPDIR"].flatMap { $0.hasPrefix("/") ? $0 : nil } ?? "/tmp"
            if case .directory(let d) = dst { near = (Container.absolutePath(d) as NSString).deletingLastPathComponent }
            do {
                guard let pid = ContainerLock.holder(root: root), let taken = try DaemonSnapshot.take(containerId: id, daemon: pid, near: near) else {
                    throw f
                }
                return (nil, (root, taken))
            } catch is DaemonSnapshot.NoRoom {
                let place =
                    if case .directory = dst { "DEST \(dst): no space left beside it (in \(near))" } else { "no space left in \(near) ($TMPDIR)" }
                throw CLIFailure(
                    message: "\(place) for the snapshot of the mounted SRC; make room and run the same command again", code: ExitStatus.failure)
            }
        }
    }

    /// The container's lock for a directory that exists: a mounted source (its daemon holds the store
    /// for itself) and a destination in use are refused; two copies into one place never run at once.
    private static func lockIfDirectory(_ location: ContainerLocation, what: String) throws -> ContainerLock? {
        guard case .directory(let path) = location, FileManager.default.fileExists(atPath: path) else { return nil }
        let root = Container.absolutePath(path)
        ContainerLock.awaitDaemonWithoutMount(root: root)
        do { return try ContainerLock(root: root) } catch let f as CLIFailure where f.code == ExitStatus.alreadyMounted {
            let pid = ContainerLock.holder(root: root).map { String($0) } ?? "?"
            throw CLIFailure(message: "\(what) \(path): container is mounted (pid \(pid)) — unmount it first", code: ExitStatus.alreadyMounted)
        }
    }

    /// Unlocks the copy's own header and runs fsck's checker over its store: clean or status 13.
    private static func verify(_ location: ContainerLocation, _ secret: Secret) throws {
        let c = try Container.open(location)
        let (keys, _) = try c.unlock(secret)
        defer { keys.wipe() }
        let store = try c.openStore(keys: keys, readOnly: true)
        defer { store.close() }
        let bar = ProgressBar("verifying")
        let result = try Checker(store: store, chunkSize: c.header.chunkSize, progress: { bar.update(done: $0, total: $1) }).run()
        bar.finish()
        let n = result.counts
        guard result.isClean else {
            for p in result.problems { print("  \(p.kind.rawValue): \(p.location): \(p.detail)") }
            throw CLIFailure(message: "verify: the copy has \(result.problems.count) problem(s)", code: ExitStatus.storeDamaged)
        }
        print(
            "coffer copy: verified: \(n.inodes) inodes, \(n.entries) entries, \(n.chunks) chunks, \(n.chunkMapPages) map pages, \(n.xattrs) xattrs open"
        )
    }
}
