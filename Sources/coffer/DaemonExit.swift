import Foundation
import Glibc

/// How a mount daemon ended, for `coffer unmount`: it waits for the daemon but is not its parent, so it cannot
/// see the daemon's exit status. A daemon that has mounted writes `exit-PID` beside its control socket
/// (ControlSocket.directory): "running" once mounted, then "STATUS MESSAGE" as it ends, rewritten in place
/// (no new file is needed on a full disk). Still "running" after the daemon is gone: it was killed or
/// crashed. No file: it could not make one (its directory is not its own), and nothing is known.
enum DaemonExit {
    enum Record: Equatable {
        case running
        case ended(status: Int32, message: String)
    }

    static func fileName(pid: pid_t) -> String { "exit-\(pid)" }

    /// The daemon's open record (written only by the thread that ends the mount).
    nonisolated(unsafe) private static var fd: Int32 = -1

    /// The daemon, once mounted.
    static func recordRunning() {
        let dir = ControlSocket.directory(environment: ProcessInfo.processInfo.environment)
        guard ControlSocket.makeDirectory(dir) else { return }
        let path = dir + "/" + fileName(pid: getpid())
        unlink(path)
        fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0o600)
        write("running\n")
    }

    /// The daemon, as it ends: its exit status and the line that says why (the message its log has; with
    /// status 0, a warning or nothing).
    static func record(status: Int32, message: String) {
        write("\(status) \(message.replacingOccurrences(of: "\n", with: " "))\n")
        if fd >= 0 { close(fd) }
        fd = -1
    }

    private static func write(_ line: String) {
        guard fd >= 0 else { return }
        let bytes = Array(line.utf8)
        if pwrite(fd, bytes, bytes.count, 0) == bytes.count { _ = ftruncate(fd, off_t(bytes.count)) }
    }

    /// At the daemon's start: records older than a week (daemons unmounted with fusermount3, which reads none).
    static func clearStale() {
        let dir = ControlSocket.directory(environment: ProcessInfo.processInfo.environment)
        let weekAgo = Date().addingTimeInterval(-7 * 86400)
        for f in (try? FileManager.default.contentsOfDirectory(atPath: dir)) ?? [] where f.hasPrefix("exit-") {
            let attributes = try? FileManager.default.attributesOfItem(atPath: dir + "/" + f)
            if let m = attributes?[.modificationDate] as? Date, m < weekAgo { unlink(dir + "/" + f) }
        }
    }

    /// Where daemon `pid` keeps its record (as its own environment says, else as this process's) and whose it
    /// must be. Asked while the daemon runs: its environment goes with it.
    static func places(daemon pid: pid_t) -> (directories: [String], name: String, owner: uid_t?) {
        let environments = [OtherProcess.environment(pid), ProcessInfo.processInfo.environment].compactMap { $0 }
        var seen: [String] = []
        for dir in environments.map({ ControlSocket.directory(environment: $0) }) where !seen.contains(dir) { seen.append(dir) }
        return (seen, fileName(pid: pid), OtherProcess.owner(pid))
    }

    /// What the daemon wrote last; nil when there is none. Only a regular file of the daemon's user, reached
    /// without following links (root may run this in another user's directory); `removing` it, once the
    /// daemon has ended. A status is 0 or 1–125 (anything else reads as 1); the message loses control characters.
    static func read(_ places: (directories: [String], name: String, owner: uid_t?), removing: Bool = false) -> Record? {
        for dir in places.directories {
            let dfd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
            guard dfd >= 0 else { continue }
            defer { close(dfd) }
            let f = openat(dfd, places.name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC)
            guard f >= 0 else { continue }
            defer { close(f) }
            var st = stat()
            guard fstat(f, &st) == 0, (st.st_mode & S_IFMT) == S_IFREG, st.st_size <= 4096, places.owner.map({ $0 == st.st_uid }) ?? true else {
                continue
            }
            var buffer = [UInt8](repeating: 0, count: 4096)
            let n = Glibc.read(f, &buffer, buffer.count)
            if removing { unlinkat(dfd, places.name, 0) }
            let line = String(decoding: buffer.prefix(max(0, n)), as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
            if line == "running" { return .running }
            let parts = line.split(separator: " ", maxSplits: 1)
            let status = parts.first.flatMap { Int32($0) }.map { (0...125).contains($0) ? $0 : ExitStatus.failure } ?? ExitStatus.failure
            let message = parts.count > 1 ? String(parts[1].unicodeScalars.filter { $0.properties.generalCategory != .control }.prefix(500)) : ""
            return .ended(status: status, message: message)
        }
        return nil
    }
}
