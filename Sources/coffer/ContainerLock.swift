import Foundation
import Glibc

/// At most one mount per container: an flock on the container directory itself, through an O_RDONLY
/// descriptor, so no lock file is left behind for a sync tool to upload. The kernel drops the lock
/// when the daemon dies, so a lock left by a killed daemon is simply taken over; flock needs no write
/// access, so a read-only container is locked the same way. The holder's pid comes from the kernel's
/// lock table (/proc/locks).
final class ContainerLock {
    /// The lock file of earlier versions: still honoured while an older daemon may hold it, then removed.
    static let legacyFileName = "coffer.lock"
    private let fd: Int32

    init(root: String) throws {
        let fd = open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard fd >= 0 else {
            throw CLIFailure(message: "cannot open \(root) to lock it: \(String(cString: strerror(errno)))", code: ExitStatus.failure)
        }
        guard flock(fd, LOCK_EX | LOCK_NB) == 0, !Self.legacyFileIsLocked(root: root) else {
            close(fd)
            throw Self.alreadyMounted(root: root)
        }
        self.fd = fd
        unlink(root + "/" + Self.legacyFileName)
    }

    deinit { close(fd) }

    /// "already mounted", saying where and by which daemon.
    static func alreadyMounted(root: String) -> CLIFailure {
        let pid = holder(root: root).map { $0 > 0 ? String($0) : "?" } ?? "?"
        let places = MountTable.entries(source: root).map(\.mountpoint)
        let where_ = places.isEmpty ? "" : " on " + places.joined(separator: ", ")
        return CLIFailure(message: "the container is already mounted\(where_) (daemon pid \(pid))", code: ExitStatus.alreadyMounted)
    }

    /// Whether a daemon holds the lock: its pid, 0 when the kernel's lock table cannot say, nil when none.
    /// Read from /proc/locks without locking: a probe that took the lock for a moment, even shared, made
    /// a mount starting at that moment fail as "already mounted" (its LOCK_EX|LOCK_NB met the probe).
    static func holder(root: String) -> pid_t? {
        var st = stat()
        guard stat(root, &st) == 0 else { return nil }
        if let pid = flockHolder(device: UInt64(st.st_dev), inode: UInt64(st.st_ino), path: root) { return pid }
        if legacyFileIsLocked(root: root) { return 0 }
        // No /proc/locks to read (a restricted /proc): the probe is all there is.
        guard access("/proc/locks", R_OK) != 0 else { return nil }
        let fd = open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard fd >= 0 else { return nil }
        defer { close(fd) }
        guard flock(fd, LOCK_SH | LOCK_NB) != 0 else {
            flock(fd, LOCK_UN)
            return nil
        }
        return 0
    }

    /// A daemon of an earlier version holds its flock on `coffer.lock`.
    private static func legacyFileIsLocked(root: String) -> Bool {
        let fd = open(root + "/" + legacyFileName, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return false }
        defer { close(fd) }
        guard flock(fd, LOCK_SH | LOCK_NB) == 0 else { return true }
        flock(fd, LOCK_UN)
        return false
    }

    /// After `fusermount3 -u` the daemon still commits and closes the store before it lets the lock go
    /// (`coffer unmount` waits for that; fusermount3 and umount(8) do not). A mount started then finds the
    /// lock held by a daemon whose mount is gone: it waits for it, up to `seconds`, saying so.
    static func awaitDaemonWithoutMount(root: String, seconds: Double = 60) {
        func finishing() -> pid_t? {
            guard let pid = holder(root: root), MountTable.entries(source: root).isEmpty, isMountDaemon(pid) else { return nil }
            return pid
        }
        guard let pid = finishing() else { return }
        printErr("coffer: waiting for the daemon of an earlier mount of \(root) (pid \(pid > 0 ? String(pid) : "?")) to finish committing")
        let deadline = Date().addingTimeInterval(seconds)
        while finishing() != nil, Date() < deadline { usleep(50_000) }
    }

    /// Only a mount daemon (`coffer mount …` in its argv) finishes by itself; `coffer fsck` or `coffer
    /// copy` hold the lock without a mount, and not for a moment: nothing to wait for. An unknown holder
    /// (pid 0) is waited for, as before.
    private static func isMountDaemon(_ pid: pid_t) -> Bool {
        guard pid > 0 else { return true }
        guard let argv = try? String(contentsOfFile: "/proc/\(pid)/cmdline", encoding: .utf8) else { return false }
        return argv.split(separator: "\0").dropFirst().first == "mount"
    }

    /// The process holding an flock on the file (device, inode), from /proc/locks, whose lines read
    /// `1: FLOCK  ADVISORY  WRITE 1752 fe:00:16220279 0 EOF` (major and minor in hex, at least two digits).
    /// A line with the same inode on another device counts only if that process has `path` open: btrfs's stat
    /// gives the subvolume's anonymous device and /proc/locks the filesystem's, but small filesystems (tmpfs)
    /// repeat inode numbers, and another container's daemon was taken for this one's (a mount refused as
    /// "already mounted", an unmount that waited for the wrong daemon).
    static func flockHolder(device: UInt64, inode: UInt64, path: String) -> pid_t? {
        guard let table = try? String(contentsOfFile: "/proc/locks", encoding: .utf8) else { return nil }
        func hex(_ v: UInt64) -> String {
            let h = String(v, radix: 16)
            return h.count < 2 ? "0" + h : h
        }
        let major = ((device >> 8) & 0xfff) | ((device >> 32) & ~UInt64(0xfff))
        let minor = (device & 0xff) | ((device >> 12) & ~UInt64(0xff))
        let id = "\(hex(major)):\(hex(minor)):\(inode)"
        var sameInode: [pid_t] = []
        for line in table.split(separator: "\n") {
            let f = line.split(separator: " ")
            // Waiting requests read "1: -> FLOCK ...": not holders.
            guard f.count >= 6, f[1] == "FLOCK", let pid = pid_t(f[4]) else { continue }
            if f[5] == id { return pid }
            if f[5].hasSuffix(":\(inode)") { sameInode.append(pid) }
        }
        return sameInode.first { hasOpen(pid: $0, path: path) }
    }

    /// Whether process `pid` has `path` open (its /proc/PID/fd links, which this user or root may read).
    private static func hasOpen(pid: pid_t, path: String) -> Bool {
        let dir = "/proc/\(pid)/fd"
        let want = (path as NSString).standardizingPath
        for fd in (try? FileManager.default.contentsOfDirectory(atPath: dir)) ?? [] {
            if let target = try? FileManager.default.destinationOfSymbolicLink(atPath: dir + "/" + fd), target == want { return true }
        }
        return false
    }
}
