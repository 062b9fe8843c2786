#!/usr/bin/env bash
# run_gpu_tests.sh BUILD [OUTDIR]: the pinshim GPU test suite (needs a GPU, nvcc, python3).
#
#   tests/gpu/run_gpu_tests.sh build             logs in a temporary directory (kept on failure)
#   tests/gpu/run_gpu_tests.sh build out/gpu     logs under out/gpu/logs, results under out/gpu
#
# BUILD must hold libpinshim.so (make shim).  The test programs are built into BUILD/gpu/.
#
# What it does
#   1. Builds every tests/gpu/*.cu three ways into BUILD/gpu/{static,shared,ptds}/:
#        nvcc -O2 -arch=sm_90 -cudart static | -cudart shared | --default-stream per-thread
#      (static cudart, shared libcudart.so, per-thread default stream).  A build failure fails.
#   2. Runs each binary in six configurations, each under `timeout` (PINSHIM_GPU_TIMEOUT, 120 s):
#        plain           no shim
#        observe         LD_PRELOAD=libpinshim.so PINSHIM_MODE=observe
#        pin             PINSHIM_MODE=pin
#        full            default mode (PINSHIM_MODE unset)
#        full-budget64M  PINSHIM_BUDGET=64M (forces staging and eviction)
#        full-min4K      PINSHIM_MIN_SIZE=4K PINSHIM_REWRITE_ALWAYS=1 (small buffers promoted too; every large sync copy rewritten)
#      Every shim run also sets PINSHIM_STATS=<log dir>/<run>.json.  A run passes when:
#        - the exit status is 0 (each program checks its own data and exits 1 with a FAIL line);
#        - (rule 9) neither stdout nor stderr mentions "pinshim" (no PINSHIM_REPORT/LOG is set);
#        - its "OBSERVE key=value" lines (error codes, flags the program saw) equal the plain
#          run's (rule 3: errors are the original's);
#        - the stats JSON exists and parses; in observe mode nothing was promoted or staged;
#          under the 64M budget, any "*regist*peak*" figure in it is <= 64 MiB (rule 7);
#        - copies.cu under observe: the JSON's copies.{h2d,d2h,d2d}.count equal the program's
#          final line "EXPECTED_COPIES h2d=N d2h=N d2d=N" (observe counts every copy exactly once).
#   3. torch_check.py and cupy_check.py in the same six configurations (SKIP if torch/cupy or a
#      GPU is missing: counted as skipped, not failed), plus the torch copy-count check: under
#      observe, torch_check.py --count 0 and --count 3; the difference of the JSON counts must be
#      exactly the EXPECTED_COPIES the --count 3 run prints.
#   4. If compute-sanitizer is found (PATH, or next to nvcc), copies and realloc_free (static
#      build) run under `compute-sanitizer --tool memcheck` with the shim preloaded into the
#      target; the ERROR SUMMARY must report 0 errors.
#   Prints one PASS/FAIL line per check, then "K skipped" and finally "N passed, M failed";
#   exits 1 if anything failed.
#
# The programs (each prints "PASS name" lines and exits non-zero with a FAIL message on error):
#   copies.cu              every runtime copy kind with host memory (cudaMemcpy, Default kind,
#                          Async on 0/created/per-thread/legacy streams, 2D, 3D, arrays, symbols,
#                          D2D), 1 byte .. 64 MiB, unaligned, every kind of host memory
#   ordering.cu            rule 2: copies after 50 ms kernels on blocking / per-thread / legacy
#                          streams see the kernel's writes; H2D before kernels; write-after-read;
#                          4 threads at once
#   pageable_semantics.cu  rule 1: async H2D from promoted memory is staged at return (source
#                          overwritten at once), async D2H into it complete at return; 2D; batch
#   realloc_free.cu        rule 4: free/realloc/munmap/mremap/madvise/MAP_FIXED of promoted
#                          memory, reuse of the address, free on a non-CUDA thread, 100x loop
#   program_pinning.cu     rule 5: the program's cudaHostRegister over promoted ranges, sub-ranges,
#                          mapped, read-only, over the budget; error codes; cudaMallocHost memory
#   graph_capture.cu       rule 6: stream capture (global, thread-local, relaxed) of copies from
#                          promoted, pinned and cold memory; graphs relaunched with new input
#   multithread.cu         8 threads allocating/copying/freeing on every kind of stream, with a
#                          checksum; 256 MiB pinned H2D || D2H
#   fork.cu                rule 8: children free promoted blocks and exit without CUDA, parent
#                          keeps copying correctly
#
# Knobs: NVCC (nvcc), NVCC_ARCH (sm_90), PINSHIM_GPU_TIMEOUT (120), PINSHIM_GPU_JOBS (parallel
# binaries, default 4; the checks assert data, never timing), PYTHON (python3),
# PINSHIM_GPU_ONLY (a regular expression: only programs whose name matches).
set -u

usage() { echo "usage: $0 BUILD [OUTDIR]" >&2; exit 2; }
[ $# -ge 1 ] && [ $# -le 2 ] || usage

HERE=$(cd "$(dirname "$0")" && pwd)
BUILD=$(cd "$1" 2>/dev/null && pwd) || { echo "no build directory $1" >&2; exit 2; }
SHIM="$BUILD/libpinshim.so"
[ -f "$SHIM" ] || { echo "missing $SHIM (run make shim)" >&2; exit 2; }

NVCC=${NVCC:-nvcc}
ARCH=${NVCC_ARCH:-sm_90}
TIMEOUT=${PINSHIM_GPU_TIMEOUT:-120}
JOBS=${PINSHIM_GPU_JOBS:-4}
PY=${PYTHON:-python3}
ONLY=${PINSHIM_GPU_ONLY:-.}
SAN_TIMEOUT=600

# Nothing from the caller's environment may change what the shim does.
for v in $(compgen -e); do
    case "$v" in PINSHIM_*) unset "$v" ;; esac
done
unset LD_PRELOAD

KEEP_OUT=1
if [ $# -eq 2 ]; then
    mkdir -p "$2" || exit 2
    OUT=$(cd "$2" && pwd)
else
    OUT=$(mktemp -d "${TMPDIR:-/tmp}/pinshim-gpu.XXXXXX")
    KEEP_OUT=0
fi
LOGS="$OUT/logs"
RES="$OUT/results"
rm -rf "$RES"
mkdir -p "$LOGS" "$RES" "$BUILD/gpu/static" "$BUILD/gpu/shared" "$BUILD/gpu/ptds"

T0=$(date +%s)

# ----- result helpers: one file per check, so parallel jobs never share a file --------------
result() {  # result NAME STATUS(PASS|FAIL|SKIP) [REASON]
    local name=$1 st=$2 why=${3:-}
    local f
    f="$RES/$(printf '%s' "$name" | tr -c 'A-Za-z0-9._-' '_').res"
    if [ -n "$why" ]; then
        printf '%s %s: %s\n' "$st" "$name" "$why" >"$f"
        printf '%s %s: %s\n' "$st" "$name" "$why"
    else
        printf '%s %s\n' "$st" "$name" >"$f"
        printf '%s %s\n' "$st" "$name"
    fi
}

# JSON checks, in one place.
PYCHECK='
import json, sys

def load(path):
    with open(path) as f:
        return json.load(f)

def count(j, d):
    try:
        return int(j["copies"][d]["count"])
    except Exception:
        raise SystemExit("no copies.%s.count in the JSON (top-level keys: %s)" % (d, sorted(j)[:20]))

def walk(o, path=""):
    if isinstance(o, dict):
        for k, v in o.items():
            yield from walk(v, path + "." + str(k))
    elif isinstance(o, (int, float)) and not isinstance(o, bool):
        yield path, o

def parse_expected(text):
    for line in text.splitlines():
        if line.startswith("EXPECTED_COPIES"):
            return dict(kv.split("=") for kv in line.split()[1:])
    raise SystemExit("no EXPECTED_COPIES line in the program output")

cmd = sys.argv[1]
if cmd == "valid":            # valid JSON MODE BUDGET_BYTES
    j = load(sys.argv[2]); mode = sys.argv[3]; budget = int(sys.argv[4])
    errs = []
    for d in ("h2d", "d2h"):
        count(j, d)
    for p, v in walk(j):
        leaf = p.rsplit(".", 1)[-1]
        if mode == "observe" and leaf in ("promotions", "promoted_bytes", "staged_copies", "staged_bytes", "sync_to_async") and v:
            errs.append("observe mode but %s = %s" % (p, v))
        if budget and "regist" in p and "peak" in p and v > budget:
            errs.append("%s = %d exceeds the budget %d (rule 7)" % (p, v, budget))
    if errs:
        raise SystemExit("; ".join(errs))
elif cmd == "counts":         # counts JSON STDOUT_FILE
    j = load(sys.argv[2]); exp = parse_expected(open(sys.argv[3]).read())
    bad = ["%s: JSON %d, program issued %s" % (d, count(j, d), n) for d, n in exp.items() if count(j, d) != int(n)]
    if bad:
        raise SystemExit("observe counts differ: " + "; ".join(bad))
elif cmd == "delta":          # delta JSON0 JSONN STDOUT_FILE_N
    j0 = load(sys.argv[2]); j1 = load(sys.argv[3]); exp = parse_expected(open(sys.argv[4]).read())
    bad = ["%s: JSON difference %d, expected %s" % (d, count(j1, d) - count(j0, d), n)
           for d, n in exp.items() if count(j1, d) - count(j0, d) != int(n)]
    if bad:
        raise SystemExit("torch extra copies miscounted: " + "; ".join(bad))
'

json_check() { "$PY" -c "$PYCHECK" "$@" 2>&1; }

# Output with our own paths removed (they may contain "pinshim"), for the rule 9 check.
ROOT=$(cd "$HERE/../.." && pwd)
strip_paths() {
    awk -v p1="$ROOT" -v p2="$BUILD" -v p3="$OUT" '
        function strip(s, p,   i) {
            if (p == "") return s
            while ((i = index(s, p)) > 0) s = substr(s, 1, i - 1) substr(s, i + length(p))
            return s
        }
        { print strip(strip(strip($0, p3), p2), p1) }' "$@"
}

# ----- one run ------------------------------------------------------------------------------
# run_one LABEL CONFIG LOGBASE PLAIN_OUT COMMAND...   (CONFIG: plain observe pin full budget min4k)
# Sets RUN_STATUS (PASS/FAIL/SKIP) and records the result.
run_one() {
    local label=$1 cfg=$2 base=$3 plain_out=$4
    shift 4
    local out="$base.out" err="$base.err" json="$base.json"
    local -a envs=()
    local budget=0 mode=full
    rm -f "$json"
    case "$cfg" in
    plain) ;;
    observe) envs=(LD_PRELOAD="$SHIM" PINSHIM_MODE=observe PINSHIM_STATS="$json"); mode=observe ;;
    pin) envs=(LD_PRELOAD="$SHIM" PINSHIM_MODE=pin PINSHIM_STATS="$json"); mode=pin ;;
    full) envs=(LD_PRELOAD="$SHIM" PINSHIM_STATS="$json") ;;
    budget) envs=(LD_PRELOAD="$SHIM" PINSHIM_BUDGET=64M PINSHIM_STATS="$json"); budget=$((64 * 1024 * 1024)) ;;
    min4k) envs=(LD_PRELOAD="$SHIM" PINSHIM_MIN_SIZE=4K PINSHIM_REWRITE_ALWAYS=1 PINSHIM_STATS="$json") ;;
    esac
    local t
    t=$(date +%s.%N)
    timeout -k 10 "$TIMEOUT" env ${envs[@]+"${envs[@]}"} "$@" >"$out" 2>"$err" </dev/null
    local rc=$?
    local dt
    dt=$(awk -v a="$t" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
    local -a why=()
    if grep -q '^SKIP' "$out" && [ $rc -eq 0 ]; then
        RUN_STATUS=SKIP
        result "$label" SKIP "$(grep -m1 '^SKIP' "$out")"
        return
    fi
    if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
        why+=("timed out after ${TIMEOUT}s")
    elif [ $rc -ne 0 ]; then
        local msg
        msg=$(grep -h 'FAIL' "$err" "$out" | head -1 | cut -c1-400)
        why+=("exit $rc${msg:+: $msg}")
    fi
    if [ "$cfg" != plain ]; then
        local said
        said=$(strip_paths "$err" "$out" | grep -i pinshim | head -1 | cut -c1-200)
        [ -n "$said" ] && why+=("rule 9: unrequested output mentions pinshim: $said")
        if [ -n "$plain_out" ] && [ -f "$plain_out" ]; then
            local d
            d=$(diff <(grep '^OBSERVE ' "$plain_out") <(grep '^OBSERVE ' "$out") | grep '^[<>]' | head -6 | tr '\n' ' ')
            [ -n "$d" ] && why+=("OBSERVE lines differ from the plain run (< plain, > shim): $d")
        fi
        if [ $rc -eq 0 ]; then
            if [ ! -s "$json" ]; then
                why+=("no stats JSON written to $json")
            else
                local m
                m=$(json_check valid "$json" "$mode" "$budget") || why+=("stats JSON: $m")
            fi
        fi
    fi
    if [ ${#why[@]} -eq 0 ]; then
        RUN_STATUS=PASS
        result "$label" PASS "(${dt}s)"
    else
        RUN_STATUS=FAIL
        local IFS='|'
        result "$label" FAIL "${why[*]} [logs: $base.*]"
    fi
}

CONFIGS="plain observe pin full budget min4k"

# All configurations of one binary: plain first (its OBSERVE lines are the reference).
run_binary() {
    local prog=$1 variant=$2 bin=$3
    local cfg base plain_out=""
    for cfg in $CONFIGS; do
        base="$LOGS/$prog.$variant.$cfg"
        run_one "${prog}[$variant] $cfg" "$cfg" "$base" "$plain_out" "$bin"
        if [ "$cfg" = plain ]; then
            [ "$RUN_STATUS" = PASS ] && plain_out="$base.out"
        fi
        if [ "$cfg" = observe ] && [ "$prog" = copies ] && [ "$RUN_STATUS" = PASS ]; then
            local m
            if m=$(json_check counts "$base.json" "$base.out"); then
                result "${prog}[$variant] observe counts" PASS "($(grep '^EXPECTED_COPIES' "$base.out"))"
            else
                result "${prog}[$variant] observe counts" FAIL "$m [logs: $base.*]"
            fi
        fi
    done
}

run_python() {
    local name=$1 script=$2
    local cfg base plain_out=""
    for cfg in $CONFIGS; do
        base="$LOGS/$name.$cfg"
        run_one "$name $cfg" "$cfg" "$base" "$plain_out" "$PY" "$script"
        [ "$RUN_STATUS" = SKIP ] && return
        [ "$cfg" = plain ] && [ "$RUN_STATUS" = PASS ] && plain_out="$base.out"
    done
    if [ "$name" = torch_check ]; then
        local b0="$LOGS/torch_count0.observe" b3="$LOGS/torch_count3.observe" s0 s3
        run_one "torch_check --count 0 observe" observe "$b0" "" "$PY" "$script" --count 0
        s0=$RUN_STATUS
        run_one "torch_check --count 3 observe" observe "$b3" "" "$PY" "$script" --count 3
        s3=$RUN_STATUS
        if [ "$s0" = PASS ] && [ "$s3" = PASS ]; then
            local m
            if m=$(json_check delta "$b0.json" "$b3.json" "$b3.out"); then
                result "torch_check observe counts" PASS "($(grep '^EXPECTED_COPIES' "$b3.out"))"
            else
                result "torch_check observe counts" FAIL "$m [logs: $b0.*, $b3.*]"
            fi
        fi
    fi
}

run_sanitizer() {
    local prog=$1 bin=$2 san=$3
    local base="$LOGS/$prog.static.memcheck"
    timeout -k 10 "$SAN_TIMEOUT" "$san" --tool memcheck --target-processes all --error-exitcode 86 \
        env LD_PRELOAD="$SHIM" PINSHIM_STATS="$base.json" "$bin" >"$base.out" 2>"$base.err" </dev/null
    local rc=$?
    if [ $rc -eq 0 ] && grep -q 'ERROR SUMMARY: 0 errors' "$base.out" "$base.err"; then
        result "${prog}[static] memcheck" PASS
    else
        result "${prog}[static] memcheck" FAIL "exit $rc, $(grep -h -m1 'ERROR SUMMARY' "$base.out" "$base.err" || echo 'no ERROR SUMMARY') [logs: $base.*]"
    fi
}

# ----- 1. build --------------------------------------------------------------------------------
echo "== building tests/gpu/*.cu with $NVCC -arch=$ARCH into $BUILD/gpu"
PROGS=()
for src in "$HERE"/*.cu; do
    p=$(basename "$src" .cu)
    [[ "$p" =~ $ONLY ]] && PROGS+=("$p")
done
NPROC=$(nproc 2>/dev/null || echo 4)
NVCC_PATH=$(command -v "$NVCC" 2>/dev/null || echo "$NVCC")
CUDA_LIBDIR=$(cd "$(dirname "$NVCC_PATH")/../lib64" 2>/dev/null && pwd || echo /usr/local/cuda/lib64)
build_one() {
    local p=$1 variant=$2 flags
    case "$variant" in
    static) flags="-cudart static" ;;
    shared) flags="-cudart shared -Xlinker -rpath=$CUDA_LIBDIR" ;;
    ptds) flags="-cudart static --default-stream per-thread" ;;
    esac
    # shellcheck disable=SC2086
    if "$NVCC" -O2 -arch="$ARCH" $flags -o "$BUILD/gpu/$variant/$p" "$HERE/$p.cu" -lpthread \
        >"$LOGS/build.$p.$variant.log" 2>&1; then
        result "build ${p}[$variant]" PASS
    else
        rm -f "$BUILD/gpu/$variant/$p"
        result "build ${p}[$variant]" FAIL "$(grep -m1 -i error "$LOGS/build.$p.$variant.log" | cut -c1-300) [log: $LOGS/build.$p.$variant.log]"
    fi
}
for p in "${PROGS[@]}"; do
    for variant in static shared ptds; do
        while [ "$(jobs -rp | wc -l)" -ge "$NPROC" ]; do wait -n; done
        build_one "$p" "$variant" &
    done
done
wait

# ----- 2-4. run, JOBS at a time -----------------------------------------------------------------
echo "== running (${JOBS} at a time, timeout ${TIMEOUT}s per run)"
throttle() { while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n; done; }

SAN=$(command -v compute-sanitizer 2>/dev/null)
if [ -z "$SAN" ]; then
    nv=$(command -v "$NVCC" 2>/dev/null)
    [ -n "$nv" ] && [ -x "$(dirname "$nv")/compute-sanitizer" ] && SAN="$(dirname "$nv")/compute-sanitizer"
fi
# The slow ones first.
if [ -n "$SAN" ]; then
    for p in copies realloc_free; do
        [ -x "$BUILD/gpu/static/$p" ] || continue
        throttle
        run_sanitizer "$p" "$BUILD/gpu/static/$p" "$SAN" &
    done
else
    echo "(compute-sanitizer not found: memcheck runs skipped)"
fi
if [[ torch_check =~ $ONLY ]] && [ -f "$HERE/torch_check.py" ]; then throttle; run_python torch_check "$HERE/torch_check.py" & fi
if [[ cupy_check =~ $ONLY ]] && [ -f "$HERE/cupy_check.py" ]; then throttle; run_python cupy_check "$HERE/cupy_check.py" & fi
for variant in static shared ptds; do
    for p in "${PROGS[@]}"; do
        bin="$BUILD/gpu/$variant/$p"
        [ -x "$bin" ] || continue
        throttle
        run_binary "$p" "$variant" "$bin" &
    done
done
wait

# ----- summary ------------------------------------------------------------------------------------
npass=$(cat "$RES"/*.res 2>/dev/null | grep -c '^PASS')
nfail=$(cat "$RES"/*.res 2>/dev/null | grep -c '^FAIL')
nskip=$(cat "$RES"/*.res 2>/dev/null | grep -c '^SKIP')
echo
echo "== $(($(date +%s) - T0)) s; results in $RES, logs in $LOGS"
if [ "$nfail" -gt 0 ]; then
    echo "failures:"
    cat "$RES"/*.res | grep '^FAIL' | sort
    [ $KEEP_OUT -eq 0 ] && echo "(logs kept in $OUT)"
elif [ $KEEP_OUT -eq 0 ]; then
    rm -rf "$OUT"
fi
echo "$nskip skipped"
echo "$npass passed, $nfail failed"
[ "$nfail" -eq 0 ]
