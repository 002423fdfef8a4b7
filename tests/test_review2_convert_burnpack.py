"""Review 2026-11 N6: a Burnpack whose CBOR metadata is millions of empty maps (one byte
each, 64+ bytes each as dicts) passed check_cbor and was decoded by cbor2 before it was
refused: the walk now estimates what cbor2 would build and refuses it first."""

import struct

import numpy as np
import pytest

import aprfast
from aprfast.convert import burnpack as bp
from aprfast.errors import LimitError

cbor2 = pytest.importorskip("cbor2")


def bomb(path, items: int, chunk: int = 0, item: bytes = b"\xa0") -> int:
    """A Burnpack whose metadata is an array of ``items`` copies of ``item`` (one array,
    or arrays of ``chunk`` each): a valid header, nothing else."""
    if chunk:
        body = (b"\x9a" + struct.pack(">I", chunk) + item * chunk) * (items // chunk)
        meta = b"\x9a" + struct.pack(">I", items // chunk) + body
    else:
        meta = b"\x9a" + struct.pack(">I", items) + item * items
    path.write_bytes(bp.MAGIC + struct.pack("<HI", bp.VERSION, len(meta)) + meta)
    return len(meta)


@pytest.mark.parametrize("item", [b"\xa0", b"\x80", b"\x19\x10\x00"], ids=["empty maps", "empty arrays", "ints"])
@pytest.mark.parametrize("chunk", [0, 1000], ids=["one array", "arrays of 1000"])
def test_cheap_items_that_build_much_are_refused_before_cbor2_runs(tmp_path, monkeypatch, item, chunk):
    bomb(tmp_path / "b.bpk", 2_000_000, chunk, item)
    decoded = []
    real = cbor2.loads
    monkeypatch.setattr(cbor2, "loads", lambda *a, **k: decoded.append(1) or real(*a, **k))
    with pytest.raises(LimitError, match="would build about"):
        aprfast.convert(tmp_path / "b.bpk", tmp_path / "o.apr")
    assert not decoded, "cbor2 decoded the metadata before it was refused"


@pytest.mark.peak_memory
def test_the_reviewers_file_costs_little_memory(tmp_path, run_child):
    """15 M empty maps (15 MB) took ~1 GiB and 7 s before the fix; 3 M here (~200 MiB then)."""
    size = bomb(tmp_path / "b.bpk", 3_000_000)
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
    done = run_child(script, tmp_path / "b.bpk", tmp_path / "o.apr")
    assert done.returncode == 0, done.stderr
    outcome, numbers = done.stdout.split("\n", 1)
    grown, cpu = numbers.split()
    assert outcome == "LimitError"
    assert int(grown) * (1 << 20) < 4 * size + (8 << 20), f"peak RSS grew {grown} MiB for a {size}-byte metadata"
    assert float(cpu) < 2


def test_the_budget_follows_the_file_and_has_a_cap():
    from aprfast import limits
    assert bp.cbor_budget(0) == limits.METADATA_MEMORY_FLOOR
    assert bp.cbor_budget(100 << 20) == limits.METADATA_MEMORY_FACTOR * (100 << 20)
    assert bp.cbor_budget(1 << 40) == bp.MAX_CBOR_MEMORY
    with pytest.raises(LimitError):
        bp.check_cbor(cbor2.dumps([{} for _ in range(100)]), max_memory=1000)
    bp.check_cbor(cbor2.dumps([{} for _ in range(100)]), max_memory=100_000)


def test_honest_metadata_still_reads(tmp_path):
    tensors = {f"layer{i}.weight": np.full((2, 3), i, np.float32) for i in range(500)}
    aprfast.save_file(tensors, tmp_path / "s.apr")
    aprfast.convert(tmp_path / "s.apr", tmp_path / "s.bpk")
    aprfast.convert(tmp_path / "s.bpk", tmp_path / "back.apr")
    got = aprfast.load_file(tmp_path / "back.apr")
    assert all(np.array_equal(got[k], v) for k, v in tensors.items())
