#!/usr/bin/env bash
# Your own data: `tandem train --data` on scikit-learn's bundled data sets, in the formats a user
# brings (CSV, .npy pair, .npz, a PNG image folder), against the PyTorch peer with the same model,
# optimiser (AdamW, tandem's defaults: betas 0.9/0.999, eps 1e-8, weight decay 0.01), lr, batch,
# epochs and normalisation (StandardScaler fitted on the training rows; uint8 images / 255, then
# the training set's per-channel mean and std), in one invocation, for several seeds. The peer is
# bench/peers/torch_tabular.py on every interpreter bench/peers/torch_pythons.sh finds (Debian's
# PyTorch 1.13, PyPI's 2.x). The split is fixed (bench/data/export_sklearn.py: test_size 0.25,
# random_state 0, stratified for classes); data order and initial weights are each side's own, so
# the seeds differ between the two sides by construction and only the means are compared.
#
# Then Fashion-MNIST: the same basicnet run (1 epoch) from the IDX files and from a .npy pair of
# the same pixels must save the same bits (cmp of the --save files); from a PNG image folder of
# the same pixels, the test accuracy. The folder lists the samples by class (as torchvision's
# ImageFolder does), not in the IDX order, so the same seed visits other samples at each step
# and the bits differ; the accuracy is what is compared there.
#
# Both sides run with 1 thread (OMP_NUM_THREADS, torch.set_num_threads, --threads 1); wall times
# are measured here around each process (interpreter start and imports included).
#
# usage: bench/bench_data.sh [BUILD_DIR]     (default: $TANDEM_BUILD_DIR or ./build)
# env:   SEEDS (default "0 1 2"), PYTHON (default /usr/bin/python3: needs numpy, scikit-learn,
#        Pillow; also the first peer), PYTHON2 (the second peer; none: skip), TANDEM_DATA
#        (Fashion-MNIST IDX dir; FMNIST=0 skips that part), PARTS (default "tabular fmnist": the
#        sklearn sets, then Fashion-MNIST; name one to run only it), DATA_DIR (keep the exported data
#        there between invocations; default a temporary directory), RUNS_OUT (a file to copy the
#        per-run JSON lines to)
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-${TANDEM_BUILD_DIR:-$src/build}}" && pwd)
tandem=$build/tandem
py=${PYTHON:-/usr/bin/python3}
seeds=${SEEDS:-0 1 2}
fmnist=${TANDEM_DATA:-/usr/share/datasets/fashion-mnist}
[ -x "$tandem" ] || { echo "bench_data: $tandem not built" >&2; exit 2; }
case $("$tandem" train --help 2>&1) in *--val-data*) ;; *)
  echo "bench_data: $tandem train has no --val-data (the data flags of issue 20)" >&2; exit 2 ;;
esac

# shellcheck source=peers/torch_pythons.sh
. "$src/bench/peers/torch_pythons.sh"
torch_pythons "$src" bench_data
[ ${#PEER_PY[@]} -gt 0 ] || { echo "bench_data: no python3 with torch (set PYTHON)" >&2; exit 2; }

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
data=${DATA_DIR:-$out/data}
parts=${PARTS:-tabular fmnist}
do_fmnist=0
case " $parts " in *" fmnist "*) do_fmnist=${FMNIST:-1} ;; esac
if [ "$do_fmnist" = 1 ] && [ ! -f "$fmnist/train-images-idx3-ubyte.gz" ]; then
  echo "bench_data: no Fashion-MNIST in $fmnist: that part is skipped" >&2
  do_fmnist=0
fi
marker=$data/.exported$([ "$do_fmnist" = 1 ] && echo -fmnist || true)
if [ ! -f "$marker" ] && [ ! -f "$data/.exported-fmnist" ]; then
  mkdir -p "$data"
  args=("$data")
  [ "$do_fmnist" = 1 ] && args+=(--fmnist "$fmnist" --fmnist-png)
  nice -n 10 "$py" "$src/bench/data/export_sklearn.py" "${args[@]}"
  touch "$marker"
fi

echo "bench_data: data in $data    load average: $(cut -d' ' -f1-3 /proc/loadavg)    $(date -u +%FT%TZ)"
for i in "${!PEER_PY[@]}"; do echo "pytorch peer: torch ${PEER_TORCH[$i]} (${PEER_PY[$i]})"; done

now() { date +%s.%N; }
since() { awk -v a="$(now)" -v b="$1" 'BEGIN { printf "%.3f", a - b }'; }
# record SIDE CASE SEED START JSON_LINE: one line of runs.jsonl
record() {
  printf '{"side": "%s", "case": "%s", "seed": %s, "wall": %s, "r": %s}\n' \
    "$1" "$2" "$3" "$(since "$4")" "$5" >> "$out/runs.jsonl"
}

cnn=$src/bench/data/digits_cnn.yaml
# case | tandem and peer flags (both take the same ones) ; the peer reads the same files
cases=(
  "breast_cancer|csv|--model mlp --data $data/breast_cancer/train.csv --val-data $data/breast_cancer/test.csv --target target --epochs 30 --batch 32 --lr 1e-3"
  "wine|csv|--model mlp --data $data/wine/train.csv --val-data $data/wine/test.csv --target target --epochs 50 --batch 32 --lr 1e-3"
  "diabetes|csv|--model mlp --loss mse --data $data/diabetes/train.csv --val-data $data/diabetes/test.csv --target target --epochs 20 --batch 32 --lr 1e-2"
  "diabetes|npy|--model mlp --loss mse --data $data/diabetes/x_train.npy,$data/diabetes/y_train.npy --val-data $data/diabetes/x_test.npy,$data/diabetes/y_test.npy --epochs 20 --batch 32 --lr 1e-2"
  "digits|png|--model $cnn --data $data/digits --epochs 20 --batch 32 --lr 1e-3"
  "digits|npz|--model $cnn --data $data/digits/digits.npz --epochs 20 --batch 32 --lr 1e-3"
)
case " $parts " in *" tabular "*) ;; *) cases=() ;; esac
for c in "${cases[@]}"; do
  IFS='|' read -r name fmt flags <<< "$c"
  read -ra fl <<< "$flags"
  for seed in $seeds; do
    t0=$(now)
    if ! line=$(nice -n 10 "$tandem" train "${fl[@]}" --seed "$seed" --threads 1 --no-progress \
                --no-eval-every-epoch --json 2> "$out/err.txt" | tail -n 1); then
      echo "bench_data: tandem train ${fl[*]} --seed $seed failed:" >&2; cat "$out/err.txt" >&2; exit 1
    fi
    record tandem "$name|$fmt" "$seed" "$t0" "$line"
    for i in "${!PEER_PY[@]}"; do
      t0=$(now)
      if ! line=$(OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 nice -n 10 "${PEER_PY[$i]}" \
                  "$src/bench/peers/torch_tabular.py" "${fl[@]}" --seed "$seed" --threads 1 \
                  2> "$out/err.txt"); then
        echo "bench_data: torch_tabular.py on ${PEER_PY[$i]} failed:" >&2; cat "$out/err.txt" >&2; exit 1
      fi
      record "torch ${PEER_TORCH[$i]}" "$name|$fmt" "$seed" "$t0" "$line"
    done
  done
done

[ -n "${RUNS_OUT:-}" ] && [ ${#cases[@]} -gt 0 ] && cp "$out/runs.jsonl" "$RUNS_OUT"
[ ${#cases[@]} -gt 0 ] && "$py" - "$out/runs.jsonl" "${PEER_TORCH[@]}" <<'PY'
import json, statistics as st, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
peers = ["torch " + v for v in sys.argv[2:]]
short = {p: "pt" + ".".join(p.split()[1].split(".")[:2]) for p in peers}  # torch 1.13.0a0 -> pt1.13
cases = list(dict.fromkeys(r["case"] for r in runs))


def is_acc(r):
    return r["r"].get("test_acc") is not None


def metric(r):
    return r["r"]["test_acc"] if is_acc(r) else r["r"]["test_loss"]


def label(s):
    return "tandem" if s == "tandem" else short[s]


print()
sides = ["tandem"] + peers
head = f"{'dataset':13s} {'format':6s} {'metric':6s} {'tandem':>8s}"
head += "".join(f" {short[p]:>8s} {'diff':>7s}" for p in peers)
head += "  samples/s:" + "".join(f" {label(s):>7s}" for s in sides)
head += "  wall s:" + "".join(f" {label(s):>6s}" for s in sides)
print(head)
for c in cases:
    name, fmt = c.split("|")
    by = {s: [r for r in runs if r["case"] == c and r["side"] == s] for s in sides}
    acc = is_acc(by["tandem"][0])
    td = st.mean(metric(r) for r in by["tandem"])
    line = f"{name:13s} {fmt:6s} " + (f"{'acc %':6s} {td:8.2f}" if acc else f"{'MSE':6s} {td:8.1f}")
    for p in peers:
        pm = st.mean(metric(r) for r in by[p])
        line += f" {pm:8.2f} {td - pm:+7.2f}" if acc else f" {pm:8.1f} {100 * (td / pm - 1):+6.1f}%"
    line += " " * 11 + "".join(f" {st.mean(r['r']['samples_per_s'] for r in by[s]):7.0f}" for s in sides)
    line += " " * 8 + "".join(f" {st.mean(r['wall'] for r in by[s]):6.2f}" for s in sides)
    print(line)
print()
print("per seed (tandem | " + " | ".join(short[p] for p in peers) + "):")
for c in cases:
    parts = [" ".join(f"{metric(r):.4g}" for r in runs if r["case"] == c and r["side"] == s)
             for s in sides]
    print(f"  {c.replace('|', ' '):20s} " + " | ".join(parts))
print()
print("metric: test accuracy (percent; diff in points) or test MSE (diff relative), mean over seeds "
      f"{sorted(set(r['seed'] for r in runs))}; samples/s: training samples per second (tandem's "
      "samples_per_s; the peer's training loop alone); wall s: the whole process, measured outside "
      "(the peers' includes starting Python and importing torch)")
PY

if [ "$do_fmnist" = 1 ]; then
  echo
  echo "Fashion-MNIST, basicnet, 1 epoch, batch 64, seed 0, 2 threads: IDX vs .npy pair vs PNG folder"
  fm=(--model basicnet --epochs 1 --batch 64 --seed 0 --threads 2 --no-progress --no-eval-every-epoch --json)
  fx=$data/fmnist
  for src_fmt in idx npy png; do
    case $src_fmt in
      idx) d=(--data "$fmnist") ;;
      npy) d=(--data "$fx/x_train.npy,$fx/y_train.npy" --val-data "$fx/x_test.npy,$fx/y_test.npy") ;;
      png) d=(--data "$data/fmnist_png") ;;
    esac
    t0=$(now)
    if ! line=$(nice -n 10 "$tandem" train "${fm[@]}" "${d[@]}" --save "$out/fm_$src_fmt.safetensors" \
                2> "$out/err.txt" | tail -n 1); then
      echo "bench_data: tandem train ${d[*]} failed:" >&2; cat "$out/err.txt" >&2; exit 1
    fi
    wall=$(since "$t0")
    "$py" -c 'import json, sys
r = json.loads(sys.argv[1])
a, l, s = r["test_acc"], r["test_loss"], r["samples_per_s"]
print(f"  {sys.argv[2]:4s} test_acc {a:.2f}%  test_loss {l:.4f}  {s:.0f} samples/s  wall {float(sys.argv[3]):.1f} s")' \
      "$line" "$src_fmt" "$wall"
  done
  if cmp -s "$out/fm_idx.safetensors" "$out/fm_npy.safetensors"; then
    echo "  idx vs npy: saved weights bitwise identical"
  else
    echo "  idx vs npy: saved weights DIFFER ($(cmp "$out/fm_idx.safetensors" "$out/fm_npy.safetensors" 2>&1 | head -1))"
  fi
  echo "  idx vs png: compare test_acc (the folder's sample order is by class, so the bits differ)"
fi
