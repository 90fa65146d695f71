#!/bin/sh
# Test for malleus-tokenize: llm.c and raw16 outputs have the right size,
# header and token values (decoded with od, independently of Malleus), and
# bad usage fails with a message while leaving no output file behind.

top_builddir=${top_builddir:-.}
tool=$top_builddir/malleus-tokenize
if [ ! -x "$tool" ]; then
    echo "test_tokenize: $tool not built" >&2
    exit 99
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/test_tokenize.XXXXXX") || exit 99
trap 'rm -rf "$work"' EXIT

fail() {
    echo "test_tokenize: FAIL: $*" >&2
    exit 1
}

size() { wc -c < "$1" | tr -d ' '; }

# One value per line, decimal: bytes (u1) or little-endian uint16 (u2).
bytes_of() { od -An -v -tu1 "$1" | tr -s ' ' '\n' | sed '/^$/d'; }
u16_of() { od -An -v -tu2 --endian=little -j "$2" "$1" | tr -s ' ' '\n' | sed '/^$/d'; }

# Input: some text plus every byte value 0..255 (bytes >= 128 must become
# tokens 128..255, not sign-extended).
printf 'The cat sat on the mat.\nSeven plus five is twelve.\n' > "$work/in.txt"
n_text=$(size "$work/in.txt")
i=0
while [ $i -lt 256 ]; do
    printf "\\$(printf %03o $i)" >> "$work/in.txt"
    i=$((i + 1))
done
n=$(size "$work/in.txt")
[ "$n" -eq $((n_text + 256)) ] || fail "test input has $n bytes, expected $((n_text + 256)) (printf broken?)"
bytes_of "$work/in.txt" > "$work/in.dec"

# llm.c format (the default).
out=$("$tool" "$work/in.txt" "$work/a.bin") || fail "llmc run failed"
echo "$out" | grep -q "wrote $n tokens" || fail "summary does not say '$n tokens': $out"
echo "$out" | grep -q "llmc" || fail "summary does not name the format: $out"
[ "$(size "$work/a.bin")" -eq $((1024 + 2 * n)) ] || fail "llmc size $(size "$work/a.bin")"
hdr=$(od -An -v -tu4 --endian=little -N 12 "$work/a.bin" | tr -s ' ' ' ' | sed 's/^ //; s/ $//')
[ "$hdr" = "20240520 1 $n" ] || fail "llmc header is '$hdr', want '20240520 1 $n'"
zeros=$(od -An -v -tu4 -j 12 -N 1012 "$work/a.bin" | tr -s ' ' '\n' | sed '/^$/d' | grep -cv '^0$')
[ "$zeros" -eq 0 ] || fail "llmc header has $zeros nonzero reserved ints"
u16_of "$work/a.bin" 1024 > "$work/a.dec"
cmp -s "$work/in.dec" "$work/a.dec" || fail "llmc tokens differ from the input bytes"

# raw16 format, both option spellings.
"$tool" --format raw16 "$work/in.txt" "$work/b.bin" > /dev/null || fail "raw16 run failed"
"$tool" -f raw16 "$work/in.txt" "$work/c.bin" > /dev/null || fail "-f raw16 run failed"
[ "$(size "$work/b.bin")" -eq $((2 * n)) ] || fail "raw16 size $(size "$work/b.bin")"
u16_of "$work/b.bin" 0 > "$work/b.dec"
cmp -s "$work/in.dec" "$work/b.dec" || fail "raw16 tokens differ from the input bytes"
cmp -s "$work/b.bin" "$work/c.bin" || fail "--format and -f outputs differ"

# Overwriting an existing output replaces it.
"$tool" --format llmc "$work/in.txt" "$work/b.bin" > /dev/null || fail "overwrite failed"
[ "$(size "$work/b.bin")" -eq $((1024 + 2 * n)) ] || fail "overwrite did not replace the file"

# The built-in corpus: llm.c file of 1-2 MB tokens, deterministic.
out=$("$tool" --default "$work/d.bin") || fail "--default run failed"
"$tool" --default "$work/d2.bin" > /dev/null || fail "second --default run failed"
cmp -s "$work/d.bin" "$work/d2.bin" || fail "--default output is not deterministic"
nd=$(od -An -v -tu4 --endian=little -j 8 -N 4 "$work/d.bin" | tr -d ' ')
[ "$nd" -ge 1000000 ] && [ "$nd" -le 2000000 ] || fail "built-in corpus has $nd tokens"
[ "$(size "$work/d.bin")" -eq $((1024 + 2 * nd)) ] || fail "built-in corpus file size"
echo "$out" | grep -q "wrote $nd tokens" || fail "--default summary: $out"

"$tool" --help | grep -q "Usage: malleus-tokenize" || fail "--help prints no usage"
"$tool" --version | grep -q "malleus" || fail "--version prints no version"

# Bad usage: nonzero exit, a message on stderr, and no output file.
# Each case: expected-message-fragment, then the arguments.
bad() {
    want=$1
    shift
    rm -f "$work/err"
    if "$tool" "$@" > /dev/null 2> "$work/err"; then
        fail "'$*' succeeded"
    fi
    [ -s "$work/err" ] || fail "'$*' printed no message"
    grep -q -- "$want" "$work/err" || fail "'$*' message lacks '$want': $(cat "$work/err")"
    [ ! -e "$work/x.bin" ] || fail "'$*' left $work/x.bin behind"
}
bad "unrecognized option" --frobnicate "$work/in.txt" "$work/x.bin"
bad "unknown output format" --format gpt2 "$work/in.txt" "$work/x.bin"
bad "unknown output format" --format auto "$work/in.txt" "$work/x.bin"
bad "expected INPUT.txt and OUTPUT.bin" "$work/in.txt"
bad "expected INPUT.txt and OUTPUT.bin"
bad "expected INPUT.txt and OUTPUT.bin" "$work/in.txt" "$work/x.bin" extra
bad "takes only OUTPUT.bin" --default "$work/in.txt" "$work/x.bin"
bad "missing.txt does not exist" "$work/missing.txt" "$work/x.bin"
: > "$work/empty.txt"
bad "empty.txt is empty" "$work/empty.txt" "$work/x.bin"
bad "nodir/x.bin" "$work/in.txt" "$work/nodir/x.bin"
[ ! -e "$work/nodir" ] || fail "unwritable output created $work/nodir"

# A failing run leaves an existing output untouched.
cp "$work/a.bin" "$work/keep.bin"
if "$tool" "$work/missing.txt" "$work/a.bin" 2> /dev/null; then fail "missing input succeeded"; fi
cmp -s "$work/a.bin" "$work/keep.bin" || fail "failing run modified the existing output"
ls "$work" | grep -q '\.tmp\.' && fail "temporary files left in $work"

echo "test_tokenize: ok ($n bytes round-tripped in both formats, built-in corpus $nd tokens)"
exit 0
