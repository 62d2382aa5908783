import Foundation
import Glibc

/// Small durable-file helpers.
enum FileIO {
    /// Writes `data` to `path` so that a crash leaves either the old or the new file.
    static func writeAtomically(_ data: Data, to path: String, mode: mode_t) throws {
        let tmp = path + ".tmp"
        let fd = Glibc.open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode)
        guard fd >= 0 else { throw ContainerError.io("\(tmp): \(String(cString: strerror(errno)))") }
        // errno is read at the call that failed: a later call (fsync, close) would overwrite it.
        var failure: Int32 = 0
        data.withUnsafeBytes { buf in
            guard let base = buf.baseAddress else { return }
            var off = 0
            while off < buf.count {
                let n = Glibc.write(fd, base + off, buf.count - off)
                if n < 0 {
                    if errno == EINTR { continue }
                    failure = errno
                    return
                }
                off += n
            }
        }
        if failure == 0, fsync(fd) != 0 { failure = errno }
        close(fd)
        guard failure == 0 else {
            unlink(tmp)
            throw ContainerError.io("\(tmp): \(String(cString: strerror(failure)))")
        }
        guard rename(tmp, path) == 0 else {
            let e = errno
            unlink(tmp)
            throw ContainerError.io("\(path): \(String(cString: strerror(e)))")
        }
        fsyncDirectory(of: path)
    }

    static func fsyncDirectory(of path: String) {
        let dir = (path as NSString).deletingLastPathComponent
        let fd = Glibc.open(dir.isEmpty ? "." : dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        if fd >= 0 {
            fsync(fd)
            close(fd)
        }
    }
}
