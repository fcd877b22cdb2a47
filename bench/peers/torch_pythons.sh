# The PyTorch interpreters the benchmarks' peers run on, sourced by bench_train.sh, bench_ddp.sh
# and bench_comm.sh so that all three measure the same two in one invocation:
#
#   1. PYTHON, default /usr/bin/python3: Debian's python3-torch (1.13), the quick peer;
#   2. PYTHON2, default the frameworks' virtual environment of scripts/venv.sh
#      ($TANDEM_FRAMEWORKS_VENV/bin/python, else the path `scripts/venv.sh --print-frameworks`
#      prints): PyTorch 2.x from PyPI, the current release a user would pick.
#      PYTHON2=none leaves it out.
#
# torch_pythons ROOT WHAT: fills PEER_PY (interpreters) and PEER_TORCH (their torch versions,
# "+cu..." dropped) with those that import torch, and prints to stderr one line per interpreter
# left out, saying why. WHAT names the caller in those lines.
torch_pythons() {
  local root=$1 what=$2 py2 venv v
  PEER_PY=() PEER_TORCH=()
  py2=${PYTHON2:-}
  if [ -z "$py2" ]; then
    venv=${TANDEM_FRAMEWORKS_VENV:-$(bash "$root/scripts/venv.sh" --print-frameworks 2>/dev/null || true)}
    if [ -z "$venv" ] || [ ! -x "$venv/bin/python" ]; then
      echo "$what: no PyTorch 2.x peer: no frameworks venv at '${venv:-?}' (bash scripts/venv.sh makes it; or set PYTHON2)" >&2
      py2=none
    elif [ ! -f "$venv/.tandem-requirements" ]; then
      echo "$what: no PyTorch 2.x peer: $venv is not ready yet (no .tandem-requirements: scripts/venv.sh is still installing, or failed)" >&2
      py2=none
    else
      py2=$venv/bin/python
    fi
  fi
  for p in "${PYTHON:-/usr/bin/python3}" "$py2"; do
    [ "$p" = none ] && continue
    if v=$("$p" -c 'import torch, torch.distributed; print(torch.__version__.split("+")[0])' 2>/dev/null); then
      PEER_PY+=("$p") PEER_TORCH+=("$v")
    else
      echo "$what: skipping $p: it cannot import torch" >&2
    fi
  done
}
