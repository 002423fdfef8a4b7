#!/usr/bin/env python3
"""atheris target: the PyTorch checkpoint importer (aprfast.convert.pytorch).

    python tests/fuzz/fuzz_pytorch.py [libFuzzer flags] [CORPUS_DIR ...]
    python tests/fuzz/fuzz_pytorch.py --seeds OUT_DIR     # write the seed corpus

Inputs follow tests/fuzz/harness.py: a control byte, a param byte, then the body.
Control bit 0 clear: the body is ``data.pkl`` of a torch.save-shaped zip (one 64-byte
storage under keys "0" and "1", so the fuzzer works on the pickle interpreter, not on
zip framing); set: the body is the whole file.  Every tensor the source declares is
read and touched, then converted to .apr.  The oracle is harness.run_one's: an
AprError is a refusal, anything else (MemoryError, RecursionError included) a finding.
"""

from __future__ import annotations

import io
import os
import pickle
import struct
import sys
import tempfile
import zipfile

import numpy as np

WHOLE_FILE = 0x01
STORAGE = bytes(range(64))


def wrap(pickle_bytes: bytes) -> bytes:
    """A torch.save-shaped zip holding ``pickle_bytes`` as data.pkl."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", pickle_bytes)
        z.writestr("archive/byteorder", "little")
        z.writestr("archive/data/0", STORAGE)
        z.writestr("archive/data/1", STORAGE[:16])
        z.writestr("archive/version", "3\n")
    return out.getvalue()


def target_pytorch(data: bytes) -> None:
    import aprfast
    from aprfast.convert import open_source

    control, _param, body = (data[0], data[1], data[2:]) if len(data) >= 2 else (0, 0, b"")
    blob = body if control & WHOLE_FILE else wrap(body)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "m.pt")
        with open(path, "wb") as f:
            f.write(blob)
        src = open_source(path)
        try:
            for spec in src.specs:
                value = src.read(spec)
                # every byte touched: a view past the map would fault here
                np.asarray(value.data if isinstance(value, aprfast.RawTensor) else value).tobytes()
        finally:
            src.close()
        # validate="off": a fuzzed tensor with NaN would stop the conversion before the writer
        aprfast.convert(path, os.path.join(tmp, "m.apr"), validate="off")


def _seed_pickles() -> dict:
    """Valid pickles torch would write (protocols 2 and 4), built by hand."""
    def uni(text):
        raw = text.encode()
        return b"X" + struct.pack("<I", len(raw)) + raw

    def glob(module, name):
        return b"c" + module.encode() + b"\n" + name.encode() + b"\n"

    def tensor(key, numel, size, stride, offset=0, storage="FloatStorage"):
        ints = lambda values: b"(" + b"".join(b"K" + bytes([v]) for v in values) + b"t"  # noqa: E731
        pid = b"(" + uni("storage") + glob("torch", storage) + uni(key) + uni("cpu") + b"K" + bytes([numel]) + b"tQ"
        return (glob("torch._utils", "_rebuild_tensor_v2") + b"(" + pid + b"K" + bytes([offset]) + ints(size)
                + ints(stride) + b"\x89" + glob("collections", "OrderedDict") + b")R" + b"tR")

    flat = (b"\x80\x02}(" + uni("w") + tensor("0", 16, (4, 4), (4, 1)) + uni("t") + tensor("0", 16, (4, 4), (1, 4))
            + uni("h") + tensor("1", 8, (2, 2), (2, 1), storage="HalfStorage") + b"u.")
    checkpoint = (b"\x80\x02}(" + uni("state_dict") + b"}(" + uni("w") + tensor("0", 16, (16,), (1,)) + b"u"
                  + uni("epoch") + b"K\x03" + uni("name") + uni("x") + b"u.")
    # numpy scalars as protocol 2 pickles them (pickle.dumps only writes; nothing is loaded)
    numbers = pickle.dumps({"best": np.float64(0.5), "step": np.int64(3), "ok": np.bool_(True)}, protocol=2)
    with_numbers = checkpoint[:-2] + numbers[6:-2] + b"u."  # the checkpoint's items, then the scalars'
    return {"flat": flat, "checkpoint": checkpoint, "numbers": with_numbers}


def write_seeds(out_dir: str) -> int:
    os.makedirs(out_dir, exist_ok=True)
    count = 0
    for name, pkl in _seed_pickles().items():
        for control, body in ((0, pkl), (WHOLE_FILE, wrap(pkl))):
            with open(os.path.join(out_dir, f"{name}-{control}"), "wb") as f:
                f.write(bytes([control, 0]) + body)
            count += 1
    return count


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--seeds":
        print(write_seeds(sys.argv[2]), "seeds")
        sys.exit(0)
    import warnings

    import atheris

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # harness, beside this file

    with atheris.instrument_imports(include=["aprfast"]):
        import aprfast.convert  # noqa: F401
        import aprfast.convert._pickle_vm  # noqa: F401
        import aprfast.convert.pytorch  # noqa: F401
    import harness  # noqa: E402

    warnings.simplefilter("error")
    atheris.Setup(sys.argv, lambda data: harness.run_one(target_pytorch, data))
    atheris.Fuzz()
