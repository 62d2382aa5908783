import Glibc
import Logging

/// The kernel's dirty-page limits for this mount's backing device (`/sys/class/bdi/MAJ:MIN`).
///
/// The kernel gives every FUSE mount `strict_limit` and 1 % of the machine's dirty-page budget, so
/// that a stalled daemon cannot pin the machine's dirty memory. With the writeback cache that
/// budget throttles writers long before the daemon is busy: fio 4 KiB random writes measured
/// 12k IOPS with the kernel's limits and 33k without the strict limit (docs/MEASUREMENTS.md).
/// Coffer is not a network filesystem that may hang for minutes, so it lifts the strict limit and
/// lets its device use up to `maxRatio` % of the budget. Only root may write these files; for
/// anyone else the kernel's limits stay (one line at info level says so).
enum WritebackLimits {
    static let maxRatio = 20

    /// Applies the limits to the device that `st_dev` names; returns false if they could not be set.
    @discardableResult
    static func relax(device: dev_t, logger: Logger) -> Bool {
        let dir = "/sys/class/bdi/\(major(device)):\(minor(device))"
        let ok = write("\(maxRatio)", to: dir + "/max_ratio") && write("0", to: dir + "/strict_limit")
        if ok {
            logger.debug("FUSE: writeback limits relaxed", metadata: ["bdi": "\(dir)", "max_ratio": "\(maxRatio)"])
        } else {
            logger.info("FUSE: kernel writeback limits kept (only root may change them)", metadata: ["bdi": "\(dir)"])
        }
        return ok
    }

    /// glibc's `major()`/`minor()` are macros, which Swift does not import.
    static func major(_ dev: dev_t) -> UInt64 { (UInt64(dev) >> 8) & 0xfff | (UInt64(dev) >> 32) & ~0xfff }
    static func minor(_ dev: dev_t) -> UInt64 { UInt64(dev) & 0xff | (UInt64(dev) >> 12) & ~0xff }

    private static func write(_ value: String, to path: String) -> Bool {
        let fd = open(path, O_WRONLY | O_CLOEXEC)
        guard fd >= 0 else { return false }
        defer { close(fd) }
        let bytes = Array(value.utf8)
        return Glibc.write(fd, bytes, bytes.count) == bytes.count
    }
}
