#!/usr/bin/env bash
# model_settings.sh [BUILD]: how the staging settings move the model benchmark's two figures,
# model.to("cuda") and the checkpoint-style state_dict() copies (bench/model_bench.py, GPT-2
# medium built on the CPU), measured in one run: each variant runs MODEL_REPS times (default 2),
# the variants taking turns so that a drift of the machine falls on all of them alike.  A
# variant is a name and the environment of its runs; LIB=PATH in it runs another build of the
# library (a build with other compile-time constants, say), NOSHIM runs without the shim.
#
# Prints a table (median GB/s of each figure per variant, and its ratio to the shim's defaults)
# and writes it to $OUT/model_settings.txt, every run's output under $OUT/model_settings/.
# About 12 s per run on an H100 or H200 host.
# Environment: OUT (default BUILD/probes), MODEL_REPS, MODEL_VARIANTS (the variants, one per
# line, "name|ENV..."; default: the list below), MODEL_ARGS (more model_bench.py arguments).
set -u
# shellcheck source=bench/probes/probe_setup.sh
. "$(dirname "$0")/probe_setup.sh" "${1:-}"   # ROOT BUILD LIB OUT DIR
REPS=${MODEL_REPS:-2}

VARIANTS=(
    "pageable|NOSHIM"
    "shim|"
    "buffers_6|PINSHIM_STAGING_BUFFERS=6"
    "buffers_6_chunk_8M|PINSHIM_STAGING_BUFFERS=6 PINSHIM_STAGING_CHUNK=8M"
    "threads_8|PINSHIM_COPY_THREADS=8"
)
probe_variants "${MODEL_VARIANTS:-}"

run() {   # run NAME REP WORD...: one model_bench.py run, its output in $DIR/NAME.REP.txt
    local name=$1 rep=$2; shift 2
    local words=() e shim=SHIM   # under the shim unless NOSHIM, or LIB= names another build
    for e in "$@"; do
        case $e in
            NOSHIM) shim= ;;
            LIB=*) shim=; words+=("$e") ;;
            *) words+=("$e") ;;
        esac
    done
    # shellcheck disable=SC2086
    probe_run 300 "$DIR/$name.$rep.txt" ${shim:+"$shim"} "${words[@]}" -- \
        python3 "$ROOT/bench/model_bench.py" ${MODEL_ARGS:-}
}

for ((rep = 1; rep <= REPS; rep++)); do
    for v in "${VARIANTS[@]}"; do
        # shellcheck disable=SC2086
        run "${v%%|*}" "$rep" ${v#*|}
    done
done

python3 - "$DIR" "$REPS" "${VARIANTS[@]}" <<'PY' | tee "$OUT/model_settings.txt"
import os, re, statistics, sys
d, reps, variants = sys.argv[1], int(sys.argv[2]), [v.split("|", 1)[0] for v in sys.argv[3:]]
field = re.compile(r"(\w+)=(\S+)")
ops = (("to_cuda", "model.to"), ("state_dict_cpu", "state_dict"))
got = {}
for v in variants:
    for rep in range(1, reps + 1):
        try:
            text = open(os.path.join(d, f"{v}.{rep}.txt"), errors="replace").read()
        except OSError:
            continue
        for line in text.splitlines():
            if line.startswith("RESULT bench=model"):
                f = dict(field.findall(line))
                if f.get("ok") == "1" and "gbps" in f:
                    got.setdefault((v, f.get("op")), []).append(float(f["gbps"]))
print(f"## model_bench.py GB/s, median of {reps} runs per variant (min-max); ratio to the shim's defaults\n")
print("| variant | " + " | ".join(f"{name} | vs shim" for _, name in ops) + " |")
print("|---|" + "---|---|" * len(ops))
for v in variants:
    cells = []
    for op, _ in ops:
        xs, base = got.get((v, op)), got.get(("shim", op))
        if not xs:
            cells += ["-", "-"]
            continue
        m = statistics.median(xs)
        cells.append(f"{m:.1f} ({min(xs):.1f}-{max(xs):.1f})")
        cells.append(f"{m / statistics.median(base):.2f}x" if base else "-")
    print(f"| {v} | " + " | ".join(cells) + " |")
print()
PY
