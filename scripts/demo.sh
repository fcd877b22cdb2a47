#!/usr/bin/env bash
# The tandem demo: installs what is missing (scripts/deps.sh), builds (scripts/build.sh), then
# runs the example workflow `demo` as a tracked run: BasicNet on Fashion-MNIST, 2 data-parallel
# workers, 2 epochs, with rank 0's progress bar: the same bits every time on a machine, and the
# test accuracy of its OpenBLAS kernel (README.md, "The demo": 90.16% with SkylakeX's, 90.15%
# with Haswell's; 8.5 minutes from an empty build directory on a busy 2-core machine). Afterwards it shows the run through tandem ps / show /
# metrics / logs. The run is stored in .tandem/ of the repository (or $TANDEM_HOME).
#   scripts/demo.sh                      the demo
#   scripts/demo.sh --param epochs=1     extra arguments go to `tandem run`
# Its last line times each phase (deps, build, data, training), so a fresh clone's time can be
# read off one run: "demo timing: deps 41 s, build 254 s, ...", with the machine's load.
set -euo pipefail
cd "$(dirname "$0")/.."
# phase NAME: ends the phase running (if any) and starts NAME; phase_line: the timing line.
timing=() phase_name='' phase_t0=0 demo_t0=$(date +%s.%N) load0=$(cut -d' ' -f1 /proc/loadavg)
phase() {
  local now
  now=$(date +%s.%N)
  [ -z "$phase_name" ] || timing+=("$phase_name $(awk -v a="$phase_t0" -v b="$now" 'BEGIN { printf "%.0f s", b - a }')")
  phase_name=$1 phase_t0=$now
}
phase_line() {
  phase ''
  local joined
  joined=$(printf '%s, ' "${timing[@]}")
  echo "demo timing: ${joined%, }; total $(awk -v a="$demo_t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.0f s", b - a }')" \
       "on $(nproc) cores, load average $load0 at the start, $(cut -d' ' -f1 /proc/loadavg) at the end"
}
bold=
plain=
if [ -t 1 ]; then
  bold=$(printf '\033[1m')
  plain=$(printf '\033[0m')
fi
step() { printf '\n%s== %s ==%s\n' "$bold" "$*" "$plain"; }

phase deps # Debian's packages (the compiler, the libraries, the data set's package) and npm's
scripts/deps.sh
build_dir=${TANDEM_BUILD_DIR:-build}
phase build
step "building into $build_dir/ (scripts/build.sh; a few minutes the first time)"
log=$(mktemp /tmp/tandem-build-XXXXXX.log)
if ! scripts/build.sh >"$log" 2>&1; then
  tail -n 40 "$log"
  echo "demo: the build failed; the whole output is in $log" >&2
  exit 1
fi
rm -f "$log"
tandem=$PWD/$build_dir/tandem
[ "${build_dir#/}" != "$build_dir" ] && tandem=$build_dir/tandem
echo "built $tandem"
show() { # prints a command, then runs it
  printf '%s$ %s%s\n' "$bold" "$*" "$plain"
  eval "$@"
}

tandem() { "$tandem" "$@"; }

# The data set is Debian's dataset-fashion-mnist (deps above installs it): nothing to download
# or convert, so this phase is its check, and says so when it is missing.
phase data
data=/usr/share/datasets/fashion-mnist
for f in train-images-idx3-ubyte.gz train-labels-idx1-ubyte.gz t10k-images-idx3-ubyte.gz t10k-labels-idx1-ubyte.gz; do
  [ -s "$data/$f" ] || { echo "demo: $data/$f is missing: apt-get install dataset-fashion-mnist (scripts/deps.sh)" >&2; exit 1; }
done

step "tandem run demo: BasicNet on Fashion-MNIST, 2 workers x 1 thread, 2 epochs, batch 64 per worker"
code=0
phase training
show "tandem run -f examples/workflows.yaml demo $*" || code=$?
phase showing
# The newest run of the workflow is the one just made (tandem ps lists newest first; an earlier
# version took the last line, the oldest run, once the demo had run twice).
run=$("$tandem" ps -a | awk '$2 == "demo" && id == "" { id = $1 } END { print id }')
[ -n "$run" ] || { echo "demo: no run of the demo workflow was recorded" >&2; exit 1; }

step "the run afterwards"
show "tandem ps"
echo
show "tandem show $run"
echo
show "tandem metrics $run --key test/acc"
echo
show "tandem logs $run --rank 0 | tail -n 4"
t=$build_dir/tandem
cat <<EOF

Look at it in the dashboard (docs/ui.md): the runs, their curves (live while a run trains),
logs, artifacts, and several runs compared:
  $t ui        then open the URL it prints (Ctrl-C stops it)

Try next (README.md, "The demo", says more):
  $t metrics $run --key train/loss --csv | head    every point; also --json
  $t artifacts $run --download /tmp/weights         the weights, SHA-256 checked
  $t run -f examples/workflows.yaml -d demo         detached: prints the new run's id; once
  ls .tandem/runs/<id>/checkpoints                          shows ckpt-100.tdck, kill a worker:
  $t kill <id> --rank 1                             SIGKILL to that run's rank 1, nothing else
  $t logs <id> -f                                   the launcher restarts both workers and they
                                                            resume from the checkpoint: same weights
EOF
echo
phase_line
exit "$code"
