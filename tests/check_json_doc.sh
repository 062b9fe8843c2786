#!/usr/bin/env bash
# tests/check_json_doc.sh BUILD: every key of the statistics JSON is documented in the README's
# key table (## Statistics), and the table names no key the JSON does not have.  The JSON is
# taken from a fake-driver program run under the shim; per-site, per-bucket and per-entry-point
# fields are checked once, under the key that holds them.
set -u
BUILD=${1:-build}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT" || exit 1
case $BUILD in /*) ;; *) BUILD=$ROOT/$BUILD ;; esac
PROG=$BUILD/tests/fake/test_call_sites
[ -x "$PROG" ] || { echo "FAIL missing $PROG (build first)"; exit 1; }
WORK=$(mktemp -d /tmp/pinshim-json-doc.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
if ! env LD_LIBRARY_PATH="$BUILD/fakecuda" LD_PRELOAD="$BUILD/libpinshim.so" PINSHIM_STATS="$WORK/s.json" \
        PINSHIM_NODE_BUDGET=1G "$PROG" >"$WORK/out" 2>&1; then
    echo "FAIL $(basename "$PROG") under the shim"; sed 's/^/    | /' "$WORK/out" | tail -5; exit 1
fi
python3 - "$WORK/s.json" README.md <<'PY'
import json, re, sys
stats = json.load(open(sys.argv[1]))
# Keys of the JSON: a.b.c for objects; the elements of call_sites[] and histogram[] by their
# fields (call_sites[].site, ...); entry_points' names are data, not keys.
keys = set()
def walk(v, path):
    if isinstance(v, dict):
        if path == "entry_points":
            keys.add(path); return
        for k, x in v.items():
            walk(x, f"{path}.{k}" if path else k)
    elif isinstance(v, list):
        keys.add(path)
        for x in v[:1]:
            if isinstance(x, dict):
                for k in x:
                    keys.add(f"{path}[].{k}")
    else:
        keys.add(path)
walk(stats, "")
# The README's table: its first cells, each a list of `key` and `.sibling` names.
text = open(sys.argv[2]).read()
table = text[text.index("## Statistics"):text.index("## Measuring the effect")]
doc = set(); wild = set(); rows = {}
for line in table.splitlines():
    m = re.match(r"\| (`[^|]*) \|", line)
    if not m or m.group(1).startswith("`flag "):
        continue
    prefix = ""
    for tok in re.findall(r"`([^`]+)`", m.group(1)):
        rows[tok] = line
        if tok.startswith("."):
            tok = prefix + tok
        elif "." in tok:
            prefix = tok.rsplit(".", 1)[0]
        else:
            prefix = tok
        (wild if "<" in tok else doc).add(tok)
def documented(k):
    if k in doc:
        return True
    for w in wild:   # copies.<dir> documents copies.h2d.count and the like
        pat = "^" + re.escape(w).replace(re.escape("<") , "<").replace(re.escape(">"), ">")
        pat = re.sub(r"<[^>]*>", r"[a-z0-9_]+", pat)
        if re.match(pat + r"(\.|$)", k):
            return True
    # a list (call_sites[]) documented by one row that names each of its elements' fields
    if k + "[]" in doc:
        return True
    if "[]." in k:
        parent, field = k.split("[].", 1)
        return parent + "[]" in doc and f"`{field}`" in rows[parent + "[]"]
    return False
fails = 0
missing = sorted(k for k in keys if not documented(k))
if missing:
    print("FAIL keys of the statistics JSON the README does not document: " + ", ".join(missing)); fails += 1
else:
    print(f"PASS every one of the {len(keys)} keys of the statistics JSON is in the README's table")
stale = sorted(d for d in doc if d not in keys and d.rstrip("[]") not in keys and
               not any(k.startswith(d + ".") for k in keys))
if stale:
    print("FAIL the README's table names keys the JSON does not have: " + ", ".join(stale)); fails += 1
else:
    print(f"PASS every key the README's table names ({len(doc)}) is in the JSON")
print(f"json doc: {2 - fails} passed, {fails} failed")
sys.exit(1 if fails else 0)
PY
