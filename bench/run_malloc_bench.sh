#!/usr/bin/env bash
# run_malloc_bench.sh BUILD [OUTDIR]: what the shim's hooks add to malloc/free, to one small
# copy and to one small memcpy, and what they do to programs that never copy to a GPU.
#
# Runs BUILD/bench/cpu_malloc_overhead, BUILD/bench/cpu_copy_overhead (against the null driver,
# whose copies return at once) and BUILD/bench/cpu_memcpy_overhead without the shim, then with
# LD_PRELOAD=BUILD/libpinshim.so in PINSHIM_MODE=observe and full, and prints the median ns per
# operation of each and the cost the shim adds.  Then BUILD/bench/cpu_heap (malloc+touch+free
# loops at 64 KiB..32 MiB on 1, 4 and 16 threads, and 140,000 live 64-72 KiB blocks) without
# the shim and in mode full, and a table of the two with the targets (bench/summarize.py
# --heap).  CPU only; no GPU or driver needed.  Asserts nothing about timings: the exit
# status is non-zero only if a run fails.  With OUTDIR, the raw output of each run is kept there
# (malloc.<variant>.txt) with the tables malloc_overhead.md and heap.md.
# Extra arguments for every program: MALLOC_BENCH_ARGS (e.g. --quick).
# MALLOC_BENCH_PROGS=heap: only cpu_memcpy_overhead and cpu_heap (the do-no-harm figures).
# HEAP_REPS (3): runs of cpu_heap on each side, alternating; each cell is the median of its runs.
set -u
BUILD=${1:-build}
OUTDIR=${2:-}
BIN=$BUILD/bench/cpu_malloc_overhead
COPY_BIN=$BUILD/bench/cpu_copy_overhead
MEMCPY_BIN=$BUILD/bench/cpu_memcpy_overhead
HEAP_BIN=$BUILD/bench/cpu_heap
LIB=$BUILD/libpinshim.so
ARGS=${MALLOC_BENCH_ARGS:-}
HEAP_REPS=${HEAP_REPS:-3}
[[ $HEAP_REPS =~ ^[1-9][0-9]*$ ]] || { echo "run_malloc_bench: HEAP_REPS must be a whole number >= 1" >&2; exit 2; }
HERE=$(cd "$(dirname "$0")" && pwd)
PROGS=("$BIN" "$COPY_BIN" "$MEMCPY_BIN")
[ "${MALLOC_BENCH_PROGS:-all}" = heap ] && PROGS=("$MEMCPY_BIN")

if [ ! -x "$BIN" ]; then
    echo "run_malloc_bench: $BIN not built (run make first)" >&2
    exit 2
fi
tmp=$(mktemp -d "${TMPDIR:-/tmp}/pinshim-malloc.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
[ -n "$OUTDIR" ] && mkdir -p "$OUTDIR"

variants="plain"
if [ -f "$LIB" ]; then
    LIB=$(cd "$(dirname "$LIB")" && pwd)/$(basename "$LIB")
    variants="plain observe full"
else
    echo "run_malloc_bench: $LIB not built: measuring without the shim only" >&2
fi

# run_in VARIANT PROG: PROG without the shim (plain) or under it in mode VARIANT, its output
# appended to VARIANT.txt / VARIANT.err; its exit status.
run_in() {
    # shellcheck disable=SC2086 # ARGS is a list of words
    if [ "$1" = plain ]; then
        env -u LD_PRELOAD "$2" $ARGS >>"$tmp/$1.txt" 2>>"$tmp/$1.err"
    else
        env LD_PRELOAD="$LIB${LD_PRELOAD:+:$LD_PRELOAD}" PINSHIM_MODE="$1" PINSHIM_STATS= PINSHIM_REPORT= \
            "$2" $ARGS >>"$tmp/$1.txt" 2>>"$tmp/$1.err"
    fi
}

# failed WHAT STATUS: say so with the end of the variant's errors (VARIANT in $v).
failed() {
    echo "run_malloc_bench: $1 failed (exit $2):" >&2
    tail -n 5 "$tmp/$v.err" >&2
    rc=1
}

rc=0
for v in $variants; do
    r=0
    for prog in "${PROGS[@]}"; do
        [ -x "$prog" ] || continue
        run_in "$v" "$prog" || r=$?
    done
    [ $r -ne 0 ] && failed "the $v run" $r
done

# The heap loops take seconds per run: without the shim and in the mode that matters, HEAP_REPS
# times each, alternating, so that a disturbance of the machine (other tenants, a straggling
# process) lands on both sides; summarize.py takes each cell's median over the runs.
if [ -x "$HEAP_BIN" ]; then
    for ((i = 0; i < HEAP_REPS; i++)); do
        for v in $variants; do
            [ "$v" = observe ] && continue
            r=0
            run_in "$v" "$HEAP_BIN" || r=$?
            [ $r -ne 0 ] && failed "the heap run in $v" $r
        done
    done
fi
for v in $variants; do
    [ -n "$OUTDIR" ] && [ -f "$tmp/$v.txt" ] && cp "$tmp/$v.txt" "$OUTDIR/malloc.$v.txt"
done

files=$(for v in $variants; do [ -s "$tmp/$v.txt" ] && echo "$tmp/$v.txt"; done)
if [ -z "$files" ]; then
    echo "run_malloc_bench: no results" >&2
    exit 1
fi
# Join the RESULT lines into: test size plain [observe +delta] [full +delta].
# ($files is a word list of paths without spaces, from mktemp.)
# shellcheck disable=SC2086
awk -v variants="$variants" '
    BEGIN { nv = split(variants, V, " ") }
    /^RESULT bench=(malloc|copy|memcpy)_overhead/ {
        n = split(FILENAME, p, "/"); v = p[n]; sub(/\.txt$/, "", v)
        test = ""; size = ""; med = ""
        for (i = 2; i <= NF; i++) {
            split($i, kv, "=")
            if (kv[1] == "test") test = kv[2]
            else if (kv[1] == "size") size = kv[2]
            else if (kv[1] == "ns_median") med = kv[2]
        }
        key = test " " size
        if (!(key in seen)) { seen[key] = 1; order[++nk] = key }
        val[key, v] = med
    }
    END {
        hdr = sprintf("| %-17s | %9s | %10s", "test", "size (B)", "plain ns")
        sep = "|-------------------|-----------|------------"
        for (j = 2; j <= nv; j++) {
            hdr = hdr sprintf(" | %10s | %10s", V[j] " ns", "added ns")
            sep = sep "|------------|------------"
        }
        print hdr " |"; print sep "|"
        for (k = 1; k <= nk; k++) {
            split(order[k], ts, " ")
            base = val[order[k], "plain"]
            line = sprintf("| %-17s | %9s | %10s", ts[1], ts[2], base == "" ? "-" : sprintf("%.1f", base))
            for (j = 2; j <= nv; j++) {
                x = val[order[k], V[j]]
                if (x == "") line = line sprintf(" | %10s | %10s", "-", "-")
                else if (base == "") line = line sprintf(" | %10.1f | %10s", x, "-")
                else line = line sprintf(" | %10.1f | %+10.1f", x, x - base)
            }
            print line " |"
        }
    }' $files >"$tmp/table.md"

echo "malloc/free and small-copy cost, median ns per operation (pair = one malloc + one free;"
echo "copy_* = one sync copy against a driver that returns at once; memcpy_*/memmove_*/memset_* ="
echo "one 64-byte call):"
cat "$tmp/table.md"
[ -n "$OUTDIR" ] && cp "$tmp/table.md" "$OUTDIR/malloc_overhead.md"
if grep -q '^RESULT bench=heap' "$tmp/plain.txt" 2>/dev/null; then
    shim_txt=$tmp/full.txt
    [ -s "$shim_txt" ] || shim_txt=/dev/null
    echo
    if python3 "$HERE/summarize.py" --heap "$tmp/plain.txt" "$shim_txt" >"$tmp/heap.md"; then
        cat "$tmp/heap.md"
        [ -n "$OUTDIR" ] && cp "$tmp/heap.md" "$OUTDIR/heap.md"
    else
        echo "run_malloc_bench: summarize.py --heap failed" >&2
        rc=1
    fi
fi
exit $rc
