#!/usr/bin/env bash
# tests/check_install.sh BUILD [PREFIX]: the installed files work on their own.
#   With PREFIX (CI, after installing the Debian package): the tree under PREFIX is checked.
#   Without: `make install` into a fresh prefix whose path holds a space (LD_PRELOAD splits at
#   spaces: the wrapper must still load the library), and the package of `make deb` unpacked
#   with dpkg-deb (where dpkg-deb exists), are checked the same way.
# A check: every file is there; the four programs print the same version, this tree's; the
# installed wrapper finds the installed library by itself and really preloads it (a stats file
# written); the demo runs with the installed scripts and library (workload and fake driver from
# BUILD); a failing install fails.
set -u
BUILD=${1:-build}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT" || exit 1
case $BUILD in /*) ;; *) BUILD=$ROOT/$BUILD ;; esac
WORK=$(mktemp -d /tmp/pinshim-install.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
pass=0 fail=0
ok() { pass=$((pass + 1)); printf 'PASS %s\n' "$1"; }
bad() { fail=$((fail + 1)); printf 'FAIL %s\n' "$1"; [ -n "${2:-}" ] && printf '%s\n' "$2" | tail -15 | sed 's/^/    | /'; return 0; }
# The outer make's jobserver and flags are not this make's business.
mk() { env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make --no-print-directory -s BUILD="$BUILD" "$@"; }

want_version=$(scripts/version.sh)

check_prefix() {
    local prefix=$1 what=$2 f missing="" v n=0
    for f in bin/pinshim bin/pinshim-ab bin/pinshim-merge bin/pinshim-settings lib/libpinshim.so \
             share/doc/pinshim/README.md share/doc/pinshim/docs/benchmarks.md; do
        [ -e "$prefix/$f" ] || missing="$missing $f"
    done
    [ -z "$missing" ] && ok "$what: every file installed" || { bad "$what: missing:$missing"; return; }
    for f in pinshim pinshim-ab pinshim-merge pinshim-settings; do
        v=$("$prefix/bin/$f" --version 2>&1)
        [ "$v" = "$f $want_version" ] && n=$((n + 1)) || bad "$what: $f --version says '$v', expected '$f $want_version'"
    done
    [ $n = 4 ] && ok "$what: the four programs say '$want_version'"
    v=$(env -u PINSHIM_LIB "$prefix/bin/pinshim" --print-lib 2>&1)
    [ "$v" = "$prefix/lib/libpinshim.so" ] && ok "$what: pinshim finds the installed library" ||
        bad "$what: pinshim --print-lib says '$v'"
    mkdir -p "$WORK/stats"
    rm -f "$WORK"/stats/*
    if env -u PINSHIM_LIB -u LD_PRELOAD LD_LIBRARY_PATH="$BUILD/fakecuda" "$prefix/bin/pinshim" --mode observe \
           --stats "$WORK/stats/s.%p.json" -- "$BUILD/tests/fake/test_doors" >"$WORK/doors.out" 2>&1 &&
       [ "$(ls "$WORK/stats" | wc -l)" = 1 ]; then
        ok "$what: pinshim --stats preloads the installed library (one stats file)"
    else
        bad "$what: pinshim --stats -- test_doors" "$(cat "$WORK/doors.out"; ls "$WORK/stats")"
    fi
    if env -u PINSHIM_LIB -u LD_PRELOAD DEMO_RUNS=1 scripts/demo.sh "$BUILD" --installed "$prefix" >"$WORK/demo.out" 2>&1 &&
       grep -q 'ratio B/A' "$WORK/demo.out" && grep -q 'pinshim report' "$WORK/demo.out"; then
        ok "$what: the demo runs with the installed scripts and library"
    else
        bad "$what: scripts/demo.sh --installed" "$(cat "$WORK/demo.out")"
    fi
}

if [ $# -ge 2 ]; then
    check_prefix "$2" "installed under $2"
else
    prefix="$WORK/pre fix"
    if mk install PREFIX="$prefix" >"$WORK/install.out" 2>&1; then
        check_prefix "$prefix" "make install PREFIX='.../pre fix'"
    else
        bad "make install PREFIX='.../pre fix' failed" "$(cat "$WORK/install.out")"
    fi
    if mk install PREFIX=/proc/pinshim-cannot-be-here >"$WORK/install.out" 2>&1; then
        bad "make install into an impossible PREFIX exited 0"
    else
        ok "make install into an impossible PREFIX fails"
    fi
    if command -v dpkg-deb >/dev/null 2>&1; then
        if deb=$(mk deb 2>"$WORK/deb.err") && [ -f "$deb" ] && dpkg-deb -x "$deb" "$WORK/debroot" 2>>"$WORK/deb.err"; then
            ok "make deb: $(basename "$deb") builds and unpacks"
            info=$(dpkg-deb -f "$deb" Package Version Depends)
            grep -q "^Version: $(scripts/version.sh --version)$" <<<"$info" && ok "make deb: the package's version is VERSION's" ||
                bad "make deb: control fields" "$info"
            check_prefix "$WORK/debroot/usr" "the package's files"
        else
            bad "make deb" "$(cat "$WORK/deb.err")"
        fi
    else
        echo "SKIP make deb: no dpkg-deb here"
    fi
fi
echo "install: $pass passed, $fail failed"
[ $fail = 0 ]
