import Foundation
import Glibc

/// The service manager's notification protocol (sd_notify(3)) without libsystemd: datagrams of
/// `KEY=VALUE` lines to the AF_UNIX socket named by `NOTIFY_SOCKET` (a path, or `@name` for an
/// abstract socket). Under `Type=notify` systemd waits for `READY=1` before it starts units ordered
/// after this one, so READY must mean "the mount answers", not "the process started".
final class ServiceNotifier: @unchecked Sendable {
    // @unchecked: `fd` and `address` never change after init; sendto on one datagram socket is thread-safe.
    private let fd: Int32
    private var address: sockaddr_un
    private let addressLength: socklen_t
    /// The watchdog period the manager asked for (WATCHDOG_USEC), when it is meant for this process.
    let watchdogMicroseconds: UInt64?

    private let watchdogState = NSLock()
    private var watchdogStopped = false

    /// Reads NOTIFY_SOCKET / WATCHDOG_USEC / WATCHDOG_PID and removes them from the environment, so
    /// programs we start (extpass commands, fusermount3) do not talk to the manager in our name.
    static func fromEnvironment() -> ServiceNotifier? {
        let env = ProcessInfo.processInfo.environment
        defer { for name in ["NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"] { unsetenv(name) } }
        guard let socket = env["NOTIFY_SOCKET"], !socket.isEmpty else { return nil }
        var watchdog: UInt64?
        if let usec = env["WATCHDOG_USEC"].flatMap({ UInt64($0) }), usec > 0 {
            let pid = env["WATCHDOG_PID"].flatMap { pid_t($0) }
            if pid == nil || pid == getpid() { watchdog = usec }
        }
        return ServiceNotifier(socket: socket, watchdogMicroseconds: watchdog)
    }

    init?(socket: String, watchdogMicroseconds: UInt64?) {
        var path = Array(socket.utf8)
        guard path.first == UInt8(ascii: "/") || path.first == UInt8(ascii: "@") else { return nil }
        var addr = sockaddr_un()
        addr.sun_family = sa_family_t(AF_UNIX)
        let capacity = MemoryLayout.size(ofValue: addr.sun_path)
        guard path.count < capacity else { return nil }
        let abstract = path.first == UInt8(ascii: "@")
        if abstract { path[0] = 0 }
        withUnsafeMutableBytes(of: &addr.sun_path) { raw in
            for (i, b) in path.enumerated() { raw[i] = b }
        }
        // An abstract name is exactly its bytes; a path also carries its terminating NUL.
        let base = MemoryLayout<sockaddr_un>.offset(of: \.sun_path) ?? 2
        addressLength = socklen_t(base + path.count + (abstract ? 0 : 1))
        address = addr
        fd = Glibc.socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { return nil }
        self.watchdogMicroseconds = watchdogMicroseconds
    }

    deinit { Glibc.close(fd) }

    /// Sends one datagram; a manager that went away is not our failure, so errors are ignored.
    @discardableResult
    func send(_ lines: String) -> Bool {
        let bytes = Array(lines.utf8)
        var addr = address
        let sent = withUnsafePointer(to: &addr) { p in
            p.withMemoryRebound(to: sockaddr.self, capacity: 1) { sa in
                bytes.withUnsafeBytes { sendto(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL), sa, addressLength) }
            }
        }
        return sent == bytes.count
    }

    func status(_ text: String) { send("STATUS=\(text.replacingOccurrences(of: "\n", with: " "))") }

    /// The mount answers: units ordered after us may start.
    func ready(status text: String) { send("READY=1\nSTATUS=\(text.replacingOccurrences(of: "\n", with: " "))") }

    /// A launcher that hands the work to another process tells the manager which one to watch.
    func ready(mainPid: pid_t, status text: String) { send("MAINPID=\(mainPid)\nREADY=1\nSTATUS=\(text)") }

    func stopping(status text: String) {
        stopWatchdog()
        send("STOPPING=1\nSTATUS=\(text.replacingOccurrences(of: "\n", with: " "))")
    }

    /// Pings `WATCHDOG=1` every half period while `healthy()` says so, from a thread of its own: a
    /// daemon whose check hangs or fails stops pinging, and the manager restarts it.
    func startWatchdog(healthy: @escaping @Sendable () -> Bool) {
        guard let usec = watchdogMicroseconds else { return }
        let interval = max(usec / 2, 1_000)
        Thread.detachNewThread { [self] in
            while true {
                if isWatchdogStopped { return }
                if healthy(), !isWatchdogStopped { send("WATCHDOG=1") }
                var remaining = interval
                while remaining > 0, !isWatchdogStopped {
                    let step = min(remaining, 50_000)
                    usleep(useconds_t(step))
                    remaining -= step
                }
            }
        }
    }

    func stopWatchdog() {
        watchdogState.lock()
        watchdogStopped = true
        watchdogState.unlock()
    }

    private var isWatchdogStopped: Bool {
        watchdogState.lock()
        defer { watchdogState.unlock() }
        return watchdogStopped
    }
}
