#!/bin/sh
# mbedTLS's source for the Cortex-M builds (TestMCUConformance, TestMCUSize,
# bench/ecdsa): Debian bookworm's mbedtls 2.28.3, the version of the host's
# libmbedcrypto, whose source Debian ships only as a source package.
#
#   mbedtls.sh path    print the directory the source is (or would be) in
#   mbedtls.sh fetch   make it available there: download the orig tarball
#                      from Debian's pool once, check its SHA-256, unpack
#
# The tarball is pinned by the SHA-256 that bookworm's Sources index lists for
# it (the index is covered by the archive's signed InRelease; checked when the
# pin was set): no deb-src line, no apt-get update, no root. When the pool
# drops this version, snapshot.debian.org still serves it (by the
# tarball's SHA-1, as the .dsc lists it; not reachable from every network). The cache is
# outside the clone, ${XDG_CACHE_HOME:-$HOME/.cache}/edgefence/mbedtls-2.28.3,
# and a fetch with the source in place does nothing.
set -eu
VERSION=2.28.3
SHA256=3b4953aa55a681e084d31892d9904cc5328d6b4958ea57b90ae4b4f94ae69a8d
TARBALL=mbedtls_$VERSION.orig.tar.gz
URLS="http://deb.debian.org/debian/pool/main/m/mbedtls/$TARBALL
https://snapshot.debian.org/file/d46536829f736d1cb1507e15d3a42ea6994e6c75"
cache=${XDG_CACHE_HOME:-$HOME/.cache}/edgefence
dir=$cache/mbedtls-$VERSION
stamp=$dir/.edgefence-sha256

case "${1:-}" in
path)
	echo "$dir"
	exit 0
	;;
fetch) ;;
*)
	echo "usage: $0 path|fetch" >&2
	exit 2
	;;
esac

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$SHA256" ]; then
	exit 0
fi
mkdir -p "$cache"
tmp=$(mktemp -d "$cache/.mbedtls-XXXXXX")
trap 'rm -rf "$tmp"' EXIT
got=
for url in $URLS; do
	if curl -fsS --retry 2 -m 300 -o "$tmp/$TARBALL" "$url"; then
		got=$url
		break
	fi
	echo "mbedtls.sh: $url: download failed" >&2
done
if [ -z "$got" ]; then
	echo "mbedtls.sh: no mbedTLS $VERSION source (offline?): the Cortex-M signed vectors are skipped (they fail under CI=true)" >&2
	exit 1
fi
if [ "$(sha256sum "$tmp/$TARBALL" | cut -d' ' -f1)" != "$SHA256" ]; then
	echo "mbedtls.sh: $got: SHA-256 mismatch, want $SHA256" >&2
	exit 1
fi
mkdir "$tmp/src"
tar xzf "$tmp/$TARBALL" -C "$tmp/src" --strip-components=1
echo "$SHA256" >"$tmp/src/.edgefence-sha256"
rm -rf "$dir"
mv "$tmp/src" "$dir"
echo "mbedTLS $VERSION source in $dir"
