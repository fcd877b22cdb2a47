#!/usr/bin/env bash
# cli: the OpenBLAS core tandem runs (tools/tandem/isa.c, tensor.h td_blas_core_for). OpenBLAS
# picks its core as it loads; a CPU it does not know by name (Debian 12's 0.3.21 on an Intel Xeon
# of model 207) gets its SSE3 fallback, Prescott, 4-5x slower at sgemm than its AVX-512 kernels.
# There tandem runs itself again under the core of the CPU's class. Checked against references
# that are not tandem's: OpenBLAS's own pick is read by Python's ctypes from the very library
# tandem links (ldd), and the CPU's class from /proc/cpuinfo's flags:
#   - `tandem --version` names OpenBLAS's own pick where OpenBLAS knew the CPU, and the class's
#     core (Cooperlake: AVX-512 with BF16; SkylakeX: AVX-512; Haswell: AVX2 with FMA) where it
#     picked Prescott, with a line saying so;
#   - OPENBLAS_CORETYPE set by the user stands (Prescott stays Prescott, with no such line);
#   - what tandem starts gets the user's environment: a worker of `tandem launch` sees no
#     OPENBLAS_CORETYPE (nor tandem's own marker) when the user set none, and the user's when set;
#   - a worker that is tandem runs the same core as its launcher.
# On a machine whose OpenBLAS knows the CPU, the exec is not taken and this says so; the rest holds.
set -uo pipefail
TANDEM=${TANDEM_BIN:?TANDEM_BIN not set}
PY=${PYTHON:-/usr/bin/python3}
fail() { echo "FAIL: $*" >&2; exit 1; }
case $(uname -m) in x86_64) ;; *) echo "SKIP: the cores named here are x86-64's"; exit 77 ;; esac
command -v "$PY" >/dev/null 2>&1 || { echo "SKIP: no $PY"; exit 77; }

lib=$(ldd "$TANDEM" | sed -n 's/^\s*libopenblas[^ ]* => \([^ ]*\) .*/\1/p' | head -1)
[ -n "$lib" ] || { echo "SKIP: $TANDEM links no libopenblas ($(ldd "$TANDEM" | grep -i blas))"; exit 77; }
picked=$(env -u OPENBLAS_CORETYPE "$PY" -c '
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
lib.openblas_get_corename.restype = ctypes.c_char_p
lib.openblas_get_config.restype = ctypes.c_char_p
print(lib.openblas_get_corename().decode(), "DYNAMIC_ARCH" in lib.openblas_get_config().decode())
' "$lib") || fail "cannot read OpenBLAS's core from $lib with ctypes"
read -r picked dynamic <<<"$picked"

flags=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
has() { for f in "$@"; do [[ $flags == *" $f "* ]] || return 1; done; }
want=$picked
if [ "$picked" = Prescott ] && [ "$dynamic" = True ]; then
    if has avx512f avx512bw avx512cd avx512dq avx512vl avx512_bf16; then want=Cooperlake
    elif has avx512f avx512bw avx512cd avx512dq avx512vl; then want=SkylakeX
    elif has avx2 fma; then want=Haswell
    fi
fi
core_of() { sed -n 's/^kernels for .*, OpenBLAS core \([^,]*\), .*/\1/p' <<<"$1"; }

out=$(env -u OPENBLAS_CORETYPE "$TANDEM" --version 2>&1) || fail "tandem --version: $out"
[ "$(core_of "$out")" = "$want" ] ||
    fail "OpenBLAS picked $picked on this CPU (flags:$(grep -o ' avx512_bf16\| avx512f\| avx2 ' <<<"$flags" | tr -d '\n')); tandem should run $want: $out"
if [ "$want" != "$picked" ]; then
    grep -q "^OpenBLAS picked $picked, its SSE3 fallback, .* OPENBLAS_CORETYPE=$want " <<<"$out" ||
        fail "tandem --version does not say it changed the core: $out"
    echo "OpenBLAS picked $picked here; tandem runs $want"
else
    grep -q "^OpenBLAS picked" <<<"$out" && fail "tandem --version says it changed a core it kept: $out"
    echo "note: OpenBLAS knows this CPU ($picked): tandem's exec for the core is not taken here"
fi

# the user's core stands
out=$(OPENBLAS_CORETYPE=Prescott "$TANDEM" --version 2>&1)
[ "$(core_of "$out")" = Prescott ] || fail "OPENBLAS_CORETYPE=Prescott was not kept: $out"
grep -q "^OpenBLAS picked" <<<"$out" && fail "a core the user set is reported as tandem's: $out"

# what tandem starts gets the user's environment; a worker that is tandem picks the same core
workers() {
    "$TANDEM" launch --standalone --nproc_per_node 1 --no-python /bin/sh -c \
        'echo "core=${OPENBLAS_CORETYPE-unset} marker=${TANDEM__BLAS_EXEC-unset}"; "$0" --version' \
        "$TANDEM" 2>&1
}
out=$(env -u OPENBLAS_CORETYPE bash -c "$(declare -f workers); TANDEM='$TANDEM' workers") ||
    fail "tandem launch: $out"
grep -q "core=unset marker=unset" <<<"$out" ||
    fail "a worker saw OPENBLAS_CORETYPE or tandem's marker the user did not set: $out"
[ "$(core_of "$(sed 's/^\[rank 0\] //' <<<"$out")")" = "$want" ] ||
    fail "the worker's tandem runs another core than $want: $out"
out=$(OPENBLAS_CORETYPE=Haswell bash -c "$(declare -f workers); TANDEM='$TANDEM' workers") ||
    fail "tandem launch: $out"
grep -q "core=Haswell marker=unset" <<<"$out" || fail "the user's OPENBLAS_CORETYPE did not reach the worker: $out"
echo "PASS"
