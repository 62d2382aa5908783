import ArgumentParser
import CofferFUSE
import CofferStore
import Foundation
import Glibc
import Synchronization

struct UnmountCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "unmount", abstract: "Unmount a mounted container and wait until everything is committed.",
        aliases: ["umount"])

    @Argument(help: "The mountpoint.")
    var mountpoint: String

    @Flag(name: [.customShort("z"), .customLong("lazy")], help: "Detach now even if busy (the daemon finishes when the last user lets go).")
    var lazy = false

    func run() throws {
        try reportingFailures {
            let mnt = Container.absolutePath(mountpoint)
            guard let entry = MountTable.entry(at: mnt), entry.type.hasPrefix("fuse.coffer") || entry.type == "fuse" else {
                throw CLIFailure(message: "\(mnt) is not a mounted Coffer container", code: ExitStatus.badMountpoint)
            }
            let daemon = entry.source.hasPrefix("/") ? ContainerLock.holder(root: entry.source) : Self.daemon(serving: mnt, owner: entry.owner)
            let exitRecord = daemon.map { DaemonExit.places(daemon: $0) } ?? ([], "", nil)
            let died = daemon == nil && !lazy && Self.connectionIsGone(mnt)
            let process = Process()
            process.executableURL = URL(fileURLWithPath: "/bin/fusermount3")
            process.arguments = ["-u"] + (lazy ? ["-z"] : []) + [mnt]
            let errPipe = Pipe()
            process.standardError = errPipe
            try process.run()
            process.waitUntilExit()
            guard process.terminationStatus == 0 else {
                let why = String(decoding: errPipe.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
                let busy = why.contains("busy")
                throw CLIFailure(
                    message: busy
                        ? "\(mnt) is busy (a process uses it); close it or use --lazy"
                        : "cannot unmount \(mnt): \(why.trimmingCharacters(in: .whitespacesAndNewlines))", code: ExitStatus.failure)
            }
            if died {
                throw CLIFailure(
                    message: "unmounted, but its daemon had already ended without finishing (killed, or it crashed): "
                        + "what it had not committed is lost; see its log, and run coffer fsck", code: ExitStatus.failure)
            }
            // The daemon commits after the kernel lets go; wait for it so "unmounted" means "durable", and say how it ended.
            if let pid = daemon, pid > 0, !lazy {
                try Self.awaitEnd(of: pid)
                switch DaemonExit.read(exitRecord, removing: true) {
                case .ended(let status, let message) where status != 0:
                    throw CLIFailure(message: "unmounted, but the daemon ended with an error: \(message)", code: status)
                case .ended(_, let message) where !message.isEmpty:
                    FileHandle.standardError.write(Data("coffer: warning: \(message)\n".utf8))
                case .running?:
                    throw CLIFailure(
                        message:
                            "unmounted, but the daemon (pid \(pid)) ended without finishing (killed, or it crashed): see its log, and run coffer fsck",
                        code: ExitStatus.failure)
                default: break
                }
            }
        }
    }
}

extension UnmountCommand {
    /// Whether the mount's daemon ended without unmounting: its connection answers ENOTCONN. Asked with
    /// statvfs (STATFS, which the kernel never answers from a cache), and for 2 s at most on a thread of its own,
    /// since a daemon that lives but is stopped would not answer at all.
    static func connectionIsGone(_ mnt: String) -> Bool {
        let answer = Mutex<Int32?>(nil)
        let done = DispatchSemaphore(value: 0)
        Thread {
            var st = statvfs()
            let e: Int32 = statvfs(mnt, &st) == 0 ? 0 : errno
            answer.withLock { $0 = e }
            done.signal()
        }.start()
        _ = done.wait(timeout: .now() + 2)
        return answer.withLock { $0 } == ENOTCONN
    }

    /// Waits for the daemon to end, saying so after 5 s: it commits what is pending after the kernel let go
    /// (a full disk's deletes, a loaded machine can take minutes). After 10 minutes it stops waiting and fails.
    static func awaitEnd(of pid: pid_t, limit: Double = 600) throws {
        let start = Date()
        var said = false
        while LocalProcess.isRunning(pid) {
            let waited = Date().timeIntervalSince(start)
            if waited >= limit {
                throw CLIFailure(
                    message: "the daemon (pid \(pid)) is still committing after \(Int(limit)) s; not waiting longer", code: ExitStatus.failure)
            }
            if !said, waited >= 5 {
                printErr("coffer: waiting for the daemon (pid \(pid)) to finish committing")
                said = true
            }
            usleep(50_000)
        }
    }

    /// A container without a directory to lock (PostgreSQL): the daemon is the `coffer mount`
    /// process (started with --ready-fd, or -f) whose argv names this mountpoint, or else one of
    /// `owner`'s (the mount's user) whose --config file does.
    static func daemon(serving mnt: String, owner: uid_t?) -> pid_t? {
        let pids = ((try? FileManager.default.contentsOfDirectory(atPath: "/proc")) ?? []).compactMap { pid_t($0) }
        let daemons: [(pid: pid_t, args: [String])] = pids.compactMap { pid in
            guard pid != getpid(), let args = OtherProcess.arguments(pid), args.count > 3, args[1] == "mount",
                args.contains(where: { $0 == "--ready-fd" || $0 == "-f" || $0 == "--foreground" })
            else { return nil }
            return (pid, args)
        }
        // Other daemons' paths are compared as text, never looked up: a path on a mount whose daemon is
        // slow or stuck (another container's) would hold this unmount up for as long.
        if let d = daemons.first(where: { d in d.args.contains { lexicalPath($0) == mnt } }) { return d.pid }
        // A config file is read only for the mount's own user's processes: anyone can name any file in argv.
        let user = owner ?? geteuid()
        return daemons.first { d in OtherProcess.owner(d.pid) == user && configMountpoint(pid: d.pid, args: d.args) == mnt }?.pid
    }

    /// The mountpoint of a `coffer mount --config FILE` process (the systemd unit's form), whose argv does not
    /// name it: the `mountpoint` line of FILE as it reads now (a relative FILE against the process's working
    /// directory, `~/` against its $HOME), resolved as text (ServiceConfig.mountpointText). Nil when the process
    /// has no --config, the file is not a small regular file, or has no mountpoint (a config edited since the
    /// daemon started may name another).
    static func configMountpoint(pid: pid_t, args: [String]) -> String? {
        var file: String?
        for (i, a) in args.enumerated() {
            if a == "--config", i + 1 < args.count { file = args[i + 1] }
            if a.hasPrefix("--config=") { file = String(a.dropFirst("--config=".count)) }
        }
        guard var path = file else { return nil }
        if !path.hasPrefix("/") {
            guard let cwd = OtherProcess.workingDirectory(pid) else { return nil }
            path = cwd + "/" + path
        }
        path = lexicalPath(path)
        guard let text = OtherProcess.smallRegularFile(path),
            let mountpoint = ServiceConfig.mountpointText(text, file: path, home: OtherProcess.environment(pid)?["HOME"])
        else { return nil }
        return lexicalPath(mountpoint)
    }

    /// `path` made absolute (against the working directory) with ".", ".." and repeated slashes taken
    /// out, without touching the filesystem.
    static func lexicalPath(_ path: String) -> String {
        let full = path.hasPrefix("/") ? path : FileManager.default.currentDirectoryPath + "/" + path
        var parts: [Substring] = []
        for part in full.split(separator: "/", omittingEmptySubsequences: true) {
            if part == "." { continue }
            if part == ".." {
                _ = parts.popLast()
                continue
            }
            parts.append(part)
        }
        return "/" + parts.joined(separator: "/")
    }
}

/// /proc/mounts, read for mountpoints and for where a container is mounted.
enum MountTable {
    struct Entry {
        let source: String
        let mountpoint: String
        let type: String
        /// A FUSE mount's `user_id=` option: the user who mounted it.
        var owner: uid_t? = nil
    }

    static func entries() -> [Entry] {
        guard let text = try? String(contentsOfFile: "/proc/mounts", encoding: .utf8) else { return [] }
        return text.split(separator: "\n").compactMap { line in
            let f = line.split(separator: " ")
            guard f.count >= 3 else { return nil }
            let owner = f.count > 3 ? f[3].split(separator: ",").first { $0.hasPrefix("user_id=") }.flatMap { uid_t($0.dropFirst(8)) } : nil
            return Entry(
                source: MountInfo.unescape(String(f[0])), mountpoint: MountInfo.unescape(String(f[1])), type: String(f[2]), owner: owner)
        }
    }

    /// The last (topmost) entry at a mountpoint.
    static func entry(at mountpoint: String) -> Entry? {
        entries().last { $0.mountpoint == mountpoint }
    }

    /// Where a container is mounted (its root is the mount's source).
    static func entries(source: String) -> [Entry] {
        entries().filter { $0.source == source && $0.type.hasPrefix("fuse") }
    }
}
