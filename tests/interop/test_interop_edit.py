"""aprender (apr-format 0.72.3) reads aprender-layout files saved with room for edits
(``reserve=``) and edited in place or rewritten by :func:`aprfast.edit` (issue 29 item 5):
the metadata at another offset, the index before or after it, the commit slot and the
room in between are invisible to it, and the footer CRC it computes still matches."""

import hashlib

import numpy as np
import pytest

import aprfast


def _tensors():
    return {f"layers.{i}.w": np.arange(64, dtype=np.float32) * (i + 1) for i in range(6)}


def _check(harness, path, metadata, names):
    out = harness.read(path)
    assert out["ok"], out
    assert out["footer_crc_ok"] is True
    stored = {k: v for k, v in out["metadata"].items() if v is not None and v != "" and v != 0}
    assert stored == metadata
    t = _tensors()
    want = {new: hashlib.sha256(t[old].tobytes()).hexdigest() for new, old in names.items()}
    assert {e["name"]: e["sha256"] for e in out["tensors"]} == want
    return out


@pytest.mark.parametrize("reserve", [0, 8192], ids=["rewritten", "in-place"])
def test_aprender_reads_an_edited_file(harness, tmp_path, reserve):
    path = tmp_path / "m.apr"
    aprfast.save_file(_tensors(), path, {"name": "m"}, layout="aprender", reserve=reserve)
    names = {n: n for n in _tensors()}
    _check(harness, path, {"name": "m"}, names)
    first = aprfast.edit(path, metadata={"name": "edited", "author": "me"}, rename={"layers.1.w": "embed"},
                         drop=["layers.2.w"])
    assert first["in_place"] is bool(reserve)
    names = {("embed" if n == "layers.1.w" else n): n for n in _tensors() if n != "layers.2.w"}
    _check(harness, path, {"name": "edited", "author": "me"}, names)
    second = aprfast.edit(path, metadata={"author": None, "hidden_size": 64}, rename={"embed": "zz"})
    assert second["in_place"] is bool(reserve)
    names = {("zz" if n == "layers.1.w" else n): n for n in _tensors() if n != "layers.2.w"}
    out = _check(harness, path, {"name": "edited", "hidden_size": 64}, names)
    if reserve:
        assert out["header"]["metadata_offset"] != 64  # moved into the room, and aprender follows
