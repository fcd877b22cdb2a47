#!/usr/bin/env bash
# packaging: builds the pip wheel (pyproject.toml: scikit-build-core over the repository's CMake)
# once per build directory, for the tests that install it (the CTest fixture tandem_wheel:
# tests/packaging/properties.cmake). The wheel lands in $TANDEM_BUILD_DIR/packaging/dist/; its
# CMake build directory is kept beside it, so the next build compiles only what changed. No
# network: scikit-build-core comes from the tests' venv (tests/requirements.txt, scripts/venv.sh),
# used without pip's build isolation. Warnings are errors here, as in scripts/build.sh.
# Checks what a wheel must hold: the tandem binary in its scripts directory (an ELF executable,
# not a Python wrapper) and the SDK package with its metadata's version.
set -uo pipefail
SRC=${TANDEM_SOURCE_DIR:?TANDEM_SOURCE_DIR must name the source tree}
BUILD=${TANDEM_BUILD_DIR:?TANDEM_BUILD_DIR must name the build directory}
fail() { echo "FAIL: $*" >&2; exit 1; }
venv=${TANDEM_VENV:-$SRC/.venv}
out=$BUILD/packaging
mkdir -p "$out"
exec 9>"$out/.build.lock" # one build at a time in this build directory
flock 9
rm -rf "$out/dist" # a skip below leaves no wheel of an older tree for the tests that install it
if ! "$venv/bin/python" -c 'import scikit_build_core' 2>/dev/null; then
    echo "SKIP: scikit-build-core is not in the tests' venv $venv (scripts/venv.sh installs tests/requirements.txt)"
    exit 77
fi
"$venv/bin/python" -m pip wheel "$SRC" --no-build-isolation --no-deps --no-index \
    --disable-pip-version-check -w "$out/dist" \
    --config-settings=build-dir="$out/skbuild" \
    --config-settings=cmake.define.TANDEM_WERROR=ON >"$out/build.log" 2>&1 ||
    { tail -40 "$out/build.log" >&2; fail "pip wheel of $SRC failed; the whole output is in $out/build.log"; }
wheels=("$out"/dist/tandem-*.whl)
[ ${#wheels[@]} = 1 ] && [ -f "${wheels[0]}" ] || fail "expected one tandem wheel in $out/dist: ${wheels[*]}"
whl=${wheels[0]}
want_version=$(sed -n 's/^SDK_VERSION = "\(.*\)"$/\1/p' "$SRC/python/tandem/_run.py")
"$venv/bin/python" - "$whl" "$want_version" <<'PY' || fail "the wheel $whl lacks what it must hold"
import sys, zipfile
whl, version = sys.argv[1:3]
z = zipfile.ZipFile(whl)
names = z.namelist()
binary = f"tandem-{version}.data/scripts/tandem"
assert binary in names, (binary, names)
assert z.read(binary)[:4] == b"\x7fELF", "the scripts directory's tandem is not an ELF binary"
assert z.getinfo(binary).external_attr >> 16 & 0o111, "tandem is not executable in the wheel"
for mod in ("__init__", "__main__", "_run", "checkpoint", "wandb", "hf", "lightning", "accelerate"):
    assert f"tandem/{mod}.py" in names, (mod, names)
meta = z.read(f"tandem-{version}.dist-info/METADATA").decode()
assert f"Version: {version}\n" in meta, meta[:300]
wheel = z.read(f"tandem-{version}.dist-info/WHEEL").decode()
assert "Tag: py3-none-linux_" in wheel, wheel
PY
echo "test_wheel_build: $(basename "$whl") ($(du -k "$whl" | cut -f1) KiB): bin/tandem and the SDK $want_version"
