#!/usr/bin/env bash
# staged_settings.sh [BUILD]: why a staged one-shot copy runs at the rate it does.  One program
# (oneshot_copies.cu: each buffer filled, then copied once, as tensor.to() does) copies 4, 16, 64
# and 256 MiB each way: pinned without the shim (the ceiling), pageable without it, then under
# the shim with its defaults and with one staging setting changed at a time, with buffers on
# transparent huge pages, and with cudaMemcpy calls instead of cudaMemcpyAsync on the legacy
# stream, and with every copy of a size from one buffer (the staging benchmark's kinds of call
# and buffer: it reached 47 GB/s D2H where one-shot async copies reached 22-26; a budget of
# 50 MiB holds the staging buffers' 48 and keeps the buffer from being registered).  Then one traced run per direction under the defaults, whose staged
# lines say where each copy's time went: copying on the CPU, waiting for DMAs, and the time
# until its first piece went to the copy threads.
#
# Prints a table (GB/s per variant and size; the variant's ratio to the defaults at the largest
# size) and the traced split, and writes them to $OUT/staged_settings.txt with every run's
# output under $OUT/staged_settings/.  About 90 s on an H100 or H200 host.
# Environment: OUT (default BUILD/probes), NVCC, BENCH_ARCH (sm_90), STAGED_SIZES (MiB, "4 16 64
# 256"), ONESHOT (a built oneshot_copies: skips the build), STAGED_VARIANTS (the variants, one
# per line, "name|WORDS" as below, LIB=PATH for another build; the ratios need one named shim).
set -u
# shellcheck source=bench/probes/probe_setup.sh
. "$(dirname "$0")/probe_setup.sh" "${1:-}"   # ROOT BUILD LIB OUT DIR
SIZES=${STAGED_SIZES:-4 16 64 256}

BIN=${ONESHOT:-}
if [ -z "$BIN" ]; then
    NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
    BIN=$BUILD/oneshot_copies
    "$NVCC" -O2 -arch="${BENCH_ARCH:-sm_90}" -o "$BIN" "$ROOT/bench/probes/oneshot_copies.cu" \
        >"$DIR/build.log" 2>&1 || { echo "staged_settings: nvcc failed (see $DIR/build.log)" >&2; exit 2; }
fi

# The variants: a name, then the environment of the run (SHIM: under the shim).
VARIANTS=(
    "pinned|PINNED=1"
    "pageable|"
    "shim|SHIM"
    "huge_pages|SHIM HUGE=1"
    "sync_calls|SHIM SYNC=1"
    "one_buffer|SHIM REUSE=1 PINSHIM_BUDGET=50M"
    "one_buffer_sync|SHIM REUSE=1 SYNC=1 PINSHIM_BUDGET=50M"
    "no_streaming_stores|SHIM PINSHIM_STREAMING_STORES=0"
    "no_taper|SHIM PINSHIM_STAGING_TAPER=0"
    "threads_4|SHIM PINSHIM_COPY_THREADS=4"
    "threads_8|SHIM PINSHIM_COPY_THREADS=8"
    "buffers_6|SHIM PINSHIM_STAGING_BUFFERS=6"
    "chunk_4M|SHIM PINSHIM_STAGING_CHUNK=4M"
    "chunk_64M|SHIM PINSHIM_STAGING_CHUNK=64M"
)
probe_variants "${STAGED_VARIANTS:-}"

run() {   # run NAME DIRECTION WORD...: one program run, its output in $DIR/NAME-DIRECTION.txt
    local name=$1 dir=$2; shift 2
    # shellcheck disable=SC2086
    probe_run 300 "$DIR/$name-$dir.txt" "$@" -- "$BIN" "$dir" $SIZES
}

for dir in h2d d2h; do
    for v in "${VARIANTS[@]}"; do
        # shellcheck disable=SC2086
        run "${v%%|*}" "$dir" ${v#*|}
    done
    rm -f "$DIR/traced-$dir.trace"
    run "traced" "$dir" SHIM PINSHIM_TRACE="$DIR/traced-$dir.trace"
done

python3 - "$ROOT/bench" "$DIR" "${VARIANTS[@]}" <<'PY' | tee "$OUT/staged_settings.txt"
import os, re, sys
sys.dont_write_bytecode = True   # no __pycache__ beside the benchmark scripts
sys.path.insert(0, sys.argv[1])
from summarize import trace_events   # the trace's line format, read in one place
d, variants = sys.argv[2], [v.split("|", 1)[0] for v in sys.argv[3:]]
line = re.compile(r"^\S+ (H2D|D2H) +([\d.]+) MiB x *\d+: +([\d.]+) GB/s")
for dir in ("h2d", "d2h"):
    rates, sizes, bad = {}, [], []
    for v in variants:
        try:
            text = open(os.path.join(d, f"{v}-{dir}.txt"), errors="replace").read()
        except OSError:
            continue
        bad += [f"**{v} {dir.upper()}: bytes differ** ({l})" for l in text.splitlines() if "MISMATCH" in l]
        for l in text.splitlines():
            m = line.match(l)
            if m:
                size = float(m.group(2))
                rates[(v, size)] = float(m.group(3))
                if size not in sizes:
                    sizes.append(size)
    sizes.sort()
    print(f"## {dir.upper()}: GB/s per size (MiB); last column: the largest size against the shim's defaults\n")
    print("| variant | " + " | ".join(f"{s:g}" for s in sizes) + " | vs shim |")
    print("|---|" + "---|" * (len(sizes) + 1))
    base = rates.get(("shim", sizes[-1])) if sizes else None
    for v in variants:
        cells = [f"{rates[(v, s)]:.1f}" if (v, s) in rates else "-" for s in sizes]
        top = rates.get((v, sizes[-1])) if sizes else None
        ratio = f"{top / base:.2f}x" if top and base else "-"
        print(f"| {v} | " + " | ".join(cells) + f" | {ratio} |")
    if bad:
        print("\n" + "\n".join(bad))
    # The traced run: each staged copy's split, summed per size.
    per = {}
    try:
        for dur, ev, f in trace_events(os.path.join(d, f"traced-{dir}.trace")):
            if ev != "staged":
                continue
            try:
                b = int(f["bytes"])
                row = per.setdefault(b, [0, 0, 0, 0, 0, 0, 0])
                row[0] += 1
                row[1] += float(dur) * 1000   # the line's duration, written in us: ns
                for i, k in enumerate(("cpu_us", "dma_wait_us", "first_us", "order_wait_us", "pieces")):
                    row[2 + i] += int(f.get(k, 0))
            except (KeyError, ValueError):
                continue
    except OSError:
        pass
    if per:
        print(f"\nTraced {dir.upper()} staged copies, means per copy (CPU GB/s: bytes over the time a piece was being copied):\n")
        print("| bytes | copies | pieces | GB/s in the call | CPU copying us | CPU GB/s | DMA waits us | to first piece us | ordering waits us |")
        print("|---|---|---|---|---|---|---|---|---|")
        for b in sorted(per):
            n, ns, cpu, wait, first, order, pieces = per[b]
            cpu_rate = f"{b * n / (cpu * 1000):.1f}" if cpu else "-"
            print(f"| {b / 2**20:g} MiB | {n} | {pieces / n:.1f} | {b * n / ns:.1f} | {cpu / n:.0f} | {cpu_rate} | {wait / n:.0f} | "
                  f"{first / n:.0f} | {order / n:.0f} |")
    print()
PY
