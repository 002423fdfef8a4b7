"""The converters' mapped I/O (convert._common.map_range): tensors of MAP_MIN bytes or
more are read as populated mappings of the source, and file-to-file copies write from
windows of one where copy_file_range is missing or refused.  Same bytes as the pread
paths, checked against gguf-py and safetensors; a source that shrank is still a typed
error, never a fault."""

from __future__ import annotations

import os

import numpy as np
import pytest

import aprfast
from aprfast.convert import _common, open_source
from aprfast.errors import CorruptError

gguf = pytest.importorskip("gguf")
sn = pytest.importorskip("safetensors.numpy")

MiB = 1 << 20


def make_gguf(path, rng):
    """Tensors above and below MAP_MIN, float32 and Q8_0, sizes not multiples of a page."""
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("mapped")
    big = rng.standard_normal((777, 1024), dtype=np.float32) * 0.02  # 3.0 MiB
    w.add_tensor("blk.0.ffn_up.weight", big)
    w.add_tensor("blk.0.ffn_down.weight", gguf.quants.quantize(big[:, :512].copy(), gguf.GGMLQuantizationType.Q8_0),
                 raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.add_tensor("blk.0.attn_norm.weight", np.ones(1024, np.float32))
    w.add_tensor("blk.1.ffn_up.weight", rng.standard_normal((300, 1000), dtype=np.float32) * 0.02)  # 1.1 MiB
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def tensors_of(path):
    return [(t.name, int(t.tensor_type), t.data.tobytes()) for t in gguf.GGUFReader(str(path)).tensors]


def no_copy_file_range(monkeypatch):
    """copy_range's fallback: write() from mapped windows."""
    uses = _common._platform.uses
    monkeypatch.setattr(_common._platform, "uses", lambda name: name != "copy_file_range" and uses(name))


@pytest.mark.parametrize("kernel_copy", [True, False])
@pytest.mark.parametrize("validate", ["off", "strict"])
def test_big_tensors_round_trip_gguf_byte_for_byte(tmp_path, rng, monkeypatch, validate, kernel_copy):
    monkeypatch.setattr(_common, "COPY_WINDOW", MiB + 4096 + 100)  # several windows, none page-sized
    if not kernel_copy:
        no_copy_file_range(monkeypatch)
    make_gguf(tmp_path / "m.gguf", rng)
    aprfast.convert(tmp_path / "m.gguf", tmp_path / "m.apr", validate=validate)
    aprfast.convert(tmp_path / "m.apr", tmp_path / "back.gguf", validate=validate)
    assert tensors_of(tmp_path / "back.gguf") == tensors_of(tmp_path / "m.gguf")
    # and the same bytes as the pread paths
    monkeypatch.setattr(_common, "MAP_MIN", 1 << 62)
    monkeypatch.setattr(_common, "_POPULATE", None)
    aprfast.convert(tmp_path / "m.gguf", tmp_path / "p.apr", validate=validate)
    aprfast.convert(tmp_path / "p.apr", tmp_path / "p.gguf", validate=validate)
    assert (tmp_path / "p.apr").read_bytes() == (tmp_path / "m.apr").read_bytes()
    assert (tmp_path / "p.gguf").read_bytes() == (tmp_path / "back.gguf").read_bytes()


@pytest.mark.parametrize("kernel_copy", [True, False])
def test_big_tensors_through_safetensors(tmp_path, rng, monkeypatch, kernel_copy):
    if not kernel_copy:
        no_copy_file_range(monkeypatch)
    tensors = {"a.weight": rng.standard_normal((513, 1027), dtype=np.float32),
               "b.weight": rng.standard_normal((3, 5), dtype=np.float32)}
    sn.save_file(tensors, str(tmp_path / "m.safetensors"))
    aprfast.convert(tmp_path / "m.safetensors", tmp_path / "m.apr", validate="off")
    aprfast.convert(tmp_path / "m.apr", tmp_path / "back.safetensors", validate="off")
    aprfast.convert(tmp_path / "back.safetensors", tmp_path / "again.safetensors", validate="off")
    for name in ("back.safetensors", "again.safetensors"):
        got = sn.load_file(str(tmp_path / name))
        assert {k: v.tobytes() for k, v in got.items()} == {k: v.tobytes() for k, v in tensors.items()}


@pytest.mark.parametrize("kernel_copy", [True, False])
def test_a_source_that_shrank_is_a_corrupt_error_not_a_fault(tmp_path, rng, monkeypatch, kernel_copy):
    if not kernel_copy:
        no_copy_file_range(monkeypatch)
    sn.save_file({"w": rng.standard_normal((1024, 1024), dtype=np.float32)}, str(tmp_path / "m.safetensors"))
    src = open_source(tmp_path / "m.safetensors")
    try:
        os.truncate(tmp_path / "m.safetensors", 2 * MiB)  # after the header was checked
        (spec,) = src.specs
        with pytest.raises(CorruptError, match="file ends inside tensor 'w'"):
            src.read(spec, _common.Scratch())
        fd, offset = src.raw_range(spec)
        out = os.open(tmp_path / "out.bin", os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            os.write(out, b"x" * 100)
            with pytest.raises(CorruptError, match="source ended inside"):
                _common.copy_range(fd, offset, spec.nbytes, out, "tensor 'w'")
        finally:
            os.close(out)
    finally:
        src.close()


def test_the_scratch_releases_each_mapped_tensor(tmp_path, rng):
    """A mapped tensor's pages leave the process at the scratch's next use, and the value
    handed out stays readable (the page cache maps them again)."""
    sn.save_file({"a": rng.standard_normal((512, 1024), dtype=np.float32),
                  "b": rng.standard_normal((512, 1024), dtype=np.float32)}, str(tmp_path / "m.safetensors"))
    expected = sn.load_file(str(tmp_path / "m.safetensors"))
    src = open_source(tmp_path / "m.safetensors")
    try:
        scratch = _common.Scratch()
        a = src.read(src.specs[0], scratch)
        assert not a.flags.writeable
        b = src.read(src.specs[1], scratch)  # releases a's mapping (a is still referenced)
        assert a.tobytes() == expected["a"].tobytes() and b.tobytes() == expected["b"].tobytes()
    finally:
        src.close()
