#!/bin/sh
# No circle between the library's files: if a.c calls (or reads) a name
# that b.c defines, and b.c -- directly or through others -- one that a.c
# defines, the two are one facility in two rooms, or a helper sits in the
# wrong one.  Read from the built objects (nm), so a call through a header
# counts and a comment does not.  Fails naming every file of each circle
# and, for each arrow inside it, the names it uses.
: "${top_srcdir:=$(dirname "$0")/..}"
: "${top_builddir:=.}"
cd "$top_builddir" || exit 99
# the library's objects: those whose source is still in the tree (a build
# tree may keep the object of a file that has since been removed)
objs=$(find base kernels comm src ckpt replan train -name '*.o' 2>/dev/null | sort |
    while read -r o; do
        for ext in c cu; do [ -f "$top_srcdir/${o%.o}.$ext" ] && echo "$o" && break; done
    done)
[ -n "$objs" ] || { echo "no objects under $(pwd): build first"; exit 99; }
T=$(mktemp -d) || exit 99
trap 'rm -rf "$T"' EXIT
for o in $objs; do
    f=${o%.o}
    nm --defined-only -g "$o" 2>/dev/null | awk -v f="$f" 'NF == 3 { print $3, f }' >>"$T/defs"
    nm -u "$o" 2>/dev/null | awk -v f="$f" '{ print $NF, f }' >>"$T/uses"
done
# edges "user definer symbol" (a name defined twice would be a link error)
sort -k1,1 "$T/defs" >"$T/defs.s"
sort -k1,1 "$T/uses" >"$T/uses.s"
join "$T/uses.s" "$T/defs.s" | awk '$2 != $3 { print $2, $3, $1 }' >"$T/edges"
awk '{ print $1, $2 }' "$T/edges" | sort -u >"$T/pairs"
# tsort names the files of every loop it meets on stderr
tsort "$T/pairs" >/dev/null 2>"$T/loops"
if [ -s "$T/loops" ]; then
    echo "FAIL: files that call each other in a circle:"
    sed -n "s/^tsort: [^:]*: input contains a loop:/a circle:/p; s/^tsort: \([^:]*\)$/    \1/p" "$T/loops"
    # each arrow between two files that tsort named, with its names
    grep -v 'input contains a loop' "$T/loops" | sed 's/^tsort: //' | sort -u >"$T/inloop"
    awk 'NR == FNR { in_[$1] = 1; next } ($1 in in_) && ($2 in in_) { a[$1 " -> " $2] = a[$1 " -> " $2] " " $3 }
         END { for (k in a) print "  " k ":" a[k] }' "$T/inloop" "$T/edges" | sort
    exit 1
fi
echo "PASS: $(echo "$objs" | wc -l) objects, $(wc -l <"$T/pairs") file-to-file arrows, no circle"
