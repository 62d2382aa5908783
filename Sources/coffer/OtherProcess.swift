import Foundation
import Glibc

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

    /// Its user (the owner of /proc/PID: its effective uid).
    static func owner(_ pid: pid_t) -> uid_t? {
        var st = stat()
        return stat("/proc/\(pid)", &st) == 0 ? st.st_uid : nil
    }

    /// A file another process names (its --config): read only if it is a regular file of at most 64 KiB,
    /// opened without blocking (a FIFO would hold the reader forever).
    static func smallRegularFile(_ path: String) -> String? {
        let fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC)
        guard fd >= 0 else { return nil }
        defer { close(fd) }
        var st = stat()
        guard fstat(fd, &st) == 0, (st.st_mode & S_IFMT) == S_IFREG, st.st_size <= 65536 else { return nil }
        var buffer = [UInt8](repeating: 0, count: 65536)
        var total = 0
        while total < buffer.count {
            let n = buffer[total...].withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
            if n < 0, errno == EINTR { continue }
            guard n > 0 else { break }
            total += n
        }
        return String(validating: buffer[0..<total], as: UTF8.self)
    }

    /// Its working directory.
    static func workingDirectory(_ pid: pid_t) -> String? {
        try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/\(pid)/cwd")
    }
}
