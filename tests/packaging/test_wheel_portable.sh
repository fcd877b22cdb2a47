#!/usr/bin/env bash
# packaging: the repaired wheel (test_wheel_build, the fixture: scripts/wheel.sh) works on a
# system that lacks the libraries the build links. In a fresh venv, then in a mount namespace
# (unshare -m) where the system's copy of every library the build's binary loads (ldd
# $TANDEM_BIN: OpenBLAS, libgomp, libgfortran, libcurl and its TLS/Kerberos/LDAP stack, SQLite,
# jansson, nettle, libyaml, libmicrohttpd, libpng, libjpeg...) is an empty file, bar those the
# manylinux policy promises on every system (glibc, libgcc_s, libz, libexpat):
#  - the build's own binary does not start there ("error while loading shared libraries": the
#    hiding works, so what follows proves something);
#  - the venv's tandem does, and so does its baseline build (TANDEM_ISA=x86-64);
#  - the venv's tandem: `tandem train` of 5 BasicNet steps gives the same weights (cmp) as
#    the build's binary outside the namespace (the bundled OpenBLAS is the same 0.3.21, picking
#    the same kernel on this CPU, and the wheel is built -march=native as build/tandem is);
#  - `tandem run -- python train.py` with the venv's SDK stores the script's metrics and config,
#    read back outside with Python's sqlite3 (inside, Python's own sqlite3 module is hidden too).
# Needs root for the mount namespace; skips (77) without it.
set -uo pipefail
SRC=${TANDEM_SOURCE_DIR:?TANDEM_SOURCE_DIR must name the source tree}
BUILD=${TANDEM_BUILD_DIR:?TANDEM_BUILD_DIR must name the build directory}
. "$SRC/tests/lib/project.sh"
project_setup wheelport
wheels=("$BUILD"/packaging/dist/tandem-*manylinux*.whl)
if [ ! -f "${wheels[0]}" ]; then
    echo "SKIP: no repaired wheel in $BUILD/packaging/dist (packaging/test_wheel_build makes it: ctest -R packaging)"
    exit 77
fi
whl=${wheels[0]}
[ "$(id -u)" = 0 ] && unshare -m true 2>/dev/null ||
    { echo "SKIP: needs root and unshare -m (a mount namespace hides the system's libraries)"; exit 77; }

/usr/bin/python3 -m venv "$P/v" || fail "python3 -m venv failed"
"$P/v/bin/pip" install --no-index --no-deps --disable-pip-version-check --quiet "$whl" ||
    fail "pip install $whl into a fresh venv failed"

# The system libraries the build's binary loads, less the manylinux policy's (PEP 600), each by
# the file its links resolve to (libopenblas.so.0 -> .../openblas-pthread/libopenblasp-r0.3.21.so).
allowed='^(libc|libm|libdl|librt|libpthread|libresolv|libutil|libnsl|libanl|libmvec|libgcc_s|libstdc\+\+|libatomic|libz|libexpat)\.so\.[0-9]+$|^ld-linux-x86-64\.so\.2$'
ldd "$B" | awk '$2 == "=>" { print $1, $3 }' | while read -r lib path; do
    [[ $lib =~ $allowed ]] || realpath "$path"
done | sort -u >hidden.txt
[ "$(wc -l <hidden.txt)" -ge 10 ] || fail "only $(wc -l <hidden.txt) libraries to hide: ldd $B: $(ldd "$B")"
: >empty

mkdir -p "$P/project"
cp "$SRC/tests/packaging/sdk_script.py" "$P/project/train.py"
args=(train --model basicnet --data "$DATA" --steps 5 --batch 16 --seed 3 --threads 1 --no-progress)
# Inside the namespace: each hidden library is an empty file bind-mounted over it (the loader
# says "file too short"), then the three legs; the venv's bin/ first on PATH, nothing else set.
cat >inside.sh <<'SH'
P=$1 B=$2
shift 2
set -u
while read -r f; do mount --bind "$P/empty" "$f" || { echo "HIDE-FAILED $f"; exit 9; }; done <"$P/hidden.txt"
out=$("$B" --version 2>&1) && { echo "BUILD-RAN: $out"; exit 10; }
echo "build binary: $out"
clean=(env -i "HOME=$HOME" "PATH=$P/v/bin:/usr/bin:/bin" "TANDEM_HOME=$P/project" "LANG=C.UTF-8")
"${clean[@]}" tandem --version || { echo "WHEEL-VERSION-FAILED"; exit 11; }
# the baseline build beside it (test_wheel_levels) finds the same bundled libraries
"${clean[@]}" TANDEM_ISA=x86-64 tandem --version | grep -q '^kernels for x86-64, ' ||
    { echo "WHEEL-BASELINE-FAILED"; "${clean[@]}" TANDEM_ISA=x86-64 tandem --version; exit 14; }
"${clean[@]}" tandem "$@" --save "$P/wheel.safetensors" >"$P/train-wheel.log" 2>&1 ||
    { echo "WHEEL-TRAIN-FAILED"; tail -5 "$P/train-wheel.log"; exit 12; }
cd "$P/project" && "${clean[@]}" tandem run --name port -- python train.py >"$P/run.log" 2>&1 ||
    { echo "WHEEL-RUN-FAILED"; tail -20 "$P/run.log"; exit 13; }
echo "inside: all legs ran"
SH
unshare -m bash inside.sh "$P" "$B" "${args[@]}" >inside.log 2>&1 </dev/null
rc=$?
case $rc in
0) ;;
9) fail "could not hide a library in the mount namespace: $(cat inside.log)" ;;
10) fail "the build's binary started with its libraries hidden: the hiding does not work: $(cat inside.log)" ;;
*) fail "the wheel's tandem in the namespace without the system's libraries (exit $rc): $(cat inside.log)" ;;
esac
grep -q "error while loading shared libraries" inside.log ||
    fail "the build's binary failed in the namespace, but not for a missing library: $(cat inside.log)"
# a clean environment, as the wheel's run has: the caller's OPENBLAS_CORETYPE, if any, would
# pick another BLAS kernel on this side only
env -i "HOME=$HOME" "PATH=/usr/bin:/bin" "LANG=C.UTF-8" "$B" "${args[@]}" \
    --save "$P/build.safetensors" >train-build.log 2>&1 ||
    fail "$B train: $(tail -5 train-build.log)"
cmp -s "$P/wheel.safetensors" "$P/build.safetensors" ||
    fail "the wheel's tandem (system libraries hidden) and $B train to different weights (5 steps)"
/usr/bin/python3 "$SRC/tests/packaging/check_sdk_run.py" "$P/project/.tandem/runs.db" port-1 || fail "the store lacks the script's metrics or config"
echo "test_wheel_portable: with $(wc -l <hidden.txt) system libraries hidden ($(xargs -n1 basename <hidden.txt | sed 's/\.so.*//' | tr '\n' ' ')) $(basename "$B") cannot start, the wheel's tandem trains to the same weights as $(basename "$B") and tandem run -- python train.py stores the SDK's metrics and config"
