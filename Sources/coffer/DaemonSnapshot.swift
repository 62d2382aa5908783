import CofferStore
import Foundation
import Glibc

/// A mounted directory container's store as its daemon wrote it for `coffer copy` (ControlServer):
/// a consistent SQLite file of sealed rows in a private temporary directory, removed by `remove`.
final class DaemonSnapshot: @unchecked Sendable {
    let directory: String
    var storePath: String { directory + "/" + SQLiteBackend.fileName }
    /// The directory, open and flock'ed while this copy uses it: one nobody holds was left by a copy that
    /// was killed (`removeAbandoned`).
    private let held: Int32
    private let removed = NSLock()
    private var isRemoved = false

    private init(directory: String) {
        self.directory = directory
        held = open(directory, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
        if held >= 0 { _ = flock(held, LOCK_EX) }
    }

    static let prefix = ".coffer-snapshot-"

    /// Removes the snapshot directories in `parent` that no copy holds: left by a copy that was killed
    /// (each as large as the store). One a daemon may still be writing goes too: its file was for that copy.
    static func removeAbandoned(in parent: String) {
        for name in (try? FileManager.default.contentsOfDirectory(atPath: parent)) ?? [] where name.hasPrefix(prefix) {
            let dir = parent + "/" + name
            let fd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
            guard fd >= 0 else { continue }
            defer { close(fd) }
            guard flock(fd, LOCK_EX | LOCK_NB) == 0 else { continue }  // a copy running now
            removeContents(of: dir)
        }
    }

    private static func removeContents(of dir: String) {
        for f in (try? FileManager.default.contentsOfDirectory(atPath: dir)) ?? [] { unlink(dir + "/" + f) }
        rmdir(dir)
    }

    /// The disk of `near` has no room for the snapshot: the copy's side (DEST's, or $TMPDIR's), not SRC's.
    struct NoRoom: Error {}

    /// Asks daemon `pid` of the container `containerId` for a snapshot in a new private directory in
    /// `near`. nil when that daemon has no control socket (an older version).
    static func take(containerId: String, daemon pid: pid_t, near: String) throws -> DaemonSnapshot? {
        let connection: (fd: Int32, owner: uid_t)?
        do { connection = try ControlSocket.connect(containerId: containerId, daemon: pid) } catch let f as CLIFailure { throw failure(f.message) }
        guard let (fd, owner) = connection else { return nil }
        defer { close(fd) }
        let snapshot = try DaemonSnapshot(directory: makePrivateDirectory(near: near, owner: owner))
        ControlSocket.writeLine(fd, "snapshot " + snapshot.storePath)
        let answer = ControlSocket.readLine(fd)
        guard answer == "OK" else {
            snapshot.remove()
            let why = answer.map { $0.hasPrefix("ERR ") ? String($0.dropFirst(4)) : $0 } ?? "no answer"
            if why == ControlSocket.noRoomForSnapshot { throw NoRoom() }
            throw failure("the mount daemon (pid \(pid)) could not take a snapshot: \(why)")
        }
        return snapshot
    }

    /// The snapshot's files and directory go (once, whichever of the copy's end or a signal comes first).
    func remove() {
        removed.lock()
        defer { removed.unlock() }
        guard !isRemoved else { return }
        isRemoved = true
        Self.removeContents(of: directory)
        if held >= 0 { close(held) }
    }

    /// A new directory (0700) in `parent`, given to the daemon's user if that is not this one (root copying
    /// a user's mount): the daemon writes the snapshot there.
    private static func makePrivateDirectory(near parent: String, owner: uid_t) throws -> String {
        removeAbandoned(in: parent)
        var template = Array("\(parent)/\(prefix)XXXXXX".utf8CString)
        let made = template.withUnsafeMutableBufferPointer { b in b.baseAddress.flatMap { mkdtemp($0) }.map { String(cString: $0) } }
        guard let dir = made else {
            if errno == ENOSPC || errno == EDQUOT { throw NoRoom() }
            throw failure("cannot create a temporary directory in \(parent): \(String(cString: strerror(errno)))")
        }
        if owner != geteuid(), chown(dir, owner, gid_t.max) != 0 {
            let e = errno
            rmdir(dir)
            throw failure("cannot give \(dir) to the daemon's user: \(String(cString: strerror(e)))")
        }
        return dir
    }

    private static func failure(_ message: String) -> CLIFailure { CLIFailure(message: "SRC: \(message)", code: ExitStatus.failure) }
}
