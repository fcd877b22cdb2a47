#!/usr/bin/env bash
# Installs the Debian packages tandem needs, only those missing. Safe to run again.
# Build: compiler, CMake, OpenBLAS (CBLAS), OpenMP (gcc), zlib, libyaml, SQLite, jansson, libpng
# and libjpeg-turbo (the data layer's image decoders). PIL (python3-pil) writes the images
# tests/data/test_formats.c compares against; scikit-learn (python3-sklearn) holds the real
# data sets of the data tests and bench/bench_data.sh.
# Fuzzing (tests/fuzz, scripts/fuzz.sh): clang with libFuzzer's runtime and clang's OpenMP.
# Run: the Fashion-MNIST dataset. Peers for tests and benchmarks: PyTorch (python3-torch),
# Open MPI, iproute2 (network namespaces for multi-host tests), Slurm and munge (the test
# cluster of tests/lib/slurm.sh, which runs daemons of its own, not the packages' services),
# OpenSSH's server and client (the ssh hosts of tests/lib/sshd.sh, likewise).
# tandem ui: libmicrohttpd (its HTTP server); node and npm, then `npm ci` in src/ui/web for the
# page's uPlot, which the build compiles into the binary (and puppeteer-core for its tests,
# which drive Debian's chromium).
# The cloud layer (src/cloud: EC2, S3): libcurl and expat; python3-venv for the tests' own
# environment (scripts/venv.sh: moto's server, boto3, the AWS CLI from PyPI).
set -euo pipefail
packages=(build-essential cmake pkg-config libopenblas-dev zlib1g-dev libyaml-dev
          libsqlite3-dev libjansson-dev dataset-fashion-mnist python3-torch python3-numpy
          libopenmpi-dev openmpi-bin iproute2 procps nettle-dev
          clang libclang-rt-14-dev libomp-14-dev
          slurmctld slurmd slurm-client munge openssh-server openssh-client
          libmicrohttpd-dev chromium libcurl4-openssl-dev libexpat1-dev python3-venv
          libpng-dev libjpeg62-turbo-dev python3-pil python3-sklearn)
command -v npm > /dev/null || packages+=(nodejs npm)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "tandem: installing missing Debian packages: ${missing[*]}"
  sudo_cmd=()
  [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
  export DEBIAN_FRONTEND=noninteractive
  # The Slurm and munge packages would start their stock services, which the tests do not use
  # (they run daemons of their own) and which fail without a cluster configuration: keep
  # services from starting during the install, as Debian's container images do.
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' | "${sudo_cmd[@]}" tee /usr/sbin/policy-rc.d > /dev/null
    "${sudo_cmd[@]}" chmod 755 /usr/sbin/policy-rc.d
    trap '"${sudo_cmd[@]}" rm -f /usr/sbin/policy-rc.d' EXIT
  fi
  if ! "${sudo_cmd[@]}" apt-get install -y --no-install-recommends "${missing[@]}"; then
    "${sudo_cmd[@]}" apt-get update
    "${sudo_cmd[@]}" apt-get install -y --no-install-recommends "${missing[@]}"
  fi
fi
# uPlot from the lock file, where it is not installed yet (node_modules is not in git).
web=$(cd "$(dirname "$0")/.." && pwd)/src/ui/web
if [ ! -d "$web/node_modules/uplot" ] && [ -f "$web/package-lock.json" ]; then
  echo "tandem: installing the ui page's npm packages (npm ci --prefix src/ui/web)"
  npm ci --prefix "$web"
fi
