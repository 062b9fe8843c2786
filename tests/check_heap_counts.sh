#!/usr/bin/env bash
# tests/check_heap_counts.sh BUILD: the heap costs the system no more under the shim than the C
# library does, counted (not timed) with tests/heap/heap_counts.c, run without and under the
# shim (mode full, the checking fake driver as libcuda):
#   - 140,000 live blocks of 64-72 KiB: at most 300 more mappings than without the shim, and
#     mmap, pthread_create and cuMemHostAlloc still work at the peak;
#   - malloc + touch + free loops (64 KiB, 1 MiB at 1, 4 and 16 threads) and a working set of
#     live blocks replaced at random: minor page faults at most twice the C library's, plus a
#     few pages of the shim's own first-use records;
#   - threads allocating at once: each thread's blocks lie in at most twice as many 2 MiB regions
#     as with the C library's per-thread arenas (spread);
#   - with the address space limited to 48 MiB beyond what the process maps, no more allocations
#     fail than without the shim, and calloc's bytes read zero (aslimit).
set -u
BUILD=${1:-build}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
SHIM=$ROOT/$BUILD/libpinshim.so
FAKE=$ROOT/$BUILD/fakecuda
BIN=$ROOT/$BUILD/tests/heap/heap_counts
mkdir -p "$(dirname "$BIN")"
${CC:-gcc} -std=gnu11 -O2 -pthread -Wall -Wextra -Werror -o "$BIN" tests/heap/heap_counts.c -ldl ||
    { echo "check_heap_counts: cannot build tests/heap/heap_counts.c"; exit 2; }

fail=0
value() { sed -n "s/^$1 //p" <<<"$2" | tail -1; }

# run ARGS...: "plain shim" values of the program's one figure, or a failure.
compare() {
    local key=$1 slack_mul=$2 slack_add=$3; shift 3
    local plain shim p s
    plain=$(env LD_LIBRARY_PATH="$FAKE" "$BIN" "$@" 2>&1) || { echo "FAIL $* without the shim: $plain"; fail=1; return; }
    shim=$(env LD_LIBRARY_PATH="$FAKE" LD_PRELOAD="$SHIM" PINSHIM_MODE=full "$BIN" "$@" 2>&1) ||
        { echo "FAIL $* under the shim: $shim"; fail=1; return; }
    p=$(value "$key" "$plain"); s=$(value "$key" "$shim")
    if [ -z "$p" ] || [ -z "$s" ]; then echo "FAIL $*: no $key line"; fail=1; return; fi
    local limit=$((p * slack_mul + slack_add))
    if [ "$s" -le "$limit" ]; then
        echo "PASS $* $key: $s under the shim, $p without (limit $limit)"
    else
        echo "FAIL $* $key: $s under the shim, $p without (limit $limit)"; fail=1
    fi
}

compare MAPPINGS 1 300 maps 140000 65536 73728
compare FAULTS 2 16 loop 65536 5000 1
compare FAULTS 2 16 loop 1048576 2000 1
compare FAULTS 2 16 loop 1048576 1000 4
compare FAULTS 2 16 loop 262144 1000 16
compare FAULTS 2 16 set 65536 256 20000
compare FAULTS 2 16 set 1048576 64 3000
compare REGIONS 2 16 spread 73728 256 8
compare FAILED 1 0 aslimit
compare NONZERO 1 0 aslimit

# Freed blocks beyond what the shim keeps resident (a 64th of memory, 256 MiB..4 GiB) give their
# pages back, in batches; calloc must return zeros from them and from those still waiting.
mem_kib=$(awk '/^MemTotal:/ {print $2; exit}' /proc/meminfo 2>/dev/null)
kept=$(( ${mem_kib:-0} * 1024 / 64 )); [ "$kept" -lt $((256 << 20)) ] && kept=$((256 << 20))
[ "$kept" -gt $((4 << 30)) ] && kept=$((4 << 30))
letgo_bytes=$((kept + (512 << 20)))
for side in plain shim; do
    if [ $side = plain ]; then
        out=$(env LD_LIBRARY_PATH="$FAKE" "$BIN" letgo "$letgo_bytes" 65536 73728 2>&1)
    else
        out=$(env LD_LIBRARY_PATH="$FAKE" LD_PRELOAD="$SHIM" PINSHIM_MODE=full "$BIN" letgo "$letgo_bytes" 65536 73728 2>&1)
    fi
    nz=$(value NONZERO "$out"); nb=$(value BLOCKS "$out")
    if [ "$nz" = 0 ]; then
        echo "PASS letgo $((letgo_bytes >> 20)) MiB [$side]: $nb blocks freed and calloc'd again, every byte zero"
    else
        echo "FAIL letgo $((letgo_bytes >> 20)) MiB [$side]: ${nz:-no NONZERO line} bytes not zero ($out)"; fail=1
    fi
done
exit $fail
