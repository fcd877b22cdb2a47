"""launch: node 0's rendezvous store listens only where --rdzv-endpoint says (issue 8: a
127.0.0.1 endpoint listened on 0.0.0.0, reachable from every network the host is on)."""
import os
import socket
import subprocess
import time

from launchtest import TANDEM, check, fail

s = socket.socket()
s.bind(("127.0.0.1", 0))
port = s.getsockname()[1]
s.close()

env = dict(os.environ, TANDEM_TOKEN="bindtest-secret")
p = subprocess.Popen([TANDEM, "launch", "--nnodes", "2", "--node-rank", "0", "--rdzv-endpoint",
                      f"127.0.0.1:{port}", "--rdzv-id", "bindtest", "--", "true"],
                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
try:
    listeners = []
    deadline = time.time() + 20
    while time.time() < deadline and not listeners:
        time.sleep(0.1)
        with open("/proc/net/tcp") as f:  # local_address is hex ip:port; state 0A = LISTEN
            for line in f.readlines()[1:]:
                local, state = line.split()[1], line.split()[3]
                ip_hex, port_hex = local.split(":")
                if state == "0A" and int(port_hex, 16) == port:
                    listeners.append(socket.inet_ntoa(bytes.fromhex(ip_hex)[::-1]))
        if p.poll() is not None:
            fail(f"launch exited early ({p.returncode}): {p.stderr.read()!r}")
    check(listeners, f"no listening socket on port {port} within 20 s")
    check(listeners == ["127.0.0.1"], f"the store listens on {listeners}, expected only 127.0.0.1")
finally:
    p.terminate()
    try:
        p.wait(timeout=20)
    except subprocess.TimeoutExpired:
        p.kill()
print(f"store for endpoint 127.0.0.1:{port} listens on {listeners} only: ok")
