import Foundation
import CofferTestSupport
import Testing

#if canImport(Glibc)
    import Glibc
#endif

// Issue 5, "Surviving faults": the daemon is SIGKILLed at random moments while a worker changes files
// through the mount; after `fusermount3 -uz` and a remount, everything the worker fsynced must be there,
// every readable file must hold a state the worker produced, and nothing may read as EIO (a torn or
// half-committed chunk fails authentication). The worker and the checker are python3 programs (below).

enum CrashScripts {
    /// What the worker and the checker share: every byte the worker writes is a function of
    /// (path, version) or (path, record), so the checker can tell a produced state from a torn one.
    static let common = #"""
        import os, sys, random, hashlib, json, struct, errno, time

        BS = 5000          # mid-file block: not a divisor of any chunk size, so blocks straddle chunks
        NB = 64            # blocks in the mid file (~320 KB, about ten 32 KiB chunks)

        def gen(tag, n):
            """Deterministic bytes for (tag, n): what the worker writes and the checker expects."""
            return random.Random(tag).randbytes(n)

        def small_content(path, v):
            n = random.Random('len:%s:%d' % (path, v)).choice([0, 100, 3000, 20000, 32768, 40000, 70000])
            return ('%s|%d|%d\n' % (path, v, n)).encode() + gen('s:%s:%d' % (path, v), n)

        def record_len(path, k):
            """Records of 1–45 KB for big.bin; log lines of 10–600 bytes for log.bin (they stay in the
            daemon's tail chunk buffer until the chunk is full or committed)."""
            if path.endswith('/log.bin'):
                return random.Random('alen:%s:%d' % (path, k)).randint(10, 600)
            return random.Random('alen:%s:%d' % (path, k)).randint(1000, 45000)

        def record(path, k):
            return gen('a:%s:%d' % (path, k), record_len(path, k))

        def block(path, b, v):
            return struct.pack('>QQ', b, v) + gen('m:%s:%d:%d' % (path, b, v), BS - 16)
        """#

    /// The worker: small files replaced whole through a temporary name and rename (like editors), appends
    /// to a big file in records of 1–45 KB (across 32 KiB chunks) and to a log in lines of 10–600 bytes, overwrites of runs of 5000-byte blocks
    /// in a middle file (straddling chunks), sparse writes and truncations of a third file, files unlinked
    /// while open, deletes, mkdirs,
    /// about a third of them fsynced, and now and then a pause long enough for the daemon to checkpoint.
    /// The journal, outside the mount, gets a line before each change ("sb", "ab", "mb", "tb", "db") and,
    /// only after fsync returned, the synced state ("ss" with the sha256, "as" with the length, "ms" with
    /// the block versions, "ts" with the change, "ds", "dir"). Runs until the mount goes away.
    static let worker =
        common + "\n" + #"""
            # Worker: changes files under MNT/ROUND in a loop until the mount goes away. Journal lines (JSON) go to a
            # file outside the mount: "...b" lines before a change starts, "...s" lines only after fsync returned.
            mnt, rnd, jpath, seed, stop = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]

            class LostWriteback(Exception):
                """Under the kernel's writeback cache, a WRITE the kernel had in flight when the daemon was
                killed fails, and the kernel reports the lost write-back as EIO at the file's next close or
                fsync (as for any failed write-back). That is unsynced data going down with the daemon, not
                a damaged file. Raised instead of that EIO, only from close and fsync and only once the mount
                has lost its daemon (a new request gets ENOTCONN); any other EIO stays an OSError."""

            def lost_daemon():
                try:
                    os.statvfs(mnt)
                    return False
                except OSError as e:
                    return e.errno in (errno.ENOTCONN, errno.ECONNABORTED)

            def telling_lost_writeback(call):
                def checked(fd):
                    try:
                        return call(fd)
                    except OSError as e:
                        if e.errno == errno.EIO and lost_daemon():
                            raise LostWriteback('%s: write-back lost with the daemon' % call.__name__) from None
                        raise
                return checked
            os.close, os.fsync = telling_lost_writeback(os.close), telling_lost_writeback(os.fsync)

            R = random.Random(seed)
            J = os.open(jpath, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

            def log(*x):
                os.write(J, (json.dumps(list(x)) + '\n').encode())

            def P(rel):
                return os.path.join(mnt, rel)

            def write_all(fd, data, offset=None):
                done = 0
                while done < len(data):
                    chunk = data[done:]
                    n = os.write(fd, chunk) if offset is None else os.pwrite(fd, chunk, offset + done)
                    done += n

            def fsync_path(rel):
                fd = os.open(P(rel) if rel else mnt, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)

            def mkdir(rel):
                os.mkdir(P(rel))
                fsync_path(os.path.dirname(rel))
                log('dir', rel)

            def put_small(rel, v, sync):
                """Like an editor: whole new content to a temporary name, then rename over the file."""
                data = small_content(rel, v)
                log('sb', rel, v)
                tmp = rel + '.tmp'
                fd = os.open(P(tmp), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                try:
                    cut = R.randint(0, len(data))
                    write_all(fd, data[:cut])
                    write_all(fd, data[cut:])
                    if sync:
                        os.fsync(fd)
                finally:
                    os.close(fd)
                os.rename(P(tmp), P(rel))
                if sync:
                    fsync_path(os.path.dirname(rel))
                    log('ss', rel, v, hashlib.sha256(data).hexdigest())

            dirs = [rnd + '/d%d' % i for i in range(3)]
            big, logf, mid = rnd + '/big.bin', rnd + '/log.bin', rnd + '/mid.bin'
            smalls = {}      # live small files: path -> version
            serial = 0
            mkdir(rnd)
            for d in dirs:
                mkdir(d)
            appended = {}    # append files: path -> [length, records]
            for path in (big, logf):
                fd = os.open(P(path), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                os.fsync(fd)
                os.close(fd)
                fsync_path(rnd)
                log('as', path, 0)
                appended[path] = [0, 0]
            versions = [0] * NB
            tmp = mid + '.tmp'
            fd = os.open(P(tmp), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            write_all(fd, b''.join(block(mid, b, 0) for b in range(NB)))
            os.fsync(fd)
            os.close(fd)
            os.rename(P(tmp), P(mid))
            fsync_path(rnd)
            log('ms', mid, versions)
            trunc = rnd + '/trunc.bin'
            fd = os.open(P(trunc), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            os.fsync(fd)
            os.close(fd)
            fsync_path(rnd)
            log('ts', trunc, 0)
            log('setup')
            held = []       # descriptors of files unlinked while open
            op = 0
            while True:
                op += 1
                if os.path.exists(stop):
                    # Asked to stop (between changes, not killed in one: a writer killed inside write()
                    # may have the kernel send the part up to a page boundary, a state of its own).
                    sys.exit(0)
                if R.random() < 0.03:
                    # Quiet for a while: the daemon checkpoints the WAL after 1 s without writes, so some
                    # kills land in or after a checkpoint.
                    time.sleep(R.uniform(1.0, 2.0))
                x = R.random()
                sync = R.random() < 0.35
                if x < 0.28 or not smalls:
                    serial += 1
                    rel = R.choice(dirs) + '/s%d' % serial
                    put_small(rel, 1, sync)
                    smalls[rel] = 1
                elif x < 0.50:
                    rel = R.choice(sorted(smalls))
                    smalls[rel] += 1
                    put_small(rel, smalls[rel], sync)
                elif x < 0.55:
                    rel = R.choice(sorted(smalls))
                    del smalls[rel]
                    log('db', rel)
                    os.unlink(P(rel))
                    if sync:
                        fsync_path(os.path.dirname(rel))
                        log('ds', rel)
                elif x < 0.75 and appended[big][0] < (3 << 20):
                    # One big record, or a burst of log lines through one descriptor.
                    path = big if R.random() < 0.5 else logf
                    fd = os.open(P(path), os.O_WRONLY | os.O_APPEND)
                    try:
                        for _ in range(1 if path == big else R.randint(1, 40)):
                            length, records = appended[path]
                            data = record(path, records)
                            log('ab', path, records)
                            write_all(fd, data)
                            appended[path] = [length + len(data), records + 1]
                        if sync:
                            os.fsync(fd)
                    finally:
                        os.close(fd)
                    if sync:
                        log('as', path, appended[path][0])
                elif x < 0.87:
                    s = R.randrange(NB)
                    c = NB if R.random() < 0.05 else R.randint(1, 12)
                    c = min(c, NB - s)
                    v = op
                    log('mb', mid, s, c, v)
                    fd = os.open(P(mid), os.O_WRONLY)
                    try:
                        write_all(fd, b''.join(block(mid, b, v) for b in range(s, s + c)), s * BS)
                        if sync:
                            os.fsync(fd)
                    finally:
                        os.close(fd)
                    versions[s:s + c] = [v] * c
                    if sync:
                        log('ms', mid, versions)
                elif x < 0.95:
                    # Sparse writes and truncations (shrinking trims chunks, growing leaves holes).
                    fd = os.open(P(trunc), os.O_WRONLY)
                    try:
                        if R.random() < 0.5:
                            off, n = R.randrange(400000), R.randint(1, 40000)
                            log('tb', trunc, op, 'w', off, n)
                            write_all(fd, gen('t:%s:%d' % (trunc, op), n), off)
                        else:
                            n = R.randrange(400000)
                            log('tb', trunc, op, 't', n, 0)
                            os.ftruncate(fd, n)
                        if sync:
                            os.fsync(fd)
                    finally:
                        os.close(fd)
                    if sync:
                        log('ts', trunc, op)
                elif x < 0.98:
                    # Files unlinked while open (orphans: removed at the last close or the next mount).
                    if held and R.random() < 0.4:
                        fd = held.pop(R.randrange(len(held)))
                        write_all(fd, gen('o:%d' % op, 1000))
                        os.close(fd)
                    else:
                        rel = rnd + '/o%d' % op
                        fd = os.open(P(rel), os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
                        held.append(fd)
                        write_all(fd, gen('o:%s' % rel, R.randint(1, 100000)))
                        os.unlink(P(rel))
                        if sync:
                            os.fsync(fd)
                else:
                    d = rnd + '/x%d' % op
                    mkdir(d)
                    dirs.append(d)
            """#

    /// The checker: reads every file and lists every directory of the given rounds, and holds them
    /// against the journals; a round checked before must not have changed since. Prints JSON.
    static let checker =
        common + "\n" + #"""
            # Checker: reads everything under the rounds named in argv[3] and holds it against the journals.
            mnt, jdir, rounds, snap_path = sys.argv[1], sys.argv[2], sys.argv[3].split(','), sys.argv[4]
            # Without the writeback cache (a PostgreSQL mount) the kernel sends a write(2) that starts inside a
            # page as two requests, its first page alone and then the rest: a kill between them leaves the first.
            split_writes = len(sys.argv) > 5 and sys.argv[5] == 'split'
            problems, stats = [], {'files': 0, 'bytes': 0, 'dirs': 0, 'syncedSmall': 0, 'syncedBig': 0, 'syncedLog': 0, 'syncedMidBlocks': 0, 'syncedTrunc': 0, 'deletedSynced': 0}
            try:
                with open(snap_path) as f:
                    snapshot = json.load(f)
            except FileNotFoundError:
                snapshot = {}

            def err(e):
                return errno.errorcode.get(e.errno, str(e.errno))

            for rnd in rounds:
                contents, dirs_seen = {}, set()
                def onerror(e):
                    problems.append('%s: list %s: %s' % (rnd, e.filename, err(e)))
                for dirpath, dirnames, filenames in os.walk(os.path.join(mnt, rnd), onerror=onerror):
                    rel_dir = os.path.relpath(dirpath, mnt)
                    dirs_seen.add(rel_dir)
                    stats['dirs'] += 1
                    for name in filenames:
                        rel = rel_dir + '/' + name
                        try:
                            with open(os.path.join(mnt, rel), 'rb') as f:
                                contents[rel] = f.read()
                            stats['files'] += 1
                            stats['bytes'] += len(contents[rel])
                        except OSError as e:
                            problems.append('%s: read %s: %s' % (rnd, rel, err(e)))
                entries = []
                with open(os.path.join(jdir, rnd + '.jsonl')) as f:
                    for line in f:
                        try:
                            entries.append(json.loads(line))
                        except ValueError:
                            pass    # a line cut short: the worker was killed while writing it
                if ['setup'] not in entries:
                    # Killed before its files were all made: only what was synced must be there.
                    pass
                small = {}
                appends = {rnd + '/big.bin': {'synced': 0, 'begun': -1, 'made': False},
                           rnd + '/log.bin': {'synced': 0, 'begun': -1, 'made': False}}
                mid = {'synced': [0] * NB, 'begun': [{0} for _ in range(NB)], 'made': False}
                dirs = set()
                for e in entries:
                    k = e[0]
                    if k == 'dir':
                        dirs.add(e[1])
                    elif k in ('sb', 'ss', 'db', 'ds'):
                        s = small.setdefault(e[1], {'begun': 0, 'synced': 0, 'db': False, 'ds': False})
                        if k == 'sb': s['begun'] = max(s['begun'], e[2])
                        if k == 'ss': s['synced'] = max(s['synced'], e[2])
                        if k == 'db': s['db'] = True
                        if k == 'ds': s['ds'] = True
                    elif k == 'ab' and e[1] in appends:
                        appends[e[1]]['begun'] = max(appends[e[1]]['begun'], e[2])
                    elif k == 'as' and e[1] in appends:
                        a = appends[e[1]]
                        a['synced'] = max(a['synced'], e[2]); a['made'] = True
                    elif k == 'mb':
                        for b in range(e[2], e[2] + e[3]):
                            mid['begun'][b].add(e[4])
                    elif k == 'ms':
                        mid['synced'] = e[2]; mid['made'] = True; mid['path'] = e[1]
                for d in dirs:
                    if d not in dirs_seen:
                        problems.append('%s: directory %s made and synced, missing' % (rnd, d))
                known = set()
                for path, s in small.items():
                    known.add(path)
                    c = contents.get(path)
                    if s['ds']:
                        stats['deletedSynced'] += 1
                        if c is not None:
                            problems.append('%s: %s deleted and synced, still there' % (rnd, path))
                        continue
                    if c is None:
                        if s['synced'] and not s['db']:
                            problems.append('%s: %s synced at version %d, missing' % (rnd, path, s['synced']))
                        continue
                    head, _, _ = c.partition(b'\n')
                    parts = head.split(b'|')
                    try:
                        v = int(parts[1]) if len(parts) == 3 and parts[0].decode() == path else -1
                    except ValueError:
                        v = -1
                    if v < 1 or v > s['begun'] or c != small_content(path, v):
                        problems.append('%s: %s holds no complete version (header %r, %d bytes; begun up to %d, synced %d)' % (rnd, path, head[:80], len(c), s['begun'], s['synced']))
                    elif v < s['synced']:
                        problems.append('%s: %s went back to version %d after version %d was synced' % (rnd, path, v, s['synced']))
                    elif s['synced']:
                        stats['syncedSmall'] += 1
                # Append files: a prefix of everything appended, at least as long as the synced length.
                for p, a in appends.items():
                    known.add(p)
                    c = contents.get(p)
                    if c is None:
                        if a['made']:
                            problems.append('%s: %s (synced) missing' % (rnd, p))
                        continue
                    expected, k = bytearray(), 0
                    while len(expected) < len(c) and k <= a['begun']:
                        expected += record(p, k); k += 1
                    if len(c) < a['synced']:
                        problems.append('%s: %s is %d bytes, %d were synced' % (rnd, p, len(c), a['synced']))
                    elif c != expected[:len(c)]:
                        at = next((i for i in range(min(len(c), len(expected))) if c[i] != expected[i]), min(len(c), len(expected)))
                        problems.append('%s: %s (%d bytes) differs from what was appended at byte %d (chunk %d)' % (rnd, p, len(c), at, at // 32768))
                    else:
                        stats['syncedBig' if p.endswith('/big.bin') else 'syncedLog'] += a['synced']
                p = rnd + '/mid.bin'; known.add(p)
                c = contents.get(p)
                if c is not None or mid['made']:
                    if c is None or len(c) != NB * BS:
                        problems.append('%s: %s missing or resized (%s bytes)' % (rnd, p, None if c is None else len(c)))
                    else:
                        for b in range(NB):
                            piece = c[b * BS:(b + 1) * BS]
                            bb, v = struct.unpack('>QQ', piece[:16])
                            if bb != b or v not in mid['begun'][b] or piece != block(p, b, v):
                                problems.append('%s: %s block %d (bytes %d..%d) holds no complete version (header %d/%d)' % (rnd, p, b, b * BS, (b + 1) * BS, bb, v))
                            elif v < mid['synced'][b]:
                                problems.append('%s: %s block %d went back to version %d after %d was synced' % (rnd, p, b, v, mid['synced'][b]))
                            else:
                                stats['syncedMidBlocks'] += 1
                # trunc.bin: each write or truncation is one request (or two: split_writes), so the file must hold
                # the state after one of them, no earlier than the last one synced.
                p = rnd + '/trunc.bin'; known.add(p)
                c = contents.get(p)
                synced_op = max((e[2] for e in entries if e[0] == 'ts'), default=None)
                if c is None:
                    if synced_op is not None:
                        problems.append('%s: %s (synced) missing' % (rnd, p))
                else:
                    state = bytearray()
                    states = [(0, hashlib.sha256(state).digest())]
                    for e in entries:
                        if e[0] != 'tb':
                            continue
                        op, kind, a, n = e[2], e[3], e[4], e[5]
                        if kind == 'w':
                            if len(state) < a:
                                state.extend(bytes(a - len(state)))
                            first = (a // 4096 + 1) * 4096 - a
                            if split_writes and a % 4096 and n > first:
                                part = bytearray(state)
                                part[a:a + first] = gen('t:%s:%d' % (p, op), n)[:first]
                                states.append((op - 0.5, hashlib.sha256(part).digest()))
                            state[a:a + n] = gen('t:%s:%d' % (p, op), n)
                        elif a < len(state):
                            del state[a:]
                        else:
                            state.extend(bytes(a - len(state)))
                        states.append((op, hashlib.sha256(state).digest()))
                    h = hashlib.sha256(c).digest()
                    matching = [op for op, d in states if d == h]
                    if not matching:
                        problems.append('%s: %s (%d bytes) holds no state the worker produced (%d changes)' % (rnd, p, len(c), len(states) - 1))
                    elif synced_op is not None and max(matching) < synced_op:
                        problems.append('%s: %s went back to the state after change %d, change %d was synced' % (rnd, p, max(matching), synced_op))
                    elif synced_op is not None:
                        stats['syncedTrunc'] += 1
                for path in contents:
                    # o* files: made to be unlinked while open; one may be caught before its unlink.
                    if path not in known and not path.endswith('.tmp') and not os.path.basename(path).startswith('o'):
                        problems.append('%s: unexpected file %s' % (rnd, path))
                digest = {p: hashlib.sha256(c).hexdigest() for p, c in contents.items()}
                if rnd in snapshot and snapshot[rnd] != digest:
                    changed = sorted(set(snapshot[rnd]) ^ set(digest)) + sorted(p for p in digest if p in snapshot[rnd] and snapshot[rnd][p] != digest[p])
                    problems.append('%s: changed since it was last checked: %s' % (rnd, changed[:10]))
                snapshot[rnd] = digest
            # The whole mount, for the entity counts of `coffer info`: the root, one inode and one entry per
            # name (no hard links are made), and ceil(st_blocks * 512 / 32 KiB) chunks per regular file.
            stats['allInodes'], stats['allEntries'], stats['allChunks'] = 1, 0, 0
            for dirpath, dirnames, filenames in os.walk(mnt):
                for name in dirnames + filenames:
                    st = os.lstat(os.path.join(dirpath, name))
                    stats['allInodes'] += 1
                    stats['allEntries'] += 1
                    if (st.st_mode & 0o170000) == 0o100000:
                        stats['allChunks'] += -(-st.st_blocks * 512 // 32768)
            with open(snap_path, 'w') as f:
                json.dump(snapshot, f)
            print(json.dumps({'problems': problems, 'stats': stats}))
            """#
}

@Suite(
    "Crash safety: SIGKILL while writing",
    .enabled(if: E2E.fuseAvailable, "/dev/fuse is not usable"),
    .enabled(if: E2E.python != nil, "python3 is needed for the worker and the checker"),
    .enabled(if: E2E.which("sqlite3") != nil, "sqlite3 is needed for PRAGMA integrity_check"))
struct CrashTests {
    /// Rounds (COFFER_CRASH_ROUNDS, default 30) of: worker running, SIGKILL of the daemon after a random
    /// delay (every fourth round: a few milliseconds into an unmount), lazy unmount, integrity check and
    /// `coffer fsck` of a copy of the crashed store, remount, check.
    @Test func sigkillLoopKeepsEverythingFsynced() throws {
        let env = ProcessInfo.processInfo.environment
        let rounds = env["COFFER_CRASH_ROUNDS"].flatMap { Int($0) } ?? 30
        let seed = env["COFFER_CRASH_SEED"].flatMap { UInt64($0) } ?? UInt64.random(in: 1...999_999_999)
        print("CrashTests: seed \(seed), \(rounds) rounds (COFFER_CRASH_SEED=\(seed) replays the kill times and the workers)")
        var rng = SplitMix64(seed: seed)
        let started = Date()
        let sb = try Sandbox("crash")
        defer { sb.cleanup() }
        let journals = sb.root + "/journals", snapshot = sb.root + "/snapshot.json"
        try #require(mkdir(journals, 0o700) == 0)
        try sb.initAndMount()
        var names: [String] = []
        var killsInUnmount = 0
        var lostWritebacks = 0

        for round in 0..<rounds {
            let name = String(format: "r%02d", round)
            names.append(name)
            let journal = journals + "/\(name).jsonl"
            let workerSeed = rng.next() >> 33
            let delay = Double(rng.next() % 2500) / 1000
            let context = "round \(round) (seed \(seed), kill \(delay) s after setup)"
            let stop = journals + "/\(name).stop"
            let worker = try Child(E2E.python ?? "/usr/bin/python3", ["-c", CrashScripts.worker, sb.mnt, name, journal, "\(workerSeed)", stop])
            defer {
                worker.spawned.signal(SIGKILL)
                worker.stop()
            }
            let setUp = E2E.wait(30) { E2E.readText(journal)?.contains("[\"setup\"]") == true || !worker.spawned.isRunning }
            usleep(useconds_t(delay * 1_000_000))
            let running = worker.spawned.isRunning
            try #require(setUp && running, "\(context): the worker stopped before the kill (an error while the daemon was alive): \(worker.stderr)")

            let pid = try #require(E2E.daemonPid(container: sb.container), "\(context): no daemon holds the container lock")
            try #require(E2E.cmdline(pid).contains(sb.container), "\(context): pid \(pid) holding the lock is not our daemon")
            let unmountDelay = useconds_t(rng.next() % 30_000)
            if round % 4 == 3 {
                // Every fourth round the kill lands in the unmount: the final commit, the TRUNCATE
                // checkpoint, the close. The worker is stopped first so the mount is not busy.
                try E2E.write(stop, "stop")
                let stopped = worker.waitForExit(30)
                #expect(stopped == 0, "\(context): the worker did not stop cleanly: \(worker.stderr)")
                let unmount = try Child("/bin/fusermount3", ["-u", sb.mnt])
                usleep(unmountDelay)
                let alive = E2E.isAlive(pid)
                #expect(kill(pid, SIGKILL) == 0 || !alive)
                if alive { killsInUnmount += 1 }
                _ = unmount.waitForExit(30)
                unmount.stop()
            } else {
                #expect(kill(pid, SIGKILL) == 0)
            }
            let died = E2E.wait(10) { !E2E.isAlive(pid) }
            #expect(died, "\(context): the daemon survived SIGKILL")
            // The worker has nothing left to do (it may be sleeping): stop it, then see what it met before.
            worker.spawned.signal(SIGKILL)
            _ = worker.waitForExit(30)
            let workerErrors = worker.stderr
            // EIO from a close or fsync once the daemon is gone is the kernel reporting lost write-back
            // (the worker raises LostWriteback for it); any other EIO is a damaged file.
            #expect(!workerErrors.contains("[Errno 5]"), "\(context): the worker got EIO: \(workerErrors)")
            if workerErrors.contains("LostWriteback") { lostWritebacks += 1 }
            if E2E.isMounted(sb.mnt) {
                let z = E2E.run("/bin/fusermount3", ["-uz", sb.mnt])
                #expect(z.ok, "\(context): \(z)")
            }
            try #require(!E2E.isMounted(sb.mnt), "\(context): still mounted after fusermount3 -uz")

            // The crashed store as the next mount finds it (WAL and all), checked on a copy so the
            // remount still does its own recovery. A PostgreSQL container has no local recovery (the
            // server did its own): fsck checks it in place (the killed daemon's lease is taken over:
            // its pid is gone), and the server's page-level integrity is the server's.
            let copy = sb.root + "/copy"
            if sb.isDirectoryContainer {
                E2E.run("/bin/rm", ["-rf", copy])
                let cp = E2E.run("/bin/cp", ["-a", sb.container, copy])
                try #require(cp.ok, "\(cp)")
                let integrity = E2E.run("/usr/bin/sqlite3", [copy + "/store.db", "PRAGMA integrity_check"])
                #expect(integrity.ok && integrity.stdout.trimmingCharacters(in: .whitespacesAndNewlines) == "ok", "\(context): \(integrity)")
            }
            // fsck on the crashed store: clean (status 0), orphans of the killed session included.
            let fsck = E2E.coffer(["fsck", sb.isDirectoryContainer ? copy : sb.container, "--passfile", sb.passfile], timeout: 120)
            #expect(fsck.ok, "\(context): coffer fsck of the crashed store: \(fsck)")

            let m = sb.mount()
            try #require(m.ok, "\(context): the store does not mount after SIGKILL: \(m)")
            // This round and the one before every time; all rounds every fifth round.
            let check = round % 5 == 4 ? names : Array(names.suffix(2))
            let result = try runChecker(sb: sb, journals: journals, snapshot: snapshot, rounds: check, context: context)
            #expect(result.problems.isEmpty, "\(context): \(result.problems.count) problem(s): \(result.problems.prefix(20).joined(separator: "\n"))")
            // Nothing leaked: no inode, entry or chunk the names do not account for (orphans of the
            // killed session are removed at mount; deleted and truncated files keep no chunk rows).
            let counts = try storeCounts(sb: sb, context: context)
            let seen = [result.stats["allInodes", default: -1], result.stats["allEntries", default: -1], result.stats["allChunks", default: -1]]
            #expect(counts == seen, "\(context): the store holds \(counts) inodes, entries, chunks; the mount shows \(seen)")
            if !result.problems.isEmpty || counts != seen {
                // Evidence for a bug report: the crashed container as the remount found it, and the journals.
                let keep = "/tmp/coffer-crash-\(seed)-\(name)"
                E2E.run("/bin/rm", ["-rf", keep])
                let saved = E2E.sh(
                    "mkdir -p '\(keep)' && cp -a '\(copy)' '\(keep)/container' && cp -a '\(journals)' '\(keep)/journals' && cp '\(sb.passfile)' '\(keep)/pass'"
                )
                print("CrashTests: \(context): crashed container and journals kept in \(keep) (\(saved.ok ? "ok" : saved.description))")
                break
            }
        }

        // A clean unmount of the last recovered state: integrity, fsck, and every round once more.
        let u = sb.unmount()
        try #require(u.ok, "\(u)")
        if sb.isDirectoryContainer {
            let integrity = E2E.run("/usr/bin/sqlite3", [sb.container + "/store.db", "PRAGMA integrity_check"])
            #expect(integrity.stdout.trimmingCharacters(in: .whitespacesAndNewlines) == "ok", "\(integrity)")
        }
        let fsck = E2E.coffer(["fsck", sb.container, "--passfile", sb.passfile], timeout: 120)
        #expect(fsck.ok, "coffer fsck after the last round: \(fsck)")
        try #require(sb.mount().ok)
        let final = try runChecker(sb: sb, journals: journals, snapshot: snapshot, rounds: names, context: "final check")
        #expect(final.problems.isEmpty, "final check: \(final.problems.prefix(20).joined(separator: "\n"))")
        // The test proved something: fsynced files of every kind were there to check.
        #expect(final.stats["syncedSmall", default: 0] > rounds, "too few fsynced small files checked: \(final.stats)")
        #expect(final.stats["syncedBig", default: 0] > 0, "no fsynced appends checked: \(final.stats)")
        #expect(final.stats["syncedLog", default: 0] > 0, "no fsynced log lines checked: \(final.stats)")
        #expect(final.stats["syncedMidBlocks", default: 0] >= 64 * rounds, "mid files missing: \(final.stats)")
        #expect(final.stats["syncedTrunc", default: 0] >= rounds, "truncated files missing: \(final.stats)")
        #expect(sb.unmount().ok)
        print(
            "CrashTests: \(names.count) rounds in \(Int(Date().timeIntervalSince(started))) s, seed \(seed); \(killsInUnmount) kills during an unmount; \(lostWritebacks) lost write-backs reported at close/fsync after a kill; coffer fsck clean after every crash; final check: \(final.stats)"
        )
    }

    struct CheckResult {
        let problems: [String]
        let stats: [String: Int]
    }

    /// Inodes, directory entries and content chunks in the store, from `coffer info` between an unmount
    /// and a mount (the daemon holds the store for itself while mounted).
    func storeCounts(sb: Sandbox, context: String) throws -> [Int] {
        let u = sb.unmount()
        try #require(u.ok, "\(context): \(u)")
        let info = E2E.coffer(["info", sb.container, "--passfile", sb.passfile])
        let m = sb.mount()
        try #require(m.ok, "\(context): \(m)")
        try #require(info.ok, "\(context): \(info)")
        let line = try #require(info.stdout.split(separator: "\n").first { $0.hasPrefix("Entities:") }, "\(context): \(info)")
        // "Entities:       4 inodes, 3 directory entries, 5 content chunks, 0 xattrs"
        let numbers = line.dropFirst("Entities:".count).split(separator: ",").compactMap { part in
            Int(part.split(separator: " ").first ?? "")
        }
        try #require(numbers.count >= 3, "\(context): \(line)")
        return Array(numbers.prefix(3))
    }

    func runChecker(sb: Sandbox, journals: String, snapshot: String, rounds: [String], context: String) throws -> CheckResult {
        let split = sb.isDirectoryContainer ? [] : ["split"]  // PostgreSQL mounts run without the writeback cache
        let r = E2E.py(CrashScripts.checker, [sb.mnt, journals, rounds.joined(separator: ","), snapshot] + split, timeout: 300)
        try #require(r.ok, "\(context): the checker failed: \(r)")
        let line = r.stdout.split(separator: "\n").last.map(String.init) ?? ""
        let object = try JSONSerialization.jsonObject(with: Data(line.utf8))
        let json = try #require(object as? [String: Any], "\(context): checker output \(line)")
        let problems = try #require(json["problems"] as? [String], "\(context): checker output \(line)")
        let stats = try #require(json["stats"] as? [String: Int], "\(context): checker output \(line)")
        return CheckResult(problems: problems, stats: stats)
    }
}

/// Issue 5: a busy mountpoint is reported, not forced (MountTests), unless `--lazy` is asked: then the
/// mount is detached at once, the process still inside keeps working, and the daemon commits what it
/// wrote and ends when it lets go.
@Suite(
    "Busy unmount: --lazy",
    .enabled(if: E2E.fuseAvailable, "/dev/fuse is not usable"),
    .enabled(if: E2E.python != nil, "python3 is needed for the process holding the mount"))
struct LazyUnmountTests {
    @Test(arguments: ["-z", "--lazy"])
    func lazyUnmountDetachesABusyMountAndCommitsOnRelease(flag: String) throws {
        let sb = try Sandbox("lazy")
        defer { sb.cleanup() }
        try sb.initAndMount()
        try E2E.write(sb.mnt + "/before.txt", "before")
        let daemon = try #require(E2E.daemonPid(container: sb.container))
        try #require(E2E.cmdline(daemon).contains(sb.container), "lock pid is not our daemon")
        let trigger = sb.root + "/go"
        // Sits in the mount until the trigger appears, then writes through its working directory.
        let holder = try Child(
            E2E.python ?? "/usr/bin/python3",
            [
                "-c",
                """
                import os, sys, time
                os.chdir(sys.argv[1])
                while not os.path.exists(sys.argv[2]):
                    time.sleep(0.02)
                with open('late.txt', 'w') as f:
                    f.write('written after the detach')
                print(sorted(os.listdir('.')))
                """, sb.mnt, trigger
            ])
        defer {
            holder.spawned.signal(SIGKILL)
            holder.stop()
        }
        let inside = E2E.wait(10) { (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/\(holder.pid)/cwd")) == sb.mnt }
        try #require(inside, "the holder did not enter the mount")

        let u = sb.unmount()
        #expect(u.status != 0 && u.stderr.contains("busy"), "without --lazy a busy mount is refused: \(u)")
        let lazy = E2E.coffer(["unmount", flag, sb.mnt], timeout: 30)
        #expect(lazy.ok, "\(lazy)")
        #expect(!E2E.isMounted(sb.mnt), "still in /proc/mounts after a lazy unmount")
        #expect(E2E.isAlive(daemon), "the daemon must serve the holder until it lets go")

        try E2E.write(trigger, "go")
        let status = holder.waitForExit(30)
        #expect(status == 0, "the holder could not work in the detached mount: \(holder.stderr)")
        let ended = E2E.wait(30) { !E2E.isAlive(daemon) }
        #expect(ended, "the daemon did not end once the last user let go")

        let m = sb.mount()
        try #require(m.ok, "\(m)")
        #expect(E2E.readText(sb.mnt + "/before.txt") == "before")
        #expect(E2E.readText(sb.mnt + "/late.txt") == "written after the detach", "what the holder wrote after the detach was not committed")
        #expect(sb.unmount().ok)
    }
}

/// Issue 5: both faults at once. The daemon is killed right after the disk filled up, and the disk is
/// still full (not one byte free) when the container is mounted again: the store must open and recover,
/// synced data must read back, and deleting must make room to write again.
@Suite(
    "Crash safety: killed on a full disk",
    .enabled(if: E2E.fuseAvailable, "/dev/fuse is not usable"),
    .enabled(if: E2E.isRoot, "a tmpfs of fixed size needs root"),
    .enabled(if: !TestEngine.isPostgres, "a full local disk under the SQLite store; a PostgreSQL server's disk is not the client's"))
struct KilledOnAFullDiskTests {
    @Test func remountOnAFullDiskAfterSIGKILL() throws {
        let sb = try Sandbox("fullkill")
        defer { sb.cleanup() }
        let disk = try sb.smallDisk("24m")
        let container = disk + "/c"
        try #require(sb.initContainer(container: container).ok)
        try #require(sb.mount(container: container).ok)
        let keep = E2E.randomBytes(3_000_000)
        try E2E.write(sb.mnt + "/keep.bin", keep)
        #expect(E2E.sh("sync '\(sb.mnt)/keep.bin'").ok)
        let fill = E2E.sh("dd if=/dev/urandom of='\(sb.mnt)/fill' bs=1M count=100 conv=fsync")
        #expect(fill.stderr.contains("No space left"), "the writer is told ENOSPC: \(fill)")

        let pid = try #require(E2E.daemonPid(container: container))
        try #require(E2E.cmdline(pid).contains(container), "lock pid is not our daemon")
        #expect(kill(pid, SIGKILL) == 0)
        let died = E2E.wait(10) { !E2E.isAlive(pid) }
        #expect(died)
        #expect(E2E.run("/bin/fusermount3", ["-uz", sb.mnt]).ok)
        // Whatever room is left (the released reserve, slack) goes to another file on the same disk.
        _ = E2E.sh("dd if=/dev/zero of='\(disk)/hog' bs=4k")
        var vfs = statvfs()
        try #require(statvfs(disk, &vfs) == 0)
        try #require(vfs.f_bavail == 0, "the disk still has \(vfs.f_bavail) free blocks")

        let m = sb.mount(container: container)
        try #require(m.ok, "the killed container does not mount on a full disk: \(m)")
        #expect(E2E.read(sb.mnt + "/keep.bin") == keep, "synced data lost or damaged")
        let list = E2E.sh("ls -la '\(sb.mnt)'")
        #expect(list.ok, "\(list)")
        let rm = E2E.sh("rm -f '\(sb.mnt)/fill'")
        #expect(rm.ok, "deleting on a full disk: \(rm)")
        let again = E2E.sh("dd if=/dev/urandom of='\(sb.mnt)/after' bs=64k count=4 conv=fsync")
        #expect(again.ok, "writing after deleting on a full disk: \(again)")
        let u = sb.unmount()
        #expect(u.ok, "\(u)")

        unlink(disk + "/hog")
        try #require(sb.mount(container: container).ok)
        #expect(E2E.read(sb.mnt + "/keep.bin") == keep)
        #expect(E2E.read(sb.mnt + "/after")?.count == 4 * 65536)
        #expect(E2E.lstatOf(sb.mnt + "/fill") == nil, "the deleted file came back")  // (its bytes would flood the log)
        #expect(sb.unmount().ok)
    }
}

/// `rm -rf` returns before the removed files' rows are deleted: that happens in the background, when the
/// mount is quiet. Whether the daemon is unmounted or killed meanwhile, no row of a removed file stays
/// behind and fsck finds nothing.
@Suite(
    "Removed files: rows deleted in the background",
    .enabled(if: E2E.fuseAvailable, "/dev/fuse is not usable"),
    .enabled(if: E2E.python != nil, "python3 counts the store's rows"),
    .enabled(if: !TestEngine.isPostgres, "counts SQLite rows and pages (the reaper is engine-independent and runs in the other suites)"))
struct BackgroundDeletionTests {
    /// Rows per table of the container's store (read with python3's sqlite3, the daemon stopped).
    static func rowCounts(_ container: String) -> [String: Int] {
        let r = E2E.py(
            """
            import sqlite3, sys
            db = sqlite3.connect(sys.argv[1] + '/store.db')
            for t in ['inodes', 'dirents', 'chunks', 'chunkmaps', 'xattrs', 'orphans']:
                print(t, db.execute('SELECT count(*) FROM ' + t).fetchone()[0])
            """, [container])
        return Dictionary(
            uniqueKeysWithValues: r.stdout.split(separator: "\n").compactMap { line in
                let p = line.split(separator: " ")
                return p.count == 2 ? (String(p[0]), Int(p[1]) ?? -1) : nil
            })
    }

    func makeTree(_ sb: Sandbox) throws {
        for d in 0..<8 {
            try FileManager.default.createDirectory(atPath: sb.mnt + "/tree/d\(d)", withIntermediateDirectories: true)
            for i in 0..<50 { try E2E.write(sb.mnt + "/tree/d\(d)/f\(i)", E2E.randomBytes(1000 + i * 700)) }
        }
        try E2E.write(sb.mnt + "/keep", "kept")
        #expect(E2E.sh("sync '\(sb.mnt)/keep'").ok)
    }

    @Test func rmRfThenUnmountLeavesNoRows() throws {
        let sb = try Sandbox("bgdelete")
        defer { sb.cleanup() }
        try sb.initAndMount()
        try makeTree(sb)
        #expect(sb.unmount().ok)  // the daemon holds the store for itself while mounted
        let before = Self.rowCounts(sb.container)
        #expect((before["chunks"] ?? 0) >= 400, "\(before)")
        try #require(sb.mount().ok)
        #expect(E2E.sh("rm -rf '\(sb.mnt)/tree'").ok)
        #expect(sb.unmount().ok)
        let after = Self.rowCounts(sb.container)
        #expect(after == ["inodes": 2, "dirents": 1, "chunks": 1, "chunkmaps": 0, "xattrs": 0, "orphans": 0], "rows left: \(after)")
        let fsck = E2E.coffer(["fsck", sb.container, "--passfile", sb.passfile], timeout: 120)
        #expect(fsck.ok, "\(fsck)")
    }

    /// Killed while it gives deleted files' pages back (pages of the files written after them are being
    /// moved): fsck finds nothing, every file reads back, and the next mount finishes the shrinking. The
    /// deleted files are 5000 of 7000 bytes, whose chunks are held in their rows (larger ones would go to
    /// segment files, whose space goes back without moving pages).
    @Test func sigkillWhileFreePagesGoBackLosesNothing() throws {
        let sb = try Sandbox("shrinkkill")
        defer { sb.cleanup() }
        try sb.initAndMount()
        let store = sb.container + "/store.db"
        let fill = E2E.py(
            "import os, sys\nos.mkdir(sys.argv[1])\nfor i in range(5000):\n    open('%s/f%d' % (sys.argv[1], i), 'wb').write(os.urandom(7000))",
            [sb.mnt + "/gone"], timeout: 300)
        #expect(fill.ok && E2E.sh("sync '\(sb.mnt)'").ok, "\(fill)")
        try makeTree(sb)  // after gone/ in the store: its pages move when gone/'s go back
        let expected = E2E.snapshot(sb.mnt).filter { !$0.key.hasPrefix("gone/") }
        #expect(expected.count == 401)
        let pid = try #require(E2E.daemonPid(container: sb.container))
        try #require(E2E.cmdline(pid).contains(sb.container), "lock pid is not our daemon")
        #expect(E2E.sh("rm -r '\(sb.mnt)/gone' && sync '\(sb.mnt)'").ok)
        // Watch the freelist and kill the daemon once part of it has gone back. Under load (CI runs suites
        // in parallel) pages go back while the reaper is still deleting, and the freelist peaked at 512
        // pages: any peak past 256 that shrinks by a fifth will do. The daemon holds the store
        // for itself, so the count is read from the file: page 1's header (offset 36), in its newest copy in
        // the WAL (frames whose salts match the WAL header's) or else in the database file.
        let watch = E2E.py(
            """
            import os, signal, struct, sys, time
            store, wal = sys.argv[1], {'off': 32, 'salt': None, 'free': None}
            def freelist():
                with open(store, 'rb') as f:
                    f.seek(36); base = struct.unpack('>I', f.read(4))[0]
                try:
                    w = open(store + '-wal', 'rb')
                except FileNotFoundError:
                    return base
                with w:
                    h = w.read(32)
                    if len(h) < 32:
                        wal.update(off=32, salt=None, free=None); return base
                    size, salt = struct.unpack('>I', h[8:12])[0], h[16:24]
                    if salt != wal['salt']:
                        wal.update(off=32, salt=salt, free=None)
                    w.seek(wal['off'])
                    while True:
                        frame = w.read(24)
                        if len(frame) < 24 or frame[8:16] != salt: break
                        page = w.read(size)
                        if len(page) < size: break
                        if struct.unpack('>I', frame[0:4])[0] == 1: wal['free'] = struct.unpack('>I', page[36:40])[0]
                        wal['off'] += 24 + size
                return base if wal['free'] is None else wal['free']
            pid, most, deadline = int(sys.argv[2]), 0, time.time() + 60
            while time.time() < deadline:
                free = freelist()
                most = max(most, free)
                if most > 256 and free < most * 0.8:
                    os.kill(pid, signal.SIGKILL)
                    print('killed at', free, 'of', most)
                    sys.exit(0)
                time.sleep(0.002)
            print('never saw the freelist shrink; most', most)
            sys.exit(1)
            """, [store, String(pid)], timeout: 90)
        #expect(watch.ok, "\(watch)")
        #expect(E2E.wait(10) { !E2E.isAlive(pid) })
        E2E.forceUnmount(sb.mnt)
        let fsck = E2E.coffer(["fsck", sb.container, "--passfile", sb.passfile], timeout: 120)
        #expect(fsck.ok, "fsck after the kill: \(fsck)")
        try #require(sb.mount().ok)
        #expect(E2E.snapshot(sb.mnt) == expected, "files differ after the kill")
        #expect(E2E.wait(30) { Int(E2E.statOf(store)?.st_size ?? -1) < 24 << 20 }, "the next mount did not finish giving 35 MB back")
        #expect(sb.unmount().ok)
    }

    @Test func rmRfThenSIGKILLLeavesNoRowsAfterTheNextMount() throws {
        let sb = try Sandbox("bgkill")
        defer { sb.cleanup() }
        try sb.initAndMount()
        try makeTree(sb)
        #expect(E2E.sh("rm -rf '\(sb.mnt)/tree' && sync '\(sb.mnt)'").ok)  // the removal is durable
        let pid = try #require(E2E.daemonPid(container: sb.container))
        try #require(E2E.cmdline(pid).contains(sb.container), "lock pid is not our daemon")
        #expect(kill(pid, SIGKILL) == 0)
        #expect(E2E.wait(10) { !E2E.isAlive(pid) })
        #expect(E2E.run("/bin/fusermount3", ["-uz", sb.mnt]).ok)
        let fsck = E2E.coffer(["fsck", sb.container, "--passfile", sb.passfile], timeout: 120)
        #expect(fsck.ok, "fsck after the kill: \(fsck)")
        // The next mount removes what the killed daemon had not.
        try #require(sb.mount().ok)
        #expect(E2E.readText(sb.mnt + "/keep") == "kept")
        #expect(E2E.lstatOf(sb.mnt + "/tree") == nil, "the removed tree came back")
        #expect(sb.unmount().ok)
        let after = Self.rowCounts(sb.container)
        #expect(after == ["inodes": 2, "dirents": 1, "chunks": 1, "chunkmaps": 0, "xattrs": 0, "orphans": 0], "rows left: \(after)")
    }
}
