import Foundation
import Synchronization

/// The PostgreSQL engine: a container's rows in its own schema of a database the server holds, which
/// sees only random ids, keyed tags and sealed bytes (docs/FORMAT.md, "Containers in PostgreSQL").
///
/// Writes go to one dedicated writer connection that keeps one transaction open and commits it in
/// groups with the sealed state (PostgresTransactions.swift); synchronous_commit is on, so every
/// commit is durable when it returns. Metadata is read through the writer (it must see the open
/// transaction); content without uncommitted changes through a small pool, concurrently.
public final class PostgresBackend: CoherentBackend, @unchecked Sendable {  // writer state behind writerLock
    public let readOnly: Bool
    public let location: PostgresLocation
    let sql: PostgresSQL
    /// How long a call waits for a lost server to come back before it fails.
    let reconnectWait: Double

    /// The writer connection; only touched with `writerLock` held. Recursive: a `batch` holds it
    /// for its body, and the body's calls on the same thread take it again (other threads wait).
    let writer: PGConnection
    let writerLock = NSRecursiveLock()
    /// Connections for committed content, opened on the first such read.
    private let readers = Mutex<PGPool?>(nil)
    static let readerConnections = 4

    public var onRollback: (@Sendable (StoreError) -> Void)?
    /// The lease holder id this store commits under (a mount, fsck's repair): every commit renews the
    /// lease in its own transaction and fails with `leaseLost` when another mount took it. Set right
    /// after opening, before the first commit.
    public var fenceHolder: String?
    /// Several mounts may share the container (set for mounts and fsck's repair, before the first
    /// write): groups begin with the writer lock and the state (`onGroupBegin`), commits are announced.
    public var coherent = false
    public var onGroupBegin: (([UInt8]?, Bool) throws(StoreError) -> Void)?
    public var onStateInGroup: (([UInt8]?) throws(StoreError) -> Void)?
    /// The writer reconnected since the last group began (`onGroupBegin`).
    let reconnected = Atomic<Bool>(false)
    /// Whether no other mount held a lease at the last group begin (`CoherentBackend.isAlone`).
    let alone = Atomic<Bool>(false)
    public var isAlone: Bool { alone.load(ordering: .acquiring) }
    /// When the listener last knew this mount held the sole lock with no other mount's lease row (nil: it
    /// does not). A mount that comes waits until the listener let go (`join`); one cut off from the server
    /// stops being told, and its session (and lock) ends on the server only after about 11 s of silence.
    let soleConfirmed = Mutex<ContinuousClock.Instant?>(nil)
    /// Well under the 11 s after which the server ends a silent session (and lets a newcomer in).
    static let soleValidity: Duration = .seconds(3)
    /// Alone, as confirmed lately: opens need not look at the server's state (`committedState`).
    public var isSole: Bool { soleConfirmed.withLock { $0.map { ContinuousClock.now - $0 < Self.soleValidity } ?? false } }
    /// `join` ran (and the lease was not taken again since, `rejoin`): only then may the listener take the
    /// sole lock (a mount's own join must not wait for it).
    let joined = Atomic<Bool>(false)
    /// When another mount last asked for the writer lock (`othersWaiting`), and when an open, opendir or
    /// failed lookup of another mount last did (`readersWaiting`).
    let lastAsked = Mutex<(any: ContinuousClock.Instant?, reader: ContinuousClock.Instant?)>((nil, nil))
    /// A request counts for the open group when heard after it began, or just before: the asker may
    /// have found the lock held by this mount's previous group and asked as that one ended.
    static let askGrace: Duration = .milliseconds(20)
    public var othersWaiting: Bool { askedDuringGroup(lastAsked.withLock { $0.any }) }
    public var readersWaiting: Bool { askedDuringGroup(lastAsked.withLock { $0.reader }) }
    private func askedDuringGroup(_ asked: ContinuousClock.Instant?) -> Bool {
        guard let asked, let since = pending.withLock({ $0.since }) else { return false }
        return asked >= since - Self.askGrace
    }
    /// When another mount's commit was last heard (or might have gone unheard: a reconnect of the listener).
    let lastHeard = Mutex<ContinuousClock.Instant?>(nil)
    /// Another mount committed or asked for a lock within `busyElsewhere`: new groups are groups of inodes
    /// (`beginGroup(_:)`). Beside mounts that write nothing a group of the container costs no lock per
    /// inode and no extra round trip at its commit, and a mount that starts writing asks for it, which ends it.
    public var othersBusy: Bool {
        let now = ContinuousClock.now
        func recent(_ t: ContinuousClock.Instant?) -> Bool { t.map { now - $0 < Self.busyElsewhere } ?? false }
        return recent(lastHeard.withLock { $0 }) || recent(lastAsked.withLock { $0.any })
    }
    static let busyElsewhere: Duration = .seconds(2)
    /// Tests: groups of inodes beside other mounts whether or not they are busy.
    var inodeGroupsBesideIdleMounts = false
    /// The connection that hears other mounts' commits (`listen`).
    let listener = Mutex<PostgresListener?>(nil)

    /// The open group transaction: when it began, how many bytes it adds, which files' content it
    /// changed (their reads go through the writer until the commit).
    struct Pending {
        var since: ContinuousClock.Instant?
        var bytes = 0
        var dirtyFiles = Set<UInt64>()
        /// Inodes whose records the group wrote or deleted, named in its commit's notification.
        var inodes = Set<UInt64>()
        /// Something was written (a group begun only for its lock and state may end without a commit).
        var wrote = false
        /// The group holds the writer lock shared and locks on `locked` (`GroupScope.inode`), not the
        /// container: other mounts' inode groups commit beside it.
        var inodeGroup = false
        var locked = Set<UInt64>()
        /// Writes whose answer nothing waits for (`later`), sent in the round trip of the next statement
        /// on the writer or with the commit: a record put costs no round trip of its own.
        var queued: [PGStatement] = []
        /// The bytes of the queued values (bounded by `queuedChunkLimit` for chunks).
        var queuedBytes = 0
        mutating func clear() {
            since = nil
            bytes = 0
            dirtyFiles.removeAll()
            inodes.removeAll()
            wrote = false
            inodeGroup = false
            locked.removeAll()
            _ = takeQueued()
        }
        mutating func takeQueued() -> [PGStatement] {
            defer {
                queued.removeAll()
                queuedBytes = 0
            }
            return queued
        }
    }
    let pending = Mutex(Pending())
    /// A read snapshot is open (`beginSnapshot`), and whether its connection was lost since.
    let snapshot = Mutex(false), snapshotLost = Mutex(false)
    let closed = Atomic<Bool>(false)
    /// The writer session is named after this mount's lease holder (`PostgresSQL.writerPrefix`), so that
    /// the other mounts can end it once the lease lapses while it holds the writer lock and stalls
    /// (`endLapsedWriter`): done at a group's begin, again after a reconnect. Behind `writerLock`.
    var named = false

    private init(location: PostgresLocation, writer: PGConnection, readOnly: Bool, reconnectWait: Double) throws(StoreError) {
        self.location = location
        self.sql = PostgresSQL(schema: location.container)
        self.writer = writer
        self.readOnly = readOnly
        self.reconnectWait = reconnectWait
        try setUpSession()
    }

    /// Opens the container's schema (it must exist: `notAStore` otherwise).
    public static func open(_ location: PostgresLocation, readOnly: Bool = false, reconnectWait: Double = 30) throws(StoreError) -> PostgresBackend {
        let backend = try PostgresBackend(location: location, writer: try connect(location), readOnly: readOnly, reconnectWait: reconnectWait)
        guard try backend.schemaExists() else {
            backend.close()
            throw .notAStore("the database has no container \(location.container)")
        }
        return backend
    }

    /// Begins the group transaction that creates the container's schema and tables and writes its
    /// header row; `EntityStore.initialize` then writes the store's first rows and commits, so the
    /// container appears whole or not at all. Without a header (a copy: StoreCopy) there is no row yet.
    public static func create(_ location: PostgresLocation, header: [UInt8]?, reconnectWait: Double = 30) throws(StoreError) -> PostgresBackend {
        let backend = try PostgresBackend(location: location, writer: try connect(location), readOnly: false, reconnectWait: reconnectWait)
        do {
            try backend.write { c in
                try c.executeScript(backend.sql.createTables)
                if let header { try c.execute(backend.sql.putHeader, [.bytea(header)]) }
            }
        } catch {
            backend.close()
            throw error
        }
        return backend
    }

    static func connect(_ location: PostgresLocation) throws(StoreError) -> PGConnection {
        do { return try PGConnection(location.conninfo) } catch { throw StoreError.postgres(error) }
    }

    /// Session settings of the writer, again after every reconnect: commits wait for the server's
    /// WAL flush (a role or database may have turned that off), a read-only store refuses writes
    /// on the server too, a writable one's idle group is ended by the server after a minute, and
    /// transactions read committed.
    func setUpSession() throws(StoreError) {
        do {
            // A writer whose group stays idle for a minute (a peer that is stopped or suspended while it
            // holds the container's writer lock) loses it, so the other mounts go on. Read committed
            // whatever the role's default: a state row read after the writer lock must be read in a
            // snapshot taken after the lock was granted.
            try writer.executeScript(
                "SET synchronous_commit = on; SET default_transaction_isolation = 'read committed'"
                    + (readOnly ? "; SET default_transaction_read_only = on" : "; SET idle_in_transaction_session_timeout = '60s'"))
        } catch { throw StoreError.postgres(error) }
    }

    func schemaExists() throws(StoreError) -> Bool {
        try read { c in try c.execute(PostgresSQL.schemaExists, [.text(sql.schema)], prepared: true).bool(0, 0) ?? false }
    }

    // MARK: Schema rows

    public func readSchema() throws(StoreError) -> StoreSchema {
        do {
            return try read { c in
                let k = try c.execute(sql.kinds, prepared: true)
                var kinds: [StoreSchema.Kind] = []
                for r in 0..<k.rowCount {
                    kinds.append(
                        StoreSchema.Kind(number: Int(try k.int64(r, 0) ?? -1), name: try k.text(r, 1) ?? "?", transformer: try k.text(r, 2) ?? "?"))
                }
                let m = try c.execute(sql.meta, prepared: true)
                var meta: [String: [UInt8]] = [:]
                for r in 0..<m.rowCount {
                    if let name = try m.text(r, 0), let value = try m.bytes(r, 1) { meta[name] = value }
                }
                return StoreSchema(kinds: kinds, meta: meta)
            }
        } catch {
            if case .unavailable = error { throw error }  // the server is away: not a damaged store
            throw .notAStore("\(error)")
        }
    }

    public func initializeSchema(_ schema: StoreSchema) throws(StoreError) {
        try write { c in
            for kind in schema.kinds {
                try c.execute(sql.putKind, [.int4(Int32(truncatingIfNeeded: kind.number)), .text(kind.name), .text(kind.transformer)], prepared: true)
            }
            for (name, value) in schema.meta { try c.execute(sql.putMeta, [.text(name), .bytea(value)], prepared: true) }
        }
    }

    /// Nothing to set up: the session was set up at connect.
    public func startWriting() throws(StoreError) {}

    /// Round trips made on the writer so far (tests).
    var writerRoundTrips: Int {
        writerLock.lock()
        defer { writerLock.unlock() }
        return writer.roundTrips
    }

    /// The connections for committed content (opened on first use, with the writer's bounded wait).
    func readerPool() throws(StoreError) -> PGPool {
        try readers.withLock { (pool: inout PGPool?) throws(StoreError) -> PGPool in
            if let pool { return pool }
            do {
                let p = try PGPool(location.conninfo, maxConnections: Self.readerConnections, reconnectWait: reconnectWait)
                pool = p
                return p
            } catch { throw StoreError.postgres(error) }
        }
    }

    /// Rolls back what is open (nothing more is committed) and ends every connection.
    public func close() {
        guard !closed.exchange(true, ordering: .acquiringAndReleasing) else { return }
        writerLock.lock()
        if writer.inTransaction, writer.isAlive { _ = try? writer.execute("ROLLBACK") }
        pending.withLock { $0.clear() }
        writer.close()
        writerLock.unlock()
        readers.withLock {
            $0?.close()
            $0 = nil
        }
        listener.withLock {
            $0?.stop()
            $0 = nil
        }
    }

    public func listen(
        heard: @escaping @Sendable () -> Void, changed: @escaping @Sendable ([UInt64]) -> Void, wanted: @escaping @Sendable () -> Void
    ) {
        listener.withLock { l in
            guard l == nil, !closed.load(ordering: .acquiring) else { return }
            l = PostgresListener(
                conninfo: location.conninfo, sql: sql, ignoring: fenceHolder ?? "",
                sole: { [weak self] at in self?.soleConfirmed.withLock { $0 = at } },
                joined: { [weak self] in self?.joined.load(ordering: .acquiring) ?? false },
                heard: { [weak self] in
                    self?.lastHeard.withLock { $0 = .now }
                    heard()
                }, changed: changed,
                wanted: { [weak self] byReader in
                    self?.lastAsked.withLock { asked in
                        asked.any = .now
                        if byReader { asked.reader = asked.any }
                    }
                    wanted()
                })
        }
    }

    /// Announces this mount (a notification) and waits until every mount alone has heard it and let go of
    /// the sole lock (taking it exclusively, on a connection of its own, then closing that); from then on
    /// they look at the server's state at every open. Fails after half a lease: a mount alone that
    /// does not answer (a stopped process; a vanished machine's session ends sooner, by keepalives).
    /// Meanwhile, each second, a holder that is a mount whose lease lapsed and whose listener has sent
    /// nothing for a few seconds (a machine stopped while alone) is ended (`endLapsedSole`), so such a
    /// machine keeps the others out until its lease lapses, not until it goes on.
    /// Only a mount with a lease joins (and may later be alone itself).
    public func join() throws(StoreError) {
        guard coherent, let holder = fenceHolder, !joined.load(ordering: .acquiring) else { return }
        do {
            let c = try PGConnection(location.conninfo)
            defer { c.close() }
            try c.execute(PostgresSQL.notify, [.text(sql.channel), .text(PostgresSQL.joinPrefix + holder)])
            // Half a lease: this mount's own lease is renewed only once it mounted.
            let deadline = ContinuousClock.now + .seconds(joinWait)
            try c.execute("SET lock_timeout = '\(min(joinWait, 1))s'")
            while true {
                do {
                    try c.execute(sql.joinLock, [.text(sql.schema)])
                    break
                } catch {
                    guard (error as? PGError)?.sqlState == .lockNotAvailable, ContinuousClock.now < deadline else { throw error }
                    do { _ = try c.execute(sql.endLapsedSole, [.text(sql.schema), .text("\(soleStall)s")]) } catch {
                        guard (error as? PGError)?.sqlState == .insufficientPrivilege else { throw error }  // a superuser's: waited for
                    }
                }
            }
        } catch {
            if (error as? PGError)?.sqlState == .lockNotAvailable {
                throw .unavailable("another mount of this container did not answer within \(joinWait) s (a stopped process?)")
            }
            throw .postgres(error)
        }
        joined.store(true, ordering: .releasing)
    }

    /// How long `join` waits, in seconds: half a lease (tests shorten it).
    var joinWait = max(1, PostgresLease.duration / 2)
    /// How long, in seconds, a mount alone's listener has sent nothing (it looks every second) before a
    /// mount that joins may end it once its lease has lapsed (tests shorten it).
    var soleStall = 4.0
    /// How long one wait for the writer lock lasts, in seconds, before the waiter looks for a holder
    /// whose lease lapsed: a lease's renewal period, at least a second (tests shorten it).
    var lockSlice = max(1, PostgresLease.renewEvery)

    /// This mount's lease row was taken again after it lapsed (the mount was cut off from the server
    /// meanwhile, and a mount alone may have started trusting that it is): the next group joins anew.
    public func rejoin() {
        joined.store(false, ordering: .releasing)
    }

    /// The space the schema's tables take on the server, indexes and TOAST included.
    public var sizeOnDisk: UInt64? {
        try? read { c in
            UInt64(clamping: try c.execute(PostgresSQL.size, [.text(sql.schema)], prepared: true).int64(0, 0) ?? 0)
        }
    }

    /// PostgreSQL reclaims space by itself (autovacuum); there is nothing to give back here.
    public func reclaimSpace(limit: Int) throws(StoreError) -> Int { 0 }

    /// The server's disk is not ours to probe: a full one answers 53100 (`diskFull`) at the statement.
    public func isLowOnSpace() -> Bool { false }
    public func hasRoom(forWrite bytes: Int, more: Int64) -> Bool { true }
}
