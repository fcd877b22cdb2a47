#!/usr/bin/env bash
# Training on one GPU, tandem's CUDA backend vs PyTorch, in one invocation on the GPU host.
# Everything is fp32 (TF32 off), AdamW lr 1e-3, Fashion-MNIST resident on the GPU.
#
#   throughput   BasicNet and mlp7 at batch 64 and 512:
#                tandem:  tandem train --device cuda --model M --batch B --steps N
#                         --no-eval-every-epoch --no-progress --json   (samples_per_s over all N
#                         steps: 2000 at batch 64, 500 at 512, so start-up does not dominate)
#                pytorch: bench/peers/torch_gpu_bench.py --mode eager,graph (30 warm-up steps,
#                         then 300 timed; graph = the whole step in one CUDA graph)
#                ratios tandem/eager and tandem/graph
#   peak share   tandem's flops_per_sample x samples_per_s against fp32 sgemm TFLOP/s measured
#                with torch.mm (8192^2, TF32 off) in the same run
#   time to 90%  BasicNet batch 64: tandem --epochs 2 (evaluation after each epoch) vs PyTorch
#                eager --time-to-acc 90 (at most 3 epochs)
#   2 workers    the step time added by reducing between 2 workers: tandem --nproc-per-node 2
#                --batch 64 vs 1 worker --batch 64 --accum 2 (the same global batch 128), and
#                whether the two write bitwise-equal weights (--save, cmp)
# Targets, printed as PASS/FAIL lines (not the exit code): BasicNet batch 64 tandem >= 2x torch
# graph; time to 90% <= 1/4 of torch eager's. About 2-3 minutes on an H100 (--quick: ~1).
#
# usage: bench/bench_gpu.sh [--quick]
# env:   TANDEM_BIN (default build-gpu/tandem, else build/tandem), TANDEM_DATA (Fashion-MNIST
#        dir), PYTHON (python3 with CUDA torch), OUT (also write the output to
#        $OUT/bench_gpu.log), TIMEOUT_S (per command, default 300), TORCH_CUDNN_BENCHMARK=1
#        (cudnn.benchmark on for PyTorch), and step counts: TANDEM_STEPS_64 (2000),
#        TANDEM_STEPS_512 (500), TORCH_STEPS (300), TORCH_WARMUP (30), DDP_STEPS (500)
set -uo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)

quick=0
for arg in "$@"; do
  case $arg in
    --quick) quick=1 ;;
    -h | --help) sed -n '2,29p' "$0"; exit 0 ;;
    *) echo "bench_gpu: unknown argument '$arg' (see --help)" >&2; exit 2 ;;
  esac
done

data=${TANDEM_DATA:-/usr/share/datasets/fashion-mnist}
py=${PYTHON:-python3}
peer=$src/bench/peers/torch_gpu_bench.py
limit=${TIMEOUT_S:-300}
if [ $quick = 1 ]; then
  td_steps_64=${TANDEM_STEPS_64:-400} td_steps_512=${TANDEM_STEPS_512:-100}
  pt_steps=${TORCH_STEPS:-100} pt_warmup=${TORCH_WARMUP:-10} ddp_steps=${DDP_STEPS:-100}
else
  td_steps_64=${TANDEM_STEPS_64:-2000} td_steps_512=${TANDEM_STEPS_512:-500}
  pt_steps=${TORCH_STEPS:-300} pt_warmup=${TORCH_WARMUP:-30} ddp_steps=${DDP_STEPS:-500}
fi
pt_extra=()
[ "${TORCH_CUDNN_BENCHMARK:-0}" = 1 ] && pt_extra+=(--cudnn-benchmark)

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
print(f"  {tag:24s} {wall:6.1f} s{status}", flush=True)
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
  echo "bench_gpu: tandem (CUDA) vs PyTorch, fp32 (TF32 off), AdamW lr 1e-3, Fashion-MNIST on the GPU"
  if command -v nvidia-smi >/dev/null 2>&1; then
    echo "  gpu: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -n 1)"
  fi
  echo "  tandem: $tandem    pytorch: $("$py" -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda)' 2>&1 | tail -n 1)"
  echo "  data: $data    $([ $quick = 1 ] && echo 'quick: ' )tandem steps $td_steps_64 (batch 64) / $td_steps_512 (batch 512), torch $pt_warmup warm-up + $pt_steps timed, 2-worker $ddp_steps"
  echo "  load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
}

check_inputs() {
  if [ ! -f "$data/train-images-idx3-ubyte.gz" ] || [ ! -f "$data/t10k-images-idx3-ubyte.gz" ]; then
    echo "bench_gpu: no Fashion-MNIST IDX .gz files in $data (source .gpu-host/env.sh, or set TANDEM_DATA)" >&2
    return 2
  fi
  if [ ! -x "$tandem" ]; then
    echo "bench_gpu: $tandem is not an executable; tandem's side will show as failed (set TANDEM_BIN)" >&2
  elif ! "$tandem" train --help 2>&1 | grep -q -- '--device'; then
    echo "bench_gpu: note: '$tandem train --help' does not mention --device; tandem's runs may fail" >&2
  fi
  return 0
}

tandem_steps_for() { # batch -> timed steps
  if [ "$1" -ge 512 ]; then echo "$td_steps_512"; else echo "$td_steps_64"; fi
}

measure_sgemm() {
  run sgemm "$py" "$peer" --sgemm
}

measure_throughput() { # model batch: tandem, then PyTorch eager and graph in one process
  local model=$1 batch=$2
  run "tandem-$model-$batch" "$tandem" train --device cuda --model "$model" --data "$data" \
    --batch "$batch" --steps "$(tandem_steps_for "$batch")" --no-eval-every-epoch --no-progress \
    --json
  run "torch-$model-$batch" "$py" "$peer" --model "$model" --batch "$batch" --mode eager,graph \
    --warmup "$pt_warmup" --steps "$pt_steps" --data "$data" "${pt_extra[@]}"
}

measure_time_to_acc() { # BasicNet batch 64 to 90% test accuracy
  rm -f "$tmp/metrics.jsonl"
  run tandem-tta env TANDEM_METRICS="$tmp/metrics.jsonl" "$tandem" train --device cuda \
    --model basicnet --data "$data" --epochs 2 --batch 64 --no-progress --json
  run torch-tta "$py" "$peer" --model basicnet --batch 64 --time-to-acc 90 --epochs 3 \
    --data "$data" "${pt_extra[@]}"
}

measure_two_workers() { # the same global batch 128: 2 workers x 64 vs 1 worker x 64 x accum 2
  local common=(--device cuda --model basicnet --data "$data" --batch 64 --steps "$ddp_steps"
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

report() {
  "$py" - "$results" "$tmp/metrics.jsonl" <<'PY'
import json, os, sys

results, metrics_path = sys.argv[1], sys.argv[2]
recs = {}
for line in open(results):
    r = json.loads(line)
    recs[r["tag"]] = r

# forward + backward FLOPs per sample as tandem's td_model_flops_per_sample counts them (forward,
# weight gradient, input gradient except below the first layer with parameters); used when
# tandem's JSON has no flops_per_sample
DEFAULT_FLOPS = {"basicnet": 71.57e6, "mlp7": 21.31e6}


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


def torch_mode(model, batch, mode):
    r = recs.get(f"torch-{model}-{batch}")
    for o in (r["json"] if r else []):
        if o.get("mode") == mode:
            return o
    return None


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


sg = last("sgemm")
peak = sg["sgemm_tflops"] if ok(sg, "sgemm_tflops") else None
problems = []

print()
print("throughput (samples/s; steps in us; % of the fp32 sgemm peak)")
print(f"{'model':9s} {'batch':>5s} {'tandem':>10s} {'torch eager':>12s} {'torch graph':>12s}"
      f" {'t/eager':>8s} {'t/graph':>8s} {'tandem step':>12s} {'graph step':>11s}"
      f" {'tandem %pk':>10s} {'graph %pk':>10s}")
flops_src = set()
for model in ("basicnet", "mlp7"):
    for batch in (64, 512):
        tag = f"tandem-{model}-{batch}"
        td = last(tag)
        td_sps = td["samples_per_s"] if ok(td, "samples_per_s") else None
        if td_sps is None:
            problems.append(f"{tag}: {why(tag)}")
        e, g = torch_mode(model, batch, "eager"), torch_mode(model, batch, "graph")
        e_sps = e["samples_per_s"] if ok(e, "samples_per_s") else None
        g_sps = g["samples_per_s"] if ok(g, "samples_per_s") else None
        for mode, o in (("eager", e), ("graph", g)):
            if o is None or "error" in o or "skipped" in o:
                problems.append(f"torch-{model}-{batch} {mode}: " + (
                    o.get("error") or "skipped: " + o.get("skipped", "") if o
                    else why(f"torch-{model}-{batch}")))
        fps, src = flops_per_sample(td, model)
        flops_src.add(src)
        td_step = 1e6 * batch / td_sps if td_sps else None
        td_pk = 100 * fps * td_sps / (peak * 1e12) if td_sps and peak else None
        g_pk = 100 * fps * g_sps / (peak * 1e12) if g_sps and peak else None
        print(f"{model:9s} {batch:5d} {fmt(td_sps, '.0f', 10)} {fmt(e_sps, '.0f', 12)}"
              f" {fmt(g_sps, '.0f', 12)} {fmt(ratio(td_sps, e_sps), '.2f', 8)}"
              f" {fmt(ratio(td_sps, g_sps), '.2f', 8)} {fmt(td_step, '.1f', 12)}"
              f" {fmt(g['step_us'] if ok(g, 'step_us') else None, '.1f', 11)}"
              f" {pct(td_pk, 10)} {pct(g_pk, 10)}")
print(f"fp32 peak: sgemm {peak:.1f} TFLOP/s (torch.mm {sg.get('n')}^2 on {sg.get('device')}, "
      "TF32 off)" if peak else
      f"fp32 peak: n/a (sgemm {why('sgemm')})")
if "default" in flops_src:
    print("FLOPs per sample (forward + backward): from tandem's JSON where present, else "
          "71.57 M for basicnet and 21.31 M for mlp7 (tandem's count: forward, weight gradient, "
          "input gradient except at the first layer)")

# time to 90%
print()
print("time to 90% test accuracy (BasicNet, batch 64, AdamW lr 1e-3, evaluation after each epoch)")
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
print("reducing between 2 workers (BasicNet, global batch 128: 2 workers x 64 vs 1 worker x 64 x accum 2)")
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
g = torch_mode("basicnet", 64, "graph")
t = last("tandem-basicnet-64")
r1 = ratio(t.get("samples_per_s") if t else None, g.get("samples_per_s") if g else None)
print(f"{'PASS' if r1 is not None and r1 >= 2.0 else 'FAIL'}  BasicNet batch 64: tandem / torch "
      f"graph = {fmt(r1, '.2f', 0) + 'x' if r1 is not None else 'n/a'} (target >= 2x)")
print(f"{'PASS' if tta_ratio is not None and tta_ratio <= 0.25 else 'FAIL'}  time to 90%: tandem / "
      f"torch eager = {fmt(tta_ratio, '.3f', 0)} (target <= 0.25)")
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
  measure_sgemm
  for model in basicnet mlp7; do
    for batch in 64 512; do
      measure_throughput "$model" "$batch"
    done
  done
  measure_time_to_acc
  measure_two_workers
  echo "  load average after: $(cut -d' ' -f1-3 /proc/loadavg); $((SECONDS - t0)) s in all"
  report
}

if [ -n "${OUT:-}" ]; then
  mkdir -p "$OUT"
  main 2>&1 | tee "$OUT/bench_gpu.log"
  exit "${PIPESTATUS[0]}"
fi
main
