import CofferStore
import Foundation
import Glibc

/// Where a directory container's mount daemon listens (ControlServer) and how both ends talk: one
/// request line, one answer line ("OK" or "ERR message"). The socket is named by the container id and
/// the daemon's pid: two mounted copies of one container (same id) each have their own, and the copy
/// command knows the pid from the container's lock.
enum ControlSocket {
    /// Longest request or answer line read.
    static let maxLine = 8192

    /// The message of the answer to `snapshot` when the disk the snapshot is written to (the caller's) has
    /// no room, told apart from a full container disk (at the commit before it): the caller names its disk.
    static let noRoomForSnapshot = "no space left on the disk the snapshot is written to"

    /// `$XDG_RUNTIME_DIR/coffer`, else `run` in the state directory (GenerationLedger's), as seen in `env`.
    static func directory(environment env: [String: String]) -> String {
        if let r = env["XDG_RUNTIME_DIR"], r.hasPrefix("/") { return r + "/coffer" }
        return GenerationLedger.defaultDirectory(environment: env) + "/run"
    }

    static func fileName(containerId: String, pid: pid_t) -> String { "\(containerId)-\(pid).sock" }

    /// Makes the directory (private: 0700) if it is missing. A link where it should be is not followed.
    static func makeDirectory(_ dir: String) -> Bool {
        guard (try? FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)) != nil else { return false }
        var st = stat()
        guard lstat(dir, &st) == 0, (st.st_mode & S_IFMT) == S_IFDIR, st.st_uid == geteuid() else { return false }
        return chmod(dir, 0o700) == 0
    }

    /// A unix socket address for `dir/name`: through `/proc/self/fd/N` of the open directory, so a long
    /// state path never exceeds sun_path's 108 bytes. `body` gets the address while the directory is open.
    static func withAddress<T>(directory dir: String, name: String, _ body: (UnsafePointer<sockaddr>, socklen_t) -> T) -> T? {
        let dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard dfd >= 0 else { return nil }
        defer { close(dfd) }
        var addr = sockaddr_un()
        addr.sun_family = sa_family_t(AF_UNIX)
        let path = Array("/proc/self/fd/\(dfd)/\(name)".utf8)
        guard path.count < MemoryLayout.size(ofValue: addr.sun_path) else { return nil }
        withUnsafeMutableBytes(of: &addr.sun_path) { raw in
            for (i, b) in path.enumerated() { raw[i] = b }
        }
        return withUnsafePointer(to: &addr) { p in
            p.withMemoryRebound(to: sockaddr.self, capacity: 1) { body($0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
        }
    }

    /// A connection to daemon `pid`'s socket for `containerId` and the socket's owner; nil when that daemon has
    /// no control socket (an older version, or it could not make one). The socket is looked for where the
    /// daemon's own environment puts it (this user or root may read it), else where this process's does.
    static func connect(containerId: String, daemon pid: pid_t) throws -> (fd: Int32, owner: uid_t)? {
        guard pid > 0 else { return nil }
        let name = fileName(containerId: containerId, pid: pid)
        let places = [OtherProcess.environment(pid), ProcessInfo.processInfo.environment].compactMap { $0 }.map { directory(environment: $0) }
        var st = stat()
        guard let dir = places.first(where: { lstat($0 + "/" + name, &st) == 0 && (st.st_mode & S_IFMT) == S_IFSOCK }) else { return nil }
        let owner = st.st_uid
        let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw CLIFailure(message: "cannot make a socket: \(String(cString: strerror(errno)))", code: ExitStatus.failure) }
        let connected = withAddress(directory: dir, name: name) { Glibc.connect(fd, $0, $1) == 0 } ?? false
        guard connected else {
            close(fd)
            return nil
        }
        // The socket's name is only a name: the daemon answering must be the lock's holder.
        guard let p = peer(fd), p.pid == pid else {
            close(fd)
            throw CLIFailure(message: "the control socket is not the mount daemon's (pid \(pid))", code: ExitStatus.failure)
        }
        return (fd, owner)
    }

    /// Linux's `struct ucred`, which Glibc's module map does not export (it needs _GNU_SOURCE).
    struct Peer {
        var pid: pid_t = 0
        var uid: uid_t = 0
        var gid: gid_t = 0
    }

    /// The peer's credentials (SO_PEERCRED).
    static func peer(_ fd: Int32) -> Peer? {
        var cred = Peer()
        var len = socklen_t(MemoryLayout<Peer>.size)
        return getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0 && len == MemoryLayout<Peer>.size ? cred : nil
    }

    /// Both directions time out after `seconds` (0: never), so a silent peer cannot hold the other end.
    static func setTimeout(_ fd: Int32, seconds: Int) {
        var tv = timeval(tv_sec: seconds, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
    }

    /// One line up to "\n" (without it), nil on EOF, error, timeout or an over-long line; invalid UTF-8 is nil.
    static func readLine(_ fd: Int32) -> String? {
        var bytes: [UInt8] = []
        var b: UInt8 = 0
        while bytes.count <= maxLine {
            let n = read(fd, &b, 1)
            if n < 0, errno == EINTR { continue }
            guard n == 1 else { return nil }
            if b == UInt8(ascii: "\n") { return String(validating: bytes, as: UTF8.self) }
            bytes.append(b)
        }
        return nil
    }

    @discardableResult
    static func writeLine(_ fd: Int32, _ line: String) -> Bool {
        let bytes = Array((line + "\n").utf8)
        var done = 0
        while done < bytes.count {
            let n = bytes[done...].withUnsafeBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            if n < 0, errno == EINTR { continue }
            guard n > 0 else { return false }
            done += n
        }
        return true
    }
}
