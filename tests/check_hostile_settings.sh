#!/usr/bin/env bash
# tests/check_hostile_settings.sh BUILD: every setting of shim/base/settings.def, set to hostile text,
# leaves a fake-driver program's output and exit status exactly as without the shim (rule 9, 10):
#   - empty or blank: treated as unset, nothing on stderr;
#   - garbage, negative, overflowing, unknown units, control bytes, very long: exactly one
#     stderr line from the shim, naming the variable;
#   - the default written out explicitly: nothing on stderr;
#   - path settings (PINSHIM_STATS, PINSHIM_REPORT): any text is a valid (relative) path and is
#     written in the working directory silently; a path that cannot be written (under /proc, under
#     a regular file, in a missing directory, onto a directory, expanding too long) gives one
#     warning naming the variable, and no partial or temporary file is left behind;
#   - a path naming a symbolic link, a FIFO or a character device: written through the link or
#     into the node, which stays what it was (a FIFO nobody reads: one warning, no hang);
#   - a name one slip away from a setting (two neighbouring letters swapped, lower case): one
#     line naming it and the setting meant; names far from every setting: nothing;
#   - under scripts/pinshim, a command of several processes gets each warning once in all.
set -u
BUILD=${1:-build}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT" || exit 1
case $BUILD in /*) ;; *) BUILD=$ROOT/$BUILD ;; esac
SHIM=$BUILD/libpinshim.so
FAKE=$BUILD/fakecuda
PROG=$BUILD/tests/fake/test_doors
DEF=$ROOT/shim/base/settings.def
for f in "$SHIM" "$PROG" "$DEF"; do
    [ -e "$f" ] || { echo "FAIL missing $f (build first)"; exit 1; }
done
WORK=$(mktemp -d /tmp/pinshim-hostile-settings.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
pass=0 fail=0

ok()  { pass=$((pass + 1)); printf 'PASS %s\n' "$1"; }
bad() { fail=$((fail + 1)); printf 'FAIL %s\n' "$1"; [ -n "${2:-}" ] && printf '%s\n' "$2" | head -c 2000 | sed 's/^/    | /'; }

# The reference: the program without the shim.
REF_OUT=$WORK/ref.out
timeout 60 env LD_LIBRARY_PATH="$FAKE" "$PROG" >"$REF_OUT" 2>"$WORK/ref.err"
REF_RC=$?
if [ $REF_RC -ne 0 ] || [ -s "$WORK/ref.err" ]; then
    bad "reference run of $(basename "$PROG") (exit $REF_RC)" "$(cat "$WORK/ref.err")"
    exit 1
fi

# try DESC VAR VALUE WANT_LINES [DIR]: run the program under the shim with VAR=VALUE (cwd DIR);
# stdout and status must match the reference and stderr must hold exactly WANT_LINES lines, each
# a pinshim line naming VAR ("any" = don't count, but only pinshim lines).
try() {
    local desc=$1 var=$2 value=$3 want=$4 dir=${5:-$WORK/cwd}
    local out=$WORK/out err=$WORK/err rc lines
    mkdir -p "$dir"
    (cd "$dir" && timeout 60 env LD_LIBRARY_PATH="$FAKE" LD_PRELOAD="$SHIM" "$var=$value" "$PROG") >"$out" 2>"$err"
    rc=$?
    if [ $rc -ne $REF_RC ]; then
        bad "$desc: exit $rc, without the shim $REF_RC" "$(cat "$err")"; return 1
    fi
    if ! cmp -s "$out" "$REF_OUT"; then
        bad "$desc: stdout differs from the run without the shim" "$(diff "$REF_OUT" "$out" | head -20)"; return 1
    fi
    lines=$(wc -l <"$err")
    if [ -s "$err" ] && [ "$(tail -c1 "$err" | od -An -c | tr -d ' ')" != '\n' ]; then
        bad "$desc: stderr does not end with a newline" "$(cat "$err")"; return 1
    fi
    if [ "$want" != any ] && [ "$lines" -ne "$want" ]; then
        bad "$desc: $lines stderr lines, expected $want" "$(cat "$err")"; return 1
    fi
    if [ "$lines" -gt 0 ] && [ "$want" != any ]; then
        if grep -v -q "^pinshim\[[0-9]*\]: .*$var" "$err"; then
            bad "$desc: a stderr line is not the shim's or does not name $var" "$(cat "$err")"; return 1
        fi
    fi
    ok "$desc"
}

# The settings: name and kind, parsed from the table.
mapfile -t ROWS < <(sed -n 's/^SETTING(\(PINSHIM_[A-Z0-9_]*\), *\([A-Z_]*\), *[a-z_0-9]*, *"\([^"]*\)".*/\1 \2 \3/p' "$DEF")
if [ ${#ROWS[@]} -lt 10 ]; then
    bad "parsing $DEF: only ${#ROWS[@]} settings found"; exit 1
fi
echo "== ${#ROWS[@]} settings from shim/base/settings.def"

LONG=$(head -c 3000 /dev/zero | tr '\0' '7')
NL=$'4K\nPINSHIM_FAKE=1'
CTRL=$'\x01\x1b[31m\xff'
HOSTILE=("banana" "-5" "99999999999999999999999" "12Q" "5KB" "  banana  " "0x10" "1e3" "$NL" "$CTRL" "$LONG")
HOSTILE_NAMES=(garbage negative overflow "unit 12Q" "unit 5KB" "padded garbage" hex exponent newline "control bytes" "3000 chars")

for row in "${ROWS[@]}"; do
    read -r var kind dflt <<<"$row"
    try "$var empty" "$var" "" 0
    try "$var blank" "$var" $' \t ' 0
    [ -n "$dflt" ] && try "$var default written out ($dflt)" "$var" "$dflt" 0
    if [ "$kind" = PATH ]; then
        continue   # below
    fi
    for i in "${!HOSTILE[@]}"; do
        try "$var ${HOSTILE_NAMES[$i]}" "$var" "${HOSTILE[$i]}" 1
    done
done

# ---- path settings ----
# leftovers DIR WANT...: DIR holds exactly the names WANT (sorted), nothing else.
leftovers() {
    local dir=$1; shift
    local got want
    got=$(ls -A "$dir" 2>/dev/null | sort | tr '\n' ' ')
    want=$(printf '%s\n' "$@" | sed '/^$/d' | sort | tr '\n' ' ')
    [ "$got" = "$want" ] || { echo "in $dir: found [$got], expected [$want]"; return 1; }
}

for row in "${ROWS[@]}"; do
    read -r var kind dflt <<<"$row"
    [ "$kind" = PATH ] || continue
    json=0; [ "$var" = PINSHIM_STATS ] && json=1

    # Hostile-looking text is a valid relative path: written silently in the working directory.
    for i in 0 1 2 3 4; do
        v=${HOSTILE[$i]}
        d=$WORK/rel-$var-$i
        if try "$var relative path '$v'" "$var" "$v" 0 "$d"; then
            if ! msg=$(leftovers "$d" "$v"); then
                bad "$var relative path '$v': files" "$msg"
            elif [ $json = 1 ] && ! python3 -c 'import json,sys; json.load(open(sys.argv[1]))' "$d/$v" 2>/dev/null; then
                bad "$var relative path '$v': not valid JSON"
            else
                ok "$var relative path '$v': the one file, complete"
            fi
        fi
    done
    try "$var 3000 chars" "$var" "$LONG" 1

    # Paths that cannot be written: one warning, nothing left anywhere.
    for p in /proc/forbidden/x.json /proc/x.json /sys/x.json; do
        try "$var unwritable $p" "$var" "$p" 1
    done
    [ -e /proc/forbidden ] && bad "/proc/forbidden exists"

    d=$WORK/file-parent-$var; mkdir -p "$d"; echo data >"$d/file"
    if try "$var parent is a regular file" "$var" "$d/file/x.json" 1; then
        msg=$(leftovers "$d" file) && [ "$(cat "$d/file")" = data ] && ok "$var parent is a regular file: nothing left, file untouched" \
            || bad "$var parent is a regular file: leftovers" "$msg"
    fi

    d=$WORK/missing-$var; mkdir -p "$d"
    if try "$var missing directory" "$var" "$d/missing/x.json" 1; then
        msg=$(leftovers "$d") && ok "$var missing directory: nothing created" || bad "$var missing directory: leftovers" "$msg"
    fi

    d=$WORK/onto-dir-$var; mkdir -p "$d/target"; echo keep >"$d/target/keep"
    if try "$var target is a directory" "$var" "$d/target" 1; then
        msg=$(leftovers "$d" target) && msg2=$(leftovers "$d/target" keep) && ok "$var target is a directory: no temporary left" \
            || bad "$var target is a directory: leftovers" "$msg $msg2"
    fi

    # Names that stand for something else: written through, never replaced by a regular file.
    d=$WORK/link-$var; mkdir -p "$d/real"; echo old >"$d/real/target"; ln -s real/target "$d/link"
    if try "$var is a symbolic link" "$var" "$d/link" 0; then
        if [ -L "$d/link" ] && [ -f "$d/real/target" ] && [ "$(cat "$d/real/target")" != old ] &&
            msg=$(leftovers "$d/real" target) && { [ $json = 0 ] || python3 -c 'import json,sys; json.load(open(sys.argv[1]))' "$d/link"; }; then
            ok "$var is a symbolic link: still a link, its target rewritten whole"
        else
            bad "$var is a symbolic link: replaced or not written" "$(ls -la "$d" "$d/real") $msg"
        fi
    fi
    d=$WORK/dangling-$var; mkdir -p "$d"; ln -s new.out "$d/link"
    if try "$var is a link to a file not there yet" "$var" "$d/link" 0; then
        [ -L "$d/link" ] && [ -s "$d/new.out" ] && ok "$var dangling link: the file created through it" ||
            bad "$var dangling link" "$(ls -la "$d")"
    fi
    d=$WORK/fifo-$var; mkdir -p "$d"; mkfifo "$d/fifo"
    (cat "$d/fifo" >"$d/read" &) 2>/dev/null
    sleep 0.2
    if try "$var is a FIFO with a reader" "$var" "$d/fifo" 0; then
        sleep 0.2
        [ -p "$d/fifo" ] && [ -s "$d/read" ] && ok "$var FIFO: still a FIFO, the reader got the file" ||
            bad "$var FIFO with a reader" "$(ls -la "$d")"
    fi
    rm -f "$d/fifo"; mkfifo "$d/fifo"
    # Nobody reading: the exit must not hang (try's timeout would fail it); one warning.
    if try "$var is a FIFO nobody reads" "$var" "$d/fifo" 1; then
        [ -p "$d/fifo" ] && ok "$var FIFO nobody reads: no hang, still a FIFO" || bad "$var FIFO nobody reads: replaced" "$(ls -la "$d")"
    fi
    # A character device: a node of our own (root can make one), never the system's /dev/null,
    # which a shim that replaced files would replace (as root) for the whole machine.
    d=$WORK/chr-$var; mkdir -p "$d"
    if mknod -m 666 "$d/null" c 1 3 2>/dev/null; then
        try "$var is a character device" "$var" "$d/null" 0 &&
            { [ -c "$d/null" ] && msg=$(leftovers "$d" null) && ok "$var character device: still one, nothing beside it" ||
                bad "$var character device replaced" "$(ls -la "$d")"; }
    elif [ ! -w /dev ]; then
        try "$var is /dev/null" "$var" /dev/null 0 && { [ -c /dev/null ] && ok "$var /dev/null: still a character device" || bad "$var: /dev/null replaced"; }
    fi

    # %p repeated until the expanded name no longer fits (the template itself does fit).
    d=$WORK/expand-$var; mkdir -p "$d"
    many=$(printf '%%p%.0s' $(seq 225))
    if try "$var expands too long" "$var" "$d/$many" 1; then
        msg=$(leftovers "$d") && ok "$var expands too long: nothing written" || bad "$var expands too long: leftovers" "$msg"
    fi

    # A valid path with %p, rewritten twice by the same name pattern: still one complete file each.
    d=$WORK/pid-$var; mkdir -p "$d"
    try "$var %p path" "$var" "$d/out-%p.x" 0 && {
        n=$(ls "$d" | grep -c '^out-[0-9]*\.x$'); others=$(ls "$d" | grep -vc '^out-[0-9]*\.x$')
        [ "$n" = 1 ] && [ "$others" = 0 ] && ok "$var %p path: one file named by the pid" || bad "$var %p path: $(ls "$d")"
    }
done

# PINSHIM_REPORT=1: the report on stderr, which the user asked for; stdout untouched.
try "PINSHIM_REPORT=1 (report on stderr, asked for)" PINSHIM_REPORT 1 any
grep -q "pinshim report" "$WORK/err" && ok "PINSHIM_REPORT=1: the report is on stderr" || bad "PINSHIM_REPORT=1: no report on stderr" "$(head -5 "$WORK/err")"

# Every setting hostile at once: one line per setting, each naming its own variable.
all_env=()
n_numeric=0
for row in "${ROWS[@]}"; do
    read -r var kind dflt <<<"$row"
    [ "$kind" = PATH ] && continue
    all_env+=("$var=banana"); n_numeric=$((n_numeric + 1))
done
out=$WORK/all.out; err=$WORK/all.err
timeout 60 env LD_LIBRARY_PATH="$FAKE" LD_PRELOAD="$SHIM" "${all_env[@]}" "$PROG" >"$out" 2>"$err"; rc=$?
if [ $rc = $REF_RC ] && cmp -s "$out" "$REF_OUT" && [ "$(wc -l <"$err")" = $n_numeric ]; then
    missing=""
    for row in "${ROWS[@]}"; do
        read -r var kind dflt <<<"$row"
        [ "$kind" = PATH ] && continue
        [ "$(grep -c "^pinshim\[[0-9]*\]: $var=" "$err")" = 1 ] || missing="$missing $var"
    done
    [ -z "$missing" ] && ok "all $n_numeric settings hostile at once: one line each" || bad "all at once: not one line each for$missing" "$(cat "$err")"
else
    bad "all settings hostile at once: exit $rc, $(wc -l <"$err") stderr lines (want $n_numeric)" "$(cat "$err")"
fi

# ---- names that are not settings ----
# slip NAME: NAME with the first two different neighbouring letters after PINSHIM_ swapped.
slip() {
    local name=$1 i a b
    for ((i = 8; i < ${#name} - 1; i++)); do
        a=${name:i:1} b=${name:i+1:1}
        if [ "$a" != "$b" ] && [ "$a" != _ ] && [ "$b" != _ ]; then
            echo "${name:0:i}$b$a${name:i+2}"; return
        fi
    done
}
for row in "${ROWS[@]}"; do
    read -r var kind dflt <<<"$row"
    s=$(slip "$var")
    [ -n "$s" ] || continue
    try "misspelt $var as $s" "$s" 1 1 && { grep -q "did you mean $var?" "$WORK/err" ||
        bad "misspelt $var as $s: the line does not name $var" "$(cat "$WORK/err")"; }
done
try "lower-case pinshim_budget" pinshim_budget 1G 1 && { grep -q "did you mean PINSHIM_BUDGET?" "$WORK/err" ||
    bad "pinshim_budget: the line does not name PINSHIM_BUDGET" "$(cat "$WORK/err")"; }
for far in PINSHIM_LIB PINSHIM_GPU_TIMEOUT PINSHIM_SOMETHING_ELSE_ENTIRELY; do
    try "$far (no setting is near): nothing on stderr" "$far" 1 0
done

# ---- once per command under the wrapper ----
# Two problems inherited from the environment, three processes under the shim: two lines.
WRAP=$ROOT/scripts/pinshim
cmd=("$WRAP" --lib "$SHIM" -- sh -c '"$0"; "$0"; "$0"' "$PROG")
timeout 60 env LD_LIBRARY_PATH="$FAKE" PINSHIM_BUDGET=banana PINSHIM_BUGDET=1G "${cmd[@]}" >"$WORK/out" 2>"$WORK/err"; rc=$?
if [ $rc = "$REF_RC" ] && cmp -s "$WORK/out" <(cat "$REF_OUT" "$REF_OUT" "$REF_OUT") && [ "$(wc -l <"$WORK/err")" = 2 ] &&
   [ "$(grep -c 'PINSHIM_BUDGET="banana"' "$WORK/err")" = 1 ] && [ "$(grep -c 'PINSHIM_BUGDET' "$WORK/err")" = 1 ]; then
    ok "pinshim -- sh -c 'P; P; P' with a bad value and a misspelt name inherited: each reported once"
else
    bad "pinshim -- three processes: exit $rc, $(wc -l <"$WORK/err") stderr lines (want 2)" "$(cat "$WORK/err")"
fi
# A process that changes the settings it was given is told again, about all of them.
cmd=("$WRAP" --lib "$SHIM" -- sh -c 'PINSHIM_MODE=pin "$0"' "$PROG")
timeout 60 env LD_LIBRARY_PATH="$FAKE" PINSHIM_BUDGET=banana "${cmd[@]}" >"$WORK/out" 2>"$WORK/err"; rc=$?
if [ $rc = "$REF_RC" ] && [ "$(grep -c 'PINSHIM_BUDGET="banana"' "$WORK/err")" = 2 ] && [ "$(wc -l <"$WORK/err")" = 2 ]; then
    ok "pinshim -- a process that changed a setting: warned again (once by the wrapper, once by the process)"
else
    bad "pinshim -- a changed setting: $(wc -l <"$WORK/err") stderr lines (want 2)" "$(cat "$WORK/err")"
fi
# Without the wrapper each process is on its own: one line each (the shell and two programs).
timeout 60 env LD_LIBRARY_PATH="$FAKE" LD_PRELOAD="$SHIM" PINSHIM_BUDGET=banana sh -c '"$0"; "$0"; true' "$PROG" >"$WORK/out" 2>"$WORK/err"
[ "$(grep -c 'PINSHIM_BUDGET="banana"' "$WORK/err")" = 3 ] && [ "$(wc -l <"$WORK/err")" = 3 ] &&
    ok "without the wrapper: one line per process" || bad "without the wrapper: $(wc -l <"$WORK/err") lines (want 3)" "$(cat "$WORK/err")"

echo "hostile settings: $pass passed, $fail failed"
[ $fail -eq 0 ]
