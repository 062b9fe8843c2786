#!/usr/bin/env bash
# run_multi_gpu.sh BUILD OUTDIR: pinshim with two GPUs (issue 8).  Needs at least two GPUs;
# with fewer it prints "SKIP: fewer than 2 GPUs" and exits 0.
#
#   1. one process, two threads, each on its own device, copying the same pageable host buffers
#      (tests/gpu/multi_gpu.cu) in both directions: data right without the shim and with it
#      (mode full); with it, the shared sources are promoted (registered once, PORTABLE, and
#      used from both devices' contexts) with no failed registration and no fallback; aggregate
#      GB/s of both devices without and with the shim;
#   2. two processes, one per device (CUDA_VISIBLE_DEVICES=0 and 1), each with 4 x 256 MiB hot
#      buffers (tests/gpu/node_worker.cu), under one node budget of about 1 GiB, half of what
#      they want together: both correct, the sum of their registered peaks within the node
#      budget (valid as a bound at every instant because neither gives registrations back
#      before both are done: see node_budget.sh), and something pinned;
#   3. PyTorch, if importable with two GPUs (else SKIP): pageable CPU tensors copied to cuda:0
#      and cuda:1 from one thread per device, and back into pageable tensors; .to()/.cpu() round
#      trips; data checked; GB/s without and with the shim.
# Prints PASS/FAIL/SKIP lines, RESULT lines with GB/s, and "N passed, M failed, K skipped".
#
# Knobs: NVCC (nvcc), NVCC_ARCH (sm_90), PYTHON (python3), MULTI_GPU_MIB (256), MULTI_GPU_ITERS (8).
set -u
# shellcheck source=tests/gpu/script_setup.sh
. "$(dirname "$0")/script_setup.sh"
PY=${PYTHON:-python3}
MIB=${MULTI_GPU_MIB:-256}
ITERS=${MULTI_GPU_ITERS:-8}
npass=0 nfail=0 nskip=0
pass() { npass=$((npass + 1)); echo "PASS $*"; }
bad() { nfail=$((nfail + 1)); echo "FAIL $*"; }
skip() { nskip=$((nskip + 1)); echo "SKIP $*"; }
summary() { echo "$npass passed, $nfail failed, $nskip skipped"; [ "$nfail" -eq 0 ]; exit $?; }

# Two GPUs visible?  nvidia-smi counts them all; CUDA_VISIBLE_DEVICES may hide some.
ngpu=0
if command -v nvidia-smi >/dev/null 2>&1; then
    ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
fi
if [ -n "${CUDA_VISIBLE_DEVICES+x}" ]; then
    nvis=$(printf '%s' "$CUDA_VISIBLE_DEVICES" | tr ',' '\n' | grep -c .)
    [ "$nvis" -lt "$ngpu" ] && ngpu=$nvis
fi
if [ "$ngpu" -lt 2 ]; then
    echo "SKIP: fewer than 2 GPUs ($ngpu found)"
    exit 0
fi

BIN=$BUILD/gpu/multi
mkdir -p "$BIN"
for p in multi_gpu node_worker; do
    if [ ! -x "$BIN/$p" ] || [ "$HERE/$p.cu" -nt "$BIN/$p" ] || [ "$HERE/common.cuh" -nt "$BIN/$p" ]; then
        if ! "$NVCC" -O2 -arch="$ARCH" -o "$BIN/$p" "$HERE/$p.cu" -lpthread >"$OUT/build.$p.log" 2>&1; then
            bad "build $p: $(grep -m1 -i error "$OUT/build.$p.log")"
            summary
        fi
    fi
done

# The binary itself may still see fewer than two (e.g. a device it cannot use).
"$BIN/multi_gpu" 1 1 >"$OUT/probe.out" 2>&1
if grep -q '^SKIP' "$OUT/probe.out"; then
    head -1 "$OUT/probe.out"   # "SKIP: fewer than 2 GPUs (...)"
    exit 0
fi

field() { sed -n "s/.*[ ]$1=\([0-9.]*\).*/\1/p" "$2" | tail -1; }

# ---- 1. one process, two threads, two devices ----
echo "== one process, two threads, two GPUs, shared pageable buffers (2 x $MIB MiB, $ITERS iterations)"
ok_plain=0 ok_shim=0
if timeout -k 5 300 "$BIN/multi_gpu" "$MIB" "$ITERS" >"$OUT/threads.plain.out" 2>&1 &&
   grep -q '^RESULT multi_gpu' "$OUT/threads.plain.out"; then
    pass "threads without the shim: data right"; ok_plain=1
else
    bad "threads without the shim: $(grep -m1 FAIL "$OUT/threads.plain.out") [log $OUT/threads.plain.out]"
fi
rm -f "$OUT/threads.shim.json"
if timeout -k 5 300 env LD_PRELOAD="$SHIM" PINSHIM_STATS="$OUT/threads.shim.json" \
       "$BIN/multi_gpu" "$MIB" "$ITERS" >"$OUT/threads.shim.out" 2>&1 &&
   grep -q '^RESULT multi_gpu' "$OUT/threads.shim.out"; then
    pass "threads with the shim: data right"; ok_shim=1
else
    bad "threads with the shim: $(grep -m1 FAIL "$OUT/threads.shim.out") [log $OUT/threads.shim.out]"
fi
if grep -qi pinshim "$OUT/threads.shim.out"; then
    bad "threads with the shim: the shim wrote to the output unasked: $(grep -m1 -i pinshim "$OUT/threads.shim.out")"
fi
if [ $ok_shim -eq 1 ]; then
    if m=$("$PY" - "$OUT/threads.shim.json" "$((MIB << 20))" 2>&1 <<'PY'
import json, sys
j = json.load(open(sys.argv[1])); size = int(sys.argv[2])
p, o = j["promotions"], j["other"]
bad = []
if not j["promotion"]["enabled"]:
    bad.append("promotion disabled: " + j["promotion"]["disabled_reason"])
if p["count"] < 2 or p["bytes"] < 2 * size:
    bad.append(f"only {p['count']} promotions, {p['bytes']} bytes (the two shared sources alone are {2 * size})")
if p["failures"]:
    bad.append(f"{p['failures']} registrations failed (a second registration from the other context?)")
if o["fallbacks"]:
    bad.append(f"{o['fallbacks']} fallbacks")
print(f"promotions {p['count']} ({p['bytes']} bytes), failures {p['failures']}, fallbacks {o['fallbacks']}, "
      f"promoted copies {j['memory']['promoted']['count']}, pageable copies {j['memory']['pageable']['count']}")
if bad:
    print("; ".join(bad)); sys.exit(1)
PY
    ); then
        pass "threads with the shim: shared sources promoted once, used from both devices ($m)"
    else
        bad "threads with the shim: $m"
    fi
fi
for run in plain shim; do
    f=$OUT/threads.$run.out
    [ -f "$f" ] && grep -q '^RESULT' "$f" &&
        echo "RESULT multi_gpu_threads run=$run h2d_gbps=$(field h2d_gbps "$f") d2h_gbps=$(field d2h_gbps "$f") size_mib=$MIB"
done

# ---- 2. two processes, one per device, one node budget ----
NB=$(( (1 << 30) - ( ($$ % 255) + 1 ) * 4096 ))
SEG=/dev/shm/pinshim-$(id -u)-$NB
trap 'rm -f "$SEG"' EXIT
echo "== two processes, one per GPU, 4 x 256 MiB hot each, node budget $NB bytes"
PROC=$OUT/procs
rm -rf "$PROC"; mkdir -p "$PROC/barrier"
pids=()
for dev in 0 1; do
    CUDA_VISIBLE_DEVICES=$dev timeout -k 5 120 env LD_PRELOAD="$SHIM" PINSHIM_NODE_BUDGET="$NB" PINSHIM_BUDGET=4G \
        PINSHIM_STATS="$PROC/node.$dev.json" "$BIN/node_worker" 4 256 1 2 --barrier "$PROC/barrier" 2 \
        >"$PROC/dev$dev.out" 2>&1 &
    pids+=($!)
done
for dev in 0 1; do
    if wait "${pids[$dev]}" && grep -q '^RESULT node_worker ok=1' "$PROC/dev$dev.out"; then
        pass "process on GPU $dev: data right"
    else
        bad "process on GPU $dev: $(grep -m1 FAIL "$PROC/dev$dev.out") [log $PROC/dev$dev.out]"
    fi
done
if m=$("$PY" - "$PROC" "$NB" 2>&1 <<'PY'
import glob, json, os, sys
d, nb = sys.argv[1], int(sys.argv[2])
peaks = {}
for f in sorted(glob.glob(os.path.join(d, "node.*.json"))):
    j = json.load(open(f))
    peaks[os.path.basename(f)] = j["promotions"]["registered_bytes_peak"]
    if j["node_budget"]["bytes"] != nb:
        print(f"{f}: node_budget.bytes {j['node_budget']['bytes']} != {nb}"); sys.exit(1)
total = sum(peaks.values())
print(f"peaks {peaks}, sum {total}, node budget {nb}")
sys.exit(0 if len(peaks) == 2 and 256 << 20 <= total <= nb else 1)
PY
); then
    pass "two processes on two GPUs: sum of registered peaks within the node budget, something pinned ($m)"
else
    bad "two processes on two GPUs: $m"
fi

# ---- 3. PyTorch ----
echo "== PyTorch: pageable tensors to cuda:0 and cuda:1"
cat >"$OUT/torch_multi_gpu.py" <<'PY'
import sys, threading, time
try:
    import torch
except Exception as e:
    print(f"SKIP: torch not importable ({e})")
    sys.exit(0)
if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
    print("SKIP: fewer than 2 GPUs visible to torch")
    sys.exit(0)
nbytes = int(sys.argv[1]) << 20 if len(sys.argv) > 1 else 256 << 20
iters = int(sys.argv[2]) if len(sys.argv) > 2 else 8
numel = nbytes // 4
gen = torch.Generator().manual_seed(1234)
src = [torch.randn(numel, generator=gen) for _ in range(2)]           # pageable
assert not src[0].is_pinned()
dev = [[torch.empty(numel, device=f"cuda:{d}") for _ in range(2)] for d in range(2)]
back = [torch.empty(numel) for _ in range(2)]                          # pageable, one per thread
errors = []

def run(d, what, barrier):
    try:
        with torch.cuda.device(d):
            barrier.wait()
            for _ in range(iters):
                for i in range(2):
                    if what == "h2d":
                        dev[d][i].copy_(src[i])
                    else:
                        back[d].copy_(dev[d][i])
            torch.cuda.synchronize(d)
    except Exception as e:
        errors.append(f"device {d} {what}: {e}")

def phase(what):
    barrier = threading.Barrier(3)
    ts = [threading.Thread(target=run, args=(d, what, barrier)) for d in range(2)]
    for t in ts:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in ts:
        t.join()
    return 2 * iters * 2 * nbytes / (time.perf_counter() - t0) / 1e9

# warm-up (the shim sees the buffers hot), then the timed phases
for d in range(2):
    for i in range(2):
        dev[d][i].copy_(src[i]); back[d].copy_(dev[d][i])
h2d = phase("h2d")
ok = all(torch.equal(dev[d][i].cpu(), src[i]) for d in range(2) for i in range(2))
d2h = phase("d2h")
ok = ok and all(torch.equal(back[d], src[1]) for d in range(2))
# .to() / .cpu(): fresh device tensors and fresh pageable CPU tensors each time
for k in range(4):
    for d in range(2):
        t = src[k % 2].to(f"cuda:{d}")
        ok = ok and torch.equal(t.mul(2).cpu(), src[k % 2] * 2)
ok = ok and not errors
for e in errors:
    print("FAIL", e)
print(f"RESULT torch_multi_gpu ok={int(ok)} h2d_gbps={h2d:.2f} d2h_gbps={d2h:.2f} size_mib={nbytes >> 20} iters={iters}")
sys.exit(0 if ok else 1)
PY
for run in plain shim; do
    envs=()
    [ $run = shim ] && envs=(LD_PRELOAD="$SHIM" PINSHIM_STATS="$OUT/torch.shim.json")
    timeout -k 5 300 env ${envs[@]+"${envs[@]}"} "$PY" "$OUT/torch_multi_gpu.py" "$MIB" "$ITERS" \
        >"$OUT/torch.$run.out" 2>&1
    rc=$?
    if grep -q '^SKIP' "$OUT/torch.$run.out"; then
        skip "torch $run: $(grep -m1 '^SKIP' "$OUT/torch.$run.out")"
        break
    elif [ $rc -eq 0 ] && grep -q '^RESULT torch_multi_gpu ok=1' "$OUT/torch.$run.out"; then
        pass "torch $run: pageable tensors to cuda:0 and cuda:1 and back, data right"
        grep '^RESULT' "$OUT/torch.$run.out" | sed "s/^RESULT torch_multi_gpu/RESULT torch_multi_gpu run=$run/"
    else
        bad "torch $run: exit $rc: $(grep -m1 -e FAIL -e Error "$OUT/torch.$run.out") [log $OUT/torch.$run.out]"
    fi
done
summary
