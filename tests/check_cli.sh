#!/usr/bin/env bash
# tests/check_cli.sh BUILD: the command lines behave like their neighbours', on the checking
# fake driver.
#   pinshim: --version; an option without its value (--stats -- CMD) is a usage error, not a
#     file named "--"; settings it sets are checked by the library's parser before anything
#     runs (--budget banana, --mode fast, --set PINSHIM_BUGDET=1G); a library path with a space
#     or a colon still loads; one that cannot be preloaded stops it (127) before the command
#     runs; --stats that nothing wrote after a successful command is an error (1); the
#     command's own failure and death by a signal come back unchanged; a relative --stats path
#     is where pinshim started, whatever directory the command moves to;
#   pinshim-ab: one help text, usage errors exit 2, --keep refuses a directory used before,
#     --json has one naming (A, B) and whole-number counts equal to one run's, sampled call
#     sites are marked ~, the plot's legend names what each side ran;
#   pinshim-merge: one help text, the same file or content twice counted once with a warning,
#     two files of one rank warned about, sampled sites marked ~ and kept so when merged;
#   make help lists the targets.
set -u
BUILD=${1:-build}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT" || exit 1
case $BUILD in /*) ;; *) BUILD=$ROOT/$BUILD ;; esac
SHIM=$BUILD/libpinshim.so
DOORS=$BUILD/tests/fake/test_doors
LOOP=$BUILD/bench/drv_train_loop
# A run long enough that its later copies' call sites are sampled estimates (each thread's first
# 256 copies of 1 MiB and more are attributed exactly): 1 MiB batches and results, 400 steps.
LONG_ARGS=(--steps 400 --batch 1M --result 1M)
WRAP=$ROOT/scripts/pinshim
AB=$ROOT/scripts/pinshim-ab
MERGE=$ROOT/scripts/pinshim-merge
for f in "$SHIM" "$BUILD/pinshim-settings" "$DOORS" "$LOOP"; do
    [ -e "$f" ] || { echo "FAIL missing $f (build first)"; exit 1; }
done
WORK=$(mktemp -d /tmp/pinshim-cli.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
pass=0 fail=0
ok() { pass=$((pass + 1)); printf 'PASS %s\n' "$1"; }
bad() { fail=$((fail + 1)); printf 'FAIL %s\n' "$1"; [ -n "${2:-}" ] && printf '%s\n' "$2" | tail -15 | sed 's/^/    | /'; return 0; }
export LD_LIBRARY_PATH=$BUILD/fakecuda PINSHIM_LIB=$SHIM
unset LD_PRELOAD PINSHIM_CHECKED
for v in $(env | sed -n 's/^\(PINSHIM_[A-Z0-9_]*\)=.*/\1/p'); do [ "$v" = PINSHIM_LIB ] || unset "$v"; done
MARK=$WORK/ran
# runs DESC WANT_RC CMD...: CMD exits WANT_RC; its stderr is in $WORK/err, stdout in $WORK/out.
runs() {
    local desc=$1 want=$2 rc; shift 2
    rm -f "$MARK"
    "$@" >"$WORK/out" 2>"$WORK/err"; rc=$?
    if [ "$rc" = "$want" ]; then return 0; fi
    bad "$desc: exit $rc, expected $want" "$(cat "$WORK/out" "$WORK/err")"
    return 1
}

echo "== versions"
want=$(scripts/version.sh)
for p in "$WRAP" "$AB" "$MERGE" "$BUILD/pinshim-settings"; do
    n=$(basename "$p")
    v=$("$p" --version 2>&1)
    [ "$v" = "$n $want" ] && ok "$n --version: $v" || bad "$n --version: '$v', expected '$n $want'"
done

echo "== pinshim: options and their values"
for opt in --stats --budget --mode --log --set --lib --report=; do
    o=${opt%=}
    args=("$o" -- sh -c ": >'$MARK'")
    [ "$opt" = --report= ] && args=(--report= --stats -- sh -c ": >'$MARK'")
    (cd "$WORK" && runs "pinshim ${args[*]:0:2}" 2 "$WRAP" "${args[@]}") &&
        { [ ! -e "$MARK" ] && [ ! -e "$WORK/--" ] && grep -q "needs a value" "$WORK/err" &&
          ok "pinshim ${args[*]:0:2} -- CMD: a missing value, exit 2, nothing run, no file '--'" ||
          bad "pinshim ${args[*]:0:2} -- CMD" "$(cat "$WORK/err"; ls "$WORK")"; }
done
for bad_opt in "--budget banana|PINSHIM_BUDGET=\"banana\" is not valid (expected a size or percentage" \
               "--mode fast|PINSHIM_MODE=\"fast\" is not valid (expected one of off, observe, pin, full)" \
               "--log 7|PINSHIM_LOG=\"7\" is not valid" \
               "--set PINSHIM_BUGDET=1G|PINSHIM_BUGDET is not a pinshim setting (did you mean PINSHIM_BUDGET?)" \
               "--set PINSHIM_STAGING_CHUNK=1K|PINSHIM_STAGING_CHUNK=\"1K\" is not valid"; do
    read -r -a o <<<"${bad_opt%%|*}"
    msg=${bad_opt#*|}
    runs "pinshim ${o[*]}" 2 "$WRAP" "${o[@]}" -- sh -c ": >'$MARK'" &&
        { [ ! -e "$MARK" ] && grep -qF "pinshim: ${o[*]}: $msg" "$WORK/err" &&
          ok "pinshim ${o[*]}: refused before running anything, with the library's reason" ||
          bad "pinshim ${o[*]}" "$(cat "$WORK/err")"; }
done
runs "pinshim --budget=8G --log=1 --mode=observe" 0 "$WRAP" --budget=8G --log=1 --mode=observe -- \
    sh -c 'printf "%s %s %s" "$PINSHIM_BUDGET" "$PINSHIM_LOG" "$PINSHIM_MODE"' &&
    { [ "$(cat "$WORK/out")" = "8G 1 observe" ] && ok "pinshim --opt=VALUE forms set the settings" ||
      bad "pinshim --opt=VALUE: the command saw '$(cat "$WORK/out")'"; }

echo "== pinshim: the library really loads"
odd="$WORK/a dir:with colon"
mkdir -p "$odd" "$WORK/s1"
cp "$SHIM" "$BUILD/pinshim-settings" "$odd/"
runs "pinshim --lib 'path with space and colon'" 0 "$WRAP" --lib "$odd/libpinshim.so" --mode observe \
    --stats "$WORK/s1/s.%p.json" -- "$DOORS" &&
    { [ "$(ls "$WORK/s1" | wc -l)" = 1 ] && ok "pinshim --lib PATH with a space and a colon: loaded, stats written" ||
      bad "pinshim --lib with a space: no stats" "$(cat "$WORK/err"; ls "$WORK/s1")"; }
printf 'not a library\n' >"$WORK/libbroken.so"
cp "$BUILD/pinshim-settings" "$WORK/"
runs "pinshim --lib BROKEN" 127 "$WRAP" --lib "$WORK/libbroken.so" -- sh -c ": >'$MARK'" &&
    { [ ! -e "$MARK" ] && grep -q "could not be preloaded" "$WORK/err" &&
      ok "pinshim --lib a file that cannot be preloaded: 127, nothing run" || bad "pinshim --lib BROKEN" "$(cat "$WORK/err")"; }
mkdir -p "$WORK/s2"
runs "pinshim --stats, a command that never reaches the driver" 1 "$WRAP" --stats "$WORK/s2/s.%p.json" -- true &&
    { grep -q "nothing was written" "$WORK/err" && ok "pinshim --stats -- true: no stats written is said, exit 1" ||
      bad "pinshim --stats -- true" "$(cat "$WORK/err")"; }
runs "pinshim --stats, a failing command" 7 "$WRAP" --stats "$WORK/s2/s.%p.json" -- sh -c 'exit 7' &&
    ok "pinshim --stats -- sh -c 'exit 7': exit 7"
# In a subshell of its own, which says "Terminated" into /dev/null and exits with the status.
( "$WRAP" --stats "$WORK/s2/s.%p.json" -- sh -c 'kill -TERM $$'; rc=$?; exit $rc ) >/dev/null 2>&1; rc=$?
[ $rc = 143 ] && ok "pinshim --stats -- a command killed by SIGTERM: pinshim dies of SIGTERM too" ||
    bad "pinshim --stats -- killed by SIGTERM: exit $rc, expected 143"
runs "pinshim --stats missing directory" 2 "$WRAP" --stats "$WORK/no/such/dir/s.json" -- sh -c ": >'$MARK'" &&
    { [ ! -e "$MARK" ] && ok "pinshim --stats into a missing directory: refused before running" || bad "missing stats directory: the command ran"; }
mkdir -p "$WORK/rel/sub"
(cd "$WORK/rel" && runs "pinshim --stats relative" 0 "$WRAP" --mode observe --stats rel.json -- \
    sh -c "cd sub && exec '$DOORS'") &&
    { [ -f "$WORK/rel/rel.json" ] && [ ! -e "$WORK/rel/sub/rel.json" ] &&
      ok "pinshim --stats rel.json: written where pinshim started, though the command changed directory" ||
      bad "pinshim --stats relative path" "$(ls -R "$WORK/rel")"; }

echo "== pinshim-ab"
for p in "$AB" "$MERGE"; do
    n=$(basename "$p")
    h=$("$p" --help 2>&1); rc=$?
    if [ $rc = 0 ] && [ "$(grep -c '^usage:' <<<"$h")" = 1 ] && ! grep -qE '^(options|optional arguments|positional arguments):' <<<"$h"; then
        ok "$n --help: one help text, exit 0"
    else
        bad "$n --help: exit $rc, $(grep -c '^usage:' <<<"$h") usage blocks" "$h"
    fi
done
for args in "--no-such-option -- true" "--a-env NOEQUALS -- true" "--b-env PINSHIM_BUDGET=banana -- true" "-n 0 -- true" "-n"; do
    # shellcheck disable=SC2086
    runs "pinshim-ab $args" 2 "$AB" $args && ok "pinshim-ab $args: usage error, exit 2"
done
runs "pinshim-ab --b-env PINSHIM_BUDGET=banana" 2 "$AB" --b-env PINSHIM_BUDGET=banana -- true &&
    { grep -qF 'PINSHIM_BUDGET="banana" is not valid' "$WORK/err" && ok "pinshim-ab --b-env: checked with the library's parser" ||
      bad "pinshim-ab --b-env banana" "$(cat "$WORK/err")"; }

keep=$WORK/keep
# One run of the loop alone, for the per-run figures the A/B table must repeat.
mkdir -p "$WORK/one"
env PINSHIM_MODE=full PINSHIM_STATS="$WORK/one/s.json" LD_PRELOAD="$SHIM" "$LOOP" "${LONG_ARGS[@]}" >/dev/null 2>&1
mkdir -p "$WORK/fakebin"
cat >"$WORK/fakebin/gnuplot" <<EOF
#!/bin/sh
cp "\$1" "$WORK/plot.gp"
EOF
chmod +x "$WORK/fakebin/gnuplot"
if env PATH="$WORK/fakebin:$PATH" "$AB" -n 2 --warmup 0 -q --json --keep "$keep" --plot "$WORK/ab.png" -- "$LOOP" "${LONG_ARGS[@]}" >"$WORK/ab.json" 2>"$WORK/ab.err"; then
    ok "pinshim-ab -n 2 --json --keep NEW --plot: exit 0"
else
    bad "pinshim-ab --json" "$(cat "$WORK/ab.err")"
fi
python3 - "$WORK/ab.json" "$WORK/one/s.json" >"$WORK/abcheck.out" 2>&1 <<'PY'
import json, sys
res, one = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
out = []
say = lambda good, text: out.append(("PASS " if good else "FAIL ") + text)
say(not {"a", "b"} & set(res) and {"A", "B"} <= set(res), f"pinshim-ab --json: one naming, A and B ({sorted(res)})")
say(res["A"]["setup"].startswith("pinshim, mode observe") and res["B"]["setup"].startswith("pinshim, mode full"),
    f"pinshim-ab --json: setups named ({res['A']['setup']!r}, {res['B']['setup']!r})")
def ints(x, path=""):
    bad = []
    if isinstance(x, dict):
        for k, v in x.items():
            p = f"{path}.{k}"
            counted = k in ("count", "bytes") or (k.endswith("_per_run") and "seconds" not in k)
            if counted and not isinstance(v, (dict, list)):
                if not isinstance(v, int):
                    bad.append(p)
            bad += ints(v, p)
    elif isinstance(x, list):
        for i, v in enumerate(x):
            bad += ints(v, f"{path}[{i}]")
    return bad
notint = ints(res)
say(not notint, f"pinshim-ab --json: counts and bytes are whole numbers ({notint[:4]})")
b = res["B"]["stats"]["per_run"]
say(all(b[d]["count"] == one["copies"][d]["count"] and b[d]["bytes"] == one["copies"][d]["bytes"] for d in ("h2d", "d2h")),
    f"pinshim-ab: per-run copies equal one run's (h2d {b['h2d']['count']} = {one['copies']['h2d']['count']})")
sampled = [c for c in res["B"]["stats"]["call_sites"] if c["sampled"]]
say(bool(sampled), f"pinshim-ab --json: call sites say whether they are sampled ({len(sampled)} sampled)")
print("\n".join(out))
PY
while IFS= read -r line; do
    case $line in PASS*) ok "${line#PASS }" ;; FAIL*) bad "${line#FAIL }" ;; *) echo "    $line" ;; esac
done <"$WORK/abcheck.out"
if grep -q 'title "A: pinshim, mode observe' "$WORK/plot.gp" 2>/dev/null && grep -q 'title "B: pinshim, mode full' "$WORK/plot.gp"; then
    ok "pinshim-ab --plot: the legend names what each side ran"
else
    bad "pinshim-ab --plot legend" "$(grep -o 'title "[^"]*"' "$WORK/plot.gp" 2>&1)"
fi
runs "pinshim-ab --keep a used directory" 2 "$AB" -n 1 --warmup 0 -q --keep "$keep" -- "$LOOP" &&
    { grep -q "not an empty directory" "$WORK/err" && ok "pinshim-ab --keep DIR used before: refused, exit 2" ||
      bad "pinshim-ab --keep used" "$(cat "$WORK/err")"; }
if "$AB" -n 1 --warmup 0 -q -- "$LOOP" "${LONG_ARGS[@]}" >"$WORK/ab.txt" 2>&1 && grep -qE '^drv_train_loop\+0x[0-9a-f]+ +~[0-9]+ ' "$WORK/ab.txt"; then
    ok "pinshim-ab: a sampled call site's count is marked ~"
else
    bad "pinshim-ab: no ~ on a sampled call site" "$(cat "$WORK/ab.txt")"
fi

echo "== pinshim-merge"
s=$WORK/one/s.json
runs "pinshim-merge F F" 0 "$MERGE" --json "$s" "$WORK/one/../one/s.json" &&
    { grep -q "counted once" "$WORK/err" && [ "$(python3 -c 'import json,sys; print(json.load(sys.stdin)["processes"])' <"$WORK/out")" = 1 ] &&
      ok "pinshim-merge F F: warned, counted once" || bad "pinshim-merge F F" "$(cat "$WORK/err")"; }
cp "$s" "$WORK/copy.json"
runs "pinshim-merge F COPY" 0 "$MERGE" --json "$s" "$WORK/copy.json" &&
    { grep -q "same content" "$WORK/err" && ok "pinshim-merge F COPY-OF-F: warned, counted once" || bad "pinshim-merge F COPY" "$(cat "$WORK/err")"; }
mkdir -p "$WORK/ranks"
python3 - "$s" "$WORK/ranks" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for pid, extra in ((101, 0), (202, 1)):
    d["pid"] = pid
    d["copies"]["h2d"]["count"] += extra
    json.dump(d, open(f"{sys.argv[2]}/stats.3.{pid}.json", "w"))
PY
runs "pinshim-merge two files of rank 3" 0 "$MERGE" --json "$WORK/ranks" &&
    { grep -q "rank 3 appears in 2 files" "$WORK/err" && [ "$(python3 -c 'import json,sys; print(json.load(sys.stdin)["processes"])' <"$WORK/out")" = 2 ] &&
      ok "pinshim-merge: two files claiming rank 3 warned about, both counted" || bad "pinshim-merge same rank" "$(cat "$WORK/err")"; }
python3 - "$s" "$WORK/unsampled.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
d["pid"] += 1
for c in d["call_sites"]:
    c["sampled"] = False
json.dump(d, open(sys.argv[2], "w"))
PY
runs "pinshim-merge sampled + unsampled" 0 "$MERGE" --json "$s" "$WORK/unsampled.json" &&
    { python3 - "$s" "$WORK/out" <<'PY' && ok "pinshim-merge: a site sampled in any part stays sampled" || bad "pinshim-merge sampled flags" "$(cat "$WORK/out" | head -40)"
import json, sys
want = {c["site"] for c in json.load(open(sys.argv[1]))["call_sites"] if c.get("sampled")}
got = {c["site"] for c in json.load(open(sys.argv[2]))["totals"]["call_sites"] if c.get("sampled")}
sys.exit(0 if want and want == got else 1)
PY
    }
runs "pinshim-merge text" 0 "$MERGE" "$s" "$WORK/unsampled.json" &&
    { grep -qE '^drv_train_loop\+0x[0-9a-f]+ +~[0-9]+ ' "$WORK/out" && ok "pinshim-merge: sampled sites marked ~ in the text report" ||
      bad "pinshim-merge: no ~" "$(cat "$WORK/out")"; }
runs "pinshim-merge no argument" 2 "$MERGE" && ok "pinshim-merge without a file: usage error, exit 2"

echo "== make help"
h=$(env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make --no-print-directory -s help 2>&1)
missing=""
for t in all deps demo test stress asan ubsan tsan valgrind check-docs bench install deb clean; do
    grep -qE "^  ([a-z-]+ )*$t( |$)" <<<"$h" || missing="$missing $t"
done
[ -z "$missing" ] && ok "make help lists every target" || bad "make help lacks:$missing" "$h"

echo "cli: $pass passed, $fail failed"
[ $fail = 0 ]
