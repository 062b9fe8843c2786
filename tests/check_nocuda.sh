#!/usr/bin/env bash
# Programs that never use CUDA behave identically under the shim: same output, same exit status,
# nothing extra on stderr, in every mode, and with settings the shim must warn about only once.
set -u
BUILD=${1:-build}
SHIM=$(cd "$(dirname "$0")/.." && pwd)/$BUILD/libpinshim.so
fail=0
compare() {
    local desc=$1; shift
    local out_a out_b err_b rc_a rc_b
    out_a=$("$@" 2>/dev/null); rc_a=$?
    for mode in off observe pin full; do
        err_b=$(mktemp)
        out_b=$(env LD_PRELOAD="$SHIM" PINSHIM_MODE=$mode PINSHIM_STATS=/tmp/pinshim-nocuda-%p.json "$@" 2>"$err_b"); rc_b=$?
        if [ "$out_a" != "$out_b" ] || [ "$rc_a" != "$rc_b" ] || [ -s "$err_b" ]; then
            echo "FAIL $desc [$mode]: output or status differs (rc $rc_a vs $rc_b), stderr: $(head -c 300 "$err_b")"
            fail=1
        else
            echo "PASS $desc [$mode]"
        fi
        rm -f "$err_b"
    done
}
compare "sh pipeline" sh -c 'for i in 1 2 3; do echo line $i; done | sort -r; exit 3'
compare "python3 large allocations" python3 -c '
import hashlib, mmap
b = bytearray(64 << 20)
for i in range(0, len(b), 4096): b[i] = i % 251
m = mmap.mmap(-1, 8 << 20); m.write(b[: 8 << 20]); m.close()
c = bytes(b[:1 << 20]) * 3
print(hashlib.sha256(b).hexdigest(), len(c))'
# Without the outer make's jobserver (make test -jN), whose warning would land on stderr.
compare "make dry run" env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make -n -C "$(dirname "$0")/.." shim
compare "coreutils" sh -c 'seq 1 100000 | sort -n | tail -1; ls /usr | head -3'
# No stats file from processes that never reached the driver.
if ls /tmp/pinshim-nocuda-*.json >/dev/null 2>&1; then
    echo "FAIL a process that never used CUDA wrote a stats file"; fail=1; rm -f /tmp/pinshim-nocuda-*.json
else
    echo "PASS no stats file from processes that never used CUDA"
fi
exit $fail
