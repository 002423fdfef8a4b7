"""aprfast.distributed.load_shard (issue 15 part 4): each rank's tensors are the slices of
the full tensors its rules name, read with about 1/world_size of the split tensors' bytes,
from every variant aprfast.open reads and from sharded models; two processes over
torch.distributed's gloo backend on 127.0.0.1."""

import fnmatch
import json
import os
import re
import socket

import numpy as np
import pytest
from servers import http_server, s3_server  # noqa: F401 - fixtures
from test_open_every_variant import TENSORS, VARIANTS

import aprfast
from aprfast import distributed
from aprfast.distributed import load_shard, part_bounds, shard_plan
from aprfast.errors import LayoutError, TensorNotFoundError
from aprfast.io import sources
from aprfast.tensors import QuantizedTensor

# A model whose split tensors dominate its bytes: two 2-D weights split along rows and
# columns (the column split has more rows than one slice call reads run by run), a norm kept whole.
MODEL = {
    "layers.0.q_proj.weight": np.arange(512 * 256, dtype=np.float32).reshape(512, 256) / 100,
    "layers.0.o_proj.weight": (np.arange(5000 * 64, dtype=np.float32).reshape(5000, 64) % 97) - 48,
    "layers.0.norm.weight": np.linspace(0, 1, 256, dtype=np.float32),
}
MODEL_RULES = {"*.q_proj.weight": 0, re.compile(r".*\.o_proj\.weight"): 1}


@pytest.fixture
def read_counter(monkeypatch):
    """Bytes read from local files (every pread of a FileSource: headers, indexes, tensors)."""
    counter = _Counter()
    counter.install(monkeypatch.setattr)
    return counter


class _Counter:
    def __init__(self):
        self.bytes = 0

    def install(self, setattr_):
        """Count what a FileSource reads: ``_readinto`` and the batched ``readinto_many``
        (get_tensors' spans), which preads without it."""
        original = sources.FileSource._readinto
        original_many = sources.FileSource.readinto_many

        def counting(source, offset, out, threads, crc):
            self.bytes += out.nbytes
            return original(source, offset, out, threads, crc)

        def counting_many(source, pieces):
            pieces = list(pieces)
            if source._direct is None:  # else each piece goes through _readinto, counted there
                self.bytes += sum(memoryview(out).nbytes for _, out in pieces)
            return original_many(source, pieces)

        setattr_(sources.FileSource, "_readinto", counting)
        setattr_(sources.FileSource, "readinto_many", counting_many)


def _sharded_model(tmp_path):
    path = tmp_path / "model.apr"
    aprfast.save_file(MODEL, path, max_shard_size=600 << 10)  # one shard per tensor
    return path


def _expected_part(name, full, rank, world_size, rules=MODEL_RULES):
    plan_dim = next((dim for pattern, dim in rules.items()
                     if (pattern.fullmatch(name) if isinstance(pattern, re.Pattern) else
                         fnmatch.fnmatchcase(name, pattern))), None)
    if plan_dim is None:
        return full
    return np.array_split(full, world_size, axis=plan_dim)[rank]


# --- every variant ------------------------------------------------------------------------
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_parts_are_the_slices_of_every_variant(tmp_path, variant):
    write, keys = VARIANTS[variant]
    path = tmp_path / "model.apr"
    write(path)
    expected = {k: v for k, v in TENSORS.items() if not (variant.endswith("trueno-native") and k == "steps")}
    rules = {"embed.weight": 1, "head.bias": 0}  # 64 columns; 33 elements: uneven
    for rank in range(3):
        parts = load_shard(path, rank=rank, world_size=3, rules=rules, uneven="tensor_split", **keys)
        assert sorted(parts) == sorted(expected)
        np.testing.assert_array_equal(parts["embed.weight"], np.array_split(TENSORS["embed.weight"], 3, axis=1)[rank])
        np.testing.assert_array_equal(parts["head.bias"], TENSORS["head.bias"][rank * 11:(rank + 1) * 11])
        assert parts["head.bias"].dtype == np.float16
        if "steps" in expected:
            np.testing.assert_array_equal(parts["steps"], TENSORS["steps"])


@pytest.mark.parametrize("mode", ["mmap", "pread"])
def test_sharded_model_parts_and_concatenation(tmp_path, mode):
    path = _sharded_model(tmp_path)
    with aprfast.open(path) as f:
        assert f.layout == "sharded" and len(f.header["shards"]) == 3
    got = [load_shard(path, rank=r, world_size=2, rules=MODEL_RULES, mode=mode) for r in range(2)]
    for name, full in MODEL.items():
        for rank in range(2):
            np.testing.assert_array_equal(got[rank][name], _expected_part(name, full, rank, 2))
    np.testing.assert_array_equal(np.concatenate([g["layers.0.o_proj.weight"] for g in got], axis=1),
                                  MODEL["layers.0.o_proj.weight"])
    np.testing.assert_array_equal(np.concatenate([g["layers.0.q_proj.weight"] for g in got], axis=0),
                                  MODEL["layers.0.q_proj.weight"])


def test_each_rank_reads_about_half_of_the_split_bytes(tmp_path, read_counter):
    path = _sharded_model(tmp_path)
    split = MODEL["layers.0.q_proj.weight"].nbytes + MODEL["layers.0.o_proj.weight"].nbytes
    whole = MODEL["layers.0.norm.weight"].nbytes
    for rank in range(2):
        read_counter.bytes = 0
        parts = load_shard(path, rank=rank, world_size=2, rules=MODEL_RULES, mode="pread")
        assert parts["layers.0.o_proj.weight"].shape == (5000, 32)
        # everything read (headers and indexes of both shards included), less the whole tensor
        assert read_counter.bytes - whole <= 0.55 * split, (rank, read_counter.bytes, split)
        assert read_counter.bytes >= split / 2


def test_an_open_handle_is_used_and_left_open(tmp_path):
    path = _sharded_model(tmp_path)
    with aprfast.open(path) as f:
        parts = load_shard(f, rank=1, world_size=2, rules=MODEL_RULES, names=["layers.0.q_proj.weight"])
        assert not f.closed
        assert list(parts) == ["layers.0.q_proj.weight"]
        np.testing.assert_array_equal(parts["layers.0.q_proj.weight"], MODEL["layers.0.q_proj.weight"][256:])
        with pytest.raises(TypeError, match="already open"):
            load_shard(f, rank=0, world_size=2, mode="pread")
        with pytest.raises(TensorNotFoundError):
            load_shard(f, rank=0, world_size=2, names=["nope"])


# --- rules and uneven dims ----------------------------------------------------------------
@pytest.mark.parametrize("size", [0, 1, 5, 7, 8, 13])
@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_part_bounds_match_torch(size, world_size):
    torch = pytest.importorskip("torch")
    x = torch.arange(size)
    for rank in range(world_size):
        start, stop = part_bounds(size, rank, world_size, "tensor_split")
        assert x[start:stop].tolist() == torch.tensor_split(x, world_size)[rank].tolist()
        chunks = torch.chunk(x, world_size) if size else ()
        start, stop = part_bounds(size, rank, world_size, "chunk")
        assert x[start:stop].tolist() == (chunks[rank].tolist() if rank < len(chunks) else [])
        if size % world_size == 0:
            assert part_bounds(size, rank, world_size) == (rank * size // world_size, (rank + 1) * size // world_size)
        else:
            with pytest.raises(LayoutError, match=f"size {size} does not divide into {world_size}"):
                part_bounds(size, rank, world_size)


def test_rules_first_match_wins_and_none_keeps_whole(tmp_path):
    path = tmp_path / "m.apr"
    tensors = {"a.weight": np.arange(24, dtype=np.float32).reshape(4, 6), "a.bias": np.arange(4, dtype=np.float32),
               "b.weight": np.arange(12, dtype=np.int32).reshape(2, 6)}
    aprfast.save_file(tensors, path)
    plan = shard_plan(path, rank=1, world_size=2, rules=[("a.bias", None), ("a.*", -1), (re.compile("b\\..*"), 0)])
    assert plan == {"a.bias": None, "a.weight": (1, 3, 6), "b.weight": (0, 1, 2)}
    parts = load_shard(path, rank=1, world_size=2, rules=lambda name, shape: 1 if len(shape) == 2 else None)
    np.testing.assert_array_equal(parts["a.weight"], tensors["a.weight"][:, 3:])
    np.testing.assert_array_equal(parts["b.weight"], tensors["b.weight"][:, 3:])
    np.testing.assert_array_equal(parts["a.bias"], tensors["a.bias"])
    assert shard_plan(path, rank=0, world_size=2) == dict.fromkeys(tensors)  # no rules: all whole
    # torch.chunk's parts of 4 rows over 3 ranks are 2, 2 and 0 rows: the last rank's part is empty
    last = load_shard(path, rank=2, world_size=3, rules={"a.weight": 0}, uneven="chunk")["a.weight"]
    assert last.shape == (0, 6) and last.dtype == np.float32


def test_refusals_name_what_was_wrong(tmp_path):
    path = tmp_path / "m.apr"
    aprfast.save_file({"w": np.ones((5, 4), np.float32), "v": np.ones(3, np.float32)}, path)
    with pytest.raises(LayoutError, match=r"'w' dim 0 \(rule 'w': 0\).*size 5 does not divide into 2"):
        load_shard(path, rank=0, world_size=2, rules={"w": 0})
    with pytest.raises(LayoutError, match=r"'v' of shape \[3\] has no dim 1 \(rule '\*': 1\)"):
        load_shard(path, rank=0, world_size=2, rules={"*": 1}, uneven="chunk")
    with pytest.raises(ValueError, match="rank 2 is not in 0..1"):
        load_shard(path, rank=2, world_size=2)
    with pytest.raises(ValueError, match="give rank= and world_size="):
        load_shard(path)  # torch.distributed is not initialised in this process
    with pytest.raises(TypeError, match="a dim is an int or None"):
        load_shard(path, rank=0, world_size=2, rules={"w": "0"})
    with pytest.raises(ValueError, match="uneven='sideways'"):
        load_shard(path, rank=0, world_size=2, rules={"w": 0}, uneven="sideways")
    with pytest.raises(aprfast.AprError, match="framework"):
        load_shard(path, rank=0, world_size=2, framework="tf")


def test_quantized_tensors_split_by_whole_rows(tmp_path):
    full = np.random.default_rng(1).standard_normal((8, 64)).astype(np.float32)
    packed = aprfast.quantize(full, "Q8_0")
    path = tmp_path / "q.apr"
    aprfast.save_file({"w": packed}, path)
    part = load_shard(path, rank=1, world_size=2, rules={"w": 0})["w"]
    assert isinstance(part, QuantizedTensor) and part.shape == (4, 64)
    np.testing.assert_array_equal(aprfast.dequantize(part), aprfast.dequantize(packed)[4:])
    values = load_shard(path, rank=1, world_size=2, rules={"w": 0}, dequantize=True)["w"]
    np.testing.assert_array_equal(values, aprfast.dequantize(packed)[4:])
    with pytest.raises(LayoutError, match="packed tensors split along dim 0 only"):
        load_shard(path, rank=0, world_size=2, rules={"w": 1})


def test_torch_tensors(tmp_path):
    torch = pytest.importorskip("torch")
    path = _sharded_model(tmp_path)
    parts = load_shard(path, rank=0, world_size=2, rules=MODEL_RULES, framework="pt")
    assert all(isinstance(v, torch.Tensor) for v in parts.values())
    assert torch.equal(parts["layers.0.o_proj.weight"], torch.from_numpy(MODEL["layers.0.o_proj.weight"][:, :32]))
    assert torch.equal(parts["layers.0.norm.weight"], torch.from_numpy(MODEL["layers.0.norm.weight"]))
    parts["layers.0.norm.weight"] += 1  # owned and writable, never a view of the map


# --- two ranks over torch.distributed (gloo on loopback) ------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_worker(rank, world_size, port, path, out_dir):
    """One rank: init gloo on 127.0.0.1, load its shard (rank and world size from
    torch.distributed), check it against the full tensors, all_gather the parts back."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo")
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        counter = _Counter()
        original, original_many = sources.FileSource._readinto, sources.FileSource.readinto_many
        counter.install(lambda obj, name, value: setattr(obj, name, value))
        try:
            parts = load_shard(path, rules=MODEL_RULES, framework="pt", mode="pread")
        finally:
            sources.FileSource._readinto, sources.FileSource.readinto_many = original, original_many
        full = aprfast.load_file(path)
        checked = []
        for name, value in parts.items():
            expected = torch.from_numpy(_expected_part(name, full[name], rank, world_size))
            assert torch.equal(value, expected), name
            dim = shard_plan(path, rank=rank, world_size=world_size, rules=MODEL_RULES)[name]
            if dim is not None:
                gathered = [torch.empty_like(value) for _ in range(world_size)]
                dist.all_gather(gathered, value.contiguous())
                assert torch.equal(torch.cat(gathered, dim=dim[0]), torch.from_numpy(full[name])), name
                checked.append(name)
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as out:
            json.dump({"rank": dist.get_rank(), "bytes_read": counter.bytes, "gathered": sorted(checked)}, out)
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.mark.slow("two torch.distributed ranks over gloo")
@pytest.mark.skipif(bool(os.environ.get("APRFAST_SANITIZED")),
                    reason="gloo's C++ runtime under tests/sanitize.sh's ASan preload is not what that run checks; "
                           "the ranks' aprfast code is the pure Python tested above")
def test_two_ranks_over_gloo(tmp_path):
    pytest.importorskip("torch")
    import torch.distributed as dist
    import torch.multiprocessing as mp

    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("this torch has no gloo backend")
    path = _sharded_model(tmp_path)
    mp.spawn(_rank_worker, args=(2, _free_port(), str(path), str(tmp_path)), nprocs=2, join=True)
    split = MODEL["layers.0.q_proj.weight"].nbytes + MODEL["layers.0.o_proj.weight"].nbytes
    whole = MODEL["layers.0.norm.weight"].nbytes
    for rank in range(2):
        report = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert report["rank"] == rank
        assert report["gathered"] == ["layers.0.o_proj.weight", "layers.0.q_proj.weight"]
        assert split / 2 <= report["bytes_read"] - whole <= 0.55 * split, report


def test_module_exports():
    assert set(distributed.__all__) >= {"load_shard", "shard_plan", "part_bounds", "allow_pickled_keys"}


# --- remote URLs (aprfast.remote) -----------------------------------------------------------
def _served_bytes(server, size):
    """Bytes the HTTP server sent, from its request log's Range headers."""
    total = 0
    for _method, _path, ranges in server.requests:
        if ranges is None:
            total += size
            continue
        for part in ranges.split("=", 1)[1].split(","):
            first, last = part.strip().split("-")
            total += int(last) if not first else min(int(last), size - 1) - int(first) + 1
    return total


def test_http_url_each_rank_reads_about_half(http_server):  # noqa: F811
    pytest.importorskip("aprfast.remote")
    rules = {"*.q_proj.weight": 0, "*.o_proj.weight": 0}  # row splits: one range per tensor
    data = aprfast.save(MODEL)
    url = http_server.put("tp/model.apr", data)
    split = MODEL["layers.0.q_proj.weight"].nbytes + MODEL["layers.0.o_proj.weight"].nbytes
    for rank in range(2):
        http_server.reset()
        parts = load_shard(url, rank=rank, world_size=2, rules=rules)
        for name, full in MODEL.items():
            expected = full if "norm" in name else np.array_split(full, 2, axis=0)[rank]
            np.testing.assert_array_equal(parts[name], expected)
        served = _served_bytes(http_server, len(data))
        # what was sent, less the whole norm weight and the 64 KiB + 64 bytes read at open
        assert served - MODEL["layers.0.norm.weight"].nbytes - (64 << 10) - 64 <= 0.55 * split, served
        assert http_server.count <= 4  # open, then one request per split tensor (the norm is in the prefix)


def test_s3_url(s3_server):  # noqa: F811
    pytest.importorskip("aprfast.remote")
    bucket = s3_server.make_bucket()
    fs = s3_server.fs()
    fs.pipe_file(f"{bucket}/model.apr", aprfast.save(MODEL))
    parts = load_shard(f"s3://{bucket}/model.apr", rank=1, world_size=2, rules=MODEL_RULES,
                       storage_options=s3_server.storage_options)
    for name, full in MODEL.items():
        np.testing.assert_array_equal(parts[name], _expected_part(name, full, 1, 2))
