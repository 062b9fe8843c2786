#!/usr/bin/env bash
# tests/check_bounce_off.sh BUILD: with PINSHIM_BOUNCE=off (mode full) test_bounce's large copies
# and test_bounce_memset's large memsets all go to the C library: the programs pass and the
# statistics show no shared call.  (make
# test's variants cover the modes: observe and pin share none, full shares them.)
set -u
BUILD=${1:-build}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT" || exit 1
case $BUILD in /*) ;; *) BUILD=$ROOT/$BUILD ;; esac
PROG=$BUILD/tests/fake/test_bounce
[ -x "$PROG" ] || { echo "FAIL missing $PROG (build first)"; exit 1; }
WORK=$(mktemp -d /tmp/pinshim-bounce-off.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
pass=0 fail=0
if env LD_LIBRARY_PATH="$BUILD/fakecuda" LD_PRELOAD="$BUILD/libpinshim.so" PINSHIM_MODE=full PINSHIM_BOUNCE=off \
        PINSHIM_STATS="$WORK/s.json" "$PROG" >"$WORK/out" 2>&1; then
    pass=$((pass + 1)); echo "PASS test_bounce with PINSHIM_BOUNCE=off: every result right"
else
    fail=$((fail + 1)); echo "FAIL test_bounce with PINSHIM_BOUNCE=off"; tail -5 "$WORK/out" | sed 's/^/    | /'
fi
grep -qx 'EXPECTED_BOUNCE shared=0' "$WORK/out" && n=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["bounce"]["count"])' "$WORK/s.json" 2>/dev/null)
if [ "${n:-x}" = 0 ]; then
    pass=$((pass + 1)); echo "PASS PINSHIM_BOUNCE=off: no copy shared (bounce.count 0)"
else
    fail=$((fail + 1)); echo "FAIL PINSHIM_BOUNCE=off: bounce.count ${n:-unreadable}, or the program expected sharing"
fi
# The same for memset (test_bounce_memset): every result right, none shared.
PROG=$BUILD/tests/fake/test_bounce_memset
if env LD_LIBRARY_PATH="$BUILD/fakecuda" LD_PRELOAD="$BUILD/libpinshim.so" PINSHIM_MODE=full PINSHIM_BOUNCE=off \
        PINSHIM_STATS="$WORK/m.json" "$PROG" >"$WORK/mout" 2>&1; then
    pass=$((pass + 1)); echo "PASS test_bounce_memset with PINSHIM_BOUNCE=off: every result right"
else
    fail=$((fail + 1)); echo "FAIL test_bounce_memset with PINSHIM_BOUNCE=off"; tail -5 "$WORK/mout" | sed 's/^/    | /'
fi
m=""
grep -qx 'EXPECTED_BOUNCE_SETS shared=0' "$WORK/mout" &&
    m=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["bounce"]["sets"])' "$WORK/m.json" 2>/dev/null)
if [ "${m:-x}" = 0 ]; then
    pass=$((pass + 1)); echo "PASS PINSHIM_BOUNCE=off: no memset shared (bounce.sets 0)"
else
    fail=$((fail + 1)); echo "FAIL PINSHIM_BOUNCE=off: bounce.sets ${m:-unreadable}, or the program expected sharing"
fi
echo "bounce off: $pass passed, $fail failed"
[ $fail -eq 0 ]
