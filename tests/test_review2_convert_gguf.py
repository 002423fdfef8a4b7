"""Review 2026-11 N5: GGUF metadata arrays were turned into Python objects without a
bound relative to the file (16 M u8 values in a 16 MB file: 1.3 GiB; 5 M empty nested
arrays: 643 MiB and 23 s).  What the metadata becomes is now estimated and bounded
before it is built: max(METADATA_MEMORY_FACTOR x the file, METADATA_MEMORY_FLOOR) bytes,
and at most MAX_METADATA_ARRAYS arrays inside arrays."""

import os
import struct
import time
import tracemalloc

import numpy as np
import pytest

import aprfast
from aprfast import limits
from aprfast.convert import gguf as cg
from aprfast.errors import LimitError

#: CPU-time bounds hold for the normal build; tests/sanitize.sh runs everything about ten times
#: slower (ASan, UBSan, -O1), so there they are scaled, not dropped
CPU = 10 if os.environ.get("APRFAST_SANITIZED") else 1

# GGUF value types
U8, F32, STRING, ARRAY = 0, 6, 8, 9


def s(text: bytes) -> bytes:
    return struct.pack("<Q", len(text)) + text


def one_key(path, body: bytes) -> int:
    """A GGUF v3 with no tensors and one metadata key "a" whose value is ``body`` (type
    id and value)."""
    data = b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + s(b"a") + body
    path.write_bytes(data)
    return len(data)


def numeric_array(etype: int, count: int, itemsize: int) -> bytes:
    return struct.pack("<IIQ", ARRAY, etype, count) + b"\0" * (count * itemsize)


@pytest.fixture
def small_floor(monkeypatch):
    """A 1 MiB floor, so a budget of 4x the file is reached by files of a few MB."""
    monkeypatch.setattr(limits, "METADATA_MEMORY_FLOOR", 1 << 20)


@pytest.mark.parametrize("etype, itemsize", [(U8, 1), (F32, 4)], ids=["u8", "f32"])
def test_a_big_numeric_array_is_refused_before_it_becomes_objects(tmp_path, small_floor, etype, itemsize):
    size = one_key(tmp_path / "a.gguf", numeric_array(etype, 2_000_000, itemsize))
    tracemalloc.start()
    try:
        with pytest.raises(LimitError, match="bytes of Python objects"):
            aprfast.convert(tmp_path / "a.gguf", tmp_path / "o.apr")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 * size, f"peak traced {peak / 2**20:.1f} MiB for a {size / 2**20:.1f} MiB file"


@pytest.mark.slow("long memory-bound measurement")
def test_nested_empty_arrays_are_bounded(tmp_path):
    n = cg.MAX_METADATA_ARRAYS + 1000
    one_key(tmp_path / "e.gguf", struct.pack("<IIQ", ARRAY, ARRAY, n) + struct.pack("<IQ", U8, 0) * n)
    t = time.process_time()
    tracemalloc.start()
    try:
        with pytest.raises(LimitError, match="arrays inside arrays"):
            cg.GGUFSource(tmp_path / "e.gguf")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 << 20
    assert time.process_time() - t < 20 * CPU  # a few seconds under tracemalloc; ~0.6 s without


@pytest.mark.peak_memory
def test_the_reviewers_file_is_refused_with_little_memory(tmp_path, run_child):
    """16 M u8 values (16 MB): 1.3-1.5 GiB RSS and 6-9 s CPU before the fix."""
    size = one_key(tmp_path / "a.gguf", numeric_array(U8, 16_000_000, 1))
    script = """
import resource, sys, time, aprfast
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t = time.process_time()
try:
    aprfast.convert(sys.argv[1], sys.argv[2])
    print("converted")
except aprfast.LimitError:
    print("LimitError")
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024, time.process_time() - t)
"""
    done = run_child(script, tmp_path / "a.gguf", tmp_path / "o.apr")
    assert done.returncode == 0, done.stderr
    outcome, numbers = done.stdout.split("\n", 1)
    grown, cpu = numbers.split()
    assert outcome == "LimitError"
    assert int(grown) << 20 < 4 * size, f"peak RSS grew {grown} MiB for a {size}-byte file"
    assert float(cpu) < 2


def test_a_budget_that_follows_the_file():
    assert cg.metadata_budget(0) == limits.METADATA_MEMORY_FLOOR
    assert cg.metadata_budget(100 << 20) == limits.METADATA_MEMORY_FACTOR * (100 << 20)
    assert cg.metadata_budget(1 << 40) == cg.MAX_METADATA_MEMORY


def test_a_vocabulary_only_file_still_converts(tmp_path):
    """A llama.cpp vocab-only GGUF (no tensors, a few MB): 150 K tokens, scores, types."""
    n = 150_000
    tokens = [f"tok{i}".encode() for i in range(n)]
    body = [s(b"tokenizer.ggml.tokens") + struct.pack("<IIQ", ARRAY, STRING, n) + b"".join(s(t) for t in tokens),
            s(b"tokenizer.ggml.scores") + struct.pack("<IIQ", ARRAY, F32, n) + np.arange(n, dtype="<f4").tobytes(),
            s(b"tokenizer.ggml.token_type") + struct.pack("<IIQ", ARRAY, 5, n) + np.ones(n, "<i4").tobytes()]
    data = b"GGUF" + struct.pack("<IQQ", 3, 0, len(body)) + b"".join(body)
    (tmp_path / "v.gguf").write_bytes(data)
    src = cg.GGUFSource(tmp_path / "v.gguf")
    try:
        assert src.metadata["tokenizer.vocab_size"] == n
        assert src.gguf_metadata["tokenizer.ggml.scores"][:3] == [0.0, 1.0, 2.0]
        assert src.gguf_metadata["tokenizer.ggml.tokens"][-1] == f"tok{n - 1}"
    finally:
        src.close()
