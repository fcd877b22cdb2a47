"""Writes one small data set in every format `tandem train --data` reads, for
test_formats_train.sh: the first 410 of scikit-learn's 8x8 digits (330 train, 80 test), pixel
values u = round(v * 255 / 16) (uint8), sorted by class so that an image folder (classes in
sorted order, files in sorted name order) lists the samples in the same order as the arrays.

  OUT/idx/{train,t10k}-{images-idx3,labels-idx1}-ubyte   IDX, uint8 [n,8,8], labels uint8
  OUT/png/{train,test}/<class>/<i>.png      8x8 greyscale PNG, the same u
  OUT/u8.npz                                x_train uint8 [n,1,8,8] = u, y_train int64, x_test, y_test
  OUT/u8.safetensors                        the same tensors (U8, I64)
  OUT/jpeg/{train,test}/<class>/<i>.jpg     the same images as JPEG (quality 90, lossy)
  OUT/jpeg.npz                              what Pillow (libjpeg) decodes from those JPEGs
  OUT/{train,test}.csv                      table: 64 float features = u, then "target"
  OUT/{x,y}_{train,test}.npy                the same table: float32 [n,64], int64 [n]
  OUT/f32.npz, OUT/f32.safetensors          the same table (x_train, y_train, x_test, y_test)
  OUT/bad/missing.csv                       line 4 has an empty feature
  OUT/bad/fortran_x.npy                     a Fortran-order float32 [n,64] (with y_train.npy)
  OUT/bad/data.parquet                      an unknown extension

The safetensors files are written by hand (8-byte little-endian header length, JSON header,
raw little-endian data), as the format's spec describes, so no safetensors package is needed.

usage: make_formats.py OUT      (needs numpy, scikit-learn, Pillow)"""
import json
import os
import struct
import sys

import numpy as np
from PIL import Image
from sklearn.datasets import load_digits

N_TRAIN, N_TEST = 330, 80


def write_idx(path, magic_dtype, arr):
    """IDX: magic 0x0000 08 <ndim>, then the dims as big-endian uint32, then the bytes."""
    with open(path, "wb") as f:
        f.write(struct.pack(">I", (magic_dtype << 8) | arr.ndim))
        for d in arr.shape:
            f.write(struct.pack(">I", d))
        f.write(arr.astype(np.uint8).tobytes())


def write_safetensors(path, tensors):
    dtypes = {np.dtype(np.uint8): "U8", np.dtype(np.int64): "I64", np.dtype(np.float32): "F32"}
    header, blobs, offset = {}, [], 0
    for name, a in tensors.items():
        a = np.ascontiguousarray(a)
        b = a.astype(a.dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": dtypes[a.dtype], "shape": list(a.shape),
                        "data_offsets": [offset, offset + len(b)]}
        blobs.append(b)
        offset += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def write_folder(root, x, y, ext, **save):
    for i, (img, c) in enumerate(zip(x, y)):
        d = os.path.join(root, str(int(c)))
        os.makedirs(d, exist_ok=True)
        Image.fromarray(img[0], mode="L").save(os.path.join(d, f"{i:04d}{ext}"), **save)


def read_folder(root):
    xs, ys = [], []
    for c in sorted(os.listdir(root)):
        for name in sorted(os.listdir(os.path.join(root, c))):
            xs.append(np.asarray(Image.open(os.path.join(root, c, name)).convert("L"))[None])
            ys.append(int(c))
    return np.stack(xs).astype(np.uint8), np.array(ys, dtype=np.int64)


def write_csv(path, x, y):
    with open(path, "w") as f:
        f.write(",".join([f"p{i}" for i in range(x.shape[1])] + ["target"]) + "\n")
        for row, t in zip(x, y):
            f.write(",".join(str(int(v)) for v in row) + f",{int(t)}\n")


def main():
    out = sys.argv[1]
    b = load_digits()
    u = np.round(b.images * 255.0 / 16.0).astype(np.uint8).reshape(-1, 1, 8, 8)
    y = b.target.astype(np.int64)
    parts = {}
    for part, sl in (("train", slice(0, N_TRAIN)), ("test", slice(N_TRAIN, N_TRAIN + N_TEST))):
        order = np.argsort(y[sl], kind="stable")  # image-folder order: by class, then index
        parts[part] = (u[sl][order], y[sl][order])
    os.makedirs(os.path.join(out, "idx"), exist_ok=True)
    os.makedirs(os.path.join(out, "bad"), exist_ok=True)
    for part, prefix in (("train", "train"), ("test", "t10k")):
        x, t = parts[part]
        write_idx(os.path.join(out, "idx", f"{prefix}-images-idx3-ubyte"), 0x08, x[:, 0])
        write_idx(os.path.join(out, "idx", f"{prefix}-labels-idx1-ubyte"), 0x08, t)
        write_folder(os.path.join(out, "png", part), x, t, ".png")
        write_folder(os.path.join(out, "jpeg", part), x, t, ".jpg", quality=90)
        tab = x.reshape(len(x), -1).astype(np.float32)
        write_csv(os.path.join(out, f"{part}.csv"), tab, t)
        np.save(os.path.join(out, f"x_{part}.npy"), tab)
        np.save(os.path.join(out, f"y_{part}.npy"), t)
    (xa, ya), (xb, yb) = parts["train"], parts["test"]
    u8 = {"x_train": xa, "y_train": ya, "x_test": xb, "y_test": yb}
    f32 = {"x_train": xa.reshape(len(xa), -1).astype(np.float32), "y_train": ya,
           "x_test": xb.reshape(len(xb), -1).astype(np.float32), "y_test": yb}
    np.savez(os.path.join(out, "u8.npz"), **u8)
    write_safetensors(os.path.join(out, "u8.safetensors"), u8)
    np.savez(os.path.join(out, "f32.npz"), **f32)
    write_safetensors(os.path.join(out, "f32.safetensors"), f32)
    ja, jya = read_folder(os.path.join(out, "jpeg", "train"))
    jb, jyb = read_folder(os.path.join(out, "jpeg", "test"))
    assert (jya == ya).all() and (jyb == yb).all()
    assert (ja != xa).any(), "JPEG came back lossless: the JPEG case would test nothing new"
    np.savez(os.path.join(out, "jpeg.npz"), x_train=ja, y_train=jya, x_test=jb, y_test=jyb)
    # error cases
    with open(os.path.join(out, "train.csv")) as f:
        lines = f.readlines()
    cells = lines[3].split(",")
    cells[5] = ""
    lines[3] = ",".join(cells)  # file line 4 (line 1 is the header)
    with open(os.path.join(out, "bad", "missing.csv"), "w") as f:
        f.writelines(lines)
    np.save(os.path.join(out, "bad", "fortran_x.npy"), np.asfortranarray(f32["x_train"]))
    with open(os.path.join(out, "bad", "data.parquet"), "wb") as f:
        f.write(b"PAR1" + bytes(64) + b"PAR1")


if __name__ == "__main__":
    main()
