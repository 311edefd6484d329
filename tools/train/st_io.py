"""safetensors read/write by hand (the format is an 8-byte header length, a JSON header, then
raw little-endian data), so the training scripts need no `safetensors` package and write
exactly the names, dtypes and order they choose.  Also the byte splitting that gets files
over 16 MiB back from the GPU machine (parts joined again by `cat`).
"""

import json
import os
import struct

import torch

_DT = {torch.float32: ("F32", 4), torch.bfloat16: ("BF16", 2), torch.float16: ("F16", 2),
       torch.int32: ("I32", 4), torch.int64: ("I64", 8)}
_RDT = {v[0]: k for k, v in _DT.items()}
_INT_VIEW = {2: torch.int16, 4: torch.int32, 8: torch.int64}


def _raw(t):
    t = t.detach().to("cpu").contiguous()
    size = _DT[t.dtype][1]
    return t.view(_INT_VIEW[size]).numpy().tobytes() if t.numel() else b""


def save_file(tensors, path, metadata=None):
    """tensors: {name: tensor} written in the dict's order; atomic (tmp file + rename)."""
    header, off, blobs = {}, 0, []
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    for name, t in tensors.items():
        dt, _ = _DT[t.dtype]
        b = _raw(t)
        header[name] = {"dtype": dt, "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)


def load_file(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        dt = _RDT[e["dtype"]]
        a, b = e["data_offsets"]
        size = _DT[dt][1]
        raw = torch.frombuffer(bytearray(data[a:b]), dtype=_INT_VIEW[size]) if b > a else torch.empty(0, dtype=_INT_VIEW[size])
        out[name] = raw.view(dt).reshape(e["shape"])
    return out


def split_file(path, out_dir, part_bytes=15 * 1024 * 1024, prefix=None):
    """Cuts path into out_dir/PREFIX.partNN (part_bytes each, the last shorter); returns the names.
    Join with `cat PREFIX.part* > FILE` (names sort in order)."""
    prefix = prefix or os.path.basename(path)
    names = []
    with open(path, "rb") as f:
        i = 0
        while True:
            b = f.read(part_bytes)
            if not b:
                break
            name = "%s.part%02d" % (prefix, i)
            with open(os.path.join(out_dir, name), "wb") as g:
                g.write(b)
            names.append(name)
            i += 1
    return names
