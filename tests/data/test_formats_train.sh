#!/usr/bin/env bash
# data: every format `tandem train --data` reads, end to end. One small data set (400 of
# scikit-learn's 8x8 digits, tests/data/make_formats.py) is written as IDX, an image folder of
# PNGs, an image folder of JPEGs, a CSV pair, a .npy pair, .npz and safetensors (by hand), and
# the mlp preset trains 12 steps on each with 1, 2 and 4 workers at the same global batch
# (--batch 8 with --accum 4, 2 and 1): past the partial last step of epoch 1 (330 = 10 x 32 + 10)
# into epoch 2. Asserted, with cmp on the --save files:
#   - for every format, 1, 2 and 4 workers give bitwise-identical weights;
#   - formats holding the same values give the same bits: the float32 table as CSV, .npy pair,
#     .npz and safetensors; the uint8 images as IDX, PNG folder, .npz and safetensors (uint8);
#     the JPEG folder and a .npz of what Pillow's libjpeg decodes from it;
#   - and it is not vacuous: the JPEG weights differ from the PNG ones (JPEG is lossy), the table
#     weights from the image ones (per-feature vs per-channel normalisation), 12 steps from 1;
#   - --data-format csv reads a CSV named .txt to the same bits;
#   - a BatchNorm spec (no `input:`, `out: outputs`) gives the same bits with 1, 2 and 4 workers;
#   - errors: a CSV with an empty field names its line, a Fortran-order .npy is refused saying
#     so, and a --data of an unknown extension names the formats that are read.
set -euo pipefail
: "${TANDEM_BIN:?TANDEM_BIN must name the tandem binary}"
py=${PYTHON:-/usr/bin/python3}
here=$(cd "$(dirname "$0")" && pwd)
if ! "$py" -c 'import numpy, sklearn, PIL' 2>/dev/null; then
  echo "SKIP: $py lacks numpy, scikit-learn or Pillow (Debian: python3-sklearn python3-pil)"
  exit 77
fi
work=$(mktemp -d /tmp/tandem-formats-XXXXXX)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
"$py" "$here/make_formats.py" "$work/d"
d=$work/d

common=(--steps 12 --batch 8 --seed 3 --threads 1 --lr 1e-2 --no-progress --no-eval-every-epoch)

# train NAME WORKERS ARGS...: trains, saves $work/NAME.wWORKERS.safetensors; the log on failure
train() {
  local name=$1 w=$2
  shift 2
  local launch=()
  [ "$w" -gt 1 ] && launch=(--nproc-per-node "$w")
  if ! "$TANDEM_BIN" train "${common[@]}" --accum $((4 / w)) "${launch[@]}" "$@" \
       --save "$work/$name.w$w.safetensors" > "$work/$name.w$w.log" 2>&1; then
    cat "$work/$name.w$w.log" >&2
    fail "$name with $w worker(s): tandem train $* exited non-zero"
  fi
}
same() { # A B WHAT
  cmp -s "$work/$1.safetensors" "$work/$2.safetensors" ||
    fail "$3: $1 and $2 saved different weights ($(cmp "$work/$1.safetensors" "$work/$2.safetensors" 2>&1 | head -1))"
}
differ() { # A B WHAT
  if cmp -s "$work/$1.safetensors" "$work/$2.safetensors"; then fail "$3: $1 and $2 are identical"; fi
}

mlp=(--model mlp)
declare -A args=(
  [csv]="--data $d/train.csv --val-data $d/test.csv --target target"
  [npy]="--data $d/x_train.npy,$d/y_train.npy --val-data $d/x_test.npy,$d/y_test.npy"
  [npz]="--data $d/f32.npz"
  [safetensors]="--data $d/f32.safetensors"
  [idx]="--data $d/idx"
  [png]="--data $d/png"
  [npz_u8]="--data $d/u8.npz"
  [safetensors_u8]="--data $d/u8.safetensors"
  [jpeg]="--data $d/jpeg"
  [jpeg_npz]="--data $d/jpeg.npz"
)
every=(csv npy npz safetensors idx png npz_u8 safetensors_u8 jpeg)
for f in "${every[@]}"; do
  read -ra a <<< "${args[$f]}"
  for w in 1 2 4; do train "$f" "$w" "${mlp[@]}" "${a[@]}"; done
  same "$f.w1" "$f.w2" "$f, 1 vs 2 workers"
  same "$f.w1" "$f.w4" "$f, 1 vs 4 workers"
done
read -ra a <<< "${args[jpeg_npz]}"
train jpeg_npz 1 "${mlp[@]}" "${a[@]}"
echo "every format: 1, 2 and 4 workers bitwise identical"

for f in npy npz safetensors; do same csv.w1 "$f.w1" "float32 table, csv vs $f"; done
for f in png npz_u8 safetensors_u8; do same idx.w1 "$f.w1" "uint8 images, idx vs $f"; done
same jpeg.w1 jpeg_npz.w1 "JPEG folder vs the .npz of its decoded pixels"
# --data-format names the format where the name does not: the same CSV as .txt
cp "$d/train.csv" "$d/train.txt"
cp "$d/test.csv" "$d/test.txt"
train csv_txt 1 "${mlp[@]}" --data "$d/train.txt" --val-data "$d/test.txt" --target target \
  --data-format csv
same csv.w1 csv_txt.w1 "--data-format csv on a .txt"
differ png.w1 jpeg.w1 "PNG vs JPEG (lossy: the values differ)"
differ csv.w1 png.w1 "table vs images (per-feature vs per-channel normalisation)"
read -ra a <<< "${args[csv]}"
"$TANDEM_BIN" train "${common[@]}" --steps 1 --accum 4 "${mlp[@]}" "${a[@]}" \
  --save "$work/csv.steps1.safetensors" > "$work/steps1.log" 2>&1 ||
  { cat "$work/steps1.log" >&2; fail "the 1-step run failed"; }
differ csv.w1 csv.steps1 "12 steps vs 1 step"
# the weights have the data's shapes: fc1 takes 64 features, the head gives 10 classes
"$py" - "$work/csv.w1.safetensors" <<'PY'
import json, struct, sys
with open(sys.argv[1], "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    h = json.loads(f.read(n))
shapes = {k: v["shape"] for k, v in h.items() if k != "__metadata__"}
ws = [s for k, s in sorted(shapes.items()) if k.endswith(".weight")]
assert ws[0] == [128, 64], f"first layer should be [128, 64], got {shapes}"
assert ws[-1] == [10, 128], f"head should be [10, 128], got {shapes}"
PY
echo "same values, same bits: csv = npy = npz = safetensors = csv as .txt with --data-format; idx = png = npz = safetensors (uint8); jpeg = its decoded npz"

# BatchNorm: batch statistics and running statistics must not depend on how the global batch
# splits over workers.
cat > "$work/bn.yaml" <<'YAML'
layers:
  - flatten
  - linear: {out: 32}
  - batchnorm
  - relu
  - linear: {out: outputs}
YAML
read -ra a <<< "${args[npz_u8]}"
for w in 1 2 4; do train bn "$w" --model "$work/bn.yaml" "${a[@]}"; done
same bn.w1 bn.w2 "BatchNorm, 1 vs 2 workers"
same bn.w1 bn.w4 "BatchNorm, 1 vs 4 workers"
# not vacuous: the running statistics are in the file and moved. 330 samples at a global batch
# of 32 is 10 full steps and a tail of 10 (micro-batches of 8 and 2, two empty, which carry no
# statistics), so 12 steps track 12 x 4 - 2 = 46 micro-batches.
"$py" - "$work/bn.w4.safetensors" <<'PY'
import json, struct, sys
import numpy as np
b = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])


def get(k, dt):
    lo, hi = h[k]["data_offsets"]
    return np.frombuffer(b[8 + n + lo:8 + n + hi], dt)


mean, var = get("bn1.running_mean", np.float32), get("bn1.running_var", np.float32)
tracked = int(get("bn1.num_batches_tracked", np.int64)[0])
assert tracked == 46, f"num_batches_tracked should be 46 (12 steps x 4 micro-batches - 2 empty), got {tracked}"
assert (mean != 0).any() and (var != 1).any(), f"running stats did not move: {mean[:4]} {var[:4]}"
PY
echo "BatchNorm spec: 1, 2 and 4 workers bitwise identical"

# Errors name the thing and exit non-zero (not a crash).
expect_error() { # WHAT PATTERN ARGS...
  local what=$1 pat=$2 rc=0
  shift 2
  "$TANDEM_BIN" train "${common[@]}" --model mlp "$@" > "$work/err.log" 2>&1 || rc=$?
  [ "$rc" -ne 0 ] || fail "$what: exit 0; output: $(cat "$work/err.log")"
  [ "$rc" -lt 128 ] || fail "$what: killed by a signal (exit $rc): $(cat "$work/err.log")"
  grep -Eqi -- "$pat" "$work/err.log" || fail "$what: expected /$pat/ in: $(cat "$work/err.log")"
}
expect_error "CSV with an empty field" "missing\.csv.*(line 4|:4)" \
  --data "$d/bad/missing.csv" --val-data "$d/test.csv" --target target
expect_error "Fortran-order .npy" "fortran_x\.npy.*fortran" \
  --data "$d/bad/fortran_x.npy,$d/y_train.npy" --val-data "$d/x_test.npy,$d/y_test.npy"
expect_error "unknown extension" "data\.parquet.*csv.*np[yz]|csv.*np[yz].*data\.parquet" \
  --data "$d/bad/data.parquet"
echo "errors: the CSV line, Fortran order and the list of formats are named"
