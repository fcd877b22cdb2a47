#!/usr/bin/env bash
# Training on one GPU, tandem's CUDA backend vs PyTorch, in one invocation on the GPU host, at
# three precisions: AdamW lr 1e-3, Fashion-MNIST resident on the GPU.
#   fp32  plain fp32, TF32 off                   tandem --precision fp32; torch: TF32 off
#   tf32  TF32 tensor-core gemms, fp32 storage   tandem --precision tf32; torch: TF32 on
#   bf16  bf16 gemm operands, fp32 accumulation and fp32 master weights
#                                                tandem --precision bf16; torch: bf16 autocast
#
#   throughput   BasicNet at batch 64, 512 and 4096 x fp32, tf32, bf16; mlp7 at 64 and 512, fp32:
#                tandem:  one run per combination: tandem train --device cuda --precision P
#                         --model M --batch B --steps N --no-eval-every-epoch --no-progress --json
#                         (its steady-state samples/s, after its first 10 steps; N: 1000 at batch
#                         64, 300 at 512, 60 at 4096)
#                pytorch: bench/peers/torch_gpu_bench.py, one process per model for all of its
#                         batches x precisions x modes: eager, and graph = the whole step in one
#                         CUDA graph (30 warm-up + 300 timed steps at batch 64 and 512, 10 + 100
#                         at 4096)
#                ratios tandem/eager and tandem/graph at the same batch and precision
#                resnet-small (BatchNorm, residual blocks, cross-entropy) on CIFAR-shaped data,
#                2,048 uint8 images [3, 32, 32] with 10 classes written here as a .npy pair
#                (throughput does not depend on the pixels), at RESNET_BATCHES x PRECISIONS:
#                tandem --data X.npy,Y.npy; the peer --npy (each channel normalised as tandem's)
#   peak share   tandem's flops_per_sample x samples_per_s against torch.mm's TFLOP/s (8192^2) at
#                the same precision, measured in the BasicNet peer's process
#   time to 90%  fp32, BasicNet batch 64: tandem --epochs 2 (evaluation after each epoch) vs
#                PyTorch eager --time-to-acc 90 (at most 3 epochs)
#   2 workers    fp32: the step time added by reducing between 2 workers: tandem
#                --nproc-per-node 2 --batch 64 vs 1 worker --batch 64 --accum 2 (the same global
#                batch 128), and whether the two write bitwise-equal weights (--save, cmp)
# Targets, printed as PASS/FAIL lines (not the exit code): BasicNet tandem >= 1.5x torch's CUDA
# graph at every batch and precision, >= 2x at batch 64 fp32; time to 90% <= 1/4 of torch
# eager's. About 2 minutes on an H100 or H200 (--quick: about 1.5; most of it is PyTorch's
# start-up, ~10 s per peer process).
#
# usage: bench/bench_gpu.sh [--quick]
# env:   TANDEM_BIN (default build-gpu/tandem, else build/tandem), TANDEM_DATA (Fashion-MNIST
#        dir), PYTHON (python3 with CUDA torch), OUT (also write the output to
#        $OUT/bench_gpu.log and the measurements to $OUT/bench_gpu_results.jsonl), TIMEOUT_S (per
#        command, default 300), TORCH_CUDNN_BENCHMARK=1 (cudnn.benchmark on for PyTorch),
#        PRECISIONS (default "fp32 tf32 bf16"), BATCHES (BasicNet's, default "64 512 4096"),
#        MLP7_BATCHES (fp32 only, default "64 512"; empty: no mlp7), RESNET_BATCHES (resnet-small's,
#        default "64 256"; empty: no resnet-small), REPORT_ONLY=FILE (measure
#        nothing: print the report of a saved bench_gpu_results.jsonl), and step counts, for
#        batch < 512, < 4096 and >= 4096 (--quick's in brackets): TANDEM_STEPS_64 1000 (300),
#        TANDEM_STEPS_512 300 (100), TANDEM_STEPS_4096 60 (30); torch warm-up + timed steps:
#        TORCH_WARMUP 30 (10) and TORCH_STEPS 300 (100) below 4096, TORCH_WARMUP_4096 10 (5)
#        and TORCH_STEPS_4096 100 (30); DDP_STEPS 500 (100)
set -uo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)

quick=0
for arg in "$@"; do
  case $arg in
    --quick) quick=1 ;;
    -h | --help) awk 'NR == 1 { next } /^#/ { print; next } { exit }' "$0"; exit 0 ;;
    *) echo "bench_gpu: unknown argument '$arg' (see --help)" >&2; exit 2 ;;
  esac
done

data=${TANDEM_DATA:-/usr/share/datasets/fashion-mnist}
py=${PYTHON:-python3}
peer=$src/bench/peers/torch_gpu_bench.py
limit=${TIMEOUT_S:-300}
precisions=${PRECISIONS-fp32 tf32 bf16}
batches=${BATCHES-64 512 4096}
mlp7_batches=${MLP7_BATCHES-64 512}
resnet_batches=${RESNET_BATCHES-64 256}
if [ $quick = 1 ]; then
  td_steps_64=${TANDEM_STEPS_64:-300} td_steps_512=${TANDEM_STEPS_512:-100}
  td_steps_4096=${TANDEM_STEPS_4096:-30}
  pt_steps_64=${TORCH_STEPS:-100} pt_warmup_64=${TORCH_WARMUP:-10}
  pt_steps_4096=${TORCH_STEPS_4096:-30} pt_warmup_4096=${TORCH_WARMUP_4096:-5}
  ddp_steps=${DDP_STEPS:-100}
else
  td_steps_64=${TANDEM_STEPS_64:-1000} td_steps_512=${TANDEM_STEPS_512:-300}
  td_steps_4096=${TANDEM_STEPS_4096:-60}
  pt_steps_64=${TORCH_STEPS:-300} pt_warmup_64=${TORCH_WARMUP:-30}
  pt_steps_4096=${TORCH_STEPS_4096:-100} pt_warmup_4096=${TORCH_WARMUP_4096:-10}
  ddp_steps=${DDP_STEPS:-500}
fi
pt_steps_512=$pt_steps_64 pt_warmup_512=$pt_warmup_64
pt_extra=()
[ "${TORCH_CUDNN_BENCHMARK:-0}" = 1 ] && pt_extra+=(--cudnn-benchmark)

for p in $precisions; do
  case $p in fp32 | tf32 | bf16) ;; *)
    echo "bench_gpu: PRECISIONS: unknown precision '$p' (fp32, tf32, bf16)" >&2; exit 2 ;;
  esac
done
for b in $batches $mlp7_batches $resnet_batches; do
  case $b in '' | *[!0-9]* | 0*)
    echo "bench_gpu: BATCHES/MLP7_BATCHES/RESNET_BATCHES: '$b' is not a positive batch size" >&2
    exit 2 ;;
  esac
done

if [ -n "${TANDEM_BIN:-}" ]; then
  tandem=$TANDEM_BIN
elif [ -x "$src/build-gpu/tandem" ]; then
  tandem=$src/build-gpu/tandem
else
  tandem=$src/build/tandem
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
results=$tmp/results.jsonl
: >"$results"

# collect.py TAG RC T0 T1 STDOUT STDERR RESULTS: appends {tag, rc, cmd_wall_s, json: [every
# stdout line that parses as a JSON object, "[rank N] " prefix stripped], err_tail} to RESULTS
# and prints one progress line.
cat >"$tmp/collect.py" <<'PY'
import json, re, sys
tag, rc, t0, t1, out, err, results = sys.argv[1:8]
objs = []
for line in open(out, errors="replace"):
    line = re.sub(r"^\[rank \d+\] ", "", line.strip())
    if line.startswith("{"):
        try:
            o = json.loads(line)
        except ValueError:
            continue
        if isinstance(o, dict):
            objs.append(o)
err_lines = [l.rstrip() for l in open(err, errors="replace") if l.strip()]
wall = float(t1) - float(t0)
rec = {"tag": tag, "rc": int(rc), "cmd_wall_s": round(wall, 2), "json": objs,
       "err_tail": err_lines[-5:]}
with open(results, "a") as f:
    f.write(json.dumps(rec) + "\n")
status = "" if int(rc) == 0 else f"   FAILED (exit {rc}{', timed out' if int(rc) in (124, 137) else ''})"
if int(rc) != 0 and err_lines:
    status += ": " + err_lines[-1][:160]
elif not objs:
    status += "   (printed no JSON)"
print(f"  {tag:26s} {wall:6.1f} s{status}", flush=True)
PY

# run TAG CMD...: runs CMD under a timeout, stdout/stderr to $tmp/TAG.{out,err}, and records it.
run() {
  local tag=$1 rc t0 t1
  shift
  t0=$(date +%s.%N)
  timeout -k 10 "$limit" "$@" >"$tmp/$tag.out" 2>"$tmp/$tag.err"
  rc=$?
  t1=$(date +%s.%N)
  "$py" "$tmp/collect.py" "$tag" "$rc" "$t0" "$t1" "$tmp/$tag.out" "$tmp/$tag.err" "$results"
  return "$rc"
}

header() {
  echo "bench_gpu: tandem (CUDA) vs PyTorch at $(echo $precisions | sed 's/ / \/ /g'), AdamW lr 1e-3, Fashion-MNIST on the GPU"
  if command -v nvidia-smi >/dev/null 2>&1; then
    echo "  gpu: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -n 1)"
  fi
  # PyTorch's version is printed with the report (from the peer's JSON): importing torch here
  # would cost seconds of the GPU host's time
  echo "  tandem: $tandem    python: $(command -v "$py" || echo "$py (not found)")"
  echo "  data: $data    $([ $quick = 1 ] && echo 'quick: ')BasicNet batches: ${batches:-none}, mlp7 batches (fp32): ${mlp7_batches:-none}"
  echo "  steps (batch 64 / 512 / 4096): tandem $td_steps_64 / $td_steps_512 / $td_steps_4096, torch warm-up + timed $pt_warmup_64+$pt_steps_64 / $pt_warmup_512+$pt_steps_512 / $pt_warmup_4096+$pt_steps_4096, 2-worker $ddp_steps"
  echo "  load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
}

check_inputs() {
  if [ ! -f "$data/train-images-idx3-ubyte.gz" ] || [ ! -f "$data/t10k-images-idx3-ubyte.gz" ]; then
    echo "bench_gpu: no Fashion-MNIST IDX .gz files in $data (source .gpu-host/env.sh, or set TANDEM_DATA)" >&2
    return 2
  fi
  local help
  if [ ! -x "$tandem" ]; then
    echo "bench_gpu: $tandem is not an executable; tandem's side will show as failed (set TANDEM_BIN)" >&2
  else
    help=$("$tandem" train --help 2>&1)
    local flag
    for flag in --device --precision; do
      if ! grep -q -- "$flag" <<<"$help"; then
        echo "bench_gpu: note: '$tandem train --help' does not mention $flag; tandem's runs may fail" >&2
      fi
    done
  fi
  return 0
}

tier() { # batch -> the step-count tier: 64 (below 512), 512 (below 4096) or 4096
  if [ "$1" -ge 4096 ]; then echo 4096; elif [ "$1" -ge 512 ]; then echo 512; else echo 64; fi
}

steps_for() { # td|pt steps|warmup batch -> the count for batch's tier
  local v=${1}_${2}_$(tier "$3")
  echo "${!v}"
}

csv() { # words -> a,b,c
  local IFS=,
  echo "$*"
}

# resnet-small's data: CIFAR-shaped uint8 images and labels, the same files for both sides
cifar_x=$tmp/cifar_x.npy cifar_y=$tmp/cifar_y.npy
write_cifar() {
  "$py" "$src/bench/data/cifar_like.py" "$cifar_x" "$cifar_y"
}

data_args() { # model -> tandem's data flags for it
  if [ "$1" = resnet-small ]; then
    echo "--data $cifar_x,$cifar_y"
  else
    echo "--data $data --mean 0.2860 --std 0.3530"
  fi
}

measure_tandem() { # model batch precision
  local model=$1 batch=$2 precision=$3
  # shellcheck disable=SC2046  # data_args is words (paths without spaces: mktemp's and TANDEM_DATA)
  run "tandem-$model-$batch-$precision" "$tandem" train --device cuda --precision "$precision" \
    --model "$model" $(data_args "$model") --batch "$batch" --steps "$(steps_for td steps "$batch")" \
    --no-eval-every-epoch --no-progress --json
}

# The PyTorch peer for one model: every batch x precision x mode in one process (torch's import,
# CUDA set-up and the data load, ~10 s, once). The first one also measures the gemm peaks
# (--sgemm, at each precision).
sgemm_pending=1
measure_torch() { # model "batches" "precisions"
  local model=$1 b bs=() steps=() warmups=() extra=()
  read -ra bs <<<"$2"
  for b in "${bs[@]}"; do
    steps+=("$(steps_for pt steps "$b")")
    warmups+=("$(steps_for pt warmup "$b")")
  done
  if [ $sgemm_pending = 1 ]; then
    extra+=(--sgemm)
    sgemm_pending=0
  fi
  # shellcheck disable=SC2086  # the precision list is words
  [ "$model" = resnet-small ] && extra+=(--npy "$cifar_x,$cifar_y")
  run "torch-$model" "$py" "$peer" --model "$model" --batch "$(csv "${bs[@]}")" \
    --precision "$(csv $3)" --mode eager,graph --steps "$(csv "${steps[@]}")" \
    --warmup "$(csv "${warmups[@]}")" --data "$data" "${extra[@]}" "${pt_extra[@]}"
}

measure_throughput() {
  local b p
  if [ -n "${batches// /}" ] && [ -n "${precisions// /}" ]; then
    for b in $batches; do
      for p in $precisions; do
        measure_tandem basicnet "$b" "$p"
      done
    done
    measure_torch basicnet "$batches" "$precisions"
  fi
  if [ -n "${mlp7_batches// /}" ]; then
    for b in $mlp7_batches; do
      measure_tandem mlp7 "$b" fp32
    done
    measure_torch mlp7 "$mlp7_batches" fp32
  fi
  if [ -n "${resnet_batches// /}" ] && [ -n "${precisions// /}" ]; then
    if ! write_cifar; then
      echo "bench_gpu: could not write resnet-small's data with $py (NumPy?)" >&2
      return
    fi
    for b in $resnet_batches; do
      for p in $precisions; do
        measure_tandem resnet-small "$b" "$p"
      done
    done
    measure_torch resnet-small "$resnet_batches" "$precisions"
  fi
}

measure_time_to_acc() { # fp32 (both sides' default), BasicNet batch 64 to 90% test accuracy
  rm -f "$tmp/metrics.jsonl"
  run tandem-tta env TANDEM_METRICS="$tmp/metrics.jsonl" "$tandem" train --device cuda \
    --model basicnet --data "$data" --mean 0.2860 --std 0.3530 --epochs 2 --batch 64 --no-progress --json
  run torch-tta "$py" "$peer" --model basicnet --batch 64 --time-to-acc 90 --epochs 3 \
    --data "$data" "${pt_extra[@]}"
}

measure_two_workers() { # the same global batch 128: 2 workers x 64 vs 1 worker x 64 x accum 2
  local common=(--device cuda --model basicnet --data "$data" --mean 0.2860 --std 0.3530 --batch 64 --steps "$ddp_steps"
    --no-eval-every-epoch --no-progress --json)
  rm -f "$tmp/w2.safetensors" "$tmp/w1.safetensors"
  run tandem-2workers "$tandem" train --nproc-per-node 2 "${common[@]}" --accum 1 \
    --save "$tmp/w2.safetensors"
  run tandem-1worker-accum2 "$tandem" train "${common[@]}" --accum 2 --save "$tmp/w1.safetensors"
  local equal=null
  if [ -s "$tmp/w2.safetensors" ] && [ -s "$tmp/w1.safetensors" ]; then
    if cmp -s "$tmp/w2.safetensors" "$tmp/w1.safetensors"; then equal=true; else equal=false; fi
  fi
  printf '{"tag": "weights_cmp", "rc": 0, "json": [{"equal": %s}]}\n' "$equal" >>"$results"
}

report() { # results.jsonl [metrics.jsonl]
  "$py" - "$1" "${2:-}" <<'PY'
import json, os, re, sys

results, metrics_path = sys.argv[1], sys.argv[2]
recs = {}
for line in open(results):
    if line.strip():
        r = json.loads(line)
        recs[r["tag"]] = r

# forward + backward FLOPs per sample as tandem's td_model_flops_per_sample counts them (forward,
# weight gradient, input gradient except below the first layer with parameters); used when
# tandem's JSON has no flops_per_sample
DEFAULT_FLOPS = {"basicnet": 71.57e6, "mlp7": 21.31e6, "resnet-small": 76.22e6}
MODELS = ("basicnet", "mlp7", "resnet-small")
PRECISIONS = ("fp32", "tf32", "bf16")
NAMES = {"basicnet": "BasicNet", "mlp7": "mlp7", "resnet-small": "resnet-small"}


def last(tag):
    """tag's last JSON object, or None. tandem's steady-state rate (after its first 10 steps,
    as the peer's warm-up steps are left out) stands for its samples_per_s."""
    r = recs.get(tag)
    o = r["json"][-1] if r and r["json"] else None
    if o and "samples_per_s_steady" in o:
        o = dict(o, samples_per_s=o["samples_per_s_steady"], samples_per_s_all=o["samples_per_s"])
    return o


def why(tag):
    r = recs.get(tag)
    if r is None:
        return "not run"
    if r["rc"] != 0:
        tail = r["err_tail"][-1] if r["err_tail"] else ""
        return f"failed (exit {r['rc']}){': ' + tail[:120] if tail else ''}"
    return "printed no JSON"


def ok(o, key):
    return o is not None and isinstance(o.get(key), (int, float)) and o[key] > 0


# tandem's throughput runs: tandem-MODEL-BATCH-PRECISION (tandem-MODEL-BATCH: fp32, older runs)
tandem_tags = {}
for tag in recs:
    m = re.fullmatch(r"tandem-(%s)-(\d+)(?:-(%s))?" % ("|".join(MODELS), "|".join(PRECISIONS)),
                     tag)
    if m:
        tandem_tags[(m[1], int(m[2]), m[3] or "fp32")] = tag

# the peers' lines: every torch-* record but time-to-accuracy's; a line without "precision" is
# fp32 (older runs)
torch_lines, torch_tags = {}, {}
peaks, peak_info = {}, {}
for tag, r in recs.items():
    for o in r["json"]:
        prec = o.get("precision", "fp32")
        tfl = o.get("gemm_tflops", o.get("sgemm_tflops"))
        if "gemm_tflops" in o or "sgemm_tflops" in o:
            if isinstance(tfl, (int, float)) and tfl > 0:
                peaks[prec], peak_info[prec] = tfl, o
        elif tag.startswith("torch-") and tag != "torch-tta" and o.get("model") in MODELS:
            key = (o["model"], o.get("batch"), prec)
            torch_lines[key + (o.get("mode"),)] = o
            torch_tags[key] = tag
    if tag.startswith("torch-") and tag != "torch-tta" and tag[len("torch-"):] in MODELS:
        torch_tags.setdefault((tag[len("torch-"):], None, None), tag)


def torch_mode(model, batch, precision, mode):
    return torch_lines.get((model, batch, precision, mode))


def torch_why(model, batch, precision, mode):
    tag = torch_tags.get((model, batch, precision)) or torch_tags.get((model, None, None))
    o = torch_mode(model, batch, precision, mode)
    if o is not None:
        if "error" in o:
            return o["error"]
        if "skipped" in o:
            return "skipped: " + o["skipped"]
        return "no samples_per_s"
    if tag is None:
        return "not run"
    return f"no line for it; the peer {why(tag) if recs[tag]['rc'] != 0 else 'ended without it'}"


def fmt(v, spec, width):
    return f"{v:{width}{spec}}" if isinstance(v, (int, float)) else f"{'n/a':>{width}s}"


def pct(v, width):
    return fmt(v, '.1f', width - 1) + "%" if isinstance(v, (int, float)) else fmt(None, "", width)


def ratio(a, b):
    return a / b if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b > 0 else None


def flops_per_sample(o, model):
    if o is not None:
        if ok(o, "flops_per_sample"):
            return o["flops_per_sample"], "tandem"
        if ok(o, "mflop_per_sample"):
            return 1e6 * o["mflop_per_sample"], "tandem"
    return DEFAULT_FLOPS[model], "default"


problems = []
rows = sorted(set(tandem_tags) | {k for k in torch_tags if k[1] is not None},
              key=lambda k: (MODELS.index(k[0]), k[1], PRECISIONS.index(k[2])))
versions = {(o.get("torch"), o.get("cuda"), o.get("device")) for r in recs.values()
            for o in r["json"] if o.get("peer") == "torch" or "gemm_tflops" in o}
versions = sorted(v for v in versions if v[0])
if versions:
    print()
    print("pytorch: " + "; ".join(f"{t}{' cuda ' + c if c else ''} on {d}"
                                  for t, c, d in versions))

print()
print("throughput (samples/s; steps in us; % of torch.mm's peak at the same precision)")
print(f"{'model':12s} {'batch':>5s} {'prec':4s} {'tandem':>10s} {'torch eager':>12s}"
      f" {'torch graph':>12s} {'t/eager':>8s} {'t/graph':>8s} {'tandem step':>12s}"
      f" {'graph step':>11s} {'tandem %pk':>10s} {'graph %pk':>10s}")
flops_src = set()
ratios = {}  # (model, batch, precision) -> (tandem / torch graph, note)
prev_batch = None
for model, batch, prec in rows:
    if prev_batch is not None and (model, batch) != prev_batch:
        print()
    prev_batch = (model, batch)
    tag = tandem_tags.get((model, batch, prec))
    td = last(tag) if tag else None
    td_sps = td["samples_per_s"] if ok(td, "samples_per_s") else None
    note = ""
    if tag is None:
        problems.append(f"tandem-{model}-{batch}-{prec}: not run")
    elif td_sps is None:
        problems.append(f"{tag}: {why(tag)}")
    elif td is not None and "precision" not in td:
        problems.append(f"{tag}: tandem's JSON has no \"precision\" (does this tandem know "
                        "--precision?)")
    elif td is not None and td["precision"] != prec:
        note = f"tandem's JSON says it ran {td['precision']}"
        problems.append(f"{tag}: asked for {prec}, {note}")
        td_sps = None
    e, g = torch_mode(model, batch, prec, "eager"), torch_mode(model, batch, prec, "graph")
    e_sps = e["samples_per_s"] if ok(e, "samples_per_s") else None
    g_sps = g["samples_per_s"] if ok(g, "samples_per_s") else None
    for mode, v in (("eager", e_sps), ("graph", g_sps)):
        if v is None:
            problems.append(f"torch {model} batch {batch} {prec} {mode}: "
                            f"{torch_why(model, batch, prec, mode)}")
    fps, src = flops_per_sample(td, model)
    flops_src.add(src)
    peak = peaks.get(prec)
    td_step = 1e6 * batch / td_sps if td_sps else None
    td_pk = 100 * fps * td_sps / (peak * 1e12) if td_sps and peak else None
    g_pk = 100 * fps * g_sps / (peak * 1e12) if g_sps and peak else None
    ratios[(model, batch, prec)] = (ratio(td_sps, g_sps), note)
    print(f"{model:12s} {batch:5d} {prec:4s} {fmt(td_sps, '.0f', 10)} {fmt(e_sps, '.0f', 12)}"
          f" {fmt(g_sps, '.0f', 12)} {fmt(ratio(td_sps, e_sps), '.2f', 8)}"
          f" {fmt(ratio(td_sps, g_sps), '.2f', 8)} {fmt(td_step, '.1f', 12)}"
          f" {fmt(g['step_us'] if ok(g, 'step_us') else None, '.1f', 11)}"
          f" {pct(td_pk, 10)} {pct(g_pk, 10)}")
if not rows:
    print("  (no throughput runs)")
if peaks:
    o = next(iter(peak_info.values()))
    print("peaks (torch.mm " + f"{o.get('n')}^2 on {o.get('device')}): " + ", ".join(
        f"{p} {peaks[p]:.1f}" for p in PRECISIONS if p in peaks) + " TFLOP/s"
        " (fp32: TF32 off; tf32: fp32 with TF32; bf16: bf16 operands)")
else:
    print("peaks: n/a (no gemm measurement in this run)")
for prec in sorted({k[2] for k in rows} - set(peaks), key=PRECISIONS.index):
    problems.append(f"gemm peak {prec}: not measured")
if "default" in flops_src:
    print("FLOPs per sample (forward + backward): from tandem's JSON where present, else "
          "71.57 M for basicnet, 21.31 M for mlp7 and 76.22 M for resnet-small (tandem's count: "
          "forward, weight gradient, input gradient except at the first layer)")

# time to 90%
print()
print("time to 90% test accuracy (BasicNet, batch 64, fp32, AdamW lr 1e-3, evaluation after each "
      "epoch)")
td = last("tandem-tta")
td_t, td_note = None, ""
if td is not None:
    evals = td.get("evals") or []
    hit = next((e for e in evals if e.get("test_acc", 0) >= 90.0), None)
    accs = ", ".join(f"{e['test_acc']:.2f}% at step {e['step']}" for e in evals)
    if evals and all("train_s" in e for e in evals):
        # counted as the peer counts: from the first training step, evaluations included
        td_t = hit["train_s"] if hit else None
        td_note = (f"[{accs}]; from the first step (evaluations included; data loading and "
                   f"CUDA set-up excluded, as for the peer: with them {hit['wall_s']:.2f} s)"
                   if hit else f"[{accs}]")
    elif evals and all("wall_s" in e for e in evals):
        td_t = hit["wall_s"] if hit else None
        td_note = (f"[{accs}]; the eval's wall_s from tandem's JSON, counted from before "
                   "loading the data (loading and CUDA set-up included)")
    else:
        # the metrics lines are {"step": S, "test/acc": A}: no wall time, so prorate wall_s
        pts = []
        if os.path.exists(metrics_path):
            for line in open(metrics_path):
                try:
                    m = json.loads(line)
                except ValueError:
                    continue
                if isinstance(m.get("test/acc"), (int, float)):
                    pts.append((m["step"], m["test/acc"]))
        hit = next((p for p in pts if p[1] >= 90.0), None)
        steps = td.get("steps")
        accs = ", ".join(f"{a:.2f}% at step {s}" for s, a in pts)
        if hit and steps and ok(td, "wall_s"):
            td_t = td["wall_s"] * hit[0] / steps
        td_note = (f"[{accs}]; the metrics lines carry no wall time: estimated as wall_s "
                   f"({td.get('wall_s', float('nan')):.2f} s) x the fraction of the {steps} "
                   "steps done at the first evaluation >= 90%")
    print(f"  tandem       {fmt(td_t, '.2f', 7)} s  {'' if td_t else '(not reached in 2 epochs) '}"
          f"{td_note}")
else:
    print(f"  tandem           n/a  {why('tandem-tta')}")
    problems.append(f"tandem-tta: {why('tandem-tta')}")
pt = last("torch-tta")
pt_t = pt.get("time_to_acc_s") if pt else None
if pt is not None:
    accs = ", ".join(f"{a:.2f}% at {w:.2f} s" for a, w in zip(pt["acc"], pt["epoch_wall_s"]))
    print(f"  torch eager  {fmt(pt_t, '.2f', 7)} s  {'' if pt_t else '(not reached in 3 epochs) '}"
          f"[{accs}]; data loading ({pt['load_s']:.2f} s) excluded, evaluations included")
else:
    print(f"  torch eager      n/a  {why('torch-tta')}")
    problems.append(f"torch-tta: {why('torch-tta')}")
tta_ratio = ratio(td_t, pt_t)
print(f"  tandem / torch eager: {fmt(tta_ratio, '.3f', 0)}")

# 2 workers
print()
print("reducing between 2 workers (BasicNet, fp32, global batch 128: 2 workers x 64 vs 1 worker x 64 "
      "x accum 2)")
steps_us = {}
for tag, label in (("tandem-2workers", "2 workers, batch 64"),
                   ("tandem-1worker-accum2", "1 worker, batch 64, accum 2")):
    o = last(tag)
    if ok(o, "samples_per_s"):
        gb = o.get("global_batch") or 128
        steps_us[tag] = 1e6 * gb / o["samples_per_s"]
        extra = ""
        if (o.get("world_size") or 1) > 1 and ("comm_s_per_step" in o
                                                or "comm_wait_s_per_step" in o):
            extra = (f"; reducer: {1e6 * o.get('comm_s_per_step', 0):.1f} us in allreduce, "
                     f"{1e6 * o.get('comm_wait_s_per_step', 0):.1f} us not overlapped")
        print(f"  {label:28s} {o['samples_per_s']:10.0f} samples/s, step {steps_us[tag]:9.1f} us"
              f" (global batch {gb}, world size {o.get('world_size', '?')}){extra}")
    else:
        print(f"  {label:28s} n/a: {why(tag)}")
        problems.append(f"{tag}: {why(tag)}")
if len(steps_us) == 2:
    d = steps_us["tandem-2workers"] - steps_us["tandem-1worker-accum2"]
    print(f"  step time added by the reduction: {d:+.1f} us per step")
else:
    print("  step time added by the reduction: n/a")
eq = last("weights_cmp")
eq = eq.get("equal") if eq else None
print(f"  bitwise equal: {'yes' if eq is True else 'no' if eq is False else 'n/a (weights missing)'}")

# targets
print()
for (model, batch, prec), (r, note) in ratios.items():
    if model != "basicnet":
        continue
    target = 2.0 if (batch, prec) == (64, "fp32") else 1.5
    print(f"{'PASS' if r is not None and r >= target else 'FAIL'}  BasicNet batch {batch} {prec}: "
          f"tandem / torch graph = {fmt(r, '.2f', 0) + 'x' if r is not None else 'n/a'}"
          f" (target >= {target:g}x){'; ' + note if note else ''}")
print(f"{'PASS' if tta_ratio is not None and tta_ratio <= 0.25 else 'FAIL'}  time to 90% (fp32): "
      f"tandem / torch eager = {fmt(tta_ratio, '.3f', 0)} (target <= 0.25)")
if problems:
    print()
    print("problems:")
    for p in problems:
        print(f"  {p}")
PY
}

main() {
  header
  check_inputs || return 2
  local t0=$SECONDS
  measure_throughput
  measure_time_to_acc
  measure_two_workers
  echo "  load average after: $(cut -d' ' -f1-3 /proc/loadavg); $((SECONDS - t0)) s in all"
  if [ -n "${OUT:-}" ]; then
    cp "$results" "$OUT/bench_gpu_results.jsonl"
    [ -s "$tmp/metrics.jsonl" ] && cp "$tmp/metrics.jsonl" "$OUT/bench_gpu_metrics.jsonl"
  fi
  report "$results" "$tmp/metrics.jsonl"
}

if [ -n "${REPORT_ONLY:-}" ]; then # the report of a saved run (OUT's bench_gpu_results.jsonl)
  if [ ! -f "$REPORT_ONLY" ]; then
    echo "bench_gpu: REPORT_ONLY: $REPORT_ONLY is not a file" >&2
    exit 2
  fi
  report "$REPORT_ONLY" "$(dirname "$REPORT_ONLY")/bench_gpu_metrics.jsonl"
  exit
fi
if [ -n "${OUT:-}" ]; then
  mkdir -p "$OUT"
  main 2>&1 | tee "$OUT/bench_gpu.log"
  exit "${PIPESTATUS[0]}"
fi
main
