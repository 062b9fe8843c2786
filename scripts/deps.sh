#!/usr/bin/env bash
# deps.sh: every requirement of pinshim, checked in one place (`make deps`; the Makefile runs it
# before building, .ci/run before anything else).
#
# usage: scripts/deps.sh [--no-install] [--quiet] [--makefile FILE --key KEY] [NEED ...] [VAR=VALUE ...]
#        scripts/deps.sh --cuda-home
#
# NEED (default: build python, plus a note on the optional ones):
#   build     a C compiler (CC) that links, make, the CUDA Toolkit headers (cuda.h,
#             cudaTypedefs.h, nvtx3/nvToolsExt.h under CUDA_INC) and uthash (uthash.h)
#   python    python3 (the scripts and the tests)
#   valgrind  valgrind (make valgrind)
#   plot      gnuplot or python3's matplotlib (pinshim-ab --plot, bench plots)
#   deb       dpkg-deb (make deb)
# VAR=VALUE: CC, CUDA_HOME, CUDA_INC, UTHASH_INC as the Makefile uses them (also read from the
# environment).  --cuda-home prints the CUDA_HOME the Makefile uses when none is given: the
# first of /usr/local/cuda, /usr/local/cuda-* (newest first) and /usr that has
# include/cuda.h, else /usr/local/cuda.
#
# Headers are judged by compiling a probe that uses them, not by looking for the file.  A
# missing Debian package is installed with apt-get when running as root where apt-get exists
# (--no-install: never); otherwise the script stops with one line naming what is missing and the
# command that installs it, exit status 1.  When uthash.h cannot be used from the system (not
# installed and no root, or a broken copy), the uthash-dev package is fetched with `apt-get
# download` (no root needed) and unpacked into build/deps/; --makefile FILE then records
# UTHASH_INC_FOUND for the Makefile, with DEPS_CHECKED := KEY.
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DEPS_DIR=$ROOT/build/deps
UTHASH_FALLBACK=$DEPS_DIR/uthash-dev/usr/include

cuda_home() {
    local d
    for d in /usr/local/cuda $(ls -d /usr/local/cuda-* 2>/dev/null | sort -rV) /usr; do
        [ -f "$d/include/cuda.h" ] && { echo "$d"; return; }
    done
    echo /usr/local/cuda
}

if [ "${1:-}" = --cuda-home ]; then
    cuda_home
    exit 0
fi

install_ok=1 quiet=0 makefile="" key="" needs=()
while [ $# -gt 0 ]; do
    case $1 in
    --no-install) install_ok=0 ;;
    --quiet) quiet=1 ;;
    --makefile) makefile=${2:?--makefile needs a file}; shift ;;
    --key) key=${2-}; shift ;;
    build | python | valgrind | plot | deb) needs+=("$1") ;;
    CC=* | CUDA_HOME=* | CUDA_INC=* | UTHASH_INC=*) export "${1?}" ;;
    -h | --help) sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "deps: unknown argument $1 (scripts/deps.sh --help)" >&2; exit 2 ;;
    esac
    shift
done
optional_note=0
if [ ${#needs[@]} = 0 ]; then
    needs=(build python)
    optional_note=1
fi
CC=${CC:-cc}
CUDA_HOME=${CUDA_HOME:-$(cuda_home)}
CUDA_INC=${CUDA_INC:-$CUDA_HOME/include}
UTHASH_INC=${UTHASH_INC:-}
want() { [[ " ${needs[*]} " == *" $1 "* ]]; }
say() { [ $quiet = 1 ] || echo "deps: $*"; }
# What changes the machine or the tree is said even with --quiet.
tell() { echo "deps: $*" >&2; }

TMP=$(mktemp -d "${TMPDIR:-/tmp}/pinshim-deps.XXXXXX") || exit 1
trap 'rm -rf "$TMP"' EXIT

# compiles NAME CFLAGS...: the probe program $TMP/NAME.c compiles (and links) with CFLAGS.
compiles() {
    local name=$1; shift
    "$CC" "$@" -o "$TMP/$name.out" "$TMP/$name.c" >"$TMP/$name.log" 2>&1
}
cat >"$TMP/cc.c" <<'EOF'
#include <stdio.h>
int main(void) { return puts("") < 0; }
EOF
cat >"$TMP/cuda.c" <<'EOF'
#include <cuda.h>
int main(void) { CUdeviceptr p = 0; CUresult r = CUDA_SUCCESS; return (int)p + (int)r; }
EOF
cat >"$TMP/cudatypedefs.c" <<'EOF'
#include <cudaTypedefs.h>
int main(void) { PFN_cuGetProcAddress_v12000 f = 0; return f != 0; }
EOF
cat >"$TMP/nvtx.c" <<'EOF'
#include <nvToolsExt.h>
int main(void) { nvtxRangePushA("probe"); return nvtxRangePop() < -1; }
EOF
cat >"$TMP/uthash.c" <<'EOF'
#include <stdlib.h>
#include <uthash.h>
struct entry { int key; UT_hash_handle hh; };
int main(void)
{
    struct entry *table = NULL, *found = NULL, one = { .key = 1 };
    HASH_ADD_INT(table, key, &one);
    HASH_FIND_INT(table, &one.key, found);
    return found != &one;
}
EOF

have_apt() { command -v apt-get >/dev/null 2>&1 && command -v dpkg >/dev/null 2>&1; }
can_install() { [ $install_ok = 1 ] && [ "$(id -u)" = 0 ] && have_apt; }

# apt_install PKG...: install with apt-get, updating the package lists once if needed.
apt_install() {
    tell "installing $* (apt-get)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -qq --no-install-recommends "$@" >"$TMP/apt.log" 2>&1 && return 0
    apt-get update -qq >>"$TMP/apt.log" 2>&1 &&
        apt-get install -y -qq --no-install-recommends "$@" >>"$TMP/apt.log" 2>&1
}

# uthash_unpacked: the uthash-dev package unpacked under build/deps (no root needed).
uthash_unpacked() {
    [ -f "$UTHASH_FALLBACK/uthash.h" ] && compiles uthash -I"$UTHASH_FALLBACK" && return 0
    have_apt || return 1
    mkdir -p "$TMP/download" &&
        (cd "$TMP/download" && apt-get download uthash-dev >"$TMP/download.log" 2>&1) || return 1
    rm -rf "$DEPS_DIR/uthash-dev" && mkdir -p "$DEPS_DIR" &&
        dpkg-deb -x "$TMP"/download/uthash-dev_*.deb "$DEPS_DIR/uthash-dev" || return 1
    compiles uthash -I"$UTHASH_FALLBACK" || return 1
    tell "uthash.h from the system does not compile here; using uthash-dev unpacked into ${UTHASH_FALLBACK#"$ROOT"/}"
}

reinstall=0     # a package is installed but broken: only --reinstall mends it
missing=()      # what to tell the user: "package (why)" or a description
packages=()     # the Debian packages among them
need_pkg() { missing+=("$1${2:+ ($2)}"); packages+=("$1"); }

# check_or_install PROBE PKG...: PROBE is a command that succeeds when the requirement is met.
check_or_install() {
    local probe=$1; shift
    eval "$probe" && return 0
    can_install && apt_install "$@" && eval "$probe" && return 0
    return 1
}

uthash_found=""
if want build; then
    compiler_packages=(gcc libc6-dev)
    case $(basename "$CC") in cc | gcc | gcc-*) ;; *) compiler_packages=() ;; esac
    if ! compiles cc; then
        if [ ${#compiler_packages[@]} -gt 0 ] && can_install && apt_install "${compiler_packages[@]}" && compiles cc; then
            :
        elif [ ${#compiler_packages[@]} -gt 0 ]; then
            missing+=("a C compiler that links ($CC: gcc libc6-dev)"); packages+=(gcc libc6-dev)
        else
            missing+=("the C compiler CC=$CC")
        fi
    fi
    check_or_install 'command -v make >/dev/null 2>&1' make || need_pkg make
fi
# Headers can only be judged by a compiler that works.
if want build && compiles cc; then
    cuda_bad=()
    compiles cuda -I"$CUDA_INC" -fsyntax-only || cuda_bad+=(cuda.h)
    compiles cudatypedefs -I"$CUDA_INC" -fsyntax-only || cuda_bad+=(cudaTypedefs.h)
    compiles nvtx -I"$CUDA_INC/nvtx3" -fsyntax-only || cuda_bad+=(nvtx3/nvToolsExt.h)
    if [ ${#cuda_bad[@]} -gt 0 ]; then
        missing+=("the CUDA Toolkit headers (${cuda_bad[*]} do not compile from $CUDA_INC; install the CUDA Toolkit, or set CUDA_HOME=DIR or CUDA_INC=DIR)")
    fi
    if [ -n "$UTHASH_INC" ]; then
        compiles uthash -I"$UTHASH_INC" || missing+=("uthash (uthash.h does not compile from UTHASH_INC=$UTHASH_INC)")
    elif ! compiles uthash; then
        if ! dpkg -s uthash-dev >/dev/null 2>&1 && can_install && apt_install uthash-dev && compiles uthash; then
            :
        elif uthash_unpacked; then
            uthash_found=$UTHASH_FALLBACK
        elif dpkg -s uthash-dev >/dev/null 2>&1; then
            need_pkg uthash-dev "installed, but uthash.h does not compile"
            reinstall=1
        else
            need_pkg uthash-dev uthash.h
        fi
    fi
fi
if want python; then
    check_or_install 'python3 -c "import argparse, json, subprocess" >/dev/null 2>&1' python3 || need_pkg python3
fi
if want valgrind; then
    check_or_install 'command -v valgrind >/dev/null 2>&1' valgrind || need_pkg valgrind "make valgrind"
fi
has_plotter() { command -v gnuplot >/dev/null 2>&1 || python3 -c 'import matplotlib' >/dev/null 2>&1; }
if want plot; then
    check_or_install has_plotter gnuplot-nox || need_pkg gnuplot-nox "pinshim-ab --plot"
fi
if want deb; then
    check_or_install 'command -v dpkg-deb >/dev/null 2>&1' dpkg || need_pkg dpkg "dpkg-deb, make deb"
fi

if [ ${#missing[@]} -gt 0 ]; then
    line="deps: missing $(printf '%s, ' "${missing[@]}")"
    line=${line%, }
    if [ ${#packages[@]} -gt 0 ]; then
        sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo "
        install="${sudo}apt-get install$([ $reinstall = 1 ] && echo " --reinstall") ${packages[*]}"
        if have_apt; then
            line="$line; install with: $install"
        else
            line="$line; install with your package manager (Debian: $install)"
        fi
    fi
    echo "$line" >&2
    exit 1
fi

if [ -n "$makefile" ]; then
    {
        echo "# Written by scripts/deps.sh: the requirements this build tree was checked against."
        echo "DEPS_CHECKED := $key"
        echo "UTHASH_INC_FOUND := $uthash_found"
    } >"$makefile.tmp" && mv "$makefile.tmp" "$makefile" || exit 1
fi
if [ $quiet = 0 ]; then
    optional=()
    if [ $optional_note = 1 ]; then
        command -v valgrind >/dev/null 2>&1 || optional+=("valgrind (make valgrind)")
        has_plotter || optional+=("gnuplot-nox or python3-matplotlib (pinshim-ab --plot)")
    fi
    note=""
    [ ${#optional[@]} -gt 0 ] && note="; optional, not installed: $(printf '%s, ' "${optional[@]}")" && note=${note%, }
    where="CUDA headers in $CUDA_INC"
    [ -n "$uthash_found" ] && where="$where, uthash.h in ${uthash_found#"$ROOT"/}"
    echo "deps: ${needs[*]}: all present ($where)$note"
fi
exit 0
