#!/usr/bin/env bash
# build-deb.sh BUILD VERSION COMMIT (`make deb`): a Debian package of what `make install
# PREFIX=/usr` installs (the library, pinshim, pinshim-ab, pinshim-merge, pinshim-settings and
# the documentation), built with dpkg-deb into BUILD/pinshim_VERSION_ARCH.deb.
set -euo pipefail
BUILD=${1:?usage: build-deb.sh BUILD VERSION COMMIT}
VERSION=${2:?usage: build-deb.sh BUILD VERSION COMMIT}
COMMIT=${3:-unknown}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
case $VERSION in [0-9]*) ;; *) echo "build-deb: VERSION '$VERSION' does not start with a digit" >&2; exit 1 ;; esac
ARCH=$(dpkg --print-architecture)
STAGE=$BUILD/deb/root
DEB=$BUILD/pinshim_${VERSION}_${ARCH}.deb

rm -rf "$BUILD/deb"
${MAKE:-make} --no-print-directory -s install BUILD="$BUILD" DESTDIR="$STAGE" PREFIX=/usr
mkdir -p "$STAGE/DEBIAN"
size=$(du -sk --exclude=DEBIAN "$STAGE" | cut -f1)
sed -e "s/@VERSION@/$VERSION/" -e "s/@ARCH@/$ARCH/" -e "s/@SIZE@/$size/" -e "s/@COMMIT@/$COMMIT/" \
    packaging/debian/control.in >"$STAGE/DEBIAN/control"
dpkg-deb --root-owner-group -Zxz --build "$STAGE" "$DEB" >/dev/null
echo "$DEB"
