#!/usr/bin/env bash
# multi.sh - issue 17: two mounts ("machines": two daemons, each with its own COFFER_STATE_DIR) of one
# PostgreSQL container in a private cluster this script starts (bench/common.sh, as bench.sh does).
#
# Usage: bench/multi.sh [--quick] [--coffer PATH] [--coffer-opts "-o ..."] [--lat-n N] [--rounds N]
#        (bench.sh's --only, --coffer-b, --label-a, --label-b are accepted and ignored, so that
#        `make bench BENCH_ARGS=...` can hand both scripts the same arguments)
# Env:   BENCH_WORKDIR (default /var/tmp/coffer-bench), BENCH_CORPUS (a tarball; default the corpus
#        bench.sh untars: ~21k files, --quick ~3.8k), COFFER (the coffer binary; default
#        .build/release/coffer of this checkout), BENCH_LAT_N (latency rounds; 1000, quick 200),
#        BENCH_LAT_GAP_MS (pause before each latency round, 50 ms: the busy run then spans an untar)
# What it measures (caches dropped before each untar run; a fresh container for each run):
#   1. untar x2: the corpus untarred twice into two directories of one container,
#      seq   one after the other on one mount (the only mount),
#      idle  one after the other on mount A while mount B is mounted and idle,
#      par   at once, A into one directory and B into the other (wall time until both are done);
#      ratio par/seq (target <= 1.0x); --rounds N repeats the three (default 1; even rounds in the
#      reverse order, idle par seq) and the ratios are of the sums; then diff -r of each par tree,
#      read through the OTHER mount, against the corpus unpacked on local disk (OK/FAIL).
#   2. where the time goes, for each run: pg_stat_activity / pg_locks sampled every 100 ms (share of
#      samples where Coffer's writer lock, the advisory lock every group takes first, is held; where
#      a session waits for it; what its holder is doing: running a statement in the server, or idle
#      in transaction, i.e. the daemon working between statements), and CPU seconds (utime+stime
#      from /proc) of daemon A, daemon B and the PostgreSQL cluster, plus the whole machine's busy share.
#   3. write on A / read on B: A writes a 13-byte counter to a file and closes it, B polls (os.open,
#      os.read, os.close every ms from one Python process) until it reads the new counter; N rounds
#      (a pause of BENCH_LAT_GAP_MS before each); p50/p99/max in ms from A's close to B's read
#      (target p99 <= 1 s); once with both mounts idle, once while B untars the corpus over and over.
# BENCH_PG_STATEMENTS=1: also the server's statement counts of each untar run (pg_stat_statements,
#      preloaded in the cluster: the statements the daemons sent, by total time in the server, with
#      their calls), printed after the report: which statements the runs at once spend more on.
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
QUICK=0; ROUNDS=1; LAT_GAP=${BENCH_LAT_GAP_MS:-50}; COFFER_OPTS=""; COFFER=${COFFER:-$here/.build/release/coffer}; LAT_N=${BENCH_LAT_N:-}
while [ $# -gt 0 ]; do
    case "$1" in
        --quick) QUICK=1 ;;
        --coffer) COFFER=$2; shift ;;
        --coffer-opts) COFFER_OPTS=$2; shift ;;
        --lat-n) LAT_N=$2; shift ;;
        --rounds) ROUNDS=$2; shift ;;
        --only|--coffer-b|--label-a|--label-b) shift ;;
        -h|--help) awk 'NR > 1 && /^#/ { print; next } NR > 1 { exit }' "$0"; exit 0 ;;
        *) echo "multi: unknown argument $1" >&2; exit 2 ;;
    esac
    shift
done
[ -x "$COFFER" ] || { echo "multi: $COFFER not built (make release)" >&2; exit 1; }
COFFER=$(readlink -f "$COFFER")
[ -n "$LAT_N" ] || LAT_N=$([ $QUICK = 1 ] && echo 200 || echo 1000)
WORK=${BENCH_WORKDIR:-/var/tmp/coffer-bench}
log() { printf '[%s] %s\n' "$(date +%T)" "$*" >&2; }
# shellcheck source=bench/common.sh
. "$here/bench/common.sh"
have_pg || { echo "multi: needs the PostgreSQL server (apt-get install postgresql)" >&2; exit 1; }
mkdir -p "$WORK"; RUN=$(mktemp -d "$WORK/multi.XXXX")
PASS="$RUN/pass"; echo "bench-password-$$" > "$PASS"; chmod 600 "$PASS"
MNT_A="$RUN/a"; MNT_B="$RUN/b"; mkdir -p "$MNT_A" "$MNT_B" "$RUN/stateA" "$RUN/stateB"
state_of() { if [ "$1" = "$MNT_A" ]; then echo "$RUN/stateA"; else echo "$RUN/stateB"; fi; }

# ---- cleanup: every mount, the background jobs this script started (by pid), the cluster, $RUN
BG_PIDS=()
wait_unmounted() { for _ in $(seq 100); do mountpoint -q "$1" || return 0; sleep 0.1; done; fusermount3 -uz "$1"; }
# fusermount3 -u, then wait (up to 60 s) until the daemon has exited, i.e. committed: what `coffer unmount`
# does, without its search for the daemon, which stats the arguments of every `coffer mount` process on
# the machine and so waits for any other FUSE mount that is slow to answer (seen: minutes).
umount_one() {
    mountpoint -q "$1" 2>/dev/null || return 0
    local pid t0; pid=$(daemon_pid "$1"); t0=$(date +%s)
    fusermount3 -u "$1" 2>/dev/null || { sleep 1; fusermount3 -u "$1" 2>/dev/null; }
    wait_unmounted "$1"
    for _ in $(seq 600); do [ "$pid" != 0 ] && kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    [ $(( $(date +%s) - t0 )) -lt 10 ] || log "unmounting $1 took $(( $(date +%s) - t0 )) s"
}
cleanup() {
    touch "$RUN/stop" 2>/dev/null
    [ -f "$RUN/loadtar.pid" ] && kill "$(cat "$RUN/loadtar.pid")" 2>/dev/null
    for p in "${BG_PIDS[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
    umount_one "$MNT_A"; umount_one "$MNT_B"
    stop_pg
    rm -rf "$RUN"
}
trap cleanup EXIT
trap 'exit 130' INT TERM HUP

make_corpus
REF="$RUN/ref"; mkdir -p "$REF"; tar -xf "$CORPUS" -C "$REF"   # the corpus on local disk, for diff -r
STATEMENTS=${BENCH_PG_STATEMENTS:-0}
[ "$STATEMENTS" = 1 ] && BENCH_PG_SETTINGS="${BENCH_PG_SETTINGS:+$BENCH_PG_SETTINGS; }shared_preload_libraries = 'pg_stat_statements'"
start_pg || { echo "multi: cannot start PostgreSQL" >&2; exit 1; }
PSQL=(psql -X -q -At -F '|' -h "$PGROOT" -p "$PGPORT" -U postgres bench)
[ "$STATEMENTS" = 1 ] && { "${PSQL[@]}" -c "CREATE EXTENSION pg_stat_statements" || exit 1; }
# The daemons' statements since the last reset (the sampler's and this script's left out), by time in the server.
STATEMENTS_SQL="SELECT calls, round(total_exec_time)::bigint, rows, left(regexp_replace(query, '\s+', ' ', 'g'), 100)
 FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = 'bench')
 AND query !~ 'pg_stat_activity|pg_stat_statements' ORDER BY total_exec_time DESC"
statements_reset() { [ "$STATEMENTS" = 1 ] && "${PSQL[@]}" -c "SELECT pg_stat_statements_reset()" > /dev/null; }
statements_dump() { [ "$STATEMENTS" = 1 ] && "${PSQL[@]}" -c "$STATEMENTS_SQL" > "$1"; }
log "coffer $COFFER; corpus $CORPUS ($CFILES files); latency rounds $LAT_N; $(nproc) cores; load:$(uptime | sed 's/.*load average://')"

drop() { sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || true; }
now() { date +%s%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN{printf "%.2f", (b-a)/1e9}'; }
init_c() { COFFER_STATE_DIR="$RUN/stateA" "$COFFER" init --passfile "$PASS" --no-recovery-key "$PGBASE&container=$1" > /dev/null; }
# mount_one MOUNTPOINT CONTAINER: each mountpoint is a machine of its own (its own state directory).
mount_one() {
    # shellcheck disable=SC2086
    COFFER_STATE_DIR=$(state_of "$1") "$COFFER" mount --passfile "$PASS" $COFFER_OPTS "$PGBASE&container=$2" "$1"
}
# The daemon serving a mountpoint: the process of this binary with the mountpoint among its arguments.
daemon_pid() {
    local p
    for p in /proc/[0-9]*; do
        [ "$(readlink "$p/exe" 2>/dev/null)" = "$COFFER" ] || continue
        tr '\0' '\n' < "$p/cmdline" 2>/dev/null | grep -qxF "$1" && { echo "${p#/proc/}"; return; }
    done
    echo 0
}
# CPU ticks so far of daemon A, daemon B, the cluster (postmaster with its reaped children, plus its
# live children), and the machine (busy, total), on one line.
cpu_snap() {
    python3 - "$(daemon_pid "$MNT_A")" "$(daemon_pid "$MNT_B")" "$(pg_pid)" <<'PY'
import os, sys
def stat(pid):
    try:
        f = open("/proc/%s/stat" % pid).read().rsplit(")", 1)[1].split()
    except Exception:
        return None
    return int(f[1]), int(f[11]) + int(f[12]), int(f[13]) + int(f[14])   # ppid, own, reaped children
a, b, pm = sys.argv[1:4]
own = lambda p: (stat(p) or (0, 0, 0))[1]
pg = 0
if pm:
    s = stat(pm)
    pg = s[1] + s[2] if s else 0
    for d in os.listdir("/proc"):
        if d.isdigit():
            s = stat(d)
            if s and str(s[0]) == pm:
                pg += s[1]
cpu = [int(x) for x in open("/proc/stat").readline().split()[1:]]
print(own(a), own(b), pg, sum(cpu) - cpu[3] - cpu[4], sum(cpu))
PY
}
# Sampler: one psql session asked every 100 ms for the client sessions of the database (the daemons'),
# apart from itself. Columns: ms, sessions waiting for the writer lock, writer locks granted, active and
# not waiting, active and waiting on something else, idle in transaction, idle, all, and what the
# writer lock's holder is doing (server: running a statement; client: idle in transaction; none).
LOCKSPACE=$((0x434F4646))   # Sources/CofferStore/Postgres/PostgresSQL.swift: lockSpace ("COFF")
SAMPLE_SQL="SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint,
 count(*) FILTER (WHERE w.pid IS NOT NULL),
 (SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = $LOCKSPACE AND granted),
 count(*) FILTER (WHERE a.state = 'active' AND a.wait_event_type IS NULL),
 count(*) FILTER (WHERE a.state = 'active' AND a.wait_event_type IS NOT NULL AND w.pid IS NULL),
 count(*) FILTER (WHERE a.state LIKE 'idle in transaction%'),
 count(*) FILTER (WHERE a.state = 'idle'),
 count(*),
 (SELECT coalesce(max(CASE WHEN h.state = 'active' THEN 'server' ELSE 'client' END), 'none')
    FROM pg_locks l JOIN pg_stat_activity h ON h.pid = l.pid
   WHERE l.locktype = 'advisory' AND l.classid = $LOCKSPACE AND l.granted)
FROM pg_stat_activity a
LEFT JOIN (SELECT DISTINCT pid FROM pg_locks WHERE locktype = 'advisory' AND classid = $LOCKSPACE AND NOT granted) w ON w.pid = a.pid
WHERE a.backend_type = 'client backend' AND a.datname = 'bench' AND a.pid <> pg_backend_pid();"
SAMPLE_SQL=${SAMPLE_SQL//$'\n'/ }
SAMPLER=""
start_sampler() {
    rm -f "$RUN/stop"
    ( while [ ! -e "$RUN/stop" ]; do echo "$SAMPLE_SQL"; sleep 0.1; done ) | "${PSQL[@]}" > "$1" 2>&1 &
    SAMPLER=$!; BG_PIDS+=("$SAMPLER")
}
stop_sampler() { touch "$RUN/stop"; wait "$SAMPLER" 2>/dev/null; BG_PIDS=("${BG_PIDS[@]/$SAMPLER}"); SAMPLER=""; }
untar() { mkdir -p "$2" && tar -xf "$CORPUS" -C "$2" && sync; }   # untar MOUNT DIR (as bench.sh: tar, then sync)

RES="$RUN/results"; : > "$RES"
rec() { echo "$*" >> "$RES"; }
# run_untar NAME ROUND: NAME one of seq / idle / par, on a fresh container NAME-ROUND.
run_untar() {
    local name=$1 round=$2 t0 t1 ta tb rc=0 pa pb c0 c1
    init_c "$name$round" || { echo "multi: init of container $name$round failed" >&2; return 1; }
    mount_one "$MNT_A" "$name$round" || return 1
    if [ "$name" != seq ]; then mount_one "$MNT_B" "$name$round" || return 1; fi
    mkdir -p "$MNT_A/x" "$MNT_A/y"; cat "$CORPUS" > /dev/null; drop
    statements_reset; c0=$(cpu_snap); start_sampler "$RUN/samples.$name.$round"; t0=$(now)
    if [ "$name" = par ]; then
        ( untar "$MNT_A" "$MNT_A/x"; r=$?; now > "$RUN/end.a"; exit $r ) & pa=$!
        ( untar "$MNT_B" "$MNT_B/y"; r=$?; now > "$RUN/end.b"; exit $r ) & pb=$!
        BG_PIDS+=("$pa" "$pb")
        wait "$pa" || rc=1; wait "$pb" || rc=1; t1=$(now)
        ta=$(secs "$t0" "$(cat "$RUN/end.a")"); tb=$(secs "$t0" "$(cat "$RUN/end.b")")
    else
        untar "$MNT_A" "$MNT_A/x" || rc=1; ta=$(secs "$t0" "$(now)")
        untar "$MNT_A" "$MNT_A/y" || rc=1; t1=$(now); tb=$(secs "$t0" "$t1")
    fi
    stop_sampler; c1=$(cpu_snap); statements_dump "$RUN/statements.$name.$round"
    rec "untar $name $round $(secs "$t0" "$t1") $ta $tb $rc"
    rec "cpu $name.$round $c0 $c1 $(( (t1 - t0) / 1000000 ))"
    log "untar x2 $name (round $round): $(secs "$t0" "$t1") s (first done at $ta s, second at $tb s)$([ $rc = 0 ] || echo ', tar FAILED')"
    if [ "$name" = par ]; then   # each tree read through the other mount, against the corpus on local disk
        local ok=OK out
        out=$(diff -r "$REF" "$MNT_B/x" 2>&1) || ok=FAIL
        rec "diff A-tree-read-via-B,round-$round $ok $(printf '%s' "$out" | wc -l)"; [ $ok = OK ] || printf '%s\n' "$out" | head -20 >&2
        ok=OK; out=$(diff -r "$REF" "$MNT_A/y" 2>&1) || ok=FAIL
        rec "diff B-tree-read-via-A,round-$round $ok $(printf '%s' "$out" | wc -l)"; [ $ok = OK ] || printf '%s\n' "$out" | head -20 >&2
        log "diff -r done"
    fi
    umount_one "$MNT_A"; umount_one "$MNT_B"
}

# Write on A, read on B (one Python process; prints one line: label n then the latencies in ms).
LAT_PY='
import os, sys, time
a, b, n, label, gap = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], float(sys.argv[5]) / 1000
fa, fb = os.path.join(a, "lat", "counter"), os.path.join(b, "lat", "counter")
def write(i):
    fd = os.open(fa, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.write(fd, b"%012d\n" % i)
    os.close(fd)
errors, other = [], 0
def read():
    try:
        fd = os.open(fb, os.O_RDONLY)
    except FileNotFoundError:
        return None
    except OSError as e:
        errors.append("open: " + str(e)); return None
    try:
        return os.read(fd, 64)
    except OSError as e:
        errors.append("read: " + str(e)); return None
    finally:
        os.close(fd)
def wait_for(i, limit=30.0):
    global other
    want, t0 = b"%012d\n" % i, time.monotonic()
    while True:
        got = read()
        t = time.monotonic()
        if got == want:
            return t
        if got is not None and got != b"%012d\n" % (i - 1):
            other += 1
        if t - t0 > limit:
            return None
        time.sleep(0.001)
os.makedirs(os.path.join(a, "lat"), exist_ok=True)
write(0)
if wait_for(0) is None:
    sys.exit("latency: the first counter never appeared on the other mount")
lat, wr, lost = [], [], 0
for i in range(1, n + 1):
    time.sleep(gap)
    t0 = time.monotonic(); write(i); t1 = time.monotonic()
    t2 = wait_for(i)
    wr.append((t1 - t0) * 1000)
    if t2 is None:
        lost += 1
    else:
        lat.append((t2 - t1) * 1000)
print(label, n, lost, other, len(errors), "%.2f" % sorted(wr)[len(wr) // 2], "%.2f" % sorted(wr)[int(len(wr) * 0.99)],
      " ".join("%.2f" % x for x in lat))
for e in errors[:5]:
    print("latency: error on the reading mount:", e, file=sys.stderr)
'
run_latency() {
    init_c lat || return 1
    mount_one "$MNT_A" lat && mount_one "$MNT_B" lat || return 1
    log "latency, idle: $LAT_N rounds"
    python3 -c "$LAT_PY" "$MNT_A" "$MNT_B" "$LAT_N" idle "$LAT_GAP" >> "$RES" || rec "latfail idle"
    # B untars the corpus over and over (each into a new directory) while A writes and B reads.
    rm -f "$RUN/stop"
    ( i=0; while [ ! -e "$RUN/stop" ]; do
          i=$((i + 1)); mkdir -p "$MNT_B/load/$i"; tar -xf "$CORPUS" -C "$MNT_B/load/$i" & echo $! > "$RUN/loadtar.pid"
          wait $! || [ -e "$RUN/stop" ] || echo "untar under the latency run failed" >&2
      done ) &
    local loader=$!; BG_PIDS+=("$loader")
    sleep 2
    log "latency, while B untars: $LAT_N rounds"
    c0=$(cpu_snap); start_sampler "$RUN/samples.lat.1"; t0=$(now)
    python3 -c "$LAT_PY" "$MNT_A" "$MNT_B" "$LAT_N" busy "$LAT_GAP" >> "$RES" || rec "latfail busy"
    t1=$(now); stop_sampler; c1=$(cpu_snap)
    rec "cpu lat.1 $c0 $c1 $(( (t1 - t0) / 1000000 ))"
    touch "$RUN/stop"; kill "$(cat "$RUN/loadtar.pid")" 2>/dev/null; wait "$loader" 2>/dev/null; rm -f "$RUN/loadtar.pid"
    BG_PIDS=("${BG_PIDS[@]/$loader}")
    umount_one "$MNT_A"; umount_one "$MNT_B"
}

for r in $(seq "$ROUNDS"); do
    order="seq par idle"; [ $((r % 2)) = 0 ] && order="idle par seq"
    for s in $order; do run_untar "$s" "$r" || { echo "multi: run $s (round $r) failed" >&2; exit 1; }; done
done
run_latency || { echo "multi: latency run failed" >&2; exit 1; }

# ---- report
python3 - "$RES" "$RUN" "$(getconf CLK_TCK)" "$(nproc)" "$CFILES" <<'PY'
import sys, os, glob
res, run, hz, ncpu, nfiles = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
untar, cpu, diff, lat = {}, {}, [], {}
runs = []   # (kind, round, wall, first done, second done, rc)
for line in open(res):
    f = line.split()
    if not f:
        continue
    if f[0] == "untar":
        runs.append((f[1], f[2], float(f[3]), float(f[4]), float(f[5]), f[6]))
        untar[f[1]] = untar.get(f[1], 0.0) + float(f[3])
    elif f[0] == "cpu":
        c0, c1, ms = [int(x) for x in f[2:7]], [int(x) for x in f[7:12]], int(f[12])
        d = [b - a for a, b in zip(c0, c1)] + [ms]
        k = f[1].split(".")[0]   # summed over the rounds
        cpu[k] = [x + y for x, y in zip(cpu.get(k, [0] * 6), d)]
    elif f[0] == "diff":
        diff.append((f[1], f[2]))
    elif f[0] in ("idle", "busy"):
        lat[f[0]] = (int(f[1]), int(f[2]), int(f[3]), int(f[4]), float(f[5]), float(f[6]), sorted(float(x) for x in f[7:]))
    elif f[0] == "latfail":
        print("latency run %s FAILED" % f[1])
cpu = {k: (d[0] / hz, d[1] / hz, d[2] / hz, d[3] / d[4] if d[4] else 0, d[5] / 1000) for k, d in cpu.items()}
def samples(name):   # all rounds' samples of a kind of run
    rows = []
    for fn in sorted(glob.glob(os.path.join(run, "samples." + name + ".*"))):
        for l in open(fn):
            p = l.strip().split("|")
            if len(p) == 9 and p[0].isdigit():
                rows.append([int(x) for x in p[1:8]] + [p[8]])
    return rows
names = [("seq", "one mount, one after the other"), ("idle", "same, 2nd mount idle"), ("par", "two mounts at once")]
print()
print("Two mounts of one PostgreSQL container (issue 17): untar x2 of %s files" % nfiles)
print("%-32s %6s %9s %9s %9s" % ("run", "round", "wall s", "1st done", "2nd done"))
for k, label in names:
    for kind, rnd, w, a, b, rc in runs:
        if kind == k:
            print("%-32s %6s %9.2f %9.2f %9.2f%s" % (label, rnd, w, a, b, "" if rc == "0" else "  tar FAILED"))
print("(1st/2nd done: seconds from the start until the untar into the first / second directory was done;")
print(" at once: first = mount A's, second = mount B's)")
if "par" in untar and "seq" in untar:
    r = untar["par"] / untar["seq"]
    print("at once / one after the other on one mount (sums over the rounds): %.2fx (target <= 1.0x: %s)" % (r, "met" if r <= 1.0 else "MISSED"))
if "par" in untar and "idle" in untar:
    print("at once / one after the other with the 2nd mount idle: %.2fx" % (untar["par"] / untar["idle"]))
for what, ok in diff:
    print("diff -r %s against the corpus: %s" % (what, ok))
print()
print("Where the time goes (pg_stat_activity / pg_locks every 100 ms; CPU from /proc; summed over the rounds)")
cols = [k for k, _ in names if k in untar] + (["lat"] if "lat" in cpu else [])
head = {"seq": "seq", "idle": "idle", "par": "at once", "lat": "lat+untar"}
print("%-44s" % "" + "".join("%11s" % head[k] for k in cols))
S = {k: samples(k) for k in cols}
def row(label, fn, fmt="%10.0f%%"):
    out = "%-44s" % label
    for k in cols:
        s = S[k]
        try:
            out += fmt % fn(s, k) if s else "%11s" % "-"
        except Exception:
            out += "%11s" % "-"
    print(out)
def share(pred):
    return lambda s, k: 100.0 * sum(1 for r in s if pred(r)) / len(s)
def mean(i):
    return lambda s, k: sum(r[i] for r in s) / len(s)
row("samples", lambda s, k: len(s), "%11d")
row("writer lock held", share(lambda r: r[1] > 0))
row("  holder running a statement (server)", share(lambda r: r[7] == "server"))
row("  holder idle in transaction (daemon)", share(lambda r: r[7] == "client"))
row("a session waiting for the writer lock", share(lambda r: r[0] > 0))
row("sessions waiting for it (mean)", mean(0), "%11.2f")
row("sessions active, on CPU (mean)", mean(2), "%11.2f")
row("sessions active, other wait (mean)", mean(3), "%11.2f")
row("sessions idle in transaction (mean)", mean(4), "%11.2f")
row("client sessions (mean)", mean(6), "%11.1f")
def crow(label, i, fmt):
    print("%-44s" % label + "".join((fmt % cpu[k][i]) if k in cpu else "%11s" % "-" for k in cols))
crow("CPU s, daemon A", 0, "%11.2f")
crow("CPU s, daemon B", 1, "%11.2f")
crow("CPU s, PostgreSQL (all its processes)", 2, "%11.2f")
print("%-44s" % "CPU s, all three" + "".join(("%11.2f" % sum(cpu[k][:3])) if k in cpu else "%11s" % "-" for k in cols))
print("%-44s" % ("machine busy (%d cores, all processes)" % ncpu) + "".join(("%10.0f%%" % (100 * cpu[k][3])) if k in cpu else "%11s" % "-" for k in cols))
print("%-44s" % "wall s" + "".join(("%11.2f" % cpu[k][4]) if k in cpu else "%11s" % "-" for k in cols))
print("(a sample is one snapshot; 'held' = Coffer's writer lock granted to some session; the sampler's own")
print(" psql session is not counted, its backend's CPU is in the PostgreSQL figure; lat+untar: the busy latency run)")
print()
print("Write on A, close; read on B until the new content shows (ms from A's close)")
print("%-26s %7s %9s %9s %9s %9s %8s %8s %9s %9s" % ("", "rounds", "p50", "p90", "p99", "max", "lost", "errors", "write p50", "write p99"))
def pct(v, q):
    return v[min(len(v) - 1, int(len(v) * q))] if v else float("nan")
for k, label in (("idle", "both mounts idle"), ("busy", "while B untars")):
    if k in lat:
        n, lost, other, errs, w50, w99, v = lat[k]
        print("%-26s %7d %9.1f %9.1f %9.1f %9.1f %8d %8d %9.1f %9.1f" % (label, n, pct(v, .5), pct(v, .9), pct(v, .99), v[-1] if v else float("nan"), lost, errs, w50, w99))
        if other:
            print("  (%d reads on B saw neither the old nor the new counter, e.g. the file empty between truncate and write)" % other)
for k in ("idle", "busy"):
    if k in lat:
        v = lat[k][6]
        p = pct(v, .99)
        print("p99 %s: %.1f ms (target <= 1000 ms: %s)" % (k, p, "met" if p <= 1000 and lat[k][1] == 0 else "MISSED"))
PY
report=$?
[ "$STATEMENTS" = 1 ] || exit $report
shopt -s nullglob
for f in "$RUN"/statements.*; do
    echo; echo "Statements of the run ${f##*/statements.} (calls, ms in the server, rows, statement), top 15 of $(wc -l < "$f"):"
    awk -F'|' '{ c += $1; t += $2 } END { printf "  all: %d calls, %d ms\n", c, t }' "$f"
    head -15 "$f" | awk -F'|' '{ printf "  %8d %7d %8d  %s\n", $1, $2, $3, $4 }'
done
exit $report
