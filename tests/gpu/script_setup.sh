# script_setup.sh: the common start of the GPU scripts that take BUILD OUTDIR (sourced).
# Sets HERE (tests/gpu), BUILD and OUT (absolute), SHIM (BUILD/libpinshim.so, which must exist),
# NVCC and ARCH; clears every PINSHIM_* variable and LD_PRELOAD, so that only what a script sets
# for a run applies to it.
[ $# -eq 2 ] || { echo "usage: $0 BUILD OUTDIR" >&2; exit 2; }
HERE=$(cd "$(dirname "$0")" && pwd)
BUILD=$(cd "$1" 2>/dev/null && pwd) || { echo "no build directory $1" >&2; exit 2; }
mkdir -p "$2" || exit 2
OUT=$(cd "$2" && pwd)
SHIM=$BUILD/libpinshim.so
[ -f "$SHIM" ] || { echo "missing $SHIM (run make shim)" >&2; exit 2; }
for v in $(compgen -e); do case "$v" in PINSHIM_*) unset "$v" ;; esac; done
unset LD_PRELOAD
NVCC=${NVCC:-nvcc}
ARCH=${NVCC_ARCH:-sm_90}
