# What the GPU test scripts share; source it after `set -euo pipefail`. It makes $work (removed
# on exit) and defines:
#   gpu_or_skip ARGS...  runs `tandem train --device cuda ARGS` briefly; exits 77 naming the
#                        reason where there is no CUDA device or no CUDA backend, 1 on another
#                        failure (so a test never passes by not running)
#   run NAME CMD...      CMD's output to $work/NAME.log; on failure the log's tail, exit 1
#   same A B WHAT        $work/A and $work/B are the same bytes, or exit 1
#   near GOT REF FROM FRAC WHAT
#                        the weights in $work/GOT (safetensors) end within FRAC of the distance
#                        REF moved from FROM (both mean |w|) from REF, or exit 1
#   GPU_LIB_DIR          this folder: Python heredocs put it on sys.path for st_load.py's
#                        load(path) -> {tensor name: float32 array} of a .safetensors file
: "${TANDEM_BIN:?}" "${TANDEM_DATA:?}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

gpu_or_skip() {
  local out
  if ! out=$("$TANDEM_BIN" train --device cuda --data "$TANDEM_DATA" --steps 1 --no-progress \
        "$@" 2>&1); then
    case "$out" in
      *"no CUDA device"*|*"without the CUDA backend"*)
        echo "SKIP: $(grep -m1 -o 'error: .*' <<<"$out")"; exit 77 ;;
    esac
    echo "$out"; exit 1
  fi
}

run() { # name cmd...
  local name=$1; shift
  if ! "$@" >"$work/$name.log" 2>&1; then echo "FAIL: $name"; tail -20 "$work/$name.log"; exit 1; fi
}

same() { # a b what
  if ! cmp "$work/$1" "$work/$2"; then echo "FAIL: $3"; exit 1; fi
  echo "ok: $3"
}

GPU_LIB_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

near() { # got ref from frac what
  "${PYTHON:-python3}" - "$work" "$GPU_LIB_DIR" "$@" <<'PY'
import sys
import numpy as np
sys.path.insert(0, sys.argv[2])
from st_load import flat, load
d, got, ref, start, frac, what = sys.argv[1], *sys.argv[3:]
got, ref, start = (flat(load(f"{d}/{k}")) for k in (got, ref, start))
travel, diff = float(np.abs(ref - start).mean()), float(np.abs(got - ref).mean())
said = f"{what}: {diff:.2e} (mean |w|) from the reference, which moved {travel:.2e}"
if not (travel > 0 and diff < float(frac) * travel):
    sys.exit(f"FAIL: {said}; the bound is {frac} of that")
print(f"ok: {said}")
PY
  [ $? = 0 ] || exit 1
}
