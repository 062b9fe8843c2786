#!/usr/bin/env bash
# node_budget.sh BUILD OUTDIR: PINSHIM_NODE_BUDGET on a real GPU (one GPU is enough).
#
# Four node_worker processes (tests/gpu/node_worker.cu) start together on GPU 0, each with four
# hot pageable buffers of 256 MiB (4 GiB wanted in all), each under PINSHIM_BUDGET=4G (so the
# process budget never binds) and one node budget of about 1 GiB shared by the four.  Checks:
#   - every worker's data is right (RESULT ... ok=1) and its stats JSON was written;
#   - every JSON's node_budget.bytes is the node budget, and mine_bytes <= used_bytes <= budget;
#   - the SUM over the workers of promotions.registered_bytes_peak (promotions, pinned cache and
#     staging buffers: staging reserves from the node budget too) is <= the node budget.  A sum
#     of per-process peaks bounds the node-wide total at every instant only if no process gives
#     registered bytes back while another can still take them; that holds here: with a process
#     budget of 4G nothing is evicted, the workers free nothing while they copy, staging buffers
#     stay until exit, and the workers wait for each other (--barrier) before any exits;
#   - something was pinned at all (at least one 256 MiB buffer), or nothing was tested;
#   - a sampler (a small C program linked with BUILD/obj/nodebudget.o and friends) reads the
#     node segment every 20 ms: its total never exceeds the budget and always equals the sum
#     of the slots.  Skipped with a note if it cannot be built.
# Figures: per-process peak and copy bandwidth, the sum, the budget, and the wall time of the
# four workers without the shim and with it.  Last line: "node budget: PASS" or "FAIL".
#
# Knobs: NVCC (nvcc), NVCC_ARCH (sm_90), CC (cc), NODE_WORKERS (4), NODE_BUFFERS (4),
# NODE_BUFFER_MIB (256), NODE_HOLD_S (2).
set -u
# shellcheck source=tests/gpu/script_setup.sh
. "$(dirname "$0")/script_setup.sh"
ROOT=$(cd "$HERE/../.." && pwd)
CC=${CC:-cc}
W=${NODE_WORKERS:-4}
K=${NODE_BUFFERS:-4}
S=${NODE_BUFFER_MIB:-256}
HOLD=${NODE_HOLD_S:-2}
ROUNDS=2
# About 1 GiB, a few pages less, different for each run: concurrent or earlier runs never share
# (or inherit) a segment.  The segment is removed at the end.
NB=$(( (1 << 30) - ( ($$ % 255) + 1 ) * 4096 ))
SEG=/dev/shm/pinshim-$(id -u)-$NB
BIN=$BUILD/gpu/node
mkdir -p "$BIN"
sampler_pid=
cleanup() {
    [ -n "$sampler_pid" ] && kill "$sampler_pid" 2>/dev/null
    rm -f "$SEG"
}
trap cleanup EXIT
T0=$(date +%s.%N)
fail=0
bad() { echo "FAIL $*"; fail=1; }

# ---- build ----
if [ ! -x "$BIN/node_worker" ] || [ "$HERE/node_worker.cu" -nt "$BIN/node_worker" ] ||
   [ "$HERE/common.cuh" -nt "$BIN/node_worker" ]; then
    "$NVCC" -O2 -arch="$ARCH" -o "$BIN/node_worker" "$HERE/node_worker.cu" -lpthread >"$OUT/build.log" 2>&1 ||
        { bad "build node_worker: $(grep -m1 -i error "$OUT/build.log")"; echo "node budget: FAIL"; exit 1; }
fi
SAMPLER=
CUDA_INC=$(cd "$(dirname "$(command -v "$NVCC" 2>/dev/null || echo /usr/local/cuda/bin/nvcc)")/../include" 2>/dev/null && pwd)
cat >"$BIN/nb_sampler.c" <<'EOF'
/* Reads the node-budget segment of PINSHIM_NODE_BUDGET every PERIOD_MS until SIGTERM. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "config.h"
#include "nodebudget.h"
static volatile sig_atomic_t stop;
static void on_term(int sig) { (void)sig; stop = 1; }
static const char *env(const char *name) { return getenv(name); }
int main(int argc, char **argv)
{
    long period_ms = argc > 1 ? atol(argv[1]) : 20;
    config_load(env);
    signal(SIGTERM, on_term);
    signal(SIGINT, on_term);
    unsigned long long max_used = 0, samples = 0, mismatches = 0, max_slots = 0, budget = 0;
    struct timespec ts = { period_ms / 1000, (period_ms % 1000) * 1000000L };
    while (!stop) {
        struct nodebudget_audit a;
        if (nodebudget_audit(&a) == 0) {
            samples++;
            budget = a.budget;
            if (a.used > max_used) max_used = a.used;
            if (a.slots_used > max_slots) max_slots = a.slots_used;
            if (a.used != a.slot_sum) mismatches++;
        }
        nanosleep(&ts, NULL);
    }
    printf("SAMPLER samples=%llu max_used=%llu budget=%llu mismatches=%llu max_slots=%llu\n",
           samples, max_used, budget, mismatches, max_slots);
    return 0;
}
EOF
if "$CC" -O2 -pthread -I"$ROOT/shim" ${CUDA_INC:+-I"$CUDA_INC"} -o "$BIN/nb_sampler" "$BIN/nb_sampler.c" \
       "$BUILD/obj/nodebudget.o" "$BUILD/obj/config.o" "$BUILD/obj/log.o" "$BUILD/obj/guard.o" -lrt \
       >"$OUT/sampler-build.log" 2>&1; then
    SAMPLER=$BIN/nb_sampler
else
    echo "note: no sampler (could not link it against $BUILD/obj: $(head -c 200 "$OUT/sampler-build.log"))"
fi

# ---- run W workers together; $1 = label, then env settings ----
run_job() {
    local label=$1; shift
    local dir=$OUT/$label
    rm -rf "$dir"; mkdir -p "$dir/barrier"
    local pids=() t
    t=$(date +%s.%N)
    for i in $(seq 1 "$W"); do
        timeout -k 5 50 env "$@" "$BIN/node_worker" "$K" "$S" "$HOLD" "$ROUNDS" --barrier "$dir/barrier" "$W" \
            >"$dir/worker$i.out" 2>"$dir/worker$i.err" &
        pids+=($!)
    done
    local rc=0
    for p in "${pids[@]}"; do wait "$p" || rc=1; done
    WALL=$(awk -v a="$t" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }')
    for i in $(seq 1 "$W"); do
        if ! grep -q '^RESULT node_worker ok=1' "$dir/worker$i.out"; then
            bad "$label worker $i: $(grep -h -m1 FAIL "$dir/worker$i.err" "$dir/worker$i.out" || echo 'no RESULT line') [logs: $dir/worker$i.*]"
            rc=1
        fi
        if [ "$label" = shim ] && grep -qi pinshim "$dir/worker$i.err"; then
            echo "note: $label worker $i: the shim wrote to stderr: $(grep -m1 -i pinshim "$dir/worker$i.err")"
        fi
    done
    return $rc
}

echo "== $W workers x $K x $S MiB on one GPU; node budget $NB bytes ($((NB >> 20)) MiB), PINSHIM_BUDGET=4G"
run_job plain && echo "PASS without the shim: every worker's data right"
WALL_PLAIN=$WALL
rm -f "$OUT"/node.*.json
if [ -n "$SAMPLER" ]; then
    PINSHIM_NODE_BUDGET=$NB "$SAMPLER" 20 >"$OUT/sampler.out" 2>&1 &
    sampler_pid=$!
fi
run_job shim LD_PRELOAD="$SHIM" PINSHIM_NODE_BUDGET="$NB" PINSHIM_BUDGET=4G \
    PINSHIM_STATS="$OUT/node.%p.json" && echo "PASS with the shim: every worker's data right"
WALL_SHIM=$WALL
if [ -n "$sampler_pid" ]; then
    kill -TERM "$sampler_pid" 2>/dev/null
    wait "$sampler_pid" 2>/dev/null
    sampler_pid=
fi

python3 - "$OUT" "$NB" "$W" "$((S << 20))" "$WALL_PLAIN" "$WALL_SHIM" <<'PY' || fail=1
import glob, json, os, re, sys
out, nb, w, bufsize = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
wall_plain, wall_shim = float(sys.argv[5]), float(sys.argv[6])
fail = 0
def check(ok, msg):
    global fail
    print(("PASS " if ok else "FAIL ") + msg)
    fail |= not ok
def gbps(label):
    r = {}
    for f in glob.glob(os.path.join(out, label, "worker*.out")):
        m = re.search(r"RESULT node_worker ok=1 .*copy_gbps=([0-9.]+).*pid=(\d+)", open(f).read())
        if m:
            r[int(m.group(2))] = float(m.group(1))
    return r
files = sorted(glob.glob(os.path.join(out, "node.*.json")))
check(len(files) == w, f"{len(files)} stats files for {w} workers")
peaks, total = [], 0
shim_gbps, plain_gbps = gbps("shim"), gbps("plain")
print(f"{'pid':>8} {'peak registered':>16} {'promotions':>10} {'declined':>8} {'failures':>8} {'staged':>6} {'copy GB/s':>9}")
for f in files:
    try:
        j = json.load(open(f))
    except Exception as e:
        check(False, f"{f}: unreadable ({e})"); continue
    p = j["promotions"]
    nbj = j.get("node_budget", {})
    peak = p["registered_bytes_peak"]
    peaks.append(peak)
    print(f"{j['pid']:>8} {peak:>16} {p['count']:>10} {p['declined']:>8} {p['failures']:>8} "
          f"{j['staging']['count']:>6} {shim_gbps.get(j['pid'], 0):>9.2f}")
    check(nbj.get("bytes") == nb and nbj.get("mine_bytes", 0) <= nbj.get("used_bytes", 0) <= nb,
          f"pid {j['pid']}: node_budget in the JSON consistent ({nbj})")
total = sum(peaks)
print(f"sum of per-process peaks {total} bytes ({total / 2**20:.1f} MiB), node budget {nb} bytes ({nb / 2**20:.1f} MiB)")
check(total <= nb, f"sum of per-process registered peaks {total} <= node budget {nb}")
check(total >= bufsize, f"something was pinned: {total} >= one buffer ({bufsize})")
sp = os.path.join(out, "sampler.out")
if os.path.exists(sp):
    m = re.search(r"samples=(\d+) max_used=(\d+) budget=(\d+) mismatches=(\d+) max_slots=(\d+)", open(sp).read())
    if m:
        n, mx, b, mis, slots = map(int, m.groups())
        print(f"sampler: {n} samples every 20 ms, node total at most {mx} bytes, up to {slots} processes in the segment")
        check(n > 0 and b == nb and mx <= nb, f"sampled node total never above the budget ({mx} <= {nb})")
        check(mis == 0, f"sampled node total always equals the sum of the slots ({mis} mismatches)")
        if total >= bufsize:
            check(mx >= bufsize, f"the sampler saw the reservations (at most {mx} >= one buffer)")
    else:
        check(False, f"sampler output unreadable: {open(sp).read()[:200]}")
pg = sum(plain_gbps.values()) / len(plain_gbps) if plain_gbps else 0
sg = sum(shim_gbps.values()) / len(shim_gbps) if shim_gbps else 0
print(f"RESULT node_budget workers={w} wall_plain_s={wall_plain:.2f} wall_shim_s={wall_shim:.2f} "
      f"copy_gbps_plain={pg:.2f} copy_gbps_shim={sg:.2f} sum_peaks={total} node_budget={nb}")
sys.exit(1 if fail else 0)
PY
echo "total $(awk -v a="$T0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }') s"
if [ $fail -eq 0 ]; then echo "node budget: PASS"; else echo "node budget: FAIL"; fi
exit $fail
