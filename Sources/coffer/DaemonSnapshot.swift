import CofferStore
import Foundation
import Glibc

/// A mounted directory container's store as its daemon wrote it for `coffer copy` (ControlServer):
/// a consistent SQLite file of sealed rows in a private temporary directory, removed by `remove`.
final class DaemonSnapshot: @unchecked Sendable {
    let directory: String
    var storePath: String { directory + "/" + SQLiteBackend.fileName }
    /// The directory, open and flock'ed while this copy uses it: one nobody holds was left by a copy that
    /// was killed (`removeAbandoned`). Its files are removed through it, never by a path looked up again.
    private let held: Int32
    private let removed = NSLock()
    private var isRemoved = false

    private init(directory: String, held: Int32) {
        self.directory = directory
        self.held = held
    }

    static let prefix = ".coffer-snapshot-"
    /// What a snapshot directory holds: the store file and SQLite's files beside it, nothing else.
    private static func isSnapshotFile(_ name: String) -> Bool { name.hasPrefix(SQLiteBackend.fileName) }

    /// The snapshot this process is taking or reading (one per `coffer copy`), for `removeOnSignal`.
    nonisolated(unsafe) private static var current: DaemonSnapshot?
    private static let currentLock = NSLock()

    /// Ctrl-C, SIGTERM or SIGHUP while a copy takes or reads a snapshot: the snapshot (as large as the
    /// store) goes, then the copy ends as the signal ends it. Installed before the snapshot is asked for.
    static func removeOnSignals() -> [DispatchSourceSignal] {
        [SIGINT, SIGTERM, SIGHUP].map { sig in
            signal(sig, SIG_IGN)
            let source = DispatchSource.makeSignalSource(signal: sig, queue: .global())
            source.setEventHandler {
                currentLock.lock()
                let taken = current
                currentLock.unlock()
                taken?.remove()
                // Dispatch's threads block the signal: unblocked here, so raising it ends the process.
                signal(sig, SIG_DFL)
                var set = sigset_t()
                sigemptyset(&set)
                sigaddset(&set, sig)
                pthread_sigmask(SIG_UNBLOCK, &set, nil)
                raise(sig)
                _exit(128 + sig)
            }
            source.resume()
            return source
        }
    }

    /// Removes the snapshot directories in `parent` that no copy holds: left by a copy that was killed
    /// (each as large as the store). One a daemon may still be writing goes too: its file was for that
    /// copy. Only this user's directories (any, for root), and in each only the snapshot's own files,
    /// unlinked through the directory's descriptor (a name swapped for a symlink meanwhile leads nowhere).
    static func removeAbandoned(in parent: String) {
        let parentFD = open(parent, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard parentFD >= 0 else { return }
        defer { close(parentFD) }
        for name in (try? FileManager.default.contentsOfDirectory(atPath: parent)) ?? [] where name.hasPrefix(prefix) {
            let fd = openat(parentFD, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
            guard fd >= 0 else { continue }
            defer { close(fd) }
            var st = stat()
            guard fstat(fd, &st) == 0, st.st_uid == geteuid() || geteuid() == 0 else { continue }
            guard flock(fd, LOCK_EX | LOCK_NB) == 0 else { continue }  // a copy running now
            removeFiles(in: fd, listing: parent + "/" + name)
            unlinkat(parentFD, name, AT_REMOVEDIR)
        }
    }

    private static func removeFiles(in fd: Int32, listing path: String) {
        for f in (try? FileManager.default.contentsOfDirectory(atPath: path)) ?? [] where isSnapshotFile(f) { unlinkat(fd, f, 0) }
    }

    /// The snapshot's files and directory go (once, whichever of the copy's end or a signal comes first).
    func remove() {
        removed.lock()
        defer { removed.unlock() }
        guard !isRemoved else { return }
        isRemoved = true
        Self.removeFiles(in: held, listing: directory)
        rmdir(directory)  // a symlink put in its place is not a directory: nothing goes
        close(held)
        Self.currentLock.lock()
        if Self.current === self { Self.current = nil }
        Self.currentLock.unlock()
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
        let snapshot = try makePrivateDirectory(near: near, owner: owner)
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

    /// A new directory (0700) in `parent`, given to the daemon's user if that is not this one (root copying
    /// a user's mount): the daemon writes the snapshot there. Made under another name, locked, then renamed
    /// to `prefix…`, so no other copy's `removeAbandoned` ever finds it unlocked. It is `current` from then on.
    private static func makePrivateDirectory(near parent: String, owner: uid_t) throws -> DaemonSnapshot {
        removeAbandoned(in: parent)
        var template = Array("\(parent)/.coffer-making-XXXXXX".utf8CString)
        let made = template.withUnsafeMutableBufferPointer { b in b.baseAddress.flatMap { mkdtemp($0) }.map { String(cString: $0) } }
        guard let temporary = made else {
            if errno == ENOSPC || errno == EDQUOT { throw NoRoom() }
            throw failure("cannot create a temporary directory in \(parent): \(String(cString: strerror(errno)))")
        }
        let dir = parent + "/" + prefix + String(temporary.suffix(6))
        let fd = open(temporary, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
        guard fd >= 0, flock(fd, LOCK_EX) == 0, rename(temporary, dir) == 0 else {
            let e = errno
            if fd >= 0 { close(fd) }
            rmdir(temporary)
            throw failure("cannot make the snapshot directory in \(parent): \(String(cString: strerror(e)))")
        }
        let snapshot = DaemonSnapshot(directory: dir, held: fd)
        currentLock.lock()
        current = snapshot
        currentLock.unlock()
        if owner != geteuid(), fchown(fd, owner, gid_t.max) != 0 {
            let e = errno
            snapshot.remove()
            throw failure("cannot give \(dir) to the daemon's user: \(String(cString: strerror(e)))")
        }
        return snapshot
    }

    private static func failure(_ message: String) -> CLIFailure { CLIFailure(message: "SRC: \(message)", code: ExitStatus.failure) }
}
