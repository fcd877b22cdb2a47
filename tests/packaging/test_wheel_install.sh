#!/usr/bin/env bash
# packaging: the wheel (built by test_wheel_build, the fixture) installed into a fresh venv as a
# user would (`python3 -m venv v && v/bin/pip install tandem-*.whl`, here with no network at all:
# the wheel has no dependencies) gives:
#  - `tandem` on the venv's PATH, which runs: auditwheel's script in bin/ that execs the binary,
#    <site-packages>/tandem.scripts/tandem (an ELF executable, its libraries in tandem.libs/:
#    scripts/wheel.sh says why it is not in bin/ itself);
#  - `import tandem` from the venv's site-packages, whose tandem.binary() and `python -m tandem`
#    use the venv's own binary (the ELF itself, no script in front) even when PATH holds none;
#  - `tandem run -- python script.py` with nothing but the venv on PATH (no PYTHONPATH, no
#    checkout): the script's SDK is the venv's, and its metrics and config are in the store,
#    read back with Python's sqlite3 from .tandem/runs.db (not through tandem);
#  - the binary trains to the same weights as the build directory's (5 steps of BasicNet).
set -uo pipefail
SRC=${TANDEM_SOURCE_DIR:?TANDEM_SOURCE_DIR must name the source tree}
BUILD=${TANDEM_BUILD_DIR:?TANDEM_BUILD_DIR must name the build directory}
. "$SRC/tests/lib/project.sh"
TANDEM_BIN=${TANDEM_BIN:-unused} project_init wheel
wheels=("$BUILD"/packaging/dist/tandem-*.whl)
if [ ! -f "${wheels[0]}" ]; then
    echo "SKIP: no wheel in $BUILD/packaging/dist (packaging/test_wheel_build makes it: ctest -R packaging)"
    exit 77
fi
whl=${wheels[0]}

/usr/bin/python3 -m venv "$P/v" || fail "python3 -m venv failed"
"$P/v/bin/pip" install --no-index --no-deps --disable-pip-version-check --quiet "$whl" ||
    fail "pip install $whl into a fresh venv failed"
[ -x "$P/v/bin/tandem" ] || fail "the venv has no bin/tandem: $(ls "$P/v/bin")"
elf=$("$P/v/bin/python" -c 'import sysconfig; print(sysconfig.get_path("platlib"))')/tandem.scripts/tandem
[ -x "$elf" ] && [ "$(head -c4 "$elf" | od -An -c | tr -d ' ')" = '177ELF' ] ||
    fail "the venv has no executable ELF binary $elf"
grep -q "tandem.scripts/tandem" "$P/v/bin/tandem" ||
    fail "bin/tandem does not exec the wheel's binary: $(head -c 300 "$P/v/bin/tandem")"

# What a user of the venv has: its bin/ on PATH, and the system's; no checkout, no PYTHONPATH.
clean=(env -i "HOME=$HOME" "PATH=$P/v/bin:/usr/bin:/bin" "TANDEM_HOME=$P/project" "LANG=C.UTF-8")
[ "$("${clean[@]}" sh -c 'command -v tandem')" = "$P/v/bin/tandem" ] || fail "tandem on PATH is not the venv's"
"${clean[@]}" tandem --version | grep -q '^tandem ' || fail "tandem --version: $("${clean[@]}" tandem --version 2>&1)"
got=$("${clean[@]}" python -c 'import tandem, os; print(os.path.realpath(tandem.__file__)); print(tandem.binary())') ||
    fail "import tandem in the venv failed"
expect_contains "$(head -1 <<<"$got")" "$P/v/lib/" "the venv's tandem package"
[ "$(tail -1 <<<"$got")" = "$elf" ] || fail "tandem.binary() is '$(tail -1 <<<"$got")', not the venv's $elf"
# python -m tandem finds the venv's binary with PATH holding none
out=$(env -i "HOME=$HOME" PATH=/usr/bin:/bin "$P/v/bin/python" -m tandem --version 2>&1) ||
    fail "python -m tandem --version with the venv's bin/ off PATH: $out"
expect_contains "$out" "tandem " "python -m tandem --version"

mkdir -p "$P/project"
cp "$SRC/tests/packaging/sdk_script.py" "$P/project/train.py"
(cd "$P/project" && "${clean[@]}" tandem run --name wheel -- python train.py) >run.log 2>&1 ||
    fail "tandem run -- python train.py from the venv: exit $?: $(tail -20 run.log)"
/usr/bin/python3 "$SRC/tests/packaging/check_sdk_run.py" "$P/project/.tandem/runs.db" wheel-1 || fail "the store lacks the script's metrics or config"
# The wheel's binary is built as build/tandem is (-march=native): the same kernels, the same bits.
data=${TANDEM_DATA:-/usr/share/datasets/fashion-mnist}
if [ -f "$data/train-images-idx3-ubyte.gz" ]; then
    args=(train --model basicnet --data "$data" --steps 5 --batch 16 --seed 3 --threads 1 --no-progress)
    "${clean[@]}" tandem "${args[@]}" --save "$P/wheel.safetensors" >train-wheel.log 2>&1 ||
        fail "the wheel's tandem train: $(tail -5 train-wheel.log)"
    # in the same clean environment: an OPENBLAS_CORETYPE of the caller's (this workplace
    # pins Haswell) would pick another BLAS kernel on one side only
    "${clean[@]}" "$TANDEM_BIN" "${args[@]}" --save "$P/build.safetensors" >train-build.log 2>&1 ||
        fail "$TANDEM_BIN train: $(tail -5 train-build.log)"
    cmp -s "$P/wheel.safetensors" "$P/build.safetensors" ||
        fail "the wheel's tandem and $TANDEM_BIN train to different weights (5 steps): not the same kernels"
    echo "the wheel's tandem and $TANDEM_BIN: the same weights after 5 steps"
fi
echo "test_wheel_install: $(basename "$whl") in a fresh venv: tandem on PATH, the SDK and python -m tandem use the venv's binary; tandem run -- python train.py stored 10 points and the config"
