#!/usr/bin/env bash
# The tandem demo: installs what is missing, builds, and trains BasicNet on Fashion-MNIST for
# 2 epochs with the progress bar (about 2 minutes on 2 cores; ~90% test accuracy).
#   scripts/demo.sh                 the demo
#   scripts/demo.sh --threads 1     extra arguments go to `tandem train`
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
scripts/build.sh
build_dir=${TANDEM_BUILD_DIR:-build}
data=/usr/share/datasets/fashion-mnist
echo
echo "== tandem train: basicnet, 2 epochs, AdamW lr 1e-3, batch 64 =="
"$build_dir/tandem" train --model basicnet --data "$data" --epochs 2 --batch 64 \
  --progress --save "$build_dir/basicnet.safetensors" "$@"
echo "weights: $build_dir/basicnet.safetensors"
