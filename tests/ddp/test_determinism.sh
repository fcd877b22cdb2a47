#!/usr/bin/env bash
# The property no peer has: with the same seed and global batch (64), 1 process (--batch 16
# --accum 4), 2 processes (--batch 16 --accum 2) and 4 processes (--batch 16) produce
# bitwise-identical saved weights after 100 steps of BasicNet, dropout included.
set -euo pipefail
: "${TANDEM_BIN:?}" "${TANDEM_DATA:?}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
common=(--model basicnet --data "$TANDEM_DATA" --steps 100 --seed 7 --threads 1 --lr 1e-3)

"$TANDEM_BIN" train "${common[@]}" --batch 16 --accum 4 --save "$work/w1.safetensors" \
    >"$work/1.log" 2>&1 || { cat "$work/1.log"; exit 1; }
"$TANDEM_BIN" launch --standalone --nproc-per-node 2 -- \
    "$TANDEM_BIN" train "${common[@]}" --batch 16 --accum 2 --save "$work/w2.safetensors" \
    >"$work/2.log" 2>&1 || { cat "$work/2.log"; exit 1; }
"$TANDEM_BIN" launch --standalone --nproc-per-node 4 -- \
    "$TANDEM_BIN" train "${common[@]}" --batch 16 --save "$work/w4.safetensors" \
    >"$work/4.log" 2>&1 || { cat "$work/4.log"; exit 1; }

for n in 2 4; do
  if ! cmp "$work/w1.safetensors" "$work/w$n.safetensors"; then
    echo "FAIL: weights after 100 steps differ between 1 process and $n processes"
    tail -5 "$work/1.log" "$work/$n.log"
    exit 1
  fi
done
# Guard against a vacuous pass: training must have moved the weights away from the init.
"$TANDEM_BIN" train "${common[@]}" --steps 1 --batch 16 --accum 4 --save "$work/w0.safetensors" \
    >"$work/0.log" 2>&1 || { echo "FAIL: the 1-step run (the guard) failed: exit $?"; cat "$work/0.log"; exit 1; }
if cmp -s "$work/w0.safetensors" "$work/w1.safetensors"; then
  echo "FAIL: 100 steps produced the same weights as 1 step"; exit 1
fi
echo "1, 2 and 4 processes: bitwise-identical weights ($(stat -c %s "$work/w1.safetensors") bytes)"
