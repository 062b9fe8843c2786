#!/usr/bin/env bash
# tests/check_hostile_env.sh BUILD: the shim in hostile surroundings, one PASS/FAIL line each.
#   - no libcuda on the machine: a program that dlopens libcuda.so.1 and handles the failure
#     behaves identically under the shim in every mode, nothing on stderr, no stats file;
#   - libcuda loaded late: a program not linked against libcuda, whose buffers were filled before
#     the driver came, dlopens it and copies through cuGetProcAddress_v2: identical output, and in
#     mode observe the stats JSON counts exactly its copies; a known name the shim does not hook
#     (cuDeviceGetName) and an unknown one (cuNoSuchThing) get the driver's own answers;
#   - fork, fork + exec, vfork + exec, posix_spawn: each exec'd process writes its own stats file
#     (PINSHIM_STATS with %p), valid JSON with its own pid and copies; the forked child that never
#     exec'd writes none;
#   - a SIGALRM every millisecond while copying: identical output, no hang.
# Covered elsewhere, only checked to be there: programs that never use CUDA (check_nocuda.sh) and
# exit() with async copies in flight plus atexit handlers that copy (fake/test_threads_exit.c).
set -u
BUILD=${1:-build}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT" || exit 1
case $BUILD in /*) ;; *) BUILD=$ROOT/$BUILD ;; esac
SHIM=$BUILD/libpinshim.so
FAKE=$BUILD/fakecuda
FAKEBIN=$BUILD/tests/fake
WORK=$(mktemp -d /tmp/pinshim-hostile-env.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$WORK/nolib"
pass=0 fail=0 skip=0
ok()   { pass=$((pass + 1)); printf 'PASS %s\n' "$1"; }
bad()  { fail=$((fail + 1)); printf 'FAIL %s\n' "$1"; [ -n "${2:-}" ] && printf '%s\n' "$2" | head -30 | sed 's/^/    | /'; return 0; }
skipped() { skip=$((skip + 1)); printf 'SKIP %s\n' "$1"; }
MODES=(off observe pin full)
TMO=${HOSTILE_TIMEOUT:-120}

for f in "$SHIM" "$FAKE/libcuda.so.1" "$FAKEBIN/env_fork_exec" "$FAKEBIN/env_signals"; do
    [ -e "$f" ] || { echo "FAIL missing $f (build first)"; exit 1; }
done

json_ok() { python3 -c 'import json,sys; json.load(open(sys.argv[1]))' "$1" 2>/dev/null; }
# copies_of JSON DIR: the count the shim recorded for one direction.
copies_of() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["copies"][sys.argv[2]]["count"])' "$1" "$2" 2>/dev/null; }

# same_as_plain DESC REF_OUT REF_RC OUT RC ERR: stdout and status identical, stderr empty.
same_as_plain() {
    local desc=$1 ref_out=$2 ref_rc=$3 out=$4 rc=$5 err=$6
    if [ "$rc" != "$ref_rc" ]; then bad "$desc: exit $rc, without the shim $ref_rc" "$(cat "$err")"; return 1; fi
    if ! cmp -s "$out" "$ref_out"; then bad "$desc: stdout differs" "$(diff "$ref_out" "$out"; cat "$err")"; return 1; fi
    if [ -s "$err" ]; then bad "$desc: stderr not empty" "$(cat "$err")"; return 1; fi
    return 0
}

# ---- the late-dlopen program, built without -lcuda ----
CUDA_INC=${CUDA_INC:-}
if [ -z "$CUDA_INC" ]; then
    for d in /usr/local/cuda /usr/local/cuda-* /usr; do
        [ -f "$d/include/cuda.h" ] && { CUDA_INC=$d/include; break; }
    done
fi
LATE=$WORK/env_late_dlopen
if ! ${CC:-cc} -std=gnu11 -O2 -g -Wall -Wextra -Werror -I"$CUDA_INC" -Itests -o "$LATE" tests/fake/env_late_dlopen.c -ldl 2>"$WORK/cc.log"; then
    bad "building env_late_dlopen without -lcuda" "$(cat "$WORK/cc.log")"; LATE=""
elif command -v readelf >/dev/null && readelf -d "$LATE" | grep -q 'libcuda'; then
    bad "env_late_dlopen is linked against libcuda"; LATE=""
fi

echo "== no libcuda on the machine"
if ldconfig -p 2>/dev/null | grep -qE 'libcuda\.so'; then
    skipped "no libcuda: this machine has one ($(ldconfig -p | grep -E 'libcuda\.so' | head -1 | xargs)); the check needs a machine without"
elif [ -n "$LATE" ]; then
    timeout "$TMO" env LD_LIBRARY_PATH="$WORK/nolib" "$LATE" >"$WORK/nolib.ref" 2>"$WORK/nolib.referr"; ref_rc=$?
    if [ $ref_rc != 3 ] || ! grep -q '^no driver' "$WORK/nolib.ref"; then
        bad "no libcuda: the program without the shim did not take its no-driver path (exit $ref_rc)" "$(cat "$WORK/nolib.ref" "$WORK/nolib.referr")"
    else
        for m in "${MODES[@]}"; do
            mkdir -p "$WORK/nolib-stats-$m"
            timeout "$TMO" env LD_LIBRARY_PATH="$WORK/nolib" LD_PRELOAD="$SHIM" PINSHIM_MODE=$m \
                PINSHIM_STATS="$WORK/nolib-stats-$m/s-%p.json" PINSHIM_REPORT="$WORK/nolib-stats-$m/r-%p.txt" \
                "$LATE" >"$WORK/out" 2>"$WORK/err"; rc=$?
            same_as_plain "no libcuda [$m]" "$WORK/nolib.ref" $ref_rc "$WORK/out" $rc "$WORK/err" || continue
            if [ -n "$(ls -A "$WORK/nolib-stats-$m")" ]; then
                bad "no libcuda [$m]: a process that never reached the driver wrote $(ls "$WORK/nolib-stats-$m")"; continue
            fi
            ok "no libcuda [$m]: same output and exit status, nothing on stderr, no stats file"
        done
    fi
fi

echo "== libcuda loaded late, found through dlopen + cuGetProcAddress_v2"
if [ -n "$LATE" ]; then
    timeout "$TMO" env LD_LIBRARY_PATH="$FAKE" "$LATE" >"$WORK/late.ref" 2>"$WORK/late.referr"; ref_rc=$?
    if [ $ref_rc != 0 ] || [ -s "$WORK/late.referr" ]; then
        bad "late dlopen: fails without the shim (exit $ref_rc)" "$(cat "$WORK/late.ref" "$WORK/late.referr")"
    else
        grep -q "^PASS cuDeviceGetName is the driver's own" "$WORK/late.ref" && grep -q '^PASS cuNoSuchThing' "$WORK/late.ref" \
            && ok "late dlopen: cuGetProcAddress lookups of cuDeviceGetName and cuNoSuchThing checked by the program" \
            || bad "late dlopen: the lookup checks did not run" "$(cat "$WORK/late.ref")"
        want=$(sed -n 's/^EXPECTED_COPIES //p' "$WORK/late.ref")
        VARIANTS=("off|" "observe|" "pin|" "full|"
                  "full-small|PINSHIM_MIN_SIZE=4K PINSHIM_REWRITE_MIN=4K PINSHIM_REWRITE_ALWAYS=1 PINSHIM_STAGING_MIN=64K PINSHIM_STAGING_CHUNK=64K PINSHIM_BUDGET=8M")
        for v in "${VARIANTS[@]}"; do
            name=${v%%|*}; extra=${v#*|}; m=${name%%-*}
            json=$WORK/late-$name.json
            # shellcheck disable=SC2086
            timeout "$TMO" env LD_LIBRARY_PATH="$FAKE" LD_PRELOAD="$SHIM" PINSHIM_MODE=$m PINSHIM_STATS="$json" $extra \
                "$LATE" >"$WORK/out" 2>"$WORK/err"; rc=$?
            same_as_plain "late dlopen [$name]" "$WORK/late.ref" $ref_rc "$WORK/out" $rc "$WORK/err" || continue
            if [ "$m" = off ]; then
                [ -e "$json" ] && { bad "late dlopen [off]: a stats file was written"; continue; }
                ok "late dlopen [off]: same output"; continue
            fi
            json_ok "$json" || { bad "late dlopen [$name]: stats JSON missing or invalid"; continue; }
            if [ "$m" = observe ]; then
                diffs=""
                for kv in $want; do
                    k=${kv%%=*}; n=${kv#*=}; got=$(copies_of "$json" "$k")
                    [ "$got" = "$n" ] || diffs="$diffs $k: issued $n, counted ${got:-?};"
                done
                [ -z "$diffs" ] || { bad "late dlopen [observe]: counts differ:$diffs"; continue; }
                ok "late dlopen [observe]: same output, the stats count exactly its copies ($want)"
            elif [ "$name" = pin ] || [ "$name" = full ]; then
                # The buffers were born before the driver came: still tracked, hot, promoted.
                np=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["promotions"]["count"])' "$json" 2>/dev/null)
                [ "${np:-0}" -gt 0 ] 2>/dev/null || { bad "late dlopen [$name]: buffers allocated before the driver was loaded were never promoted (promotions: ${np:-?})"; continue; }
                ok "late dlopen [$name]: same output, data right, $np buffers born before the driver promoted"
            else
                ok "late dlopen [$name]: same output, data right, stats JSON valid"
            fi
        done
    fi
    # Not a failure (a design choice of the shim), but a difference a program can see: the shim
    # exports the copy entry points itself, so a probe of the global scope finds them even where
    # no driver is loaded.
    cat >"$WORK/probe.c" <<'EOF'
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
int main(void) { printf("%d\n", dlsym(RTLD_DEFAULT, "cuGetProcAddress_v2") != NULL); return 0; }
EOF
    if ${CC:-cc} -o "$WORK/probe" "$WORK/probe.c" -ldl 2>/dev/null; then
        a=$(env LD_LIBRARY_PATH="$WORK/nolib" "$WORK/probe"); b=$(env LD_LIBRARY_PATH="$WORK/nolib" LD_PRELOAD="$SHIM" "$WORK/probe")
        [ "$a" = "$b" ] || echo "NOTE without libcuda, dlsym(RTLD_DEFAULT, \"cuGetProcAddress_v2\") finds the shim's own export (without the shim: NULL); calling it returns CUDA_ERROR_NOT_INITIALIZED"
    fi
else
    bad "late dlopen: no program"
fi

echo "== cuGetProcAddress: names the shim does not hook"
if grep -q 'cuNoSuchFunction' tests/fake/test_doors.c && grep -q 'cuCtxGetCurrent' tests/fake/test_doors.c; then
    ok "unknown name and unhooked name also checked by fake/test_doors in every mode (make test)"
else
    bad "fake/test_doors no longer checks unknown or unhooked names"
fi

echo "== fork, fork + exec, vfork + exec, posix_spawn"
timeout "$TMO" env LD_LIBRARY_PATH="$FAKE" "$FAKEBIN/env_fork_exec" "$WORK/pids-plain" >"$WORK/fork.ref" 2>"$WORK/fork.referr"; ref_rc=$?
if [ $ref_rc != 0 ]; then
    bad "fork: fails without the shim (exit $ref_rc)" "$(cat "$WORK/fork.ref" "$WORK/fork.referr")"
else
    for m in "${MODES[@]}"; do
        sd=$WORK/fork-stats-$m; mkdir -p "$sd"
        timeout "$TMO" env LD_LIBRARY_PATH="$FAKE" LD_PRELOAD="$SHIM" PINSHIM_MODE=$m PINSHIM_STATS="$sd/s-%p.json" \
            "$FAKEBIN/env_fork_exec" "$WORK/pids-$m" >"$WORK/out" 2>"$WORK/err"; rc=$?
        same_as_plain "fork [$m]" "$WORK/fork.ref" $ref_rc "$WORK/out" $rc "$WORK/err" || continue
        if [ "$m" = off ]; then
            [ -z "$(ls -A "$sd")" ] && ok "fork [off]: same output, no stats files" || bad "fork [off]: stats files written: $(ls "$sd")"
            continue
        fi
        # Expected: the parent's file and one per exec'd child, nothing else (the plain forked child
        # never reached the driver itself).
        problems=""
        mapfile -t rows <"$WORK/pids-$m"
        want_files=()
        for row in "${rows[@]}"; do
            read -r who pid rounds <<<"$row"
            f=$sd/s-$pid.json
            want_files+=("s-$pid.json")
            if ! json_ok "$f"; then problems="$problems $who $pid: no valid JSON;"; continue; fi
            jpid=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["pid"])' "$f" 2>/dev/null)
            [ "$jpid" = "$pid" ] || problems="$problems $who $pid: the file says pid ${jpid:-?};"
            if [ "$m" = observe ]; then
                if [ "$who" = exec ]; then wh=$rounds; wd=$rounds; else wh=9; wd=1; fi
                gh=$(copies_of "$f" h2d); gd=$(copies_of "$f" d2h)
                [ "$gh" = "$wh" ] && [ "$gd" = "$wd" ] || problems="$problems $who $pid: counted h2d=$gh d2h=$gd, issued h2d=$wh d2h=$wd;"
            fi
        done
        got=$(ls -A "$sd" | sort | tr '\n' ' ')
        want=$(printf '%s\n' "${want_files[@]}" | sort | tr '\n' ' ')
        [ "$got" = "$want" ] || problems="$problems files [$got], expected [$want];"
        npids=$(printf '%s\n' "${rows[@]}" | awk '{print $2}' | sort -u | wc -l)
        [ "$npids" = 4 ] && [ ${#rows[@]} = 4 ] || problems="$problems ${#rows[@]} processes with $npids distinct pids, expected 4;"
        if [ -z "$problems" ]; then
            note=""; [ "$m" = observe ] && note=", with exact counts"
            ok "fork [$m]: same output; parent, fork+exec, vfork+exec and posix_spawn children each wrote their own stats file$note"
        else
            bad "fork [$m]:$problems"
        fi
    done
fi

echo "== SIGALRM every millisecond while copying"
timeout "$TMO" env LD_LIBRARY_PATH="$FAKE" "$FAKEBIN/env_signals" >"$WORK/sig.ref" 2>"$WORK/sig.referr"; ref_rc=$?
if [ $ref_rc != 0 ]; then
    bad "signals: fails without the shim (exit $ref_rc)" "$(cat "$WORK/sig.ref" "$WORK/sig.referr")"
else
    for v in "observe|" "full|" "full-small|PINSHIM_MIN_SIZE=4K PINSHIM_REWRITE_MIN=4K PINSHIM_REWRITE_ALWAYS=1 PINSHIM_STAGING_MIN=64K PINSHIM_STAGING_CHUNK=64K PINSHIM_BUDGET=8M" "full-trust|PINSHIM_TRUST_ASYNC=1"; do
        name=${v%%|*}; extra=${v#*|}; m=${name%%-*}
        t0=$SECONDS
        # shellcheck disable=SC2086
        timeout "$TMO" env LD_LIBRARY_PATH="$FAKE" LD_PRELOAD="$SHIM" PINSHIM_MODE=$m $extra \
            "$FAKEBIN/env_signals" >"$WORK/out" 2>"$WORK/err"; rc=$?
        [ $rc = 124 ] && { bad "signals [$name]: hung (killed after ${TMO}s)"; continue; }
        same_as_plain "signals [$name]" "$WORK/sig.ref" $ref_rc "$WORK/out" $rc "$WORK/err" || continue
        ok "signals [$name]: 200 interrupted rounds, calls succeed, data right ($((SECONDS - t0))s)"
    done
fi

echo "== covered elsewhere"
[ -x tests/check_nocuda.sh ] && ok "programs that never use CUDA: tests/check_nocuda.sh" || bad "tests/check_nocuda.sh is missing"
if grep -q atexit tests/fake/test_threads_exit.c 2>/dev/null && [ -x "$FAKEBIN/test_threads_exit" ]; then
    ok "exit() with async copies in flight, atexit handlers that copy: fake/test_threads_exit (every mode, make test)"
else
    bad "fake/test_threads_exit (exit with copies in flight, atexit copies) is missing"
fi

echo "hostile environments: $pass passed, $fail failed, $skip skipped"
[ $fail -eq 0 ]
