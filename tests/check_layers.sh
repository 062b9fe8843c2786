#!/usr/bin/env bash
# The library's layers (shim/<layer>/), lowest first.  This list is the one statement of the
# order; a file may include headers from its own layer and from the layers below it, never
# from one above:
#
#   base    the C library and kernel under other names, settings, log, the shim's own
#           metadata; knows nothing of the driver's memory or copies
#   stats   counters and the report (base); what it reports from higher layers is handed to
#           it from above (e.g. the node budget's figures, wired up in top/init.c)
#   mem     blocks, arena, registry, node budget (base, stats)
#   copy    the copy paths: routing, staging, bounce, the program's pinning (base, stats, mem)
#   hook    the exported entry points: allocator, string and driver hooks (all of the above)
#   top     start-up, fork handling and shut-down: wires the layers together (everything)
#
# Includes are resolved as the compiler resolves them: "x.h" next to the including file
# first, then from shim/ (-Ishim).  System headers (<...>) are not checked.
# One PASS or FAIL line per layer; exits non-zero on any violation.
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT/shim" || exit 1
LAYERS=(base stats mem copy hook top)

rank() {
    local i
    for i in "${!LAYERS[@]}"; do [ "${LAYERS[$i]}" = "$1" ] && { echo "$i"; return; }; done
    echo -1
}

fail=0
# Every folder of shim/ must be a known layer: a new one has to be placed in the order first.
for d in */; do
    d=${d%/}
    if [ "$(rank "$d")" -lt 0 ]; then
        echo "FAIL shim/$d is not a layer: add it to the order in tests/check_layers.sh"; fail=1
    fi
done

for layer in "${LAYERS[@]}"; do
    me=$(rank "$layer")
    bad=()
    [ -d "$layer" ] || { echo "FAIL shim/$layer is missing"; fail=1; continue; }
    while IFS= read -r f; do
        while IFS= read -r inc; do
            # Next to the including file first, then from shim/.
            if [ -f "$(dirname "$f")/$inc" ]; then
                target=$(realpath --relative-to=. "$(dirname "$f")/$inc")
            elif [ -f "$inc" ]; then
                target=$(realpath --relative-to=. "$inc")
            else
                bad+=("$f: \"$inc\" not found in shim/"); continue
            fi
            tl=${target%%/*}
            r=$(rank "$tl")
            if [ "$tl" = "$target" ] || [ "$r" -lt 0 ]; then
                bad+=("$f: \"$inc\" resolves to $target, outside every layer")
            elif [ "$r" -gt "$me" ]; then
                bad+=("$f: \"$inc\" is in $tl, above $layer")
            fi
        done < <(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$f")
    done < <(find "$layer" -type f \( -name '*.c' -o -name '*.h' -o -name '*.def' \) | sort)
    allowed=$(printf '%s ' "${LAYERS[@]:0:$((me + 1))}")
    if [ ${#bad[@]} -eq 0 ]; then
        echo "PASS $layer includes only from: ${allowed% }"
    else
        echo "FAIL $layer includes only from: ${allowed% }"
        printf '    %s\n' "${bad[@]}"
        fail=1
    fi
done
exit $fail
