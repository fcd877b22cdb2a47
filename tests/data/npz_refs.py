"""Fixtures for tests/data/test_archive_rules.c: .npz archives that broke tandem's reader (issue
29), each written by NumPy and Python's zipfile and then, where the case needs it, patched, with
what NumPy itself makes of each one in DIR/numpy.txt (one line per archive: name, then "ok" and
the array's values, or "refused"). The C test checks that tandem refuses what it must and that
its errors say what NumPy does.

  dup.npz        member x.npy twice: x = [1 2 3], then x = [7 8 9] (zipfile keeps both entries)
  dup_key.npz    members "x" and "x.npy", different arrays, both array "x"
  liar.npz       deflated x.npy (288 Ki random float32, 1.1 MiB, incompressible) whose central
                 directory claims 1 GiB uncompressed (within deflate's 1032:1 ratio); NumPy
                 reads it (it reads the elements the .npy header declares and stops)
  liar64.npz     the same through ZIP64 (the central directory's size in a ZIP64 extra field)
  liar_stored.npz  stored x.npy whose .npy header claims 2^28 float32 (1 GiB) in 1.1 MiB

Usage: npz_refs.py DIR. Exit 77 when NumPy is missing."""
import io
import os
import struct
import sys
import warnings
import zipfile

try:
    import numpy as np
except ImportError:
    sys.exit(77)

out = sys.argv[1]
GIB = 1 << 30


def npy_bytes(a):
    b = io.BytesIO()
    np.save(b, a)
    return b.getvalue()


def write_zip(name, members, method=zipfile.ZIP_STORED):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Duplicate name": the point of the case
        with zipfile.ZipFile(os.path.join(out, name), "w", method) as z:
            for member, data in members:
                z.writestr(member, data)


def patch_central_usize(name, usize, zip64=False):
    """Sets the uncompressed size in every central-directory entry; with zip64, through a ZIP64
    extra field (the 32-bit field all ones), as archives past 4 GiB have it."""
    p = os.path.join(out, name)
    b = bytearray(open(p, "rb").read())
    eocd = b.rindex(b"PK\x05\x06")
    count, cd_size, cd_off = struct.unpack_from("<HII", b, eocd + 10)
    cd = bytearray()
    at = cd_off
    for _ in range(count):
        nlen, xlen, clen = struct.unpack_from("<HHH", b, at + 28)
        e = bytearray(b[at:at + 46 + nlen + xlen + clen])
        if zip64:
            struct.pack_into("<I", e, 24, 0xFFFFFFFF)
            extra = struct.pack("<HHQ", 1, 8, usize)
            e = e[:46 + nlen] + extra + e[46 + nlen:]  # first, before any other extra field
            struct.pack_into("<H", e, 30, xlen + len(extra))
        else:
            struct.pack_into("<I", e, 24, usize)
        cd += e
        at += 46 + nlen + xlen + clen
    tail = bytearray(b[eocd:])
    struct.pack_into("<I", tail, 12, len(cd))
    open(p, "wb").write(bytes(b[:cd_off]) + bytes(cd) + bytes(tail))


def numpy_verdict(name):
    try:
        with np.load(os.path.join(out, name)) as z:
            x = z["x"]
        return "ok " + " ".join(str(v) for v in x.ravel()[:8])
    except Exception as e:  # NumPy/zipfile refuse it: any exception is a refusal
        return "refused " + type(e).__name__


write_zip("dup.npz", [("x.npy", npy_bytes(np.array([1, 2, 3], dtype=np.int64))),
                      ("x.npy", npy_bytes(np.array([7, 8, 9], dtype=np.int64)))])
write_zip("dup_key.npz", [("x", npy_bytes(np.array([1, 2, 3], dtype=np.int64))),
                          ("x.npy", npy_bytes(np.array([7, 8, 9], dtype=np.int64)))])
N = 288 << 10  # 1.125 MiB of float32: compressed, still above 1 GiB / 1032
noise = np.random.default_rng(29).standard_normal(N).astype(np.float32)
for name, zip64 in (("liar.npz", False), ("liar64.npz", True)):
    write_zip(name, [("x.npy", npy_bytes(noise))], zipfile.ZIP_DEFLATED)
    patch_central_usize(name, GIB, zip64)
# a stored member: the .npy header (not the zip) lies, 2^28 float32 in 1 MiB
stored = bytearray(npy_bytes(noise))
hdr = stored[:stored.index(b"\n") + 1].decode("latin1")
fake = hdr.replace(f"({N},)", "(268435456,)")
fake = fake[:-1].rstrip(" ")
fake = fake + " " * (len(hdr) - 1 - len(fake)) + "\n"
assert len(fake) == len(hdr)
write_zip("liar_stored.npz", [("x.npy", fake.encode("latin1") + bytes(stored[len(hdr):]))])

with open(os.path.join(out, "numpy.txt"), "w") as f:
    for name in ("dup.npz", "dup_key.npz", "liar.npz", "liar64.npz", "liar_stored.npz"):
        f.write(f"{name} {numpy_verdict(name)}\n")
