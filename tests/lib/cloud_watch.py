#!/usr/bin/env python3
# The watcher of tests/lib/cloud.sh: turns the instances moto's EC2 reports into ssh hosts.
# Runs (with the venv's python, boto3) in the fixture's login network namespace and the
# machine's mount namespace, started by cloud_up:
#   cloud_watch.py STATE_DIR OWNER_PID
# with TSH_STATE, CLOUD_MOTO_ENDPOINT, CLOUD_REGIONS (comma-separated, us-east-1 by default) and
# CLOUD_LIB (tests/lib) in the environment. Every ~0.3 s it describes the instances of each
# region:
#  - an instance moto reports running gets a host (tests/lib/sshd.sh: sshd_add_host ID IP/16
#    172.31.0.1): its hostname is the instance id, its address the instance's private IP, and
#    its IMDS (cloud_imds.py, Debian's python3) listens on 169.254.169.254:80 inside it. Its
#    directory STATE_DIR/cloud/ID holds meta.json, what the fixture posts to its IMDS, and
#    `ready` (its address and host number) once ssh and the IMDS answer and its user data, when
#    a script, is started (cloud-init's part: run once as root, output in log/user-data-ID.log);
#  - an instance moto reports in any other state (stopped, terminated...) or no longer reports
#    has its host torn down (sshd_remove_host: every process in it killed, its namespaces
#    deleted) and STATE_DIR/cloud/ID removed;
#  - STATE_DIR/cloud/ID/terminate-at (epoch seconds, from cloud_interrupt) is honoured: at that
#    time the instance is terminated in moto, as EC2 ends an interrupted spot instance.
#  - STATE_DIR/cloud/ID/shutdown (the instance ran its shutdown command, cloud_shutdown.sh, which
#    posts to its IMDS): as EC2 does with its InstanceInitiatedShutdownBehavior (moto keeps it;
#    "stop" by default), the instance is terminated or stopped in moto; STATE_DIR/cloud/
#    shutdown/ID records "BEHAVIOUR EPOCH-SECONDS WHY" (the proxy gives a terminated one EC2's
#    state reason Client.InstanceInitiatedShutdown).
# It logs what it does to stdout (cloud_up sends it to STATE_DIR/log/cloud-watch.log). When
# OWNER_PID (the test) is gone, it tears the whole fixture down (its hosts, moto, the proxy, the
# login namespace, STATE_DIR) and exits: a SIGKILLed test leaves nothing running for long.
import base64
import glob
import ipaddress
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import boto3
import botocore.config

ST, OWNER = sys.argv[1], int(sys.argv[2])
CLOUD = os.path.join(ST, "cloud")
LIB = os.environ["CLOUD_LIB"]
ENDPOINT = os.environ["CLOUD_MOTO_ENDPOINT"]
REGIONS = [r for r in os.environ.get("CLOUD_REGIONS", "us-east-1").split(",") if r]
NET = ipaddress.ip_network(os.environ.get("CLOUD_NET", "172.31.0.0/16"))
GATEWAY = os.environ.get("CLOUD_GATEWAY", "172.31.0.1")
FIXTURE = os.path.basename(ST).rsplit("-", 1)[1]
T0 = time.monotonic()
hosts = {}  # instance id -> "adding" | "up" | "failed" | "removing"
lock = threading.Lock()
children = []
CLIENTS = {}  # region -> boto3 EC2 client of moto


def log(msg):
    print("%s %7.2f %s" % (time.strftime("%H:%M:%S"), time.monotonic() - T0, msg), flush=True)


def sshd(fn, *args):
    """Runs sshd.sh's FN ARGS in bash; returns (exit status, output)."""
    r = subprocess.run(["bash", "-c", '. "$1/sshd.sh"; shift; "$@"', "bash", LIB, fn, *args],
                       stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, env=dict(os.environ, TSH_STATE=ST))
    return r.returncode, r.stdout.strip()


def write(path, text):
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.rename(path + ".tmp", path)


def add(iid, inst, region):
    t = time.monotonic()
    ip = inst.get("PrivateIpAddress")
    state = "failed"
    try:
        if not ip or ipaddress.ip_address(ip) not in NET:
            log("%s: running, but its address %s is outside %s: no host" % (iid, ip, NET))
            return
        d = os.path.join(CLOUD, iid)
        os.makedirs(d, exist_ok=True)
        meta = {"instance-id": iid, "instance-type": inst.get("InstanceType", ""),
                "availability-zone": inst.get("Placement", {}).get("AvailabilityZone", ""),
                "region": region, "local-ipv4": ip, "ami-id": inst.get("ImageId", ""),
                "local-hostname": inst.get("PrivateDnsName", ""),
                "mac": (inst.get("NetworkInterfaces") or [{}])[0].get("MacAddress", ""),
                "instance-life-cycle": inst.get("InstanceLifecycle", "on-demand"),
                "subnet-id": inst.get("SubnetId", ""),
                "iam-role": inst.get("IamInstanceProfile", {}).get("Arn", "").split("/")[-1]}
        write(os.path.join(d, "meta.json"), json.dumps(meta, indent=1))
        rc, out = sshd("sshd_add_host", iid, "%s/%d" % (ip, NET.prefixlen), GATEWAY)
        if rc != 0:
            log("%s: sshd_add_host failed (%d): %s" % (iid, rc, out))
            return
        rc, idx = sshd("sshd_host_index", iid)
        with open(os.path.join(ST, "h%s" % idx, "pid")) as f:
            pid = f.read().strip()
        ns = "tsh-%s-h%s" % (FIXTURE, idx)
        subprocess.run(["ip", "-n", ns, "addr", "add", "169.254.169.254/32", "dev", "lo"], check=True)
        logf = open(os.path.join(ST, "log", "imds-%s.log" % iid), "a")
        # in the host's network and PID namespaces (its processes die with its sshd), reading
        # the state dir through the machine's mount namespace
        children.append(subprocess.Popen(
            ["nsenter", "-t", pid, "-n", "-p", "--", "/usr/bin/python3",
             os.path.join(LIB, "cloud_imds.py"), d],
            stdin=subprocess.DEVNULL, stdout=logf, stderr=logf, start_new_session=True))
        logf.close()
        log("%s: host %s up, IMDS started (pid %d)" % (iid, idx, children[-1].pid))
        for _ in range(200):
            if os.path.exists(os.path.join(d, "imds.ready")):
                break
            time.sleep(0.05)
        else:
            log("%s: its IMDS did not start within 10 s" % iid)
            return
        user_data(iid, region, d, pid)
        write(os.path.join(d, "ready"), "%s %s\n" % (ip, idx))
        state = "up"
        log("%s: host up at %s (host %s, %s, %s) in %.2f s"
            % (iid, ip, idx, meta["instance-type"], meta["availability-zone"], time.monotonic() - t))
    except Exception as e:  # noqa: BLE001 - a fixture logs and goes on
        log("%s: cannot make its host: %r" % (iid, e))
    finally:
        with lock:
            hosts[iid] = state


def user_data(iid, region, d, pid):
    """Its user data: served by its IMDS (latest/user-data); a script (#!) is run once as root
    inside the host, detached, in / with a clean environment, its output in
    STATE_DIR/log/user-data-ID.log, like cloud-init runs it at the end of the boot."""
    value = CLIENTS[region].describe_instance_attribute(
        InstanceId=iid, Attribute="userData").get("UserData", {}).get("Value")
    if not value:
        return
    data = base64.b64decode(value)
    path = os.path.join(d, "user-data")
    with open(path + ".tmp", "wb") as f:
        f.write(data)
    os.chmod(path + ".tmp", 0o755)
    os.rename(path + ".tmp", path)
    if not data.startswith(b"#!"):
        log("%s: user data (%d bytes) served, not run: not a script" % (iid, len(data)))
        return
    logf = open(os.path.join(ST, "log", "user-data-%s.log" % iid), "ab")
    children.append(subprocess.Popen(
        ["nsenter", "-t", pid, "-n", "-u", "-m", "-p", "--", "env", "-i",
         "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root",
         "sh", "-c", 'cd / && exec "$0"', path],
        stdin=subprocess.DEVNULL, stdout=logf, stderr=logf, start_new_session=True))
    logf.close()
    log("%s: user data (%d bytes) started" % (iid, len(data)))


def remove(iid, why):
    t = time.monotonic()
    rc, out = sshd("sshd_remove_host", iid)
    if rc != 0 and "no host" not in out:
        log("%s: sshd_remove_host failed (%d): %s" % (iid, rc, out))
    shutil.rmtree(os.path.join(CLOUD, iid), ignore_errors=True)
    log("%s: %s: host torn down in %.2f s" % (iid, why, time.monotonic() - t))
    with lock:
        del hosts[iid]


def start(fn, *args):
    threading.Thread(target=fn, args=args, daemon=True).start()


def alive(pid):
    try:
        with open("/proc/%d/status" % pid) as f:
            return not any(line.startswith("State:") and "Z" in line.split()[1] for line in f)
    except OSError:
        return False


def teardown_all():
    """The owner is gone: everything of the fixture, this process last."""
    log("the test (pid %d) is gone: tearing the fixture down" % OWNER)
    for iid in list(hosts):
        sshd("sshd_remove_host", iid)
    me = str(os.getpid())
    nss = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
    nss = [n for n in nss if n.startswith("tsh-%s-" % FIXTURE)]
    for ns in nss:
        pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
        for p in pids:
            if p != me:
                try:
                    os.kill(int(p), signal.SIGKILL)
                except OSError:
                    pass
    time.sleep(0.2)
    for ns in nss:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
    shutil.rmtree(ST, ignore_errors=True)
    sys.exit(0)


def main():
    cfg = botocore.config.Config(retries={"max_attempts": 2, "mode": "standard"},
                                 connect_timeout=5, read_timeout=30)
    clients = CLIENTS
    clients.update({r: boto3.client("ec2", region_name=r, endpoint_url=ENDPOINT, config=cfg,
                               aws_access_key_id="fixture", aws_secret_access_key="fixture")
                    for r in REGIONS})
    # what a test needs to launch: an image and the default subnets of the first region
    ec2 = clients[REGIONS[0]]
    for _ in range(100):
        try:
            images = ec2.describe_images(Owners=["amazon"])["Images"]
            break
        except Exception as e:  # noqa: BLE001 - moto starting
            err = e
            time.sleep(0.2)
    else:
        log("moto does not answer at %s: %r" % (ENDPOINT, err))
        sys.exit(1)
    ami = sorted(i["ImageId"] for i in images if "x86_64" in i.get("Architecture", "x86_64"))[0]
    subnets = sorted((s["AvailabilityZone"], s["SubnetId"], s["CidrBlock"])
                     for s in ec2.describe_subnets()["Subnets"] if s.get("DefaultForAz"))
    write(os.path.join(CLOUD, "info"), "ami %s\n" % ami
          + "".join("subnet %s %s %s\n" % (sid, az, cidr) for az, sid, cidr in subnets))
    log("watching %s at %s (image %s, %d default subnets); owner %d"
        % (",".join(REGIONS), ENDPOINT, ami, len(subnets), OWNER))
    while True:
        if not alive(OWNER):
            teardown_all()
        children[:] = [c for c in children if c.poll() is None]
        for path in glob.glob(os.path.join(CLOUD, "*", "terminate-at")):
            try:
                with open(path) as f:
                    due = float(f.read())
            except (OSError, ValueError):
                continue
            if time.time() >= due:
                iid = path.split("/")[-2]
                region = json.load(open(os.path.join(os.path.dirname(path), "meta.json")))["region"]
                try:
                    # the proxy's DescribeInstances gives it a spot interruption's state reason
                    os.makedirs(os.path.join(CLOUD, "interrupted"), exist_ok=True)
                    write(os.path.join(CLOUD, "interrupted", iid), "%f\n" % due)
                    clients.get(region, ec2).terminate_instances(InstanceIds=[iid])
                    log("%s: interruption due: terminated" % iid)
                except Exception as e:  # noqa: BLE001
                    log("%s: interruption due, but terminate failed: %r" % (iid, e))
                os.unlink(path)
        for path in glob.glob(os.path.join(CLOUD, "*", "shutdown")):
            iid = path.split("/")[-2]
            try:
                with open(path) as f:
                    why = f.read().replace("\n", " ")
                region = json.load(open(os.path.join(os.path.dirname(path), "meta.json")))["region"]
                client = clients.get(region, ec2)
                how = client.describe_instance_attribute(
                    InstanceId=iid, Attribute="instanceInitiatedShutdownBehavior")[
                    "InstanceInitiatedShutdownBehavior"]["Value"]
                os.makedirs(os.path.join(CLOUD, "shutdown"), exist_ok=True)
                write(os.path.join(CLOUD, "shutdown", iid), "%s %f %s\n" % (how, time.time(), why))
                if how == "terminate":
                    client.terminate_instances(InstanceIds=[iid])
                else:
                    client.stop_instances(InstanceIds=[iid])
                log("%s: shut down from inside (%s): %s" % (iid, why, how))
            except Exception as e:  # noqa: BLE001
                log("%s: shut down from inside, but acting on it failed: %r" % (iid, e))
            try:
                os.unlink(path)
            except OSError:
                pass
        seen = {}
        try:
            for region, client in clients.items():
                for page in client.get_paginator("describe_instances").paginate():
                    for r in page["Reservations"]:
                        for inst in r["Instances"]:
                            seen[inst["InstanceId"]] = (inst, region)
        except Exception as e:  # noqa: BLE001 - go on polling
            log("describe_instances: %r" % e)
            time.sleep(1)
            continue
        with lock:
            for iid, (inst, region) in seen.items():
                if inst["State"]["Name"] == "running" and iid not in hosts:
                    hosts[iid] = "adding"
                    log("%s: running at %s: making its host" % (iid, inst.get("PrivateIpAddress")))
                    start(add, iid, inst, region)
            for iid, state in list(hosts.items()):
                now = seen[iid][0]["State"]["Name"] if iid in seen else "gone"
                if now not in ("pending", "running") and state in ("up", "failed"):
                    hosts[iid] = "removing"
                    start(remove, iid, now)
        time.sleep(0.3)


main()
