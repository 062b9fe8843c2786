#!/usr/bin/env bash
# Launcher recipes (issue 7), on the checking fake driver:
#   1. a job of six "ranks", each naming its rank the way one launcher does (RANK for torchrun,
#      OMPI_COMM_WORLD_RANK for Open MPI, PMI_RANK for MPICH/Hydra, SLURM_PROCID for srun), all
#      with PINSHIM_STATS=DIR/stats.%r.json: one file per rank, %r expanded; without any rank
#      variable %r becomes "x"; RANK wins over the others;
#   2. scripts/pinshim-merge over those files: --json totals equal the per-file counts, bytes and
#      seconds summed here independently (the peak is the largest), a directory argument gives
#      the same totals, and the text report has one row per rank;
#   3. scripts/pinshim: --mode/--stats with %p write the stats file of that pid, the command's
#      exit status comes back unchanged, an LD_PRELOAD already set is kept (after the shim, and
#      really loaded), the shim is not put in twice, and a missing command gives 127.
# usage: tests/check_merge.sh [BUILD]   (prints PASS/FAIL lines, "N passed, M failed")
set -u
BUILD=${1:-build}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
SHIM=$ROOT/$BUILD/libpinshim.so
FAKE=$ROOT/$BUILD/fakecuda
DOORS=$ROOT/$BUILD/tests/fake/test_doors
OTHER=$ROOT/$BUILD/tests/fake/test_promotion   # a second workload, so the ranks differ
[ -x "$OTHER" ] || OTHER=$DOORS
MERGE=$ROOT/scripts/pinshim-merge
WRAP=$ROOT/scripts/pinshim
npass=0 nfail=0
pass() { npass=$((npass + 1)); echo "PASS $*"; }
bad() { nfail=$((nfail + 1)); echo "FAIL $*"; }
for f in "$SHIM" "$DOORS"; do
    [ -e "$f" ] || { echo "FAIL $f is not built"; echo "0 passed, 1 failed"; exit 1; }
done
TMP=$(mktemp -d /tmp/pinshim-merge.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
RANKVARS=(-u RANK -u OMPI_COMM_WORLD_RANK -u PMI_RANK -u SLURM_PROCID -u LD_PRELOAD)

# rank_run DIR PROGRAM [VAR=VALUE...]: the program under the shim in observe mode, stats in
# DIR/stats.%r.json, no rank variable inherited from the caller but the ones given.
rank_run() {
    local dir=$1 prog=$2; shift 2
    env "${RANKVARS[@]}" LD_LIBRARY_PATH="$FAKE" LD_PRELOAD="$SHIM" PINSHIM_MODE=observe \
        PINSHIM_STATS="$dir/stats.%r.json" "$@" "$prog" >"$TMP/last.out" 2>&1
}

# ---- 1. one stats file per rank ----
JOB=$TMP/job
mkdir -p "$JOB"
runs=("0 $DOORS RANK=0" "1 $OTHER RANK=1" "2 $DOORS RANK=2"
      "3 $DOORS OMPI_COMM_WORLD_RANK=3" "4 $OTHER PMI_RANK=4" "5 $DOORS SLURM_PROCID=5")
for r in "${runs[@]}"; do
    # shellcheck disable=SC2086
    set -- $r
    rank=$1 prog=$2 var=$3
    if rank_run "$JOB" "$prog" "$var"; then
        if [ -s "$JOB/stats.$rank.json" ]; then
            pass "rank $rank ($var, $(basename "$prog")): stats.$rank.json written"
        else
            bad "rank $rank ($var): no stats.$rank.json (files: $(ls "$JOB" | tr '\n' ' '))"
        fi
    else
        bad "rank $rank ($var): $(basename "$prog") failed under the shim"; sed 's/^/    | /' "$TMP/last.out" | tail -10
    fi
done
n=$(find "$JOB" -name '*.json' | wc -l)
[ "$n" -eq 6 ] && pass "six ranks, six stats files" || bad "six ranks but $n stats files: $(ls "$JOB" | tr '\n' ' ')"

mkdir -p "$TMP/norank" "$TMP/both"
if rank_run "$TMP/norank" "$DOORS" && [ -s "$TMP/norank/stats.x.json" ]; then
    pass "no rank variable: %r becomes x (stats.x.json)"
else
    bad "no rank variable: expected stats.x.json, found: $(ls "$TMP/norank" | tr '\n' ' ')"
fi
if rank_run "$TMP/both" "$DOORS" RANK=7 SLURM_PROCID=9 && [ -s "$TMP/both/stats.7.json" ] &&
   [ ! -e "$TMP/both/stats.9.json" ]; then
    pass "RANK and SLURM_PROCID both set: RANK wins (stats.7.json)"
else
    bad "RANK=7 SLURM_PROCID=9: expected stats.7.json, found: $(ls "$TMP/both" | tr '\n' ' ')"
fi

# ---- 2. pinshim-merge ----
if "$MERGE" "$JOB"/stats.*.json --json >"$TMP/merged.json" 2>"$TMP/merge.err"; then
    pass "pinshim-merge --json over the six files exits 0"
else
    bad "pinshim-merge --json exited non-zero: $(head -c 300 "$TMP/merge.err")"
fi
"$MERGE" --json "$JOB" >"$TMP/merged_dir.json" 2>>"$TMP/merge.err"
python3 - "$TMP/merged.json" "$TMP/merged_dir.json" "$JOB"/stats.*.json >"$TMP/check.out" 2>&1 <<'PY'
import json, sys
merged, merged_dir, files = sys.argv[1], sys.argv[2], sys.argv[3:]
per = [json.load(open(f)) for f in files]
out = []
def say(ok, msg):
    out.append(("PASS " if ok else "FAIL ") + msg)
try:
    m = json.load(open(merged))
except Exception as e:
    print(f"FAIL merged JSON unreadable: {e}")
    sys.exit(0)
t = m.get("totals", {})
say(m.get("processes") == len(per), f"merged processes = {m.get('processes')} (files: {len(per)})")
bad = []
for d in ("h2d", "d2h", "d2d", "h2h"):
    for k in ("count", "bytes"):
        want = sum(p["copies"][d][k] for p in per)
        got = t.get("copies", {}).get(d, {}).get(k)
        if got != want:
            bad.append(f"copies.{d}.{k}: merged {got}, sum {want}")
    want = sum(p["copies"][d]["seconds"] for p in per)
    got = t.get("copies", {}).get(d, {}).get("seconds")
    if got is None or abs(got - want) > 1e-9 + 1e-6 * want:
        bad.append(f"copies.{d}.seconds: merged {got}, sum {want}")
say(not bad, "merged copies per direction = sums of the files (count, bytes, seconds)" + (": " + "; ".join(bad) if bad else ""))
bad = []
for kind in per[0]["memory"]:
    for k in ("count", "bytes"):
        want = sum(p["memory"][kind][k] for p in per)
        got = t.get("memory", {}).get(kind, {}).get(k)
        if got != want:
            bad.append(f"memory.{kind}.{k}: merged {got}, sum {want}")
say(not bad, "merged memory paths = sums of the files" + (": " + "; ".join(bad) if bad else ""))
hist_want = sum(h["count"] for p in per for h in p.get("histogram", []))
hist_got = sum(h["count"] for h in t.get("histogram", []))
say(hist_got == hist_want, f"merged histogram holds every copy ({hist_got} = {hist_want})")
peak_want = max(p["promotions"]["registered_bytes_peak"] for p in per)
peak_got = t.get("promotions", {}).get("registered_bytes_peak")
say(peak_got == peak_want, f"merged registered_bytes_peak is the largest ({peak_got} = {peak_want})")
say(sorted(t.get("pids", [])) == sorted(p["pid"] for p in per), "merged pids are the files' pids")
ranks = sorted(r.get("rank") for r in m.get("rows", []) if r.get("rank") is not None)
say(ranks == list(range(len(per))), f"rows carry ranks 0..{len(per) - 1} ({ranks})")
total_copies = sum(p["copies"][d]["count"] for p in per for d in ("h2d", "d2h", "d2d"))
say(total_copies > 0 and len({json.dumps(p["copies"]) for p in per}) > 1,
    f"the ranks copied something, not all alike ({total_copies} copies)")
try:
    md = json.load(open(merged_dir))
    say(md.get("totals", {}).get("copies") == t.get("copies") and md.get("processes") == m.get("processes"),
        "pinshim-merge DIR gives the same totals as the file list")
except Exception as e:
    say(False, f"pinshim-merge DIR: unreadable output ({e})")
print("\n".join(out))
PY
while IFS= read -r line; do
    case $line in PASS*) pass "${line#PASS }" ;; FAIL*) bad "${line#FAIL }" ;; *) echo "    $line" ;; esac
done <"$TMP/check.out"

"$MERGE" "$JOB"/stats.*.json >"$TMP/merged.txt" 2>>"$TMP/merge.err"
# Rows of the "Per process" table: after its header and dashes, up to the end or a blank line.
rows=$(awk '/^Per process/ { on = 1; skip = 2; next }
            on && skip { skip--; next }
            on && NF == 0 { exit }
            on { print $1 }' "$TMP/merged.txt" | sort -n | tr '\n' ' ')
if [ "$rows" = "0 1 2 3 4 5 " ]; then
    pass "text report: one row per rank (0..5)"
else
    bad "text report: rows per rank are '$rows', expected '0 1 2 3 4 5'"; sed 's/^/    | /' "$TMP/merged.txt" | tail -12
fi
grep -q '^pinshim-merge: 6 process(es), ranks 0\.\.5' "$TMP/merged.txt" &&
    pass "text report header: 6 processes, ranks 0..5" ||
    bad "text report header: $(head -1 "$TMP/merged.txt")"

# ---- 3. the pinshim wrapper ----
mkdir -p "$TMP/wrap"
if env "${RANKVARS[@]}" PINSHIM_LIB="$SHIM" LD_LIBRARY_PATH="$FAKE" \
       "$WRAP" --mode observe --stats "$TMP/wrap/p.%p.json" -- "$DOORS" >"$TMP/wrap.out" 2>&1; then
    pass "pinshim --mode observe --stats ... -- test_doors exits 0"
else
    bad "pinshim -- test_doors failed"; sed 's/^/    | /' "$TMP/wrap.out" | tail -10
fi
f=$(ls "$TMP/wrap"/p.*.json 2>/dev/null)
if [ "$(echo "$f" | grep -c .)" -eq 1 ] && python3 - "$f" <<'PY'
import json, os, re, sys
path = sys.argv[1]
d = json.load(open(path))
pid = int(re.search(r"p\.(\d+)\.json$", path).group(1))
sys.exit(0 if d["pid"] == pid and d["mode"] == "observe" and d["copies"]["h2d"]["count"] > 0 else 1)
PY
then
    pass "pinshim --stats p.%p.json: one file, named by the pid it records, mode observe, copies counted"
else
    bad "pinshim --stats p.%p.json: files '$f'"
fi

env -u LD_PRELOAD PINSHIM_LIB="$SHIM" "$WRAP" -- sh -c 'exit 7' >/dev/null 2>&1; rc=$?
[ "$rc" -eq 7 ] && pass "pinshim -- sh -c 'exit 7' exits 7" || bad "pinshim -- sh -c 'exit 7' exited $rc"
env -u LD_PRELOAD PINSHIM_LIB="$SHIM" "$WRAP" -- true >/dev/null 2>&1; rc=$?
[ "$rc" -eq 0 ] && pass "pinshim -- true exits 0" || bad "pinshim -- true exited $rc"
env -u LD_PRELOAD PINSHIM_LIB="$SHIM" "$WRAP" -- /nonexistent/command >/dev/null 2>&1; rc=$?
[ "$rc" -eq 127 ] && pass "pinshim -- a missing command exits 127" || bad "pinshim -- a missing command exited $rc"

# A preload the user already had: a do-nothing library of our own.
DUMMY=$TMP/libmergedummy.so
if printf 'int mergedummy_marker(void) { return 42; }\n' >"$TMP/dummy.c" &&
   ${CC:-cc} -shared -fPIC -o "$DUMMY" "$TMP/dummy.c" 2>"$TMP/cc.err"; then
    preload=$(LD_PRELOAD="$DUMMY" PINSHIM_LIB="$SHIM" "$WRAP" -- sh -c 'printf "%s" "$LD_PRELOAD"' 2>&1)
    if [ "$preload" = "$SHIM:$DUMMY" ]; then
        pass "pinshim keeps an existing LD_PRELOAD, after the shim ($preload)"
    else
        bad "pinshim with LD_PRELOAD=$DUMMY: the command saw LD_PRELOAD='$preload'"
    fi
    maps=$(LD_PRELOAD="$DUMMY" PINSHIM_LIB="$SHIM" "$WRAP" -- sh -c 'cat /proc/$$/maps' 2>/dev/null)
    if echo "$maps" | grep -q libmergedummy && echo "$maps" | grep -q "$(basename "$SHIM")"; then
        pass "both the shim and the existing preload are loaded into the command"
    else
        bad "the command's maps lack the shim or the existing preload"
    fi
else
    bad "could not build a dummy preload library: $(head -c 200 "$TMP/cc.err")"
fi
got=$(LD_PRELOAD="$SHIM" PINSHIM_LIB="$SHIM" "$WRAP" -- sh -c 'printf "%s" "$LD_PRELOAD"' 2>&1)
[ "$got" = "$SHIM" ] && pass "pinshim does not preload the shim twice" || bad "LD_PRELOAD already holding the shim became '$got'"

echo "$npass passed, $nfail failed"
[ "$nfail" -eq 0 ]
