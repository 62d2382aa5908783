import Foundation
import Glibc

/// At most one mount per container: an flock on `coffer.lock` in the container. The kernel drops it
/// when the daemon dies, so a lock left by a killed daemon is simply taken over.
///
/// In a container that cannot be written (read-only medium or directory) the lock is taken through a
/// read-only descriptor (flock needs none other), so a daemon serving the same container through another
/// path is still noticed; the pid cannot be recorded there (`holder` finds it in the kernel's lock table),
/// and with no lock file there is nothing to lock.
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
            close(fd)
            let pid = Self.holder(root: root).map { String($0) } ?? "?"
            throw CLIFailure(message: "the container is already mounted (daemon pid \(pid))", code: ExitStatus.alreadyMounted)
        }
        if writable {
            ftruncate(fd, 0)
            let text = "\(getpid())\n"
            _ = text.withCString { pwrite(fd, $0, strlen($0), 0) }
        }
        self.fd = fd
    }

    /// The pid of the daemon holding the lock, if one holds it. The kernel's lock table names it even
    /// where the file could not be written (a read-only container keeps an older daemon's pid); the
    /// pid in the file is the answer only when the table cannot be read.
    static func holder(root: String) -> pid_t? {
        let fd = open(root + "/" + fileName, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return nil }
        defer { close(fd) }
        guard flock(fd, LOCK_SH | LOCK_NB) != 0 else { flock(fd, LOCK_UN); return nil }
        var st = stat()
        if fstat(fd, &st) == 0, let pid = flockHolder(device: UInt64(st.st_dev), inode: UInt64(st.st_ino)) { return pid }
        var buf = [UInt8](repeating: 0, count: 32)
        let n = pread(fd, &buf, 31, 0)
        guard n > 0 else { return nil }
        return pid_t(String(decoding: buf[0 ..< n], as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines))
    }

    /// The process holding an flock on the file (device, inode), from /proc/locks, whose lines read
    /// `1: FLOCK  ADVISORY  WRITE 1752 fe:00:16220279 0 EOF` (major and minor in hex, at least two digits).
    static func flockHolder(device: UInt64, inode: UInt64) -> pid_t? {
        guard let table = try? String(contentsOfFile: "/proc/locks", encoding: .utf8) else { return nil }
        func hex(_ v: UInt64) -> String { let h = String(v, radix: 16); return h.count < 2 ? "0" + h : h }
        let major = ((device >> 8) & 0xfff) | ((device >> 32) & ~UInt64(0xfff))
        let minor = (device & 0xff) | ((device >> 12) & ~UInt64(0xff))
        let id = "\(hex(major)):\(hex(minor)):\(inode)"
        for line in table.split(separator: "\n") {
            let f = line.split(separator: " ")
            // Waiting requests read "1: -> FLOCK ...": not holders.
            guard f.count >= 6, f[1] == "FLOCK", f[5] == id else { continue }
            return pid_t(f[4])
        }
        return nil
    }

    deinit { if fd >= 0 { close(fd) } }
}
