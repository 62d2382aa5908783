import CofferFS
import Glibc

/// Mount options of one FUSE session. See `FUSEMount`.
public struct FUSEMountOptions: Sendable {
    /// Shows in /proc/mounts as the source (e.g. the container path). Commas and backslashes are escaped for libfuse.
    public var fsName: String
    /// The mount type becomes `fuse.<subtype>`.
    public var subtype: String = "coffer"
    public var allowOther = false
    public var defaultPermissions = false
    public var readOnly = false
    /// libfuse `-d` style debug output on stderr.
    public var debug = false
    public var autoUnmount = false
    public var singleThreaded = false
    /// Most worker threads of the multi-threaded loop (libfuse's `max_threads`). libfuse's default, 10, hands
    /// each request of a serial workload to the thread that waited longest, and with more threads than cores
    /// that costs context switches: `tar -x` ran about 6 % faster with one thread more than cores than with 10
    /// on a 2-core machine (docs/MEASUREMENTS.md). One thread more than cores keeps the cores busy when a
    /// request waits for a lock.
    public var maxThreads: UInt32 = FUSEMountOptions.defaultMaxThreads
    public static let defaultMaxThreads = UInt32(max(1, min(sysconf(Int32(_SC_NPROCESSORS_ONLN)), 255)) + 1)
    /// Requests FUSE_CAP_WRITEBACK_CACHE in init.
    public var writebackCache = false
    /// Negotiates FUSE_HANDLE_KILLPRIV_V2 through a /dev/fuse hook (`KillPrivHook`): the kernel then stops asking
    /// GETXATTR(security.capability) before each write, and the filesystem clears set-id bits when told to.
    public var killPrivV2 = true
    /// Take requests through io_uring when the kernel offers it (FUSERing); false keeps /dev/fuse.
    public var ioUring = true
    /// Unmount once nothing has used the mount for this long, if nothing holds it (`-o idle=`, `FUSEMount+Idle`).
    public var idleUnmount: Duration?
    /// Applied in init (conn->max_write); clamped to 4 KiB ... 1 MiB.
    public var maxWrite: UInt32 = 1 << 20
    /// Further `-o` options, handed to libfuse as they are. Connection options that `fuse_session_new` does not
    /// know (`max_write=`, `max_readahead=`, `writeback_cache`, `async_read`, ...) are parsed with
    /// `fuse_parse_conn_info_opts` and applied in init. "nonempty" only allows a non-empty mountpoint and is not
    /// handed on (libfuse 3 has no such option).
    public var passthrough: [String] = []

    public init(fsName: String) { self.fsName = fsName }
}

/// Why a mount could not be set up or did not end cleanly.
public enum FUSEMountError: Error, CustomStringConvertible, Equatable {
    case fuseDeviceUnavailable(reason: String)
    case mountpointMissing(path: String)
    case mountpointNotDirectory(path: String)
    case mountpointNotEmpty(path: String)
    case mountpointInaccessible(path: String, reason: String)
    case invalidOptions(String)
    case alreadyRunning
    case sessionCreationFailed(options: String)
    case signalHandlersFailed
    case mountFailed(path: String)
    case loopFailed(errno: Int32)

    public var description: String {
        switch self {
        case .fuseDeviceUnavailable(let reason):
            return "FUSE is not available: cannot open /dev/fuse (\(reason))"
        case .mountpointMissing(let path):
            return "mountpoint \(path) does not exist"
        case .mountpointNotDirectory(let path):
            return "mountpoint \(path) is not a directory"
        case .mountpointNotEmpty(let path):
            return "mountpoint \(path) is not empty (use -o nonempty to mount over it anyway)"
        case .mountpointInaccessible(let path, let reason):
            return "mountpoint \(path) cannot be used: \(reason)"
        case .invalidOptions(let options):
            return "invalid FUSE options: \(options)"
        case .alreadyRunning:
            return "this FUSE mount has already been run"
        case .sessionCreationFailed(let options):
            return "could not create the FUSE session (options: \(options))"
        case .signalHandlersFailed:
            return "could not install the FUSE signal handlers"
        case .mountFailed(let path):
            return "could not mount FUSE filesystem at \(path)"
        case .loopFailed(let errno):
            return "FUSE session ended with an error: \(String(cString: strerror(errno)))"
        }
    }
}

extension FUSEMountOptions {
    /// Escapes a value for libfuse's comma-separated option parser.
    static func escapeOptionValue(_ value: String) -> String {
        var out = ""
        for ch in value {
            if ch == "," || ch == "\\" { out.append("\\") }
            out.append(ch)
        }
        return out
    }

    /// True when `passthrough` asks to allow a non-empty mountpoint.
    var allowsNonEmpty: Bool { passthrough.contains { Self.split($0).contains("nonempty") } }

    /// Splits one passthrough entry that may itself hold several comma-separated options (honouring `\,`).
    static func split(_ option: String) -> [String] {
        var parts: [String] = []
        var current = ""
        var escaped = false
        for ch in option {
            if escaped {
                current.append(ch)
                escaped = false
                continue
            }
            if ch == "\\" {
                current.append(ch)
                escaped = true
                continue
            }
            if ch == "," {
                if !current.isEmpty { parts.append(current) }
                current = ""
                continue
            }
            current.append(ch)
        }
        if !current.isEmpty { parts.append(current) }
        return parts
    }

    /// The `-o` option list handed to libfuse, in order.
    func fuseOptionList(filesystemReadOnly: Bool) -> [String] {
        var list = ["fsname=" + Self.escapeOptionValue(fsName), "subtype=" + Self.escapeOptionValue(subtype)]
        if allowOther { list.append("allow_other") }
        if defaultPermissions { list.append("default_permissions") }
        if readOnly || filesystemReadOnly { list.append("ro") }
        if autoUnmount { list.append("auto_unmount") }
        for entry in passthrough {
            for part in Self.split(entry) where part != "nonempty" && !Self.ignoredOptions.contains(part) {
                list.append(part)
            }
        }
        return list
    }

    /// Atime flags that libfuse 3.14's fuse_session_new rejects ("unknown option"). relatime is the kernel's
    /// default for a FUSE mount anyway, and atime on FUSE is the filesystem's business: they are dropped.
    static let ignoredOptions: Set<String> = [
        "relatime", "norelatime", "strictatime", "nostrictatime",
        "nodiratime", "diratime"
    ]

    /// The passthrough options that `fuseOptionList` drops (for a log line).
    var droppedOptions: [String] {
        passthrough.flatMap { Self.split($0) }.filter { Self.ignoredOptions.contains($0) }
    }

    /// argv for fuse_session_new: "coffer", "-o", "a,b,c"[, "-d"].
    func fuseArguments(filesystemReadOnly: Bool) -> [String] {
        var argv = ["coffer"]
        let list = fuseOptionList(filesystemReadOnly: filesystemReadOnly)
        if !list.isEmpty { argv += ["-o", list.joined(separator: ",")] }
        if debug { argv.append("-d") }
        return argv
    }
}
