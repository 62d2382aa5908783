import Foundation

/// What /proc shows of another process (a mount daemon): read as text, never acted on. Nil when the
/// process is gone or not this user's to read.
enum OtherProcess {
    /// Its argv, as it started.
    static func arguments(_ pid: pid_t) -> [String]? {
        FileManager.default.contents(atPath: "/proc/\(pid)/cmdline").map { raw in
            raw.split(separator: 0).map { String(decoding: $0, as: UTF8.self) }
        }
    }

    /// Its environment, as it started (where it keeps its sockets, its $HOME).
    static func environment(_ pid: pid_t) -> [String: String]? {
        guard let raw = FileManager.default.contents(atPath: "/proc/\(pid)/environ") else { return nil }
        var env: [String: String] = [:]
        for item in raw.split(separator: 0) {
            let s = String(decoding: item, as: UTF8.self)
            guard let eq = s.firstIndex(of: "=") else { continue }
            env[String(s[..<eq])] = String(s[s.index(after: eq)...])
        }
        return env
    }

    /// Its working directory.
    static func workingDirectory(_ pid: pid_t) -> String? {
        try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/\(pid)/cwd")
    }
}
