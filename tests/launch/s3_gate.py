"""An S3 for test_ckpt_s3_queue: moto's server behind a proxy that can hold uploads.

  s3_gate.py serve DIR      starts moto_server (port 0), makes the bucket `ckpts`, listens on
                            port 0 itself and writes "PROXY_PORT MOTO_PORT" to DIR/ports; every
                            request it forwards is logged to DIR/requests ("METHOD PATH"), in the
                            order they reach it; while DIR/gate exists, a PUT of an object that is
                            not a commit is held (logged "HELD PATH") until the file goes. Runs
                            until killed.
  s3_gate.py verify PORT KEY FILE
                            exits 0 when, per boto3 on moto's PORT, s3://ckpts/KEY holds FILE's
                            bytes and s3://ckpts/KEY.commit names their size and SHA-256; else says
                            what differs and exits 1.

The held upload is how the test sees tandem's side wait in the middle of a transfer; the log and
boto3 are the references, never tandem's own reading of S3."""
import ctypes
import hashlib
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

BUCKET = "ckpts"


def start_moto(log_path):
    moto = os.path.join(os.path.dirname(sys.executable), "moto_server")
    log = open(log_path, "w")
    # gone with this script, however it ends (the test kills it)
    libc = ctypes.CDLL(None, use_errno=True)
    proc = subprocess.Popen([moto, "-H", "127.0.0.1", "-p", "0"], stdout=log, stderr=log,
                            preexec_fn=lambda: libc.prctl(1, signal.SIGKILL))
    for _ in range(300):
        with open(log_path) as f:
            m = re.search(r"Running on http://[0-9.]+:(\d+)", f.read())
        if m:
            return proc, int(m.group(1))
        if proc.poll() is not None:
            sys.exit("moto_server exited: " + open(log_path).read()[-500:])
        time.sleep(0.1)
    sys.exit("moto_server did not say its port in 30 s")


def read_request(sock, buf):
    """One whole request (head and Content-Length body) from sock, after what buf holds; returns
    (request bytes, rest) or (None, b"") at the end."""
    while b"\r\n\r\n" not in buf:
        got = sock.recv(65536)
        if not got:
            return None, b""
        buf += got
    head, _, rest = buf.partition(b"\r\n\r\n")
    m = re.search(rb"(?im)^content-length:\s*(\d+)", head)
    n = int(m.group(1)) if m else 0
    while len(rest) < n:
        got = sock.recv(65536)
        if not got:
            return None, b""
        rest += got
    return head + b"\r\n\r\n" + rest[:n], rest[n:]


def pump(src, dst):
    try:
        while True:
            got = src.recv(65536)
            if not got:
                break
            dst.sendall(got)
    except OSError:
        pass
    for s in (src, dst):
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def serve(out_dir):
    moto, moto_port = start_moto(os.path.join(out_dir, "moto.log"))
    import boto3

    endpoint = "http://127.0.0.1:%d" % moto_port
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket=BUCKET)
    lock = threading.Lock()
    log = open(os.path.join(out_dir, "requests"), "a", buffering=1)
    gate = os.path.join(out_dir, "gate")

    def say(line):
        with lock:
            log.write(line + "\n")

    def client(c):
        up = socket.create_connection(("127.0.0.1", moto_port))
        threading.Thread(target=pump, args=(up, c), daemon=True).start()
        buf = b""
        try:
            while True:
                req, buf = read_request(c, buf)
                if req is None:
                    break
                method, path = req.split(b" ", 2)[:2]
                line = "%s %s" % (method.decode(), path.decode().split("?")[0])
                if method == b"PUT" and b".commit" not in path and os.path.exists(gate):
                    say("HELD " + line.split(" ", 1)[1])
                    while os.path.exists(gate):
                        time.sleep(0.02)
                say(line)
                up.sendall(req)
        except OSError:
            pass
        pump(c, up)

    ls = socket.socket()
    ls.bind(("127.0.0.1", 0))
    ls.listen(64)
    tmp = os.path.join(out_dir, "ports.tmp")
    with open(tmp, "w") as f:
        f.write("%d %d\n" % (ls.getsockname()[1], moto_port))
    os.rename(tmp, os.path.join(out_dir, "ports"))
    try:
        while True:
            c, _ = ls.accept()
            threading.Thread(target=client, args=(c,), daemon=True).start()
    finally:
        moto.kill()


def verify(port, key, path):
    import boto3

    s3 = boto3.client("s3", endpoint_url="http://127.0.0.1:%s" % port, region_name="us-east-1")
    want = open(path, "rb").read()
    got = s3.get_object(Bucket=BUCKET, Key=key)["Body"].read()
    if got != want:
        sys.exit("s3://%s/%s holds %d bytes, not %s's %d" % (BUCKET, key, len(got), path, len(want)))
    commit = s3.get_object(Bucket=BUCKET, Key=key + ".commit")["Body"].read().decode()
    sha = hashlib.sha256(want).hexdigest()
    if "sha256 %s" % sha not in commit or "nbytes %d" % len(want) not in commit:
        sys.exit("s3://%s/%s.commit does not name sha256 %s, nbytes %d:\n%s"
                 % (BUCKET, key, sha, len(want), commit))


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "serve":
        serve(sys.argv[2])
    elif len(sys.argv) == 5 and sys.argv[1] == "verify":
        verify(sys.argv[2], sys.argv[3], sys.argv[4])
    else:
        sys.exit(__doc__)
