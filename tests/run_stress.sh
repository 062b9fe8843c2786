#!/usr/bin/env bash
# Randomized differential stress on the checking fake driver (`make stress SEEDS=...`).
#
#   tests/run_stress.sh BUILD [SEEDS]
#
# SEEDS: a count N (seeds 1..N) or a range START:COUNT; default 3.  Builds tests/stress/stress.c
# into BUILD/tests/stress/, then runs every seed without the shim and under each variant below.
# A variant passes when the program exits 0 (its own checks: driver answers, budget, zero pages,
# watchdog), prints the same CHECKSUM as the run without the shim, the fake driver reports no
# violation, and the shim wrote nothing to stderr unasked.  Every failure prints the command that
# replays it.  Settings (environment):
#   STRESS_THREADS (4), STRESS_OPS (300 per thread), STRESS_TIMEOUT (120 s per run),
#   STRESS_JOBS (1: seeds run one at a time), STRESS_VARIANTS (names to run, default all but
#   the extra ones; "all" for every one), FAKECUDA_ASYNC_DELAY_US (20).
set -u
BUILD=${1:-build}
SEEDS=${2:-3}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
SHIM=$ROOT/$BUILD/libpinshim.so
FAKE=$ROOT/$BUILD/fakecuda
BIN=$ROOT/$BUILD/tests/stress/stress
LOGDIR=$ROOT/$BUILD/stress-logs
THREADS=${STRESS_THREADS:-4}
OPS=${STRESS_OPS:-300}
TMO=${STRESS_TIMEOUT:-120}
JOBS=${STRESS_JOBS:-1}
DELAY=${FAKECUDA_ASYNC_DELAY_US:-20}
WATCHDOG=$((TMO > 20 ? TMO - 10 : TMO))

die() { echo "run_stress: $*" >&2; exit 2; }

[ -f "$SHIM" ] && [ -f "$FAKE/libcuda.so.1" ] || die "$SHIM or $FAKE/libcuda.so.1 missing: run make BUILD=$BUILD all first"

case $SEEDS in
    *:*) first=${SEEDS%%:*}; count=${SEEDS#*:} ;;
    *) first=1; count=$SEEDS ;;
esac
[[ $first =~ ^[0-9]+$ && $count =~ ^[0-9]+$ ]] || die "SEEDS must be a count N or START:COUNT, not '$SEEDS'"

# Build the generator program, with the test programs' flags.
CUDA_INC=${CUDA_INC:-$(for d in /usr/local/cuda /usr/local/cuda-* /usr; do [ -f "$d/include/cuda.h" ] && { echo "$d/include"; break; }; done)}
mkdir -p "$(dirname "$BIN")"
if [ ! -x "$BIN" ] || [ tests/stress/stress.c -nt "$BIN" ] || [ "$FAKE/libcuda.so.1" -nt "$BIN" ] ||
   [ tests/fake/drvtest.h -nt "$BIN" ] || [ tests/fakecuda/fakecuda.h -nt "$BIN" ]; then
    ${CC:-gcc} -std=gnu11 -O2 -g -pthread -Wall -Wextra -Werror -Wno-unused-parameter -Wshadow -Wformat=2 \
        -I"$CUDA_INC" -Ishim -Itests/fakecuda -Itests -o "$BIN.tmp" tests/stress/stress.c \
        -L"$FAKE" -lcuda -ldl -lrt -lm || die "cannot build tests/stress/stress.c"
    mv -f "$BIN.tmp" "$BIN"
fi

SMALL="PINSHIM_MIN_SIZE=4K PINSHIM_REWRITE_MIN=4K PINSHIM_REWRITE_ALWAYS=1 PINSHIM_STAGING_MIN=64K PINSHIM_STAGING_CHUNK=64K"
ALL_VARIANTS=(
    "off|PINSHIM_MODE=off"
    "observe|PINSHIM_MODE=observe"
    "pin|PINSHIM_MODE=pin"
    "full|PINSHIM_MODE=full"
    "full-4M|PINSHIM_MODE=full PINSHIM_BUDGET=4M $SMALL"
    "full-16M|PINSHIM_MODE=full PINSHIM_BUDGET=16M $SMALL"
    "pin-4M|PINSHIM_MODE=pin PINSHIM_BUDGET=4M PINSHIM_MIN_SIZE=4K"
)
EXTRA_VARIANTS=" pin-4M "
want=${STRESS_VARIANTS:-}
VARIANTS=()
for v in "${ALL_VARIANTS[@]}"; do
    n=${v%%|*}
    if [ -z "$want" ]; then
        case $EXTRA_VARIANTS in *" $n "*) continue ;; esac
    elif [ "$want" != all ]; then
        case " $want " in *" $n "*) ;; *) continue ;; esac
    fi
    VARIANTS+=("$v")
done

rm -rf "$LOGDIR"; mkdir -p "$LOGDIR"
ARGS=(--threads "$THREADS" --ops "$OPS" --watchdog "$WATCHDOG")

# replay_cmd VARIANT_ENV SEED: the exact command line of one run.
replay_cmd() {
    local venv=$1 seed=$2 pre=""
    [ -n "$venv" ] && pre="LD_PRELOAD=$SHIM $venv "
    echo "cd $ROOT && env LD_LIBRARY_PATH=$FAKE FAKECUDA_ASYNC_DELAY_US=$DELAY ${pre}$BIN --seed $seed ${ARGS[*]}"
}

# run_one SEED NAME VARIANT_ENV: run, leave NAME.log and NAME.err; prints rc.
run_one() {
    local seed=$1 name=$2 venv=$3 dir=$LOGDIR/seed-$1
    local envs=(LD_LIBRARY_PATH="$FAKE" FAKECUDA_ASYNC_DELAY_US="$DELAY")
    if [ -n "$venv" ]; then
        envs+=(LD_PRELOAD="$SHIM")
        # shellcheck disable=SC2206
        envs+=($venv)
    fi
    timeout -k 5 "$TMO" env "${envs[@]}" "$BIN" --seed "$seed" "${ARGS[@]}" >"$dir/$name.log" 2>"$dir/$name.err"
    echo $?
}

field() { sed -n "s/^$1 //p" "$2" | tail -1; }

# run_seed SEED: every variant of one seed; writes its report lines to seed-N/result.
run_seed() {
    local seed=$1 dir=$LOGDIR/seed-$1 out
    mkdir -p "$dir"
    out=$dir/result
    : >"$out"
    local rc ref ops viol
    rc=$(run_one "$seed" plain "")
    ref=$(field CHECKSUM "$dir/plain.log")
    ops=$(field OPS "$dir/plain.log"); viol=$(grep -c 'fakecuda: VIOLATION' "$dir/plain.err")
    echo "OPS ${ops:-0}" >>"$out"; echo "VIOL $viol" >>"$out"
    if [ "$rc" = 0 ] && [ -n "$ref" ] && [ "$viol" = 0 ]; then
        echo "PASS seed $seed [plain] checksum $ref" >>"$out"
    else
        {
            echo "FAIL seed $seed [plain] (exit $rc, violations $viol): the program itself or the fake driver; replay:"
            echo "    $(replay_cmd "" "$seed")"
            cat "$dir/plain.log" "$dir/plain.err" | grep -E 'MISMATCH|BUDGET|WATCHDOG|fakecuda: VIOLATION|FAIL|FATAL' | head -10 | sed 's/^/    | /'
        } >>"$out"
        ref=""
    fi
    local v name venv sum why
    for v in "${VARIANTS[@]}"; do
        name=${v%%|*}; venv=${v#*|}
        rc=$(run_one "$seed" "$name" "$venv")
        sum=$(field CHECKSUM "$dir/$name.log")
        ops=$(field OPS "$dir/$name.log"); viol=$(grep -c 'fakecuda: VIOLATION' "$dir/$name.err")
        echo "OPS ${ops:-0}" >>"$out"; echo "VIOL $viol" >>"$out"
        why=""
        case $rc in
            0) ;;
            124|137) why="timed out after ${TMO}s" ;;
            86) why="exit 86 (the fake driver's violation status)" ;;
            99) why="watchdog" ;;
            *) why="exit $rc" ;;
        esac
        [ "$viol" != 0 ] && why="${why:+$why; }$viol violation(s)"
        if [ -z "$sum" ]; then
            why="${why:+$why; }no CHECKSUM line"
        elif [ -z "$ref" ]; then
            why="${why:+$why; }no reference checksum (the plain run failed)"
        elif [ "$sum" != "$ref" ]; then
            why="${why:+$why; }checksum $sum differs from the plain run's $ref"
        fi
        grep -q 'pinshim' "$dir/$name.err" && why="${why:+$why; }the shim wrote to stderr unasked"
        if [ -z "$why" ]; then
            echo "PASS seed $seed [$name]" >>"$out"
        else
            {
                echo "FAIL seed $seed [$name]: $why; replay:"
                echo "    $(replay_cmd "$venv" "$seed")"
                echo "    (STRESS_DUMP=FILE on both this and the plain run writes the logs to diff)"
                cat "$dir/$name.log" "$dir/$name.err" | grep -E 'MISMATCH|BUDGET|WATCHDOG|fakecuda: VIOLATION|FAIL|FATAL|pinshim' |
                    head -10 | sed 's/^/    | /'
            } >>"$out"
        fi
    done
    grep -E '^(PASS|FAIL|    )' "$out"
}

echo "== stress: seeds $first..$((first + count - 1)), $THREADS threads x $OPS ops, variants: plain" \
     "$(for v in "${VARIANTS[@]}"; do printf '%s ' "${v%%|*}"; done)(FAKECUDA_ASYNC_DELAY_US=$DELAY)"
t0=$(date +%s)
for ((s = first; s < first + count; s++)); do
    if [ "$JOBS" -le 1 ]; then
        run_seed "$s"
    else
        while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n; done
        run_seed "$s" &
    fi
done
wait

pass=0 fail=0 ops=0 viol=0 seeds=0
for ((s = first; s < first + count; s++)); do
    r=$LOGDIR/seed-$s/result
    [ -f "$r" ] || continue
    seeds=$((seeds + 1))
    pass=$((pass + $(grep -c '^PASS' "$r")))
    fail=$((fail + $(grep -c '^FAIL' "$r")))
    while read -r k n; do
        case $k in OPS) ops=$((ops + n)) ;; VIOL) viol=$((viol + n)) ;; esac
    done < <(grep -E '^(OPS|VIOL) ' "$r")
done
echo "stress totals: $seeds seeds, $((pass + fail)) runs, $ops operations, $viol violations, $(($(date +%s) - t0)) s; logs in $LOGDIR"
if [ "$fail" -gt 0 ]; then
    echo "failed:"
    grep -h '^FAIL' "$LOGDIR"/seed-*/result | sed 's/^/  /'
fi
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
