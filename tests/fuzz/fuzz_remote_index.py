#!/usr/bin/env python3
"""atheris target: the parsers a fetched index goes through before any shard is
requested: ``aprfast.convert.safetensors.parse_index`` (a checkpoint index's
``weight_map``), ``aprfast.files.shards.parse_manifest`` (an ``.apr`` shard manifest)
and ``aprfast.convert._remote._companions`` (which of them a URL's name picks, then the
shard names checked for URL syntax), all on the same fuzzed bytes.

    python tests/fuzz/fuzz_remote_index.py --seeds OUT_DIR  # write the seed corpus
    python tests/fuzz/fuzz_remote_index.py [libFuzzer flags] [CORPUS_DIR ...]

Inputs follow tests/fuzz/harness.py: a control byte, a param byte, then the JSON bytes.
Every parser runs on every input, each refusal (AprError) caught on its own so the next
still runs; anything else escapes (a finding).  Control bit 0x01: the limits are
tightened (``param`` tensors at most) for parse_manifest.  Where two parsers accept the
bytes they must agree: _companions gives the sorted shard names parse_index or
parse_manifest gave.  Oracle: harness.run_one.
"""

from __future__ import annotations

import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

TIGHT = 0x01
URL = "https://models.invalid/org/repo/"


def target_remote_index(data: bytes) -> None:
    import harness

    from aprfast.convert import _remote
    from aprfast.convert.safetensors import parse_index
    from aprfast.errors import AprError
    from aprfast.files.shards import parse_manifest
    from aprfast.limits import Limits

    control, param, body = harness.split(data)
    limits = Limits(max_tensor_count=param) if control & TIGHT else Limits()
    weight_map = manifest = None
    try:
        weight_map = parse_index(body, URL + "model.safetensors.index.json")
        if not all(isinstance(k, str) for k in weight_map):
            raise AssertionError("parse_index gave a non-string tensor name")
    except AprError:
        pass
    try:
        manifest = parse_manifest(body, limits, URL + "model.apr.index.json")
        repr(manifest)
    except AprError:
        pass
    path = os.path.join(harness.write_scratch({"index.json": body}), "index.json")
    for name, accepted in (("model.safetensors.index.json", weight_map),
                           ("pytorch_model.bin.index.json", weight_map),
                           ("model.apr.index.json", manifest if not control & TIGHT else None)):
        try:
            names = _remote._companions(path, URL + name)
        except AprError:
            continue
        if accepted is not None:
            want = (sorted(set(accepted.values())) if name.endswith(("safetensors.index.json", "bin.index.json"))
                    else [s["file"] for s in accepted["shards"]])
            if names != want:
                raise AssertionError(f"_companions({name}) gives {names!r:.200}, the parser {want!r:.200}")


def seeds() -> dict:
    index = {"metadata": {"total_size": 96}, "weight_map": {"a.weight": "model-00001-of-00002.safetensors",
                                                           "b.weight": "model-00002-of-00002.safetensors",
                                                           "c": "model-00001-of-00002.safetensors"}}
    manifest = {"apr_version": "2.0.0", "sharded": True, "shard_count": 2,
                "shards": [{"file": "model-00001-of-00002.apr", "size": 1234, "crc32": "89abcdef"},
                           {"file": "model-00002-of-00002.apr", "size": 99, "crc32": "00000001"}],
                "tensor_shard_map": {"a": 0, "b": 1, "c\u00e9": 1}, "metadata": {"name": "x", "n": [1, 2.5]}}
    return {
        "weight-map": (0, json.dumps(index).encode()),
        "weight-map-pretty": (0, json.dumps(index, indent=2, ensure_ascii=False).encode()),
        "manifest": (0, json.dumps(manifest).encode()),
        "manifest-tight": (TIGHT, json.dumps(manifest).encode()),
        "empty-map": (0, b'{"weight_map": {}}'),
    }


def write_seeds(out_dir: str) -> int:
    import harness

    os.makedirs(out_dir, exist_ok=True)
    written = seeds()
    for name, (control, blob) in written.items():
        harness.run_one(target_remote_index, bytes([control, 3]) + blob)
        with open(os.path.join(out_dir, f"{name}-{control:02x}"), "wb") as f:
            f.write(bytes([control, 3]) + blob)
    return len(written)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--seeds":
        print(write_seeds(sys.argv[2]), "seeds")
        sys.exit(0)
    import fuzz

    fuzz.main("remote_index", sys.argv)
