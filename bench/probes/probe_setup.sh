# probe_setup.sh: what every shell probe of bench/probes/ begins with, sourced as
#   . "$(dirname "$0")/probe_setup.sh" "${1:-}"
# It sets ROOT (the repository), BUILD (the build folder: the probe's first argument, else
# build/), LIB (the library in it, which must exist), OUT (the environment's, else BUILD/probes)
# and DIR (OUT/<the probe's name>, made), and exits 2 where one of them cannot be had.
# shellcheck shell=bash
PROBE=$(basename "$0" .sh)
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=$(cd "${1:-$ROOT/build}" && pwd) || exit 2
LIB=$BUILD/libpinshim.so
OUT=${OUT:-$BUILD/probes}
DIR=$OUT/$PROBE
mkdir -p "$DIR" || exit 2
[ -f "$LIB" ] || { echo "$PROBE: $LIB is missing (make all)" >&2; exit 2; }
