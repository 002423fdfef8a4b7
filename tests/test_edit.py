"""aprfast.edit / apr edit: metadata, renames and drops, in place in a file saved with
room (``reserve=``) or by an atomic rewrite otherwise (issue 29 item 5).

What is checked: each kind of change in both layouts, in place and rewritten; the
tensor bytes never move in place, the footer is never written and the CRC32 still
matches (``open(..., verify=True)``); a rewrite gives ``save_file``'s bytes where it can;
signed files (re-signed, or refused without a key), digest manifests, encrypted and
v1 files (refused); files not aligned to 64; a crash at every step of an in-place edit
and at random moments leaves the old or the new file (kill -9 of a child); concurrent
editors are serialised; the CLI.
"""

import hashlib
import json
import os
import random
import signal
import struct
import subprocess
import sys
import tempfile
import time

import numpy as np
import pytest

import aprfast
from aprfast import v1
from aprfast.cli import main as apr_main
from aprfast.io import atomic as atomic_files
from aprfast.layouts import apr2, aprender
from aprfast.tools.edit import forge_crc32

LAYOUTS = ["aprender", "apr2"]
SLOT = {"aprender": aprender.SLOT_END, "apr2": apr2.SLOT_END}


def tensors(n=12, size=1000):
    return {f"layers.{i}.weight": (np.arange(size, dtype=np.float32) * (i + 1)) for i in range(n)}


def contents(path, **keys):
    """(stored metadata, {name: sha256 of the tensor's bytes}) of a file, CRC checked."""
    with aprfast.open(path, verify=True, **keys) as f:
        return f.metadata, {name: hashlib.sha256(np.ascontiguousarray(f.get_tensor(name)).tobytes()).hexdigest()
                            for name in f.keys()}


def streamed_names(path):
    with open(path, "rb") as fh, aprfast.stream(fh) as s:
        return sorted(name for name, _ in s)


def data_section(path):
    info = aprfast.inspect(path)["header"]
    raw = path.read_bytes()
    footer = aprender.FOOTER_SIZE if raw[:4] == aprender.MAGIC else apr2.FOOTER_SIZE
    return raw[info["data_offset"]:len(raw) - footer], raw[len(raw) - footer:]


def expected_after(t, metadata, rename=(), drop=()):
    rename = dict(rename)
    names = {rename.get(k, k): v for k, v in t.items() if k not in drop}
    return metadata, {k: hashlib.sha256(v.tobytes()).hexdigest() for k, v in names.items()}


# --- reserve= ------------------------------------------------------------------------------
@pytest.mark.parametrize("layout", LAYOUTS)
def test_reserve_zero_writes_the_same_bytes_and_room_reads_the_same(tmp_path, layout):
    t = tensors()
    plain = aprfast.save(t, {"name": "m"}, layout=layout)
    assert aprfast.save(t, {"name": "m"}, layout=layout, reserve=0) == plain
    roomy = aprfast.save(t, {"name": "m"}, layout=layout, reserve=10000)
    assert len(roomy) >= len(plain) + 10000
    assert roomy[SLOT[layout] - 32:SLOT[layout]] == bytes(32)  # the commit slot is zeros
    (tmp_path / "r.apr").write_bytes(roomy)
    assert contents(tmp_path / "r.apr") == contents_of_bytes(tmp_path, plain)
    assert streamed_names(tmp_path / "r.apr") == sorted(t)
    assert aprfast.inspect(tmp_path / "r.apr")["header"]["metadata_offset"] == SLOT[layout]


def contents_of_bytes(tmp_path, blob):
    path = tmp_path / "plain.apr"
    path.write_bytes(blob)
    return contents(path)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_writer_with_reserve_matches_save_file(tmp_path, layout):
    t = tensors(4)
    aprfast.save_file(t, tmp_path / "s.apr", {"a": 1}, layout=layout, reserve=5000)
    with aprfast.Writer(tmp_path / "w.apr", {"a": 1}, layout=layout, reserve=5000) as w:
        for name in reversed(list(t)):
            w.add(name, t[name])
    with aprfast.Writer(tmp_path / "p.apr", {"a": 1}, layout=layout, reserve=5000,
                        plan=[(n, "F32", t[n].shape) for n in sorted(t)]) as w:
        for name in sorted(t):
            w.add(name, t[name])
    want = (tmp_path / "s.apr").read_bytes()
    assert (tmp_path / "w.apr").read_bytes() == want
    assert (tmp_path / "p.apr").read_bytes() == want


def test_reserve_is_checked():
    with pytest.raises(aprfast.LayoutError, match="reserve"):
        aprfast.save({"a": np.zeros(1, np.float32)}, reserve=-1)
    with pytest.raises(aprfast.LayoutError, match="reserve"):
        aprfast.save({"a": np.zeros(1, np.float32)}, reserve=1 << 40)
    with pytest.raises(aprfast.LayoutError, match="reserve"):
        aprfast.save({"a": np.zeros(1, np.float32)}, reserve=1.5)


# --- every kind of change, both layouts, in place and rewritten --------------------------------
CHANGES = [
    dict(metadata={"name": "edited", "description": "ten more keys", **{f"k{i}": i for i in range(10)}}),
    dict(metadata={"name": None}),
    dict(rename={"layers.3.weight": "zz.last", "layers.4.weight": "aa.first"}),
    dict(rename={"layers.1.weight": "layers.2.weight", "layers.2.weight": "layers.1.weight"}),  # a swap
    dict(drop=["layers.5.weight", "layers.0.weight"]),
    dict(metadata={"license": "MIT"}, rename={"layers.7.weight": "renamed"}, drop=["layers.8.weight"]),
]


@pytest.mark.parametrize("reserve", [0, 65536], ids=["rewrite", "in-place"])
@pytest.mark.parametrize("change", range(len(CHANGES)))
@pytest.mark.parametrize("layout", LAYOUTS)
def test_each_change_in_each_layout(tmp_path, layout, change, reserve):
    t, path = tensors(), tmp_path / "m.apr"
    aprfast.save_file(t, path, {"name": "m", "author": "a"}, layout=layout, reserve=reserve)
    before_data, before_footer = data_section(path)
    size = os.path.getsize(path)
    spec = CHANGES[change]
    result = aprfast.edit(path, **spec)
    assert result["in_place"] is bool(reserve)
    meta = {"name": "m", "author": "a"}
    for key, value in spec.get("metadata", {}).items():
        meta.pop(key, None) if value is None else meta.__setitem__(key, value)
    assert contents(path) == expected_after(t, meta, spec.get("rename", {}), spec.get("drop", ()))
    if reserve:  # nothing after the room moved: the data and the footer are the same bytes
        assert os.path.getsize(path) == size
        assert data_section(path) == (before_data, before_footer)
        assert result["bytes_written"] < 4096
    with aprfast.open(path) as f:
        assert f.layout == layout
    assert streamed_names(path) == sorted(contents(path)[1])


@pytest.mark.parametrize("layout", LAYOUTS)
def test_many_edits_in_place_alternate_through_the_room(tmp_path, layout):
    t, path = tensors(), tmp_path / "m.apr"
    aprfast.save_file(t, path, {"step": 0}, layout=layout, reserve=8192)
    data = data_section(path)
    names = dict.fromkeys(t)
    for step in range(1, 30):
        old = random.Random(step).choice(sorted(names))
        new = f"renamed.{step}"
        result = aprfast.edit(path, metadata={"step": step}, rename={old: new})
        assert result["in_place"], (step, result)
        names.pop(old)
        names[new] = None
        meta, found = contents(path)
        assert meta == {"step": step} and sorted(found) == sorted(names)
    assert data_section(path) == data


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_file_saved_with_reserve_keeps_its_tensor_bytes_and_verifies(tmp_path, layout):
    t, path = tensors(40, 3000), tmp_path / "m.apr"
    aprfast.save_file(t, path, {"name": "m"}, layout=layout, reserve=1 << 16)
    before = path.read_bytes()
    info = aprfast.inspect(path)["header"]
    aprfast.edit(path, metadata={f"key{i}": "v" * i for i in range(10)},
                 rename={f"layers.{i}.weight": f"model.layers.{i}.w" for i in range(0, 40, 2)})
    after = path.read_bytes()
    # only the header, its slot and bytes in the room changed
    changed = [i for i in range(0, len(before), 64) if before[i:i + 64] != after[i:i + 64]]
    assert changed[0] == 0 and all(i < info["data_offset"] for i in changed)
    assert before[info["data_offset"]:] == after[info["data_offset"]:]
    aprfast.open(path, verify=True).close()
    loaded = aprfast.load_file(path)
    for i in range(40):
        name = f"model.layers.{i}.w" if i % 2 == 0 else f"layers.{i}.weight"
        assert loaded[name].tobytes() == t[f"layers.{i}.weight"].tobytes()


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_metadata_rewrite_of_a_file_without_room_is_save_files_bytes(tmp_path, layout):
    t, path = tensors(), tmp_path / "m.apr"
    aprfast.save_file(t, path, {"name": "m"}, layout=layout)
    result = aprfast.edit(path, metadata={"name": "new", "extra": [1, 2]})
    assert not result["in_place"] and result["room"] == 0
    assert path.read_bytes() == aprfast.save(t, {"name": "new", "extra": [1, 2]}, layout=layout)


def test_a_rewrite_keeps_room_for_the_next_edit(tmp_path):
    t, path = tensors(), tmp_path / "m.apr"
    aprfast.save_file(t, path, {"name": "m"}, reserve=256)
    result = aprfast.edit(path, metadata={"description": "x" * 2000})  # does not fit: rewritten
    assert not result["in_place"] and result["room"] > 2000
    assert aprfast.edit(path, metadata={"description": "y" * 2000})["in_place"]
    assert contents(path)[0] == {"name": "m", "description": "y" * 2000}


def test_dropping_the_tensor_that_ends_an_aprender_file_rewrites_it_shorter(tmp_path):
    t, path = tensors(), tmp_path / "m.apr"
    aprfast.save_file(t, path, layout="aprender", reserve=4096)
    last = sorted(t)[-1]
    data, _ = data_section(path)
    result = aprfast.edit(path, drop=[last])
    assert not result["in_place"]  # aprender's footer sits where the index says the data ends
    shorter, _ = data_section(path)
    assert shorter == data[:len(data) - 4032]  # the dropped tensor's 4000 bytes and padding are gone
    assert contents(path) == expected_after(t, {}, drop=[last])


def test_an_apr2_drop_of_the_last_tensor_stays_in_place(tmp_path):
    t, path = tensors(), tmp_path / "m.apr"
    aprfast.save_file(t, path, layout="apr2", reserve=4096)
    assert aprfast.edit(path, drop=[sorted(t)[-1]])["in_place"]
    assert contents(path) == expected_after(t, {}, drop=[sorted(t)[-1]])


def test_nothing_to_change_writes_nothing(tmp_path):
    path = tmp_path / "m.apr"
    aprfast.save_file(tensors(), path, {"name": "m"}, reserve=4096)
    before = path.read_bytes()
    result = aprfast.edit(path, metadata={"name": "m"})
    assert result["bytes_written"] == 0 and path.read_bytes() == before


# --- unaligned, compressed, odd shapes -------------------------------------------------------
def test_unaligned_files_and_spans_across_pages(tmp_path):
    """32-byte alignment, odd-sized tensors and metadata, 0-d and empty tensors, and an
    index big enough that the in-place span crosses page boundaries."""
    t = {f"t{i:04d}": np.arange(i % 7 + 1, dtype=np.uint8) for i in range(300)}
    t["scalar"] = np.float32(3.5)
    t["empty"] = np.zeros((0, 3), np.float16)
    path = tmp_path / "u.apr"
    aprfast.save_file(t, path, {"odd": "x" * 13}, layout="apr2", alignment=32, reserve=100_001)
    result = aprfast.edit(path, metadata={"odd": "y" * 17}, rename={f"t{i:04d}": f"u{i:05d}" for i in range(0, 300, 3)})
    assert result["in_place"] and result["bytes_written"] > 4096
    meta, found = contents(path)
    assert meta == {"odd": "y" * 17} and len(found) == 302
    loaded = aprfast.load_file(path)
    assert loaded["u00003"].tolist() == list(range(4)) and loaded["scalar"] == 3.5 and loaded["empty"].shape == (0, 3)


def test_an_alignment_32_file_rewritten_keeps_its_tensors_aligned(tmp_path):
    t = {f"t{i}": np.arange(i + 5, dtype=np.uint8) for i in range(9)}
    path = tmp_path / "u.apr"
    aprfast.save_file(t, path, {"m": 1}, layout="apr2", alignment=32)
    aprfast.edit(path, metadata={"m": "x" * 101}, rename={"t1": "renamed"})
    header = aprfast.inspect(path)["header"]
    assert header["data_offset"] % 32 == 0
    assert contents(path) == expected_after(t, {"m": "x" * 101}, {"t1": "renamed"})


def test_compressed_and_quantized_tensors(tmp_path):
    rng = np.random.default_rng(1)
    t = {"z": np.zeros(100_000, np.float32), "r": rng.standard_normal(5000).astype(np.float32)}
    path = tmp_path / "c.apr"
    aprfast.save_file(t, path, compression="zstd", reserve=4096)
    assert aprfast.edit(path, rename={"z": "zeros"})["in_place"]
    assert contents(path) == expected_after(t, {}, {"z": "zeros"})
    q = aprfast.quantize_tensors({"w": rng.standard_normal((4, 256)).astype(np.float32)}, "q8_0")[0]
    aprfast.save_file({**q, "b": np.ones(3, np.float32)}, tmp_path / "q.apr", layout="apr2", reserve=4096)
    assert aprfast.edit(tmp_path / "q.apr", drop=["w"])["in_place"]
    flags = aprfast.inspect(tmp_path / "q.apr")["header"]["flag_names"]
    assert "QUANTIZED" not in flags  # as the writer would set it for what is left
    aprfast.open(tmp_path / "q.apr", verify=True).close()


# --- refusals ------------------------------------------------------------------------------------
@pytest.mark.parametrize("reserve", [0, 4096])
def test_refusals_leave_the_file_as_it_was(tmp_path, reserve):
    path = tmp_path / "m.apr"
    aprfast.save_file(tensors(), path, {"name": "m"}, layout="aprender", reserve=reserve)
    before = path.read_bytes()
    with pytest.raises(aprfast.TensorNotFoundError, match="nope"):
        aprfast.edit(path, rename={"nope": "x"})
    with pytest.raises(aprfast.TensorNotFoundError):
        aprfast.edit(path, drop=["nope"])
    with pytest.raises(aprfast.LayoutError, match="two tensors"):
        aprfast.edit(path, rename={"layers.1.weight": "layers.2.weight"})
    with pytest.raises(aprfast.LayoutError, match="both renamed and dropped"):
        aprfast.edit(path, rename={"layers.1.weight": "x"}, drop=["layers.1.weight"])
    with pytest.raises(aprfast.LayoutError, match="256"):
        aprfast.edit(path, rename={"layers.1.weight": "n" * 300})
    with pytest.raises(aprfast.LayoutError, match="cannot hold"):
        aprfast.edit(path, metadata={"hidden_size": "big"})  # aprender's typed field
    with pytest.raises(aprfast.LayoutError, match="signing_key"):
        aprfast.edit(path, metadata={"a": 1}, signing_key=bytes(32))
    assert path.read_bytes() == before


def test_v1_encrypted_and_missing_files_are_refused(tmp_path):
    v1.save_model({"w": np.zeros(2, np.float32)}, tmp_path / "v1.apr", model_type=1)
    with pytest.raises(aprfast.FormatError, match="v1"):
        aprfast.edit(tmp_path / "v1.apr", metadata={"a": 1})
    aprfast.save_file(tensors(2), tmp_path / "e.apr", password="pw", reserve=4096)
    before = (tmp_path / "e.apr").read_bytes()
    with pytest.raises(aprfast.DecryptError, match="encrypted"):
        aprfast.edit(tmp_path / "e.apr", metadata={"a": 1})
    assert (tmp_path / "e.apr").read_bytes() == before
    with pytest.raises(aprfast.AprFileNotFoundError):
        aprfast.edit(tmp_path / "missing.apr", metadata={"a": 1})


def test_a_shard_takes_in_place_metadata_edits_only(tmp_path):
    t = {f"w{i}": np.full(1000, i, np.float32) for i in range(4)}
    aprfast.save_file(t, tmp_path / "m.apr", {"name": "m"}, max_shard_size=8000, reserve=4096)
    shard = sorted(p for p in tmp_path.iterdir() if p.name.startswith("m-0"))[0]
    assert aprfast.edit(shard, metadata={"note": "edited"})["in_place"]
    with aprfast.open(tmp_path / "m.apr") as f:  # the manifest's CRC32 of the shard still holds
        f.verify()
        assert sorted(f.keys()) == sorted(t)
    for change in (dict(rename={"w0": "x"}), dict(metadata={"note": "y" * 10000})):
        with pytest.raises(aprfast.LayoutError, match="shard"):
            aprfast.edit(shard, **change)


# --- signed files ----------------------------------------------------------------------------------
@pytest.mark.parametrize("reserve", [0, 16384], ids=["rewrite", "in-place"])
def test_signed_files_are_signed_again_or_refused(tmp_path, reserve):
    seed, public = v1.generate_signing_key()
    seed2, public2 = v1.generate_signing_key()
    t, path = tensors(6, 300_000), tmp_path / "s.apr"  # several 1 MiB chunks per tensor
    aprfast.save_file(t, path, {"name": "m"}, signing_key=seed, reserve=reserve)
    before = path.read_bytes()
    with pytest.raises(aprfast.SignatureError, match="signing_key"):
        aprfast.edit(path, metadata={"name": "x"})
    assert path.read_bytes() == before
    spec = dict(metadata={"name": "x"}, rename={"layers.1.weight": "z", "layers.2.weight": "a"},
                drop=["layers.4.weight"])
    result = aprfast.edit(path, **spec, signing_key=seed2)
    assert result["in_place"] is bool(reserve)
    assert contents(path, trusted_keys=[public2]) == expected_after(t, {"name": "x"}, spec["rename"], spec["drop"])
    with pytest.raises(aprfast.SignatureError):
        aprfast.open(path, trusted_keys=[public])
    assert sorted(aprfast.load_file(path)) == sorted(expected_after(t, {}, spec["rename"], spec["drop"])[1])


def test_a_tampered_signed_file_is_not_signed_again(tmp_path):
    seed, _ = v1.generate_signing_key()
    path = tmp_path / "s.apr"
    aprfast.save_file(tensors(2), path, {"name": "m"}, signing_key=seed, reserve=4096)
    raw = bytearray(path.read_bytes())
    at = raw.index(b'"m"')
    raw[at + 1:at + 2] = b"n"
    path.write_bytes(bytes(raw))
    with pytest.raises((aprfast.SignatureError, aprfast.ChecksumError)):
        aprfast.edit(path, metadata={"name": "x"}, signing_key=seed)


def test_a_digest_manifest_is_kept_and_can_be_signed_in_place(tmp_path):
    seed, public = v1.generate_signing_key()
    t, path = tensors(4, 300_000), tmp_path / "d.apr"
    aprfast.save_file(t, path, digest="sha256", reserve=8192)
    assert aprfast.edit(path, rename={"layers.0.weight": "first"})["in_place"]
    with aprfast.open(path, verify=True) as f:
        assert f.header["security"]["digest"] == "sha256" and not f.header["security"]["signed"]
    assert aprfast.edit(path, metadata={"signed": True}, signing_key=seed)["in_place"]
    with aprfast.open(path, verify=True, trusted_keys=[public]) as f:
        assert f.header["security"]["signed"] and "first" in f.keys()


# --- the CRC arithmetic ------------------------------------------------------------------------------
def test_forge_crc32_reaches_any_target():
    rng = random.Random(7)
    for n in (4, 5, 64, 1000):
        for _ in range(20):
            region = bytes(rng.randrange(256) for _ in range(n))
            target = rng.randrange(1 << 32)
            out = forge_crc32(region, target)
            assert aprfast.crc32(out) == target and out[:-4] == region[:-4]
    with pytest.raises(ValueError):
        forge_crc32(b"abc", 0)


# --- crashes ------------------------------------------------------------------------------------------
CRASH_CHILD = r"""
import os, signal, sys
import aprfast
from aprfast.tools import edit as edit_module

path, kill_at, durable = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
calls = [0]

def killing(fn):
    def wrapped(*args):
        calls[0] += 1
        if calls[0] == kill_at:          # before this write or sync
            os.kill(os.getpid(), signal.SIGKILL)
        out = fn(*args)
        calls[0] += 1
        if calls[0] == kill_at:          # right after it
            os.kill(os.getpid(), signal.SIGKILL)
        return out
    return wrapped

edit_module._pwrite = killing(edit_module._pwrite)
edit_module._sync = killing(edit_module._sync)
aprfast.edit(path, metadata={"generation": "new", "pad": "x" * 300}, rename={"layers.3.weight": "renamed"},
             drop=["layers.6.weight"], durable=durable)
print("done", flush=True)
"""


def child_env():
    parent = os.path.dirname(os.path.dirname(os.path.abspath(aprfast.__file__)))
    return dict(os.environ, PYTHONPATH=parent)


def old_or_new(path, old, new):
    found = contents(path)  # verify=True: the CRC32 matches whichever it is
    assert found in (old, new), "torn: neither the old nor the new file"
    return found == new


@pytest.mark.slow("kill -9 harness")
@pytest.mark.skipif(os.name != "posix", reason="kill -9")
@pytest.mark.parametrize("durable", [True, False])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_kill_9_at_every_step_of_an_in_place_edit(tmp_path, layout, durable):
    t = tensors()
    reference = tmp_path / "ref.apr"
    aprfast.save_file(t, reference, {"generation": "old"}, layout=layout, reserve=8192)
    old = contents(reference)
    new = expected_after(t, {"generation": "new", "pad": "x" * 300}, {"layers.3.weight": "renamed"},
                         ["layers.6.weight"])
    steps = 8 if durable else 4  # two writes (and two syncs), a kill before and after each
    seen = []
    for kill_at in range(1, steps + 2):
        path = tmp_path / f"k{kill_at}.apr"
        path.write_bytes(reference.read_bytes())
        child = subprocess.run([sys.executable, "-c", CRASH_CHILD, str(path), str(kill_at), str(int(durable))],
                               env=child_env(), cwd=tempfile.gettempdir(), capture_output=True, text=True,
                               timeout=120)
        finished = child.returncode == 0
        assert finished or child.returncode == -signal.SIGKILL, child.stderr
        seen.append(old_or_new(path, old, new))
        if finished:
            assert seen[-1]
    # killed before the header write: old; from the header write on: new
    assert seen == sorted(seen) and seen[0] is False and seen[-1] is True


LOOP_CHILD = r"""
import sys
import aprfast
path = sys.argv[1]
print("ready", flush=True)
i = 0
while True:
    i += 1
    a, b = ("layers.1.weight", "swapped") if i % 2 else ("swapped", "layers.1.weight")
    aprfast.edit(path, metadata={"generation": i % 2}, rename={a: b}, durable=False)
"""


@pytest.mark.slow("kill -9 harness")
@pytest.mark.skipif(os.name != "posix", reason="kill -9")
@pytest.mark.parametrize("layout", LAYOUTS)
def test_kill_9_at_random_moments_of_repeated_edits(tmp_path, layout):
    """A child edits in a loop (in place, spans within one page); killed at random times,
    the file is always one of the two states, CRC included."""
    t = tensors()
    path = tmp_path / "m.apr"
    aprfast.save_file(t, path, {"generation": 0}, layout=layout, reserve=8192)
    states = [contents(path), expected_after(t, {"generation": 1}, {"layers.1.weight": "swapped"})]
    rng = random.Random(layout)
    for _ in range(8):
        child = subprocess.Popen([sys.executable, "-c", LOOP_CHILD, str(path)], env=child_env(),
                                 cwd=tempfile.gettempdir(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert child.stdout.readline() == "ready\n", child.stderr.read()
        time.sleep(rng.uniform(0.0, 0.3))
        child.send_signal(signal.SIGKILL)
        child.communicate(timeout=60)
        assert contents(path) in states


def test_a_torn_span_write_is_the_documented_window(tmp_path):
    """Inside the span write itself (only a span larger than a page can be split by a
    kill), the file reads as the old one but its footer CRC does not match: the one
    window docs/FORMAT.md §5.2 names.  Simulated by writing half the span."""
    from aprfast.tools import edit as edit_module

    t, path = tensors(), tmp_path / "m.apr"
    aprfast.save_file(t, path, {"generation": "old"}, reserve=8192)
    old_meta, old_names = contents(path)
    real = edit_module._pwrite
    calls = []

    def half_then_crash(fd, data, offset):
        calls.append(offset)
        real(fd, data[:len(data) // 2], offset)
        raise KeyboardInterrupt  # stands for the process dying inside the write

    edit_module._pwrite = half_then_crash
    try:
        with pytest.raises(KeyboardInterrupt):
            aprfast.edit(path, metadata={"generation": "new"})
    finally:
        edit_module._pwrite = real
    with aprfast.open(path) as f:  # every byte the header points at is the old file's
        assert f.metadata == old_meta and sorted(f.keys()) == sorted(old_names)
    with pytest.raises(aprfast.ChecksumError):
        aprfast.open(path, verify=True)
    assert aprfast.edit(path, metadata={"generation": "new"})["in_place"]  # edits still work


REWRITE_CHILD = r"""
import sys
import aprfast
print("ready", flush=True)
aprfast.edit(sys.argv[1], metadata={"generation": "new"}, rename={"layers.1.weight": "renamed"})
print("done", flush=True)
"""


@pytest.mark.slow("kill -9 harness")
@pytest.mark.skipif(os.name != "posix", reason="kill -9")
def test_kill_9_during_a_rewrite_leaves_old_or_new(tmp_path):
    t = tensors(8, 4 << 20)  # 128 MiB: the copy takes a while
    reference = tmp_path / "ref.apr"
    aprfast.save_file(t, reference, {"generation": "old"}, durable=False)
    old = contents(reference)
    new = expected_after(t, {"generation": "new"}, {"layers.1.weight": "renamed"})
    start = time.monotonic()
    path = tmp_path / "m.apr"
    path.write_bytes(reference.read_bytes())
    child = subprocess.run([sys.executable, "-c", REWRITE_CHILD, str(path)], env=child_env(),
                           cwd=tempfile.gettempdir(), capture_output=True, text=True, timeout=300)
    assert child.returncode == 0, child.stderr
    span = time.monotonic() - start
    rng = random.Random(3)
    for trial in range(4):
        directory = tmp_path / f"t{trial}"
        directory.mkdir()
        path = directory / "m.apr"
        path.write_bytes(reference.read_bytes())
        child = subprocess.Popen([sys.executable, "-c", REWRITE_CHILD, str(path)], env=child_env(),
                                 cwd=tempfile.gettempdir(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert child.stdout.readline() == "ready\n", child.stderr.read()
        try:
            child.wait(timeout=rng.uniform(0, span))
        except subprocess.TimeoutExpired:
            child.send_signal(signal.SIGKILL)
        child.communicate(timeout=60)
        old_or_new(path, old, new)
        # at most a temporary the next save sweeps (tests/test_crash_safety.py covers the sweep)
        assert all(atomic_files._TEMP_NAME.fullmatch(n) for n in os.listdir(directory) if n != "m.apr")


# --- concurrency ------------------------------------------------------------------------------------
EDITOR_CHILD = r"""
import sys
import aprfast
path, who, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
for i in range(n):
    # every fourth edit does not fit the room: a rewrite replaces the inode under the others
    aprfast.edit(path, metadata={f"{who}.{i}": "x" * (3000 if i % 4 == 3 else 1)}, durable=False, reserve=0)
"""


@pytest.mark.skipif(os.name != "posix", reason="flock")
def test_concurrent_editors_lose_no_edit(tmp_path):
    path = tmp_path / "m.apr"
    aprfast.save_file(tensors(4), path, reserve=2048)
    kids = [subprocess.Popen([sys.executable, "-c", EDITOR_CHILD, str(path), who, "12"], env=child_env(),
                             cwd=tempfile.gettempdir(), stderr=subprocess.PIPE, text=True) for who in "abc"]
    for kid in kids:
        _, err = kid.communicate(timeout=300)
        assert kid.returncode == 0, err
    meta, _ = contents(path)
    assert sorted(meta) == sorted(f"{who}.{i}" for who in "abc" for i in range(12))


# --- apr edit ----------------------------------------------------------------------------------------
def test_cli_edit(tmp_path, capsys):
    path = tmp_path / "m.apr"
    aprfast.save_file(tensors(4), path, {"name": "m", "drop_me": 1}, reserve=4096)
    code = apr_main(["edit", str(path), "--set", "name=llama", "--set", "hidden_size=4096", "--set", 'tags=["a"]',
                     "--set", 'quoted="7"', "--unset", "drop_me", "--rename", "layers.0.weight=embed",
                     "--drop", "layers.2.weight", "--json"])
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    assert report["in_place"] and report["renamed"] == 1 and report["dropped"] == 1
    meta, found = contents(path)
    assert meta == {"name": "llama", "hidden_size": 4096, "tags": ["a"], "quoted": "7"}
    assert sorted(found) == ["embed", "layers.1.weight", "layers.3.weight"]
    assert apr_main(["edit", str(path), "--set", "name=x"]) == 0
    assert "in place" in capsys.readouterr().out
    assert apr_main(["edit", str(path)]) == 2
    assert apr_main(["edit", str(path), "--set", "novalue"]) == 2
    assert apr_main(["edit", str(path), "--set", "a=null"]) == 2
    assert apr_main(["edit", str(path), "--rename", "nope=x"]) == 4
    assert apr_main(["edit", str(tmp_path / "missing.apr"), "--set", "a=1"]) == 3
    capsys.readouterr()


def test_cli_edit_signed(tmp_path, capsys):
    key = tmp_path / "k"
    assert apr_main(["keygen", str(key), "--format", "raw"]) == 0
    seed = key.read_bytes()
    path = tmp_path / "s.apr"
    aprfast.save_file(tensors(2), path, signing_key=seed, reserve=4096)
    assert apr_main(["edit", str(path), "--set", "a=1"]) == 4
    assert apr_main(["edit", str(path), "--set", "a=1", "--signing-key", str(key)]) == 0
    capsys.readouterr()
    with aprfast.open(path, verify=True, trusted_keys=[(tmp_path / "k.pub").read_bytes()]) as f:
        assert f.metadata == {"a": 1}


def test_inspect_and_quality_accept_an_edited_file(tmp_path, capsys):
    path = tmp_path / "m.apr"
    aprfast.save_file(tensors(4), path, {"name": "m"}, reserve=4096)
    aprfast.edit(path, metadata={"name": "n"})
    header = aprfast.inspect(path)["header"]
    assert header["metadata_offset"] > aprender.SLOT_END  # moved into the room by the edit
    assert apr_main(["validate", "--quality", str(path)]) in (0, 5)
    out = capsys.readouterr().out
    assert "A. Format & Structural Integrity:   16/16" in out and "[FAIL] #2 " not in out
    assert struct.unpack("<I", path.read_bytes()[-4:])[0] == aprfast.crc32(path.read_bytes()[:-4])
