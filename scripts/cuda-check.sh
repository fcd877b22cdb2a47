#!/usr/bin/env bash
# The CUDA backend built and checked on a machine without a GPU or a CUDA toolkit: nvcc and its
# headers from PyPI (tests/requirements-cuda.txt) and the CUDA runtime, cuBLAS and NCCL that
# PyTorch's wheels bring (the frameworks environment), both made by scripts/venv.sh, assembled
# into a toolkit tree of links. Then the CUDA build with warnings as errors, the kernels' host
# test (tests/gpu/test_gpu_kernels_host.cu: kernel bodies run over every thread of their
# launches on the CPU, against direct loops), and the CLI's answer where no driver is.
# What it cannot show is anything a device runs: that is tests/gpu on the GPU host
# (scripts/gpu-round.sh).
#   scripts/cuda-check.sh [BUILD_DIR]     (default build-cuda); exit 77 when the environments
#                                          are missing (run scripts/venv.sh)
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$src/build-cuda}
cuda_venv=$("$src/scripts/venv.sh" --print-cuda)
fw_venv=${TANDEM_FRAMEWORKS_VENV:-$("$src/scripts/venv.sh" --print-frameworks)}
site() { echo "$1"/lib/python3*/site-packages/nvidia; }
nv=$(site "$cuda_venv") fw=$(site "$fw_venv")
for need in "$nv/cu13/bin/nvcc" "$fw/cu13/include/cublas_v2.h" "$fw/cu13/lib/libcudart.so.13" \
            "$fw/nccl/include/nccl.h"; do
  [ -e "$need" ] || { echo "cuda-check: skipped: $need is missing; run scripts/venv.sh"; exit 77; }
done

# The toolkit tree: nvcc's own directory linked whole (it finds its headers from where it lies),
# every header and library of both environments linked one by one, nvcc's winning on a clash.
kit=$build/toolkit
rm -rf "$kit"
mkdir -p "$kit/include" "$kit/lib"
ln -s "$nv/cu13/bin" "$kit/bin"
ln -s "$nv/cu13/nvvm" "$kit/nvvm"
for d in "$fw/nccl" "$fw/cu13" "$nv/cu13"; do
  for f in "$d"/include/*; do ln -sfn "$f" "$kit/include/"; done
  for f in "$d"/lib/*; do ln -sfn "$f" "$kit/lib/"; done
done
for l in cudart cublas cublasLt nccl; do
  so=$(cd "$kit/lib" && ls lib$l.so.* | head -1)
  ln -sfn "$so" "$kit/lib/lib$l.so"
done
ln -s lib "$kit/lib64"

conf_log=$build/cuda-check.configure.log build_log=$build/cuda-check.build.log # in the build
cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Release -DTANDEM_WERROR=ON -DTANDEM_CUDA=ON \
  -DTANDEM_TORCH=OFF -DCMAKE_CUDA_COMPILER="$kit/bin/nvcc" -DCUDAToolkit_ROOT="$kit" \
  -DCMAKE_CUDA_ARCHITECTURES=90 >"$conf_log" 2>&1 ||
  { cat "$conf_log"; exit 1; }
grep -q "CUDA backend on" "$conf_log" ||
  { echo "cuda-check: the CUDA backend was not configured"; cat "$conf_log"; exit 1; }
cmake --build "$build" -j"$(nproc)" --target tandem gpu_test_gpu_kernels_host >"$build_log" 2>&1 ||
  { grep -E "error|warning" "$build_log" | head -40; echo "cuda-check: build failed ($build_log)"; exit 1; }
export LD_LIBRARY_PATH=$kit/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
"$build/tests/gpu_test_gpu_kernels_host"
# No driver here: the CLI must say so and name the way out, not crash or train on the CPU.
if out=$("$build/tandem" train --device cuda --steps 1 --data "${TANDEM_DATA:-/usr/share/datasets/fashion-mnist}" 2>&1); then
  echo "cuda-check: 'tandem train --device cuda' succeeded on a machine without a driver:"; echo "$out"; exit 1
fi
grep -q "no CUDA device can be used here.*--device cpu" <<<"$out" ||
  { echo "cuda-check: unexpected answer without a driver:"; echo "$out"; exit 1; }
echo "cuda-check: the CUDA backend builds (nvcc $("$kit/bin/nvcc" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p'), -Werror), its kernels' host test passes, and without a driver the CLI says so"
