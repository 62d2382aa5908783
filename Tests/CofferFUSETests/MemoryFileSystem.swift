import CofferFS
import Glibc
import Synchronization

/// A small in-memory `FileSystemOperations` for exercising the FUSE adapter: files, directories, symlinks,
/// hard links, xattrs, rename. It also records lookup-count mistakes (a forget of more than was looked up) and
/// which operations were called.
final class MemoryFileSystem: FileSystemOperations, Sendable {
    struct Node {
        var attributes: Attributes
        var data: [UInt8] = []
        var children: [[UInt8]: InodeNumber] = [:]
        var parent: InodeNumber = 1
        var target: [UInt8] = []
        var xattrs: [[UInt8]: [UInt8]] = [:]
        var lookups: UInt64 = 0
    }

    struct State {
        var nodes: [InodeNumber: Node] = [:]
        var nextIno: InodeNumber = 2
        var nextHandle: HandleID = 1
        var openHandles: [HandleID: InodeNumber] = [:]
        var lookupViolations: [String] = []
        var calls: [String: Int] = [:]
        var shutdownCount = 0
        var openFlags: [Int32] = []
        var largestWrite = 0
        var statfsInFlight = 0
        var statfsMostAtOnce = 0
    }

    let state = Mutex(State())
    let isReadOnly: Bool
    let opensWithoutHandles: Bool
    let cacheTimeouts: CacheTimeouts
    let statistics = FileSystemStatistics(
        blockSize: 4096, totalBlocks: 123_456, freeBlocks: 100_000,
        availableBlocks: 99_000, totalFiles: 1_000_000, freeFiles: 999_000,
        maxNameLength: 255)

    /// How long each statfs takes (to see how many requests are served at once).
    let statfsPause: UInt32

    init(
        readOnly: Bool = false, timeouts: CacheTimeouts = CacheTimeouts(), opensWithoutHandles: Bool = false,
        statfsPauseMicroseconds: UInt32 = 0
    ) {
        self.statfsPause = statfsPauseMicroseconds
        self.isReadOnly = readOnly
        self.opensWithoutHandles = opensWithoutHandles
        self.cacheTimeouts = timeouts
        let now = Timestamp.now()
        let root = Attributes(
            ino: 1, mode: UInt32(S_IFDIR) | 0o755, nlink: 2, uid: getuid(), gid: getgid(), rdev: 0,
            size: 0, blocks: 0, atime: now, mtime: now, ctime: now)
        state.withLock { $0.nodes[1] = Node(attributes: root) }
    }

    // MARK: - Inspection for tests

    func count(_ op: String) -> Int { state.withLock { $0.calls[op, default: 0] } }
    var violations: [String] { state.withLock { $0.lookupViolations } }
    var shutdownCount: Int { state.withLock { $0.shutdownCount } }
    var openFlagsSeen: [Int32] { state.withLock { $0.openFlags } }
    var largestWrite: Int { state.withLock { $0.largestWrite } }
    /// The most statfs calls that were being served at the same time.
    var statfsMostAtOnce: Int { state.withLock { $0.statfsMostAtOnce } }
    func inode(of path: [String]) -> InodeNumber? {
        state.withLock { s in
            var ino: InodeNumber = 1
            for part in path {
                guard let next = s.nodes[ino]?.children[Array(part.utf8)] else { return nil }
                ino = next
            }
            return ino
        }
    }
    func lookupCount(_ ino: InodeNumber) -> UInt64? { state.withLock { $0.nodes[ino]?.lookups } }
    func contents(of path: [String]) -> [UInt8]? {
        state.withLock { s in
            var ino: InodeNumber = 1
            for part in path {
                guard let next = s.nodes[ino]?.children[Array(part.utf8)] else { return nil }
                ino = next
            }
            return s.nodes[ino]?.data
        }
    }

    // MARK: - Helpers (called with the lock held)

    private static func note(_ s: inout State, _ op: String) { s.calls[op, default: 0] += 1 }

    private static func node(_ s: inout State, _ ino: InodeNumber) throws(FSError) -> Node {
        guard let n = s.nodes[ino] else { throw .notFound }
        return n
    }

    private static func directory(_ s: inout State, _ ino: InodeNumber) throws(FSError) -> Node {
        let n = try node(&s, ino)
        guard n.attributes.mode & UInt32(S_IFMT) == UInt32(S_IFDIR) else { throw .notDirectory }
        return n
    }

    private func checkWritable() throws(FSError) { if isReadOnly { throw .readOnly } }

    private static func validate(_ name: [UInt8]) throws(FSError) {
        if name.isEmpty || name.contains(0x2F) || name.contains(0) { throw .invalid }
        if name.count > 255 { throw .nameTooLong }
    }

    private static func makeNode(_ s: inout State, parent: InodeNumber, name: [UInt8], mode: UInt32, caller: Caller)
        throws(FSError) -> Attributes
    {
        try validate(name)
        var dir = try directory(&s, parent)
        if dir.children[name] != nil { throw .exists }
        let ino = s.nextIno
        s.nextIno += 1
        let now = Timestamp.now()
        let isDir = mode & UInt32(S_IFMT) == UInt32(S_IFDIR)
        var attributes = Attributes(
            ino: ino, mode: mode, nlink: isDir ? 2 : 1, uid: caller.uid, gid: caller.gid,
            rdev: 0, size: 0, blocks: 0, atime: now, mtime: now, ctime: now)
        attributes.mode = (mode & UInt32(S_IFMT)) | (mode & 0o7777 & ~caller.umask)
        var node = Node(attributes: attributes)
        node.parent = parent
        node.lookups = 1
        s.nodes[ino] = node
        dir.children[name] = ino
        if isDir { dir.attributes.nlink += 1 }
        dir.attributes.mtime = now
        dir.attributes.ctime = now
        s.nodes[parent] = dir
        return attributes
    }

    private static func dropLink(_ s: inout State, _ ino: InodeNumber) {
        guard var n = s.nodes[ino] else { return }
        let isDir = n.attributes.mode & UInt32(S_IFMT) == UInt32(S_IFDIR)
        n.attributes.nlink = isDir ? 0 : n.attributes.nlink - 1
        n.attributes.ctime = .now()
        s.nodes[ino] = n
    }

    // MARK: - FileSystemOperations

    func lookup(parent: InodeNumber, name: [UInt8]) throws(FSError) -> Attributes {
        try state.withLock { s throws(FSError) in
            Self.note(&s, "lookup")
            let dir = try Self.directory(&s, parent)
            let ino: InodeNumber
            if name == [0x2E] {
                ino = parent
            } else if name == [0x2E, 0x2E] {
                ino = dir.parent
            } else {
                guard let child = dir.children[name] else { throw .notFound }
                ino = child
            }
            s.nodes[ino]?.lookups += 1
            return try Self.node(&s, ino).attributes
        }
    }

    func forget(_ ino: InodeNumber, lookups: UInt64) {
        state.withLock { s in
            Self.note(&s, "forget")
            guard var n = s.nodes[ino] else {
                s.lookupViolations.append("forget of unknown inode \(ino)")
                return
            }
            if ino == 1 { return }  // the root's count is implicit
            if n.lookups < lookups {
                s.lookupViolations.append("forget \(lookups) of inode \(ino) with \(n.lookups) lookups")
                n.lookups = 0
            } else {
                n.lookups -= lookups
            }
            s.nodes[ino] = n
        }
    }

    func getattr(_ ino: InodeNumber) throws(FSError) -> Attributes {
        try state.withLock { s throws(FSError) in
            Self.note(&s, "getattr")
            return try Self.node(&s, ino).attributes
        }
    }

    func setattr(_ ino: InodeNumber, changes: AttributeChanges, handle: HandleID?, caller: Caller) throws(FSError)
        -> Attributes
    {
        try checkWritable()
        return try state.withLock { s throws(FSError) in
            Self.note(&s, handle == nil ? "setattr" : "setattr-handle")
            var n = try Self.node(&s, ino)
            let now = Timestamp.now()
            if let mode = changes.mode { n.attributes.mode = (n.attributes.mode & UInt32(S_IFMT)) | (mode & 0o7777) }
            if let uid = changes.uid { n.attributes.uid = uid }
            if let gid = changes.gid { n.attributes.gid = gid }
            if let size = changes.size {
                n.data = Array(n.data.prefix(Int(size))) + [UInt8](repeating: 0, count: max(0, Int(size) - n.data.count))
                n.attributes.size = size
                n.attributes.mtime = now
            }
            switch changes.atime {
            case .now?: n.attributes.atime = now
            case .set(let t)?: n.attributes.atime = t
            case nil: break
            }
            switch changes.mtime {
            case .now?: n.attributes.mtime = now
            case .set(let t)?: n.attributes.mtime = t
            case nil: break
            }
            if changes.clearSetID { Self.dropSetID(&n) }
            n.attributes.ctime = changes.ctime ?? now
            s.nodes[ino] = n
            return n.attributes
        }
    }

    func clearSetID(_ ino: InodeNumber) throws(FSError) -> Bool {
        try state.withLock { s throws(FSError) in
            Self.note(&s, "clearSetID")
            var n = try Self.node(&s, ino)
            let before = n.attributes.mode
            Self.dropSetID(&n)
            s.nodes[ino] = n
            return n.attributes.mode != before
        }
    }

    private static func dropSetID(_ n: inout Node) {
        guard n.attributes.mode & UInt32(S_IFMT) == UInt32(S_IFREG) else { return }
        n.attributes.mode &= ~UInt32(S_ISUID)
        if n.attributes.mode & UInt32(S_IXGRP) != 0 { n.attributes.mode &= ~UInt32(S_ISGID) }
    }

    func readlink(_ ino: InodeNumber) throws(FSError) -> [UInt8] {
        try state.withLock { s throws(FSError) in
            Self.note(&s, "readlink")
            let n = try Self.node(&s, ino)
            guard n.attributes.mode & UInt32(S_IFMT) == UInt32(S_IFLNK) else { throw .invalid }
            return n.target
        }
    }

    func mknod(parent: InodeNumber, name: [UInt8], mode: UInt32, rdev: UInt64, caller: Caller) throws(FSError)
        -> Attributes
    {
        try checkWritable()
        guard mode & UInt32(S_IFMT) == UInt32(S_IFREG) || mode & UInt32(S_IFMT) == UInt32(S_IFIFO) else {
            throw .permission
        }
        return try state.withLock { s throws(FSError) in
            Self.note(&s, "mknod")
            return try Self.makeNode(&s, parent: parent, name: name, mode: mode, caller: caller)
        }
    }

    func mkdir(parent: InodeNumber, name: [UInt8], mode: UInt32, caller: Caller) throws(FSError) -> Attributes {
        try checkWritable()
        return try state.withLock { s throws(FSError) in
            Self.note(&s, "mkdir")
            return try Self.makeNode(
                &s, parent: parent, name: name, mode: UInt32(S_IFDIR) | (mode & 0o7777),
                caller: caller)
        }
    }

    func symlink(parent: InodeNumber, name: [UInt8], target: [UInt8], caller: Caller) throws(FSError) -> Attributes {
        try checkWritable()
        return try state.withLock { s throws(FSError) in
            Self.note(&s, "symlink")
            var a = try Self.makeNode(
                &s, parent: parent, name: name, mode: UInt32(S_IFLNK) | 0o777,
                caller: Caller(uid: caller.uid, gid: caller.gid, pid: caller.pid, umask: 0))
            s.nodes[a.ino]?.target = target
            s.nodes[a.ino]?.attributes.size = UInt64(target.count)
            a.size = UInt64(target.count)
            return a
        }
    }

    func link(_ ino: InodeNumber, newParent: InodeNumber, newName: [UInt8]) throws(FSError) -> Attributes {
        try checkWritable()
        return try state.withLock { s throws(FSError) in
            Self.note(&s, "link")
            try Self.validate(newName)
            var n = try Self.node(&s, ino)
            if n.attributes.mode & UInt32(S_IFMT) == UInt32(S_IFDIR) { throw .permission }
            var dir = try Self.directory(&s, newParent)
            if dir.children[newName] != nil { throw .exists }
            dir.children[newName] = ino
            s.nodes[newParent] = dir
            n.attributes.nlink += 1
            n.attributes.ctime = .now()
            n.lookups += 1
            s.nodes[ino] = n
            return n.attributes
        }
    }

    func unlink(parent: InodeNumber, name: [UInt8]) throws(FSError) {
        try checkWritable()
        try state.withLock { s throws(FSError) in
            Self.note(&s, "unlink")
            var dir = try Self.directory(&s, parent)
            guard let ino = dir.children[name] else { throw .notFound }
            if try Self.node(&s, ino).attributes.mode & UInt32(S_IFMT) == UInt32(S_IFDIR) { throw .isDirectory }
            dir.children[name] = nil
            s.nodes[parent] = dir
            Self.dropLink(&s, ino)
        }
    }

    func rmdir(parent: InodeNumber, name: [UInt8]) throws(FSError) {
        try checkWritable()
        try state.withLock { s throws(FSError) in
            Self.note(&s, "rmdir")
            var dir = try Self.directory(&s, parent)
            guard let ino = dir.children[name] else { throw .notFound }
            let child = try Self.directory(&s, ino)
            if !child.children.isEmpty { throw .notEmpty }
            dir.children[name] = nil
            dir.attributes.nlink -= 1
            s.nodes[parent] = dir
            Self.dropLink(&s, ino)
        }
    }

    func rename(parent: InodeNumber, name: [UInt8], newParent: InodeNumber, newName: [UInt8], flags: RenameFlags)
        throws(FSError)
    {
        try checkWritable()
        try state.withLock { s throws(FSError) in
            Self.note(&s, "rename")
            try Self.validate(newName)
            guard let ino = try Self.directory(&s, parent).children[name] else { throw .notFound }
            let existing = try Self.directory(&s, newParent).children[newName]
            if flags.contains(.exchange) {
                guard let other = existing else { throw .notFound }
                s.nodes[parent]?.children[name] = other
                s.nodes[newParent]?.children[newName] = ino
                s.nodes[ino]?.parent = newParent
                s.nodes[other]?.parent = parent
                return
            }
            if let existing {
                if flags.contains(.noReplace) { throw .exists }
                if existing == ino { return }
                if try Self.node(&s, existing).attributes.mode & UInt32(S_IFMT) == UInt32(S_IFDIR) {
                    if !(try Self.node(&s, existing).children.isEmpty) { throw .notEmpty }
                }
                Self.dropLink(&s, existing)
            }
            s.nodes[parent]?.children[name] = nil
            s.nodes[newParent]?.children[newName] = ino
            s.nodes[ino]?.parent = newParent
            s.nodes[ino]?.attributes.ctime = .now()
        }
    }

    func open(_ ino: InodeNumber, flags: Int32, caller: Caller) throws(FSError) -> OpenResult {
        if flags & O_ACCMODE != O_RDONLY || flags & O_TRUNC != 0 { try checkWritable() }
        return try state.withLock { s throws(FSError) in
            Self.note(&s, "open")
            s.openFlags.append(flags)
            var n = try Self.node(&s, ino)
            if n.attributes.mode & UInt32(S_IFMT) == UInt32(S_IFDIR) { throw .isDirectory }
            if flags & O_TRUNC != 0 {
                n.data = []
                n.attributes.size = 0
                n.attributes.mtime = .now()
                s.nodes[ino] = n
            }
            let h = s.nextHandle
            s.nextHandle += 1
            s.openHandles[h] = ino
            return OpenResult(handle: h, keepCache: false)
        }
    }

    func create(parent: InodeNumber, name: [UInt8], mode: UInt32, flags: Int32, caller: Caller) throws(FSError)
        -> (Attributes, OpenResult)
    {
        try checkWritable()
        return try state.withLock { s throws(FSError) in
            Self.note(&s, "create")
            let a = try Self.makeNode(
                &s, parent: parent, name: name, mode: UInt32(S_IFREG) | (mode & 0o7777),
                caller: caller)
            let h = s.nextHandle
            s.nextHandle += 1
            s.openHandles[h] = a.ino
            return (a, OpenResult(handle: h, keepCache: false))
        }
    }

    func read(_ ino: InodeNumber, handle: HandleID, offset: UInt64, size: Int) throws(FSError) -> [UInt8] {
        try state.withLock { s throws(FSError) in
            Self.note(&s, "read")
            guard s.openHandles[handle] == ino || (opensWithoutHandles && handle == .none) else { throw .badHandle }
            let n = try Self.node(&s, ino)
            guard offset < UInt64(n.data.count) else { return [] }
            let start = Int(offset)
            return Array(n.data[start..<min(n.data.count, start + size)])
        }
    }

    func write(_ ino: InodeNumber, handle: HandleID, offset: UInt64, data: UnsafeRawBufferPointer) throws(FSError)
        -> Int
    {
        try checkWritable()
        return try state.withLock { s throws(FSError) in
            Self.note(&s, "write")
            s.largestWrite = max(s.largestWrite, data.count)
            guard s.openHandles[handle] == ino || (opensWithoutHandles && handle == .none) else { throw .badHandle }
            var n = try Self.node(&s, ino)
            let end = Int(offset) + data.count
            if n.data.count < end { n.data += [UInt8](repeating: 0, count: end - n.data.count) }
            n.data.replaceSubrange(Int(offset)..<end, with: data)
            n.attributes.size = UInt64(n.data.count)
            n.attributes.blocks = (UInt64(n.data.count) + 511) / 512
            n.attributes.mtime = .now()
            s.nodes[ino] = n
            return data.count
        }
    }

    func release(_ ino: InodeNumber, handle: HandleID) {
        state.withLock { s in
            Self.note(&s, "release")
            s.openHandles[handle] = nil
        }
    }

    func fsync(_ ino: InodeNumber, handle: HandleID?, dataOnly: Bool) throws(FSError) {
        state.withLock { Self.note(&$0, "fsync") }
    }

    func fallocate(_ ino: InodeNumber, handle: HandleID, mode: Int32, offset: UInt64, length: UInt64) throws(FSError) {
        try checkWritable()
        guard mode == 0 || mode == 1 else { throw .notSupported }
        try state.withLock { s throws(FSError) in
            Self.note(&s, "fallocate")
            var n = try Self.node(&s, ino)
            let end = Int(offset + length)
            if mode == 0 && n.data.count < end {
                n.data += [UInt8](repeating: 0, count: end - n.data.count)
                n.attributes.size = UInt64(end)
            }
            s.nodes[ino] = n
        }
    }

    func opendir(_ ino: InodeNumber, caller: Caller) throws(FSError) -> HandleID {
        try state.withLock { s throws(FSError) in
            Self.note(&s, "opendir")
            _ = try Self.directory(&s, ino)
            let h = s.nextHandle
            s.nextHandle += 1
            s.openHandles[h] = ino
            return h
        }
    }

    /// Cookie i+1 resumes after the i-th entry of [".", "..", children sorted by name].
    func readdir(_ ino: InodeNumber, handle: HandleID, offset: Int64, limit: Int, plus: Bool) throws(FSError)
        -> [DirectoryEntry]
    {
        try state.withLock { s throws(FSError) in
            Self.note(&s, plus ? "readdirplus" : "readdir")
            let dir = try Self.directory(&s, ino)
            var all: [([UInt8], InodeNumber)] = [([0x2E], ino), ([0x2E, 0x2E], dir.parent)]
            all += dir.children.sorted { $0.key.lexicographicallyPrecedes($1.key) }.map { ($0.key, $0.value) }
            guard offset >= 0, offset < Int64(all.count) else { return [] }
            var out: [DirectoryEntry] = []
            for i in Int(offset)..<min(all.count, Int(offset) + limit) {
                let (name, child) = all[i]
                guard let node = s.nodes[child] else { continue }
                var entry = DirectoryEntry(
                    name: name, ino: child, type: node.attributes.mode & UInt32(S_IFMT),
                    offset: Int64(i + 1))
                if plus {
                    entry.attributes = node.attributes
                    s.nodes[child]?.lookups += 1
                }
                out.append(entry)
            }
            return out
        }
    }

    func releasedir(_ ino: InodeNumber, handle: HandleID) {
        state.withLock { s in
            Self.note(&s, "releasedir")
            s.openHandles[handle] = nil
        }
    }

    func fsyncdir(_ ino: InodeNumber, handle: HandleID, dataOnly: Bool) throws(FSError) {
        state.withLock { Self.note(&$0, "fsyncdir") }
    }

    func statfs() throws(FSError) -> FileSystemStatistics {
        state.withLock { s in
            Self.note(&s, "statfs")
            s.statfsInFlight += 1
            s.statfsMostAtOnce = max(s.statfsMostAtOnce, s.statfsInFlight)
        }
        if statfsPause > 0 { usleep(statfsPause) }
        state.withLock { $0.statfsInFlight -= 1 }
        return statistics
    }

    func setxattr(_ ino: InodeNumber, name: [UInt8], value: [UInt8], flags: Int32) throws(FSError) {
        try checkWritable()
        try state.withLock { s throws(FSError) in
            Self.note(&s, "setxattr")
            var n = try Self.node(&s, ino)
            let exists = n.xattrs[name] != nil
            if flags & 1 /* XATTR_CREATE */ != 0 && exists { throw .exists }
            if flags & 2 /* XATTR_REPLACE */ != 0 && !exists { throw .noData }
            n.xattrs[name] = value
            s.nodes[ino] = n
        }
    }

    func getxattr(_ ino: InodeNumber, name: [UInt8]) throws(FSError) -> [UInt8] {
        try state.withLock { s throws(FSError) in
            Self.note(&s, "getxattr")
            guard let v = try Self.node(&s, ino).xattrs[name] else { throw .noData }
            return v
        }
    }

    func listxattr(_ ino: InodeNumber) throws(FSError) -> [[UInt8]] {
        try state.withLock { s throws(FSError) in
            Self.note(&s, "listxattr")
            return try Self.node(&s, ino).xattrs.keys.sorted { $0.lexicographicallyPrecedes($1) }
        }
    }

    func removexattr(_ ino: InodeNumber, name: [UInt8]) throws(FSError) {
        try checkWritable()
        try state.withLock { s throws(FSError) in
            Self.note(&s, "removexattr")
            guard s.nodes[ino]?.xattrs.removeValue(forKey: name) != nil else { throw .noData }
        }
    }

    func shutdown() {
        state.withLock { $0.shutdownCount += 1 }
    }
}
