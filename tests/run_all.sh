#!/usr/bin/env bash
# `make test`: unit tests, the checking fake driver's self-tests, every fake-driver program run
# without the shim and again under LD_PRELOAD in each mode, programs that never use CUDA, the
# settings documentation check, and the GPU suite when a GPU is present.
set -u
BUILD=${1:-build}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
SHIM=$ROOT/$BUILD/libpinshim.so
FAKE=$ROOT/$BUILD/fakecuda
LOGDIR=$ROOT/$BUILD/test-logs
rm -rf "$LOGDIR"; mkdir -p "$LOGDIR"
pass=0 fail=0 skip=0
failed_names=()

note_pass() { pass=$((pass + 1)); printf 'PASS %s\n' "$1"; }
note_fail() {
    fail=$((fail + 1)); failed_names+=("$1"); printf 'FAIL %s\n' "$1"
    [ -f "$2" ] && sed 's/^/    | /' "$2" | grep -v '^    | PASS' | tail -25
}

# run NAME LOG CMD...: pass when CMD exits 0 within its time limit.
run() {
    local name=$1 log=$2; shift 2
    if timeout 300 "$@" >"$log" 2>&1; then note_pass "$name"; else note_fail "$name (exit $?)" "$log"; fi
}

echo "== unit tests"
for t in "$BUILD"/tests/unit/test_*; do
    [ -x "$t" ] || continue
    n=$(basename "$t")
    run "unit/$n" "$LOGDIR/unit-$n.log" env LD_LIBRARY_PATH="$FAKE" "$t"
done

echo "== checking fake driver self-tests"
for t in "$BUILD"/tests/fake/test_fake_*; do
    [ -x "$t" ] || continue
    n=$(basename "$t")
    run "fake/$n" "$LOGDIR/fake-$n.log" env LD_LIBRARY_PATH="$FAKE" FAKECUDA_ASYNC_DELAY_US=200 "$t"
done

# The variants every shim program runs in: none (no shim), then the shim in each mode, then
# small budgets and thresholds so that eviction, the cache, rewrites and staging all happen.
VARIANTS=(
    "plain|"
    "off|PINSHIM_MODE=off"
    "observe|PINSHIM_MODE=observe"
    "pin|PINSHIM_MODE=pin"
    "full|PINSHIM_MODE=full"
    "full-small|PINSHIM_MODE=full PINSHIM_MIN_SIZE=4K PINSHIM_REWRITE_MIN=4K PINSHIM_REWRITE_ALWAYS=1 PINSHIM_STAGING_MIN=64K PINSHIM_STAGING_CHUNK=64K PINSHIM_BUDGET=8M"
    "pin-tiny-budget|PINSHIM_MODE=pin PINSHIM_BUDGET=1M"
    "full-trust|PINSHIM_MODE=full PINSHIM_TRUST_ASYNC=1"
)

# check_counts LOG JSON MODE: the shim counted exactly the copies the program says it issued
# (EXPECTED_COPIES, observe mode: other modes may split or stage a copy), the calls of each
# entry point (EXPECTED_ENTRIES, every mode: the doors count what the program called), and what
# the registry tracks at exit (EXPECTED_TRACKING, every mode: keys of the "tracking" object),
# whether large memcpy calls were shared (EXPECTED_BOUNCE shared=0|1: the stats' bounce count),
# and large memset calls (EXPECTED_BOUNCE_SETS shared=0|1: bounce.sets),
# the program's own pinning calls (EXPECTED_PINNING, every mode but off, whose doors call no
# handler: keys of the "program_pinning" object, each kind of call made also timed),
# the stacks walked for call sites (EXPECTED_WALKS max=N: call_site_walks at most N),
# the never-touched destinations staging faulted in ahead of its copies (EXPECTED_PREFAULT bytes=N:
# never more than N; all N where every D2H copy was staged),
# and the call sites (EXPECTED_SITE exact|sampled size=S copies=N bytes=B, every mode: the site
# whose copies are of size S; exact: those numbers, not marked sampled; sampled: marked, count
# and bytes within a third of the truth), the copies staged (EXPECTED_STAGED copies=N: all N, or
# those not staged each after waiting the 100 ms the shim waits for its staging buffers), the
# blocks registered on an H2D copy's path whose lines that copy flushed (EXPECTED_FLUSHED
# min=N: at least N bytes); and, for every program, that staging flushed no more bytes than it
# staged and no more bytes of fresh registrations were flushed than registered.
check_counts() {
    python3 - "$1" "$2" "$3" <<'PY'
import json, re, sys
log, path, mode = sys.argv[1:4]
want = {}
for line in open(log, errors="replace"):
    m = re.match(r"EXPECTED_(COPIES|ENTRIES|TRACKING|PINNING) (.*)", line)
    if m:
        want[m.group(1)] = {k: int(v) for k, v in (kv.split("=") for kv in m.group(2).split())}
    m = re.match(r"EXPECTED_WALKS max=([0-9]+)", line)
    if m:
        want["WALKS"] = int(m.group(1))
    m = re.match(r"EXPECTED_STAGED copies=([0-9]+)", line)
    if m:
        want["STAGED"] = int(m.group(1))
    m = re.match(r"EXPECTED_PREFAULT bytes=([0-9]+)", line)
    if m:
        want["PREFAULT"] = int(m.group(1))
    m = re.match(r"EXPECTED_FLUSHED min=([0-9]+)", line)
    if m:
        want["FLUSHED"] = int(m.group(1))
    m = re.match(r"EXPECTED_BOUNCE shared=([01])", line)
    if m:
        want["BOUNCE"] = int(m.group(1))
    m = re.match(r"EXPECTED_BOUNCE_SETS shared=([01])", line)
    if m:
        want["BOUNCE_SETS"] = int(m.group(1))
    m = re.match(r"EXPECTED_SITE (exact|sampled) (.*)", line)
    if m:
        site = {k: int(v) for k, v in (kv.split("=") for kv in m.group(2).split())}
        site["how"] = m.group(1)
        want.setdefault("SITES", []).append(site)
stats = json.load(open(path))
bad = []
if mode == "observe":
    got = stats["copies"]
    bad += [f"{k}: expected {v}, counted {got[k]['count']}"
            for k, v in want.get("COPIES", {}).items() if got[k]["count"] != v]
got = stats.get("entry_points", {})
bad += [f"entry point {k}: called {v} times, counted {got.get(k, 0)}"
        for k, v in want.get("ENTRIES", {}).items() if got.get(k, 0) != v]
got = stats.get("tracking", {})
bad += [f"tracking {k}: expected {v}, reported {got.get(k)}"
        for k, v in want.get("TRACKING", {}).items() if got.get(k) != v]
if "PINNING" in want and mode != "off":
    got = stats.get("program_pinning", {})
    bad += [f"program_pinning {k}: expected {v}, reported {got.get(k)}"
            for k, v in want["PINNING"].items() if got.get(k) != v]
    for calls, secs in (("host_allocs", "host_alloc_seconds"), ("host_frees", "host_free_seconds"),
                        ("registers", "register_seconds"), ("unregisters", "unregister_seconds")):
        if want["PINNING"].get(calls) and not got.get(secs, 0) > 0:
            bad.append(f"program_pinning {secs}: {got.get(secs)} for {got.get(calls)} calls")
if "BOUNCE" in want and (stats["bounce"]["count"] > 0) != bool(want["BOUNCE"]):
    bad.append(f"bounce copies: {stats['bounce']['count']} shared, expected "
               + ("some" if want["BOUNCE"] else "none (every call to the C library)"))
if "BOUNCE_SETS" in want and (stats["bounce"]["sets"] > 0) != bool(want["BOUNCE_SETS"]):
    bad.append(f"memset calls: {stats['bounce']['sets']} shared, expected "
               + ("some" if want["BOUNCE_SETS"] else "none (every call to the C library)"))
staging = stats.get("staging", {})
if "STAGED" in want:
    # Every copy staged, save those made while the buffers took longer than the wait's bound to
    # build (a loaded machine): each of those waited the whole bound first.
    late = stats["memory"]["pageable"]
    if staging.get("count", 0) + late["count"] != want["STAGED"] or late["seconds"] < 0.1 * late["count"]:
        bad.append(f"staged {staging.get('count', 0)} copies of {want['STAGED']}; {late['count']} took the "
                   f"driver's path after {late['seconds']:.3f} s in all (each must wait 0.1 s for the buffers)")
if "PREFAULT" in want:
    got = staging.get("prefaulted_bytes", 0)
    staged_all = stats["memory"]["staged"]["count"] == stats["copies"]["d2h"]["count"]
    if got > want["PREFAULT"] or (staged_all and got != want["PREFAULT"]):
        bad.append(f"prefaulted {got} bytes; the fresh contiguous destinations hold {want['PREFAULT']}"
                   + (" and every D2H copy was staged" if staged_all else ""))
if staging.get("flushed_bytes", 0) > staging.get("bytes", 0):
    bad.append(f"staging flushed {staging.get('flushed_bytes')} bytes, more than it staged ({staging.get('bytes')})")
promotions = stats.get("promotions", {})
if "FLUSHED" in want and mode != "off" and promotions.get("flushed_bytes", 0) < want["FLUSHED"]:
    bad.append(f"flushed {promotions.get('flushed_bytes', 0)} bytes of blocks registered on an H2D copy's path; "
               f"at least {want['FLUSHED']} were")
if promotions.get("flushed_bytes", 0) > promotions.get("bytes", 0):
    bad.append(f"flushed {promotions.get('flushed_bytes')} bytes of freshly registered blocks, more than were "
               f"registered ({promotions.get('bytes')})")
if "WALKS" in want and stats.get("call_site_walks", 0) > want["WALKS"]:
    bad.append(f"{stats.get('call_site_walks')} stacks walked, expected at most {want['WALKS']} "
               "(a chain already walked is found in the thread's memo)")
sites = [c for c in stats.get("call_sites", []) if c["count"]]
for w in want.get("SITES", []):
    near = [c for c in sites if abs(c["bytes"] / c["count"] - w["size"]) <= 0.1 * w["size"]]
    if len(near) != 1:
        bad.append(f"call site of {w['size']}-byte copies: {len(near)} sites found")
        continue
    c = near[0]
    if w["how"] == "exact":
        if (c["count"], c["bytes"], c["sampled"]) != (w["copies"], w["bytes"], False):
            bad.append(f"call site of {w['size']}-byte copies: {c['count']} copies, {c['bytes']} bytes, "
                       f"sampled={c['sampled']}; made {w['copies']} copies, {w['bytes']} bytes, exact")
    elif not (c["sampled"] and abs(c["count"] - w["copies"]) <= w["copies"] / 3
              and abs(c["bytes"] - w["bytes"]) <= w["bytes"] / 3):
        bad.append(f"call site of {w['size']}-byte copies: {c['count']} copies, {c['bytes']} bytes, "
                   f"sampled={c['sampled']}; made {w['copies']} copies, {w['bytes']} bytes (an estimate within a third)")
if bad:
    print("counts differ: " + "; ".join(bad))
    sys.exit(1)
PY
}

# in_variants PROGRAM: the program without the shim and under it in every variant.
in_variants() {
    local t=$1 n v vname venv log json envs
    n=$(basename "$t")
    for v in "${VARIANTS[@]}"; do
        vname=${v%%|*}; venv=${v#*|}
        log="$LOGDIR/$n-$vname.log"; json="$LOGDIR/$n-$vname.json"
        envs=(LD_LIBRARY_PATH="$FAKE" FAKECUDA_ASYNC_DELAY_US=300)
        if [ "$vname" != plain ]; then
            envs+=(LD_PRELOAD="$SHIM" PINSHIM_STATS="$json")
            # shellcheck disable=SC2206
            envs+=($venv)
        fi
        if ! timeout 300 env "${envs[@]}" "$t" >"$log" 2>"$log.err"; then
            cat "$log.err" >>"$log"; note_fail "$n [$vname]" "$log"; continue
        fi
        # Rule 9: nothing from the shim on the program's output unless asked.
        if grep -q 'pinshim' "$log.err"; then
            cat "$log.err" >>"$log"; note_fail "$n [$vname]: the shim wrote to stderr unasked" "$log"; continue
        fi
        if [ "$vname" != plain ] && [ "$vname" != off ]; then
            if ! python3 -c 'import json,sys; json.load(open(sys.argv[1]))' "$json" 2>>"$log"; then
                note_fail "$n [$vname]: stats JSON missing or invalid" "$log"; continue
            fi
            if ! check_counts "$log" "$json" "$vname" >>"$log" 2>&1; then note_fail "$n [$vname]: counts" "$log"; continue; fi
        fi
        note_pass "$n [$vname]"
    done
}

echo "== programs on the checking fake driver, without and with the shim"
for t in "$BUILD"/tests/fake/test_*; do
    [ -x "$t" ] || continue
    case $(basename "$t") in test_fake_*) continue ;; esac
    in_variants "$t"
done

# Hostile but legal programs (tests/fake/hostile_*.c): each behaves the same without the shim and
# under it in every variant.
echo "== hostile programs on the checking fake driver, without and with the shim"
for t in "$BUILD"/tests/fake/hostile_*; do
    [ -x "$t" ] || continue
    in_variants "$t"
done

echo "== randomized differential stress"
run "stress (3 seeds)" "$LOGDIR/stress.log" tests/run_stress.sh "$BUILD" 3

echo "== scripted checks"
for s in tests/check_*.sh; do
    [ -x "$s" ] || continue
    n=$(basename "$s" .sh)
    run "$n" "$LOGDIR/$n.log" "$s" "$BUILD"
done

echo "== CPU microbenchmark (figures only, nothing asserted)"
if [ -x bench/run_malloc_bench.sh ]; then
    HEAP_REPS=1 bench/run_malloc_bench.sh "$BUILD" 2>&1 | sed 's/^/    /' || true
fi

echo "== GPU suite"
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
    run "gpu suite" "$LOGDIR/gpu.log" tests/gpu/run_gpu_tests.sh "$BUILD" "${GPU_OUT:-$LOGDIR/gpu}"
    grep -E '^(PASS|FAIL|SKIP)' "$LOGDIR/gpu.log" | sed 's/^/    /'
else
    skip=$((skip + 1))
    echo "SKIP gpu suite: no GPU here (nvidia-smi finds none); it runs on a machine with one"
fi

echo
if [ "$fail" -gt 0 ]; then
    printf 'failed: %s\n' "${failed_names[@]}"
fi
echo "$pass passed, $fail failed, $skip skipped"
[ "$fail" -eq 0 ]
