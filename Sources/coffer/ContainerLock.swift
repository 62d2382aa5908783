import Foundation
import Glibc

/// At most one mount per container: an flock on `coffer.lock` in the container. The kernel drops it
/// when the daemon dies, so a lock left by a killed daemon is simply taken over.
///
/// In a container that cannot be written (read-only medium or directory) the lock is taken through a
/// read-only descriptor (flock needs none other), so a daemon serving the same container through another
/// path is still noticed; the pid is not recorded there, and with no lock file there is nothing to lock.
final class ContainerLock {
    static let fileName = "coffer.lock"
    private let fd: Int32

    init(root: String) throws {
        let path = root + "/" + Self.fileName
        var fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0o600)
        let writable = fd >= 0
        if !writable, errno == EROFS || errno == EACCES {
            fd = open(path, O_RDONLY | O_CLOEXEC)
            if fd < 0, errno == ENOENT { self.fd = -1; return }
        }
        guard fd >= 0 else {
            throw CLIFailure(message: "cannot create the mount lock \(path): \(String(cString: strerror(errno)))", code: ExitStatus.failure)
        }
        guard flock(fd, LOCK_EX | LOCK_NB) == 0 else {
            var buf = [UInt8](repeating: 0, count: 32)
            let n = pread(fd, &buf, 31, 0)
            close(fd)
            let pid = n > 0 ? String(decoding: buf[0 ..< n], as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines) : "?"
            throw CLIFailure(message: "the container is already mounted (daemon pid \(pid))", code: ExitStatus.alreadyMounted)
        }
        if writable {
            ftruncate(fd, 0)
            let text = "\(getpid())\n"
            _ = text.withCString { pwrite(fd, $0, strlen($0), 0) }
        }
        self.fd = fd
    }

    /// The pid recorded by the daemon holding the lock, if one holds it.
    static func holder(root: String) -> pid_t? {
        let fd = open(root + "/" + fileName, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return nil }
        defer { close(fd) }
        guard flock(fd, LOCK_SH | LOCK_NB) != 0 else { flock(fd, LOCK_UN); return nil }
        var buf = [UInt8](repeating: 0, count: 32)
        let n = pread(fd, &buf, 31, 0)
        guard n > 0 else { return nil }
        return pid_t(String(decoding: buf[0 ..< n], as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines))
    }

    deinit { if fd >= 0 { close(fd) } }
}
