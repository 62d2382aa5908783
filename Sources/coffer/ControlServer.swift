import CofferStore
import Foundation
import Glibc
import Logging

/// The control socket of a directory container's mount daemon (ControlSocket). The daemon holds the
/// store for itself (unix-excl VFS), so what other commands would read from it they ask here:
/// - `snapshot PATH`: how `coffer copy` reads a mounted container; the daemon commits and writes the
///   copy (sealed rows only) for the caller;
/// - `status`: `OK generation=N inodes=N entries=N chunks=N xattrs=N` for `coffer info`; the daemon
///   commits first, so the counts are those of that generation.
/// Requests are served one at a time on the server's own thread, never on a FUSE worker.
final class ControlServer: @unchecked Sendable {
    let path: String
    private let directory: String
    private let name: String
    private let listener: Int32
    private let snapshot: @Sendable (String) throws -> Void
    private let status: @Sendable () throws -> String
    private let logger: Logger
    private let done = DispatchSemaphore(value: 0)
    private let stopped = NSLock()
    private var isStopped = false

    /// Listens at the socket for `containerId` and this process (a stale one left there is replaced);
    /// nil, logged, when it cannot: the mount works, only a copy (and counts by `coffer info`) while mounted is refused.
    init?(
        containerId: String, logger: Logger, snapshot: @escaping @Sendable (String) throws -> Void,
        status: @escaping @Sendable () throws -> String
    ) {
        directory = ControlSocket.directory(environment: ProcessInfo.processInfo.environment)
        name = ControlSocket.fileName(containerId: containerId, pid: getpid())
        path = directory + "/" + name
        self.logger = logger
        self.snapshot = snapshot
        self.status = status
        let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0, ControlSocket.makeDirectory(directory) else {
            logger.warning(
                "no control socket in \(directory) (coffer copy of this mount is refused, and coffer info shows no counts while it is mounted): \(String(cString: strerror(errno)))"
            )
            if fd >= 0 { close(fd) }
            return nil
        }
        Self.removeStale(in: directory, containerId: containerId)
        unlink(path)
        let bound = ControlSocket.withAddress(directory: directory, name: name) { bind(fd, $0, $1) == 0 } ?? false
        // The directory is private (0700): no one else reaches the socket before its mode is set.
        guard bound, chmod(path, 0o600) == 0, listen(fd, 4) == 0 else {
            logger.warning(
                "no control socket at \(path) (coffer copy of this mount is refused, and coffer info shows no counts while it is mounted): \(String(cString: strerror(errno)))"
            )
            close(fd)
            unlink(path)
            return nil
        }
        listener = fd
        Thread.detachNewThread { [self] in
            serve()
            done.signal()
        }
    }

    /// Stops listening, waits for a request being served (a snapshot finishes before the store closes)
    /// and removes the socket. Later calls do nothing.
    func stop() {
        stopped.lock()
        defer { stopped.unlock() }
        guard !isStopped else { return }
        isStopped = true
        shutdown(listener, Int32(SHUT_RDWR))
        done.wait()
        close(listener)
        unlink(path)
    }

    private func serve() {
        while true {
            let c = accept(listener, nil, nil)
            if c < 0 {
                if errno == EINTR || errno == ECONNABORTED { continue }
                return
            }
            _ = fcntl(c, F_SETFD, FD_CLOEXEC)
            ControlSocket.setTimeout(c, seconds: 10)
            ControlSocket.writeLine(c, answer(c))
            close(c)
        }
    }

    /// The answer line to the request on `c`.
    /// The request is read first (bounded, timed out) so the answer reaches a refused caller too.
    private func answer(_ c: Int32) -> String {
        let line = ControlSocket.readLine(c)
        guard let cred = ControlSocket.peer(c), cred.uid == geteuid() || cred.uid == 0 else {
            logger.warning("control socket: refused a request from another user")
            return "ERR permission denied: only the daemon's user or root may ask"
        }
        guard let line else { return "ERR no request" }
        if line == "status" {
            do { return "OK " + (try status()) } catch { return "ERR \(error)".replacingOccurrences(of: "\n", with: " ") }
        }
        guard line.hasPrefix("snapshot ") else { return "ERR unknown request" }
        let target = String(line.dropFirst("snapshot ".count))
        do {
            try createTarget(target)
            do { try snapshot(target) } catch {
                unlink(target)
                throw error
            }
            logger.info("control socket: wrote a snapshot of the store for pid \(cred.pid)")
            return "OK"
        } catch {
            logger.error("control socket: snapshot failed: \(error)")
            return "ERR \(error)".replacingOccurrences(of: "\n", with: " ")
        }
    }

    /// The snapshot's file, created empty here (VACUUM INTO fills an empty file): absolute, new (never
    /// an existing file or a symlink), mode 0600, in a directory the caller can write (the caller is this
    /// user, whose rights the daemon has, or root).
    private func createTarget(_ target: String) throws {
        guard target.hasPrefix("/"), !target.hasSuffix("/") else { throw CLIFailure(message: "the path is not absolute", code: 1) }
        let fd = open(target, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0o600)
        guard fd >= 0 else {
            if errno == ENOSPC || errno == EDQUOT { throw CLIFailure(message: ControlSocket.noRoomForSnapshot, code: 1) }
            throw CLIFailure(message: "\(target): \(String(cString: strerror(errno)))", code: 1)
        }
        close(fd)
    }

    /// `dir` and its parents, the last one private.
    /// Sockets of this container left by daemons that are gone (killed).
    private static func removeStale(in dir: String, containerId: String) {
        for f in (try? FileManager.default.contentsOfDirectory(atPath: dir)) ?? [] where f.hasPrefix(containerId + "-") && f.hasSuffix(".sock") {
            let pid = f.dropFirst(containerId.count + 1).dropLast(".sock".count)
            guard let p = pid_t(pid), kill(p, 0) != 0, errno == ESRCH else { continue }
            unlink(dir + "/" + f)
        }
    }
}
