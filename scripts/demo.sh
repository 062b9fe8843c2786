#!/usr/bin/env bash
# demo.sh BUILD [--installed PREFIX] (`make demo`): the bundled training-style loop
# (bench/drv_train_loop.c) run without and with pinshim by scripts/pinshim-ab, then once more with
# the shim's text report.  With --installed, the scripts and the library are the ones installed
# under PREFIX (PREFIX/bin/pinshim-ab finding PREFIX/lib/libpinshim.so by itself); the workload
# and the fake driver still come from BUILD.
#
# On a machine without a GPU it runs against the checking fake driver in BUILD/fakecuda: that
# shows what the shim does (and checks it does it correctly), but its timings mean nothing.
# Settings: DEMO_RUNS (3) A/B pairs; DEMO_ARGS arguments for the loop (default: 64 MiB batch,
# 16 MiB result, 50 steps on a GPU; the loop's small defaults on the fake driver).
set -u
BUILD=${1:-build}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
LIB=$BUILD/libpinshim.so
PROG=$BUILD/bench/drv_train_loop
RUNS=${DEMO_RUNS:-3}
SCRIPTS=$ROOT/scripts
if [ "${2:-}" = --installed ]; then
    PREFIX=${3:?demo: --installed needs a PREFIX}
    SCRIPTS=$PREFIX/bin
    LIB=$PREFIX/lib/libpinshim.so
fi

for f in "$LIB" "$PROG" "$SCRIPTS/pinshim" "$SCRIPTS/pinshim-ab"; do
    if [ ! -e "$f" ]; then
        echo "demo: $f is missing: run \`make\` (or \`make install\`) first" >&2
        exit 2
    fi
done
LIB=$(cd "$(dirname "$LIB")" && pwd)/$(basename "$LIB")
# From a source tree the scripts are told which library to use; installed ones find their own.
LIBOPT=(--lib "$LIB")
[ "$SCRIPTS" = "$ROOT/scripts" ] || LIBOPT=()

fake=0
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
    fake=1
fi

banner() {
    echo "======================================================================================"
    echo " NO GPU FOUND: this demo runs against pinshim's checking FAKE DRIVER ($BUILD/fakecuda)."
    echo " Timings against the fake driver mean NOTHING. The demo only shows the mechanics (what"
    echo " the shim promotes, stages and rewrites) and the shim's report. Run it on a machine with"
    echo " an NVIDIA GPU for real numbers."
    echo "======================================================================================"
}

if [ $fake = 1 ]; then
    if [ ! -e "$BUILD/fakecuda/libcuda.so.1" ]; then
        echo "demo: no GPU and no fake driver ($BUILD/fakecuda/libcuda.so.1): run \`make\` first" >&2
        exit 2
    fi
    FAKEDIR=$(cd "$BUILD/fakecuda" && pwd)
    export LD_LIBRARY_PATH=$FAKEDIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    banner
    echo
    read -r -a ARGS <<<"${DEMO_ARGS:-}"
else
    echo "pinshim demo on $(nvidia-smi --query-gpu=name --format=csv,noheader | head -n1)"
    echo
    read -r -a ARGS <<<"${DEMO_ARGS:---batch 64M --result 16M --steps 50}"
fi

echo "The workload: a training-style loop (fill a pageable batch, cuMemcpyHtoD, a small device"
echo "step, cuMemcpyDtoH of the result, verify it), driver API only:"
echo "  $PROG ${ARGS[*]}"
echo
echo "1) A/B: A = without changes (shim in observe mode, to count), B = pinshim, mode full"
echo

keep=$(mktemp -d "${TMPDIR:-/tmp}/pinshim-demo.XXXXXX")
trap 'rm -rf "$keep"' EXIT
rc=0
"$SCRIPTS/pinshim-ab" "${LIBOPT[@]}" -n "$RUNS" --warmup 1 --quiet --keep "$keep/ab" -- \
    "$PROG" "${ARGS[@]}" || rc=1

echo
echo "2) One run with the shim's text report (PINSHIM_REPORT=1):"
echo
"$SCRIPTS/pinshim" "${LIBOPT[@]}" --mode full --report -- "$PROG" "${ARGS[@]}" \
    >"$keep/out.txt" 2>"$keep/report.txt" || rc=1
grep -v '^RESULT ' "$keep/out.txt"
echo
cat "$keep/report.txt"

if [ $fake = 1 ]; then
    # The fake driver checks the copy contract and says VIOLATION when the shim breaks it.
    v=$(grep -rh "fakecuda: VIOLATION" "$keep" 2>/dev/null | head -n 5)
    if [ -n "$v" ]; then
        echo
        echo "demo: the fake driver reported contract violations:"
        echo "$v"
        rc=1
    fi
    echo
    banner
fi
if [ $rc != 0 ]; then
    echo "demo: FAILED (see above)" >&2
fi
exit $rc
