#!/usr/bin/env bash
# scale.sh - mount time and daemon memory against the number of files (Coffer, and gocryptfs
# for mount time). Creates N files in one directory through the mount, remounts, times the mount,
# lists the directory (ls -l) and reports the daemon's peak RSS.
# Usage: bench/scale.sh [N ...]   (default: 1000 100000)
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
COFFER=${COFFER:-$here/.build/release/coffer}
WORK=$(mktemp -d "${BENCH_WORKDIR:-/var/tmp}/coffer-scale.XXXX")
echo pw > "$WORK/pass"
trap 'for m in "$WORK"/*/m; do mountpoint -q "$m" && fusermount3 -u "$m"; done; rm -rf "$WORK"' EXIT
ms() { local a b; a=$(date +%s%N); "$@" >/dev/null 2>&1; b=$(date +%s%N); echo $(( (b - a) / 1000000 )); }
printf "%-8s %10s %10s %12s %12s %12s %12s\n" files "mount ms" "ls -l ms" "RSS MiB" "HWM MiB" "gcfs mount" "gcfs ls -l"
for n in "${@:-1000 100000}"; do
    d="$WORK/c$n"; mkdir -p "$d/m"
    "$COFFER" init --passfile "$WORK/pass" --no-recovery-key --kdf scrypt --scrypt-logn 16 "$d/c" >/dev/null
    "$COFFER" mount --passfile "$WORK/pass" "$d/c" "$d/m"
    python3 -c "
import os,sys
d=sys.argv[1]
for i in range($n):
    with open(f'{d}/file-{i:07d}.txt','w') as f: f.write('x'*100)
" "$d/m/many" 2>/dev/null || { mkdir "$d/m/many"; python3 -c "
import sys
d=sys.argv[1]
for i in range($n):
    with open(f'{d}/file-{i:07d}.txt','w') as f: f.write('x'*100)
" "$d/m/many"; }
    "$COFFER" unmount "$d/m"; sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null
    t=$(ms "$COFFER" mount --passfile "$WORK/pass" "$d/c" "$d/m")
    l=$(ms ls -l "$d/m/many")
    # RSS now (after listing every file) and the high-water mark (which includes the KDF's memory).
    rss=$(awk '/VmRSS/{print int($2/1024)}' /proc/"$(head -1 "$d/c/coffer.lock")"/status)
    hwm=$(awk '/VmHWM/{print int($2/1024)}' /proc/"$(head -1 "$d/c/coffer.lock")"/status)
    "$COFFER" unmount "$d/m"
    # gocryptfs: same number of files, mount time only
    g="$WORK/g$n"; mkdir -p "$g/c" "$g/m"; gt="-"; gl="-"
    if command -v gocryptfs >/dev/null; then
        gocryptfs -init -q -scryptn 16 -passfile "$WORK/pass" "$g/c" >/dev/null 2>&1
        gocryptfs -q -passfile "$WORK/pass" "$g/c" "$g/m" && mkdir "$g/m/many" && python3 -c "
import sys
d=sys.argv[1]
for i in range($n):
    with open(f'{d}/file-{i:07d}.txt','w') as f: f.write('x'*100)
" "$g/m/many" && fusermount3 -u "$g/m"; sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null
        gt=$(ms gocryptfs -q -passfile "$WORK/pass" "$g/c" "$g/m"); gl=$(ms ls -l "$g/m/many"); fusermount3 -u "$g/m"
    fi
    printf "%-8s %10s %10s %12s %12s %12s %12s\n" "$n" "$t" "$l" "$rss" "$hwm" "$gt" "$gl"
done
