"""launch: a node that never comes (issue 8: 300 s of silence, then an error). The waiting node
says every 5 s who has joined and gives up at --rdzv-timeout, naming the fix."""
import os
import socket

from launchtest import check, launch

s = socket.socket()
s.bind(("127.0.0.1", 0))
port = s.getsockname()[1]
s.close()

rc, out, err, secs = launch(["--nnodes", "2", "--node-rank", "0", "--rdzv-endpoint",
                             f"127.0.0.1:{port}", "--rdzv-id", "missing", "--rdzv-timeout", "11",
                             "--", "true"], timeout=60, env={"TANDEM_TOKEN": "missing-secret"})
check(rc != 0, f"a rendezvous that never completes must fail (exit {rc})")
reports = [l for l in err.splitlines() if "rendezvous: 1 of 2 nodes joined" in l]
check(len(reports) >= 2, f"expected a report every 5 s naming who joined: {err!r}")
check(socket.gethostname() in reports[0], f"the joined node is not named: {reports[0]!r}")
check("waited 11 s" in err and "--rdzv-timeout" in err, f"the give-up names the timeout: {err!r}")
check(secs < 40, f"gave up after {secs:.0f} s, --rdzv-timeout is 11 s")
print(f"missing node: {len(reports)} reports, gave up after {secs:.1f} s: ok")
