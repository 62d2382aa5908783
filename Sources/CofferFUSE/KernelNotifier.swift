import CFuse3
import CofferFS
import Foundation
import Synchronization

/// Tells the kernel what another mount changed (a container mounted on several machines): each inode
/// another mount's commit wrote loses its cached attributes, and the name the kernel last found it by
/// expires, so `stat`, `ls -l` and lookups here show the change within a commit and its announcement
/// rather than after the kernel's 1 s timeouts (which stay: they bound what is missed when an announcement
/// is, or names no inodes). Expires, not drops (FUSE_EXPIRE_ONLY): the next walk through the name asks
/// again and keeps it when it still holds; a dropped name left a process whose working directory another
/// machine had merely written into with a "deleted" one (getcwd ENOENT, and git refused to run).
///
/// On a queue of its own: dropping an entry takes the directory's lock in the kernel, which a request in
/// that directory holds until a worker answers it; the listener that hears the commits, and the workers,
/// must never wait for that.
final class KernelNotifier: Sendable {
    private struct Session: @unchecked Sendable { let pointer: OpaquePointer }
    private let queue = DispatchQueue(label: "coffer-kernel-notify")
    private let running = DispatchGroup()
    private let session = Mutex<Session?>(nil)

    /// Starts telling the kernel of `se` what `fs` reports changed elsewhere.
    func start(session se: OpaquePointer, fs: any FileSystemOperations) {
        session.withLock { $0 = Session(pointer: se) }
        fs.onChangedElsewhere { [self] inodes in
            running.enter()
            queue.async { [self] in
                defer { running.leave() }
                tell(inodes, fs: fs)
            }
        }
    }

    private func tell(_ inodes: [InodeNumber], fs: any FileSystemOperations) {
        // The pointer is used outside the lock (a call may wait in the kernel); `stop` waits for it.
        guard let se = session.withLock({ $0?.pointer }) else { return }
        for ino in inodes { _ = fuse_lowlevel_notify_inval_inode(se, ino, -1, 0) }
        for (parent, name) in fs.kernelNames(inodes) {
            _ = name.withUnsafeBufferPointer { n in
                n.withMemoryRebound(to: CChar.self) { coffer_expire_entry(se, parent, $0.baseAddress, n.count) }
            }
        }
    }

    /// Stops: nothing more is told, and a call in progress is waited for at most `timeout` seconds (one
    /// waiting for a directory whose request no worker answers any more). False if it did not end: the
    /// session must then stay.
    func stop(timeout: Double = 2) -> Bool {
        session.withLock { $0 = nil }
        return running.wait(timeout: .now() + timeout) == .success
    }
}
