#!/usr/bin/env bash
# Nothing inside BUILD/libpinshim.so binds to the library's own exports.  The library exports
# malloc, mmap, memcpy and the rest of their families (shim/hook/exports.map) for the program;
# its own calls must go to the C library under other names (base/libc_calls.h, base/real.h) or
# to the kernel (base/os.c).  A call through the plain name would come back into the hooks:
# the shim's own pages would be tracked as the program's, or it would recurse.
#
#   1. the dynamic symbol table exports what exports.map lists, and nothing else: no test-only
#      entry points (*_test_*, ...) and no internal function leak out;
#   2. no PLT or GOT relocation (JUMP_SLOT, GLOB_DAT) names a function the library exports;
#   3. no other relocation names an exported allocator, mapping or string function.  The doors'
#      tables name the library's own cu* entry points on purpose (what dlsym and
#      cuGetProcAddress hand out), so driver entry points are allowed there;
#   4. no test seam is in the library at all, exported or hidden: code under PINSHIM_TEST_SEAMS
#      is built only into the unit tests' objects (the Makefile's obj-seams).
# The exported set is read from the library itself (defined, GLOBAL, FUNC).
set -u
BUILD=${1:-build}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
LIB=$BUILD/libpinshim.so
MAP=shim/hook/exports.map
[ -f "$LIB" ] || { echo "FAIL $LIB is not built"; exit 1; }
command -v readelf >/dev/null || { echo "FAIL readelf not found (binutils)"; exit 1; }
fail=0
TMP=$(mktemp -d /tmp/pinshim-selfbind.XXXXXX)
trap 'rm -rf "$TMP"' EXIT

# Defined, GLOBAL (or WEAK), FUNC symbols of .dynsym, without version suffixes.
readelf --dyn-syms -W "$LIB" |
    awk '$1 ~ /^[0-9]+:$/ && $4 == "FUNC" && ($5 == "GLOBAL" || $5 == "WEAK") && $7 != "UND" { sub(/@.*/, "", $8); print $8 }' |
    sort -u >"$TMP/exported"
# Every defined dynamic symbol of any type (a data export is a leak too).
readelf --dyn-syms -W "$LIB" |
    awk '$1 ~ /^[0-9]+:$/ && $7 != "UND" && $5 != "LOCAL" && NF >= 8 { sub(/@.*/, "", $8); print $8 }' | sort -u >"$TMP/defined"
# Relocations that name a symbol: TYPE NAME.
readelf -rW "$LIB" |
    awk '$3 ~ /^R_/ && NF >= 5 { n = $5; sub(/@.*/, "", n); print $3, n }' | sort -u >"$TMP/relocs"

# ---- 1. the exports are exports.map's, nothing more ----
# The map's global: names and patterns (cu*), as shell patterns.
patterns=$(sed -n '/global:/,/local:/p' "$MAP" | sed 's#/\*.*\*/##; s/global://; s/local:.*//' |
    tr ';' '\n' | tr -d ' \t' | grep -v '^$')
if ! grep -qx malloc "$TMP/exported" || ! grep -qx mmap "$TMP/exported" || ! grep -qx memcpy "$TMP/exported"; then
    echo "FAIL malloc, mmap and memcpy are not all exported: this check would prove nothing"; fail=1
fi
extra=()
while IFS= read -r s; do
    ok=0
    for p in $patterns; do
        # shellcheck disable=SC2254
        case $s in $p) ok=1; break ;; esac
    done
    case $s in *_test_* | *_for_test*) ok=0 ;; esac
    [ $ok = 1 ] || extra+=("$s")
done <"$TMP/defined"
if [ ${#extra[@]} -eq 0 ]; then
    echo "PASS the library exports only what $MAP lists ($(wc -l <"$TMP/defined") symbols, none test-only)"
else
    echo "FAIL exported beyond $MAP (or test-only): ${extra[*]}"; fail=1
fi

# ---- 2. no PLT/GOT binding to an own export ----
self=$(awk '$1 ~ /JUMP_SLOT|GLOB_DAT/ { print $2 }' "$TMP/relocs" | sort -u | comm -12 - "$TMP/exported")
if [ -z "$self" ]; then
    echo "PASS no JUMP_SLOT/GLOB_DAT relocation names one of the $(wc -l <"$TMP/exported") exported functions"
else
    echo "FAIL the library calls its own exports through the PLT/GOT: $(echo $self)"; fail=1
fi

# ---- 3. no other relocation names an exported allocator, mapping or string function ----
self=$(awk '$1 !~ /JUMP_SLOT|GLOB_DAT/ { print $2 }' "$TMP/relocs" | sort -u |
    comm -12 - "$TMP/exported" | grep -v '^cu' || true)
if [ -z "$self" ]; then
    echo "PASS no data relocation names an exported allocator, mapping or string function"
else
    echo "FAIL data relocations name the library's own exports: $(echo $self)"; fail=1
fi

# ---- 4. no test seam inside, hidden or not ----
if command -v nm >/dev/null; then
    seams=$(nm "$LIB" 2>/dev/null | awk '{ print $NF }' | grep -E '_test_|_for_test' | sort -u || true)
    if ! nm "$LIB" >/dev/null 2>&1 || [ -z "$(nm "$LIB" 2>/dev/null | head -n 1)" ]; then
        echo "FAIL nm reads no symbol table from $LIB: the test-seam check would prove nothing"; fail=1
    elif [ -z "$seams" ]; then
        echo "PASS no test seam (*_test_*) among the library's symbols, hidden ones included"
    else
        echo "FAIL test seams built into the library: $(echo $seams)"; fail=1
    fi
else
    echo "FAIL nm not found (binutils)"; fail=1
fi
exit $fail
