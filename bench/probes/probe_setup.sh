# probe_setup.sh: what every shell probe of bench/probes/ begins with, sourced as
#   . "$(dirname "$0")/probe_setup.sh" "${1:-}"
# It sets ROOT (the repository), BUILD (the build folder: the probe's first argument, else
# build/), LIB (the library in it, which must exist), OUT (the environment's, else BUILD/probes)
# and DIR (OUT/<the probe's name>, made), and exits 2 where one of them cannot be had; and
# defines probe_run, the probes' one way to run a program, and probe_variants (below).
# shellcheck shell=bash
PROBE=$(basename "$0" .sh)
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=$(cd "${1:-$ROOT/build}" && pwd) || exit 2
LIB=$BUILD/libpinshim.so
OUT=${OUT:-$BUILD/probes}
DIR=$OUT/$PROBE
mkdir -p "$DIR" || exit 2
[ -f "$LIB" ] || { echo "$PROBE: $LIB is missing (make all)" >&2; exit 2; }

# probe_run SECONDS FILE [WORD...] -- COMMAND...: one run of COMMAND under `timeout SECONDS`,
# both its output streams in FILE and a failure noted at its end.  WORDs: VAR=VALUE for its
# environment, SHIM to run it under LIB (mode full), LIB=PATH under another build of the
# library.  The words' own settings come after the shim's, so that they win.
probe_run() {
    local secs=$1 file=$2 lib=
    shift 2
    local envs=()
    while [ $# -gt 0 ] && [ "$1" != -- ]; do
        case $1 in
            SHIM) lib=$LIB ;;
            LIB=*) lib=${1#LIB=} ;;
            *) envs+=("$1") ;;
        esac
        shift
    done
    [ $# -gt 0 ] && shift   # the --
    [ -n "$lib" ] && envs=(LD_PRELOAD="$lib" PINSHIM_MODE=full "${envs[@]}")
    timeout "$secs" env "${envs[@]}" "$@" >"$file" 2>&1 || echo "run failed: exit $?" >>"$file"
}

# probe_variants TEXT: where TEXT (a variable of the environment, "name|WORDS" per line) is not
# empty, its lines replace the probe's own VARIANTS.
probe_variants() {
    [ -n "$1" ] && mapfile -t VARIANTS < <(printf '%s\n' "$1" | grep -v '^[[:space:]]*$')
    return 0
}
