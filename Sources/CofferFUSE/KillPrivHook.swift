import CFuse3
import Foundation
import Glibc
import Synchronization

/// Negotiates FUSE_HANDLE_KILLPRIV_V2, which libfuse 3.14 does not know, by watching the /dev/fuse traffic.
///
/// Without it the kernel keeps SB_NOSEC off a FUSE mount, so every write(2) runs file_remove_privs, which asks
/// GETXATTR("security.capability") — a round trip per write. With it the kernel sets SB_NOSEC (an inode then asks
/// once, until its attributes are refreshed) and leaves clearing set-user-ID/set-group-ID to the filesystem. It
/// marks the requests that must clear them: WRITE (`write_flags` FUSE_WRITE_KILL_SUIDGID, caller without
/// CAP_FSETID), SETATTR (`valid` FATTR_KILL_SUIDGID: truncate without CAP_FSETID, any chown of a non-directory),
/// OPEN/CREATE with O_TRUNC (`open_flags` FUSE_OPEN_KILL_SUIDGID, without CAP_FSETID).
///
/// libfuse 3.14 passes none of these marks to the ops, so the hook, installed with `fuse_session_custom_io`:
/// - `read` takes requests through the context's `RequestReader`, remembers the unique id of an INIT whose flags
///   offer KILLPRIV_V2, and notes a request's kill mark for the thread that read it (libfuse processes a request
///   on the thread that read it, in both loops and with clone_fd); the ops ask `requested(for:)`;
/// - `writev` passes replies through, ORing KILLPRIV_V2 into the reply to that INIT — unless libfuse enabled
///   splice reads, which bypass `read` (Coffer never does), so the marks could not be seen.
///
/// Being the one place that sees INIT and every reply, it also asks for FUSE over io_uring in that INIT reply
/// when the kernel offers it (flags2, which libfuse 3.14 does not know either) and sends each reply to a request
/// a ring entry holds back through that entry (`FUSERing`); ring requests are noted here the same way (`noted`).
final class KillPrivHook: Sendable {
    /// fuse_init_in/out.flags bit (protocol 7.33).
    static let handleKillPrivV2: UInt32 = 1 << 28
    /// fuse_init_in/out.flags bit: flags2 is meaningful (protocol 7.36).
    private static let initExt: UInt32 = 1 << 30
    /// flags2 bit (FUSE_OVER_IO_URING, 1 << 41 of the 64-bit flags; protocol 7.42).
    private static let overIOUring: UInt32 = 1 << 9
    private static let spliceRead: UInt32 = 1 << 9

    /// Unique id of the INIT request that offered the flag; 0 once answered (or never offered).
    private let pendingInit = Atomic<UInt64>(0)
    /// True once the INIT reply carrying the flag was written.
    let negotiated = Atomic<Bool>(false)
    /// Which of the two the kernel offered in INIT (and this mount wants): 1 KILLPRIV_V2, 2 io_uring.
    private let offered = Atomic<Int>(0)
    /// When false, requests and replies pass through untouched (the flag is never asked for).
    let enabled: Bool
    /// When false, io_uring is never asked for.
    let ringEnabled: Bool

    init(enabled: Bool, ringEnabled: Bool) {
        self.enabled = enabled
        self.ringEnabled = ringEnabled
    }

    /// The io callbacks; `userdata` is the session's userdata, a `FUSEContext`.
    static let customIO: fuse_custom_io = {
        var io = fuse_custom_io()
        io.read = { fd, buf, len, userdata in KillPrivHook.read(fd, buf, len, userdata) }
        io.writev = { fd, iov, count, userdata in KillPrivHook.writev(fd, iov, count, userdata) }
        return io
    }()

    /// True when the request this thread is processing asked to clear set-id bits of `ino`.
    static func requested(for ino: fuse_ino_t) -> Bool {
        ino != 0 && UInt(bitPattern: pthread_getspecific(threadKey)) == UInt(truncatingIfNeeded: ino)
    }

    // MARK: - Wire layout (include/uapi/linux/fuse.h)

    private enum Opcode: UInt32 {
        case setattr = 4
        case open = 14
        case write = 16
        case `init` = 26
        case create = 35
    }
    /// sizeof(struct fuse_in_header): len, opcode, unique, nodeid, uid, gid, pid, total_extlen, padding.
    private static let inHeaderSize = 40
    /// sizeof(struct fuse_out_header): len, error, unique.
    private static let outHeaderSize = 16

    /// The thread's current kill mark: the nodeid of the request it read, or nil.
    private static let threadKey: pthread_key_t = {
        var key = pthread_key_t()
        precondition(pthread_key_create(&key, nil) == 0, "pthread_key_create")
        return key
    }()

    private static func context(_ userdata: UnsafeMutableRawPointer?) -> FUSEContext? {
        guard let userdata else { return nil }
        return Unmanaged<FUSEContext>.fromOpaque(userdata).takeUnretainedValue()
    }

    private static func hook(_ userdata: UnsafeMutableRawPointer?) -> KillPrivHook? { context(userdata)?.killPriv }

    // MARK: - Callbacks

    private static func read(
        _ fd: Int32, _ buf: UnsafeMutableRawPointer?, _ len: Int,
        _ userdata: UnsafeMutableRawPointer?
    ) -> Int {
        ReplyCheck.finishPrevious(fd, logger: context(userdata)?.logger, ring: nil)
        let n = context(userdata)?.reader.read(fd, buf, len) ?? Glibc.read(fd, buf, len)
        guard n >= inHeaderSize, let buf else {
            let saved = errno  // libfuse reads errno after a failed read
            pthread_setspecific(threadKey, nil)
            errno = saved
            return n
        }
        noted(buf, n, userdata)
        return n
    }

    /// Notes a request the calling thread is about to process (read from /dev/fuse or taken from a ring
    /// entry): its kill mark, `ReplyCheck`, and an INIT whose reply is to be edited.
    static func noted(_ buf: UnsafeMutableRawPointer, _ n: Int, _ userdata: UnsafeMutableRawPointer?) {
        guard n >= inHeaderSize else { return }
        func u32(_ at: Int) -> UInt32? { at + 4 <= n ? buf.loadUnaligned(fromByteOffset: at, as: UInt32.self) : nil }
        let opcode = buf.loadUnaligned(fromByteOffset: 4, as: UInt32.self)
        let nodeid = buf.loadUnaligned(fromByteOffset: 16, as: UInt64.self)
        ReplyCheck.began(unique: buf.loadUnaligned(fromByteOffset: 8, as: UInt64.self), opcode: opcode)
        let body = inHeaderSize
        var kill = false
        switch Opcode(rawValue: opcode) {
        case .write?: kill = (u32(body + 20) ?? 0) & 1 << 2 != 0  // fuse_write_in.write_flags
        case .setattr?: kill = (u32(body) ?? 0) & 1 << 11 != 0  // fuse_setattr_in.valid
        case .open?: kill = (u32(body + 4) ?? 0) & 1 << 0 != 0  // fuse_open_in.open_flags
        case .create?: kill = (u32(body + 12) ?? 0) & 1 << 0 != 0  // fuse_create_in.open_flags
        case .`init`?:
            // fuse_init_in: major, minor, max_readahead, flags, flags2 (meaningful with FUSE_INIT_EXT)
            guard let flags = u32(body + 12), let hook = hook(userdata) else { break }
            let flags2 = flags & initExt != 0 ? u32(body + 16) ?? 0 : 0
            let killPriv = hook.enabled && flags & handleKillPrivV2 != 0
            let ring = hook.ringEnabled && flags2 & overIOUring != 0
            hook.offered.store((killPriv ? 1 : 0) | (ring ? 2 : 0), ordering: .releasing)
            if killPriv || ring {
                hook.pendingInit.store(buf.loadUnaligned(fromByteOffset: 8, as: UInt64.self), ordering: .releasing)
            }
        case nil: break
        }
        pthread_setspecific(threadKey, kill ? UnsafeRawPointer(bitPattern: UInt(truncatingIfNeeded: nodeid)) : nil)
    }

    private static func writev(
        _ fd: Int32, _ iov: UnsafeMutablePointer<iovec>?, _ count: Int32,
        _ userdata: UnsafeMutableRawPointer?
    ) -> Int {
        if let iov, count > 0, iov[0].iov_len >= outHeaderSize, let base = iov[0].iov_base {
            ReplyCheck.answered(unique: base.loadUnaligned(fromByteOffset: 8, as: UInt64.self))
            if let ring = context(userdata)?.ring, let n = ring.reply(iov, count) { return n }
        }
        if let iov, count > 0, iov[0].iov_len >= outHeaderSize, let base = iov[0].iov_base, let hook = hook(userdata) {
            let pending = hook.pendingInit.load(ordering: .acquiring)
            if pending != 0 && base.loadUnaligned(fromByteOffset: 8, as: UInt64.self) == pending {
                return hook.writeInitReply(fd, iov, Int(count), context: context(userdata))
            }
        }
        return Glibc.writev(fd, iov, count)
    }

    /// Writes the INIT reply with KILLPRIV_V2 added to fuse_init_out.flags, and FUSE_OVER_IO_URING to flags2,
    /// as offered (fuse_init_out: major, minor, max_readahead, flags, max_background, congestion_threshold,
    /// max_write, time_gran, max_pages, map_alignment, flags2).
    /// The ring entries are made before the reply asks for them (`FUSEContext.makeRing`) and started after it.
    private func writeInitReply(_ fd: Int32, _ iov: UnsafeMutablePointer<iovec>, _ count: Int, context: FUSEContext?) -> Int {
        pendingInit.store(0, ordering: .releasing)
        var message = [UInt8]()
        for i in 0..<count where iov[i].iov_len > 0 {
            message.append(contentsOf: UnsafeRawBufferPointer(start: iov[i].iov_base, count: iov[i].iov_len))
        }
        let flagsAt = Self.outHeaderSize + 12, flags2At = Self.outHeaderSize + 32
        let offered = offered.load(ordering: .acquiring)
        let error = message.withUnsafeBytes { $0.loadUnaligned(fromByteOffset: 4, as: Int32.self) }
        guard error == 0 && message.count >= flagsAt + 4 else { return Glibc.writev(fd, iov, Int32(count)) }
        var flags = message.withUnsafeBytes { $0.loadUnaligned(fromByteOffset: flagsAt, as: UInt32.self) }
        let killPriv = offered & 1 != 0 && flags & Self.spliceRead == 0
        var ring = offered & 2 != 0 && message.count >= flags2At + 4
        if ring, let context {
            // The connection's payload limit, for the entries' buffers: max_write, and max_pages in pages.
            let maxWrite = message.withUnsafeBytes { $0.loadUnaligned(fromByteOffset: Self.outHeaderSize + 20, as: UInt32.self) }
            let maxPages = message.withUnsafeBytes { $0.loadUnaligned(fromByteOffset: Self.outHeaderSize + 28, as: UInt16.self) }
            let page = max(4096, sysconf(Int32(_SC_PAGESIZE)))
            var payload = max(8192, Int(maxWrite), Int(maxPages) * page)
            // Tests: buffers smaller than the connection's limit, which the kernel refuses at registration.
            if let small = ProcessInfo.processInfo.environment["COFFER_TEST_RING_PAYLOAD"].flatMap(Int.init) { payload = small }
            ring = context.makeRing(fd: fd, payloadSize: payload)
        } else {
            ring = false
        }
        guard killPriv || ring else { return Glibc.writev(fd, iov, Int32(count)) }
        if killPriv { flags |= Self.handleKillPrivV2 }
        if ring {
            flags |= Self.initExt
            var flags2 = message.withUnsafeBytes { $0.loadUnaligned(fromByteOffset: flags2At, as: UInt32.self) }
            flags2 |= Self.overIOUring
            message.withUnsafeMutableBytes { $0.storeBytes(of: flags2, toByteOffset: flags2At, as: UInt32.self) }
        }
        message.withUnsafeMutableBytes { $0.storeBytes(of: flags, toByteOffset: flagsAt, as: UInt32.self) }
        let n = message.withUnsafeBytes { Glibc.write(fd, $0.baseAddress, $0.count) }
        if n == message.count && killPriv { negotiated.store(true, ordering: .releasing) }
        if ring { context?.startRing(replyWritten: n == message.count) }
        return n
    }
}
