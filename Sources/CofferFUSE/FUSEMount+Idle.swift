import Foundation
import Glibc

/// `-o idle=`: a mount that nothing has used for a while unmounts by itself (as gocryptfs's -idle and CryFS's
/// --unmount-idle), by a normal unmount only, which the kernel refuses while the mount is in use (an open file,
/// a working directory inside); it then stays, and is tried again at each look while still idle.
extension FUSEMount {
    /// Watches `context.activity` (requests that are use: `LowLevelOps.serve`) and unmounts once it has not moved
    /// for `idle`. Looks every tenth of `idle` (between 1 s and 1 min), and ends with the session or once the
    /// path no longer leads to this mount (unmounted lazily by someone else: another filesystem may be mounted
    /// there by now, and must not be unmounted).
    func startIdleWatcher(_ idle: Duration, context: FUSEContext) {
        let look = min(max(idle / 10, .seconds(1)), .seconds(60))
        let seconds = Double(idle.components.seconds) + Double(idle.components.attoseconds) / 1e18
        let shown = seconds == seconds.rounded() ? "\(Int(seconds))" : "\(seconds)"
        Thread.detachNewThread { [self] in
            var seen = context.activity.load(ordering: .relaxed)
            var since = ContinuousClock.now
            var toldInUse = false
            while sleepWhileRunning(look) {
                let now = context.activity.load(ordering: .relaxed)
                if now != seen {
                    (seen, since, toldInUse) = (now, .now, false)
                    continue
                }
                guard ContinuousClock.now - since >= idle else { continue }
                guard let device = state.withLock({ $0.device }), MountInfo.device(at: mountpoint) == device else {
                    logger.info("\(mountpoint) no longer leads to this mount: idle= stops watching")
                    return
                }
                let claimed = state.withLock { s -> Bool in
                    guard s.phase == .running, !s.exitRequested, s.stop == .none else { return false }
                    s.idleProbe = true
                    return true
                }
                guard claimed else { return }
                let result = Self.unmount(mountpoint, lazy: false)
                state.withLock { s in
                    s.idleProbe = false
                    if result == .done { s.idleUnmounted = true }
                }
                switch result {
                case .done:
                    logger.notice("no use for \(shown) s (idle=): unmounting \(mountpoint)")
                    return
                case .busy:
                    if !toldInUse { logger.info("idle for \(shown) s, but \(mountpoint) is in use: it stays mounted") }
                    toldInUse = true
                case .failed(let why):
                    logger.warning("idle for \(shown) s, but \(mountpoint) could not be unmounted: \(why)")
                    since = .now
                }
            }
        }
    }

    /// Sleeps `duration` in steps of at most a second; false as soon as the session is no longer running.
    private func sleepWhileRunning(_ duration: Duration) -> Bool {
        var left = duration
        while left > .zero {
            guard isRunning else { return false }
            let step = min(left, .seconds(1))
            Thread.sleep(forTimeInterval: Double(step.components.seconds) + Double(step.components.attoseconds) / 1e18)
            left -= step
        }
        return isRunning
    }
}

/// The kernel's mount table of this process (/proc/self/mountinfo): which device a path is mounted from. Reading
/// it sends no request to any FUSE mount.
public enum MountInfo {
    /// The device (as `stat`'s st_dev) of the topmost mount at `path`, nil when nothing is mounted there.
    static func device(at path: String) -> UInt? {
        guard let text = try? String(contentsOfFile: "/proc/self/mountinfo", encoding: .utf8) else { return nil }
        var found: UInt?
        for line in text.split(separator: "\n") {
            // ID PARENT MAJOR:MINOR ROOT MOUNTPOINT ...
            let f = line.split(separator: " ", maxSplits: 5)
            guard f.count >= 5, unescape(String(f[4])) == path else { continue }
            let mm = f[2].split(separator: ":")
            guard mm.count == 2, let major = UInt(mm[0]), let minor = UInt(mm[1]) else { continue }
            found = makedev(major, minor)
        }
        return found
    }

    /// glibc's makedev: the st_dev of a major and minor number.
    static func makedev(_ major: UInt, _ minor: UInt) -> UInt {
        ((major & 0xfff) << 8) | ((major & ~0xfff) << 32) | (minor & 0xff) | ((minor & ~0xff) << 12)
    }

    /// The kernel's mount tables escape space, tab, newline and backslash as octal (`\040`).
    public static func unescape(_ s: String) -> String {
        var out = [UInt8](), bytes = Array(s.utf8), i = 0
        while i < bytes.count {
            if bytes[i] == UInt8(ascii: "\\"), i + 3 < bytes.count,
                let v = UInt8(String(decoding: bytes[i + 1...i + 3], as: UTF8.self), radix: 8)
            {
                out.append(v)
                i += 4
            } else {
                out.append(bytes[i])
                i += 1
            }
        }
        return String(decoding: out, as: UTF8.self)
    }
}
