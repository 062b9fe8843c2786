#!/usr/bin/env bash
# tests/check_trace.sh BUILD: the event trace (PINSHIM_TRACE) on the checking fake driver.
#   - every line has the documented shape: end time, duration, pid, tid, event, key=value fields;
#   - the program's own pinning calls each have their line (test_many_program_pins: 5,000
#     registrations and unregistrations, 6 host allocations and frees);
#   - the copies of 1 MiB and more, and the memcpy/memmove calls the copy threads shared, have a
#     line each, as many as the statistics count (drv_host_copies, fresh and bounce modes); each
#     copy line says why its path, in one of the words the README lists, the cost model's among
#     them; each staged copy has a `staged` line, and their bytes, pieces and CPU time add up to
#     the statistics' staging figures;
#   - a program that closes every descriptor it did not open and reuses the numbers for files of
#     its own gets no line in them (hostile_close_fds checks its files);
#   - a path through a symbolic link writes into its target and leaves the link; a path that
#     cannot be opened warns once and the program runs as without it; mode off writes nothing.
set -u
BUILD=${1:-build}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT" || exit 1
case $BUILD in /*) ;; *) BUILD=$ROOT/$BUILD ;; esac
PINS=$BUILD/tests/fake/test_many_program_pins
COPIES=$BUILD/bench/drv_host_copies
CLOSER=$BUILD/tests/fake/hostile_close_fds
for p in "$PINS" "$COPIES" "$CLOSER"; do
    [ -x "$p" ] || { echo "FAIL missing $p (build first)"; exit 1; }
done
WORK=$(mktemp -d /tmp/pinshim-trace.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
pass=0 fail=0
ok() { pass=$((pass + 1)); echo "PASS $*"; }
bad() { fail=$((fail + 1)); echo "FAIL $*"; }
shim() { env LD_LIBRARY_PATH="$BUILD/fakecuda" LD_PRELOAD="$BUILD/libpinshim.so" "$@"; }

# check TRACE STATS WANT...: python checks; WANT is event=count (exact) or "copies"/"bounce"
# (as many as the statistics count).
check() {
    python3 - "$@" <<'PY'
import json, re, sys
trace, stats_path, *want = sys.argv[1:]
readme = open("README.md").read()
shape = re.compile(r"^\d+\.\d{6} \d+\.\d{3} \d+ \d+ [a-z_]+( [a-z_]+=\S+)*$")
lines = open(trace).read().splitlines()
bad = [l for l in lines if not shape.match(l)]
if bad:
    sys.exit(f"{len(bad)} of {len(lines)} lines not of the documented shape, e.g. {bad[0]!r}")
events = {}
for l in lines:
    f = l.split()
    events.setdefault(f[4], []).append(dict(kv.split("=", 1) for kv in f[5:]))
stats = json.load(open(stats_path)) if stats_path != "-" else {}
problems = []
for w in want:
    if w == "copies":
        n = sum(h["count"] for h in stats["histogram"] if h["min_bytes"] >= 1 << 20)
        got = len(events.get("copy", []))
        if n == 0 or got != n:
            problems.append(f"{got} copy lines, the statistics count {n} copies of 1 MiB and more")
        # Each says why its path, in the words the README lists.
        words = set(re.findall(r"`([a-z_]+)`", readme.split("why that path:", 1)[1].split("), large", 1)[0]))
        unknown = sorted({e.get("why", "(none)") for e in events.get("copy", [])} - words)
        if unknown:
            problems.append(f"copy lines whose why is not one the README lists: {unknown}")
        whys = {e.get("why") for e in events.get("copy", [])}
        if not whys & {"gain", "reused", "one_shot"}:
            problems.append(f"no copy line gives the cost model's reason (whys: {sorted(whys)})")
    elif w == "staged":
        # A line per staged copy, which adds up to the statistics' staging figures.
        st, lines_ = stats["staging"], events.get("staged", [])
        fields = ("dir", "bytes", "pieces", "first_us", "cpu_us", "dma_wait_us", "order_wait_us")
        if st["count"] == 0 or len(lines_) != st["count"]:
            problems.append(f"{len(lines_)} staged lines, the statistics count {st['count']} staged copies")
        elif any(set(e) != set(fields) for e in lines_):
            problems.append(f"a staged line without the fields {fields}: {lines_[0]}")
        else:
            for key, total in (("bytes", st["bytes"]), ("pieces", st["pieces"])):
                got = sum(int(e[key]) for e in lines_)
                if got != total:
                    problems.append(f"staged lines' {key} add up to {got}, the statistics say {total}")
            cpu_us = sum(int(e["cpu_us"]) for e in lines_)
            if abs(cpu_us - st["cpu_seconds"] * 1e6) > len(lines_) + 1:
                problems.append(f"staged lines' cpu_us add up to {cpu_us}, the statistics say {st['cpu_seconds']} s")
    elif w == "bounce":
        n = stats["bounce"]["count"]
        got = sum(1 for k in ("memcpy", "memmove") for e in events.get(k, []) if e.get("shared") == "1")
        if n == 0 or got != n:
            problems.append(f"{got} shared memcpy/memmove lines, the statistics count {n}")
    else:
        k, n = w.split("=")
        if len(events.get(k, [])) != int(n):
            problems.append(f"{len(events.get(k, []))} {k} lines, expected {n}")
if problems:
    sys.exit("; ".join(problems))
print(f"{len(lines)} lines")
PY
}

if shim PINSHIM_TRACE="$WORK/pins.trace" "$PINS" >"$WORK/pins.out" 2>&1 &&
   r=$(check "$WORK/pins.trace" - program_register=5000 program_unregister=5000 program_host_alloc=6 \
       program_host_free=6 2>&1); then
    ok "the program's own pinning calls, a line each ($r)"
else
    bad "the program's own pinning calls: ${r:-the program failed}"; tail -3 "$WORK/pins.out" | sed 's/^/    | /'
fi

for mode in fresh bounce; do
    if shim PINSHIM_TRACE="$WORK/$mode.trace" PINSHIM_STATS="$WORK/$mode.json" "$COPIES" --mode $mode --quick \
            >"$WORK/$mode.out" 2>&1 &&
       r=$(check "$WORK/$mode.trace" "$WORK/$mode.json" $([ $mode = fresh ] && echo copies staged || echo bounce) 2>&1); then
        ok "drv_host_copies --mode $mode: a line per $([ $mode = fresh ] && echo "copy of 1 MiB and more, and per staged copy" || echo "shared memcpy") ($r)"
    else
        bad "drv_host_copies --mode $mode: ${r:-the program failed}"; tail -3 "$WORK/$mode.out" | sed 's/^/    | /'
    fi
done

if shim PINSHIM_TRACE="$WORK/closer.trace" "$CLOSER" >"$WORK/closer.out" 2>&1; then
    ok "a program that reuses every descriptor number gets no trace line in its files"
else
    bad "a program that reuses every descriptor number"; grep FAIL "$WORK/closer.out" | head -3 | sed 's/^/    | /'
fi

: >"$WORK/target"
ln -s "$WORK/target" "$WORK/link"
if shim PINSHIM_TRACE="$WORK/link" "$PINS" >/dev/null 2>&1 && [ -L "$WORK/link" ] &&
   grep -q ' program_host_alloc ' "$WORK/target"; then
    ok "a trace path through a symbolic link writes into its target, the link stays"
else
    bad "a trace path through a symbolic link"
fi

if shim PINSHIM_TRACE="$WORK/no/such/dir/t" "$PINS" >"$WORK/nodir.out" 2>"$WORK/nodir.err" &&
   [ "$(grep -c 'PINSHIM_TRACE' "$WORK/nodir.err")" = 1 ] && [ ! -e "$WORK/no" ]; then
    ok "a trace path that cannot be opened: one warning, the program runs"
else
    bad "a trace path that cannot be opened"; sed 's/^/    | /' "$WORK/nodir.err" | tail -3
fi

if shim PINSHIM_MODE=off PINSHIM_TRACE="$WORK/off.trace" "$PINS" >/dev/null 2>&1 && [ ! -e "$WORK/off.trace" ]; then
    ok "mode off writes no trace"
else
    bad "mode off wrote a trace, or the program failed"
fi
echo "trace: $pass passed, $fail failed"
[ $fail -eq 0 ]
