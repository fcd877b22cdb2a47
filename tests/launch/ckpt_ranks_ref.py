"""boto3's side of test_ckpt_s3_ranks (moto behind tests/launch/s3_gate.py, bucket `ckpts`): the
reference for what another node's agent put in S3, never tandem's own reading of it.

  ckpt_ranks_ref.py commit PORT KEY REL...   puts KEY.commit as node 0's agent writes a directory
                                             checkpoint's commit, naming files REL (made-up sizes
                                             and SHA-256s: only the names matter to the test)
  ckpt_ranks_ref.py verify PORT PREFIX NAME NODE DIR REL...
                                             exits 0 when PREFIX/NAME/.tandem-node-NODE.commit
                                             lists exactly the files REL, each with the size and
                                             hashlib's SHA-256 of DIR/REL, each object
                                             PREFIX/NAME/.tandem-node-NODE/REL holds DIR/REL's
                                             bytes, and no other key lies below
                                             PREFIX/NAME/.tandem-node-NODE/; else says what
                                             differs and exits 1
  ckpt_ranks_ref.py absent PORT PREFIX       exits 0 when no key begins with PREFIX
  ckpt_ranks_ref.py tamper PORT KEY          overwrites KEY with other bytes of the same size"""
import hashlib
import sys

BUCKET = "ckpts"


def client(port):
    import boto3

    return boto3.client("s3", endpoint_url="http://127.0.0.1:%s" % port, region_name="us-east-1")


def keys(s3, prefix):
    out = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix):
        out += [o["Key"] for o in page.get("Contents", [])]
    return out


def main(argv):
    cmd, port = argv[1], argv[2]
    s3 = client(port)
    if cmd == "commit":
        key, rels = argv[3], argv[4:]
        name = key.rsplit("/", 1)[-1]
        text = "tandem-checkpoint-commit 1\nobject %s/\nstep %s\nfiles %d\n" % (
            name, name.rsplit("-", 1)[-1], len(rels))
        text += "".join("file 10 %s %s\n" % ("ab" * 32, r) for r in rels)
        s3.put_object(Bucket=BUCKET, Key=key + ".commit", Body=text.encode())
    elif cmd == "verify":
        prefix, name, node, d, rels = argv[3], argv[4], argv[5], argv[6], argv[7:]
        base = "%s/%s/.tandem-node-%s" % (prefix, name, node)
        text = s3.get_object(Bucket=BUCKET, Key=base + ".commit")["Body"].read().decode()
        lines = sorted(l for l in text.splitlines() if l.startswith("file "))
        want = []
        for rel in rels:
            data = open("%s/%s" % (d, rel), "rb").read()
            want.append("file %d %s %s" % (len(data), hashlib.sha256(data).hexdigest(), rel))
            got = s3.get_object(Bucket=BUCKET, Key="%s/%s" % (base, rel))["Body"].read()
            if got != data:
                sys.exit("s3://%s/%s/%s holds %d bytes, not %s/%s's %d"
                         % (BUCKET, base, rel, len(got), d, rel, len(data)))
        if lines != sorted(want) or "files %d" % len(rels) not in text.splitlines():
            sys.exit("s3://%s/%s.commit lists\n%s\nnot\n%s" % (BUCKET, base, text, "\n".join(want)))
        extra = sorted(set(keys(s3, base + "/")) - {"%s/%s" % (base, r) for r in rels})
        if extra:
            sys.exit("keys other than the node's own files below s3://%s/%s/: %s"
                     % (BUCKET, base, extra))
    elif cmd == "absent":
        found = keys(s3, argv[3])
        if found:
            sys.exit("keys below s3://%s/%s: %s" % (BUCKET, argv[3], found))
    elif cmd == "tamper":
        key = argv[3]
        data = s3.get_object(Bucket=BUCKET, Key=key)["Body"].read()
        s3.put_object(Bucket=BUCKET, Key=key, Body=bytes((b + 1) % 256 for b in data))
    else:
        sys.exit("unknown command %s" % cmd)


if __name__ == "__main__":
    main(sys.argv)
