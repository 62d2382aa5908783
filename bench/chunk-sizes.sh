#!/usr/bin/env bash
# chunk-sizes.sh - streaming write/read and random 4 KiB write/read on Coffer for each chunk size,
# one container per size, same disk, one run. Usage: bench/chunk-sizes.sh [MiB] [fio-seconds] [extra mount args]
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
COFFER=${COFFER:-$here/.build/release/coffer}
MB=${1:-512}; RT=${2:-10}; EXTRA=${3:-}
WORK=$(mktemp -d "${BENCH_WORKDIR:-/var/tmp}/coffer-chunks.XXXX")
echo pw > "$WORK/pass"
trap 'mountpoint -q "$WORK/m" && "$COFFER" unmount "$WORK/m"; rm -rf "$WORK"' EXIT
drop() { sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || true; }
secs() { local a b; a=$(date +%s%N); "$@" >/dev/null 2>&1; b=$(date +%s%N); awk -v a="$a" -v b="$b" 'BEGIN{printf "%.3f",(b-a)/1e9}'; }
fio_iops() { fio --name=x --filename="$WORK/m/fio.dat" --size=256M --rw="$1" --bs=4k --ioengine=psync --direct=0 --time_based --runtime="$RT" --fallocate=none --output-format=json 2>/dev/null | python3 -c "import json,sys; j=json.load(sys.stdin)['jobs'][0]; print(int(j['$2']['iops']))"; }
printf "%-8s %12s %12s %14s %14s %10s\n" chunk "write MB/s" "read MB/s" "randwrite IOPS" "randread IOPS" "store MiB"
for cs in 4096 16384 32768 65536; do
    rm -rf "$WORK/c" "$WORK/m"; mkdir -p "$WORK/m"
    "$COFFER" init --passfile "$WORK/pass" --no-recovery-key --kdf scrypt --scrypt-logn 16 --chunk-size $cs "$WORK/c" >/dev/null
    "$COFFER" mount --passfile "$WORK/pass" $EXTRA "$WORK/c" "$WORK/m"
    w=$(secs dd if=/dev/zero of="$WORK/m/seq" bs=1M count="$MB" conv=fsync)
    "$COFFER" unmount "$WORK/m"; drop; "$COFFER" mount --passfile "$WORK/pass" $EXTRA "$WORK/c" "$WORK/m"
    r=$(secs cat "$WORK/m/seq"); rm "$WORK/m/seq"
    dd if=/dev/urandom of="$WORK/m/fio.dat" bs=1M count=256 conv=fsync status=none
    "$COFFER" unmount "$WORK/m"; drop; "$COFFER" mount --passfile "$WORK/pass" $EXTRA "$WORK/c" "$WORK/m"
    rw=$(fio_iops randwrite write); rr=$(fio_iops randread read)
    size=$(du -sm "$WORK/c" | cut -f1)
    "$COFFER" unmount "$WORK/m"
    printf "%-8s %12.0f %12.0f %14s %14s %10s\n" $((cs/1024))KiB "$(awk -v s=$w -v n=$MB 'BEGIN{print n*1048576/s/1e6}')" "$(awk -v s=$r -v n=$MB 'BEGIN{print n*1048576/s/1e6}')" "$rw" "$rr" "$size"
done
