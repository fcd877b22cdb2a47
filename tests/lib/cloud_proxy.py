#!/usr/bin/env python3
# The EC2 endpoint the tests' clients see (tests/lib/cloud.sh: CLOUD_ENDPOINT): an HTTP proxy in
# front of moto's server that forwards every request unchanged, but for RunInstances:
#  - without a subnet (no SubnetId, no network interface, no launch template) it adds the
#    default subnet of Placement.AvailabilityZone (else of the first zone), as EC2 does; moto
#    would otherwise give the instance a random 10.x address outside its subnet;
#  - when its subnet, that subnet's availability zone or its instance type is listed in the
#    control file (one per line; tests/lib/cloud.sh's cloud_refuse_capacity writes it), it
#    answers what EC2 answers when it has no capacity (HTTP 500, InsufficientInstanceCapacity,
#    EC2's error XML) and creates nothing;
# and for DescribeInstances, whose answer names an instance that a spot interruption ended
# (cloud_interrupt) with EC2's state reason (Server.SpotInstanceTermination), or one that shut
# itself down with InstanceInitiatedShutdownBehavior=terminate (cloud_shutdown.sh) with
# Client.InstanceInitiatedShutdown, not moto's; and for DescribeSpotPriceHistory, whose items
# take the prices of the spot-prices file beside the control file (lines "TYPE ZONE USD",
# cloud_spot_prices; moto prices every zone alike): a type it names is priced in the zones it
# names and has no spot price in the others; other types keep moto's. A HEAD
# is answered with the upstream's Content-Length (the object's size), not its empty body's.
#   cloud_proxy.py LISTEN_ADDR PORT UPSTREAM_HOST UPSTREAM_PORT CONTROL_FILE
# Standard library only. Logs one line per RunInstances (and per error) to stderr.
import http.client
import os
import http.server
import re
import socketserver
import sys
import threading
import time
import urllib.parse
import uuid
import xml.etree.ElementTree as ET

LISTEN, PORT, UP_HOST, UP_PORT, CONTROL = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), sys.argv[5]
HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer",
       "upgrade", "content-length"}
INTERRUPTED = os.path.join(os.path.dirname(CONTROL), "interrupted")
SHUTDOWN = os.path.join(os.path.dirname(CONTROL), "shutdown")
SPOT_PRICES = os.path.join(os.path.dirname(CONTROL), "spot-prices")
SUBNETS = {}  # region -> {subnet id: (az, default for az)}
LOCK = threading.Lock()


def log(msg):
    sys.stderr.write("%s proxy %s\n" % (time.strftime("%H:%M:%S"), msg))
    sys.stderr.flush()


def refused():
    try:
        with open(CONTROL) as f:
            return {w for line in f for w in line.split()}
    except OSError:
        return set()


def upstream(method, path, body, headers):
    conn = http.client.HTTPConnection(UP_HOST, UP_PORT, timeout=120)
    try:
        conn.request(method, path, body=body, headers=headers)
        r = conn.getresponse()
        return r.status, r.reason, r.getheaders(), r.read()
    finally:
        conn.close()


def subnets(region, refresh=False):
    """{subnet id: (az, default-for-az)} of REGION, asked of moto (unsigned: moto checks no
    signature, it reads the service and region from the credential scope)."""
    with LOCK:
        if region in SUBNETS and not refresh:
            return SUBNETS[region]
    body = urllib.parse.urlencode({"Action": "DescribeSubnets", "Version": "2016-11-15"})
    hdrs = {"Content-Type": "application/x-www-form-urlencoded; charset=utf-8",
            "Host": "%s:%d" % (UP_HOST, UP_PORT),
            "Authorization": "AWS4-HMAC-SHA256 Credential=fixture/20240101/%s/ec2/aws4_request, "
                             "SignedHeaders=host, Signature=0" % region}
    status, _, _, data = upstream("POST", "/", body, hdrs)
    found = {}
    if status == 200:
        root = ET.fromstring(data)
        for item in root.iter():
            if item.tag.endswith("}item") or item.tag == "item":
                fields = {c.tag.split("}")[-1]: (c.text or "") for c in item}
                if "subnetId" in fields and "availabilityZone" in fields:
                    found[fields["subnetId"]] = (fields["availabilityZone"],
                                                 fields.get("defaultForAz") == "true")
    with LOCK:
        SUBNETS[region] = found
    return found


def ice(itype, az, others):
    msg = ("We currently do not have sufficient %s capacity in the Availability Zone you requested"
           " (%s). Our system will be working on provisioning additional capacity. You can currently"
           " get %s capacity by not specifying an Availability Zone in your request or choosing %s."
           % (itype, az, itype, ", ".join(others)))
    return ('<?xml version="1.0" encoding="UTF-8"?>\n<Response><Errors><Error>'
            "<Code>InsufficientInstanceCapacity</Code><Message>%s</Message></Error></Errors>"
            "<RequestID>%s</RequestID></Response>" % (msg, uuid.uuid4())).encode()


def spot_terminations(data):
    """DescribeInstances' answer with the state reason EC2 gives an instance that a spot
    interruption ended (cloud_interrupt; the watcher names it in INTERRUPTED) in place of
    moto's Client.UserInitiatedShutdown."""
    reasons = {}
    for d, code, msg in ((SHUTDOWN, "Client.InstanceInitiatedShutdown",
                          "Client.InstanceInitiatedShutdown: Instance initiated shutdown"),
                         (INTERRUPTED, "Server.SpotInstanceTermination",
                          "Server.SpotInstanceTermination: Spot instance termination")):
        try:
            reasons.update({i: (code, msg) for i in os.listdir(d)})
        except OSError:
            pass
    ids = set(reasons)
    if not ids or not any(i.encode() in data for i in ids):
        return data
    root = ET.fromstring(data)
    ns = root.tag[1:].split("}")[0] if root.tag.startswith("{") else ""
    q = (lambda t: "{%s}%s" % (ns, t)) if ns else (lambda t: t)
    for inst in root.iter(q("item")):
        iid = inst.findtext(q("instanceId"))
        if iid not in ids or inst.findtext(q("instanceState") + "/" + q("name")) not in (
                "shutting-down", "terminated"):
            continue
        sr = inst.find(q("stateReason"))
        if sr is None:
            sr = ET.SubElement(inst, q("stateReason"))
        for child in list(sr):
            sr.remove(child)
        ET.SubElement(sr, q("code")).text = reasons[iid][0]
        ET.SubElement(sr, q("message")).text = reasons[iid][1]
    if ns:
        ET.register_namespace("", ns)
    return b'<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root)


def spot_prices(data):
    """DescribeSpotPriceHistory's answer with the spot-prices file's prices (TYPE ZONE USD)."""
    try:
        with open(SPOT_PRICES) as f:
            table = {(w[0], w[1]): w[2] for w in (line.split() for line in f) if len(w) == 3}
    except OSError:
        return data
    if not table:
        return data
    root = ET.fromstring(data)
    ns = root.tag[1:].split("}")[0] if root.tag.startswith("{") else ""
    q = (lambda t: "{%s}%s" % (ns, t)) if ns else (lambda t: t)
    named = {t for t, _ in table}
    for parent in list(root.iter()):
        for item in [c for c in parent if c.tag == q("item")]:
            key = (item.findtext(q("instanceType")), item.findtext(q("availabilityZone")))
            price = item.find(q("spotPrice"))
            if key in table and price is not None:
                price.text = table[key]
            elif key[0] in named:
                parent.remove(item)
    if ns:
        ET.register_namespace("", ns)
    return b'<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root)


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):
        pass

    def read_body(self):
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            out = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return out
                out += self.rfile.read(size)
                self.rfile.readline()
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""

    def send(self, status, reason, headers, body):
        self.send_response(status, reason)
        for k, v in headers:
            if k.lower() not in HOP:
                self.send_header(k, v)
        # A HEAD's answer has no body but says the object's length, as the upstream said it
        # (S3 HeadObject: a client checks the size of what it would download by it).
        length = str(len(body))
        if self.command == "HEAD":
            length = next((v for k, v in headers if k.lower() == "content-length"), length)
        self.send_header("Content-Length", length)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def handle_any(self):
        body = self.read_body()
        headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP}
        ctype = (self.headers.get("Content-Type") or "").lower()
        action = None
        if self.command == "POST" and ctype.startswith("application/x-www-form-urlencoded"):
            params = urllib.parse.parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True)
            action = dict(params).get("Action")
            if action == "RunInstances":
                answer = self.run_instances(params)
                if isinstance(answer, bytes):
                    return self.send(500, "Internal Server Error",
                                     [("Content-Type", "text/xml;charset=UTF-8")], answer)
                body = answer.encode()
        try:
            status, reason, rheaders, data = upstream(self.command, self.path, body or None, headers)
        except OSError as e:
            log("upstream %s %s: %s" % (self.command, self.path, e))
            return self.send(502, "Bad Gateway", [("Content-Type", "text/plain")], b"moto unreachable\n")
        if action == "DescribeInstances" and status == 200:
            data = spot_terminations(data)
        if action == "DescribeSpotPriceHistory" and status == 200:
            data = spot_prices(data)
        self.send(status, reason, rheaders, data)

    def run_instances(self, params):
        """The (maybe amended) form body to forward, or the error XML (bytes) to answer."""
        p = dict(params)
        m = re.search(r"Credential=[^/]*/[^/]*/([^/]*)/", self.headers.get("Authorization") or "")
        region = m.group(1) if m else "us-east-1"
        keys = [k for k, _ in params]
        nets = subnets(region)
        subnet = p.get("SubnetId") or next(
            (v for k, v in params if re.fullmatch(r"NetworkInterface\.\d+\.SubnetId", k)), None)
        if subnet is None and not any(k.startswith(("NetworkInterface.", "LaunchTemplate."))
                                      for k in keys):
            want = p.get("Placement.AvailabilityZone")
            default = sorted((az, sid) for sid, (az, dflt) in nets.items()
                             if dflt and (want is None or az == want))
            if default:
                subnet = default[0][1]
                params = params + [("SubnetId", subnet)]
                log("RunInstances without a subnet: default subnet %s (%s)" % (subnet, default[0][0]))
        if subnet and subnet not in nets:
            nets = subnets(region, refresh=True)
        az = nets.get(subnet, (p.get("Placement.AvailabilityZone", region + "a"), False))[0]
        itype = p.get("InstanceType", "m1.small")
        hit = refused() & {subnet, az, itype}
        if hit:
            others = sorted({a for a, _ in nets.values()} - {az})
            log("RunInstances %s in %s (%s): refused, InsufficientInstanceCapacity (listed: %s)"
                % (itype, subnet, az, " ".join(sorted(hit))))
            return ice(itype, az, others)
        log("RunInstances %s x%s in %s (%s): forwarded" % (itype, p.get("MaxCount", "?"), subnet, az))
        return urllib.parse.urlencode(params)

    do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = do_PATCH = do_OPTIONS = handle_any


class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def server_bind(self):  # HTTPServer's asks DNS for the address's name: 10 s without DNS
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = self.server_address[:2]


srv = Server((LISTEN, PORT), Handler)
log("listening on %s:%d, forwarding to %s:%d, refusals in %s" % (LISTEN, PORT, UP_HOST, UP_PORT, CONTROL))
srv.serve_forever()
