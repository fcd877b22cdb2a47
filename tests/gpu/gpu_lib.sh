# What the GPU test scripts share; source it after `set -euo pipefail`. It makes $work (removed
# on exit) and defines:
#   gpu_or_skip ARGS...  runs `tandem train --device cuda ARGS` briefly; exits 77 naming the
#                        reason where there is no CUDA device or no CUDA backend, 1 on another
#                        failure (so a test never passes by not running)
#   run NAME CMD...      CMD's output to $work/NAME.log; on failure the log's tail, exit 1
#   same A B WHAT        $work/A and $work/B are the same bytes, or exit 1
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
