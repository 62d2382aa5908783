#!/usr/bin/env bash
# bench.sh - Coffer side by side with a plain directory and gocryptfs (and securefs/cryfs if
# installed) on the same disk, in one run; prints a table with ratios.
# Also, when PostgreSQL / openssh-server + sshfs are installed, coffer-pg (a Coffer container in a
# private PostgreSQL cluster this script starts on a private port and socket directory) and
# gocryptfs-sshfs (gocryptfs over sshfs to a loopback sshd this script starts, with a temporary key);
# both servers are stopped at the end, also on failure. Their data lives under BENCH_WORKDIR too.
#
# Usage: bench/bench.sh [--quick] [--only coffer,gocryptfs] [--coffer-opts "-o writeback_cache"]
#        [--coffer-b PATH] [--coffer-b-opts "-o no_uring"] [--label-a NAME] [--label-b NAME] [--uring]
# Env:   BENCH_WORKDIR (default /var/tmp/coffer-bench), BENCH_SEQ_MB (1024; quick 256),
#        BENCH_FIO_RUNTIME (20; quick 5), BENCH_FIO_SIZE_MB (256), BENCH_CORPUS (a tarball),
#        COFFER (path to the coffer binary; default .build/release/coffer),
#        COFFER_B (same as --coffer-b), BENCH_PG_SETTINGS (extra server settings for coffer-pg's
#        cluster, "name = value; ..."; default initdb's, as a new Debian server has)
# A/B: --coffer-b PATH adds a subject coffer-b, a second Coffer binary measured like coffer in the
#   same run (own container, same options); the table gains a column coffer/coffer-b (how many times
#   better coffer is). --label-a/--label-b only rename the two columns. The subjects run in the order
#   given, e.g. --only coffer-b,coffer,gocryptfs to put B first. --coffer-b-opts adds mount options
#   for coffer-b only (after --coffer-opts).
# --uring: turns on FUSE over io_uring in the kernel (the fuse module's enable_uring, root) for the run
#   and puts the knob back at the end; Coffer mounts then use it (unless -o no_uring), the peers do not.
# Workloads (caches dropped before each; each subject remounted before each read workload):
#   mount (s), seq_write dd 1M + fsync (MB/s), seq_read after remount (MB/s), untar corpus (s),
#   ls_lR (s), read_all: cat every file (s), rm_rf (s), fio 4 KiB randwrite / randread, psync,
#   1 job, and randread from 2 jobs (IOPS), coffer daemon peak RSS while streaming a write and a read (MiB); space (MB, du of the
#   subject's files): peak during the streaming write and 5 s after, then, 5 s after the untar, and once
#   everything is removed and a minute has passed (coffer/gocrypt: how many times less Coffer takes).
# Ratios (issue 16): pg/sshfs = coffer-pg vs gocryptfs-sshfs (times: coffer-pg time / sshfs time,
#   target <= 0.25 for untar, ls_lR, read_all, rm_rf; MB/s: coffer-pg / sshfs, target >= 2);
#   pg/coffer = coffer-pg time / coffer time (small-file work, target <= 3).
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
QUICK=0; ONLY=""; COFFER_OPTS=""; COFFER_B_OPTS=""; COFFER_B=${COFFER_B:-}; LABEL_A=coffer; LABEL_B=coffer-b; URING=0
while [ $# -gt 0 ]; do
    case "$1" in
        --quick) QUICK=1 ;;
        --only) ONLY=$2; shift ;;
        --coffer-opts) COFFER_OPTS=$2; shift ;;
        --coffer-b) COFFER_B=$2; shift ;;
        --coffer-b-opts) COFFER_B_OPTS=$2; shift ;;
        --uring) URING=1 ;;
        --label-a) LABEL_A=$2; shift ;;
        --label-b) LABEL_B=$2; shift ;;
        -h|--help) sed -n '2,31p' "$0"; exit 0 ;;
        *) echo "bench: unknown argument $1" >&2; exit 2 ;;
    esac
    shift
done
COFFER=${COFFER:-$here/.build/release/coffer}
[ -x "$COFFER" ] || { echo "bench: $COFFER not built (make release)" >&2; exit 1; }
[ -z "$COFFER_B" ] || [ -x "$COFFER_B" ] || { echo "bench: --coffer-b $COFFER_B is not an executable" >&2; exit 1; }
WORK=${BENCH_WORKDIR:-/var/tmp/coffer-bench}
if [ $QUICK = 1 ]; then SEQ_MB=${BENCH_SEQ_MB:-256}; FIO_RT=${BENCH_FIO_RUNTIME:-5}; else SEQ_MB=${BENCH_SEQ_MB:-1024}; FIO_RT=${BENCH_FIO_RUNTIME:-20}; fi
FIO_MB=${BENCH_FIO_SIZE_MB:-256}
mkdir -p "$WORK"; RUN=$(mktemp -d "$WORK/run.XXXX"); RES="$RUN/results.tsv"; : > "$RES"
PASS="$RUN/pass"; echo "bench-password-$$" > "$PASS"; chmod 600 "$PASS"
log() { printf '[%s] %s\n' "$(date +%T)" "$*" >&2; }
# shellcheck source=bench/common.sh
. "$here/bench/common.sh"

SUBJECTS="plain coffer"
[ -n "$COFFER_B" ] && SUBJECTS="$SUBJECTS coffer-b"
command -v gocryptfs >/dev/null && SUBJECTS="$SUBJECTS gocryptfs"
command -v securefs >/dev/null && SUBJECTS="$SUBJECTS securefs"
have_pg && SUBJECTS="$SUBJECTS coffer-pg"
command -v gocryptfs >/dev/null && command -v sshfs >/dev/null && [ -x /usr/sbin/sshd ] && SUBJECTS="$SUBJECTS gocryptfs-sshfs"
[ -n "$ONLY" ] && SUBJECTS="plain ${ONLY//,/ }"
case " $SUBJECTS " in *" coffer-b "*) [ -n "$COFFER_B" ] || { echo "bench: subject coffer-b needs --coffer-b PATH" >&2; exit 2; } ;; esac

# ---- corpus (bench/common.sh): the same tarball bench/multi.sh untars
make_corpus

# ---- subjects
declare -A PID=()
# The Coffer binary of a Coffer subject (coffer, coffer-b), empty for the others.
bin_of() { case $1 in coffer|coffer-pg) echo "$COFFER" ;; coffer-b) echo "$COFFER_B" ;; esac; }
dir_of() { echo "$RUN/$1"; }
mnt_of() { if [ "$1" = plain ]; then echo "$RUN/plain/data"; else echo "$RUN/$1/mnt"; fi; }
# A Coffer subject's container: a directory, or for coffer-pg a libpq URI (set by start_pg).
cont_of() { if [ "$1" = coffer-pg ]; then echo "$PGURI"; else echo "$(dir_of "$1")/c"; fi; }

# ---- servers (started only for the subjects that need them; stopped by cleanup)
# PostgreSQL: start_pg / stop_pg in bench/common.sh
SSHDIR=""; SSHD_PID=""; SSHPORT=""
start_sshd() { # a loopback sshd with its own host key, a temporary root key and a private known_hosts
    SSHDIR=$(mktemp -d "$WORK/ssh.XXXX"); SSHPORT=$(free_port); mkdir -p /run/sshd; ssh_opts
    ssh-keygen -q -t ed25519 -N '' -f "$SSHDIR/host_key" && ssh-keygen -q -t ed25519 -N '' -f "$SSHDIR/id" || return 1
    cp "$SSHDIR/id.pub" "$SSHDIR/authorized_keys"
    echo "[127.0.0.1]:$SSHPORT $(cut -d' ' -f1,2 "$SSHDIR/host_key.pub")" > "$SSHDIR/known_hosts"
    /usr/sbin/sshd -D -e -p "$SSHPORT" -o ListenAddress=127.0.0.1 -h "$SSHDIR/host_key" -o PidFile=none \
        -o AuthorizedKeysFile="$SSHDIR/authorized_keys" -o StrictModes=no -o PermitRootLogin=prohibit-password \
        -o PasswordAuthentication=no 2> "$SSHDIR/sshd.log" &
    SSHD_PID=$!
    for _ in $(seq 50); do
        ssh "${SSH_OPTS[@]}" root@127.0.0.1 true 2>/dev/null && { log "sshd pid $SSHD_PID on port $SSHPORT"; return 0; }
        kill -0 "$SSHD_PID" 2>/dev/null || break; sleep 0.1
    done
    cat "$SSHDIR/sshd.log" >&2; return 1
}
stop_sshd() {
    if [ -n "$SSHD_PID" ]; then kill "$SSHD_PID" 2>/dev/null; wait "$SSHD_PID" 2>/dev/null; SSHD_PID=""; fi
    [ -n "$SSHDIR" ] && rm -rf "$SSHDIR"; SSHDIR=""
}
ssh_opts() {
    SSH_OPTS=(-p "$SSHPORT" -i "$SSHDIR/id" -o IdentitiesOnly=yes -o UserKnownHostsFile="$SSHDIR/known_hosts"
              -o GlobalKnownHostsFile=/dev/null -o StrictHostKeyChecking=yes -o BatchMode=yes)
}
SSH_OPTS=()
sshfs_of() { echo "$(dir_of "$1")/sshfs"; }   # the sshfs mount that gocryptfs-sshfs's ciphertext is in
mount_sshfs() {
    sshfs -p "$SSHPORT" -o IdentityFile="$SSHDIR/id",IdentitiesOnly=yes,UserKnownHostsFile="$SSHDIR/known_hosts" \
        -o GlobalKnownHostsFile=/dev/null,StrictHostKeyChecking=yes,BatchMode=yes "root@127.0.0.1:$(dir_of "$1")/remote" "$(sshfs_of "$1")"
}
init_subject() {
    local d; d=$(dir_of "$1"); mkdir -p "$d/mnt" "$d/data"
    case $1 in
        plain) ;;
        coffer|coffer-b|coffer-pg) "$(bin_of "$1")" init --passfile "$PASS" --no-recovery-key "$(cont_of "$1")" > /dev/null ;;
        gocryptfs) gocryptfs -init -q -passfile "$PASS" "$d/data" > /dev/null ;;
        gocryptfs-sshfs) mkdir -p "$d/remote" "$d/sshfs" && mount_sshfs "$1" && mkdir "$d/sshfs/data" \
            && gocryptfs -init -q -passfile "$PASS" "$d/sshfs/data" > /dev/null; fusermount3 -u "$d/sshfs" ;;
        securefs) securefs create --pass "$(cat "$PASS")" "$d/data" > /dev/null 2>&1 ;;
    esac
}
mount_subject() {
    local d; d=$(dir_of "$1")
    case $1 in
        plain) return 0 ;;
        coffer|coffer-pg) "$(bin_of "$1")" mount --passfile "$PASS" $COFFER_OPTS "$(cont_of "$1")" "$d/mnt" ;;
        coffer-b) "$(bin_of "$1")" mount --passfile "$PASS" $COFFER_OPTS $COFFER_B_OPTS "$(cont_of "$1")" "$d/mnt" ;;
        gocryptfs) gocryptfs -q -passfile "$PASS" "$d/data" "$d/mnt" ;;
        gocryptfs-sshfs) mount_sshfs "$1" && gocryptfs -q -passfile "$PASS" "$d/sshfs/data" "$d/mnt" ;;
        securefs) securefs mount -b --pass "$(cat "$PASS")" --log "$d/securefs.log" "$d/data" "$d/mnt" > /dev/null 2>&1; for _ in $(seq 100); do mountpoint -q "$d/mnt" && break; sleep 0.1; done ;;
    esac
}
wait_unmounted() { for _ in $(seq 50); do mountpoint -q "$1" || return 0; sleep 0.1; done; fusermount3 -uz "$1"; }
umount_subject() {
    [ "$1" = plain ] && return 0
    local m; m=$(mnt_of "$1")
    if [ -n "$(bin_of "$1")" ]; then "$(bin_of "$1")" unmount "$m"; else fusermount3 -u "$m"; fi
    wait_unmounted "$m"
    # sshfs stays busy until the gocryptfs process (gone from the mount table already) has exited
    if [ "$1" = gocryptfs-sshfs ]; then
        m=$(sshfs_of "$1")
        for _ in $(seq 50); do fusermount3 -u "$m" 2>/dev/null && break; sleep 0.1; done
        wait_unmounted "$m"
    fi
}
cleanup() {
    for s in $SUBJECTS; do
        m=$(mnt_of "$s"); mountpoint -q "$m" 2>/dev/null && umount_subject "$s"
        [ "$s" = gocryptfs-sshfs ] && mountpoint -q "$(sshfs_of "$s")" 2>/dev/null && fusermount3 -uz "$(sshfs_of "$s")"
    done
    stop_sshd; stop_pg
    [ -n "${KNOB_BEFORE:-}" ] && echo "$KNOB_BEFORE" > "$KNOB"
}
trap cleanup EXIT
trap 'exit 130' INT TERM HUP
KNOB=/sys/module/fuse/parameters/enable_uring
if [ $URING = 1 ]; then
    [ -w $KNOB ] || { echo "bench: --uring needs $KNOB (Linux 6.14+) and root" >&2; exit 1; }
    KNOB_BEFORE=$(cat $KNOB); echo Y > $KNOB; log "FUSE over io_uring on for this run (enable_uring was $KNOB_BEFORE)"
fi
drop() { sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || true; }
remount() { umount_subject "$1"; drop; mount_subject "$1"; }
t() { local a b; a=$(date +%s%N); "$@" > /dev/null 2>&1; b=$(date +%s%N); awk -v a="$a" -v b="$b" 'BEGIN{printf "%.3f", (b-a)/1e9}'; }
rec() { printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" >> "$RES"; }
# A Coffer subject's daemon: the holder of the flock on its container (the directory itself since
# the lock file went, coffer.lock in earlier versions), from the kernel's lock table.
coffer_pid() {
    local c ino p; c="$(dir_of "$1")/c"
    if [ "$1" = coffer-pg ]; then  # no lock file: the process of this binary with the mountpoint among its arguments
        for p in /proc/[0-9]*; do
            [ "$(readlink "$p/exe" 2>/dev/null)" = "$(readlink -f "$COFFER")" ] || continue
            tr '\0' '\n' < "$p/cmdline" 2>/dev/null | grep -qxF "$(mnt_of "$1")" && { echo "${p#/proc/}"; return; }
        done
        return
    fi
    if [ -f "$c/coffer.lock" ]; then ino=$(stat -c %i "$c/coffer.lock"); else ino=$(stat -c %i "$c"); fi
    awk -v ino="$ino" '$2 == "FLOCK" && $3 == "ADVISORY" { n = split($6, a, ":"); if (a[n] == ino) { print $5; exit } }' /proc/locks
}

case " $SUBJECTS " in *" coffer-pg "*) start_pg || { echo "bench: cannot start PostgreSQL" >&2; exit 1; } ;; esac
case " $SUBJECTS " in *" gocryptfs-sshfs "*) start_sshd || { echo "bench: cannot start sshd" >&2; exit 1; } ;; esac
log "subjects: $SUBJECTS; corpus $CFILES files; streaming $SEQ_MB MiB; fio ${FIO_RT}s on $FIO_MB MiB"
for s in $SUBJECTS; do init_subject "$s"; drop; rec "$s" mount "$(t mount_subject "$s")" s; done

# A Coffer daemon's peak resident size while a workload runs: watch_rss SUBJECT before it,
# rss_peak SUBJECT NAME after.
watch_rss() {
    local pid; pid=$(coffer_pid "$1"); rm -f "$RUN/rss"
    ( peak=0; while kill -0 "$pid" 2>/dev/null; do r=$(awk '/VmRSS/{print $2}' /proc/"$pid"/status 2>/dev/null); [ -n "$r" ] && [ "$r" -gt "$peak" ] && peak=$r && echo "$peak" > "$RUN/rss"; sleep 0.2; done ) &
    watcher=$!
}
rss_peak() { kill "$watcher" 2>/dev/null; wait "$watcher" 2>/dev/null; rec "$1" "$2" "$(( $(cat "$RUN/rss" 2>/dev/null || echo 0) / 1024 ))" MiB; }
# Space (issue 19): what a subject's files take on the disk (du, allocated), in MB: the peak while the
# streaming write runs and in the 5 s after it, at the end of those 5 s, 5 s after the untar, and after
# rm -rf of everything and a quiet minute.
# Not for coffer-pg (its rows are in the server's cluster).
store_of() {
    case $1 in
        coffer|coffer-b) echo "$(dir_of "$1")/c" ;;
        gocryptfs-sshfs) echo "$(dir_of "$1")/remote" ;;
        coffer-pg) ;;
        *) echo "$(dir_of "$1")/data" ;;
    esac
}
space_now() { du -sk "$(store_of "$1")" 2>/dev/null | awk '{printf "%.0f", $1 * 1024 / 1e6}'; }
rec_space() { [ -n "$(store_of "$1")" ] && rec "$1" "$2" "$(space_now "$1")" MB; }
watch_space() {
    rm -f "$RUN/space"; [ -n "$(store_of "$1")" ] || return 0
    ( peak=0; while :; do v=$(space_now "$1"); [ -n "$v" ] && [ "$v" -gt "$peak" ] && peak=$v && echo "$peak" > "$RUN/space"; sleep 0.2; done ) &
    space_watcher=$!
}
space_peak() { [ -n "$(store_of "$1")" ] || return 0; kill "$space_watcher" 2>/dev/null; wait "$space_watcher" 2>/dev/null; rec "$1" "$2" "$(cat "$RUN/space" 2>/dev/null || echo NA)" MB; }
for s in $SUBJECTS; do
    m=$(mnt_of "$s"); drop
    [ -n "$(bin_of "$s")" ] && watch_rss "$s"
    watch_space "$s"
    secs=$(t dd if=/dev/zero of="$m/seq.dat" bs=1M count="$SEQ_MB" conv=fsync)
    rec "$s" seq_write "$(awk -v s="$secs" -v n="$SEQ_MB" 'BEGIN{printf "%.0f", n*1048576/s/1e6}')" MB/s
    [ -n "$(bin_of "$s")" ] && rss_peak "$s" rss_streaming
    sleep 5
    space_peak "$s" space_seq_peak
    rec_space "$s" space_seq_settled
done
for s in $SUBJECTS; do
    remount "$s"; m=$(mnt_of "$s")
    [ -n "$(bin_of "$s")" ] && watch_rss "$s"
    secs=$(t cat "$m/seq.dat")
    [ -n "$(bin_of "$s")" ] && rss_peak "$s" rss_streaming_read
    rm -f "$m/seq.dat"
    rec "$s" seq_read "$(awk -v s="$secs" -v n="$SEQ_MB" 'BEGIN{printf "%.0f", n*1048576/s/1e6}')" MB/s
done
cat "$CORPUS" > /dev/null
for s in $SUBJECTS; do
    m=$(mnt_of "$s"); mkdir -p "$m/tree"; drop; rec "$s" untar "$(t sh -c "tar -xf '$CORPUS' -C '$m/tree' && sync")" s
    sleep 5; rec_space "$s" space_untar
done
for s in $SUBJECTS; do remount "$s"; rec "$s" ls_lR "$(t ls -lR "$(mnt_of "$s")/tree")" s; done
for s in $SUBJECTS; do remount "$s"; rec "$s" read_all "$(t sh -c "find '$(mnt_of "$s")/tree' -type f -print0 | xargs -0 cat")" s; done
for s in $SUBJECTS; do remount "$s"; rec "$s" rm_rf "$(t rm -rf "$(mnt_of "$s")/tree")" s; done
sleep 60
for s in $SUBJECTS; do rec_space "$s" space_emptied; done
for s in $SUBJECTS; do dd if=/dev/urandom of="$(mnt_of "$s")/fio.dat" bs=1M count="$FIO_MB" conv=fsync status=none; done
# randread2: the same reads from two jobs at once (issue 19 asks for 1 and 2).
for w in randwrite randread randread2; do
    rw=${w%2}; jobs=$([ $w = randread2 ] && echo 2 || echo 1)
    for s in $SUBJECTS; do
        remount "$s"; j="$RUN/$s-$w.json"
        fio --name=$w --filename="$(mnt_of "$s")/fio.dat" --size="${FIO_MB}M" --rw=$rw --bs=4k --ioengine=psync \
            --direct=0 --numjobs=$jobs --time_based --runtime="$FIO_RT" --fallocate=none --output-format=json --output="$j" > /dev/null 2>&1
        key=$([ $rw = randread ] && echo read || echo write)
        rec "$s" "fio_$w" "$(python3 -c "import json,sys; print(int(sum(j['$key']['iops'] for j in json.load(open('$j'))['jobs'])))" 2>/dev/null || echo NA)" IOPS
    done
done
for s in $SUBJECTS; do rm -f "$(mnt_of "$s")/fio.dat"; done

# ---- table: value per subject, then ratio to gocryptfs (>1 better) and to plain
python3 - "$RES" "$SUBJECTS" "$LABEL_A" "$LABEL_B" <<'PY'
import sys, collections
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
subjects = sys.argv[2].split()
label = {"coffer": sys.argv[3], "coffer-b": sys.argv[4]}
ab = "coffer" in subjects and "coffer-b" in subjects
val = collections.OrderedDict()
for s, w, v, u in rows:
    val.setdefault((w, u), {})[s] = v
def better(d, a, b, u):   # how many times better a is than b (> 1: a better)
    try:
        x, y = float(d[a]), float(d[b])
        return "%15.2fx" % ((y / x) if u in ("s", "MB") else (x / y))
    except Exception:
        return "%16s" % "-"
# Issue 16's ratios: plain a/b of the values (times or rates), with the target where there is one.
SMALL = ("untar", "ls_lR", "read_all", "rm_rf")
def ratio(d, a, b, w, u, targets):
    try:
        r = float(d[a]) / float(d[b])
    except Exception:
        return "%18s" % "-"
    t = targets.get(w)
    mark = "" if t is None else (" ok" if t(r) else " MISS")
    return "%18s" % ("%.2fx%s" % (r, mark))
PG_SSHFS = {w: (lambda r: r <= 0.25) for w in SMALL}
PG_SSHFS.update({"seq_write": lambda r: r >= 2, "seq_read": lambda r: r >= 2})
PG_COFFER = {w: (lambda r: r <= 3) for w in SMALL}
pgs = "coffer-pg" in subjects and "gocryptfs-sshfs" in subjects
pgc = "coffer-pg" in subjects and "coffer" in subjects
W = max([12] + [len(label.get(s, s)) + 2 for s in subjects])
print("%-18s %-6s" % ("workload", "unit") + "".join("%*s" % (W, label.get(s, s)) for s in subjects) + "%16s" % "coffer/gocrypt"
      + ("%16s" % "coffer/coffer-b" if ab else "") + ("%18s" % "pg/sshfs" if pgs else "") + ("%18s" % "pg/coffer" if pgc else ""))
for (w, u), d in val.items():
    line = "%-18s %-6s" % (w, u) + "".join("%*s" % (W, d.get(s, "-")) for s in subjects) + better(d, "coffer", "gocryptfs", u)
    if ab:
        line += better(d, "coffer", "coffer-b", u) if u in ("s", "MB/s", "IOPS") else "%16s" % "-"
    if pgs:
        line += ratio(d, "coffer-pg", "gocryptfs-sshfs", w, u, PG_SSHFS) if u in ("s", "MB/s", "IOPS") else "%18s" % "-"
    if pgc:
        line += ratio(d, "coffer-pg", "coffer", w, u, PG_COFFER if u == "s" else {}) if u in ("s", "MB/s", "IOPS") else "%18s" % "-"
    print(line)
print("(coffer/gocrypt: how many times better Coffer is; for times, gocryptfs time / Coffer time)")
if pgs:
    print("(pg/sshfs: coffer-pg value / gocryptfs-sshfs value; targets: times <= 0.25x for untar, ls_lR, read_all, rm_rf; seq MB/s >= 2x)")
if pgc:
    print("(pg/coffer: coffer-pg value / coffer value; target: times <= 3x for untar, ls_lR, read_all, rm_rf)")
if ab:
    print("(coffer/coffer-b: how many times better %s is than %s, the same way; RSS rows not compared)" % (label["coffer"], label["coffer-b"]))
PY
log "results: $RES"
