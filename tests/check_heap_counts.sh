#!/usr/bin/env bash
# tests/check_heap_counts.sh BUILD: the heap costs the system no more under the shim than the C
# library does, counted (not timed) with tests/heap/heap_counts.c, run without and under the
# shim (mode full, the checking fake driver as libcuda):
#   - 140,000 live blocks of 64-72 KiB: at most 300 more mappings than without the shim, and
#     mmap, pthread_create and cuMemHostAlloc still work at the peak;
#   - malloc + touch + free loops (64 KiB, 1 MiB at 1, 4 and 16 threads) and a working set of
#     live blocks replaced at random: minor page faults at most twice the C library's, plus a
#     few pages of the shim's own first-use records.
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
exit $fail
