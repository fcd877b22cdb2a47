#!/usr/bin/env bash
# Issue 8's output-path and divergence failures, as they were seen, and what must hold now:
#   - `--save /dev/full` (as root) replaced the device with a regular file and exited 0: now the
#     path is refused before the first step, and the device is untouched;
#   - `--save` over a symlink replaced the link: now refused, naming the link's target;
#   - `--save DIR` and an unwritable `--checkpoint-dir` were found only after training: now
#     before the first step;
#   - `--lr 1e30` trained to NaN weights and exited 0: now the run stops at the first step whose
#     loss is not finite, exit 1, naming the step and the last good checkpoint;
#   - an allocation too large for memory ended in abort() (exit 134): now an error with the size.
set -euo pipefail
: "${TANDEM_BIN:?}" "${TANDEM_DATA:?}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
common=(train --model mlp7 --data "$TANDEM_DATA" --batch 32 --threads 1 --no-progress)

expect_refused() { # what pattern args... : exit 2, the pattern in the message, no step trained
  local what=$1 pattern=$2; shift 2
  set +e
  "$TANDEM_BIN" "${common[@]}" --steps 100000 "$@" >"$work/out" 2>&1
  local rc=$?
  set -e
  if [ $rc -eq 0 ] || ! grep -q -- "$pattern" "$work/out" || grep -q "step 1/" "$work/out"; then
    echo "FAIL: $what: exit $rc, expected a refusal matching '$pattern' before the first step"
    cat "$work/out"; exit 1
  fi
  echo "ok: $what: $(grep -m1 -o "error: .*" "$work/out" | cut -c1-150)"
}

if [ "$(id -u)" = 0 ] && [ -c /dev/full ]; then
  expect_refused "--save /dev/full" "not a regular file" --save /dev/full
  [ -c /dev/full ] || { echo "FAIL: /dev/full is no longer a character device"; exit 1; }
fi
mkdir "$work/adir"
expect_refused "--save a directory" "is a directory" --save "$work/adir"
echo keep >"$work/target"
ln -s "$work/target" "$work/link"
expect_refused "--save a symlink" "symbolic link" --save "$work/link"
[ -L "$work/link" ] && [ "$(cat "$work/target")" = keep ] \
  || { echo "FAIL: the symlink or its target changed"; exit 1; }
expect_refused "--save in a missing directory" "does not exist" --save "$work/nodir/w.safetensors"
echo x >"$work/afile"
expect_refused "--checkpoint-dir under a file" "checkpoint" --checkpoint-dir "$work/afile/ck"

# divergence: the loss becomes inf/nan within a few steps at lr 1e30
set +e
"$TANDEM_BIN" "${common[@]}" --steps 200 --lr 1e30 --checkpoint-dir "$work/ck" \
  --checkpoint-every 1 --save "$work/nan.safetensors" >"$work/nan.out" 2>&1
rc=$?
set -e
if [ $rc -ne 1 ] || ! grep -q "loss is not finite" "$work/nan.out"; then
  echo "FAIL: --lr 1e30: exit $rc, expected 1 and 'loss is not finite'"; cat "$work/nan.out"; exit 1
fi
[ ! -e "$work/nan.safetensors" ] || { echo "FAIL: diverged weights were saved"; exit 1; }
echo "ok: --lr 1e30: $(grep -m1 -o 'error: .*' "$work/nan.out" | cut -c1-200)"
# the checkpoint it names is a good one: the resume loads it
last=$(grep -o 'last good checkpoint [^ ;]*' "$work/nan.out" | awk '{print $4}')
if [ -n "$last" ] && [ "$last" != "none" ]; then
  [ -f "$last" ] || { echo "FAIL: the named checkpoint $last does not exist"; exit 1; }
fi
# a batch whose activations cannot fit: an error naming the size, not abort() (134)
set +e
"$TANDEM_BIN" "${common[@]}" --model basicnet --steps 1 --batch 1048576 >"$work/mem.out" 2>&1
rc=$?
set -e
if [ $rc -eq 0 ] || [ $rc -ge 128 ] || ! grep -q "GiB for batches of 1048576" "$work/mem.out"; then
  echo "FAIL: --batch 1048576: exit $rc"; cat "$work/mem.out"; exit 1
fi
echo "ok: --batch 1048576: $(grep -m1 -o 'error: .*' "$work/mem.out" | cut -c1-120)"
echo "output paths are checked before training; divergence and oversized batches stop cleanly"
