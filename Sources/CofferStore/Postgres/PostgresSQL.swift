/// The container's tables in its own schema (docs/FORMAT.md, "Containers in PostgreSQL") and every
/// fixed statement over them, with the schema name quoted in. Each text is prepared once per
/// session (`PGConnection.execute(prepared: true)`); ids travel as int8 with the same bit patterns
/// SQLite keeps, tags and sealed values as bytea, so a row means the same thing in both engines.
struct PostgresSQL: Sendable {
    let schema: String
    let q: String

    init(schema: String) {
        self.schema = schema
        q = PostgresIdentifier.quoted(schema)
    }

    /// The tables. Sealed values do not compress: STORAGE EXTERNAL spares the server pglz's
    /// attempt on every chunk and map page (they are still moved out of line when large).
    var createTables: String {
        """
        CREATE SCHEMA \(q);
        CREATE TABLE \(q).header(id integer PRIMARY KEY CHECK (id = 1), value bytea NOT NULL);
        CREATE TABLE \(q).meta(name text PRIMARY KEY, value bytea NOT NULL);
        CREATE TABLE \(q).kinds(kind integer PRIMARY KEY, name text NOT NULL, transformer text NOT NULL);
        CREATE TABLE \(q).inodes(id bigint PRIMARY KEY, value bytea NOT NULL);
        CREATE TABLE \(q).dirents(parent bytea NOT NULL, tag bytea NOT NULL, value bytea NOT NULL, PRIMARY KEY(parent, tag));
        CREATE TABLE \(q).chunks(file bigint NOT NULL, idx bigint NOT NULL, value bytea NOT NULL, PRIMARY KEY(file, idx));
        CREATE TABLE \(q).xattrs(inode bigint NOT NULL, tag bytea NOT NULL, value bytea NOT NULL, PRIMARY KEY(inode, tag));
        CREATE TABLE \(q).orphans(id bigint PRIMARY KEY);
        CREATE TABLE \(q).chunkmaps(file bigint NOT NULL, page bigint NOT NULL, value bytea NOT NULL, PRIMARY KEY(file, page));
        ALTER TABLE \(q).chunks ALTER COLUMN value SET STORAGE EXTERNAL;
        ALTER TABLE \(q).chunks SET (toast_tuple_target = 8160);
        ALTER TABLE \(q).chunkmaps ALTER COLUMN value SET STORAGE EXTERNAL;
        \(createLeases);
        \(createLocks);
        """
    }

    // The leases (PostgresLease): one row per mount (any number) or per fsck (alone); `expires` is the
    // server's clock, so machines need not agree. Containers made before several mounts were allowed
    // have a one-row `lease` table instead, left unused.
    var createLeases: String {
        "CREATE TABLE IF NOT EXISTS \(q).leases(holder text PRIMARY KEY, host text NOT NULL, pid integer NOT NULL, "
            + "machine text NOT NULL, purpose text NOT NULL, expires timestamptz NOT NULL)"
    }
    /// Taken by whoever adds a lease, so two takers decide one after the other (renewals wait for it briefly).
    var lockLeases: String { "LOCK TABLE \(q).leases IN SHARE ROW EXCLUSIVE MODE" }
    var leaseRows: String { "SELECT holder, host, pid, machine, purpose, expires > now() FROM \(q).leases ORDER BY holder" }
    var putLease: String {
        "INSERT INTO \(q).leases(holder, host, pid, machine, purpose, expires) VALUES ($1, $2, $3, $4, $5, now() + $6 * interval '1 second') "
            + "ON CONFLICT (holder) DO UPDATE SET expires = EXCLUDED.expires"
    }
    /// Live leases of mounts (this one's included), read at every group begin: one means a mount alone.
    var liveMounts: String { "SELECT count(*) FROM \(q).leases WHERE expires > now() AND purpose = 'mount'" }
    var renewLease: String { "UPDATE \(q).leases SET expires = now() + $2 * interval '1 second' WHERE holder = $1" }
    /// Renews the lease inside a commit, or fails the transaction (division by zero, 22012) when the
    /// row is gone (it lapsed and an fsck took the container): such a mount never commits again.
    var fenceLease: String {
        "WITH r AS (UPDATE \(q).leases SET expires = now() + $2 * interval '1 second' WHERE holder = $1 RETURNING 1) "
            + "SELECT 1 / (SELECT count(*)::int FROM r)"
    }
    var deleteLease: String { "DELETE FROM \(q).leases WHERE holder = $1" }

    // File locks shared by the mounts (PostgresLocks): plain numbers only (the inode's random id, the
    // holder's lease id, the kernel's lock owner, the range, the pid), each row tied to its holder's
    // lease. Made by the first mount that needs it on containers made before.
    var createLocks: String {
        "CREATE TABLE IF NOT EXISTS \(q).locks(inode bigint NOT NULL, kind integer NOT NULL, holder text NOT NULL, "
            + "owner bigint NOT NULL, type integer NOT NULL, start bigint NOT NULL, stop bigint NOT NULL, pid integer NOT NULL); "
            + "CREATE INDEX IF NOT EXISTS locks_inode ON \(q).locks(inode)"
    }
    /// Taken first in every lock transaction: the container's lock table decides one change at a time.
    /// Its own key space (`locksSpace`), so lock waits never hold up a commit. Waited for 5 s at most
    /// (the transaction's lock_timeout, set first): a lock request never holds a FUSE worker longer.
    var locksLock: String {
        "SELECT set_config('lock_timeout', '5s', true), pg_advisory_xact_lock(\(Self.locksSpace), hashtext($1))"
    }
    /// The advisory lock space of file-lock decisions ("COLK").
    static let locksSpace: Int32 = 0x434F_4C4B
    /// Rows whose holder has no live lease (a mount that died, or was cut off longer than its lease) go.
    var dropLapsedLocks: String {
        "DELETE FROM \(q).locks l WHERE l.inode = $1 AND NOT EXISTS "
            + "(SELECT 1 FROM \(q).leases e WHERE e.holder = l.holder AND e.expires > now())"
    }
    var locksOfInode: String {
        "SELECT l.holder, l.owner, l.type, l.start, l.stop, l.pid, coalesce(e.host, '') FROM \(q).locks l "
            + "LEFT JOIN \(q).leases e ON e.holder = l.holder WHERE l.inode = $1 AND l.kind = $2"
    }
    var deleteOwnerLocks: String { "DELETE FROM \(q).locks WHERE inode = $1 AND kind = $2 AND holder = $3 AND owner = $4" }
    var putLock: String {
        "INSERT INTO \(q).locks(inode, kind, holder, owner, type, start, stop, pid) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)"
    }
    var deleteHolderLocks: String { "DELETE FROM \(q).locks WHERE holder = $1" }

    // Several mounts at once (docs/FORMAT.md): the container's writer lock, taken first in every group
    // transaction (a transaction-level advisory lock, so a lost connection releases it), the sealed
    // state read under it, and the commit's notification to the other mounts.
    /// The writer lock, waited for `$2` at most (the transaction's lock_timeout, set first): between
    /// waits the waiter looks for a holder to end (`endLapsedWriter`).
    var writerLock: String { "SELECT set_config('lock_timeout', $2, true), pg_advisory_xact_lock(\(Self.lockSpace), hashtext($1))" }
    /// The writer lock when no other mount holds it or waits for it (false otherwise: that mount is
    /// asked to end its group first, `wantPrefix`).
    var tryWriterLock: String { "SELECT pg_try_advisory_xact_lock(\(Self.lockSpace), hashtext($1))" }
    /// The writer lock shared, waited for as `writerLock`: it waits for any group open on another mount
    /// (close-to-open), not for other mounts that only look.
    var writerLockShared: String {
        "SELECT set_config('lock_timeout', $2, true), pg_advisory_xact_lock_shared(\(Self.lockSpace), hashtext($1))"
    }
    /// What a writer session calls itself (`application_name`): its mount's lease holder, so a waiter can
    /// tell whose session holds the writer lock.
    static let writerPrefix = "coffer "
    static let nameSession = "SELECT set_config('application_name', $1, false)"
    /// Ends the session holding the writer lock (the backend's pid from pg_locks) when it is a mount's
    /// writer (`writerPrefix`) that has waited on its client for longer than `$2` (an interval: nothing
    /// sent, the group idle or a statement half sent, which the server would wait for without limit)
    /// and whose lease has lapsed: a machine stopped, suspended or cut off in the middle of a group. A
    /// healthy mount is never stalled that long (its groups end within a second) and renews its lease
    /// while it runs. Its group is lost as in a crash. The clock, not `now()`: a commit runs it inside its
    /// own transaction, whose `now()` stays at its start (`lockedState`). Only sessions this role may end: its own, or any
    /// with pg_signal_backend; another role's state is seen only with pg_read_all_stats.
    var endLapsedWriter: String { endLapsed(Self.lockSpace) }
    /// `endLapsedWriter` for the holder of the sole lock (a mount alone's listener, which looks at the
    /// lease table every second while it holds it): a machine stopped while mounted alone.
    var endLapsedSole: String { endLapsed(Self.soleSpace) }
    private func endLapsed(_ space: Int32) -> String {
        "SELECT count(*) FILTER (WHERE pg_terminate_backend(a.pid)) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
            + "WHERE l.locktype = 'advisory' AND l.granted AND l.classid = \(space)::oid AND l.objid = hashtext($1)::oid "
            + "AND l.objsubid = 2 AND a.datname = current_database() AND a.pid <> pg_backend_pid() "
            + "AND a.wait_event_type = 'Client' AND a.state_change < clock_timestamp() - $2::interval "
            + "AND (pg_has_role(a.usesysid, 'MEMBER') OR pg_has_role('pg_signal_backend', 'MEMBER')) "
            + "AND starts_with(a.application_name, '\(Self.writerPrefix)') AND NOT EXISTS (SELECT 1 FROM \(q).leases e "
            + "WHERE e.holder = substr(a.application_name, \(Self.writerPrefix.count + 1)) AND e.expires > clock_timestamp())"
    }
    var tryWriterLockShared: String { "SELECT pg_try_advisory_xact_lock_shared(\(Self.lockSpace), hashtext($1))" }
    /// A notification whose payload starts with this is a mount asking for the writer lock (the rest
    /// names it): a mount with a group open ends it soon (`PostgresListener`, `othersWaiting`).
    static let wantPrefix = "?"
    /// ... and this one, an open, opendir or failed lookup waiting for the lock shared (close-to-open):
    /// a busy holder ends its group after its slice for it, not only once it pauses. Holder ids are
    /// hex, so `?r` never starts a writer's ask; mounts of earlier versions take it for one.
    static let readerWantPrefix = "?r"
    var stateRow: String { "SELECT value FROM \(q).meta WHERE name = 'state'" }
    /// The state row read at the commit of an inode group, locked until its COMMIT: commits beside each other
    /// take turns on it, so each reads the generation the last one wrote and seals the next.
    var stateRowForUpdate: String { "SELECT value FROM \(q).meta WHERE name = 'state' FOR UPDATE" }

    // Inode groups (`GroupScope.inode`): the writer lock shared, and a lock on each inode the group changes,
    // keyed by container and inode (`$1` the schema, `$2` the inode's id), in a space of their own.
    private var inodeKey: String { "\(Self.inodeSpace), hashtext($1 || ':' || $2::text)" }
    /// Tried by a group that holds other inodes already (it must never wait while it does).
    var tryInodeLock: String { "SELECT pg_try_advisory_xact_lock(\(inodeKey))" }
    /// Waited for `$3` at most by a new group, which holds nothing else but the writer lock shared.
    var inodeLock: String { "SELECT set_config('lock_timeout', $3, true), pg_advisory_xact_lock(\(inodeKey))" }
    /// Shared: an open, a listing or a failed lookup waits for a group that changes the inode (close-to-open).
    var tryInodeLockShared: String { "SELECT pg_try_advisory_xact_lock_shared(\(inodeKey))" }
    var inodeLockShared: String { "SELECT set_config('lock_timeout', $3, true), pg_advisory_xact_lock_shared(\(inodeKey))" }
    /// The advisory lock space of inode locks ("COFI").
    static let inodeSpace: Int32 = 0x434F_4649
    static let notify = "SELECT pg_notify($1, $2)"

    /// A commit's notification: the committing mount's holder id, then (when they fit well inside
    /// PostgreSQL's 8000-byte payload) the inodes whose records it wrote, in hex, so the other mounts
    /// can drop what their kernels cached of them. The ids are the rows' own keys: the server sees
    /// which rows a commit writes anyway.
    static func commitPayload(holder: String, inodes: Set<UInt64>) -> String {
        guard !inodes.isEmpty, inodes.count <= maxNamedInodes else { return holder }
        return holder + " " + inodes.map { String($0, radix: 16) }.joined(separator: ",")
    }
    static let maxNamedInodes = 400

    /// A notification's sender, and the inodes it named (a commit's; nil when none were named or
    /// they do not parse: the receiver then cannot tell its kernel what changed, only reread).
    static func parsePayload(_ payload: String) -> (holder: String, inodes: [UInt64]?) {
        guard let space = payload.firstIndex(of: " ") else { return (payload, nil) }
        let ids = payload[payload.index(after: space)...].split(separator: ",").map { UInt64($0, radix: 16) }
        return (String(payload[..<space]), ids.contains(nil) || ids.isEmpty ? nil : ids.compactMap { $0 })
    }
    /// The advisory lock space of Coffer's writer locks ("COFF").
    static let lockSpace: Int32 = 0x434F_4646

    // A mount alone (docs/FORMAT.md, "A mount alone"): its listener holds the container's sole lock shared
    // (a session lock: a lost connection releases it) while no other mount has a lease row; a mount that
    // joins announces itself (`joinPrefix`), then takes the lock exclusively, so it goes on only once every
    // mount alone has heard it and let go.
    var trySoleLock: String { "SELECT pg_try_advisory_lock_shared(\(Self.soleSpace), hashtext($1))" }
    var soleUnlock: String { "SELECT pg_advisory_unlock_shared(\(Self.soleSpace), hashtext($1))" }
    var joinLock: String { "SELECT pg_advisory_lock(\(Self.soleSpace), hashtext($1))" }
    /// Lease rows of others, lapsed or not (a lapsed one may still commit after renewing it).
    var otherLeases: String { "SELECT count(*) FROM \(q).leases WHERE holder <> $1" }
    /// A notification whose payload starts with this is a mount joining (the rest names it).
    static let joinPrefix = "+"
    /// The advisory lock space of the sole lock ("COFS").
    static let soleSpace: Int32 = 0x434F_4653
    /// The channel a container's commits are announced on (at most 63 bytes: a longer schema name
    /// shares it with others of the same first 56 bytes, which costs them a needless reread only).
    var channel: String { "coffer:" + String(decoding: Array(schema.utf8.prefix(56)), as: UTF8.self) }

    // Header
    var header: String { "SELECT value FROM \(q).header WHERE id = 1" }
    var putHeader: String { "INSERT INTO \(q).header(id, value) VALUES (1, $1)" }
    var updateHeader: String { "UPDATE \(q).header SET value = $1 WHERE id = 1" }
    var replaceHeader: String { "UPDATE \(q).header SET value = $1 WHERE id = 1 AND value = $2" }
    static let schemaExists = "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)"

    // Schema rows
    var kinds: String { "SELECT kind, name, transformer FROM \(q).kinds" }
    var meta: String { "SELECT name, value FROM \(q).meta" }
    var putKind: String { "INSERT INTO \(q).kinds(kind, name, transformer) VALUES ($1, $2, $3)" }
    var putMeta: String { "INSERT INTO \(q).meta(name, value) VALUES ($1, $2) ON CONFLICT (name) DO UPDATE SET value = EXCLUDED.value" }

    // Inodes
    var inode: String { "SELECT value FROM \(q).inodes WHERE id = $1" }
    var inodesAmong: String { "SELECT id, value FROM \(q).inodes WHERE id = ANY($1)" }
    var putInode: String { "INSERT INTO \(q).inodes(id, value) VALUES ($1, $2) ON CONFLICT (id) DO UPDATE SET value = EXCLUDED.value" }
    var deleteInode: String { "DELETE FROM \(q).inodes WHERE id = $1" }

    // Directory entries
    var entry: String { "SELECT value FROM \(q).dirents WHERE parent = $1 AND tag = $2" }
    var replaceEntry: String {
        "INSERT INTO \(q).dirents(parent, tag, value) VALUES ($1, $2, $3) ON CONFLICT (parent, tag) DO UPDATE SET value = EXCLUDED.value"
    }
    var addEntry: String { "INSERT INTO \(q).dirents(parent, tag, value) VALUES ($1, $2, $3) ON CONFLICT (parent, tag) DO NOTHING" }
    var deleteEntry: String { "DELETE FROM \(q).dirents WHERE parent = $1 AND tag = $2" }
    var entryPage: String { "SELECT tag, value FROM \(q).dirents WHERE parent = $1 AND tag >= $2 ORDER BY tag LIMIT $3" }
    var hasEntries: String { "SELECT EXISTS (SELECT 1 FROM \(q).dirents WHERE parent = $1)" }

    // Chunks (ranges are read in pages of `PostgresBackend.chunkPage` rows)
    var chunkRange: String { "SELECT idx, value FROM \(q).chunks WHERE file = $1 AND idx BETWEEN $2 AND $3 ORDER BY idx LIMIT $4" }
    var putChunk: String {
        "INSERT INTO \(q).chunks(file, idx, value) VALUES ($1, $2, $3) ON CONFLICT (file, idx) DO UPDATE SET value = EXCLUDED.value"
    }
    var deleteChunksFrom: String { "DELETE FROM \(q).chunks WHERE file = $1 AND idx >= $2" }
    var deleteChunkRange: String { "DELETE FROM \(q).chunks WHERE file = $1 AND idx BETWEEN $2 AND $3" }
    var chunkIndices: String { "SELECT idx FROM \(q).chunks WHERE file = $1 AND idx BETWEEN $2 AND $3 ORDER BY idx" }
    var deleteChunk: String { "DELETE FROM \(q).chunks WHERE file = $1 AND idx = $2" }
    var deleteAllChunks: String { "DELETE FROM \(q).chunks WHERE file = $1" }
    var chunkSummaries: String { "SELECT file, count(*), max(idx) FROM \(q).chunks GROUP BY file" }

    // Chunk map pages
    var chunkMap: String { "SELECT value FROM \(q).chunkmaps WHERE file = $1 AND page = $2" }
    var putChunkMap: String {
        "INSERT INTO \(q).chunkmaps(file, page, value) VALUES ($1, $2, $3) ON CONFLICT (file, page) DO UPDATE SET value = EXCLUDED.value"
    }
    var deleteChunkMapsFrom: String { "DELETE FROM \(q).chunkmaps WHERE file = $1 AND page >= $2" }
    var deleteChunkMap: String { "DELETE FROM \(q).chunkmaps WHERE file = $1 AND page = $2" }
    var deleteAllChunkMaps: String { "DELETE FROM \(q).chunkmaps WHERE file = $1" }

    // Extended attributes
    var xattr: String { "SELECT value FROM \(q).xattrs WHERE inode = $1 AND tag = $2" }
    var xattrs: String { "SELECT tag, value FROM \(q).xattrs WHERE inode = $1 ORDER BY tag" }
    var putXattr: String {
        "INSERT INTO \(q).xattrs(inode, tag, value) VALUES ($1, $2, $3) ON CONFLICT (inode, tag) DO UPDATE SET value = EXCLUDED.value"
    }
    var deleteXattr: String { "DELETE FROM \(q).xattrs WHERE inode = $1 AND tag = $2" }
    var deleteXattrs: String { "DELETE FROM \(q).xattrs WHERE inode = $1" }

    // Orphans
    var addOrphan: String { "INSERT INTO \(q).orphans(id) VALUES ($1) ON CONFLICT (id) DO NOTHING" }
    var removeOrphan: String { "DELETE FROM \(q).orphans WHERE id = $1" }
    var orphans: String { "SELECT id FROM \(q).orphans" }

    // Whole-store scans
    var counts: String {
        "SELECT (SELECT count(*) FROM \(q).inodes), (SELECT count(*) FROM \(q).dirents), (SELECT count(*) FROM \(q).chunks), "
            + "(SELECT count(*) FROM \(q).xattrs), (SELECT count(*) FROM \(q).chunkmaps)"
    }
    var allInodes: String { "SELECT id, value FROM \(q).inodes" }
    var allEntries: String { "SELECT parent, tag, value FROM \(q).dirents" }
    var allXattrs: String { "SELECT inode, tag, value FROM \(q).xattrs" }
    var allChunkMaps: String { "SELECT file, page, value FROM \(q).chunkmaps" }
    static let size = """
        SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0)::bigint FROM pg_class c
        JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1 AND c.relkind = 'r'
        """
}
