#!/usr/bin/env bash
# PINSHIM_NODE_BUDGET across processes, on the checking fake driver (tests/fake/node_worker.c):
#   0. start-up attaches the segment (the registrar thread never opens a descriptor), but not in
#      PINSHIM_MODE=off;
#   1. four ranks started together, each with four hot 16 MiB buffers and a process budget of 1G:
#      never more than the node budget registered at once over all four (the fake's node-wide
#      peak through FAKECUDA_SHM), every rank's data right, and some pinning did happen;
#   2. a rank that pinned what it could is SIGKILLed: a rank started while it lives pins nothing
#      (nobody takes a live process's budget), a rank started after it died pins again.
# The node budget is 48M less a few pages, different for each run, so that concurrent runs never
# share a segment; the segments made here are removed at the end.
set -u
BUILD=${1:-build}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
WORKER=$ROOT/$BUILD/tests/fake/node_worker
[ -x "$WORKER" ] || { echo "FAIL $WORKER is not built"; exit 1; }
BUDGET=$(( (48 << 20) - ( ($$ % 255) + 1 ) * 4096 ))
TMP=$(mktemp -d /tmp/pinshim-nodebudget.XXXXXX)
SHM1=/pinshim-test-node-$$-1
SHM2=/pinshim-test-node-$$-2
holder=
cleanup() {
    [ -n "$holder" ] && kill -9 "$holder" 2>/dev/null
    rm -rf "$TMP"
    rm -f "/dev/shm$SHM1" "/dev/shm$SHM2" "/dev/shm/pinshim-$(id -u)-$BUDGET"
}
trap cleanup EXIT
fail=0
pass() { echo "PASS $*"; }
bad() { echo "FAIL $*"; fail=1; }
field() { sed -n "s/^$1 //p" "$2" | tail -1; }

# rank SHM NAME ARGS...: one worker under the shim, output in $TMP/NAME.out.  Run it in a
# subshell, ( rank ... ), whose exec makes $! the worker itself.
rank() {
    local shm=$1 name=$2; shift 2
    exec env LD_PRELOAD="$ROOT/$BUILD/libpinshim.so" LD_LIBRARY_PATH="$ROOT/$BUILD/fakecuda" \
        PINSHIM_MODE=pin PINSHIM_BUDGET=1G PINSHIM_NODE_BUDGET=$BUDGET FAKECUDA_SHM="$shm" \
        PINSHIM_STATS="$TMP/$name.json" "$WORKER" "$@" >"$TMP/$name.out" 2>"$TMP/$name.err"
}

echo "node budget $BUDGET bytes"

# ---- 0. start-up: the segment is attached on the program's thread, never in mode off ----
SEG="/dev/shm/pinshim-$(id -u)-$BUDGET"
env LD_PRELOAD="$ROOT/$BUILD/libpinshim.so" PINSHIM_MODE=off PINSHIM_NODE_BUDGET=$BUDGET true
if [ -e "$SEG" ]; then bad "PINSHIM_MODE=off made the node budget's segment"; else pass "mode off: no segment"; fi
env LD_PRELOAD="$ROOT/$BUILD/libpinshim.so" PINSHIM_MODE=pin PINSHIM_NODE_BUDGET=$BUDGET true
if [ -e "$SEG" ]; then
    pass "start-up attaches the segment (its registrar thread never opens one)"
else
    bad "a process started with a node budget did not attach its segment at start-up"
fi

# ---- 1. four ranks at once ----
pids=()
for r in 0 1 2 3; do
    ( rank "$SHM1" "rank$r" run 8 ) &
    pids+=($!)
done
peak=0 promoted=0
for r in 0 1 2 3; do
    if wait "${pids[$r]}"; then
        pass "rank $r: data right, no violations ($(field PROMOTED "$TMP/rank$r.out") buffers pinned at the end)"
    else
        bad "rank $r exited non-zero"; sed 's/^/    | /' "$TMP/rank$r.out" "$TMP/rank$r.err" | tail -20
    fi
    p=$(field NODE_PEAK "$TMP/rank$r.out"); p=${p:-0}
    [ "$p" -gt "$peak" ] && peak=$p
    l=$(field LOCAL_PEAK "$TMP/rank$r.out"); [ "${l:-0}" -gt 0 ] && promoted=$((promoted + 1))
    if grep -q pinshim "$TMP/rank$r.err"; then bad "rank $r: the shim wrote to stderr"; sed 's/^/    | /' "$TMP/rank$r.err"; fi
    if python3 - "$TMP/rank$r.json" "$BUDGET" <<'PY'
import json, sys
nb = json.load(open(sys.argv[1]))["node_budget"]
b = int(sys.argv[2])
sys.exit(0 if nb["bytes"] == b and nb["mine_bytes"] <= nb["used_bytes"] <= b else 1)
PY
    then pass "rank $r: stats JSON node_budget consistent"; else bad "rank $r: stats JSON node_budget"; grep -o '"node_budget":{[^}]*}' "$TMP/rank$r.json"; fi
done
if [ "$peak" -le "$BUDGET" ]; then
    pass "node-wide registered peak $peak <= node budget $BUDGET (4 ranks x 64 MiB hot, 1G each)"
else
    bad "node-wide registered peak $peak exceeds the node budget $BUDGET"
fi
if [ "$promoted" -ge 1 ] && [ "$peak" -ge $((16 << 20)) ]; then
    pass "$promoted of 4 ranks pinned something: the test pinned for real"
else
    bad "no rank pinned anything: nothing was tested"
fi

# ---- 2. a rank killed while holding budget ----
( rank "$SHM2" holder hold ) &
holder=$!
for _ in $(seq 1 300); do grep -q '^HELD' "$TMP/holder.out" 2>/dev/null && break; sleep 0.1; done
held=$(field HELD "$TMP/holder.out")
if [ "${held:-0}" -ge 1 ]; then pass "holder pinned $held buffers"; else bad "holder pinned nothing"; cat "$TMP/holder.out" "$TMP/holder.err"; fi

if ( rank "$SHM2" beside run 4 ) && [ "$(field PROMOTED "$TMP/beside.out")" = 0 ] &&
   [ "$(field LOCAL_PEAK "$TMP/beside.out")" = 0 ]; then
    pass "a rank beside the live holder pins nothing: the node is full, and nobody takes a live rank's budget"
else
    bad "a rank beside the live holder: $(tr '\n' ' ' <"$TMP/beside.out")"
fi

kill -9 "$holder"; wait "$holder" 2>/dev/null; holder=
if ( rank "$SHM2" after run 8 ) && [ "$(field PROMOTED "$TMP/after.out")" -ge 1 ] &&
   [ "$(field LOCAL_PEAK "$TMP/after.out")" -le "$BUDGET" ]; then
    pass "after the holder was SIGKILLed, a new rank pins again ($(field PROMOTED "$TMP/after.out") buffers)"
else
    bad "after the holder was SIGKILLed: $(tr '\n' ' ' <"$TMP/after.out")"
fi
exit $fail
