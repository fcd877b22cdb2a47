"""Fixtures for tests/data/test_formats.c written by the real NumPy and PIL, so the readers are
checked against what users' tools write rather than against our own idea of the formats.
Usage: formats_fixtures.py DIR. Exit 77 when NumPy is missing; PIL is optional (the image files
are skipped without it and the C test says so)."""
import os
import sys
import zipfile

try:
    import numpy as np
except ImportError:
    sys.exit(77)

out = sys.argv[1]


def path(name):
    return os.path.join(out, name)


base = np.arange(12).reshape(3, 4)
for dt in ["uint8", "int8", "uint16", "int16", "int32", "int64", "float16", "float32", "float64"]:
    np.save(path(f"t_{dt}.npy"), (base - (6 if dt.startswith("int") else 0)).astype(dt))
np.save(path("t_bool.npy"), base % 3 == 0)
np.save(path("scalar.npy"), np.float64(2.5))
np.save(path("empty.npy"), np.zeros((0, 5), dtype=np.float32))
for v in [(1, 0), (2, 0), (3, 0)]:
    with open(path(f"v{v[0]}.npy"), "wb") as f:
        np.lib.format.write_array(f, np.arange(6, dtype=np.float32).reshape(2, 3), version=v)
np.save(path("fortran.npy"), np.asfortranarray(base.astype(np.float32)))
np.save(path("bigendian.npy"), np.arange(4, dtype=">f4"))
np.save(path("object.npy"), np.array([1, "a"], dtype=object), allow_pickle=True)
np.save(path("strings.npy"), np.array(["a", "bc"]))
np.save(path("uint32.npy"), np.arange(3, dtype=np.uint32))

x = np.arange(24, dtype=np.float32).reshape(2, 3, 4) / 4
y = np.array([3, 1, 4, 1, 5], dtype=np.int64)
big = np.arange(100000, dtype=np.int32) % 1000
np.savez(path("stored.npz"), x=x, y=y)
np.savez_compressed(path("deflated.npz"), x=x, y=y, big=big)
# ZIP64 everywhere: zipfile writes the ZIP64 extra fields and end records when sizes pass its
# limits; lowering them makes a small archive take every ZIP64 path a >4 GiB one would.
saved = zipfile.ZIP64_LIMIT, zipfile.ZIP_FILECOUNT_LIMIT
zipfile.ZIP64_LIMIT, zipfile.ZIP_FILECOUNT_LIMIT = 16, 1
np.savez(path("zip64.npz"), x=x, y=y)
np.savez_compressed(path("zip64_deflated.npz"), x=x, y=y)
zipfile.ZIP64_LIMIT, zipfile.ZIP_FILECOUNT_LIMIT = saved

try:
    from PIL import Image
except ImportError:
    sys.exit(0)

h, w = 23, 37
yy, xx = np.mgrid[0:h, 0:w]
rgb = np.stack([xx * 7 % 256, yy * 11 % 256, (xx * yy) % 256], axis=-1).astype(np.uint8)
Image.fromarray(rgb).save(path("pil_rgb.jpg"), quality=90)
Image.fromarray(rgb).save(path("pil_rgb_prog.jpg"), quality=75, progressive=True)
Image.fromarray(rgb[:, :, 0]).save(path("pil_grey.jpg"), quality=95)
Image.fromarray(rgb).save(path("pil_rgb.png"))
Image.fromarray(rgb).convert("P", palette=Image.ADAPTIVE, colors=16).save(path("pil_pal.png"))
Image.fromarray(np.concatenate([rgb, rgb[:, :, :1]], axis=-1)).save(path("pil_rgba.png"))
Image.fromarray((yy * 1000 + xx).astype(np.uint16)).save(path("pil_grey16.png"))
# what PIL decodes, to compare pixel for pixel (the same libjpeg decodes both)
for name in ["pil_rgb.jpg", "pil_rgb_prog.jpg", "pil_grey.jpg", "pil_pal.png", "pil_rgba.png"]:
    im = Image.open(path(name))
    im = im.convert("RGBA" if name.endswith("rgba.png") else ("L" if im.mode == "L" else "RGB"))
    np.asarray(im).tofile(path(name + ".raw"))
# PIL's own luma and resampling of the RGB image, for td_image_convert
im = Image.fromarray(rgb)
np.asarray(im.convert("L")).tofile(path("pil_rgb_L.raw"))
np.asarray(im.resize((10, 7), Image.BOX)).tofile(path("pil_rgb_box_10x7.raw"))
np.asarray(im.resize((80, 50), Image.BILINEAR)).tofile(path("pil_rgb_bilinear_80x50.raw"))
