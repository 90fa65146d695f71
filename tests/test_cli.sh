#!/bin/sh
# malleus-train's command line: a short good run writes the metrics it
# promises; every bad input (flags, model config, data, snapshot) gives a
# message naming the problem, a nonzero exit, and overwrites nothing.
set -u
TRAIN="${top_builddir:-.}/malleus-train"
: "${top_srcdir:=$(dirname "$0")/..}"
W=$(mktemp -d /tmp/malleus-test-cli-XXXXXX)
trap 'rm -rf "$W"' EXIT
fails=0

# expect CODE PATTERN -- ARGS...: exit status CODE ("nz" = any nonzero) and
# PATTERN (grep -E) in stderr.
expect() {
    code=$1 pat=$2; shift 3
    "$TRAIN" "$@" >"$W/out" 2>"$W/err"; rc=$?
    ok=1
    if [ "$code" = nz ]; then [ $rc -ne 0 ] || ok=0; else [ $rc -eq "$code" ] || ok=0; fi
    grep -Eq -- "$pat" "$W/err" || ok=0
    if [ $ok = 1 ]; then
        echo "ok: $* -> $rc: $(head -1 "$W/err")"
    else
        echo "FAIL: $* -> exit $rc, wanted $code and /$pat/; stderr:"; cat "$W/err"
        fails=$((fails + 1))
    fi
}

# A good short run.
"$TRAIN" --model tiny --steps 3 --global-batch 4 --micro-batch 2 --metrics "$W/m.jsonl" \
    --snapshot-dir "$W/snap" >"$W/out" 2>&1 || { cat "$W/out"; echo "FAIL: good run"; exit 1; }
grep -q 'step 3/3' "$W/out" || { echo "FAIL: no step line"; fails=$((fails + 1)); }
grep -q 'parameters' "$W/out" || { echo "FAIL: no start-up table"; fails=$((fails + 1)); }
[ "$(wc -l <"$W/m.jsonl")" -eq 3 ] || { echo "FAIL: metrics lines"; fails=$((fails + 1)); }
for k in step loss lr tokens_per_s step_ms; do
    grep -q "\"$k\":" "$W/m.jsonl" || { echo "FAIL: metrics lack $k"; fails=$((fails + 1)); }
done
"$TRAIN" --help >"$W/out" 2>&1 && grep -q -- '--snapshot-dir' "$W/out" ||
    { echo "FAIL: --help"; fails=$((fails + 1)); }

printf '{"vocab": 256, "d_model": 64, "n_layers": 4, "n_heads": 8, "ffn_hidden": 128, "seq_len": 32,}' >"$W/badjson.json"
printf '{"vocab": 256, "d_model": 64, "n_layers": 4, "n_heads": 8, "ffn_hidden": 128, "seq_len": 32, "dmodel": 3}' >"$W/unknown.json"
printf '{"vocab": 256, "d_model": 60, "n_layers": 4, "n_heads": 8, "ffn_hidden": 128, "seq_len": 32}' >"$W/indiv.json"
printf '{"vocab": 100, "d_model": 64, "n_layers": 4, "n_heads": 8, "ffn_hidden": 128, "seq_len": 32}' >"$W/v100.json"
printf '{"vocab": 256, "d_model": 64, "n_layers": 3, "n_heads": 8, "ffn_hidden": 128, "seq_len": 32}' >"$W/l3.json"
printf 'not a token file at all, just some text.....' >"$W/bad.bin"
# grouped-query attention, tied embeddings, rotary scaling: fields checked
base='"vocab": 256, "d_model": 64, "n_layers": 4, "n_heads": 8, "ffn_hidden": 128, "seq_len": 32'
printf '{%s, "n_kv_heads": 3}' "$base" >"$W/kv3.json"
printf '{%s, "n_kv_heads": 16}' "$base" >"$W/kv16.json"
printf '{%s, "tie_embeddings": 1}' "$base" >"$W/tie1.json"
printf '{%s, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}}' "$base" >"$W/yarn.json"
printf '{%s, "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 4.0, "high_freq_factor": 1.0, "original_max_position_embeddings": 8192}}' "$base" >"$W/lohi.json"
printf '{%s, "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}}' "$base" >"$W/noorig.json"
printf '{%s, "rope_scaling": {"rope_type": "llama3", "factr": 8.0}}' "$base" >"$W/typo.json"
printf '{%s, "n_kv_heads": 2, "tie_embeddings": true, "rope_theta": 500000.0, "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}' "$base" >"$W/gqa.json"

expect 2 "unknown option '--frobnicate'" -- --frobnicate
expect 2 "--steps expects an integer" -- --steps abc
expect 2 "--lr expects a number" -- --lr -1
expect 2 "needs a value" -- --model
expect 2 "neither a preset" -- --model nosuch
expect 2 "invalid JSON" -- --model "$W/badjson.json"
expect 2 'unknown field "dmodel"' -- --model "$W/unknown.json"
expect 2 "not divisible by n_heads" -- --model "$W/indiv.json"
expect 2 "n_heads 8 is not divisible by n_kv_heads 3" -- --model "$W/kv3.json"
expect 2 "n_kv_heads must be in \[1, 8\]" -- --model "$W/kv16.json"
expect 2 '"tie_embeddings" must be true or false' -- --model "$W/tie1.json"
expect 2 'rope_type must be "llama3"' -- --model "$W/yarn.json"
expect 2 "0 < low_freq_factor < high_freq_factor" -- --model "$W/lohi.json"
expect 2 'missing field "original_max_position_embeddings"' -- --model "$W/noorig.json"
expect 2 'unknown field "rope_scaling.factr"' -- --model "$W/typo.json"
"$TRAIN" --model "$W/gqa.json" --steps 1 --global-batch 2 --micro-batch 2 >"$W/out" 2>&1 &&
    grep -q 'kv heads / tied emb. |    2 / yes' "$W/out" && grep -q 'llama3: factor 8' "$W/out" ||
    { cat "$W/out"; echo "FAIL: a grouped-query, tied, scaled config"; fails=$((fails + 1)); }
expect nz "$W/missing.bin" -- --data "$W/missing.bin" --steps 1
expect nz "$W/bad.bin" -- --data "$W/bad.bin" --data-format llmc --steps 1
expect 2 "not a multiple of --micro-batch" -- --global-batch 6 --micro-batch 4
expect 2 "vocabulary of 100" -- --model "$W/v100.json" --steps 1
expect 2 "--resume needs --snapshot-dir" -- --resume
expect 2 "--snapshot-async needs --snapshot-dir" -- --snapshot-async
expect 2 "--inject expects RANK:FACTOR" -- --inject 3
expect 2 "--inject expects RANK:FACTOR" -- --inject 3:0.5
expect 2 "--inject expects RANK:FACTOR" -- --inject 3:2:10:5
expect 2 "--inject names rank 5 but the job has 1 ranks" -- --inject 5:2 --steps 1
expect 2 "--inject-link expects A:B:FACTOR" -- --inject-link 3:3:2
expect 2 "--inject-link expects A:B:FACTOR" -- --inject-link 0:1:0.5
expect 2 "--inject-link names rank 4 but the job has 1 ranks" -- --inject-link 0:4:2 --steps 1
# --inject-mode: sleep or gpu; gpu slows a GPU for real, so the CPU backends
# (which have no slowdown in the kernel table) refuse it as a usage error
expect 2 "--inject-mode must be sleep or gpu" -- --inject-mode fast
expect 2 "--inject-mode gpu slows a GPU for real, and device 'cpu' has none" -- \
    --inject 0:3 --inject-mode gpu --device cpu --steps 1
expect 2 "--inject-mode gpu slows a GPU for real, and device 'cpu-opaque' has none" -- \
    --inject-mode gpu --device cpu-opaque --steps 1
"$TRAIN" --help >"$W/out" 2>&1 && grep -q -- '--inject-mode MODE' "$W/out" ||
    { echo "FAIL: --help lacks --inject-mode"; fails=$((fails + 1)); }
# sleep stays the default and is accepted explicitly
"$TRAIN" --model tiny --steps 2 --global-batch 4 --micro-batch 2 --inject 0:2:1 \
    --inject-mode sleep --quiet >"$W/out" 2>&1 ||
    { cat "$W/out"; echo "FAIL: --inject-mode sleep"; fails=$((fails + 1)); }
expect 2 "--adapt must be off, restart or online" -- --adapt sometimes
expect 2 "--gap expects a number" -- --gap -1
expect 2 "needs a planner profile" -- --adapt online --planner-profile "$W/nope.json" --steps 1
expect 2 "--planner-time-limit expects a number" -- --planner-time-limit -5
echo keep >"$W/prof.json"
expect 2 "TP size 3" -- --profile "$W/prof.json" --tp 3
[ "$(cat "$W/prof.json")" = keep ] || { echo "FAIL: a failed --profile overwrote its file"; fails=$((fails + 1)); }
expect 2 "either --plan or --dp" -- --plan "$top_srcdir/tests/plans/dp8.json" --dp 2
expect 2 "ranks" -- --plan "$top_srcdir/tests/plans/dp8.json" --steps 1
expect 2 "disagrees with the plan" -- --plan "$top_srcdir/tests/plans/dp8.json" --micro-batch 4
expect 2 "--dp 2 x --tp 1 x --pp 1 = 2 ranks, but the job has 1" -- --dp 2 --steps 1
# Backends by name: unknown, not built into this build, listed in --help,
# shown in the start-up table.
expect 2 "unknown device 'tpu': this build has (cuda, )?cpu, cpu-opaque" -- --device tpu --steps 1
# --device cuda: not compiled in, or (a CUDA build) no GPU here; where a GPU
# is present this run trains, and tests/test_cuda_train.sh covers it
if ! grep -q '^#define HAVE_CUDA 1' "$top_builddir/malconf.h"; then
    expect 2 "device 'cuda' is not compiled into this build" -- --device cuda --steps 1
elif ! "$TRAIN" --device cuda --steps 0 >/dev/null 2>&1; then
    expect 2 "device 'cuda' cannot be used on this machine: .*GPU" -- --device cuda --steps 1
fi
expect 2 "unknown comm backend 'tcp'" -- --comm tcp --steps 1
# --comm nccl: not compiled in, or (an NCCL build) no GPU here, or not with
# the cpu device
if ! grep -q '^#define HAVE_NCCL 1' "$top_builddir/malconf.h"; then
    expect 2 "comm backend 'nccl' is not compiled into this build" -- --comm nccl --steps 1
elif ! "$TRAIN" --device cuda --comm nccl --steps 0 >/dev/null 2>&1; then
    expect 2 "comm backend 'nccl' cannot be used on this machine: .*NCCL moves GPU buffers" -- --comm nccl --steps 1
else
    expect 2 "comm backend 'nccl' moves buffers of the 'cuda' device, not of 'cpu'" -- --device cpu --comm nccl --steps 1
fi
if grep -q '^#define HAVE_NCCL 1' "$top_builddir/malconf.h"; then
    export MALLEUS_NCCL_TIMEOUT=soon
    expect 2 "MALLEUS_NCCL_TIMEOUT='soon' is not a number of seconds" -- --comm nccl --steps 1
    unset MALLEUS_NCCL_TIMEOUT
fi
expect 2 "unknown device 'tpu'" -- --device tpu --profile "$W/prof.json"
# bf16 on the CPU: bf16 storage, fp32 arithmetic (through the opaque backend:
# no host code reads the bf16 buffers as floats)
"$TRAIN" --device cpu-opaque --precision bf16 --comm mpi --steps 2 --global-batch 2 --micro-batch 2 >"$W/out" 2>&1 &&
    grep -Eq '^\| kernels / comm +\| cpu-opaque \(bf16\) +/ mpi' "$W/out" ||
    { cat "$W/out"; echo "FAIL: --device cpu-opaque --precision bf16 run or its start-up table"; fails=$((fails + 1)); }
"$TRAIN" --help | grep -Eq '(cuda, )?cpu, cpu-opaque in this build' || { echo "FAIL: --help lists no devices"; fails=$((fails + 1)); }
"$TRAIN" --device cpu-opaque --comm mpi --steps 1 --global-batch 2 --micro-batch 2 >"$W/out" 2>&1 &&
    grep -Eq '^\| kernels / comm +\| cpu-opaque \(fp32\) +/ mpi' "$W/out" ||
    { cat "$W/out"; echo "FAIL: --device cpu-opaque run or its start-up table"; fails=$((fails + 1)); }
printf '{"format": "malleus-plan/1", "micro_batch_size": 2, "pipelines": [{"micro_batches": 8, "stages": [{"ranks": [0], "layers": [0, 3]}]}], "suspended": []}' >"$W/short.json"
expect 2 "layers" -- --plan "$W/short.json" --steps 1
mkdir -p "$W/empty"
expect nz "$W/empty" -- --resume --snapshot-dir "$W/empty" --steps 5

# Resume refusals must leave the metrics file and snapshots untouched.
cp "$W/m.jsonl" "$W/m.before"
ls -R "$W/snap" >"$W/snap.before"
expect nz "n_layers: snapshot 4, this run 3" -- --model "$W/l3.json" --resume --snapshot-dir "$W/snap" --metrics "$W/m.jsonl" --steps 5
expect nz "seed: snapshot 1234, this run 99" -- --seed 99 --resume --global-batch 4 --micro-batch 2 --snapshot-dir "$W/snap" --metrics "$W/m.jsonl" --steps 5
cmp -s "$W/m.jsonl" "$W/m.before" || { echo "FAIL: metrics file changed by a refused run"; fails=$((fails + 1)); }
ls -R "$W/snap" | cmp -s - "$W/snap.before" || { echo "FAIL: snapshot dir changed by a refused run"; fails=$((fails + 1)); }

# An incomplete snapshot (no completion marker) is never loaded.
latest="$W/snap/$(cat "$W/snap/latest")"
rm -f "$latest/COMPLETE"
expect nz "COMPLETE|incomplete" -- --resume --global-batch 4 --micro-batch 2 --snapshot-dir "$W/snap" --steps 5

# Resuming the good run continues where it stopped and appends to the
# metrics (more steps than its run's: --override steps keeps its schedule).
cp -r "$W/snap" "$W/snap2"
"$TRAIN" --steps 3 --global-batch 4 --micro-batch 2 --snapshot-dir "$W/snap3" --metrics "$W/r.jsonl" >/dev/null 2>&1
"$TRAIN" --steps 5 --override steps --global-batch 4 --micro-batch 2 --snapshot-dir "$W/snap3" --metrics "$W/r.jsonl" --resume >"$W/out" 2>&1 ||
    { cat "$W/out"; echo "FAIL: resume"; fails=$((fails + 1)); }
[ "$(wc -l <"$W/r.jsonl")" -eq 5 ] || { echo "FAIL: resumed metrics should hold 5 lines"; fails=$((fails + 1)); }

echo "$fails failure(s)"
[ $fails -eq 0 ]
