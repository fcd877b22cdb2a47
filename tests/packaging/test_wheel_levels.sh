#!/usr/bin/env bash
# packaging: the builds of tandem's kernels for x86-64 levels beside the binary, and how the
# binary picks one (tools/tandem/isa.c, TANDEM_ISA). The tests' wheel (test_wheel_build, the
# fixture) is built -march=native with one level beside it, tandem-x86-64 (baseline: SSE2, no
# FMA); the portable wheel carries x86-64-v3 and x86-64-v4 beside a baseline binary, the same
# mechanism. The CPU's level is read here from /proc/cpuinfo's flags against the psABI's lists,
# not from tandem. Installed into a fresh venv:
#  - `tandem --version` with nothing set runs the native build (the highest level present that
#    the CPU runs); TANDEM_ISA=x86-64 runs the baseline build through the same bin/tandem: its
#    --version says so, its kernels have no AVX or FMA, and it trains (5 BasicNet steps) with
#    a finite loss;
#  - the baseline build, as the binary users start (the portable wheel's case), execs the
#    highest level the CPU runs among those beside it (stand-ins that print their arguments and
#    the level they were exec'd as), passes the arguments through unchanged, and runs itself
#    when no level above it is there;
#  - a level the CPU lacks, a level no build is there for, a value that is no level, a build
#    that is not the level its name says: exit 2 with a message naming TANDEM_ISA and the fix.
set -uo pipefail
SRC=${TANDEM_SOURCE_DIR:?TANDEM_SOURCE_DIR must name the source tree}
BUILD=${TANDEM_BUILD_DIR:?TANDEM_BUILD_DIR must name the build directory}
. "$SRC/tests/lib/project.sh"
project_setup levels
wheels=("$BUILD"/packaging/dist/tandem-*.whl)
if [ ! -f "${wheels[0]}" ]; then
    echo "SKIP: no wheel in $BUILD/packaging/dist (packaging/test_wheel_build makes it: ctest -R packaging)"
    exit 77
fi
whl=${wheels[0]}
[ "$(uname -m)" = x86_64 ] || { echo "SKIP: x86-64 levels only ($(uname -m))"; exit 77; }

# The CPU's level: the psABI's feature lists (x86-64-v2: cx16 lahf popcnt sse4.1 sse4.2 ssse3;
# v3: avx avx2 bmi1 bmi2 f16c fma lzcnt movbe xsave; v4: avx512f bw cd dq vl), as Linux names them.
flags=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
has() { local f; for f in "$@"; do [[ $flags == *" $f "* ]] || return 1; done; }
cpu=1
has cx16 lahf_lm popcnt sse4_1 sse4_2 ssse3 && cpu=2
[ $cpu = 2 ] && has avx avx2 bmi1 bmi2 f16c fma abm movbe xsave && cpu=3
[ $cpu = 3 ] && has avx512f avx512bw avx512cd avx512dq avx512vl && cpu=4
name() { [ "$1" = 1 ] && echo x86-64 || echo "x86-64-v$1"; }
echo "this CPU: $(name $cpu)"

/usr/bin/python3 -m venv "$P/v" || fail "python3 -m venv failed"
"$P/v/bin/pip" install --no-index --no-deps --disable-pip-version-check --quiet "$whl" ||
    fail "pip install $whl into a fresh venv failed"
scripts=$("$P/v/bin/python" -c 'import sysconfig; print(sysconfig.get_path("platlib"))')/tandem.scripts
[ -x "$scripts/tandem-x86-64" ] || fail "the wheel has no tandem-x86-64 beside its binary: $(ls "$scripts")"
clean=(env -i "HOME=$HOME" "PATH=$P/v/bin:/usr/bin:/bin" "TANDEM_HOME=$P" "LANG=C.UTF-8")

# Nothing set: the native build runs (line 2 of --version: "kernels for LEVEL FEATURES, ...").
native=$("$B" --version | sed -n 's/^kernels for \([^ ,]*\).*/\1/p')
[ -n "$native" ] || fail "$B --version names no level: $("$B" --version)"
out=$("${clean[@]}" tandem --version) || fail "tandem --version: $out"
expect_contains "$out" "kernels for $native " "the venv's tandem --version"

# TANDEM_ISA=x86-64: the baseline build, through the same bin/tandem, trains.
if [ "$native" != x86-64 ]; then
    out=$("${clean[@]}" TANDEM_ISA=x86-64 tandem --version) || fail "TANDEM_ISA=x86-64 tandem --version: $out"
    expect_contains "$out" "kernels for x86-64, OpenBLAS core" "TANDEM_ISA=x86-64 tandem --version"
    out=$("${clean[@]}" TANDEM_ISA=x86-64 tandem train --model basicnet --data "$DATA" --steps 5 --batch 16 \
        --threads 1 --no-progress --json 2>&1) || fail "TANDEM_ISA=x86-64 tandem train: $out"
    "$PYTHON" -c 'import json, math, sys
r = json.loads(sys.argv[1].strip().splitlines()[-1])
assert r["steps"] == 5 and math.isfinite(r["final_loss"]), r' "$out" ||
        fail "TANDEM_ISA=x86-64 tandem train did not train 5 steps to a finite loss: $out"
fi

# The baseline build as the binary users start: beside it, stand-ins for other levels.
d=$P/site/tandem.scripts
mkdir -p "$d"
ln -s "$(dirname "$scripts")/tandem.libs" "$P/site/tandem.libs" # its RPATH: $ORIGIN/../tandem.libs
cp "$scripts/tandem-x86-64" "$d/tandem"
stand_in() { # LEVEL: a tandem-LEVEL that says how it was run
    printf '#!/bin/sh\necho "ran %s as $TANDEM__ISA_EXEC:$#:$*"\n' "$1" >"$d/tandem-$1"
    chmod +x "$d/tandem-$1"
}
out=$(env -u TANDEM_ISA "$d/tandem" --version) || fail "the baseline binary alone: $out"
expect_contains "$out" "kernels for x86-64, " "the baseline binary with no level beside it"
if [ $cpu -ge 3 ]; then
    stand_in x86-64-v2
    stand_in x86-64-v3
    [ $cpu = 4 ] || stand_in x86-64-v4 # above this CPU: never picked
    out=$(env -u TANDEM_ISA "$d/tandem" train --data "a b" --steps 3) || fail "auto pick: $out"
    [ "$out" = "ran x86-64-v3 as x86-64-v3:5:train --data a b --steps 3" ] ||
        fail "with v2 and v3 beside the baseline binary on a $(name $cpu) CPU, expected v3 run with the 5 arguments: $out"
    out=$(TANDEM_ISA=x86-64-v2 "$d/tandem" ps) || fail "TANDEM_ISA=x86-64-v2: $out"
    [ "$out" = "ran x86-64-v2 as x86-64-v2:1:ps" ] || fail "TANDEM_ISA=x86-64-v2 ran: $out"
    out=$(TANDEM_ISA=x86-64 "$d/tandem" --version) || fail "TANDEM_ISA=x86-64 with levels beside: $out"
    expect_contains "$out" "kernels for x86-64, " "TANDEM_ISA=x86-64 with levels above beside it"
    if [ $cpu = 4 ]; then
        stand_in x86-64-v4
        out=$(env -u TANDEM_ISA "$d/tandem" ps) || fail "auto pick with v4: $out"
        [ "$out" = "ran x86-64-v4 as x86-64-v4:1:ps" ] || fail "an x86-64-v4 CPU did not pick v4: $out"
    fi
else
    echo "this CPU is below x86-64-v3: the auto pick among v2 and v3 not checked"
fi

# expect_refusal WANT CMD...: exit 2, WANT in stderr
expect_refusal() {
    local want=$1 err rc
    shift
    err=$("$@" 2>&1 >/dev/null)
    rc=$?
    [ $rc = 2 ] || fail "$*: exit $rc, expected 2 ($err)"
    expect_contains "$err" "$want" "$*"
}
expect_refusal "TANDEM_ISA=x86-64-v5 is not a level: use auto, x86-64, x86-64-v2, x86-64-v3 or x86-64-v4" \
    env TANDEM_ISA=x86-64-v5 "$B" --version
if [ $cpu -lt 4 ]; then
    expect_refusal "TANDEM_ISA=x86-64-v4: this CPU runs x86-64 up to $(name $cpu); set TANDEM_ISA=$(name $cpu) or lower" \
        env TANDEM_ISA=x86-64-v4 "$d/tandem" --version
fi
rm -f "$d"/tandem-x86-64-v*
if [ $cpu -ge 2 ]; then
    expect_refusal "TANDEM_ISA=x86-64-v2: this tandem is built for x86-64 only (no $d/tandem-x86-64-v2 beside it)" \
        env TANDEM_ISA=x86-64-v2 "$d/tandem" --version
fi
expect_refusal "exec'd as the build for x86-64-v3 but is built for x86-64:" \
    env TANDEM__ISA_EXEC=x86-64-v3 "$d/tandem" --version
# The variable is the exec'd build's alone: the workers it starts choose afresh.
out=$(TANDEM__ISA_EXEC=x86-64 "$d/tandem" launch --standalone --nproc_per_node 1 --no-python env 2>&1) ||
    fail "tandem launch -- env as the exec'd build: $out"
expect_contains "$out" "[rank 0] LOCAL_RANK=0" "the worker's environment"
expect_lacks "$out" "TANDEM__ISA_EXEC" "the worker's environment"

# Two nodes (network namespaces) whose tandem runs different levels, as on two CPU generations:
# node 1's agent runs the baseline build (TANDEM_ISA=x86-64 in its environment only). tandem
# launch gives every node's workers the lowest level, so the ranks agree (without it their
# numerics check stops both before the first step) and write the bits of one node of
# baseline workers.
if [ "$native" = x86-64 ] || [ "$(id -u)" != 0 ] || ! ip netns list >/dev/null 2>&1; then
    echo "two nodes of different levels not checked (needs root, ip netns and a native build above x86-64)"
else
    . "$SRC/tests/lib/netns.sh"
    trap 'netns_cleanup; project_cleanup' EXIT
    netns_pair tdl 10.81.0 || fail "could not set up the two namespaces"
    train=(tandem train --data "$DATA" --steps 6 --batch 16 --seed 5 --threads 1 --no-progress)
    "${clean[@]}" TANDEM_ISA=x86-64 tandem launch --standalone --nproc-per-node 2 -- "${train[@]}" \
        --save "$P/one-node.st" >"$P/one.out" 2>"$P/one.err" || fail "one node of baseline workers: $(tail -3 "$P/one.err")"
    node() { # ns tag node-rank TANDEM_ISA
        ip netns exec "$1" timeout -k 5 120 "${clean[@]}" TANDEM_ISA="$4" TANDEM_TOKEN=levels-test \
            tandem launch --nnodes 2 --nproc-per-node 1 --node-rank "$3" --rdzv-endpoint 10.81.0.1:29400 \
            --rdzv-id levels --rdzv-timeout 60 -- "${train[@]}" --save "$P/two-nodes.st" \
            >"$P/$2.out" 2>"$P/$2.err" &
    }
    node "$A" n0 0 auto; p0=$!
    node "$B" n1 1 x86-64; p1=$!
    wait $p0; r0=$?; wait $p1; r1=$?
    [ $r0 = 0 ] && [ $r1 = 0 ] || fail "two nodes of levels $native and x86-64 exited $r0/$r1: $(tail -n 4 "$P"/n0.* "$P"/n1.*)"
    grep -q "the lowest x86-64 level among the nodes is x86-64, this node's tandem runs $native: its workers get TANDEM_ISA=x86-64" "$P/n0.err" ||
        fail "node 0 did not say it pins the lowest level: $(cat "$P/n0.err")"
    cmp "$P/one-node.st" "$P/two-nodes.st" || fail "two nodes of levels $native and x86-64 did not write one baseline node's bits"
    echo "two nodes, $native and x86-64: every worker ran x86-64, the bits of one baseline node"
fi
echo "test_wheel_levels: native $native, the baseline build and its pick of levels on an $(name $cpu) CPU"
