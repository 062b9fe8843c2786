#!/usr/bin/env bash
# model_split.sh [BUILD]: where model.to("cuda") under the shim loses to the same move made
# tensor by tensor.  model_tensors.py's per-tensor move reached 29.9 GB/s under the shim where
# model_bench.py's model.to reached 16.7-20.6 on the same machine (bench/RESULTS.md, run 50);
# pinned, the two are close.  The per-tensor move differs from model.to in two ways, each a word of model_tensors.py:
# "free" (each tensor's CPU memory freed during the move, the frees timed apart) and
# "fresh_device" (the device memory allocated during the move).  This runs the move with
# neither, each and both, under the shim and pinned without it, then model_bench.py's model.to
# under the shim, free_after_copy (the frees of model-sized blocks right after their copies)
# with and without the shim, and fresh_device (each tensor's copy into device memory allocated
# before the move or right before the copy, optionally written once first; its steps timed
# apart) under the shim and from pinned memory without it.
#
# Prints a table (the move's GB/s, its time, the frees' time) and writes it to
# $OUT/model_split.txt, every run's output under $OUT/model_split/.  About 170 s.
# Environment: OUT (default BUILD/probes), CUDA_INC (/usr/local/cuda/include).
set -u
# shellcheck source=bench/probes/probe_setup.sh
. "$(dirname "$0")/probe_setup.sh" "${1:-}"   # ROOT BUILD LIB OUT DIR

run() {   # run NAME WORD... -- COMMAND...: one run, its output in $DIR/NAME.txt
    local name=$1; shift
    probe_run 120 "$DIR/$name.txt" "$@"
}

MT=$ROOT/bench/probes/model_tensors.py
for words in "" "free" "fresh_device" "free fresh_device"; do
    tag=${words// /+}
    # shellcheck disable=SC2086
    run "shim${tag:+-$tag}" SHIM -- python3 "$MT" shim $words
done
run "pinned" -- python3 "$MT" pinned
run "pinned-free+fresh_device" -- python3 "$MT" pinned free fresh_device
run "model_bench-shim" SHIM -- python3 "$ROOT/bench/model_bench.py" --checkpoints 1
FD=$BUILD/fresh_device
if cc -O2 -I"${CUDA_INC:-/usr/local/cuda/include}" -o "$FD" "$ROOT/bench/probes/fresh_device.c" -lcuda \
        >"$DIR/fresh_device-build.txt" 2>&1; then
    for e in "FRESH=0" "FRESH=1" "FRESH=1 TOUCH=1"; do
        tag=${e//FRESH=/fresh}; tag=${tag// TOUCH=1/-touch}
        # shellcheck disable=SC2086
        run "fresh_device-shim-$tag" SHIM $e -- "$FD"
        # shellcheck disable=SC2086
        run "fresh_device-pinned-$tag" PINNED=1 $e -- "$FD"
    done
fi
FAC=$BUILD/free_after_copy
if cc -O2 -I"${CUDA_INC:-/usr/local/cuda/include}" -o "$FAC" "$ROOT/bench/probes/free_after_copy.c" -lcuda \
        >"$DIR/free_after_copy-build.txt" 2>&1; then
    for e in 0 1; do
        run "free_after_copy-shim-each$e" SHIM FREE_EACH=$e -- "$FAC"
        run "free_after_copy-plain-each$e" FREE_EACH=$e -- "$FAC"
    done
fi

python3 - "$DIR" <<'PY' | tee "$OUT/model_split.txt"
import glob, os, re, sys
d = sys.argv[1]
move = re.compile(r'^(\S+): to\("cuda"\)(?: as Module\.to)?, (\d+) tensors \((.*)\): ([\d.]+) GB in ([\d.]+) ms \(([\d.]+) GB/s\)')
freed = re.compile(r"CPU memory freed: ([\d.]+) ms")
print("## The move to the GPU, GB/s (time; the frees' time where the move frees)\n")
print("| run | GB/s | ms | frees ms |")
print("|---|---|---|---|")
for path in sorted(glob.glob(os.path.join(d, "*.txt"))):
    name = os.path.basename(path)[:-4]
    text = open(path, errors="replace").read()
    for line in text.splitlines():
        m = move.match(line)
        if m:
            f = freed.search(m.group(3))
            print(f"| {name} | {m.group(6)} | {m.group(5)} | {f.group(1) if f else '-'} |")
            break
        if line.startswith("RESULT bench=model op=to_cuda"):
            g = dict(kv.split("=", 1) for kv in line.split()[1:] if "=" in kv)
            print(f"| {name} (model.to) | {float(g.get('gbps', 0)):.1f} | {float(g.get('seconds', 0)) * 1e3:.1f} | - |")
            break
        if line.startswith("free_each=") or line.startswith("fresh=") or line.startswith("MISMATCH"):
            print(f"| {name} | {line} | | |")
            break
    else:
        if "run failed" in text:
            print(f"| {name} | failed (see {name}.txt) | | |")
print()
PY
