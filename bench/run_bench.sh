#!/usr/bin/env bash
# run_bench.sh BUILD: the pinshim benchmarks (`make bench`).
#
# Every benchmark runs as an A/B: the same program without the shim ("plain") and under it
# ("shim": scripts/pinshim, PINSHIM_MODE=full, stats JSON per run), alternately, BENCH_REPS
# times.  Results go to $OUT when set, else BUILD/bench-results/<date>_<time>/ (ignored by git):
#   env.txt          date, host, GPU, driver, CUDA and toolkit versions
#   raw/             stdout, stderr and shim stats of every run; manifest.tsv lists the runs
#   results.csv/json every RESULT line of every run
#   summary.md       the generated summary (paste it into bench/RESULTS.md)
#   sweep_*.png      bandwidth sweep plots (also copied to bench/results/)
# One failing benchmark does not stop the others: its failure is recorded in summary.md.
# Without a GPU only the CPU malloc benchmark runs.
#
# Settings (environment):
#   BENCH_REPS=3        A/B pairs per benchmark (the sweep uses BENCH_SWEEP_REPS=2)
#   BENCH_LATENCY_REPS=30  A/B pairs of the small-copy latency benchmark: a process's medians
#                       vary by several percent from one run to the next, more than the 3%
#                       the target allows, so it needs many short pairs, judged pair by pair
#   BENCH_LATENCY_CPU=N    the CPU both sides of the latency benchmark run on (taskset); by
#                       default the last CPU local to the GPU, so that neither side depends on
#                       where the scheduler happens to put it; "none" leaves it to the scheduler
#   BENCH_ONLY=a,b      run only these groups: sweep loop latency staging train drv two torch
#                       cupy ab malloc, and model safetensors dataloader fresh two_fresh bounce
#                       jax heap (docs/benchmarks.md lists what each runs and how long it takes)
#   BENCH_DL_REPS=5     interleaved repetitions of the DataLoader-with-workers benchmark
#   BENCH_FRESH_REPS=2  A/B pairs of the fresh-buffer loop (each run is 600 copies and memsets)
#   HEAP_REPS=3         runs of the heap loops on each side, alternating (run_malloc_bench.sh)
#   BENCH_TMP=dir       where the safetensors benchmark writes its 1.5 GiB file (default
#                       ${TMPDIR:-/tmp}); the file is removed afterwards
#   BENCH_QUICK=1       small sizes and few repetitions: a smoke run, not a measurement
#   BENCH_ARCH=sm_90    nvcc -arch;  NVCC=path to nvcc
#   BENCH_TIMEOUT=600   seconds per run before it is killed
#   BENCH_BUDGET_STAGING=64M  PINSHIM_BUDGET for the staging benchmark
#   BENCH_SWEEP_ARGS=...      gpu_bandwidth sweep arguments (sizes, factor, repetitions)
#   BENCH_COMMIT=abc123       the commit the summary names, where the tree was copied without
#                             its history (default: git rev-parse HEAD)
set -u
BUILD=${1:-build}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$BUILD"
BUILD=$(cd "$BUILD" && pwd)
OUT=${OUT:-$BUILD/bench-results/$(date +%Y-%m-%d_%H%M%S)}
mkdir -p "$OUT/raw" || exit 1
OUT=$(cd "$OUT" && pwd)
RAW=$OUT/raw
MANIFEST=$RAW/manifest.tsv
LOG=$OUT/bench.log
LIB=$BUILD/libpinshim.so
PINSHIM=$ROOT/scripts/pinshim
REPS=${BENCH_REPS:-3}
SWEEP_REPS=${BENCH_SWEEP_REPS:-2}
QUICK=${BENCH_QUICK:-0}
ONLY=${BENCH_ONLY:-}
TIMEOUT=${BENCH_TIMEOUT:-600}
ARCH=${BENCH_ARCH:-sm_90}
STAGING_BUDGET=${BENCH_BUDGET_STAGING:-64M}
DL_REPS=${BENCH_DL_REPS:-5}
FRESH_REPS=${BENCH_FRESH_REPS:-2}
BENCH_TMP=${BENCH_TMP:-${TMPDIR:-/tmp}}
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
BIN=$BUILD/bench

: >"$LOG"
printf 'case\tside\trep\trc\tseconds\tstdout\tstderr\tstats\tcommand\n' >"$MANIFEST"

# Sizes: full, or small for a smoke run.
if [ "$QUICK" = 1 ]; then
    SWEEP_ARGS="--min 4K --max 64M --factor 4 --reps 3"
    BIG=32M; LOOP_ITERS=5; BATCH=16M; RESULT=4M; STEPS=10; TSIZE=64M; TREPS=3; DL_BATCHES=5
    REPS=1; SWEEP_REPS=1; AB_RUNS=1; LATENCY_REPS=1
    # The newer benchmarks' own small sizes; two DataLoader repetitions so that both orders run.
    Q=--quick; DL_WORKER_BATCHES=10; DL_REPS=${BENCH_DL_REPS:-2}; FRESH_REPS=1; ST_SIZE=64M; ST_REPS=1
else
    SWEEP_ARGS="--min 4K --max 1G --factor 2 --reps 5"
    BIG=256M; LOOP_ITERS=50; BATCH=64M; RESULT=16M; STEPS=50; TSIZE=512M; TREPS=10; DL_BATCHES=30
    AB_RUNS=3; LATENCY_REPS=30
    Q=; DL_WORKER_BATCHES=200; ST_SIZE=1536M; ST_REPS=3
fi

SWEEP_ARGS=${BENCH_SWEEP_ARGS:-$SWEEP_ARGS}
LATENCY_REPS=${BENCH_LATENCY_REPS:-$LATENCY_REPS}

log() { echo "[bench] $*" | tee -a "$LOG" >&2; }
want() { [ -z "$ONLY" ] || [[ ",$ONLY," == *",$1,"* ]]; }

# ------------------------------------------------------------------ environment record
have_gpu=0
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    have_gpu=1
fi
{
    echo "date=$(date -u '+%Y-%m-%d %H:%M:%S UTC')"
    echo "host=$(uname -srm)"
    echo "cpu=$(awk -F': ' '/^model name/ {print $2; exit}' /proc/cpuinfo 2>/dev/null) ($(nproc) cores)"
    echo "memory=$(awk '/^MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo 2>/dev/null)"
    if [ $have_gpu = 1 ]; then
        echo "gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n1)"
        echo "gpus=$(nvidia-smi -L 2>/dev/null | wc -l)"
        echo "driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -n1)"
        echo "cuda_driver=$(nvidia-smi 2>/dev/null | grep -o 'CUDA Version: *[0-9.]*' | head -n1 | sed 's/.*: *//')"
        echo "pcie=$(nvidia-smi --query-gpu=pcie.link.gen.current,pcie.link.width.current --format=csv,noheader 2>/dev/null | head -n1)"
    else
        echo "gpu=none"
    fi
    if [ -x "$NVCC" ]; then
        echo "nvcc=$("$NVCC" --version 2>/dev/null | grep -o 'release [0-9.]*, V[0-9.]*' | head -n1)"
    else
        echo "nvcc=not found"
    fi
    echo "python=$(python3 -c 'import sys; print(sys.version.split()[0])' 2>/dev/null)"
    echo "commit=${BENCH_COMMIT:-$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)}"
    echo "reps=$REPS"
    echo "sweep_reps=$SWEEP_REPS"
    echo "quick=$QUICK"
    echo "shim=$([ -f "$LIB" ] && echo built || echo missing)"
} >"$OUT/env.txt"
if [ $have_gpu = 1 ]; then
    nvidia-smi >"$OUT/nvidia-smi.txt" 2>&1
    nvidia-smi topo -m >>"$OUT/nvidia-smi.txt" 2>&1
fi

# ------------------------------------------------------------------ running one case
# run_case CASE SIDE REP [VAR=VALUE ...] -- CMD ARGS...
#   SIDE plain: without the shim; SIDE shim: under scripts/pinshim, mode full, stats saved.
#   VAR=VALUE apply to that run only (for a shim run: the shim's settings, e.g. PINSHIM_BUDGET).
run_case() {
    local name=$1 side=$2 rep=$3
    shift 3
    local envs=()
    while [ $# -gt 0 ] && [ "$1" != "--" ]; do envs+=("$1"); shift; done
    shift
    local base=$RAW/$name.$side.$rep
    local stats=""
    local pre
    if [ "$side" = shim ]; then
        stats=$base.stats.json
        pre=(env PINSHIM_MODE=full "${envs[@]}" "$PINSHIM" --lib "$LIB" --stats "$stats" --)
    else
        pre=(env -u LD_PRELOAD "${envs[@]}")
    fi
    local t0 t1 rc
    t0=$(date +%s.%N)
    timeout -k 10 "$TIMEOUT" "${pre[@]}" "$@" >"$base.out" 2>"$base.err"
    rc=$?
    t1=$(date +%s.%N)
    local secs
    secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", b - a }')
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$side" "$rep" "$rc" "$secs" \
        "$(basename "$base.out")" "$(basename "$base.err")" "$( [ -n "$stats" ] && basename "$stats")" \
        "${envs[*]} $*" >>"$MANIFEST"
    case $rc in
    0) log "  $name $side #$rep: ok (${secs}s)" ;;
    77) log "  $name $side #$rep: skipped: $(grep -m1 '^SKIP' "$base.out")" ;;
    124 | 137) log "  $name $side #$rep: TIMED OUT after ${TIMEOUT}s" ;;
    *) log "  $name $side #$rep: FAILED (exit $rc): $(tail -n 1 "$base.err")" ;;
    esac
    return 0
}

# ab CASE REPS [shim VAR=VALUE ...] -- CMD: plain and shim alternately, REPS pairs, the order
# swapped every other pair (plain-shim, shim-plain, ...) so that neither side always runs right
# after the other's process has torn its GPU context down.
# Stops early when the first plain run skips (exit 77: torch/cupy missing).
ab() {
    local name=$1 reps=$2
    shift 2
    local envs=()
    while [ $# -gt 0 ] && [ "$1" != "--" ]; do envs+=("$1"); shift; done
    shift
    log "$name: $*"
    for ((r = 1; r <= reps; r++)); do
        if ((r % 2 == 0)); then
            run_case "$name" shim "$r" "${envs[@]}" -- "$@"
            run_case "$name" plain "$r" -- "$@"
            continue
        fi
        run_case "$name" plain "$r" -- "$@"
        if [ $r = 1 ] && [ "$(tail -n 1 "$MANIFEST" | cut -f4)" = 77 ]; then
            return 0
        fi
        run_case "$name" shim "$r" "${envs[@]}" -- "$@"
    done
}

# plain_only CASE REPS -- CMD: a reference without the shim.
plain_only() {
    local name=$1 reps=$2
    shift 3
    log "$name (reference, no shim): $*"
    for ((r = 1; r <= reps; r++)); do
        run_case "$name" plain "$r" -- "$@"
        [ "$(tail -n 1 "$MANIFEST" | cut -f4)" = 77 ] && return 0
    done
}

finish() {
    log "writing $OUT/summary.md"
    if ! python3 "$ROOT/bench/summarize.py" "$OUT"; then
        log "summarize.py failed: raw results are in $RAW"
        return 1
    fi
    local png
    mkdir -p "$ROOT/bench/results"
    for png in "$OUT"/*.png; do
        [ -f "$png" ] && cp "$png" "$ROOT/bench/results/" 2>/dev/null
    done
    log "done: $OUT/summary.md"
}

# ------------------------------------------------------------------ CPU benchmark (always)
# malloc: every CPU benchmark; heap: only the do-no-harm ones (cpu_heap, cpu_memcpy_overhead).
if want malloc || want heap; then
    progs=all
    want malloc || progs=heap
    log "run_malloc_bench.sh, programs: $progs (CPU only)"
    if [ -x "$BIN/cpu_malloc_overhead" ]; then
        margs=""
        [ "$QUICK" = 1 ] && margs="--quick"
        mkdir -p "$OUT/malloc"
        MALLOC_BENCH_ARGS=$margs MALLOC_BENCH_PROGS=$progs "$ROOT/bench/run_malloc_bench.sh" "$BUILD" "$OUT/malloc" \
            >"$OUT/malloc/run.txt" 2>&1 || log "  run_malloc_bench.sh failed (see malloc/run.txt)"
        cat "$OUT/malloc/run.txt" >&2
    else
        log "  $BIN/cpu_malloc_overhead not built (run make first)"
    fi
fi

if [ $have_gpu = 0 ]; then
    log "no GPU found (nvidia-smi -L failed or is missing): only the CPU benchmark ran;"
    log "the transfer benchmarks need a machine with an NVIDIA GPU."
    finish
    exit 0
fi
[ -f "$LIB" ] || log "WARNING: $LIB is missing: every shim run will fail (run make first)"

# ------------------------------------------------------------------ build the CUDA programs
mkdir -p "$BIN"
build_cu() { # build_cu NAME OUTNAME [cudart]
    local src=$ROOT/bench/$1.cu out=$BIN/$2 cudart=${3:-shared}
    if "$NVCC" -O2 -arch="$ARCH" -cudart "$cudart" -I"$ROOT/bench" -o "$out" "$src" -lpthread \
        >"$RAW/build.$2.txt" 2>&1; then
        log "built $2 (-cudart $cudart)"
    else
        log "BUILD FAILED: $2: $(head -n 3 "$RAW/build.$2.txt" | tr '\n' ' ')"
        rm -f "$out"
    fi
}
if [ -x "$NVCC" ]; then
    build_cu gpu_bandwidth gpu_bandwidth shared
    build_cu gpu_bandwidth gpu_bandwidth_static static
    build_cu gpu_train_loop gpu_train_loop shared
    build_cu gpu_two_threads gpu_two_threads shared
    if want fresh || want two_fresh || want bounce; then
        build_cu gpu_host_copies gpu_host_copies shared
    fi
else
    log "nvcc not found ($NVCC): the CUDA runtime benchmarks are skipped"
fi
have() { [ -x "$BIN/$1" ] || { log "$1 not built: skipped"; return 1; }; }


# shellcheck disable=SC2086 # the *_ARGS and sizes are word lists
if want sweep && have gpu_bandwidth; then
    ab sweep "$SWEEP_REPS" -- "$BIN/gpu_bandwidth" --mode sweep $SWEEP_ARGS
fi
if want loop && have gpu_bandwidth; then
    ab loop_pageable "$REPS" -- "$BIN/gpu_bandwidth" --mode loop --kind pageable --size $BIG --iters $LOOP_ITERS
    ab loop_pinned "$REPS" -- "$BIN/gpu_bandwidth" --mode loop --kind pinned --size $BIG --iters $LOOP_ITERS
    if have gpu_bandwidth_static; then
        ab loop_static "$REPS" -- "$BIN/gpu_bandwidth_static" --mode loop --kind pageable --size $BIG --iters $LOOP_ITERS
    fi
fi
# The last CPU of the GPU's NUMA node (from sysfs; the first CPU takes more of the interrupts),
# or nothing.
gpu_local_cpu() {
    local bus dev list
    bus=$(nvidia-smi --query-gpu=pci.bus_id --format=csv,noheader 2>/dev/null | head -n1 | tr 'A-F' 'a-f')
    [ -n "$bus" ] || return 0
    dev=/sys/bus/pci/devices/${bus#0000}
    [ -e "$dev" ] || dev=/sys/bus/pci/devices/${bus:4}
    list=$(cat "$dev/local_cpulist" 2>/dev/null) || return 0
    list=${list##*,}
    echo "${list##*-}"
}
if want latency && have gpu_bandwidth; then
    lat_cpu=${BENCH_LATENCY_CPU:-$(gpu_local_cpu)}
    lat_pin=()
    if [ -n "$lat_cpu" ] && [ "$lat_cpu" != none ] && command -v taskset >/dev/null; then
        lat_pin=(taskset -c "$lat_cpu")
        log "latency: both sides run on CPU $lat_cpu"
        echo "latency_cpu=$lat_cpu" >>"$OUT/env.txt"
    fi
    ab latency "$LATENCY_REPS" -- "${lat_pin[@]}" "$BIN/gpu_bandwidth" --mode latency --sizes 4K,16K,64K --count 5000
fi
if want staging && have gpu_bandwidth; then
    ab staging "$REPS" PINSHIM_BUDGET="$STAGING_BUDGET" -- "$BIN/gpu_bandwidth" --mode staging --size $BIG
fi
if want train && have gpu_train_loop; then
    ab train_reuse "$REPS" -- "$BIN/gpu_train_loop" --reuse --batch $BATCH --result $RESULT --steps $STEPS
    ab train_realloc "$REPS" -- "$BIN/gpu_train_loop" --realloc --batch $BATCH --result $RESULT --steps $STEPS
    plain_only train_pinned "$REPS" -- "$BIN/gpu_train_loop" --reuse --pinned --batch $BATCH --result $RESULT --steps $STEPS
    # Transfer-bound: the CPU writes one word per page, so the copies dominate each step.
    ab train_reuse_light "$REPS" -- "$BIN/gpu_train_loop" --reuse --batch $BATCH --result $RESULT --steps $STEPS --fill-stride 1024
    ab train_realloc_light "$REPS" -- "$BIN/gpu_train_loop" --realloc --batch $BATCH --result $RESULT --steps $STEPS --fill-stride 1024
    plain_only train_pinned_light "$REPS" -- "$BIN/gpu_train_loop" --reuse --pinned --batch $BATCH --result $RESULT --steps $STEPS --fill-stride 1024
fi
if want drv; then
    if [ -x "$BIN/drv_train_loop" ]; then
        ab drv_reuse "$REPS" -- "$BIN/drv_train_loop" --reuse --batch $BATCH --result $RESULT --steps $STEPS
        ab drv_realloc "$REPS" -- "$BIN/drv_train_loop" --realloc --batch $BATCH --result $RESULT --steps $STEPS
    else
        log "drv_train_loop not built (make builds it): skipped"
    fi
fi
if want two && have gpu_two_threads; then
    ab two_pinned "$REPS" -- "$BIN/gpu_two_threads" --threads 2 --size $BIG --kind pinned
    ab two_pageable "$REPS" -- "$BIN/gpu_two_threads" --threads 2 --size $BIG --kind pageable
fi
if want torch; then
    ab torch_dl_nopin "$REPS" -- python3 "$ROOT/bench/torch_bench.py" dataloader --batches $DL_BATCHES
    plain_only torch_dl_pin "$REPS" -- python3 "$ROOT/bench/torch_bench.py" dataloader --pin-memory --batches $DL_BATCHES
    ab torch_transfer "$REPS" -- python3 "$ROOT/bench/torch_bench.py" transfer --size $TSIZE --reps $TREPS
fi
if want cupy; then
    ab cupy "$REPS" -- python3 "$ROOT/bench/cupy_bench.py" --size $TSIZE --reps $TREPS
fi

# ------------------------------------------------------------------ cold, fresh and bounce copies
PY_BENCH=$ROOT/bench
if want model; then
    ab model "$REPS" -- python3 "$PY_BENCH/model_bench.py" $Q
    # The same program from and into pinned memory: what PyTorch's own per-tensor work allows.
    plain_only model_pinned 1 -- python3 "$PY_BENCH/model_bench.py" $Q --pinned
    # One more shim run with the event trace (raw/model_traced.trace): each tensor's copy and
    # the gaps between them, i.e. the shim's share of the time and the framework's.
    run_case model_traced shim 1 PINSHIM_TRACE="$RAW/model_traced.trace" -- python3 "$PY_BENCH/model_bench.py" $Q
fi
if want safetensors; then
    st_file=$(mktemp "$BENCH_TMP/pinshim-bench.XXXXXX.safetensors") || st_file=
    if [ -n "$st_file" ] && python3 "$PY_BENCH/safetensors_bench.py" write --path "$st_file" --size "$ST_SIZE" \
        >"$RAW/safetensors.write.txt" 2>&1; then
        log "safetensors: $(tail -n 1 "$RAW/safetensors.write.txt")"
        ab safetensors "$REPS" -- python3 "$PY_BENCH/safetensors_bench.py" load --path "$st_file" --reps "$ST_REPS"
        # Traced (raw/safetensors_traced.trace): which path load_file(device="cuda") takes (the
        # program's own pinning, memcpy calls, the copies), on a timeline.
        run_case safetensors_traced shim 1 PINSHIM_TRACE="$RAW/safetensors_traced.trace" -- \
            python3 "$PY_BENCH/safetensors_bench.py" load --path "$st_file" --reps 1
    else
        log "safetensors: could not write the checkpoint in $BENCH_TMP (see raw/safetensors.write.txt)"
    fi
    [ -n "$st_file" ] && rm -f "$st_file" "$st_file.part"
fi
# DataLoader with 4 workers: pin_memory=True without the shim (side "plain" of case dataloader)
# against pin_memory=False with it (side "shim"), in pairs, the order swapped every other pair,
# and pin_memory=False without the shim for reference after each pair.  The figure is noisy:
# DL_REPS pairs, and the summary shows their spread.
if want dataloader; then
    dl=(python3 "$ROOT/bench/torch_bench.py" dataloader --workers 4 --batches "$DL_WORKER_BATCHES")
    log "dataloader: ${dl[*]} [--pin-memory], $DL_REPS pairs"
    for ((r = 1; r <= DL_REPS; r++)); do
        if ((r % 2)); then
            run_case dataloader plain "$r" -- "${dl[@]}" --pin-memory
            [ $r = 1 ] && [ "$(tail -n 1 "$MANIFEST" | cut -f4)" = 77 ] && break
            run_case dataloader shim "$r" -- "${dl[@]}"
        else
            run_case dataloader shim "$r" -- "${dl[@]}"
            run_case dataloader plain "$r" -- "${dl[@]}" --pin-memory
        fi
        run_case dataloader_nopin plain "$r" -- "${dl[@]}"
    done
fi
# The host-copy programs: the CUDA runtime build, else the driver-API build that make made.
host_copies=$BIN/gpu_host_copies
if [ ! -x "$host_copies" ] && [ -x "$BIN/drv_host_copies" ]; then
    if want fresh || want two_fresh || want bounce; then
        log "gpu_host_copies not built: the driver-API build drv_host_copies stands in"
    fi
    host_copies=$BIN/drv_host_copies
fi
if want fresh && have "$(basename "$host_copies")"; then
    ab fresh_pageable "$FRESH_REPS" -- "$host_copies" --mode fresh --kind pageable $Q
    plain_only fresh_pinned "$FRESH_REPS" -- "$host_copies" --mode fresh --kind pinned $Q
    # Traced (raw/fresh_traced.trace): what a fresh buffer's first copy (about 1.2 ms H2D at
    # every size in runs 10-16, where registering 1 MiB costs about 0.15) and the copies after it
    # spend, event by event.
    run_case fresh_traced shim 1 PINSHIM_TRACE="$RAW/fresh_traced.trace" -- "$host_copies" --mode fresh --kind pageable $Q
fi
if want two_fresh && have "$(basename "$host_copies")"; then
    ab two_fresh "$REPS" -- "$host_copies" --mode two_fresh $Q
fi
if want bounce && have "$(basename "$host_copies")"; then
    ab bounce "$REPS" -- "$host_copies" --mode bounce $Q
fi
if want jax; then
    ab jax "$REPS" -- python3 "$PY_BENCH/jax_bench.py" $Q
    # Traced (raw/jax_traced.trace): where an np.asarray call's time goes beyond the shared copies.
    run_case jax_traced shim 1 PINSHIM_TRACE="$RAW/jax_traced.trace" -- python3 "$PY_BENCH/jax_bench.py" $Q --reps 3
fi

if want ab && have gpu_train_loop; then
    log "pinshim-ab on the alloc-copy-free loop"
    "$ROOT/scripts/pinshim-ab" --lib "$LIB" --a-plain -n $AB_RUNS --warmup 1 --markdown -- \
        "$BIN/gpu_train_loop" --realloc --batch $BATCH --result $RESULT --steps $STEPS \
        >"$OUT/ab_train_realloc.md" 2>"$RAW/ab_train_realloc.err" ||
        log "  pinshim-ab reported a failure (see raw/ab_train_realloc.err)"
fi

finish
exit 0
