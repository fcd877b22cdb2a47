"""Shared helpers for the launch tests: run `tandem launch`, assert with both values shown."""
import os
import subprocess
import sys
import tempfile
import time

TANDEM = os.environ.get("TANDEM_BIN") or os.path.join(
    os.environ.get("TANDEM_BUILD_DIR", "build"), "tandem")
PYTHON = os.environ.get("PYTHON", "/usr/bin/python3")
SOURCE = os.environ.get("TANDEM_SOURCE_DIR",
                        os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def fail(msg):
    print("FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


def check(cond, msg):
    if not cond:
        fail(msg)


def check_eq(a, b, what):
    if a != b:
        fail(f"{what}: got {a!r}, expected {b!r}")


def tmpdir():
    return tempfile.mkdtemp(prefix="tandem-launch-test-")


def write_script(d, name, body):
    path = os.path.join(d, name)
    with open(path, "w") as f:
        f.write(body)
    os.chmod(path, 0o755)
    return path


def launch(args, timeout=60, env=None, **kw):
    """Runs tandem launch to completion; returns (rc, stdout, stderr, seconds)."""
    e = dict(os.environ)
    e.pop("TANDEM_TOKEN", None)
    if env:
        e.update(env)
    t0 = time.time()
    p = subprocess.run([TANDEM, "launch"] + args, capture_output=True, text=True,
                       timeout=timeout, env=e, **kw)
    return p.returncode, p.stdout, p.stderr, time.time() - t0


def pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is not alive for our purposes (it holds no resources beyond the table entry).
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False
