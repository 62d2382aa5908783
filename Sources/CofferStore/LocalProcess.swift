import Foundation
import Glibc

/// A process of this machine, seen from outside: a lease's holder (PostgresLease), the daemon `coffer unmount`
/// waits for.
public enum LocalProcess {
    /// Whether `pid` still runs (EPERM: it runs under another user). A zombie does not: a daemon that ended and
    /// that nobody has reaped yet holds nothing. A /proc entry that cannot be read says nothing: running.
    public static func isRunning(_ pid: Int32) -> Bool {
        guard pid > 0, kill(pid, 0) == 0 || errno == EPERM else { return false }
        // /proc/PID/stat: "PID (COMMAND) STATE ...", where COMMAND may itself hold spaces and parentheses.
        guard let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8), let close = stat.lastIndex(of: ")") else { return true }
        let state = stat[stat.index(after: close)...].trimmingCharacters(in: .whitespaces).first
        return state != "Z" && state != "X"
    }
}
