#!/usr/bin/env bash
# tandem's SigV4 signer against the botocore of the tests' venv, at test time: sigv4_vectors.py
# signs its cases with botocore now, and test_sigv4 must agree with every one (the committed
# sigv4_vectors.txt is the same script's output, checked by test_sigv4 without a venv).
set -euo pipefail
venv=${TANDEM_VENV:-$TANDEM_SOURCE_DIR/.venv}
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import botocore' 2>/dev/null; then
  echo "SKIP: no botocore in $venv (run scripts/venv.sh, or set TANDEM_VENV)"
  exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$venv/bin/python" "$TANDEM_SOURCE_DIR/tests/cloud/sigv4_vectors.py" > "$tmp/vectors.txt"
"$TANDEM_BUILD_DIR/tests/cloud_test_sigv4" "$tmp/vectors.txt"
