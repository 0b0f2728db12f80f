#!/bin/sh
# debversion.sh VERSION — print VERSION (`git describe --tags --always
# --dirty` output, as the Makefile's $(VERSION)) as a Debian version.
#
#   v1.2.3                  -> 1.2.3
#   v1.2.3-rc1              -> 1.2.3~rc1             (sorts before 1.2.3)
#   v1.2.3-4-gabc1234       -> 1.2.3+git4.gabc1234   (sorts after 1.2.3)
#   v1.2.3-4-gabc1234-dirty -> 1.2.3+git4.gabc1234.dirty
#   abc1234 (no tag yet)    -> 0.0.0~gitabc1234      (sorts before any release)
#   dev, anything else      -> 0.0.0~dev             (characters outside [A-Za-z0-9.+~] become .)
#
# The result starts with a digit and has no '-' (there is no Debian
# revision), so dpkg accepts it. deploy/package_test.go checks the table.
set -eu
v=${1:-dev}
dirty=
case $v in *-dirty) dirty=.dirty; v=${v%-dirty} ;; esac
case $v in
*[!0-9a-f]*|'' | ?????? | ????? | ???? | ??? | ?? | ?)
	;;
*)	# a bare abbreviated commit hash (7+ hex digits): no tag yet. Even
	# one made only of digits is a hash, not a version.
	v=0.0.0~git$v$dirty
	;;
esac
case $v in
0.0.0~git*) ;;
[vV][0-9]*|[0-9]*)
	v=${v#[vV]}
	# -N-gSHA: commits since the tag.
	since=$(printf '%s\n' "$v" | sed -n 's/^.*-\([0-9][0-9]*\)-\(g[0-9a-f][0-9a-f]*\)$/+git\1.\2/p')
	[ -n "$since" ] && v=$(printf '%s\n' "$v" | sed 's/-[0-9][0-9]*-g[0-9a-f][0-9a-f]*$//')
	# What is left after the first '-' is a pre-release: ~ sorts it first.
	case $v in *-*) v=$(printf '%s\n' "$v" | sed 's/-/~/') ;; esac
	v=$v$since$dirty
	;;
*)	v=0.0.0~$v$dirty ;;
esac
printf '%s\n' "$v" | sed 's/[^A-Za-z0-9.+~]/./g'
