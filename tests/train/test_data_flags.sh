#!/usr/bin/env bash
# tandem train on a user's data: the held-out split, the normalisation (stated, computed, kept by
# a resume and recorded in a tracked run's config), file-backed arrays read as needed (the same
# bits as in memory, for 1 and 2 workers), regression, multi-label, and the errors that name the
# fix.
# The data is sklearn's diabetes set (real data, 442 samples x 10 features) written with numpy.
set -euo pipefail
. "$(dirname "$0")/../lib/project.sh"
project_init data-flags
PY=${PYTHON:-/usr/bin/python3}
if ! "$PY" -c 'import sklearn, numpy' 2> /dev/null; then
    echo "SKIP: $PY lacks sklearn or numpy (Debian: python3-sklearn python3-numpy)"
    exit 77
fi
cat > mk.py << 'X'
import numpy as np
from sklearn.datasets import load_diabetes
x, y = load_diabetes(return_X_y=True)
x = (x * 100).astype(np.float32)  # raw scale far from mean 0 / std 1: normalisation matters
np.save("x.npy", x); np.save("y.npy", y.astype(np.float32))
np.save("yc.npy", (y > np.median(y)).astype(np.int64))  # a binary class target
# two 0/1 labels per sample (multi-label, for bce): above the median target, and above the mean
np.save("ym.npy", np.stack([y > np.median(y), y > y.mean() + y.std()], 1).astype(np.float32))
mean, std = x.mean(0), x.std(0)
np.save("stats.npy", np.stack([mean, std]))
np.save("x5.npy", x[:, :5])  # another sample shape
with open("x.csv", "w") as f:
    f.write(",".join(f"f{i}" for i in range(10)) + ",target\n")
    for row, t in zip(x, y):
        f.write(",".join(repr(float(v)) for v in row) + f",{t}\n")
X
"$PY" mk.py
common=(--model mlp --loss mse --batch 16 --lr 1e-2 --threads 1 --no-progress --seed 3)

# (1) --val-fraction: 442 samples, 0.25 held out = ceil(110.5) = 111, the same set for any seed
out=$("$B" train "${common[@]}" --data x.npy,y.npy --val-fraction 0.25 --steps 3 2>&1)
expect_contains "$out" "331 samples of [10] float32" "the training part of --val-fraction 0.25"
expect_contains "$out" "111 samples of [10] float32" "the held-out part"
expect_contains "$out" "test loss" "a regression run's evaluation line"
expect_lacks "$out" "accuracy" "a regression run's log (it has no accuracy)"

# (2) computed normalisation = numpy's mean/std (ddof 0) over the training samples
json=$("$B" train "${common[@]}" --data x.npy,y.npy --steps 2 --json 2> /dev/null | tail -n 1)
"$PY" - "$json" << 'X'
import json, sys
import numpy as np
r = json.loads(sys.argv[1])
mean, std = np.load("stats.npy")
got_m, got_s = np.array(r["norm_mean"]), np.array(r["norm_std"])
assert np.allclose(got_m, mean, rtol=1e-5, atol=1e-5), (got_m, mean)
assert np.allclose(got_s, std, rtol=1e-5), (got_s, std)
assert r["loss"] == "mse" and r["outputs"] == 1 and r.get("test_acc") is None, r
X

# (3) file-backed = in memory, bit for bit; 2 workers streaming = 1 worker in memory (same G)
TANDEM_DATA_IN_MEMORY=1 "$B" train "${common[@]}" --data x.npy,y.npy --epochs 2 --accum 2 \
    --save mem.st > /dev/null 2>&1
out=$(TANDEM_DATA_IN_MEMORY=0 "$B" train "${common[@]}" --data x.npy,y.npy --epochs 2 \
      --accum 2 --save file.st 2>&1)
expect_contains "$out" "read from the file as needed" "TANDEM_DATA_IN_MEMORY=0's data line"
cmp mem.st file.st || fail "file-backed data trained other weights than the same data in memory"
TANDEM_DATA_IN_MEMORY=0 "$B" train "${common[@]}" --nproc-per-node 2 --data x.npy,y.npy \
    --epochs 2 --save file2.st > /dev/null 2>&1
cmp mem.st file2.st || fail "2 workers reading the file trained other weights than 1 in memory"
# the CSV holds the same float32 values: the same bits again
"$B" train "${common[@]}" --data x.csv --epochs 2 --accum 2 --save csv.st > /dev/null 2>&1
cmp mem.st csv.st || fail "the CSV of the same values trained other weights than the .npy"

# (4) a resume keeps the checkpoint's normalisation: stated --mean/--std for 10 steps, resumed
# without them (the computed statistics differ), ends with the bits of an uninterrupted run
stated=(--mean 1 --std 2)
"$B" train "${common[@]}" --data x.npy,y.npy "${stated[@]}" --steps 20 --save whole.st \
    > /dev/null 2>&1
"$B" train "${common[@]}" --data x.npy,y.npy "${stated[@]}" --steps 20 --checkpoint-dir ck \
    --checkpoint-every 10 > /dev/null 2>&1
rm ck/ckpt-20.tdck
out=$("$B" train "${common[@]}" --data x.npy,y.npy --steps 20 --checkpoint-dir ck --resume \
      --save resumed.st 2>&1)
expect_contains "$out" "resuming with the checkpoint's" "a resume whose data normalises otherwise"
cmp whole.st resumed.st || fail "the resumed run did not end with the uninterrupted run's weights"

# (5) classification from integer targets; the class count comes from the data (2)
json=$("$B" train --model mlp --batch 16 --threads 1 --no-progress --data x.npy,yc.npy \
       --val-fraction 0.25 --epochs 3 --json 2> /dev/null | tail -n 1)
"$PY" -c 'import json,sys; r=json.loads(sys.argv[1]); assert r["outputs"]==2 and r["test_acc"]>55, r' "$json"

# (6) multi-label 0/1 targets with bce: 2 outputs, an accuracy over labels
json=$("$B" train --model mlp --batch 16 --threads 1 --no-progress --data x.npy,ym.npy \
       --loss bce --val-fraction 0.25 --epochs 3 --json 2> /dev/null | tail -n 1)
"$PY" -c 'import json,sys; r=json.loads(sys.argv[1]); assert r["outputs"]==2 and r["loss"]=="bce" and r["test_acc"]>60 and r["test_loss"]<0.69, r' "$json"

# (7) errors that name the thing and the fix
err() { # what expected-text args...
    local what=$1 want=$2 out
    shift 2
    if out=$("$B" train --threads 1 --no-progress --steps 1 "$@" 2>&1); then
        fail "$what: succeeded"
    fi
    expect_contains "$out" "$want" "$what"
}
err "float targets under cross-entropy" "--loss mse" --model mlp --data x.npy,y.npy
err "a lone .npy" "X.npy,Y.npy" --model mlp --data x.npy
err "--mean without --std" "--std" --model mlp --data x.npy,y.npy --loss mse --mean 1
err "--mean of the wrong length" "10 channels" --model mlp --data x.npy,y.npy --loss mse \
    --mean 1,2 --std 1,2
err "log_softmax under mse" "remove it" --model mlp7 --data x.npy,y.npy --loss mse
err "a preset that does not fit" "mlp" --model basicnet --data x.npy,yc.npy
err "an unknown extension" "--data-format" --model mlp --data mk.py
err "a missing file" "does not exist" --model mlp --data nothing.csv
err "--val-data of another shape" "[10]" --model mlp --data x.npy,y.npy --loss mse \
    --val-data x5.npy,y.npy

# (8) a tracked run records the data's config (the normalisation included)
"$B" run -- "$B" train "${common[@]}" --data x.npy,y.npy --steps 2 > run.txt 2>&1 ||
    { cat run.txt; fail "tandem run -- tandem train failed"; }
run=$(grep -o 'run [a-z0-9-]* succeeded' run.txt | awk '{print $2}')
config=$(show_section "$run" config)
expect_contains "$config" "norm_mean" "the tracked run's config"
expect_contains "$config" '"mse"' "the tracked run's config (loss)"
echo "test_data_flags: ok"
