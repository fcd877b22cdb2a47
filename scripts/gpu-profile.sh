#!/usr/bin/env bash
# Where a GPU step's time goes, kernel by kernel: Nsight Compute (ncu) times every kernel of a
# few training steps of tandem (launched one by one, TANDEM_CUDA_GRAPH=0) and of the PyTorch peer
# (eager). Run on the GPU host after scripts/gpu-round.sh has built build-gpu/, .gpu-host carried:
#     scripts/gpu-profile.sh [CASE...]      CASE = model:batch:precision (tandem),
#                                           torch:model:batch:precision (the peer, eager)
# Default: resnet-small at batch 256, fp32 and bf16, both sides (about a minute on an H200).
# Output in $OUT: profile.txt (per case: the kernels by time per step, the step's sum) and
# profile-cases.tar.gz (per case its CSV and one step's kernels in launch order, to tell which
# layer a kernel serves).
# One metric only (gpu__time_duration): each more replays every kernel (three took 9 passes and
# ran 20x longer). ncu serialises the kernels, so the sum exceeds a step in a CUDA graph: read
# the shares. env: CASE_TIMEOUT_S (each case's run, default 120).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-$PWD/gpu-round-logs}
mkdir -p "$out"
report=$out/profile.txt
: >"$report"
# shellcheck disable=SC1091
source .gpu-host/env.sh >/dev/null ||
  { echo "gpu-profile: no .gpu-host/env.sh: run ../shared/gpu-host/kit.sh here first" >&2; exit 1; }
py=$(command -v python3)
tandem=build-gpu/tandem
[ -x "$tandem" ] || { echo "gpu-profile: no $tandem: run scripts/gpu-round.sh first" >&2; exit 1; }
cases=("$@")
[ ${#cases[@]} = 0 ] && cases=(resnet-small:256:fp32 resnet-small:256:bf16
                               torch:resnet-small:256:fp32 torch:resnet-small:256:bf16)
tmp=$(mktemp -d)
mkdir "$tmp/cases"
# the device tool brings back a few files only: the cases' CSVs and listings go in one archive
trap 'tar -C "$tmp/cases" -czf "$out/profile-cases.tar.gz" . ; rm -rf "$tmp"' EXIT
"$py" bench/data/cifar_like.py "$tmp/x.npy" "$tmp/y.npy" || exit 1

for c in "${cases[@]}"; do
  IFS=: read -ra f <<<"$c"
  name=${c//:/-}
  if [ "${f[0]}" = torch ]; then
    model=${f[1]} batch=${f[2]} prec=${f[3]}
    data=(--data "$TANDEM_DATA")
    [ "$model" = resnet-small ] && data+=(--npy "$tmp/x.npy,$tmp/y.npy")
    cmd=("$py" bench/peers/torch_gpu_bench.py --model "$model" --batch "$batch" --precision "$prec"
         --mode eager --warmup 1 --steps 2 "${data[@]}")
  else
    model=${f[0]} batch=${f[1]} prec=${f[2]}
    data=(--data "$TANDEM_DATA" --mean 0.2860 --std 0.3530)
    [ "$model" = resnet-small ] && data=(--data "$tmp/x.npy,$tmp/y.npy")
    cmd=("$tandem" train --device cuda --precision "$prec" --model "$model" "${data[@]}"
         --batch "$batch" --steps 3 --no-eval-every-epoch --no-progress)
  fi
  echo "== $c: ${cmd[*]}" >>"$report"
  TANDEM_CUDA_GRAPH=0 timeout "${CASE_TIMEOUT_S:-120}" ncu --clock-control none \
      --metrics gpu__time_duration.sum --csv --print-units base --page raw \
      --log-file "$tmp/cases/$name.csv" "${cmd[@]}" >"$tmp/$name.log" 2>&1 \
    || { echo "failed ($?):" >>"$report"; tail -15 "$tmp/$name.log" >>"$report"; continue; }
  # Steps end at the optimizer's kernels (tandem's adamw_kernel, PyTorch's AdamW: a run of
  # them): the first step (warm-up) and what follows the last (evaluation) are left out.
  "$py" - "$tmp/cases/$name.csv" >>"$report" 2>&1 <<'PY'
import collections, csv, sys
path = sys.argv[1]
lines = open(path).read().splitlines()
head = next(k for k, l in enumerate(lines) if l.startswith('"ID"'))
rows = [r for r in csv.DictReader(lines[head:]) if r.get("ID", "").isdigit()]
ns = lambda r: float(r["gpu__time_duration.sum"].replace(",", ""))
opt = [k for k, r in enumerate(rows)
       if "adam" in r["Kernel Name"].lower() or "multi_tensor" in r["Kernel Name"].lower()]
ends = [k for k in opt if k + 1 not in opt]   # the last kernel of each step
if len(ends) < 2:
    sys.exit(f"{path}: fewer than two steps found")
rows, steps = rows[ends[0] + 1:ends[-1] + 1], len(ends) - 1
agg = collections.OrderedDict()
for r in rows:
    a = agg.setdefault(r["Kernel Name"][:64], [0, 0.0])
    a[0] += 1
    a[1] += ns(r)
total = sum(a[1] for a in agg.values())
print(f"{'kernel':64} {'n/step':>6} {'us/step':>9} {'share':>6}")
for n, a in sorted(agg.items(), key=lambda kv: -kv[1][1])[:25]:
    print(f"{n:64} {a[0] / steps:6.1f} {a[1] / steps / 1e3:9.1f} {a[1] / total:6.1%}")
print(f"{'sum of ' + str(steps) + ' steps, per step':64} {len(rows) / steps:6.1f} "
      f"{total / steps / 1e3:9.1f}")
with open(path[:-4] + ".order.txt", "w") as o:   # the last step in launch order
    for r in rows[-(len(rows) // steps):]:
        o.write(f"{ns(r) / 1e3:9.1f} us  {r['Kernel Name'][:100]}\n")
PY
done
cat "$report"
