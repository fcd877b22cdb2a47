#!/usr/bin/env bash
# python: `python -m tandem launch script.py` runs the script with that same interpreter (as
# torchrun does with its sys.executable), not the python3 first on PATH: the frameworks' venv
# python starts tandem, the script reports its sys.executable and torch 2.x. `tandem env` names
# the interpreter scripts get. Without a binary, `python -m tandem` says how to give one.
set -uo pipefail
SRC=${TANDEM_SOURCE_DIR:?TANDEM_SOURCE_DIR must name the source tree}
. "$SRC/tests/lib/project.sh"
. "$SRC/tests/lib/frameworks.sh"
project_init entry
fw_python
cat > probe.py <<'PY'
import sys, torch
print(f"probe {sys.executable} torch {torch.__version__.split('+')[0]}", flush=True)
PY
out=$(env -u TANDEM_PYTHON -u PYTHON -u PYTHON_EXEC -u VIRTUAL_ENV PATH="$(dirname "$B"):/usr/bin:/bin" \
    "$FW_PY" -m tandem launch --standalone --nproc-per-node 1 probe.py 2>&1) ||
    fail "python -m tandem launch: $out"
got=$(grep -o 'probe [^ ]* torch [0-9.]*' <<<"$out")
[ "$got" = "probe $FW_PY torch $("$FW_PY" -c 'import torch; print(torch.__version__.split("+")[0])')" ] ||
    fail "the script ran with '$got', expected $FW_PY (PATH's python3 is $(command -v python3))"
echo "python -m tandem launch: the script ran with $FW_PY, not $(PATH=/usr/bin:/bin command -v python3)"
env=$(PATH="$(dirname "$B"):/usr/bin:/bin" TANDEM_PYTHON="$FW_PY" "$B" env 2>&1)
grep -q "$FW_PY" <<<"$env" || fail "tandem env does not name the interpreter: $env"
# A Python whose SDK came without a binary (the checkout's python/; FW_PY has the wheel's)
err=$(env -u TANDEM_BIN PATH=/usr/bin:/bin PYTHONPATH="$SRC/python" /usr/bin/python3 -m tandem ps 2>&1) &&
    fail "no binary: exit 0"
grep -q "no tandem binary" <<<"$err" || fail "no binary: $err"
echo "tandem env names $FW_PY; an SDK without a binary: $err"
