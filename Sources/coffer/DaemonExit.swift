import Foundation
import Glibc

/// How a mount daemon ended, for `coffer unmount`: it waits for the daemon but is not its parent, so it cannot
/// see the daemon's exit status. A daemon that has mounted writes `exit-PID` beside its control socket
/// (ControlSocket.directory): "running" once mounted, then "STATUS MESSAGE" as it ends, one line each. Still
/// "running" after the daemon is gone: it was killed or crashed. No file at all: it could not write one
/// (its directory is not its own), and nothing is known.
enum DaemonExit {
    enum Record: Equatable {
        case running
        case ended(status: Int32, message: String)
    }

    static func fileName(pid: pid_t) -> String { "exit-\(pid)" }

    /// The daemon, once mounted.
    static func recordRunning() { write("running\n") }

    /// The daemon, as it ends: its exit status and, unless 0, the line that says why (the message the log has;
    /// no secret and no file name is ever in one).
    static func record(status: Int32, message: String) { write("\(status) \(message.replacingOccurrences(of: "\n", with: " "))\n") }

    private static func write(_ line: String) {
        let dir = ControlSocket.directory(environment: ProcessInfo.processInfo.environment)
        guard (try? FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)) != nil, chmod(dir, 0o700) == 0
        else { return }
        let path = dir + "/" + fileName(pid: getpid())
        let temporary = path + ".new"
        guard FileManager.default.createFile(atPath: temporary, contents: Data(line.utf8), attributes: [.posixPermissions: 0o600]) else { return }
        rename(temporary, path)
    }

    /// At the daemon's start: a file an earlier process with this pid left, and any older than a week (daemons
    /// unmounted with fusermount3, which reads none).
    static func clearStale() {
        let dir = ControlSocket.directory(environment: ProcessInfo.processInfo.environment)
        unlink(dir + "/" + fileName(pid: getpid()))
        let weekAgo = Date().addingTimeInterval(-7 * 86400)
        for f in (try? FileManager.default.contentsOfDirectory(atPath: dir)) ?? [] where f.hasPrefix("exit-") {
            let attributes = try? FileManager.default.attributesOfItem(atPath: dir + "/" + f)
            if let m = attributes?[.modificationDate] as? Date, m < weekAgo { unlink(dir + "/" + f) }
        }
    }

    /// Where daemon `pid` writes its file: as its own environment says, else as this process's. Asked while
    /// the daemon runs (its environment goes with it).
    static func places(daemon pid: pid_t) -> [String] {
        let environments = [OtherProcess.environment(pid), ProcessInfo.processInfo.environment].compactMap { $0 }
        var seen: [String] = []
        for dir in environments.map({ ControlSocket.directory(environment: $0) }) where !seen.contains(dir) { seen.append(dir) }
        return seen.map { $0 + "/" + fileName(pid: pid) }
    }

    /// What the daemon wrote last; nil when there is no file. `removing` it, once the daemon has ended.
    static func read(_ places: [String], removing: Bool = false) -> Record? {
        for path in places {
            guard let text = OtherProcess.smallRegularFile(path) else { continue }
            if removing { unlink(path) }
            let line = text.trimmingCharacters(in: .whitespacesAndNewlines)
            if line == "running" { return .running }
            let parts = line.split(separator: " ", maxSplits: 1)
            guard let first = parts.first, let status = Int32(first) else {
                return .ended(status: ExitStatus.failure, message: "unreadable exit record")
            }
            return .ended(status: status, message: parts.count > 1 ? String(parts[1]) : "")
        }
        return nil
    }
}
