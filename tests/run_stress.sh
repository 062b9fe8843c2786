#!/usr/bin/env bash
# Randomized differential stress on the checking fake driver (`make stress SEEDS=...`, and the
# long mode `make stress LONG=1`).
#
#   tests/run_stress.sh BUILD [SEEDS]
#
# SEEDS: a count N (seeds 1..N) or a range START:COUNT; default 3 (long mode: 1000).  Builds
# tests/stress/stress.c into BUILD/tests/stress/, then runs every seed without the shim and under
# each variant below.
# A variant passes when the program exits 0 (its own checks: driver answers, budget, zero pages,
# watchdog), prints the same CHECKSUM as the run without the shim, the fake driver reports no
# violation, and the shim wrote nothing to stderr unasked.  Every failure prints the command that
# replays it.  Settings (environment):
#   STRESS_THREADS (4), STRESS_OPS (300 per thread), STRESS_TIMEOUT (120 s per run),
#   STRESS_JOBS (1: seeds run one at a time), STRESS_VARIANTS (names to run, default all but
#   the extra ones; "all" for every one), FAKECUDA_ASYNC_DELAY_US (20),
#   STRESS_DELAYS (a list of FAKECUDA_ASYNC_DELAY_US values: seed N runs with the (N mod k)-th;
#   default the one above), STRESS_PER_SEED (0: every variant for each seed; K: K of them per
#   seed, in rotation, so that consecutive seeds cover them all), STRESS_POOL (256 live
#   64-256 KiB blocks per thread), STRESS_HOSTILE (0; 1 adds hostile but legal operations:
#   mappings made read-only then written, a signal handler that calls malloc),
#   STRESS_DEADLINE (seconds; no seed starts after it, and the run fails as incomplete; 0: none).
# Long mode (STRESS_LONG=1): 1000 seeds, one parallel job per CPU, delays "20 0" (async work
# delayed by 20 us, and run as soon as its worker gets to it), 1 of the 12 variants per seed
# besides the run without the shim (all 12 over every 12 seeds, each under both delays), 150
# operations per thread, 256 live blocks per thread (1024 per process), hostile operations on,
# a two-hour deadline: 2000 runs, 1.27 million operations, about 35 minutes on 2 cores (the
# runs' time is mostly the kernel's: page faults, mappings, forks); each setting above still
# overrides.
set -u
BUILD=${1:-build}
LONG=${STRESS_LONG:-}
[ "$LONG" = 0 ] && LONG=""
if [ -n "$LONG" ]; then
    SEEDS=${2:-1000}
    : "${STRESS_JOBS:=$(nproc 2>/dev/null || echo 2)}" "${STRESS_DELAYS:=20 0}" "${STRESS_PER_SEED:=1}"
    : "${STRESS_OPS:=150}" "${STRESS_POOL:=256}" "${STRESS_HOSTILE:=1}" "${STRESS_DEADLINE:=7200}"
    : "${STRESS_VARIANTS:=all}"
else
    SEEDS=${2:-3}
fi
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
read -r -a DELAYS <<<"${STRESS_DELAYS:-${FAKECUDA_ASYNC_DELAY_US:-20}}"
PER_SEED=${STRESS_PER_SEED:-0}
POOL=${STRESS_POOL:-256}
HOSTILE=${STRESS_HOSTILE:-0}
DEADLINE=${STRESS_DEADLINE:-0}
WATCHDOG=$((TMO > 20 ? TMO - 10 : TMO))

die() { echo "run_stress: $*" >&2; exit 2; }

[ -f "$SHIM" ] && [ -f "$FAKE/libcuda.so.1" ] || die "$SHIM or $FAKE/libcuda.so.1 missing: run make BUILD=$BUILD all first"

case $SEEDS in
    *:*) first=${SEEDS%%:*}; count=${SEEDS#*:} ;;
    *) first=1; count=$SEEDS ;;
esac
[[ $first =~ ^[0-9]+$ && $count =~ ^[0-9]+$ ]] || die "SEEDS must be a count N or START:COUNT, not '$SEEDS'"
[ "${#DELAYS[@]}" -gt 0 ] || die "STRESS_DELAYS is empty"
for d in "${DELAYS[@]}"; do [[ $d =~ ^[0-9]+$ ]] || die "STRESS_DELAYS: '$d' is not a number of microseconds"; done
[[ $PER_SEED =~ ^[0-9]+$ && $POOL =~ ^[0-9]+$ && $DEADLINE =~ ^[0-9]+$ ]] ||
    die "STRESS_PER_SEED, STRESS_POOL and STRESS_DEADLINE are whole numbers"

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

# A few pages under 8M, different for each run, so that separate runs never share a segment;
# removed at the end.
NODE_BUDGET=$(( (8 << 20) - ( ($$ % 255) + 1 ) * 4096 ))
trap 'rm -f "/dev/shm/pinshim-$(id -u)-$NODE_BUDGET"' EXIT
SMALL="PINSHIM_MIN_SIZE=4K PINSHIM_REWRITE_MIN=4K PINSHIM_REWRITE_ALWAYS=1 PINSHIM_STAGING_MIN=64K PINSHIM_STAGING_CHUNK=64K PINSHIM_BOUNCE=all PINSHIM_BOUNCE_MIN=64K"
ALL_VARIANTS=(
    "off|PINSHIM_MODE=off"
    "observe|PINSHIM_MODE=observe"
    "pin|PINSHIM_MODE=pin"
    "full|PINSHIM_MODE=full"
    "full-4M|PINSHIM_MODE=full PINSHIM_BUDGET=4M $SMALL"
    "full-16M|PINSHIM_MODE=full PINSHIM_BUDGET=16M $SMALL"
    "full-2M-chunks|PINSHIM_MODE=full PINSHIM_STAGING_MIN=64K PINSHIM_STAGING_CHUNK=2M PINSHIM_STAGING_BUFFERS=2 PINSHIM_BOUNCE=all"
    # The event trace written on every path (into a device node: the lines' shape is
    # tests/check_trace.sh's to check; here, that tracing changes nothing under threads, forks and
    # signals).
    "full-traced|PINSHIM_MODE=full PINSHIM_TRACE=/dev/null $SMALL"
    # Every registration takes 2 ms, as a real one of a few dozen MiB does: background
    # registrations and the staging buffers' stay under way while frees, munmaps, forks, program
    # registrations and copies of the same blocks go on.  The cost model told as much (400 ms/GiB),
    # so that blocks above 640 KiB register in the background and smaller ones on the copy's path.
    "full-slow-register|PINSHIM_MODE=full PINSHIM_BUDGET=16M FAKECUDA_REGISTER_DELAY_US=2000 PINSHIM_REGISTER_COST=400000 $SMALL"
    # Registrations of 8 ms and the default budget: a checkpoint round's burst of freed blocks
    # queues up for the pinned cache, and the round after takes blocks back from the queue while
    # the registrar holds the burst off (other threads copy).
    "full-slow-cache|PINSHIM_MODE=full FAKECUDA_REGISTER_DELAY_US=8000"
    "pin-4M|PINSHIM_MODE=pin PINSHIM_BUDGET=4M PINSHIM_MIN_SIZE=4K"
    # A node budget half the process budget, shared by this run's processes (seeds run at once
    # in the long mode): reservations from the registrar thread and from copies' paths, slots
    # of processes killed or exited, the segment attached at start-up.
    "full-node-budget|PINSHIM_MODE=full PINSHIM_BUDGET=16M PINSHIM_NODE_BUDGET=$NODE_BUDGET $SMALL"
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

[ "$PER_SEED" -gt "${#VARIANTS[@]}" ] && PER_SEED=${#VARIANTS[@]}

rm -rf "$LOGDIR"; mkdir -p "$LOGDIR"
ARGS=(--threads "$THREADS" --ops "$OPS" --watchdog "$WATCHDOG" --pool "$POOL")

# delay_of SEED: the FAKECUDA_ASYNC_DELAY_US of that seed's runs.  With K variants per seed, the
# delay changes with each full turn of the rotation (seed_variants), so that every variant runs
# under every delay whatever the number of variants.
delay_of() {
    local i=$1
    [ "$PER_SEED" -gt 0 ] && i=$(($1 * PER_SEED / ${#VARIANTS[@]}))
    echo "${DELAYS[$((i % ${#DELAYS[@]}))]}"
}

# replay_cmd VARIANT_ENV SEED: the exact command line of one run.
replay_cmd() {
    local venv=$1 seed=$2 pre=""
    [ -n "$venv" ] && pre="LD_PRELOAD=$SHIM $venv "
    echo "cd $ROOT && env LD_LIBRARY_PATH=$FAKE FAKECUDA_ASYNC_DELAY_US=$(delay_of "$seed") STRESS_HOSTILE=$HOSTILE" \
         "${pre}$BIN --seed $seed ${ARGS[*]}"
}

# run_one SEED NAME VARIANT_ENV: run, leave NAME.log and NAME.err; prints rc.
run_one() {
    local seed=$1 name=$2 venv=$3 dir=$LOGDIR/seed-$1
    local envs=(LD_LIBRARY_PATH="$FAKE" FAKECUDA_ASYNC_DELAY_US="$(delay_of "$seed")" STRESS_HOSTILE="$HOSTILE")
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
    case $rc in 124|137|99) echo "HANG 1" >>"$out" ;; esac
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
    for v in $(seed_variants "$seed"); do
        v=${VARIANTS[$v]}
        name=${v%%|*}; venv=${v#*|}
        rc=$(run_one "$seed" "$name" "$venv")
        case $rc in 124|137|99) echo "HANG 1" >>"$out" ;; esac
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
    if [ -n "$LONG" ]; then grep -A12 '^FAIL' "$out" | grep -E '^(FAIL|    )'; else grep -E '^(PASS|FAIL|    )' "$out"; fi
}

# seed_variants SEED: the indices in VARIANTS of the variants that seed runs.
seed_variants() {
    local n=${#VARIANTS[@]} k=$PER_SEED j
    [ "$k" -eq 0 ] && k=$n
    for ((j = 0; j < k; j++)); do echo $(((($1 * k) + j) % n)); done
}

echo "== stress: seeds $first..$((first + count - 1)), $THREADS threads x $OPS ops, $POOL live blocks per thread," \
     "hostile operations $([ "$HOSTILE" = 1 ] && echo on || echo off), variants: plain" \
     "$(for v in "${VARIANTS[@]}"; do printf '%s ' "${v%%|*}"; done)$([ "$PER_SEED" -gt 0 ] && echo "($PER_SEED per seed) ")" \
     "(FAKECUDA_ASYNC_DELAY_US=${DELAYS[*]}$([ "${#DELAYS[@]}" -gt 1 ] && echo ' by seed'), $JOBS job(s))"
t0=$(date +%s)
stopped=""
for ((s = first; s < first + count; s++)); do
    if [ "$DEADLINE" -gt 0 ] && [ $(($(date +%s) - t0)) -ge "$DEADLINE" ]; then
        stopped=$s
        break
    fi
    if [ -n "$LONG" ] && [ $(((s - first) % 50)) -eq 0 ]; then
        echo "   seed $s of $first..$((first + count - 1)), $(($(date +%s) - t0)) s"
    fi
    if [ "$JOBS" -le 1 ]; then
        run_seed "$s"
    else
        while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n; done
        run_seed "$s" &
    fi
done
wait

pass=0 fail=0 ops=0 viol=0 seeds=0 hangs=0
for ((s = first; s < first + count; s++)); do
    r=$LOGDIR/seed-$s/result
    [ -f "$r" ] || continue
    seeds=$((seeds + 1))
    pass=$((pass + $(grep -c '^PASS' "$r")))
    fail=$((fail + $(grep -c '^FAIL' "$r")))
    while read -r k n; do
        case $k in OPS) ops=$((ops + n)) ;; VIOL) viol=$((viol + n)) ;; HANG) hangs=$((hangs + n)) ;; esac
    done < <(grep -E '^(OPS|VIOL|HANG) ' "$r")
done
echo "stress totals: $seeds seeds, $((pass + fail)) runs, $ops operations, $viol violations, $hangs hangs," \
     "$(($(date +%s) - t0)) s; logs in $LOGDIR"
if [ -n "$stopped" ]; then
    echo "incomplete: the ${DEADLINE} s deadline passed before seed $stopped; seeds $stopped..$((first + count - 1)) did not run"
    fail=$((fail + 1))
fi
if [ "$fail" -gt 0 ]; then
    echo "failed:"
    grep -h '^FAIL' "$LOGDIR"/seed-*/result | sed 's/^/  /'
fi
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
