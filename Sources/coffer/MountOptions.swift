import CofferFUSE
import Foundation

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
    /// Requests through io_uring when the kernel offers it (its fuse module's `enable_uring`); `no_uring` keeps /dev/fuse.
    var ioUring = true
    var maxThreads: UInt32?
    var allowRollback = false
    /// PostgreSQL containers: how long an operation waits for a lost server before it fails (EIO).
    var reconnectWait: Double = 30
    /// How long changes may wait in memory before a group commit (ext4's `commit=`); fsync and unmount commit at once.
    var commitInterval: Double = 1
    /// Unmount after this many seconds without use (`idle=`); nil or 0: never.
    var idleSeconds: Double?
    /// Set-user-ID programs and device files are not honoured in the mount unless asked (`suid`, `dev`),
    /// in every form: libfuse defaults to nosuid,nodev, but mount.fuse3 asks for suid,dev (see `fromMountHelper`).
    var nosuid = true
    var nodev = true
    var passthrough: [String] = []

    /// Kernel mount flags and FUSE options handed on as they are.
    static let passthroughFlags: Set<String> = [
        "noatime", "atime", "relatime", "strictatime", "nodiratime", "noexec", "exec", "sync", "async", "dirsync"
    ]
    /// Options that mount(8) and fstab use and that concern no one after mount.fuse3.
    static let ignored: Set<String> = [
        "rw", "defaults", "auto", "noauto", "user", "nouser", "users", "owner", "nofail", "_netdev", "default_permissions"
    ]
    static let passthroughValued: Set<String> = ["max_read", "fsname", "subtype"]

    /// The options users write, with what each does: the one list behind `coffer help mount`, the
    /// unknown-option error and the man page.
    static let documented: [(names: [String], help: String)] = [
        (["passfile=FILE"], "read the password from the first line of FILE"),
        (["extpass=CMD"], "run CMD with /bin/sh -c and use the first line it prints as the password"),
        (["keyfile=FILE"], "open with a key file slot (the whole content of FILE)"),
        (["ro"], "mount read-only"),
        (["allow_other"], "let other users in (the kernel still checks permissions)"),
        (["default_permissions"], "always on: the kernel checks permissions for every caller"),
        (["debug"], "log at level debug"),
        (["auto_unmount"], "unmount when the daemon ends"),
        (["nonempty"], "mount over a non-empty directory or over an existing mount"),
        (["plain_symlinks"], "store absolute symlink targets inside the mount as given"),
        (
            ["no_writeback_cache"],
            "turn off the kernel's writeback cache (on by default: writes reach the daemon in batches, errors show at fsync or close; writeback_cache is accepted)"
        ),
        (["writeback_cache"], "the default"),
        (
            ["no_uring"],
            "take requests through /dev/fuse even when the kernel offers FUSE over io_uring (used by default when the fuse module's enable_uring is on; auto_unmount implies no_uring)"
        ),
        (["allow_rollback"], "mount a store older than the newest this machine has seen (as --allow-rollback)"),
        (
            ["reconnect_wait=SECONDS"],
            "PostgreSQL containers: how long an operation waits for a lost server to come back before it fails with EIO (default 30, 0 to 3600)"
        ),
        (["max_threads=N"], "worker threads, 1 to 256 (default: one more than cores)"),
        (
            ["idle=TIME"],
            "unmount by itself once nothing has used the mount for TIME (seconds, or with s, m, h: idle=10m; 1 s to 7 days; 0: never); df and a stat of the mountpoint are not use; a mount in use (an open file, a working directory inside) stays"
        ),
        (
            ["commit=SECONDS"],
            "how long changes may wait in memory before they are committed together (default 1, 0.05 to 600; fsync and unmount commit at once, a group of several MiB sooner, and a PostgreSQL container with other mounts within 50 ms)"
        ),
        (
            ["suid", "dev"],
            "honour set-user-ID programs and device files (nosuid,nodev is the default in every form; through mount(8) and fstab write allow_suid, allow_dev: mount.fuse3 asks for suid,dev whatever was written)"
        ),
        (["noatime", "noexec", "sync", "dirsync"], "mount flags, and their opposites (atime, exec, async)")
    ]

    /// The option names alone, for the unknown-option error.
    static var documentedNames: String {
        documented.flatMap(\.names).joined(separator: ", ")
    }

    /// One option a line, for help texts (argument-parser wraps each line).
    static var helpText: String {
        documented.map { "  \($0.names.joined(separator: ", ")): \($0.help)" }.joined(separator: "\n")
    }

    /// mount.fuse3 adds `dev,suid` to every option list unless nodev/nosuid was written (and drops a
    /// written `suid` or `dev` in favour of its own), so in the argv form they say nothing: dropped
    /// there before parsing; `allow_suid`, `allow_dev` opt out instead.
    static func fromMountHelper(_ option: String) -> String {
        splitEscaped(option).filter { $0 != "suid" && $0 != "dev" }.map(escape).joined(separator: ",")
    }

    /// Parses comma-separated options; an unknown one is an error that names it.
    mutating func parse(_ text: String) throws {
        for raw in Self.splitEscaped(text) where !raw.isEmpty {
            // Empty parts are kept: "=" alone is an unknown (empty) option, not a crash.
            let parts = raw.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false).map(String.init)
            let key = parts.first ?? "", value = parts.count > 1 && !parts[1].isEmpty ? parts[1] : nil
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
            case ("no_uring", nil): ioUring = false
            case ("max_threads", let v?):
                guard let n = UInt32(v), (1...256).contains(n) else {
                    throw CLIFailure(message: "mount option max_threads=\(v): expected a number of threads from 1 to 256", code: ExitStatus.usage)
                }
                maxThreads = n
            case ("allow_rollback", nil): allowRollback = true
            case ("reconnect_wait", let v?):
                guard let n = Double(v), n.isFinite, (0...3600).contains(n) else {
                    throw CLIFailure(message: "mount option reconnect_wait=\(v): expected a number of seconds from 0 to 3600", code: ExitStatus.usage)
                }
                reconnectWait = n
            case ("commit", let v?):
                guard let n = Double(v), n.isFinite, (0.05...600).contains(n) else {
                    throw CLIFailure(message: "mount option commit=\(v): expected a number of seconds from 0.05 to 600", code: ExitStatus.usage)
                }
                commitInterval = n
            case ("idle", let v?):
                guard let n = Self.seconds(v), n == 0 || (1...604_800).contains(n) else {
                    throw CLIFailure(
                        message: "mount option idle=\(v): expected a time from 1 s to 7 days (seconds, or with s, m, h: 90, 90s, 10m, 1h), or 0",
                        code: ExitStatus.usage)
                }
                idleSeconds = n == 0 ? nil : n
            case ("suid", nil), ("allow_suid", nil): nosuid = false
            case ("nosuid", nil): nosuid = true
            case ("dev", nil), ("allow_dev", nil): nodev = false
            case ("nodev", nil): nodev = true
            case (let k, nil) where Self.passthroughFlags.contains(k): passthrough.append(k)
            case (let k, _) where Self.ignored.contains(k) || k.hasPrefix("x-") || k.hasPrefix("comment="): continue
            case (let k, _?) where Self.passthroughValued.contains(k): passthrough.append(raw)
            default:
                throw CLIFailure(message: "unknown mount option \"\(raw)\" (known: \(Self.documentedNames))", code: ExitStatus.usage)
            }
        }
    }

    /// A time written as seconds or with a unit (s, m, h): "90", "1.5h"; nil when it is not one.
    static func seconds(_ text: String) -> Double? {
        let units: [Character: Double] = ["s": 1, "m": 60, "h": 3600]
        let (number, scale) = text.last.flatMap { units[$0] }.map { (text.dropLast(), $0) } ?? (Substring(text), 1)
        guard let n = Double(number), n.isFinite, n >= 0 else { return nil }
        return n * scale
    }

    private static func escape(_ option: String) -> String {
        option.replacingOccurrences(of: "\\", with: "\\\\").replacingOccurrences(of: ",", with: "\\,")
    }

    /// Splits on commas not escaped by a backslash.
    static func splitEscaped(_ s: String) -> [String] {
        var parts: [String] = [], current = "", escaped = false
        for ch in s {
            if escaped {
                current.append(ch)
                escaped = false
            } else if ch == "\\" {
                escaped = true
            } else if ch == "," {
                parts.append(current)
                current = ""
            } else {
                current.append(ch)
            }
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
        // auto_unmount's fusermount3 looks once, as the daemon dies, whether the mount answers ENOTCONN; with rings the
        // kernel ends the connection only when io_uring has torn them down, a moment later, and the dead mount stayed.
        o.ioUring = ioUring && !singleThreaded && !autoUnmount
        if let maxThreads { o.maxThreads = maxThreads }
        if let idleSeconds { o.idleUnmount = .milliseconds(Int64(idleSeconds * 1000)) }
        o.writebackCache = writebackCache
        // noatime says what a FUSE mount of Coffer does (the kernel never moves a FUSE file's atime, and
        // Coffer does not on reads): the mount showed relatime, and tools trusted atime (a tester found it).
        o.passthrough = ["noatime"] + passthrough + [nosuid ? "nosuid" : "suid", nodev ? "nodev" : "dev"] + (nonempty ? ["nonempty"] : [])
        return o
    }
}
