#!/usr/bin/env bash
# Training throughput, tandem vs PyTorch, the same step on both sides, in one invocation.
#
# Both sides train with AdamW (lr 1e-3, weight decay 0.01) at batch 64 on the same data:
#   basicnet, mlp7   Fashion-MNIST (IDX files, TANDEM_DATA)
#   resnet-small     CIFAR-shaped images: 2,048 synthetic uint8 [3, 32, 32] with 10 classes, a
#                    .npy pair written here (throughput does not depend on the pixels)
#   mlp              scikit-learn's bundled digits table (1,797 rows, 64 features, 10 classes)
#                    written here as a CSV with a header row
#   SPEC.yaml:DATA   a model spec (docs/model-spec.md), built for DATA: fmnist, cifar (the images
#                    above) or digits (the CSV); PyTorch trains its twin (bench/peers/
#                    torch_spec.py). The defaults: examples/models/vgg-cifar.yaml (3x3 convs,
#                    batchnorm, max pooling), lenet5.yaml (5x5 convs, tanh, average pooling),
#                    cifar-net.yaml (PyTorch's CIFAR-10 tutorial network: 5x5 convs of 6 and 16
#                    channels) and tabular.yaml (layernorm, GELU, batchnorm, a residual block)
# tandem is `tandem train --json` (samples_per_s_steady: its first 10 steps left out); PyTorch is
# bench/peers/torch_train.py (5 warm-up steps left out) on PyPI's PyTorch 2.x from the frameworks
# venv (bench/peers/torch_pythons.sh finds it; PYTHON=/usr/bin/python3 adds Debian's 1.13).
# Threads are pinned alike: --threads T for tandem, OMP_NUM_THREADS=MKL_NUM_THREADS=T and
# torch.set_num_threads(T) for PyTorch, T = 1 and 2.
#
# Each configuration runs REPEATS times, interleaved (round r runs every configuration once), and
# the table gives medians. The sgemm peak (OpenBLAS, n=1536) is measured at 1 and 2 threads once
# per round in the same invocation; "% peak" divides tandem's GFLOP/s, counted over conv and
# linear layers only (the compute-bound ones; FLOPs per sample counted by the peer from the
# PyTorch modules: forward, weight gradient, input gradient but the first layer's), by the
# median peak. "layers %" is the same ratio measured inside tandem: `tandem train --profile`
# times each layer (thread time), and the conv and linear layers' FLOPs over their time alone,
# per thread, are divided by the peak per thread: how close the compute-bound layers run to the
# gemm, with the optimizer, normalisation and elementwise layers left out. The CPU class (model
# name, AVX2/AVX-512, OpenBLAS core) heads the output.
#
# ISA_CLASS=avx2 measures the AVX2 class on an AVX-512 machine: both sides restricted to AVX2
# code, tandem a build for x86-64-v3 (BUILD_DIR configured with -DTANDEM_NATIVE=OFF
# -DTANDEM_MARCH=x86-64-v3) with OpenBLAS's Haswell kernels (OPENBLAS_CORETYPE=Haswell, for the
# sgemm peak too), PyTorch with ATEN_CPU_CAPABILITY=avx2, ONEDNN_MAX_CPU_ISA=AVX2 and
# MKL_ENABLE_INSTRUCTIONS=AVX2. Not an AVX2 machine's caches or clocks, but its code paths.
#
# BASELINE=PATH/tandem adds a column for another tandem binary (e.g. a build before a kernel
# change) run in the same rounds, for before/after figures from one invocation.
#
# usage: bench/bench_train.sh [BUILD_DIR]      (default: $TANDEM_BUILD_DIR or ./build)
# env:   TANDEM_DATA (Fashion-MNIST dir), REPEATS (default 3), STEPS_SCALE (default 1),
#        MODELS (default "basicnet mlp7 resnet-small mlp" and the four specs above; a relative
#        SPEC path is taken from the source tree), THREADS (default "1 2"),
#        PYTHON / PYTHON2 (bench/peers/torch_pythons.sh; PYTHON defaults to none here),
#        BASELINE (a second tandem binary), ISA_CLASS (avx2, above)
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-${TANDEM_BUILD_DIR:-$src/build}}" && pwd)
fmnist=${TANDEM_DATA:-/usr/share/datasets/fashion-mnist}
scale=${STEPS_SCALE:-1}
repeats=${REPEATS:-3}
specs="examples/models/vgg-cifar.yaml:cifar examples/models/lenet5.yaml:fmnist"
specs+=" examples/models/cifar-net.yaml:cifar examples/models/tabular.yaml:digits"
models=${MODELS:-basicnet mlp7 resnet-small mlp $specs}
threads=${THREADS:-1 2}
baseline=${BASELINE:-}
engine=$build/bench/bench_engine
tandem=$build/tandem
[ -x "$engine" ] || { echo "bench_train: $engine not built (cmake --build $build --target bench_engine)" >&2; exit 2; }
[ -x "$tandem" ] || { echo "bench_train: $tandem not built (scripts/build.sh)" >&2; exit 2; }
[ -z "$baseline" ] || [ -x "$baseline" ] || { echo "bench_train: BASELINE=$baseline is not an executable tandem" >&2; exit 2; }
isa_class=${ISA_CLASS:-}
case $isa_class in
  "") ;;
  avx2)
    "$tandem" --version | grep -q '^kernels for x86-64-v3 ' || {
      echo "bench_train: ISA_CLASS=avx2 needs a tandem built for x86-64-v3 (cmake -B DIR -DTANDEM_NATIVE=OFF -DTANDEM_MARCH=x86-64-v3); $tandem: $("$tandem" --version | tail -1)" >&2; exit 2; }
    export OPENBLAS_CORETYPE=Haswell ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 DNNL_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 ;;
  *) echo "bench_train: ISA_CLASS=$isa_class: only avx2 (or unset)" >&2; exit 2 ;;
esac
# The sgemm peak on the kernels tandem runs: where OpenBLAS does not know the CPU, tandem runs
# itself under the core of the CPU's class (tools/tandem/isa.c); bench_engine, which measures the
# peak, and a BASELINE binary get the same core.
if [ -z "${OPENBLAS_CORETYPE+set}" ]; then
  core=$("$tandem" --version | sed -n 's/^kernels for .*, OpenBLAS core \([^,]*\), .*/\1/p')
  [ -z "$core" ] || export OPENBLAS_CORETYPE=$core
fi
[ -f "$fmnist/train-images-idx3-ubyte.gz" ] || { echo "bench_train: no Fashion-MNIST IDX files in $fmnist (set TANDEM_DATA)" >&2; exit 2; }

# shellcheck source=peers/torch_pythons.sh
. "$src/bench/peers/torch_pythons.sh"
PYTHON=${PYTHON:-none} torch_pythons "$src" bench_train
[ ${#PEER_PY[@]} -gt 0 ] || { echo "bench_train: no python3 with torch 2.x (bash scripts/venv.sh makes the frameworks venv; or set PYTHON2)" >&2; exit 2; }
py=${PEER_PY[0]}

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

# the data both sides read
"$py" "$src/bench/data/cifar_like.py" "$out/cifar_x.npy" "$out/cifar_y.npy" || exit 1
"$py" - "$out" <<'PY'
import gzip, os, sys
import numpy as np
out = sys.argv[1]
digits = "/usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz"
if not os.path.exists(digits):
    sys.exit(f"bench_train: {digits} missing (apt-get install python3-sklearn)")
d = np.loadtxt(gzip.open(digits), delimiter=",")
with open(os.path.join(out, "digits.csv"), "w") as f:
    f.write(",".join([f"p{i}" for i in range(64)] + ["target"]) + "\n")
    for row in d:
        f.write(",".join(str(int(v)) for v in row) + "\n")
PY

# A MODELS entry is a preset or SPEC.yaml:DATA; model_arg gives what both sides load, data_of
# which data set it trains on.
model_arg() {
  case $1 in
    *:*) local spec=${1%:*}; [ -f "$spec" ] || spec=$src/$spec; echo "$spec" ;;
    *) echo "$1" ;;
  esac
}
data_of() {
  case $1 in
    resnet-small) echo cifar ;; mlp) echo digits ;; *:*) echo "${1##*:}" ;; *) echo fmnist ;;
  esac
}
for model in $models; do
  case $model in *:*)
    [ -f "$(model_arg "$model")" ] ||
      { echo "bench_train: $model: no spec file ${model%:*}" >&2; exit 2; }
    case $(data_of "$model") in fmnist|cifar|digits) ;;
      *) echo "bench_train: $model: data '$(data_of "$model")' is none of fmnist, cifar," \
           "digits" >&2; exit 2 ;;
    esac ;;
  esac
done
tandem_data() { # model -> tandem's --data arguments
  case $(data_of "$1") in
    cifar) echo "--data $out/cifar_x.npy,$out/cifar_y.npy" ;;
    digits) echo "--data $out/digits.csv" ;;
    *) echo "--data $fmnist --mean 0.2860 --std 0.3530" ;;
  esac
}
peer_data() {
  case $(data_of "$1") in
    cifar) echo "--npy $out/cifar_x.npy,$out/cifar_y.npy" ;;
    digits) echo "--csv $out/digits.csv" ;;
    *) echo "--data $fmnist" ;;
  esac
}
steps_for() { # model -> tandem's steps, its 10 warm ones included: a few seconds each
  case $1 in
    basicnet|*:cifar) echo $((10 + 30 * scale)) ;; resnet-small) echo $((10 + 15 * scale)) ;;
    mlp7|*:fmnist) echo $((10 + 90 * scale)) ;; *) echo $((10 + 300 * scale)) ;;
  esac
}
torch_steps_for() { # timed steps after the 5 warm-up ones
  case $1 in basicnet|*:cifar) echo $((20 * scale)) ;; resnet-small) echo $((12 * scale)) ;;
    mlp7|*:fmnist) echo $((60 * scale)) ;; *) echo $((200 * scale)) ;; esac
}

run_tandem() { # side binary model threads round
  local side=$1 bin=$2 model=$3 t=$4 r=$5 profile=
  [ "$side" != tandem ] || profile=--profile # (a baseline binary may predate it)
  # shellcheck disable=SC2046
  if ! "$bin" train --model "$(model_arg "$model")" $(tandem_data "$model") --steps "$(steps_for "$model")" \
       --batch 64 --threads "$t" --no-eval-every-epoch --no-progress --json $profile 2> "$out/err.txt" \
       | tail -n 1 | sed "s|^|{\"side\": \"$side\", \"model\": \"$model\", \"threads\": $t, \"round\": $r, \"r\": |; s|\$|}|" \
       >> "$out/runs.jsonl"; then
    echo "bench_train: $bin train --model $model failed:" >&2; cat "$out/err.txt" >&2; exit 1
  fi
}

echo "load average at the start: $(cut -d' ' -f1-3 /proc/loadavg)    cores: $(nproc)"
for i in "${!PEER_PY[@]}"; do echo "pytorch peer: torch ${PEER_TORCH[$i]} (${PEER_PY[$i]})"; done
for r in $(seq 1 "$repeats"); do
  "$engine" --models '' --threads "${threads// /,}" --seconds 1 --json >> "$out/peak.jsonl"
  for model in $models; do
    for t in $threads; do
      run_tandem tandem "$tandem" "$model" "$t" "$r"
      [ -z "$baseline" ] || run_tandem baseline "$baseline" "$model" "$t" "$r"
      for i in "${!PEER_PY[@]}"; do
        # shellcheck disable=SC2046
        if ! OMP_NUM_THREADS=$t MKL_NUM_THREADS=$t "${PEER_PY[$i]}" "$src/bench/peers/torch_train.py" \
             --model "$(model_arg "$model")" --threads "$t" --steps "$(torch_steps_for "$model")" --warmup 5 \
             $(peer_data "$model") 2> "$out/err.txt" \
             | sed "s|^|{\"side\": \"torch ${PEER_TORCH[$i]}\", \"model\": \"$model\", \"threads\": $t, \"round\": $r, \"r\": |; s|\$|}|" \
             >> "$out/runs.jsonl"; then
          echo "bench_train: torch_train.py on ${PEER_PY[$i]} failed:" >&2; cat "$out/err.txt" >&2; exit 1
        fi
      done
    done
  done
  echo "round $r/$repeats done, load average $(cut -d' ' -f1-3 /proc/loadavg)"
done

"$py" - "$out" "$repeats" "${PEER_TORCH[@]}" <<'PY'
import json, os, re, statistics, sys
out, repeats, peers = sys.argv[1], int(sys.argv[2]), ["torch " + v for v in sys.argv[3:]]
med = statistics.median
peak, core, runs, flops, tflops, layers = {}, "?", {}, {}, {}, {}
for line in open(os.path.join(out, "peak.jsonl")):
    r = json.loads(line)
    peak.setdefault(r["threads"], []).append(r["gflops"])
    core = r.get("openblas_core", "?")
for line in open(os.path.join(out, "runs.jsonl")):
    r = json.loads(line)
    key = (r["side"], r["model"], r["threads"])
    res = r["r"]
    runs.setdefault(key, []).append(res.get("samples_per_s_steady", res["samples_per_s"]))
    if r["side"].startswith("torch"):
        flops[r["model"]] = res["flops_per_sample"]
    elif r["side"] == "tandem":
        tflops[r["model"]] = res["flops_per_sample"]
        prof = res.get("profile")
        if prof:  # conv and linear layers: FLOPs per step over their thread ms per step
            rows = [x for x in prof["rows"] if x["kind"] in ("conv2d", "linear")]
            ms = sum(x["fwd_ms"] + x["bwd_ms"] for x in rows)
            if ms > 0:
                layers.setdefault(key, []).append(sum(x["flops"] for x in rows) / ms / 1e6)
cpu = "?"
flags = ""
for line in open("/proc/cpuinfo"):
    if line.startswith("model name") and cpu == "?":
        cpu = line.split(":", 1)[1].strip()
    if line.startswith("flags") and not flags:
        flags = line.split(":", 1)[1].split()
simd = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "no AVX2"
if os.environ.get("ISA_CLASS") == "avx2":
    simd += ", both sides restricted to AVX2 code (ISA_CLASS=avx2: tandem built for x86-64-v3)"
print()
print(f"CPU: {cpu}; {simd}; OpenBLAS core {core}; {os.cpu_count()} cores; "
      f"load average at the end {open('/proc/loadavg').read().split()[0]}")
print("sgemm peak (n=1536), median of " + str(repeats) + ": " + ", ".join(
    f"{t} thread{'s' if t > 1 else ''} {med(g):.1f} GFLOP/s (runs {', '.join(f'{x:.0f}' for x in g)})"
    for t, g in sorted(peak.items())))
has_base = any(k[0] == "baseline" for k in runs)
models = list(dict.fromkeys(k[1] for k in runs))
threads = sorted(set(k[2] for k in runs))
# a spec's row is named by its file: vgg-cifar.yaml for examples/models/vgg-cifar.yaml:cifar
name = lambda m: os.path.basename(m.rsplit(":", 1)[0]) if ":" in m else m
head = f"{'model':15s} {'thr':>3s} {'tandem s/s':>11s}"
if has_base:
    head += f" {'baseline':>9s} {'new/base':>8s}"
for p in peers:
    head += f" {p:>13s} {'ratio':>6s}"
print(head + f" {'GFLOP/s':>8s} {'% peak':>7s} {'layers %':>8s}  tandem runs")
for model in models:
    for t in threads:
        td = runs[("tandem", model, t)]
        line = f"{name(model):15s} {t:3d} {med(td):11.1f}"
        if has_base:
            b = runs[("baseline", model, t)]
            line += f" {med(b):9.1f} {med(td) / med(b):8.2f}"
        for p in peers:
            pt = runs[(p, model, t)]
            line += f" {med(pt):13.1f} {med(td) / med(pt):6.2f}"
        gf = med(td) * flops.get(model, 0) / 1e9
        lay = layers.get(("tandem", model, t))
        lay = f"{100 * med(lay) / (med(peak[t]) / t):7.1f}%" if lay else f"{'-':>8s}"
        line += f" {gf:8.1f} {100 * gf / med(peak[t]):6.1f}% {lay}  " + " ".join(f"{x:.0f}" for x in td)
        print(line)
print()
print("FLOPs per sample (conv + linear, counted by the peer from the PyTorch modules; tandem's own "
      "count, which adds normalisation and elementwise layers, in brackets): " + ", ".join(
          f"{name(m)} {flops[m] / 1e6:.2f} M ({tflops.get(m, 0) / 1e6:.2f} M)"
          for m in models if m in flops))
print("layers %: tandem's conv and linear layers alone (`tandem train --profile`: their FLOPs "
      "over their thread time) against the sgemm peak per thread")
print("tandem: `tandem train --json`, AdamW lr 1e-3, batch 64, samples_per_s_steady; "
      f"pytorch ({', '.join(peers)}): bench/peers/torch_train.py, AdamW lr 1e-3 weight decay 0.01, "
      "batch 64, warm-up excluded; ratio = tandem / that peer; medians of " + str(repeats) + " rounds")
PY
