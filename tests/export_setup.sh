# Sourced by tests/test_export.sh and tests/test_export_hf.sh: train the tiny
# model long enough that attention depends on positions (so a wrong q/k
# permutation shows in the loss), keep the snapshot of step K, and take
# malleus-train's loss for those parameters on step K's batch: the metrics
# line of step K+1 (its loss is computed before step K+1's update).
# And, for tiny (a byte-level vocabulary), malleus-sample's greedy
# continuation of PROMPT by NGREEDY tokens with the same parameters
# ($W/greedy), which the references must reproduce.
# Needs W (work directory), top_builddir, TAG (the test's name), and MODEL
# (tiny unless set: tiny-llama3 has grouped-query attention, tied
# embeddings and rope_theta 500000 with the llama3 scaling); the snapshots
# go to $W/snap$SUFFIX (SUFFIX may be empty); sets TRAIN, EXPORT, K, GB,
# SEED, LOSS, PROMPT, NGREEDY, SNAP.
TRAIN=$top_builddir/malleus-train
EXPORT=$top_builddir/malleus-export
for p in "$TRAIN" "$EXPORT" "$top_builddir/malleus-tokenize" "$top_builddir/malleus-sample"; do
    [ -x "$p" ] || { echo "$TAG: $p not built"; exit 99; }
done
K=60
GB=16
SEED=1234
i=0
while [ $i -lt 400 ]; do
    echo "Line $i: the $((i * 7 % 13)) quick brown foxes jump over $((i * i % 97)) lazy dogs; x=$((i * 31 % 1000))."
    i=$((i + 1))
done >"$W/text.txt"
"$top_builddir/malleus-tokenize" "$W/text.txt" "$W/tokens.bin" >/dev/null ||
    { echo "$TAG: tokenize failed"; exit 99; }
MODEL=${MODEL:-tiny}
SUFFIX=${SUFFIX:-}
SNAP=$W/snap$SUFFIX/step_000000$K
"$TRAIN" --model "$MODEL" --data "$W/tokens.bin" --seed $SEED --global-batch $GB --micro-batch 4 \
    --lr 3e-3 --steps $((K + 1)) --snapshot-every $K --snapshot-dir "$W/snap$SUFFIX" \
    --metrics "$W/m$SUFFIX.jsonl" --threads 1 --quiet >"$W/train.log" 2>&1 ||
    { cat "$W/train.log"; echo "$TAG: malleus-train failed"; exit 99; }
LOSS=$(sed -n "$((K + 1))p" "$W/m$SUFFIX.jsonl" | sed 's/.*"loss": \([^,]*\),.*/\1/')
[ -n "$LOSS" ] && [ -d "$SNAP" ] ||
    { echo "$TAG: no loss for step $((K + 1)) or no snapshot of step $K"; exit 99; }
PROMPT="Line 7: the "
NGREEDY=20 # prompt + new tokens = seq_len: Hugging Face never sees a position past it
# (a text prompt needs the byte-level vocabulary: 256 tokens)
if [ "$MODEL" = tiny ]; then
    "$top_builddir/malleus-sample" --temperature 0 --tokens $NGREEDY --prompt "$PROMPT" \
        --threads 1 "$SNAP" >"$W/greedy$SUFFIX" || { echo "$TAG: malleus-sample failed"; exit 99; }
fi
