#!/usr/bin/env bash
# version.sh [--version | --commit]: the version of this source tree (the VERSION file) and the
# commit it is at ("unknown" outside a git checkout of this very tree, e.g. an exported tree
# unpacked inside some other repository; "-dirty" when tracked files differ from it).
# Without an option: "VERSION (commit COMMIT)".  The Makefile and the scripts of a source tree
# both ask this script, so they cannot disagree.
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd -P)
version=$(tr -d ' \t\r\n' <"$ROOT/VERSION" 2>/dev/null)
[ -n "$version" ] || version=unknown
commit=unknown
top=$(git -C "$ROOT" rev-parse --show-toplevel 2>/dev/null) &&
    [ "$(cd "$top" && pwd -P)" = "$ROOT" ] &&
    commit=$(git -C "$ROOT" rev-parse --short=12 HEAD 2>/dev/null) || commit=unknown
if [ "$commit" != unknown ] && ! git --no-optional-locks -C "$ROOT" diff --quiet HEAD -- 2>/dev/null; then
    commit=$commit-dirty
fi
case ${1:-} in
--version) echo "$version" ;;
--commit) echo "$commit" ;;
"") echo "$version (commit $commit)" ;;
*) echo "usage: $0 [--version | --commit]" >&2; exit 2 ;;
esac
