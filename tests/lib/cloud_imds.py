#!/usr/bin/env python3
# The instance metadata service (IMDSv2) of one simulated EC2 instance (tests/lib/cloud.sh):
# started by the watcher (cloud_watch.py) inside the instance's host namespaces, listening on
# 169.254.169.254:80 there. Standard library only (it runs with Debian's python3).
#   cloud_imds.py DIR
# DIR holds meta.json (instance-id, instance-type, availability-zone, region, local-ipv4,
# ami-id, instance-life-cycle, local-hostname, mac, iam-role: the instance profile's name when
# it has one, whose meta-data/iam/security-credentials/ROLE are static keys that moto accepts
# as long as its IAM authentication is off), written before the start, and what the
# fixture posts later, read at each request: spot-instance-action (the JSON of
# meta-data/spot/instance-action, which also yields spot/termination-time) and rebalance (that of
# meta-data/events/recommendations/rebalance). Both answer 404 until posted, like EC2;
# user-data (latest/user-data, 404 without).
# IMDSv2 only (http_tokens=required): PUT /latest/api/token with
# X-aws-ec2-metadata-token-ttl-seconds (1..21600) returns a token; a GET without a valid,
# unexpired X-aws-ec2-metadata-token gets 401. Writes DIR/imds.ready once it listens.
import http.server
import json
import os
import secrets
import socketserver
import sys
import threading
import time

sys.stderr.write("%s imds starting\n" % time.strftime("%H:%M:%S"))
sys.stderr.flush()

DIR = sys.argv[1]
ADDR = os.environ.get("CLOUD_IMDS_ADDR", "169.254.169.254")
PORT = int(os.environ.get("CLOUD_IMDS_PORT", "80"))
with open(os.path.join(DIR, "meta.json")) as f:
    META = json.load(f)
TOKENS = {}  # token -> expiry (monotonic)
LOCK = threading.Lock()


def posted(name):
    try:
        with open(os.path.join(DIR, name)) as f:
            return f.read()
    except OSError:
        return None


def meta_data(path):
    """The body of meta-data/PATH, or None for 404."""
    m = META
    fixed = {
        "instance-id": m["instance-id"],
        "instance-type": m["instance-type"],
        "ami-id": m.get("ami-id", ""),
        "local-ipv4": m["local-ipv4"],
        "local-hostname": m.get("local-hostname", ""),
        "hostname": m.get("local-hostname", ""),
        "mac": m.get("mac", ""),
        "instance-life-cycle": m.get("instance-life-cycle", "on-demand"),
        "placement/availability-zone": m["availability-zone"],
        "placement/region": m["region"],
    }
    if path in fixed:
        return fixed[path]
    if path == "spot/instance-action":
        return posted("spot-instance-action")
    if path == "spot/termination-time":
        action = posted("spot-instance-action")
        return json.loads(action)["time"] if action else None
    if path == "events/recommendations/rebalance":
        return posted("rebalance")
    role = m.get("iam-role")
    if role and path.rstrip("/") == "iam/security-credentials":
        return role
    if role and path == "iam/security-credentials/" + role:
        now = time.time()
        stamp = lambda t: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))  # noqa: E731
        return json.dumps({"Code": "Success", "LastUpdated": stamp(now), "Type": "AWS-HMAC",
                           "AccessKeyId": "ASIAFIXTURE" + m["instance-id"][-9:].upper(),
                           "SecretAccessKey": "fixture", "Token": "fixture-" + m["instance-id"],
                           "Expiration": stamp(now + 6 * 3600)}, indent=2)
    # directory listings, as EC2 prints them (entries with a trailing / are directories)
    listings = {
        "": ["ami-id", "events/", "hostname", "instance-id", "instance-life-cycle",
             "instance-type", "local-hostname", "local-ipv4", "mac", "placement/"]
            + (["spot/"] if posted("spot-instance-action") else [])
            + (["iam/"] if m.get("iam-role") else []),
        "iam": ["security-credentials/"] if m.get("iam-role") else None,
        "placement": ["availability-zone", "region"],
        "events": ["recommendations/"],
        "events/recommendations": ["rebalance"] if posted("rebalance") else [],
        "spot": ["instance-action", "termination-time"] if posted("spot-instance-action") else None,
    }
    entries = listings.get(path.rstrip("/"))
    return None if entries is None else "\n".join(entries)


class Handler(http.server.BaseHTTPRequestHandler):
    server_version = "EC2ws"
    sys_version = ""

    def log_message(self, fmt, *args):
        sys.stderr.write("%s imds %s\n" % (time.strftime("%H:%M:%S"), fmt % args))

    def reply(self, code, body="", ctype="text/plain", headers=()):
        data = body.encode()
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        for k, v in headers:
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def do_POST(self):
        """The fixture's own door, not EC2's: cloud_shutdown.sh (the instance's shutdown command
        in the tests) posts here; the watcher then does what EC2 does with the instance's
        InstanceInitiatedShutdownBehavior. The body (why) is kept for the test to read."""
        n = int(self.headers.get("Content-Length") or 0)
        why = self.rfile.read(n).decode(errors="replace") if n else ""
        if self.path != "/fixture/shutdown":
            return self.reply(404, "Not Found")
        with open(os.path.join(DIR, "shutdown.tmp"), "w") as f:
            f.write(why)
        os.rename(os.path.join(DIR, "shutdown.tmp"), os.path.join(DIR, "shutdown"))
        self.reply(200, "shutting down\n")

    def do_PUT(self):
        n = int(self.headers.get("Content-Length") or 0)
        if n:
            self.rfile.read(n)
        if self.path != "/latest/api/token":
            return self.reply(404, "Not Found")
        if self.headers.get("X-Forwarded-For"):
            return self.reply(403, "Forbidden")
        ttl = self.headers.get("X-aws-ec2-metadata-token-ttl-seconds")
        if ttl is None or not ttl.isdigit() or not 1 <= int(ttl) <= 21600:
            return self.reply(400, "Bad Request")
        token = secrets.token_urlsafe(42)
        with LOCK:
            TOKENS[token] = time.monotonic() + int(ttl)
        self.reply(200, token, headers=[("X-aws-ec2-metadata-token-ttl-seconds", ttl)])

    def do_GET(self):
        token = self.headers.get("X-aws-ec2-metadata-token")
        with LOCK:
            valid = token is not None and TOKENS.get(token, 0) > time.monotonic()
        if not valid:
            return self.reply(401, "Unauthorized")
        path = self.path.split("?")[0]
        if path in ("/", "/latest", "/latest/"):
            return self.reply(200, "dynamic\nmeta-data" + ("\nuser-data" if posted("user-data") else ""))
        if path == "/latest/user-data":
            data = posted("user-data")
            return self.reply(200, data) if data is not None else self.reply(404, "Not Found")
        if path == "/latest/dynamic/instance-identity/document":
            m = META
            doc = {"accountId": m.get("account-id", "123456789012"),
                   "architecture": "x86_64", "availabilityZone": m["availability-zone"],
                   "imageId": m.get("ami-id", ""), "instanceId": m["instance-id"],
                   "instanceType": m["instance-type"], "privateIp": m["local-ipv4"],
                   "region": m["region"], "version": "2017-09-30"}
            return self.reply(200, json.dumps(doc, indent=2), "application/json")
        prefix = "/latest/meta-data/"
        if path == prefix[:-1] or path.startswith(prefix):
            body = meta_data(path[len(prefix):])
            if body is not None:
                return self.reply(200, body)
        self.reply(404, "Not Found")

    do_HEAD = do_GET


class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def server_bind(self):  # HTTPServer's asks DNS for the address's name: 10 s without DNS
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = self.server_address[:2]


srv = Server((ADDR, PORT), Handler)
sys.stderr.write("%s imds of %s listening on %s:%d\n" % (time.strftime("%H:%M:%S"), META["instance-id"], ADDR, PORT))
sys.stderr.flush()
with open(os.path.join(DIR, "imds.ready.tmp"), "w") as f:
    f.write("%d\n" % os.getpid())
os.rename(os.path.join(DIR, "imds.ready.tmp"), os.path.join(DIR, "imds.ready"))
srv.serve_forever()
