import CofferStore
import Foundation
import Glibc

/// A mounted directory container's store as its daemon wrote it for `coffer copy` (ControlServer):
/// a consistent SQLite file of sealed rows in a private temporary directory, removed by `remove`.
final class DaemonSnapshot {
    let directory: String
    var storePath: String { directory + "/" + SQLiteBackend.fileName }

    private init(directory: String) { self.directory = directory }

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

    /// The snapshot's files and directory go.
    func remove() {
        for f in (try? FileManager.default.contentsOfDirectory(atPath: directory)) ?? [] { unlink(directory + "/" + f) }
        rmdir(directory)
    }

    /// A new directory (0700) in `parent`, given to the daemon's user if that is not this one (root copying
    /// a user's mount): the daemon writes the snapshot there.
    private static func makePrivateDirectory(near parent: String, owner: uid_t) throws -> String {
        var template = Array("\(parent)/.coffer-snapshot-XXXXXX".utf8CString)
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
