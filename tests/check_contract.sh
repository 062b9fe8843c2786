#!/usr/bin/env bash
# docs/contract.md is the copy contract the code and the tests cite.  This check keeps the three
# in step:
#   - every rule ("### N. title") names its tests on a "Tests:" line, and every file named there
#     exists (tests/..., with the "through" remarks and the like ignored);
#   - every "rule N" / "rules N and M" cited in shim/ and tests/ is a rule of the contract.
# BUILD is accepted like every other check and not used.
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT" || exit 1
DOC=docs/contract.md
pass=0 fail=0
ok()  { pass=$((pass + 1)); printf 'PASS %s\n' "$1"; }
bad() { fail=$((fail + 1)); printf 'FAIL %s\n' "$1"; }
[ -f "$DOC" ] || { bad "$DOC missing"; echo "contract: $pass passed, $fail failed"; exit 1; }

# Each rule: its number, and the text from its heading to the next heading.
mapfile -t RULES < <(sed -n 's/^### \([0-9][0-9]*\)\. .*/\1/p' "$DOC")
[ ${#RULES[@]} -ge 10 ] && ok "$DOC has ${#RULES[@]} numbered rules" || bad "$DOC: only ${#RULES[@]} numbered rules"
for n in "${RULES[@]}"; do
    body=$(awk -v n="$n" '/^##/ { on = ($0 ~ "^### " n "\\. ") ; next } on' "$DOC")
    tests=$(printf '%s\n' "$body" | sed -n '/^Tests:/,/^$/p' | grep -oE 'tests/[A-Za-z0-9_./-]+[A-Za-z0-9_]' | sort -u)
    if [ -z "$tests" ]; then
        bad "rule $n names no test"
        continue
    fi
    missing=""
    for t in $tests; do [ -e "$t" ] || missing="$missing $t"; done
    [ -z "$missing" ] && ok "rule $n: its $(echo "$tests" | wc -l) tests exist" || bad "rule $n names tests that do not exist:$missing"
done

# Rules cited in the code and the tests.
cited=$(grep -rhoE '[Rr]ules? [0-9]+( (and|or|,) ?[0-9]+)*' shim tests --include='*.c' --include='*.h' --include='*.cu' --include='*.py' --include='*.sh' --include='*.def' |
    grep -oE '[0-9]+' | sort -un)
unknown=""
for c in $cited; do
    printf '%s\n' "${RULES[@]}" | grep -qx "$c" || unknown="$unknown $c"
done
[ -z "$unknown" ] && ok "every rule cited in shim/ and tests/ ($(echo $cited)) is in $DOC" || bad "rules cited but not in $DOC:$unknown"

echo "contract: $pass passed, $fail failed"
[ $fail -eq 0 ]
