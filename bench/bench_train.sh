#!/usr/bin/env bash
# Training throughput, tandem vs PyTorch, in one invocation: basicnet and mlp7 at batch 64 with 1
# and 2 threads. tandem is measured with `tandem train --json` when the CLI has the train
# subcommand (falls back to bench_engine's training step otherwise; the output says which), and
# PyTorch with bench/peers/torch_train.py (AdamW lr 1e-3, same data) on two interpreters in the
# same invocation: Debian's PyTorch 1.13 and PyPI's PyTorch 2.x from the frameworks venv
# (bench/peers/torch_pythons.sh says how they are found; a missing one is skipped with a line).
# Threads are pinned alike for both: OMP_NUM_THREADS=MKL_NUM_THREADS=T and
# torch.set_num_threads(T). Also prints tandem's GFLOP/s against the sgemm peak measured in the
# same run. Takes about 3-4 minutes.
#
# usage: bench/bench_train.sh [BUILD_DIR]      (default: $TANDEM_BUILD_DIR or ./build)
# env:   TANDEM_DATA (Fashion-MNIST dir), PYTHON (default /usr/bin/python3), PYTHON2 (default
#        the frameworks venv's python; none: skip), STEPS_SCALE (default 1)
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-${TANDEM_BUILD_DIR:-$src/build}}" && pwd)
data=${TANDEM_DATA:-/usr/share/datasets/fashion-mnist}
scale=${STEPS_SCALE:-1}
engine=$build/bench/bench_engine
tandem=$build/tandem
[ -x "$engine" ] || { echo "bench_train: $engine not built (cmake --build $build --target bench_engine)" >&2; exit 2; }

# shellcheck source=peers/torch_pythons.sh
. "$src/bench/peers/torch_pythons.sh"
torch_pythons "$src" bench_train
[ ${#PEER_PY[@]} -gt 0 ] || { echo "bench_train: no python3 with torch (set PYTHON)" >&2; exit 2; }

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

mode=bench_engine
if [ -x "$tandem" ] && "$tandem" train --help 2>&1 | grep -q -- "--json"; then
  mode="tandem train"
fi
echo "tandem side: $mode    data: $data    load average: $(cut -d' ' -f1-3 /proc/loadavg)"
for i in "${!PEER_PY[@]}"; do echo "pytorch peer: torch ${PEER_TORCH[$i]} (${PEER_PY[$i]})"; done

# sgemm peak and the engine's own step rate (also the GFLOP/s reference)
"$engine" --models basicnet,mlp7 --threads 1,2 --seconds 2 --json > "$out/engine.jsonl"

steps_for() { # model -> timed steps, about 5 s of tandem work each
  case $1 in basicnet) echo $((120 * scale)) ;; *) echo $((400 * scale)) ;; esac
}

torch_steps_for() { # PyTorch is slower: fewer steps for the same few seconds
  case $1 in basicnet) echo $((40 * scale)) ;; *) echo $((120 * scale)) ;; esac
}

for model in basicnet mlp7; do
  for t in 1 2; do
    n=$(steps_for "$model")
    if [ "$mode" = "tandem train" ]; then
      if ! "$tandem" train --model "$model" --data "$data" --mean 0.2860 --std 0.3530 --steps "$n" --batch 64 --threads "$t" \
           --no-eval-every-epoch --no-progress --json 2> "$out/err.txt" | tail -n 1 \
           | sed "s/^/{\"side\": \"tandem\", \"model\": \"$model\", \"threads\": $t, \"r\": /; s/\$/}/" \
           >> "$out/runs.jsonl"; then
        echo "bench_train: tandem train failed:" >&2; cat "$out/err.txt" >&2; exit 1
      fi
    fi
    for i in "${!PEER_PY[@]}"; do
      if ! TANDEM_DATA="$data" OMP_NUM_THREADS=$t MKL_NUM_THREADS=$t "${PEER_PY[$i]}" \
           "$src/bench/peers/torch_train.py" --model "$model" --threads "$t" \
           --steps "$(torch_steps_for "$model")" --warmup 5 --data "$data" 2> "$out/err.txt" \
           | sed "s/^/{\"side\": \"torch ${PEER_TORCH[$i]}\", \"model\": \"$model\", \"threads\": $t, \"r\": /; s/\$/}/" \
           >> "$out/runs.jsonl"; then
        echo "bench_train: torch_train.py on ${PEER_PY[$i]} failed:" >&2; cat "$out/err.txt" >&2; exit 1
      fi
    done
  done
done

"${PEER_PY[0]}" - "$out" "$mode" "${PEER_TORCH[@]}" <<'PY'
import json, sys, os
out, mode, peers = sys.argv[1], sys.argv[2], ["torch " + v for v in sys.argv[3:]]
peak, engine, runs = {}, {}, {}
for line in open(os.path.join(out, "engine.jsonl")):
    r = json.loads(line)
    if r["kind"] == "sgemm_peak":
        peak[r["threads"]] = r["gflops"]
    else:
        engine[(r["model"], r["threads"])] = r
for line in open(os.path.join(out, "runs.jsonl")):
    r = json.loads(line)
    runs[(r["side"], r["model"], r["threads"])] = r["r"]["samples_per_s"]
print()
head = f"{'model':9s} {'thr':>3s} {'tandem s/s':>11s}"
for p in peers:
    head += f" {p:>13s} {'ratio':>6s}"
print(head + f" {'GFLOP/s':>8s} {'% sgemm peak':>13s} {'engine step s/s':>16s}")
for model in ("basicnet", "mlp7"):
    for t in (1, 2):
        e = engine[(model, t)]
        td = runs.get(("tandem", model, t), e["samples_per_s"])
        line = f"{model:9s} {t:3d} {td:11.1f}"
        for p in peers:
            pt = runs[(p, model, t)]
            line += f" {pt:13.1f} {td / pt:6.2f}"
        gf = td * e["mflop_per_sample"] / 1000.0
        print(line + f" {gf:8.1f} {100 * gf / peak[t]:12.1f}% {e['samples_per_s']:16.1f}")
print()
print("sgemm peak (n=1536): " + ", ".join(f"{t} thread{'s' if t > 1 else ''} {g:.1f} GFLOP/s"
                                         for t, g in sorted(peak.items())))
print(f"tandem column: {mode}" + ("" if mode == "tandem train" else
      " (forward+backward+SGD on random data; `tandem train` not available)"))
print(f"pytorch columns ({', '.join(peers)}): torch_train.py, AdamW lr 1e-3, batch 64, warm-up "
      "excluded, OMP_NUM_THREADS and torch.set_num_threads = thr; ratio = tandem / that peer")
PY
