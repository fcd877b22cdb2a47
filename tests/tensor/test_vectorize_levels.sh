#!/usr/bin/env bash
# Every vector loop (`#pragma omp simd`, optim's TD_OMP_FOR) of the compute layers (src/tensor, src/nn, src/optim)
# that GCC vectorises for AVX-512 (x86-64-v4) is vectorised for AVX2 (x86-64-v3) too, so the AVX2 machines and the
# wheel's v3 kernels are not left with scalar loops the AVX-512 build hides. It happened: GCC
# branches around a ?: arm that multiplies or divides and, without AVX-512's masked moves, cannot
# turn the branch back into a select; GELU, tanh, sigmoid, dropout and SGD's momentum step ran
# scalar in the v3 build (td_pick in core.h is the fix). A loop that may stay scalar below
# AVX-512 says so on its `for` line: "scalar below AVX-512". (Loops GCC's -O2 vectorises on its
# own, pointer tables of a few entries, are not the engine's vector loops and are not checked.)
# Each file is compiled twice with the build's own flags and includes (the Makefile
# generator's flags.make), -march swapped for the level, and GCC's -fopt-info-vec-optimized
# lists compared.
set -euo pipefail
src=${TANDEM_SOURCE_DIR:?}
build=${TANDEM_BUILD_DIR:?}
cc=$(sed -n 's/^CMAKE_C_COMPILER:[A-Z]*=//p' "$build/CMakeCache.txt")
macros=$("$cc" -dM -E - < /dev/null 2>/dev/null || true)
if ! grep -q '__GNUC__' <<< "$macros" || grep -q '__clang__' <<< "$macros"; then
  echo "SKIP: $cc is not GCC (the check reads GCC's -fopt-info)"; exit 77
fi
[ "$(uname -m)" = x86_64 ] || { echo "SKIP: not x86-64"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0 loops=0
for layer in tensor nn optim; do
  flags=$build/CMakeFiles/td_$layer.dir/flags.make
  [ -f "$flags" ] || { echo "SKIP: $flags missing (a Makefile build of td_$layer is needed)"; exit 77; }
  inc=$(sed -n 's/^C_INCLUDES = //p' "$flags")
  cflags=$(sed -n 's/^C_FLAGS = //p' "$flags" | sed 's/-march=[^ ]*//g; s/-mtune=[^ ]*//g; s/-fsanitize=[^ ]*//g')
  for f in "$src"/src/$layer/*.c; do
    for level in x86-64-v4 x86-64-v3; do
      rm -f "$tmp/$level.txt" # -fopt-info appends
      # shellcheck disable=SC2086
      "$cc" $cflags -march=$level $inc -c "$f" -o "$tmp/o.o" -fopt-info-vec-optimized="$tmp/$level.txt"
      grep -o '^[^ ]*:[0-9]*:[0-9]*: optimized: loop vectorized' "$tmp/$level.txt" |
        sed 's/: optimized.*//' | sort -u > "$tmp/$level.loops" || true
    done
    loops=$((loops + $(wc -l < "$tmp/x86-64-v4.loops")))
    while IFS=: read -r file line _; do
      [ -n "$file" ] || continue
      # GCC names the loop's `for` line or its body's first: the `for` at or just above it
      at=$line
      for back in 0 1 2; do
        sed -n "$((line - back))p" "$file" | grep -q '^ *for (' && { at=$((line - back)); break; }
      done
      sed -n "$((at - 1))p" "$file" | grep -Eq '^ *(#pragma omp .*simd|TD_OMP_FOR)' || continue
      sed -n "${at}p" "$file" | grep -q 'scalar below AVX-512' && continue
      echo "FAIL: $file:$at: a loop vectorised for x86-64-v4 stays scalar for x86-64-v3:"
      sed -n "${at}p" "$file"
      echo "  (a ?: choosing a computed value inside it? compute both and td_pick them, core.h)"
      fail=1
    done < <(comm -23 "$tmp/x86-64-v4.loops" "$tmp/x86-64-v3.loops")
  done
done
[ "$loops" -gt 50 ] || { echo "FAIL: only $loops vectorised loops found at x86-64-v4: the check is not looking"; exit 1; }
[ $fail = 0 ] && echo "ok: $loops loops vectorised at x86-64-v4, all of them at x86-64-v3"
exit $fail
