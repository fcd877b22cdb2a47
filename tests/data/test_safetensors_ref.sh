#!/usr/bin/env bash
# The safetensors files of test_archive_rules.c, judged by the safetensors library itself (the
# format's reference reader, Rust under its Python package): tandem must accept exactly the files
# it accepts (overlapping, gapped or short offsets, trailing bytes, bad metadata all refused), but
# for a key given twice, which tandem refuses on purpose. Needs `safetensors` in the tests' venv
# (scripts/venv.sh, tests/requirements.txt); skipped (77) without it.
set -euo pipefail
src=${TANDEM_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
build=${TANDEM_BUILD_DIR:-$src/build}
venv=${TANDEM_VENV:-$src/.venv}
if ! "$venv/bin/python" -c 'import safetensors' 2>/dev/null; then
  echo "SKIP: no safetensors in $venv (run scripts/venv.sh, or set TANDEM_VENV)"
  exit 77
fi
bin=$build/tests/data_test_archive_rules
dir=$(mktemp -d /tmp/tandem-st-ref-XXXXXX)
trap 'rm -rf "$dir"' EXIT
"$bin" --write "$dir"
"$venv/bin/python" - "$dir" <<'PY'
import glob, os, sys
from safetensors import deserialize  # validates the header and the offsets, as safe_open does
d = sys.argv[1]
with open(os.path.join(d, "reference.txt"), "w") as f:
    for p in sorted(glob.glob(os.path.join(d, "*.safetensors"))):
        try:
            deserialize(open(p, "rb").read())
            verdict = "ok"
        except Exception:
            verdict = "err"
        f.write(f"{os.path.basename(p)[:-len('.safetensors')]} {verdict}\n")
PY
"$bin" --check "$dir"
