# Sourced by tests/test_export.sh and tests/test_export_hf.sh: train the tiny
# model long enough that attention depends on positions (so a wrong q/k
# permutation shows in the loss), keep the snapshot of step K, and take
# malleus-train's loss for those parameters on step K's batch: the metrics
# line of step K+1 (its loss is computed before step K+1's update).
# And malleus-sample's greedy continuation of PROMPT by NGREEDY tokens with
# the same parameters ($W/greedy), which the references must reproduce.
# Needs W (work directory), top_builddir, TAG (the test's name); sets
# TRAIN, EXPORT, K, GB, SEED, LOSS, PROMPT, NGREEDY.
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
"$TRAIN" --model tiny --data "$W/tokens.bin" --seed $SEED --global-batch $GB --micro-batch 4 \
    --lr 3e-3 --steps $((K + 1)) --snapshot-every $K --snapshot-dir "$W/snap" \
    --metrics "$W/m.jsonl" --threads 1 --quiet >"$W/train.log" 2>&1 ||
    { cat "$W/train.log"; echo "$TAG: malleus-train failed"; exit 99; }
LOSS=$(sed -n "$((K + 1))p" "$W/m.jsonl" | sed 's/.*"loss": \([^,]*\),.*/\1/')
[ -n "$LOSS" ] && [ -d "$W/snap/step_000000$K" ] ||
    { echo "$TAG: no loss for step $((K + 1)) or no snapshot of step $K"; exit 99; }
PROMPT="Line 7: the "
NGREEDY=20 # prompt + new tokens = seq_len: Hugging Face never sees a position past it
"$top_builddir/malleus-sample" --temperature 0 --tokens $NGREEDY --prompt "$PROMPT" --threads 1 \
    "$W/snap/step_000000$K" >"$W/greedy" || { echo "$TAG: malleus-sample failed"; exit 99; }
