import CofferCrypto
import CofferStore
import Foundation
import Glibc
import Logging
import Synchronization

/// POSIX filesystem semantics over the sealed entity store.
///
/// Locking: `meta` guards the inode table and every multi-step store change,
/// so a group commit (also taken under `meta`) never splits an operation. Content reads and
/// writes hold the inode's content lock and take `meta` only briefly; sealing and opening chunks
/// happen outside `meta`, so several files encrypt in parallel. Order: content lock, then `meta`.
public final class CofferFileSystem: FileSystemOperations, @unchecked Sendable {
    public struct Options: Sendable {
        /// Absolute mountpoint: stored relative symlink targets resolve against it, and (unless
        /// `plainSymlinks`) absolute targets inside it are stored relative to it.
        public var symlinkRoot: String?
        /// Store every new symlink target exactly as given (`-o plain_symlinks`).
        public var plainSymlinks = false
        public var readOnly = false
        public var cacheTimeouts = CacheTimeouts(entry: 5, attributes: 5, negativeEntry: 1)
        /// A group commit happens at the latest this long after the first uncommitted change.
        public var commitInterval: Duration = .seconds(1)
        /// ... or once this many bytes are waiting (embedded stores: a little less than the SQLite writer's
        /// page cache, SQLiteBackend.writerCacheKiB; PostgreSQL mounts take 16 MiB).
        public var commitVolume = 8 << 20
        /// Small files' last chunks wait in memory (`TailChunk`) for at most this many bytes written into
        /// them; past it they are stored before the commit (`storeHeldTails`).
        public var heldTailVolume = 4 << 20
        /// A coherent mount beside others commits its open group this soon (other mounts' listings
        /// show its changes once committed).
        public var sharedCommitInterval: Duration = .milliseconds(50)
        /// ... and once another mount asks for the writer lock, as soon as the group is this old and this
        /// mount has paused between changes for `writerPause`, or the asker waits to open or look up a
        /// name: an open elsewhere after a close here waits about this long. A mount busy with changes
        /// keeps its group from other writers for `sharedCommitInterval`: every turn of the lock costs
        /// both mounts a few milliseconds of nobody working (bench/multi.sh: two untars at once took
        /// 1.39x the time of one after the other with 10 ms turns, 1.19x with 50 ms).
        public var writerSlice: Duration = .milliseconds(10)
        /// How long without a change counts as a pause (the committer looks every 2 ms meanwhile).
        public var writerPause: Duration = .milliseconds(2)
        /// One of several mounts of a shared container (PostgreSQL): records are read again once the
        /// store changed under this mount (`storeEpoch`), and `SharedMount` runs each change inside
        /// a group transaction that holds what it decides on (its inode, or the container). Set with
        /// `store.shareWithOtherMounts` done before.
        public var coherent = false
        /// Remove what a crashed session left unlinked but open (false while other mounts may hold such files).
        public var removesOrphans = true
        public init() {}
    }

    let store: EntityStore
    let chunkSize: Int
    let options: Options
    let logger: Logger
    let statfsPath: String?

    let meta = Lock()
    var inodes: [InodeNumber: InodeState] = [:]
    /// Coherent mounts: names read from the store, for LOOKUPs (EntryCache.swift). Under meta.
    var entryCache = EntryCache()
    /// Coherent mounts (a server's store): chunks fetched ahead of a reader going through a file in order.
    let readAhead: ReadAhead?
    /// Unlinked inodes the kernel is done with, whose rows are still in the store
    /// (Reaping.swift). Under meta.
    var dying: [InodeNumber: InodeState] = [:]
    /// Forgets received so far: the reaper waits until they stop coming.
    let forgetsSeen = Atomic<UInt64>(0)
    /// The kernel keeps regular files' mtime and ctime (writeback cache; `writebackCacheGranted`).
    let kernelKeepsFileTimes = Atomic<Bool>(false)
    /// Set by `startCommitter`: forgets leave the deletes to the committer thread's quiet moments.
    var reapsWhenQuiet = false
    /// The committer thread's last look at `forgetsSeen`.
    var quietMark: UInt64 = 0
    /// Counts the store's changes by other mounts (`EntityStore.onForeignChange`): a record read
    /// before the last one is read again before use (`state`). Only coherent mounts count.
    let storeEpoch = Atomic<UInt64>(0)
    /// When the last change of a coherent mount ended (`SharedMount.change`): a group whose mount has
    /// paused since `writerPause` yields to a waiting mount after its slice.
    let lastChangeEnded = Mutex<ContinuousClock.Instant>(.now)
    /// Files whose last chunk waits in memory, and the bytes written into such chunks since they were
    /// last stored (TailChunk.swift). Under meta.
    var heldTails: [InodeState] = []
    var heldTailBytes = 0
    /// `heldTailBytes` in 256 KiB steps when the disk was last looked at for them.
    var heldTailsProbed = 0
    /// When writes last looked at the disk's room (RoomCheck.swift).
    let roomCheck = Mutex(RoomCheck())
    /// Coherent mounts: inodes written since the last durable commit (a server crash may take them).
    /// Under meta.
    var writtenSinceDurable = Set<InodeNumber>()
    /// The store heard that the server lost commits (`lostCommits`); applied under meta.
    let pendingLostCommits = Atomic<Bool>(false)
    /// Set by the store's `onRollback` (on whatever thread hit it): the errno the lost changes report.
    private let rolledBack = Mutex<FSError?>(nil)
    private var stopped = false
    /// Files and directories whose changes a dropped group took, until an fsync reports it or they are removed.
    /// Under meta.
    var unheardLosses = Set<InodeNumber>()
    /// Inodes (files, directories, symlinks) written into the open group as the kernel forgot them (`release`): a drop loses
    /// their changes, and memory no longer holds them to carry the error to an fsync or fsyncdir. Under meta.
    var forgottenInGroup = Set<InodeNumber>()
    /// Set by the store's `onRollback`: the open group was dropped (not only earlier commits lost).
    let groupDropped = Atomic<Bool>(false)
    /// Under meta: `finalCommitFailure` and `unmountWarning`, sentences for the user.
    private var finalFailure: String?
    private var lossWarning: String?
    private var committer: Thread?
    /// Wakes the committer before its pause ends (another mount asks for the writer lock).
    private let wakeCommitter = DispatchSemaphore(value: 0)
    /// Coherent mounts: held for a whole change (`SharedMount.change`) and by the committer's commits,
    /// so a group never ends between a change's decisions and its writes.
    let groupGate = Lock()

    public var cacheTimeouts: CacheTimeouts { options.cacheTimeouts }
    public var isReadOnly: Bool { options.readOnly }
    /// Existing files are read and written by inode alone: an open costs the kernel no round trip.
    /// What an open would have guarded is covered otherwise: the kernel holds a lookup on every
    /// open file, so an unlinked file stays (as an orphan) until its forget. There is no handle
    /// table: `open` and `create` hand out `HandleID.none`, and nothing but `.none` is accepted.
    public var opensWithoutHandles: Bool { true }

    /// Opens the filesystem over an open store. Orphans left by a crash are removed first.
    public init(store: EntityStore, chunkSize: Int, options: Options, statfsPath: String?, logger: Logger) throws(FSError) {
        self.store = store
        self.chunkSize = chunkSize
        self.options = options
        self.logger = logger
        self.statfsPath = statfsPath
        readAhead =
            options.coherent
            ? ReadAhead { [store] content, first, last in (try? store.committedChunks(file: content, first: first, last: last)) ?? nil } : nil
        guard (try? store.inode(EntityStore.rootInode)) != nil else {
            logger.error("the root directory is missing or damaged")
            throw .io
        }
        store.onRollback = { [weak self] error in
            // A full disk is ENOSPC; a lost server or anything else is EIO.
            self?.groupDropped.store(true, ordering: .releasing)
            self?.rolledBack.withLock { $0 = error == .diskFull ? .noSpace : .io }
        }
        if options.coherent {
            store.onForeignChange = { [weak self] in self?.storeEpoch.add(1, ordering: .acquiringAndReleasing) }
            store.onLostCommits = { [weak self] in self?.lostCommits() }
            store.onOthersWaiting = { [weak self] in self?.wakeCommitter.signal() }
        }
        if !options.readOnly && options.removesOrphans { removeOrphans() }
    }

    public func onChangedElsewhere(_ handler: @escaping @Sendable ([InodeNumber]) -> Void) {
        guard options.coherent else { return }
        store.onForeignInodes = handler
    }

    public func kernelNames(_ inodes: [InodeNumber]) -> [(parent: InodeNumber, name: [UInt8])] {
        meta.withLock { inodes.compactMap { self.inodes[$0]?.location } }
    }

    /// Starts the background group committer (the mount does; unit tests may commit by hand).
    /// It also deletes the rows of removed files once the filesystem is quiet (`reapIfQuiet`), and
    /// then gives their pages back to the disk (`shrinkIfQuiet`).
    public func startCommitter() {
        meta.withLock { reapsWhenQuiet = true }
        let thread = Thread { [weak self] in
            while let fs = self, !fs.meta.withLock({ fs.stopped }) {
                if fs.wakeCommitter.wait(timeout: .now() + fs.committerPause()) == .success {
                    while fs.wakeCommitter.wait(timeout: .now()) == .success {}  // a burst of requests wakes it once
                }
                fs.reapIfQuiet()
                do { try fs.commitIfDueOutsideChanges() } catch { fs.logger.error("group commit failed: \(error)") }
                fs.shrinkIfQuiet()
            }
        }
        thread.name = "coffer-commit"
        committer = thread
        thread.start()
    }

    /// Why the last commit, at unmount, failed (what was written since the commit before is lost), as a
    /// sentence for the user; nil when it did not.
    public var finalCommitFailure: String? { meta.withLock { finalFailure } }
    /// What the unmount may have lost unheard (files whose changes a dropped group took, no fsync reporting
    /// it); nil when nothing.
    public var unmountWarning: String? { meta.withLock { lossWarning } }

    public func shutdown() {
        meta.withLock { stopped = true }
        // The reaper deletes in a group of the container's; an open group of inodes goes first.
        if store.holdsInodeGroup { try? commitGroup(durable: false) }
        reapAll()
        do { try commit() } catch {
            logger.error("final commit failed: \(error)")
            meta.withLock { finalFailure = "the last commit failed (\(error)): what was written since the commit before it is lost" }
        }
        // Files whose changes a dropped group took and no fsync reported (the unmount raced a group
        // commit that failed, say, and then had nothing left to commit): the unmount is the last
        // chance to tell. A warning, not a failure: a write, close or create may have told their
        // programs already, which is not tracked.
        meta.withLock {
            guard finalFailure == nil, !unheardLosses.isEmpty else { return }
            let why =
                "changes to \(unheardLosses.count) file(s) or directories were lost while mounted (the store dropped a group they were in) and no fsync reported it"
            logger.warning("\(why)")
            lossWarning = why
        }
        store.close()
        meta.withLock { for s in inodes.values { s.wipeCipher() } }
    }

    // MARK: Errors

    /// Maps store failures to errno, logging what a user needs to hear once.
    func fsError(_ error: any Error, _ context: @autoclosure () -> String = "") -> FSError {
        if let e = error as? FSError { return e }
        guard let error = error as? StoreError else {
            logger.error("unexpected error: \(error)")
            return .io
        }
        switch error {
        case .diskFull: return .noSpace
        case .readOnly: return .readOnly
        case .authenticationFailed, .malformed:
            // A read that will be tried again (another mount changed the file under it) is not damage yet.
            let line: Logger.Message = "damaged entity: \(error)\(context().isEmpty ? "" : " (\(context()))")"
            if SharedMount.rereadPending { logger.debug("\(line) (read again: another mount may have changed it)") } else { logger.error(line) }
            return .io
        default:
            logger.error("store error: \(error)")
            return .io
        }
    }

    /// The path of an inode the kernel knows, from the names it was found under (the kernel holds
    /// every ancestor of a known inode, so the chain reaches the root). Call under `meta`.
    func knownPath(_ ino: InodeNumber) -> String? {
        var parts: [[UInt8]] = []
        var current = ino
        while current != EntityStore.rootInode {
            guard parts.count < 4096, let s = inodes[current], let (parent, name) = s.location else { return nil }
            parts.append(name)
            current = parent
        }
        return "/" + parts.reversed().map { String(decoding: $0, as: UTF8.self) }.joined(separator: "/")
    }

    /// Names a damaged file or entry by its path, at debug level only (file names stay out of
    /// logs above debug). Call under `meta`.
    func logDamagedPath(_ ino: InodeNumber) {
        guard logger.logLevel <= .debug, let path = knownPath(ino) else { return }
        logger.debug("the damaged file (inode \(ino)) is \(path) in the mount")
    }

    func logDamagedPath(parent: InodeNumber, name: [UInt8]) {
        guard logger.logLevel <= .debug, let dir = knownPath(parent) else { return }
        logger.debug("the damaged entry is \(dir == "/" ? "" : dir)/\(String(decoding: name, as: UTF8.self)) in the mount")
    }

    func checkWritable() throws(FSError) { if options.readOnly { throw .readOnly } }

    /// Runs a namespace operation under `meta`, with all its store calls in one visit to the
    /// writer connection (a queue hop per operation instead of one per store call).
    func locked<T>(_ body: () throws(FSError) -> T) throws(FSError) -> T {
        try meta.withLock { () throws(FSError) -> T in
            do { return try store.batch { () throws(FSError) -> T in try body() } } catch { throw fsError(error) }
        }
    }

    // MARK: Inode table (call under meta)

    /// Takes in a group the store dropped since the last look: what memory holds, the dying files
    /// included, is then what the store holds. Call under meta, before acting on that memory.
    func takeDroppedGroup() {
        if let e = rolledBack.withLock({ $0 }) { reloadAfterRollback(e) }
    }

    func state(_ ino: InodeNumber) throws(FSError) -> InodeState {
        takeDroppedGroup()
        let epoch = storeEpoch.load(ordering: .acquiring)
        if let s = inodes[ino] {
            if s.goneElsewhere { throw FSError(ESTALE) }
            if s.epoch != epoch && options.coherent { try refresh(s, epoch: epoch) }
            return s
        }
        let record: InodeRecord?
        do { record = try store.inode(ino) } catch { throw fsError(error, "inode \(ino)") }
        guard let record else { throw .notFound }
        let s = InodeState(ino: ino, record: record)
        s.epoch = epoch
        inodes[ino] = s
        return s
    }

    /// Another mount changed the store since this record was read: read it again (`epoch`: the count
    /// taken before the read). A record changed here and not yet written is this mount's to write (a
    /// group of this mount is open, so nobody else committed since). A file removed elsewhere is
    /// ESTALE from then on, as on NFS.
    private func refresh(_ s: InodeState, epoch: UInt64) throws(FSError) {
        guard Self.isRefreshable(s) else { return }
        if s.goneElsewhere { throw FSError(ESTALE) }
        let record: InodeRecord?
        do { record = try store.inode(s.ino) } catch { throw fsError(error, "inode \(s.ino)") }
        try adopt(record, into: s, epoch: epoch)
    }

    /// A cached record that is not this mount's to write (see `refresh`).
    private static func isRefreshable(_ s: InodeState) -> Bool { !s.dirty && s.tail == nil && !s.deleted }

    /// The store's record for `s` as read at `epoch` (nil: gone) replaces the cached one.
    private func adopt(_ record: InodeRecord?, into s: InodeState, epoch: UInt64) throws(FSError) {
        s.epoch = epoch
        guard let record else {
            s.goneElsewhere = true
            throw FSError(ESTALE)
        }
        guard record != s.record else { return }
        if record.nlink == 0 && s.record.nlink > 0 { s.unlinkedElsewhere = true }
        if record.contentId != s.record.contentId { s.wipeCipher() }
        s.record = record
        s.dropChunkMap()
        s.changedElsewhere = true
    }

    /// Reads the records of `inos` that are not cached, or are stale on a coherent mount, in one store
    /// call: a listing with attributes then costs one round trip per page instead of one per entry on
    /// a remote engine. Best effort: what it leaves out, `state` reads (and reports) one by one.
    func prefetch(_ inos: [InodeNumber]) {
        let epoch = storeEpoch.load(ordering: .acquiring)
        let wanted = inos.filter { ino in
            guard let s = inodes[ino] else { return true }
            return options.coherent && s.epoch != epoch && Self.isRefreshable(s) && !s.goneElsewhere
        }
        guard wanted.count > 1, let records = try? store.inodes(wanted) else { return }
        for ino in wanted {  // what was asked for only: a server's extra rows must not touch other states
            guard let record = records[ino] else { continue }
            if let s = inodes[ino] {
                try? adopt(record, into: s, epoch: epoch)
            } else {
                let s = InodeState(ino: ino, record: record)
                s.epoch = epoch
                inodes[ino] = s
            }
        }
    }

    func directory(_ ino: InodeNumber) throws(FSError) -> InodeState {
        let s = try state(ino)
        guard s.isDirectory else { throw .notDirectory }
        return s
    }

    /// The store dropped the open group transaction (a full disk, a lost database server): everything
    /// since the last commit is gone. Reread the cached records, and remember the error for every file that was
    /// changed, so its next fsync reports it (as a kernel filesystem reports failed
    /// write-back). What was committed before is untouched.
    private func reloadAfterRollback(_ error: FSError) {
        rolledBack.withLock { $0 = nil }
        // Names read before (even a listing still running) may be the dropped group's: a new epoch ends
        // every mark taken before it.
        entryCache.clear()
        forgetHeldTails()  // dropped with the chunk maps below
        if options.coherent { forgetCachedRecords() }
        logger.error("the store dropped uncommitted changes (\(error)); writes since the last commit are lost and fsync reports it")
        // A server that cannot be reached is not asked again for every cached inode: each read would wait
        // the whole reconnect bound, with `meta` held (an unmount waited that long per inode).
        var unreachable = false
        for (ino, s) in inodes {
            if s.dirty {
                s.writeError = error
                unheardLosses.insert(ino)
            }
            s.dropChunkMap()
            let stored: InodeRecord?
            var unread = false
            do throws(StoreError) {
                if unreachable { throw .unavailable("not asked again") }
                stored = try store.inode(ino)
            } catch {
                if case .unavailable = error { unreachable = true }
                // The store cannot be read now (a lost server): nothing is known to be gone. A coherent
                // mount rereads the record at its next use; this one is not to be written.
                if options.coherent {
                    s.dirty = false
                    s.epoch = .max
                    continue
                }
                stored = nil
                unread = true
            }
            if let r = stored {
                // A stored record without links was written with its orphan row (`persist`).
                s.record = r
                s.dirty = false
                s.deleted = false
                s.orphaned = r.nlink == 0
            } else if s.lookups == 0 {
                inodes[ino] = nil
            } else {
                // Created inside the lost transaction: it no longer exists, and its content went with it
                // (its record still says how long it was: read, it gave zeros). ESTALE from now on, as on NFS.
                s.deleted = true
                s.dirty = false
                s.record.nlink = 0
                s.goneElsewhere = !unread  // known gone; a record that could not be read may still be there
            }
        }
        // A dying inode whose unlink was lost is a file again (its entry is back: the kernel finds it
        // anew); one the store holds without links (an orphan) stays dying; one created in the lost
        // transaction is gone.
        for (ino, s) in dying {
            if !unreachable, let r = try? store.inode(ino), r.nlink == 0 {
                s.record = r
                s.dirty = false
                s.deleted = false
                s.orphaned = true
            } else {
                dying[ino] = nil
            }
        }
        // Files written into the group and then forgotten by the kernel are not in memory any more.
        // Only for a group really dropped: after lost commits (`lostCommits`) the open group goes on.
        if groupDropped.exchange(false, ordering: .acquiringAndReleasing) { unheardLosses.formUnion(forgottenInGroup) }
        forgottenInGroup.removeAll()
    }

    /// Writes a changed record now (inside the open group transaction). A record without links
    /// (unlinked, still held) is written with its orphan row, so a crash before its removal
    /// leaves nothing behind after the next mount.
    func persist(_ s: InodeState) throws(FSError) {
        guard !s.deleted else { return }
        try flushTail(s)
        do {
            try s.flushChunkMap(store)
            try store.putInode(s.ino, s.record)
            if options.coherent { writtenSinceDurable.insert(s.ino) }
            if s.record.nlink == 0 && !s.orphaned {
                try store.addOrphan(s.ino)
                s.orphaned = true
            }
        } catch { throw fsError(error) }
        s.dirty = false
    }

    /// Drops an inode from memory once the kernel is done with it (its last forget); deletes its
    /// content when it has no name left.
    func release(ifUnused s: InodeState) {
        guard s.lookups == 0 else { return }
        // Unlinked by another mount, which may hold it open: its rows are that mount's to remove (at its
        // forget, or as its orphan after a crash). Here it only leaves memory.
        if s.unlinkedElsewhere {
            inodes[s.ino] = nil
            return
        }
        if s.record.nlink == 0 && !s.deleted {
            try? destroy(s)
        } else if s.dirty {
            try? persist(s)
            forgottenInGroup.insert(s.ino)
        }
        if s.ino != EntityStore.rootInode { inodes[s.ino] = nil }
    }

    /// Removes an inode and everything it owns from the store. The reaper calls it without `meta`
    /// (`holdingMeta` false), having forgotten the file's losses under it.
    func destroy(_ s: InodeState, holdingMeta: Bool = true) throws(FSError) {
        do {
            if s.record.contentId != 0 && s.isRegular {
                try store.deleteChunks(file: s.record.contentId)
                // Map pages exist only once a paged root was written.
                if case .paged = s.record.chunkMap { try store.deleteChunkMapPages(file: s.record.contentId) }
            }
            try store.deleteXattrs(s.ino)
            try store.deleteInode(s.ino)
            if s.orphaned {
                try store.removeOrphan(s.ino)
                s.orphaned = false
            }
        } catch { throw fsError(error) }
        if holdingMeta { forgetLosses(s.ino) }
        s.tail = nil
        s.deleted = true
        s.dirty = false
    }

    /// A file removed: whatever a dropped group took of it no longer matters. Call under meta.
    func forgetLosses(_ ino: InodeNumber) {
        unheardLosses.remove(ino)
        forgottenInGroup.remove(ino)
    }

    /// Deletes the files an earlier session left unlinked but open (a crash, or a reap that failed).
    /// A failure here refuses nothing: what was not deleted stays with its orphan row (an inode row
    /// goes only after its chunks, deletes repeat harmlessly), and a later mount tries again. A full
    /// disk must still mount, so the user can free space; a damaged row is for `coffer fsck`, not a
    /// reason to hide every other file.
    private func removeOrphans() {
        do {
            let ids = try store.orphans()
            for id in ids {
                if let r = try? store.inode(id), r.nlink == 0 {
                    let s = InodeState(ino: id, record: r)
                    try destroy(s)
                }
                try store.removeOrphan(id)
            }
            if !ids.isEmpty {
                try store.commit()
                logger.info("removed \(ids.count) file(s) left unlinked but open by an earlier session")
            }
        } catch {
            // Nothing of the user's was in the group, and nothing is cached yet: a dropped group needs
            // no reload (and no "writes since the last commit are lost" in the log).
            rolledBack.withLock { $0 = nil }
            logger.warning(
                "removing the file(s) an earlier session left unlinked but open failed (\(error)); what was not removed stays until a later mount removes it"
            )
        }
    }

    // MARK: Group commit

    /// Writes every changed record and makes it durable in one commit (fsync, fsyncdir, unmount).
    public func commit() throws(FSError) {
        awaitForgetsOnAFullDisk()
        try meta.withLock { () throws(FSError) in try commitLocked(durable: true) }
    }

    /// Commits, then counts the store's rows before anything else can commit (the meta lock held): the
    /// counts are those of the generation returned (`coffer info` of a mounted container).
    public func committedCounts() throws(FSError) -> (generation: UInt64, counts: StoreCounts) {
        awaitForgetsOnAFullDisk()
        return try meta.withLock { () throws(FSError) in
            if !options.readOnly { try commitLocked(durable: true) }
            do { return (store.generation, try store.committedCounts()) } catch { throw .io }
        }
    }

    /// Commits (changed records first) once the open transaction is old or large enough, or, on a
    /// coherent mount, once another mount waits for the writer lock, the group had its slice, and the
    /// waiter reads or this mount paused between changes (`betweenChanges`: the committer's look, not
    /// one at a change's end; `yieldsToOthers`).
    /// Atomic, not synced: durability is what fsync asks for, and it syncs every commit before it.
    func commitIfDue(betweenChanges: Bool = false) throws(FSError) {
        guard !options.readOnly else { return }
        // Beside others a group is committed soon, so that their listings show its changes; a group begun
        // alone too, once another mount waits for it (one that just mounted, an fsck).
        let beside = options.coherent && (!store.isAlone || store.othersWaiting)
        let interval = beside ? options.sharedCommitInterval : options.commitInterval
        guard yieldsToOthers(betweenChanges) || store.isCommitDue(age: interval, volume: options.commitVolume) else { return }
        awaitForgetsOnAFullDisk()
        try meta.withLock { () throws(FSError) in try commitLocked(durable: false) }
    }

    /// Another mount waits for the writer lock, this group had its slice, and either that mount waits to
    /// read (an open or lookup: close-to-open stays within a slice) or this mount is not busy: no change
    /// for `writerPause`. A busy one keeps the lock from other writers for its commit interval.
    private func yieldsToOthers(_ betweenChanges: Bool) -> Bool {
        guard options.coherent, store.othersWaiting, store.isCommitDue(age: options.writerSlice, volume: .max) else { return false }
        if store.readersWaiting { return true }
        return betweenChanges && ContinuousClock.now - lastChangeEnded.withLock({ $0 }) >= options.writerPause
    }

    /// Called by `SharedMount.change` as a change ends (under `groupGate`).
    func changeEnded() { lastChangeEnded.withLock { $0 = .now } }

    /// `commitIfDue` for callers outside a change (the committer, a forget): on a coherent mount it
    /// waits for the change under way, if any (`groupGate`).
    func commitIfDueOutsideChanges() throws(FSError) {
        try outsideChanges { () throws(FSError) in try commitIfDue(betweenChanges: true) }
    }

    /// `body` between changes on a coherent mount (`groupGate`); at once on others.
    private func outsideChanges(_ body: () throws(FSError) -> Void) throws(FSError) {
        guard options.coherent else { return try body() }
        try groupGate.withLock { () throws(FSError) in try body() }
    }

    /// How long the committer sleeps: a group open on a coherent mount beside others is looked at
    /// often (its interval is short, and a waiting mount's slice shorter; a request wakes it at
    /// once), reaping goes on in small steps.
    private func committerPause() -> Double {
        if options.coherent && store.othersWaiting { return 0.002 }  // only while a group is open
        if options.coherent && !store.isAlone && store.hasPendingChanges { return 0.01 }
        return meta.withLock({ dying.isEmpty }) ? 0.2 : 0.02
    }

    /// While nothing is written and no removed file waits for its rows to go, gives free pages back
    /// to the disk a piece at a time (FreePages.swift), each piece in a commit of its own: a request
    /// that comes meanwhile waits for one piece at most, and the next piece waits for it to commit.
    func shrinkIfQuiet() {
        while !options.readOnly, meta.withLock({ !stopped && dying.isEmpty }), !store.hasPendingChanges {
            do {
                guard try store.giveBackFreePages() > 0 else { return }
                try outsideChanges { () throws(FSError) in try meta.withLock { () throws(FSError) in try commitLocked(durable: false) } }
            } catch {
                logger.error("giving free space back to the disk failed: \(error)")
                return
            }
        }
    }

    /// A deleted file's space comes free at the kernel's forget, which follows `rm` at once but is
    /// handled on another thread and may lag behind the next writes under load. On a full disk a
    /// commit that runs first finds no room, and its group, the new writes included, is lost. So
    /// when space is short, wait a little (at most 0.5 s) for the forgets of unlinked files; a file
    /// really held open (the kernel keeps its lookup) only costs that wait.
    private func awaitForgetsOnAFullDisk() {
        guard !options.readOnly, store.isLowOnSpace() else { return }
        reapAll()
        let deadline = ContinuousClock.now + .milliseconds(500)
        while ContinuousClock.now < deadline {
            let pending = meta.withLock { inodes.values.contains { $0.record.nlink == 0 && !$0.deleted } }
            guard pending else { return }
            usleep(5_000)
        }
    }

    // MARK: Several mounts (SharedMount)

    /// Begins this mount's group transaction with what the change decides on locked: what follows is decided
    /// on what every mount committed. A rollback met here is EIO (logged).
    ///
    /// `scope`: what the change decides on. A group of inodes that cannot take it (another mount holds
    /// the inode, or the change needs the container) is committed first, and the next one waits for what
    /// the change needs. A removed file whose deletes failed waits in memory (`dying`) with its record and
    /// orphan row to write: no change's inode, so while there is one, a new group takes the container (the
    /// records' writes are refused outside the inodes a group holds: `EntityStore.covered`). Within a group
    /// every dirty record is one of its changes'; what a dropped group left is read again first
    /// (`takeDroppedGroup`, at the next commit or use).
    func beginGroup(_ scope: GroupScope = .container) throws(FSError) {
        var opening = !store.hasPendingChanges
        let leftovers = scope != .container && opening && meta.withLock { dying.values.contains { $0.dirty } }
        let wanted = leftovers ? .container : scope
        while true {
            let ready: Bool
            do { ready = try store.beginGroup(wanted) } catch { throw fsError(error) }
            if ready { break }
            try commitGroup(durable: false)
            opening = true
        }
        meta.withLock { applyLostCommits() }
        // Beside other mounts a group is committed within `sharedCommitInterval` (their kernels hear of its
        // changes then): the committer, asleep longer while no group was open, looks again.
        if opening && !store.isAlone { wakeCommitter.signal() }
    }

    /// Commits the group (the changed records first); `durable` waits for the server's disk.
    func commitGroup(durable: Bool) throws(FSError) {
        try meta.withLock { () throws(FSError) in try commitLocked(durable: durable) }
    }

    /// The server lost commits that were not durable yet (it crashed), or may have (this mount
    /// reconnected to it since): every file written since this mount's last durable commit reports EIO
    /// at its next fsync, as a disk's lost write-back does.
    /// Heard during a group begin (the writer held, maybe `meta` too): marked here, applied by
    /// `applyLostCommits` under `meta`.
    func lostCommits() {
        logger.error(
            """
            the server lost commits that were not durable yet, or may have (it crashed or restarted): \
            files changed since the last fsync report EIO at their next fsync
            """)
        pendingLostCommits.store(true, ordering: .releasing)
        // What is cached may name what the server no longer has (a file created in a lost commit): it is
        // all read again, as after a dropped group, before the next use (`state`), so nothing lost is
        // written back without its entry.
        rolledBack.withLock { $0 = .io }
    }

    /// Call under `meta`.
    func applyLostCommits() {
        guard pendingLostCommits.exchange(false, ordering: .acquiringAndReleasing) else { return }
        for ino in writtenSinceDurable { (inodes[ino] ?? dying[ino])?.writeError = .io }
        writtenSinceDurable.removeAll()
    }

    /// Every cached record is read again before its next use (a read found chunks its map did not name).
    func forgetCachedRecords() { storeEpoch.add(1, ordering: .acquiringAndReleasing) }

    private func commitLocked(durable: Bool) throws(FSError) {
        // A group the store dropped since the last look is taken in first: its files' cached records would
        // otherwise be written into the next group, without the entries that went with the dropped one.
        takeDroppedGroup()
        var written: [InodeState] = []
        do {
            for s in inodes.values where s.dirty {
                try persist(s)
                written.append(s)
            }
            // Not reaped yet: the record goes out with an orphan row, for the next mount to remove after a crash.
            for s in dying.values where s.dirty { try persist(s) }
            forgetHeldTails()  // every tail was stored with its dirty file
            try store.commit(durable: durable)
            roomCheck.withLock { $0.entityBytes = 0 }
            forgottenInGroup.removeAll()
            applyLostCommits()  // heard at this group's begin: its files were marked before they were written again
            if durable { writtenSinceDurable.removeAll() }
        } catch {
            let e = fsError(error)
            if rolledBack.withLock({ $0 }) != nil {
                // Written into the group just lost: as dirty as before, so that their next fsync (and, unheard,
                // the unmount) reports the loss. A later fsync of such a file used to succeed.
                for s in written where !s.deleted { s.dirty = true }
                roomCheck.withLock { $0.entityBytes = 0 }  // what was made went with the group
                reloadAfterRollback(e)
            }
            throw e
        }
    }

    // MARK: Helpers

    public func writebackCacheGranted(_ granted: Bool) {
        kernelKeepsFileTimes.store(granted, ordering: .releasing)
    }

    /// Whether a change to this inode's data or size stamps its mtime and ctime here. Not for a regular file
    /// under the writeback cache: the kernel stamped them when the change was made and sends them (SETATTR),
    /// and a WRITE of the same data may reach us after that SETATTR. Stamping again then moved the stored
    /// times a clock tick past the ones the kernel showed, seen only after a remount (issue 15).
    func stampsTimes(_ s: InodeState) -> Bool {
        !(s.isRegular && kernelKeepsFileTimes.load(ordering: .acquiring))
    }

    func attributes(_ s: InodeState) -> Attributes {
        let r = s.record
        return Attributes(
            ino: s.ino, mode: r.mode, nlink: r.nlink, uid: r.uid, gid: r.gid, rdev: r.rdev,
            size: reportedSize(s), blocks: blocks(r),
            atime: Timestamp(r.atime), mtime: Timestamp(r.mtime), ctime: Timestamp(r.ctime))
    }

    /// A symlink's size is the length readlink returns here (programs size their buffer by it), not the
    /// length of the target as written under another mountpoint.
    func reportedSize(_ s: InodeState) -> UInt64 {
        guard s.isSymlink, let stored = s.record.symlinkTarget, let target = try? resolvedTarget(stored) else { return s.record.size }
        return UInt64(target.count)
    }

    /// 512-byte blocks of the chunks actually stored: sparse files look sparse to du, cp and rsync.
    func blocks(_ r: InodeRecord) -> UInt64 {
        let stored = r.chunkCount.multipliedReportingOverflow(by: UInt64(chunkSize))
        let rounded = (r.size + 511) / 512 * 512
        return (stored.overflow ? rounded : min(stored.partialValue, rounded)) / 512
    }

    static func validate(name: [UInt8]) throws(FSError) {
        guard !name.isEmpty, !name.contains(0), !name.contains(UInt8(ascii: "/")) else { throw .invalid }
        guard name.count <= DirectoryEntryRecord.maxNameLength else { throw .nameTooLong }
        if name == [UInt8(ascii: ".")] || name == [UInt8(ascii: "."), UInt8(ascii: ".")] { throw .invalid }
    }
}

extension Timestamp {
    init(_ t: StoredTime) { self.init(seconds: t.seconds, nanoseconds: t.nanoseconds) }
    var stored: StoredTime { StoredTime(seconds: seconds, nanoseconds: nanoseconds) }
}

extension StoredTime {
    static func now() -> StoredTime { Timestamp.now().stored }
}
