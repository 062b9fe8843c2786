#!/usr/bin/env bash
# gpu_session.sh: everything a session on a GPU machine does, in one command, within a time
# budget: build (make all), the GPU suite (tests/gpu/run_gpu_tests.sh), then `make bench` on the
# benchmark groups asked for.  What it leaves in $OUT is a few files:
#   session.tar.gz  every log: build.log, gpu-suite.log and gpu/ (the suite's logs and results),
#                   bench/ (the benchmark results directory: raw/, summary.md, results.*, ...)
#   summary.md      the benchmarks' summary (bench/summarize.py)
#   session.txt     what ran, how long each stage took, the suite's counts and every target
# and it ends by printing session.txt (a few kB: the end of the output is what one sees).
#
# usage: scripts/gpu_session.sh [--bench GROUPS] [--quick] [--budget SECONDS] [--no-suite]
#   --bench a,b,c     benchmark groups, in the order to run them (bench/run_bench.sh's
#                     BENCH_ONLY names; "all": every group; "none": no benchmark); default all
#   --quick           BENCH_QUICK=1: small sizes, one repetition (a smoke run of the scripts)
#   --budget SECONDS  wall time for the whole call, packing included (default 540: a command
#                     on the lent machines may run 600 s).  A stage, or a benchmark group, whose
#                     estimated time does not fit in what is left is skipped, and said so; each
#                     stage runs under `timeout` of what is left
#   --no-suite        skip the GPU suite
#   --probe NAME      after the benchmarks, a probe of bench/probes/ (staged_settings: where a
#                     staged copy's time goes, settings varied one at a time; model_settings:
#                     the model benchmark under staging settings; model_split: model.to
#                     against the same move tensor by tensor); its table is printed with the
#                     report.  May be repeated
# Environment: OUT (default build/gpu-session); BENCH_COMMIT, the commit to name where the tree
# came without its history; GPU_SESSION_EST (below); and anything bench/run_bench.sh reads (BENCH_REPS, BENCH_DL_REPS,
# ...; the estimates below assume their defaults).
# uthash.h: where /usr/include/uthash.h is missing, a copy in .carry/include/ is used.
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT" || exit 2

GROUPS_ASKED=all
QUICK=0
BUDGET=540
SUITE=1
PROBES=()
usage() { awk 'NR > 1 && !/^#/ { exit } NR > 1' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
while [ $# -gt 0 ]; do
    case $1 in
    --bench) [ $# -ge 2 ] || usage; GROUPS_ASKED=$2; shift 2 ;;
    --bench=*) GROUPS_ASKED=${1#*=}; shift ;;
    --quick) QUICK=1; shift ;;
    --budget) [ $# -ge 2 ] || usage; BUDGET=$2; shift 2 ;;
    --budget=*) BUDGET=${1#*=}; shift ;;
    --no-suite) SUITE=0; shift ;;
    --probe) [ $# -ge 2 ] || usage; PROBES+=("$2"); shift 2 ;;
    --probe=*) PROBES+=("${1#*=}"); shift ;;
    -h | --help) usage ;;
    *) echo "gpu_session: unknown argument $1" >&2; usage ;;
    esac
done
[[ "$BUDGET" =~ ^[0-9]+$ ]] || { echo "gpu_session: --budget takes seconds" >&2; exit 2; }

# Estimated seconds per stage and per benchmark group on the H200 machine, full and --quick
# (docs/benchmarks.md says how they were reached).
declare -A EST_FULL=(
    [build]=20 [suite]=300
    [malloc]=60 [heap]=45 [sweep]=70 [loop]=45 [latency]=80 [staging]=15 [train]=60 [drv]=15
    [two]=30 [torch]=90 [cupy]=30 [ab]=15 [model]=150 [safetensors]=70 [dataloader]=110
    [fresh]=90 [two_fresh]=45 [bounce]=60 [jax]=75 [staged_settings]=100 [model_settings]=170 [model_split]=170
)
declare -A EST_QUICK=(
    [build]=60 [suite]=300
    [malloc]=10 [heap]=8 [sweep]=10 [loop]=5 [latency]=5 [staging]=3 [train]=10 [drv]=3
    [two]=5 [torch]=25 [cupy]=8 [ab]=8 [model]=35 [safetensors]=18 [dataloader]=40
    [fresh]=5 [two_fresh]=3 [bounce]=3 [jax]=20 [staged_settings]=100 [model_settings]=170 [model_split]=170
)
# GPU_SESSION_EST="suite=160 latency=70": estimates measured on the machine at hand, in seconds,
# replace these for this call (the planner keeps the groups' time for them, so a high suite
# estimate leaves none on a short call).
for kv in ${GPU_SESSION_EST:-}; do
    k=${kv%%=*} v=${kv#*=}
    if [[ -n ${EST_FULL[$k]+x} && $v =~ ^[0-9]+$ ]]; then
        EST_FULL[$k]=$v
    else
        echo "gpu_session: GPU_SESSION_EST: '$kv' is not NAME=SECONDS for a known stage or group" >&2
        exit 2
    fi
done
# bench/run_bench.sh's order.
ALL_GROUPS="malloc heap sweep loop latency staging train drv two torch cupy model safetensors dataloader fresh two_fresh bounce jax ab"
# Seconds kept for summarizing and packing.
RESERVE=20

OUT=${OUT:-$ROOT/build/gpu-session}
mkdir -p "$OUT" || exit 2
OUT=$(cd "$OUT" && pwd)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/pinshim-session.XXXXXX") || exit 2
T0=$(date +%s)
elapsed() { echo $(($(date +%s) - T0)); }
left() { echo $((BUDGET - RESERVE - $(elapsed))); }
est() {
    if [ "$QUICK" = 1 ]; then echo "${EST_QUICK[$1]:-30}"; return; fi
    # The latency group's time is its pairs' (BENCH_LATENCY_REPS, 30 by default).
    if [ "$1" = latency ] && [[ "${BENCH_LATENCY_REPS:-}" =~ ^[0-9]+$ ]]; then
        echo $((5 + EST_FULL[latency] * BENCH_LATENCY_REPS / 30)); return
    fi
    echo "${EST_FULL[$1]:-60}"
}

REPORT=$WORK/session.txt
STAGES=()   # "name|status|seconds|note"
note_stage() { STAGES+=("$1|$2|$3|$4"); echo "[session] $1: $2 (${3}s) $4" >&2; }

# run_stage NAME LIMIT LOG CMD...: CMD under timeout of LIMIT seconds; sets STAGE_RC,
# STAGE_SECS and STAGE_STATUS.
run_stage() {
    local name=$1 lim=$2 log=$3
    shift 3
    local t0
    [ "$lim" -ge 1 ] || lim=1
    t0=$(date +%s)
    echo "[session] $name: started, at most ${lim}s" >&2
    timeout -k 10 "$lim" "$@" >"$log" 2>&1
    STAGE_RC=$?
    STAGE_SECS=$(($(date +%s) - t0))
    if [ $STAGE_RC = 124 ] || [ $STAGE_RC = 137 ]; then
        STAGE_STATUS="TIMED OUT"
    elif [ $STAGE_RC = 0 ]; then
        STAGE_STATUS=ok
    else
        STAGE_STATUS="FAILED (exit $STAGE_RC)"
    fi
}

# fits NAME [SECONDS]: whether NAME's estimate fits in what is left, less SECONDS.
fits() { [ "$(est "$1")" -le $(($(left) - ${2:-0})) ]; }

# The benchmark groups that fit, in the order asked, planned before anything runs: the build
# and the suite are estimated first, and the suite may not eat into the groups' time.
case $GROUPS_ASKED in
all) wanted=$ALL_GROUPS ;;
none | "") wanted="" ;;
*) wanted=${GROUPS_ASKED//,/ } ;;
esac
avail=$(($(left) - $(est build)))
[ $SUITE = 1 ] && avail=$((avail - $(est suite)))
chosen=() dropped=()
planned=0
# The probes first: asked for by name, they are what the call is for.
probes=()
probes_planned=0
for pr in "${PROBES[@]}"; do
    if [ ! -x "$ROOT/bench/probes/$pr.sh" ] || [ -z "${EST_FULL[$pr]+x}" ]; then
        dropped+=("$pr (no such probe)")
    elif [ $((planned + $(est "$pr"))) -le "$avail" ]; then
        probes+=("$pr")
        planned=$((planned + $(est "$pr")))
        probes_planned=$((probes_planned + $(est "$pr")))
    else
        dropped+=("$pr (estimate $(est "$pr")s)")
    fi
done
for g in $wanted; do
    if [[ " $ALL_GROUPS " != *" $g "* ]]; then
        dropped+=("$g (no such group)")
        continue
    fi
    # malloc runs what heap runs, and more.
    [ "$g" = heap ] && [[ " $wanted " == *" malloc "* ]] && continue
    e=$(est "$g")
    if [ $((planned + e)) -le $avail ]; then
        chosen+=("$g")
        planned=$((planned + e))
    else
        dropped+=("$g (estimate ${e}s)")
    fi
done

{
    echo "commit=${BENCH_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"
    echo "host=$(uname -srm), $(nproc) cores"
    gpu=$(nvidia-smi -L 2>/dev/null | head -n 1)
    echo "gpu=${gpu:-none}"
    echo "quick=$QUICK budget=${BUDGET}s groups=$GROUPS_ASKED suite=$SUITE"
} >"$WORK/env.txt"

# ------------------------------------------------------------------ 1. build
UTH=()
if [ ! -f /usr/include/uthash.h ]; then
    if [ -f "$ROOT/.carry/include/uthash.h" ]; then
        UTH=(UTHASH_INC="$ROOT/.carry/include")
    else
        echo "[session] WARNING: no uthash.h in /usr/include nor in .carry/include: the build will fail" >&2
    fi
fi
BUILD_OK=0
if fits build; then
    lim=$(left)
    [ "$lim" -gt $(($(est build) * 3)) ] && lim=$(($(est build) * 3))
    run_stage build "$lim" "$WORK/build.log" make -j"$(nproc)" all "${UTH[@]}"
    [ $STAGE_RC = 0 ] && BUILD_OK=1
    note="$( [ $STAGE_RC = 0 ] || tail -n 3 "$WORK/build.log" | tr '\n' ' ' | cut -c1-300)"
    note_stage build "$STAGE_STATUS" "$STAGE_SECS" "$note"
else
    note_stage build skipped 0 "estimate $(est build)s > $(left)s left"
fi

# ------------------------------------------------------------------ 2. GPU suite
SUITE_COUNTS="not run"
if [ $SUITE = 0 ]; then
    note_stage suite skipped 0 "--no-suite"
elif [ $BUILD_OK = 0 ]; then
    note_stage suite skipped 0 "the build failed or did not run"
elif ! fits suite "$planned"; then
    note_stage suite skipped 0 "estimate $(est suite)s > $(($(left) - planned))s left beside the benchmarks"
else
    run_stage suite $(($(left) - planned)) "$WORK/gpu-suite.log" tests/gpu/run_gpu_tests.sh build "$WORK/gpu"
    # Counted from the result files, which a suite stopped at its time limit leaves too.
    res=$(cat "$WORK"/gpu/results/*.res 2>/dev/null)
    SUITE_COUNTS="$(grep -c '^PASS' <<<"$res") passed, $(grep -c '^FAIL' <<<"$res") failed, $(grep -c '^SKIP' <<<"$res") skipped"
    # A failing check makes the suite exit 1 after its count: the stage itself ran through.
    [ "$STAGE_STATUS" = "FAILED (exit 1)" ] && grep -q '^[0-9]* passed, [0-9]* failed' "$WORK/gpu-suite.log" &&
        STAGE_STATUS="ran, FAILURES"
    note_stage suite "$STAGE_STATUS" "$STAGE_SECS" "$SUITE_COUNTS"
fi

# ------------------------------------------------------------------ 3. benchmarks
if [ $BUILD_OK = 0 ] && [ ${#chosen[@]} -gt 0 ]; then
    note_stage bench skipped 0 "the build failed or did not run"
elif [ ${#chosen[@]} -gt 0 ]; then
    only=$(IFS=,; echo "${chosen[*]}")
    lim=$(($(left) - probes_planned))   # the probes' time is theirs
    per_run=$((lim < 600 ? lim : 600))
    quick_env=()
    [ "$QUICK" = 1 ] && quick_env=(BENCH_QUICK=1)
    mkdir -p "$ROOT/build/bench-tmp"
    run_stage bench "$lim" "$WORK/bench.log" env OUT="$WORK/bench" BENCH_ONLY="$only" BENCH_TIMEOUT="$per_run" \
        BENCH_TMP="$ROOT/build/bench-tmp" "${quick_env[@]}" make bench "${UTH[@]}"
    rm -rf "$ROOT/build/bench-tmp"
    if [ ! -f "$WORK/bench/summary.md" ] || [ "$STAGE_STATUS" != ok ]; then
        # Stopped early: what finished is in raw/.
        python3 bench/summarize.py "$WORK/bench" >>"$WORK/bench.log" 2>&1
    fi
    note="groups $only (planned $((planned - probes_planned))s)"
    [ ${#dropped[@]} -gt 0 ] && note="$note; NOT RUN: ${dropped[*]}"
    note_stage bench "$STAGE_STATUS" "$STAGE_SECS" "$note"
else
    note="no group asked"
    [ ${#dropped[@]} -gt 0 ] && note="NOT RUN: ${dropped[*]}"
    note_stage bench skipped 0 "$note"
fi

# ------------------------------------------------------------------ 4. probes
for pr in "${probes[@]}"; do
    if [ $BUILD_OK = 0 ]; then
        note_stage "$pr" skipped 0 "the build failed or did not run"
    else
        run_stage "$pr" "$(left)" "$WORK/probe-$pr.log" env OUT="$WORK/probes" "bench/probes/$pr.sh" build
        note_stage "$pr" "$STAGE_STATUS" "$STAGE_SECS" ""
    fi
done

# ------------------------------------------------------------------ report
{
    echo "== pinshim GPU session: $(tr '\n' ';' <"$WORK/env.txt" | sed 's/;$//')"
    printf '%-7s %-16s %6s  %s\n' stage status seconds note
    for s in "${STAGES[@]}"; do
        IFS='|' read -r n st sec nt <<<"$s"
        printf '%-7s %-16s %6s  %s\n' "$n" "$st" "$sec" "$nt"
    done
    if ls "$WORK"/gpu/results/*.res >/dev/null 2>&1; then
        nfail=$(cat "$WORK"/gpu/results/*.res | grep -c '^FAIL')
        if [ "$nfail" -gt 0 ]; then
            echo "GPU suite failures ($nfail; the first 12):"
            cat "$WORK"/gpu/results/*.res | grep '^FAIL' | sort | head -n 12 | cut -c1-200
        fi
    fi
    sum=$WORK/bench/summary.md
    if [ -f "$sum" ]; then
        grep -q 'QUICK RUN' "$sum" && echo "(QUICK RUN: small sizes, not a measurement)"
        echo "targets (result | what | measured | target | note), groups that ran:"
        # The summary's target table, less the rows of groups that were not run.
        awk '/^## Against the targets/ { on = 1; next }
            on && /^## / { exit }
            on && /^\| / && !/^\| what / && !/^\|---/ {
                sub(/^\| /, ""); sub(/ \|$/, "")
                n = split($0, c, / \| /)
                if (c[4] == "not measured" && c[5] == "not run") next
                line = sprintf("%-12s | %s | %s | %s", c[4], c[1], c[2], c[3])
                if (c[5] != "") line = line " | " c[5]
                print substr(line, 1, 300)
            }' "$sum"
    else
        echo "no benchmark summary"
    fi
    for pr in "${probes[@]}"; do
        if [ -f "$WORK/probes/$pr.txt" ]; then
            echo "probe $pr:"
            cat "$WORK/probes/$pr.txt"
        fi
    done
    echo "total $(elapsed)s of a ${BUDGET}s budget"
} >"$REPORT"

# ------------------------------------------------------------------ pack
cp "$REPORT" "$OUT/session.txt"
[ -f "$WORK/bench/summary.md" ] && cp "$WORK/bench/summary.md" "$OUT/summary.md"
limit=$((15 * 1024 * 1024))
tar -czf "$OUT/session.tar.gz" -C "$WORK" . 2>/dev/null
if [ "$(stat -c %s "$OUT/session.tar.gz")" -gt $limit ]; then
    # Too big to come back: without the statistics JSON of every run.
    tar -czf "$OUT/session.tar.gz" -C "$WORK" --exclude='*.json' --exclude='*.png' . 2>/dev/null
    echo "(session.tar.gz: the statistics JSON files were left out, it was over 15 MiB)" | tee -a "$OUT/session.txt" >>"$REPORT"
fi
if [ "$(stat -c %s "$OUT/session.tar.gz")" -gt $limit ]; then
    small=()
    for f in env.txt session.txt bench/summary.md bench/results.csv bench/raw/manifest.tsv gpu/results \
        gpu-suite.log build.log bench.log; do
        [ -e "$WORK/$f" ] && small+=("$f")
    done
    tar -czf "$OUT/session.tar.gz" -C "$WORK" "${small[@]}"
    echo "(session.tar.gz: summaries and results only, the whole was over 15 MiB)" | tee -a "$OUT/session.txt" >>"$REPORT"
fi
cat "$REPORT"
rm -rf "$WORK"
