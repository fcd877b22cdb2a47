"""SigV4 test vectors from botocore's own signer (SigV4Auth for EC2, S3SigV4Auth for S3).

Writes the cases below, each with botocore's canonical request, string to sign, signature and
Authorization header, in the line format tests/cloud/test_sigv4.c reads. sigv4_vectors.txt in
this folder is this script's output (committed, botocore 1.44.8); test_sigv4_botocore.sh runs it
again with the tests' venv and checks tandem's signer against the fresh output.
  python sigv4_vectors.py > sigv4_vectors.txt
"""
import datetime
import hashlib
import sys
from unittest import mock

import botocore
from botocore.auth import S3SigV4Auth, SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

AK, SK = "AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"
TOKEN = "IQoJb3JpZ2luX2VjEXAMPLETOKEN//////////wEaCXVzLWVhc3QtMSJHMEUCIQ+long/and+odd=="

CASES = [
    dict(name="ec2-run-instances", service="ec2", region="us-east-1", method="POST",
         host="ec2.us-east-1.amazonaws.com", path="/", query="",
         headers={"content-type": "application/x-www-form-urlencoded; charset=utf-8"},
         body=b"Action=RunInstances&Version=2016-11-15&ImageId=ami-12345678&InstanceType=t3.micro"
              b"&MinCount=2&MaxCount=2&TagSpecification.1.Tag.1.Key=tandem%3Arun",
         token=None, time=1700000000),
    dict(name="ec2-session-token-port", service="ec2", region="eu-west-3", method="POST",
         host="127.0.0.1:45123", path="/", query="",
         headers={"content-type": "application/x-www-form-urlencoded; charset=utf-8"},
         body=b"Action=DescribeInstances&Version=2016-11-15&Filter.1.Name=tag%3Atandem%3Arun",
         token=TOKEN, time=1735689599),
    dict(name="s3-put-encoded-key", service="s3", region="us-west-2", method="PUT",
         host="my-bucket.s3.us-west-2.amazonaws.com",
         path="/runs/r%201/ckpt%2B%C3%A9t%C3%A9.bin", query="",
         headers={"content-md5": "1B2M2Y8AsgTpgAmY7PhCfg==",
                  "content-type": "application/octet-stream",
                  "x-amz-meta-tandem-sha256": "ab" * 32},
         body=b"hello world\n", token=TOKEN, time=1700000123),
    dict(name="s3-list-unsorted-query", service="s3", region="us-east-1", method="GET",
         host="127.0.0.1:9000", path="/bkt", query="prefix=a%2Fb%20c&list-type=2&max-keys=2"
         "&continuation-token=1%2Fabc%3D%3D", headers={}, body=b"", token=None,
         time=1700000456),
    dict(name="s3-create-multipart", service="s3", region="us-east-1", method="POST",
         host="127.0.0.1:9000", path="/bkt/big.bin", query="uploads",
         headers={"content-type": "application/octet-stream",
                  "x-amz-meta-tandem-sha256": "cd" * 32},
         body=b"", token=None, time=1700000789),
    dict(name="s3-upload-part", service="s3", region="ap-southeast-2", method="PUT",
         host="bkt.s3.ap-southeast-2.amazonaws.com", path="/big.bin",
         query="uploadId=VXBsb2FkIElEIGZvciA2aWWpbmcncyBteS1tb3ZpZS5tMnRzIHVwbG9hZA--"
               "&partNumber=10", headers={"content-md5": "XrY7u+Ae7tCTyyK7j1rNww=="},
         body=b"x" * 1000, token=TOKEN, time=1700001000),
    dict(name="s3-header-spacing", service="s3", region="us-east-1", method="DELETE",
         host="bkt.s3.us-east-1.amazonaws.com", path="/k", query="",
         headers={"X-Amz-Meta-Note": "  two   spaces  inside ", "X-Custom": "a\tb"},
         body=b"", token=None, time=1700002000),
]


def esc(s):
    return s.replace("\\", "\\\\").replace("\n", "\\n")


def sign(c):
    url = "http://" + c["host"] + c["path"] + ("?" + c["query"] if c["query"] else "")
    headers = dict(c["headers"])
    payload = hashlib.sha256(c["body"]).hexdigest()
    if c["service"] == "s3":
        headers["X-Amz-Content-SHA256"] = payload
    req = AWSRequest(method=c["method"], url=url, data=c["body"], headers=headers)
    req.headers["host"] = c["host"]
    base = S3SigV4Auth if c["service"] == "s3" else SigV4Auth
    seen = {}

    class Capture(base):
        def canonical_request(self, r):
            seen["cr"] = super().canonical_request(r)
            return seen["cr"]

        def string_to_sign(self, r, cr):
            seen["sts"] = super().string_to_sign(r, cr)
            return seen["sts"]

    auth = Capture(Credentials(AK, SK, c["token"]), c["service"], c["region"])
    now = datetime.datetime.fromtimestamp(c["time"], datetime.timezone.utc).replace(tzinfo=None)
    with mock.patch("botocore.auth.get_current_datetime", return_value=now):
        auth.add_auth(req)
    authz = req.headers["Authorization"]
    sig = authz.rsplit("Signature=", 1)[1]
    return payload, seen["cr"], seen["sts"], sig, authz


def main():
    out = sys.stdout
    out.write(f"# SigV4 vectors from botocore {botocore.__version__} (tests/cloud/sigv4_vectors.py)\n\n")
    for c in CASES:
        payload, cr, sts, sig, authz = sign(c)
        out.write(f"name: {c['name']}\n")
        out.write(f"service: {c['service']}\nregion: {c['region']}\nmethod: {c['method']}\n")
        out.write(f"path: {c['path']}\nquery: {c['query']}\n")
        out.write(f"header: host: {c['host']}\n")
        for k, v in c["headers"].items():
            out.write(f"header: {k}: {esc(v)}\n")
        if c["service"] == "s3":
            out.write(f"header: x-amz-content-sha256: {payload}\n")
        out.write(f"access_key_id: {AK}\nsecret_access_key: {SK}\n")
        if c["token"]:
            out.write(f"session_token: {c['token']}\n")
        out.write(f"time_s: {c['time']}\npayload_sha256: {payload}\n")
        out.write(f"expect_canonical_request: {esc(cr)}\n")
        out.write(f"expect_string_to_sign: {esc(sts)}\n")
        out.write(f"expect_signature: {sig}\n")
        out.write(f"expect_authorization: {authz}\n\n")


if __name__ == "__main__":
    main()
