"""The GPU tests' reader of the .safetensors files `tandem train --save` writes (float32 tensors)."""
import json
import struct

import numpy as np


def load(path):
    """{tensor name: flat float32 array}, names sorted."""
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    header = json.loads(b[8:8 + n])
    body = b[8 + n:]
    return {k: np.frombuffer(body[v["data_offsets"][0]:v["data_offsets"][1]], np.float32)
            for k, v in sorted(header.items()) if k != "__metadata__"}


def flat(weights):
    """All tensors of load()'s result in one array, in name order."""
    return np.concatenate([weights[k] for k in sorted(weights)])
