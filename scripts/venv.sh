#!/usr/bin/env bash
# The tests' Python virtual environment: the real clients and servers the tests talk to that
# Debian does not package (moto's server for the EC2 and S3 APIs, boto3 and the AWS CLI to check
# what tandem did against them). Made once with Debian's python3 and reused: .venv (git-ignored),
# or TANDEM_VENV. It is reinstalled when tests/requirements.txt changes. Debian's own
# python3-torch stays the quick peer of the other tests (they use /usr/bin/python3).
#   scripts/venv.sh        creates or updates it; prints nothing when it is up to date
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv=${TANDEM_VENV:-$root/.venv}
req=$root/tests/requirements.txt
stamp=$venv/.tandem-requirements
if [ -x "$venv/bin/python" ] && [ -f "$stamp" ] && cmp -s "$req" "$stamp"; then
  exit 0
fi
echo "tandem: preparing the tests' Python environment in $venv (pip: $(tr '\n' ' ' < "$req"))"
[ -x "$venv/bin/python" ] || /usr/bin/python3 -m venv "$venv"
"$venv/bin/pip" install --quiet --disable-pip-version-check -r "$req"
cp "$req" "$stamp"
