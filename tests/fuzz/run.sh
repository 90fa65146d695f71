#!/bin/sh
# Run libFuzzer harnesses for a bounded time each, from their committed seed
# corpus, and print one line per harness: executions, speed, inputs kept,
# result.  `make fuzz` calls it (tests/fuzz/local.mk).
#   sh tests/fuzz/run.sh SECONDS SRCDIR BINDIR NAME...
# Harness NAME is BINDIR/fuzz_NAME; it starts from SRCDIR/tests/fuzz/
# corpus/NAME and keeps what it finds new in work/NAME (under the current
# directory; the committed corpus is never written).  A crash, leak,
# sanitizer report, time-out or broken promise (the harness aborts) leaves
# its input as work/NAME-crash-* (or -leak-, -timeout-, -oom-) and makes the
# status 1; the other harnesses still run.
set -u
if [ $# -lt 4 ]; then
    echo "usage: $0 SECONDS SRCDIR BINDIR NAME..." >&2
    exit 99
fi
secs=$1 src=$2 bin=$3
shift 3
case $secs in
'' | *[!0-9]* | 0) echo "$0: SECONDS must be a positive integer (libFuzzer reads 0 as no limit)" >&2; exit 2 ;;
esac
mkdir -p work
status=0
printf '%-8s %12s %8s %7s  %s\n' harness executions exec/s inputs result
for name in "$@"; do
    h="$bin/fuzz_$name"
    [ -x "$h" ] || { echo "$0: no harness $h" >&2; exit 99; }
    mkdir -p "work/$name"
    log="work/$name.log"
    # An index.h5 is tens of KiB; the other inputs are small text files.
    case $name in index) max_len=65536 ;; *) max_len=8192 ;; esac
    # -rss_limit_mb / -malloc_limit_mb: a parser that allocates what an
    # input asks for is a finding, not a reason to take the machine's
    # memory.  -timeout: one input taking 10 s is a finding (a hang).
    "$h" -max_total_time="$secs" -print_final_stats=1 -rss_limit_mb=2048 \
        -malloc_limit_mb=1024 -max_len=$max_len -timeout=10 \
        -artifact_prefix="work/$name-" "work/$name" "$src/tests/fuzz/corpus/$name" \
        >"$log" 2>&1
    rc=$?
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    speed=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
    units=$(find "work/$name" -type f | wc -l)
    if [ $rc -eq 0 ]; then
        result=ok
    else
        status=1
        art=$(ls -t "work/$name"-* 2>/dev/null | grep -v '\.log$' | head -1)
        result="FOUND (status $rc): ${art:-no input saved}; see $log"
        grep -E "^==[0-9]+==ERROR|^SUMMARY|runtime error|deadly signal|ALARM" "$log" | head -5
    fi
    printf '%-8s %12s %8s %7s  %s\n' "$name" "${execs:-?}" "${speed:-?}" "$units" "$result"
done
exit $status
