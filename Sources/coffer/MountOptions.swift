import CofferFUSE

/// The `-o` options of `coffer mount` and of `mount -t fuse.coffer` / fstab lines.
struct MountOptionSet {
    var passfile: String?
    var extpass: String?
    var keyfile: String?
    var readOnly = false
    var allowOther = false
    var debug = false
    var autoUnmount = false
    var nonempty = false
    var plainSymlinks = false
    /// The kernel's writeback cache: writes land in the page cache and reach the daemon in large
    /// batches (docs/MEASUREMENTS.md); a write error shows at fsync or close. On by default;
    /// `no_writeback_cache` turns it off.
    var writebackCache = true
    var singleThreaded = false
    var maxThreads: UInt32?
    var allowRollback = false
    var passthrough: [String] = []

    /// Kernel mount flags and FUSE options handed on as they are.
    static let passthroughFlags: Set<String> = ["noatime", "atime", "relatime", "strictatime", "nodiratime", "nodev", "dev", "nosuid", "suid", "noexec", "exec", "sync", "async", "dirsync"]
    /// Options that mount(8) and fstab use and that concern no one after mount.fuse3.
    static let ignored: Set<String> = ["rw", "defaults", "auto", "noauto", "user", "nouser", "users", "owner", "nofail", "_netdev", "default_permissions"]
    static let passthroughValued: Set<String> = ["max_read", "fsname", "subtype"]

    /// Parses comma-separated options; an unknown one is an error that names it.
    mutating func parse(_ text: String) throws {
        for raw in splitEscaped(text) where !raw.isEmpty {
            let parts = raw.split(separator: "=", maxSplits: 1).map(String.init)
            let key = parts[0], value = parts.count > 1 ? parts[1] : nil
            switch (key, value) {
            case ("passfile", let v?): passfile = v
            case ("extpass", let v?): extpass = v
            case ("keyfile", let v?): keyfile = v
            case ("ro", nil): readOnly = true
            case ("allow_other", nil): allowOther = true
            case ("debug", nil): debug = true
            case ("auto_unmount", nil): autoUnmount = true
            case ("nonempty", nil): nonempty = true
            case ("plain_symlinks", nil): plainSymlinks = true
            case ("writeback_cache", nil): writebackCache = true
            case ("no_writeback_cache", nil): writebackCache = false
            case ("single_thread", nil): singleThreaded = true
            case ("max_threads", let v?):
                guard let n = UInt32(v), (1 ... 256).contains(n) else {
                    throw CLIFailure(message: "mount option max_threads=\(v): expected a number of threads from 1 to 256", code: 64)
                }
                maxThreads = n
            case ("allow_rollback", nil): allowRollback = true
            case (let k, nil) where Self.passthroughFlags.contains(k): passthrough.append(k)
            case (let k, _) where Self.ignored.contains(k) || k.hasPrefix("x-") || k.hasPrefix("comment="): continue
            case (let k, _?) where Self.passthroughValued.contains(k): passthrough.append(raw)
            default:
                throw CLIFailure(message: "unknown mount option \"\(raw)\" (known: passfile=, extpass=, keyfile=, ro, allow_other, default_permissions, debug, auto_unmount, nonempty, plain_symlinks, writeback_cache, no_writeback_cache, allow_rollback, max_threads=, noatime, nodev, nosuid, noexec, ...)", code: 64)
            }
        }
    }

    /// Splits on commas not escaped by a backslash.
    private func splitEscaped(_ s: String) -> [String] {
        var parts: [String] = [], current = "", escaped = false
        for ch in s {
            if escaped { current.append(ch); escaped = false }
            else if ch == "\\" { escaped = true }
            else if ch == "," { parts.append(current); current = "" }
            else { current.append(ch) }
        }
        parts.append(current)
        return parts
    }

    func fuseOptions(fsName: String) -> FUSEMountOptions {
        var o = FUSEMountOptions(fsName: fsName)
        o.allowOther = allowOther
        // Permission checks are the kernel's, for every caller, from the attributes we return.
        o.defaultPermissions = true
        o.readOnly = readOnly
        o.debug = debug
        o.autoUnmount = autoUnmount
        o.singleThreaded = singleThreaded
        if let maxThreads { o.maxThreads = maxThreads }
        o.writebackCache = writebackCache
        o.passthrough = passthrough + (nonempty ? ["nonempty"] : [])
        return o
    }
}
