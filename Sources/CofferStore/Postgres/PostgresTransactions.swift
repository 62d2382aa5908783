import Foundation

/// The group transaction on the writer connection. PostgreSQL aborts a whole transaction on any
/// failed statement, and a lost connection takes it too: either way the group is gone, so it is
/// rolled back and `onRollback` called, and the failing call throws (a later call must not add
/// the rest of an operation to a new transaction). Outside a transaction a lost server is waited
/// for (`reconnectWait`) and the call run again.
extension PostgresBackend {
    /// Runs `body` on the writer inside the open group transaction (begun here when none is open), after
    /// the queued writes (`later`) unless it only queues one. `bytes` is what the statement adds; `file`
    /// marks content whose reads must see it.
    func write<T>(bytes: Int = 0, file: UInt64? = nil, queueing: Bool = false, _ body: (PGConnection) throws -> T) throws(StoreError) -> T {
        guard !readOnly else { throw .readOnly }
        return try onWriter { () throws(StoreError) -> T in
            if pending.withLock({ $0.since == nil }) { try begin() }
            let result = try inTransaction { try queueing ? body(writer) : withQueued(body) }
            pending.withLock { p in
                p.wrote = true
                p.bytes += bytes
                if let file { p.dirtyFiles.insert(file) }
            }
            return result
        }
    }

    /// Runs a read on the writer: in the open transaction if there is one (it must see it).
    func read<T>(_ body: (PGConnection) throws -> T) throws(StoreError) -> T {
        try onWriter { () throws(StoreError) -> T in
            if snapshotLost.withLock({ $0 }) { throw .unavailable("the connection holding the snapshot was lost") }
            if pending.withLock({ $0.since != nil }) { return try inTransaction { try withQueued(body) } }
            return try idle(body)
        }
    }

    /// A write nothing waits for the answer of (a record put, a delete): queued in the open group and
    /// sent with the next statement's round trip or the commit's. Its failure drops the group there.
    /// `inode`: the inode record it writes or deletes, which the commit's notification names.
    func later(_ statement: String, _ params: [PGValue], bytes: Int = 0, file: UInt64? = nil, inode: UInt64? = nil) throws(StoreError) {
        try write(bytes: bytes, file: file, queueing: true) { _ in
            pending.withLock { p in
                p.queued.append(PGStatement(statement, params, prepared: true))
                p.queuedBytes += bytes
                if let inode { p.inodes.insert(inode) }  // named in the commit's notification
            }
        }
    }

    /// `body` on the writer (held, in the open group) with the queued writes going ahead of its first
    /// statement, in the same round trip; sent on their own when it ran none.
    private func withQueued<T>(_ body: (PGConnection) throws -> T) throws -> T {
        writer.ahead = pending.withLock { $0.takeQueued() }
        let result: T
        do {
            result = try body(writer)
            if !writer.ahead.isEmpty { _ = try writer.pipeline([]) }
        } catch {
            // Not sent (`body` failed before its first statement): still the group's, unless it is dropped.
            let unsent = writer.ahead
            writer.ahead = []
            pending.withLock { p in
                p.queued = unsent + p.queued
                p.queuedBytes += unsent.reduce(0) { $0 + $1.params.reduce(0) { $0 + ($1.byteCount ?? 0) } }
            }
            throw error
        }
        return result
    }

    public func beginGroup() throws(StoreError) {
        guard try beginGroup(.container) else { throw .database("a group of inodes is open where the container's is needed") }
    }

    public func beginGroup(_ scope: GroupScope) throws(StoreError) -> Bool {
        guard !readOnly else { throw .readOnly }
        return try onWriter { () throws(StoreError) -> Bool in
            let (open, inodeGroup, locked) = pending.withLock { ($0.since != nil, $0.inodeGroup, $0.locked) }
            // Alone, or beside mounts that write nothing, nobody commits beside this mount: its groups take the
            // container, which costs no lock per inode (`othersBusy`).
            guard open else {
                try begin(coherent && !isAlone && (othersBusy || inodeGroupsBesideIdleMounts) ? scope : .container)
                return true
            }
            guard inodeGroup else { return true }  // the container's group covers every change
            switch scope {
            case .container: return false
            case .nothing: return true
            case .inode(let id): return locked.contains(id) ? true : try lockInGroup(id)
            }
        }
    }

    public var holdsInodeGroup: Bool { pending.withLock { $0.since != nil && $0.inodeGroup } }

    public func covers(_ inode: UInt64) -> Bool { pending.withLock { !$0.inodeGroup || $0.locked.contains(inode) } }

    public func madeInGroup(_ inode: UInt64) {
        pending.withLock { p in if p.inodeGroup { p.locked.insert(inode) } }
    }

    /// One more inode for the open inode group: only tried (a group never waits while it holds inodes),
    /// in one round trip with the state, read after the lock was granted. Another mount's commit since
    /// this mount last looked may have changed what this one cached of the inode: `onStateInGroup` hears
    /// the new generation, and the layers above read again before they decide.
    private func lockInGroup(_ id: UInt64) throws(StoreError) -> Bool {
        let (got, state) = try inTransaction { () throws -> (Bool, [UInt8]?) in
            try withQueued { c in
                let r = try c.pipeline([
                    PGStatement(sql.tryInodeLock, [.text(sql.schema), Self.id(id)], prepared: true), PGStatement(sql.stateRow, prepared: true)
                ])
                guard r.count == 2 else { throw PGError(.unexpectedResult, "a pipeline of 2 answered \(r.count)") }
                return (try r[0].bool(0, 0) ?? false, try r[1].bytes(0, 0))
            }
        }
        guard got else { return false }
        pending.withLock { _ = $0.locked.insert(id) }
        do throws(StoreError) { try onStateInGroup?(state) } catch {
            droppedTransaction(error)
            throw error
        }
        return true
    }

    public func committedState(of inode: UInt64?) throws(StoreError) -> [UInt8]? {
        // Alone: nobody else can have committed (a mount that joins waits until this is false).
        if isSole { return nil }
        enum Look {
            case seen
            case read([UInt8]?)
            case besideOwnGroup
        }
        let look = try onWriter { () throws(StoreError) -> Look in
            let (open, inodeGroup, locked) = pending.withLock { ($0.since != nil, $0.inodeGroup, $0.locked) }
            // The container's group sees every commit since it began, an inode group those of its inodes.
            if open && (!inodeGroup || inode.map(locked.contains) == true) { return .seen }
            if open { return .besideOwnGroup }
            return .read(try idle { c in try awaitedState(c, of: inode, writerLock: true) })
        }
        switch look {
        case .seen: return nil
        case .read(let state): return state
        case .besideOwnGroup:
            // This mount's inode group holds the writer lock shared, on the writer: the wait for the inode's
            // goes on a connection of the pool, so that the group can still commit meanwhile.
            do { return try readerPool().withConnection { c in try awaitedState(c, of: inode, writerLock: false) } } catch {
                throw StoreError.postgres(error)
            }
        }
    }

    /// The committed state once no other mount holds the writer lock exclusively (`writerLock`) or `inode`'s
    /// lock: both taken shared and tried first, with the state in the same round trip, then waited for.
    /// Each pipeline is one implicit transaction: the locks hold until its end, and the state is read in a
    /// snapshot taken after they were granted.
    private func awaitedState(_ c: PGConnection, of inode: UInt64?, writerLock: Bool) throws -> [UInt8]? {
        let schema = PGValue.text(sql.schema), timeout = PGValue.text(lockTimeout)
        var tries: [PGStatement] = [], waits: [PGStatement] = []
        if writerLock {
            tries.append(PGStatement(sql.tryWriterLockShared, [schema], prepared: true))
            waits.append(PGStatement(sql.writerLockShared, [schema, timeout], prepared: true))
        }
        if let inode {
            tries.append(PGStatement(sql.tryInodeLockShared, [schema, Self.id(inode)], prepared: true))
            waits.append(PGStatement(sql.inodeLockShared, [schema, Self.id(inode), timeout], prepared: true))
        }
        let r = try c.pipeline(tries + [PGStatement(sql.stateRow, prepared: true)])
        if r.count == tries.count + 1, try tries.indices.allSatisfy({ try r[$0].bool(0, 0) == true }) { return try r[tries.count].bytes(0, 0) }
        return try waitingForTheWriterLock(c, reader: true) {
            let w = try c.pipeline(waits + [PGStatement(sql.stateRow, prepared: true)])
            return w.count == waits.count + 1 ? try w[waits.count].bytes(0, 0) : nil
        }
    }

    /// Tells the other mounts that this one waits for the writer lock, to write or (`reader`) to read:
    /// the one holding it ends its group soon (`CoherentBackend.othersWaiting`, `readersWaiting`). Sent
    /// outside any transaction (after a ROLLBACK, or alone), so the notification goes out at the batch's
    /// end, at once.
    private func askForTheWriterLock(reader: Bool) -> PGStatement {
        let prefix = reader ? PostgresSQL.readerWantPrefix : PostgresSQL.wantPrefix
        return PGStatement(PostgresSQL.notify, [.text(sql.channel), .text(prefix + (fenceHolder ?? ""))], prepared: true)
    }

    /// Runs `wait` (a wait for the writer lock of at most `lockSlice` seconds, outside any transaction when
    /// it fails) until it gets the lock: before each wait (`first` ahead of the first ask, in its round
    /// trip) the holder is asked to end its group, and after each wait that ran out a holder stalled on
    /// its client for a slice whose lease has lapsed is ended (`endLapsedWriter`), so a stopped machine
    /// holds the others up for about a lease and a slice, whatever it stopped in.
    private func waitingForTheWriterLock<T>(_ c: PGConnection, reader: Bool = false, first: [PGStatement] = [], _ wait: () throws -> T) throws -> T {
        var ask = first + [askForTheWriterLock(reader: reader)]
        while true {
            _ = try c.pipeline(ask)
            ask = [askForTheWriterLock(reader: reader)]
            do {
                return try wait()
            } catch {
                guard (error as? PGError)?.sqlState == .lockNotAvailable else { throw error }
            }
            do {
                _ = try c.execute(sql.endLapsedWriter, [.text(sql.schema), .text(lockTimeout)], prepared: true)
            } catch {
                // A superuser's session, which only a superuser may end: waited for until it goes on or ends.
                guard error.sqlState == .insufficientPrivilege else { throw error }
            }
        }
    }

    private var lockTimeout: String { "\(Int(lockSlice * 1000))ms" }

    /// Opens the group transaction (with the writer held). Nothing is open yet, so it is safe to run
    /// again after a reconnect. With several mounts: the writer lock, the sealed state and the number of
    /// live mounts in the same round trip, then `onGroupBegin`; a group it refuses is rolled back before
    /// anything is written.
    private func begin(_ scope: GroupScope = .container) throws(StoreError) {
        guard coherent else {
            _ = try idle { try $0.execute("BEGIN") }
            pending.withLock { $0.since = .now }
            return
        }
        // A mount whose lease was taken again (`rejoin`) announces itself before it may commit.
        if fenceHolder != nil, !joined.load(ordering: .acquiring) { try join() }
        let state: [UInt8]?, mounts: Int64
        do {
            (state, mounts) = try idle { c in
                if !named, let holder = fenceHolder {  // not yet, or that failed at the last reconnect
                    try c.execute(PostgresSQL.nameSession, [.text(PostgresSQL.writerPrefix + holder)])
                    named = true
                }
                // Held elsewhere (or waited for): roll back, ask its holder to end its group, then wait.
                // The container's group takes the writer lock; an inode group takes it shared, and its inode.
                func group(trying: Bool) throws -> (got: Bool, state: [UInt8]?, mounts: Int64) {
                    let schema = PGValue.text(sql.schema)
                    // Tried, or waited for with the slice's timeout.
                    func lock(_ tried: String, _ waited: String, _ params: [PGValue]) -> PGStatement {
                        trying ? PGStatement(tried, params, prepared: true) : PGStatement(waited, params + [.text(lockTimeout)], prepared: true)
                    }
                    var locks =
                        scope == .container
                        ? [lock(sql.tryWriterLock, sql.writerLock, [schema])] : [lock(sql.tryWriterLockShared, sql.writerLockShared, [schema])]
                    if case .inode(let id) = scope { locks.append(lock(sql.tryInodeLock, sql.inodeLock, [schema, Self.id(id)])) }
                    // Once waited for, the lock's timeout goes back to the one the session started with
                    // (the writer never sets its own) for the rest of the group.
                    let reset = trying ? [] : [PGStatement("SET LOCAL lock_timeout TO DEFAULT")]
                    let r = try c.pipeline(
                        [PGStatement("BEGIN")] + locks + reset + [
                            PGStatement(sql.stateRow, prepared: true), PGStatement(sql.liveMounts, prepared: true)
                        ])
                    let at = 1 + locks.count + reset.count
                    guard r.count == at + 2 else { return (true, nil, 0) }
                    let state = try r[at].bytes(0, 0), mounts = try r[at + 1].int64(0, 0) ?? 0
                    let got = trying ? try (1...locks.count).allSatisfy { try r[$0].bool(0, 0) == true } : true
                    return (got, state, mounts)
                }
                let tried = try group(trying: true)
                if tried.got { return (tried.state, tried.mounts) }
                let waited = try waitingForTheWriterLock(c, first: [PGStatement("ROLLBACK")]) {
                    do { return try group(trying: false) } catch {
                        if c.inTransaction { _ = try c.pipeline([PGStatement("ROLLBACK")]) }
                        throw error
                    }
                }
                return (waited.state, waited.mounts)
            }
        } catch {
            if writer.inTransaction { _ = try? writer.execute("ROLLBACK") }
            throw error
        }
        // Alone: this mount's lease is the only live one (a store without a lease never is).
        alone.store(fenceHolder != nil && mounts <= 1, ordering: .releasing)
        pending.withLock { p in
            p.since = .now
            p.inodeGroup = scope != .container
            if case .inode(let id) = scope { p.locked = [id] }
        }
        let reconnectedSince = reconnected.exchange(false, ordering: .acquiringAndReleasing)
        do { try onGroupBegin?(state, reconnectedSince) } catch {
            if reconnectedSince { reconnected.store(true, ordering: .releasing) }  // still to be reported
            _ = try? writer.execute("ROLLBACK")
            pending.withLock { $0.clear() }
            throw error
        }
    }

    public func batch<T>(_ body: () throws -> T) throws -> T {
        writerLock.lock()
        defer { writerLock.unlock() }
        return try body()
    }

    /// Writes the sealed state and commits in one round trip (a pipeline of the state's upsert and
    /// COMMIT). A durable commit waits for the server's WAL flush (synchronous_commit on), which
    /// covers every earlier commit; the others turn that off for their own transaction. A COMMIT whose answer is lost with the
    /// connection may have committed; the group is reported rolled back all the same (the caches
    /// above reload whichever state the server kept, and the next commit writes a later generation).
    public func commit(durable: Bool, state: () throws(StoreError) -> [UInt8]) throws(StoreError) -> Bool {
        guard !readOnly else { return false }
        return try onWriter { () throws(StoreError) -> Bool in
            guard let wrote = pending.withLock({ $0.since != nil ? $0.wrote : nil }) else { return false }
            // A group begun for its lock that wrote nothing ends without a new generation, unless a durable
            // commit is asked for: that one flushes every earlier commit (fsync with nothing pending).
            if !wrote && !durable {
                _ = try inTransaction { try writer.execute("ROLLBACK") }
                pending.withLock { $0.clear() }
                return false
            }
            // Inode groups commit beside each other: each reads the generation the last commit wrote (the row
            // stays locked until this COMMIT) and seals the next, so generations still grow by one.
            if pending.withLock({ $0.inodeGroup }) {
                let current = try inTransaction { try withQueued { c in try lockedState(c) } }
                do throws(StoreError) { try onStateInGroup?(current) } catch {
                    droppedTransaction(error)
                    throw error
                }
            }
            let sealed = try state()
            let (queued, changed) = pending.withLock { ($0.takeQueued(), $0.inodes) }
            try inTransaction {
                var statements = queued
                // Commits in between need not wait for the server's disk: fsync and unmount commit
                // durably, which flushes every earlier commit too.
                if !durable { statements.append(PGStatement("SET LOCAL synchronous_commit = off")) }
                if coherent {
                    let payload = PostgresSQL.commitPayload(holder: fenceHolder ?? "", inodes: changed)
                    statements.append(PGStatement(PostgresSQL.notify, [.text(sql.channel), .text(payload)], prepared: true))
                }
                if let holder = fenceHolder {
                    statements.append(PGStatement(sql.fenceLease, [.text(holder), .int4(Int32(clamping: PostgresLease.duration))], prepared: true))
                }
                statements.append(PGStatement(sql.putMeta, [.text("state"), .bytea(sealed)], prepared: true))
                statements.append(PGStatement("COMMIT"))
                let r: [PGResult]
                do { r = try writer.pipeline(statements) } catch let e as PGError where e.sqlState == SQLState("22012") && fenceHolder != nil {
                    throw StoreError.leaseLost
                }
                guard r.count == statements.count, r.last?.commandStatus == "COMMIT" else {
                    throw PGError(.server, "the server rolled the transaction back at COMMIT")
                }
            }
            pending.withLock { $0.clear() }
            return true
        }
    }

    /// The state row `FOR UPDATE`, at the commit of a group of inodes: another mount's commit holds it for
    /// one round trip, unless that mount stopped between the two round trips of its commit. So the row is
    /// waited for in slices, each in a savepoint (a lock timeout would otherwise take the group with it),
    /// and after a slice that ran out a stalled holder whose lease lapsed is ended (`endLapsedWriter`: it
    /// holds the writer lock shared), as a wait for the writer lock does.
    private func lockedState(_ c: PGConnection) throws -> [UInt8]? {
        while true {
            do {
                let r = try c.pipeline([
                    PGStatement("SAVEPOINT coffer_state"),
                    PGStatement("SELECT set_config('lock_timeout', $1, true)", [.text(lockTimeout)], prepared: true),
                    PGStatement(sql.stateRowForUpdate, prepared: true), PGStatement("RELEASE SAVEPOINT coffer_state"),
                    PGStatement("SET LOCAL lock_timeout TO DEFAULT")
                ])
                guard r.count == 5 else { throw PGError(.unexpectedResult, "a pipeline of 5 answered \(r.count)") }
                return try r[2].bytes(0, 0)
            } catch let e as PGError where e.sqlState == .lockNotAvailable {
                _ = try c.pipeline([PGStatement("ROLLBACK TO SAVEPOINT coffer_state"), PGStatement("SET LOCAL lock_timeout TO DEFAULT")])
                do {
                    _ = try c.execute(sql.endLapsedWriter, [.text(sql.schema), .text(lockTimeout)], prepared: true)
                } catch {
                    guard error.sqlState == .insufficientPrivilege else { throw error }
                    _ = try c.pipeline([PGStatement("ROLLBACK TO SAVEPOINT coffer_state")])
                }
            }
        }
    }

    /// One REPEATABLE READ, READ ONLY transaction on the writer, through which every read here goes,
    /// until `close`. It counts as the open transaction, so a lost connection fails the reads
    /// instead of reconnecting outside the snapshot.
    public func beginSnapshot() throws(StoreError) {
        guard readOnly else { throw .database("a snapshot is taken on a store opened read-only") }
        try onWriter { () throws(StoreError) in
            try idle { try $0.executeScript("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; SELECT 1") }
            pending.withLock { $0.since = .now }
            snapshot.withLock { $0 = true }
        }
    }

    public var hasPendingChanges: Bool { pending.withLock { $0.since != nil } }

    /// Due when the open transaction is older than `age` or adds `volume` bytes or more. Nothing
    /// about the disk: it is the server's (a full one answers `diskFull`).
    public func isCommitDue(age: Duration, volume: Int) -> Bool {
        guard let (since, bytes) = pending.withLock({ p in p.since.map { ($0, p.bytes) } }) else { return false }
        return bytes >= volume || ContinuousClock.now - since >= age
    }

    // MARK: Plumbing

    /// `body` with the writer held by this thread (a `batch` on it already holds it).
    private func onWriter<T>(_ body: () throws(StoreError) -> T) throws(StoreError) -> T {
        writerLock.lock()
        defer { writerLock.unlock() }
        guard !closed.load(ordering: .acquiring) else { throw .database("the store is closed") }
        return try body()
    }

    /// A statement outside any transaction: on a dead session (server restarted, connection cut) it
    /// reconnects, waiting up to `reconnectWait`, and runs once more.
    private func idle<T>(_ body: (PGConnection) throws -> T) throws(StoreError) -> T {
        if !writer.isAlive { try reconnect() }
        do { return try body(writer) } catch let e as PGError where e.isConnectionLoss {
            try reconnect()
            do { return try body(writer) } catch { throw StoreError.postgres(error) }
        } catch { throw StoreError.postgres(error) }
    }

    /// A statement inside the open transaction. A server error aborted the transaction, and a lost
    /// connection took it: roll back, tell `onRollback`, throw. A result this client refused (wrong
    /// type or shape) left the server's transaction as it was.
    private func inTransaction<T>(_ body: () throws -> T) throws(StoreError) -> T {
        do { return try body() } catch {
            let pg = error as? PGError
            let e = StoreError.postgres(error)
            if pg?.kind == .connection || writer.transactionFailed || !writer.inTransaction || !writer.isAlive {
                droppedTransaction(e)
            }
            throw e
        }
    }

    /// Called with the writer held (inside a batch), as every change is.
    public func dropOpenGroup(_ error: StoreError) { droppedTransaction(error) }

    /// The group is gone: end what is left of it on the server, forget it here, tell the store. A
    /// snapshot (`beginSnapshot`) is gone for good: later reads fail instead of reading outside it.
    func droppedTransaction(_ error: StoreError) {
        if snapshot.withLock({ $0 }) { snapshotLost.withLock { $0 = true } }
        if writer.isAlive {
            if writer.inTransaction { _ = try? writer.execute("ROLLBACK") }
        } else {
            writer.close()  // reconnected by the next call
        }
        pending.withLock { $0.clear() }
        onRollback?(error)
    }

    private func reconnect() throws(StoreError) {
        do { try writer.reconnect(within: reconnectWait, store: true) } catch { throw StoreError.postgres(error) }
        reconnected.store(true, ordering: .releasing)
        named = false
        try setUpSession()
    }
}
