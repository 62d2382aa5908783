import CofferStore
import Foundation
import Glibc

/// A mounted directory container's store as its daemon wrote it for `coffer copy` (ControlServer):
/// a consistent SQLite file of sealed rows in a private temporary directory, removed by `remove`.
final class DaemonSnapshot {
    let directory: String
    var storePath: String { directory + "/" + SQLiteBackend.fileName }

    private init(directory: String) { self.directory = directory }

    /// Asks daemon `pid` of the container `containerId` for a snapshot in a new private directory in
    /// `near`. nil when that daemon has no control socket (an older version).
    static func take(containerId: String, daemon pid: pid_t, near: String) throws -> DaemonSnapshot? {
        guard pid > 0, let (dir, owner) = socket(containerId: containerId, pid: pid) else { return nil }
        let name = ControlSocket.fileName(containerId: containerId, pid: pid)
        let fd = Glibc.socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw failure("cannot make a socket: \(String(cString: strerror(errno)))") }
        defer { close(fd) }
        let connected = ControlSocket.withAddress(directory: dir, name: name) { connect(fd, $0, $1) == 0 } ?? false
        guard connected else { return nil }
        // The socket's name is only a name: the daemon answering must be the lock's holder.
        guard let peer = ControlSocket.peer(fd), peer.pid == pid else { throw failure("the control socket is not the mount daemon's (pid \(pid))") }
        let snapshot = try DaemonSnapshot(directory: makePrivateDirectory(near: near, owner: owner))
        ControlSocket.writeLine(fd, "snapshot " + snapshot.storePath)
        let answer = ControlSocket.readLine(fd)
        guard answer == "OK" else {
            snapshot.remove()
            let why = answer.map { $0.hasPrefix("ERR ") ? String($0.dropFirst(4)) : $0 } ?? "no answer"
            throw failure("the mount daemon (pid \(pid)) could not take a snapshot: \(why)")
        }
        return snapshot
    }

    /// The snapshot's files and directory go.
    func remove() {
        for f in (try? FileManager.default.contentsOfDirectory(atPath: directory)) ?? [] { unlink(directory + "/" + f) }
        rmdir(directory)
    }

    /// The directory of the daemon's socket (found through the daemon's own environment, which this user
    /// or root may read, else this process's) and the socket's owner.
    private static func socket(containerId: String, pid: pid_t) -> (String, uid_t)? {
        var envs: [[String: String]] = []
        if let raw = FileManager.default.contents(atPath: "/proc/\(pid)/environ") {
            var env: [String: String] = [:]
            for item in raw.split(separator: 0) {
                let s = String(decoding: item, as: UTF8.self)
                guard let eq = s.firstIndex(of: "=") else { continue }
                env[String(s[..<eq])] = String(s[s.index(after: eq)...])
            }
            envs.append(env)
        }
        envs.append(ProcessInfo.processInfo.environment)
        for env in envs {
            let dir = ControlSocket.directory(environment: env)
            var st = stat()
            if lstat(dir + "/" + ControlSocket.fileName(containerId: containerId, pid: pid), &st) == 0, (st.st_mode & S_IFMT) == S_IFSOCK {
                return (dir, st.st_uid)
            }
        }
        return nil
    }

    /// A new directory (0700) in `parent`, given to the daemon's user if that is not this one (root copying
    /// a user's mount): the daemon writes the snapshot there.
    private static func makePrivateDirectory(near parent: String, owner: uid_t) throws -> String {
        var template = Array("\(parent)/.coffer-snapshot-XXXXXX".utf8CString)
        let made = template.withUnsafeMutableBufferPointer { b in b.baseAddress.flatMap { mkdtemp($0) }.map { String(cString: $0) } }
        guard let dir = made else { throw failure("cannot create a temporary directory in \(parent): \(String(cString: strerror(errno)))") }
        if owner != geteuid(), chown(dir, owner, gid_t.max) != 0 {
            let e = errno
            rmdir(dir)
            throw failure("cannot give \(dir) to the daemon's user: \(String(cString: strerror(e)))")
        }
        return dir
    }

    private static func failure(_ message: String) -> CLIFailure { CLIFailure(message: "SRC: \(message)", code: ExitStatus.failure) }
}
