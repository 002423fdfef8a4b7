"""Sharded .apr models: save_file(max_shard_size=) writes shards plus a manifest as a
set; aprfast.open/load_file/inspect read them as one model, lazily, and refuse missing,
altered or mis-described shards and hostile manifests with typed errors."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

import aprfast
from aprfast.errors import (
    AprError,
    AprFileNotFoundError,
    AprIOError,
    ChecksumError,
    CorruptError,
    FormatError,
    LayoutError,
    LimitError,
    TensorNotFoundError,
)
from aprfast.files import shards
from aprfast.limits import Limits


def model(n=6, size=100, dtype=np.float32):
    return {f"layer.{i}.weight": np.full((size,), i, dtype) for i in range(n)}


def manifest_of(directory, stem="model"):
    with open(os.path.join(directory, stem + shards.MANIFEST_SUFFIX)) as f:
        return json.load(f)


def write_manifest(directory, manifest, stem="model"):
    path = os.path.join(directory, stem + shards.MANIFEST_SUFFIX)
    with open(path, "w") as f:
        json.dump(manifest, f)
    return path


def assert_same(loaded, expected):
    assert sorted(loaded) == sorted(expected)
    for name, array in expected.items():
        got = np.asarray(loaded[name])
        assert got.dtype == array.dtype and got.shape == array.shape, name
        assert got.tobytes() == array.tobytes(), name


# --- writing -------------------------------------------------------------------------------
def test_shards_and_manifest_are_laid_out_as_documented(tmp_path):
    tensors = model(5, 100)  # 400 bytes each
    aprfast.save_file(tensors, tmp_path / "model.apr", {"model_type": "mlp"}, max_shard_size=800)
    assert sorted(os.listdir(tmp_path)) == [
        "model-00001-of-00003.apr", "model-00002-of-00003.apr", "model-00003-of-00003.apr",
        "model.apr.index.json"]
    m = manifest_of(tmp_path)
    assert m["apr_version"] == "2.0.0" and m["sharded"] is True and m["shard_count"] == 3
    assert m["tensor_shard_map"] == {"layer.0.weight": 0, "layer.1.weight": 0, "layer.2.weight": 1,
                                     "layer.3.weight": 1, "layer.4.weight": 2}
    assert m["metadata"] == {"model_type": "mlp"}
    for i, entry in enumerate(m["shards"]):
        data = (tmp_path / entry["file"]).read_bytes()
        assert entry["file"] == f"model-{i + 1:05d}-of-00003.apr"
        assert entry["size"] == len(data)
        # all bytes but the last four: for an aprender shard that is its footer CRC
        assert entry["crc32"] == f"{aprfast._crc.crc32(data[:-4]):08x}"
        assert entry["crc32"] == f"{int.from_bytes(data[-4:], 'little'):08x}"
    assert len({e["crc32"] for e in m["shards"]}) == 3


def test_each_shard_is_a_complete_file_with_aprenders_sharding_object(tmp_path):
    aprfast.save_file(model(4), tmp_path / "model.apr", {"model_type": "mlp"}, max_shard_size=800)
    info = aprfast.inspect(tmp_path / "model-00002-of-00002.apr")
    assert "SHARDED" in info["header"]["flag_names"]
    assert info["metadata"]["sharding"] == {"shard_count": 2, "shard_index": 1, "total_size": 1600,
                                            "pattern": "model-{index:05}-of-{count:05}.apr"}
    assert info["metadata"]["model_type"] == "mlp"
    assert sorted(aprfast.load_file(tmp_path / "model-00002-of-00002.apr")) == ["layer.2.weight", "layer.3.weight"]


def test_a_tensor_larger_than_the_limit_gets_a_shard_of_its_own(tmp_path):
    tensors = {"small.a": np.zeros(10, np.float32), "huge": np.arange(1000, dtype=np.float32),
               "small.b": np.ones(10, np.float32)}
    aprfast.save_file(tensors, tmp_path / "model.apr", max_shard_size=100)
    m = manifest_of(tmp_path)
    assert m["tensor_shard_map"] == {"small.a": 0, "huge": 1, "small.b": 2}
    assert_same(aprfast.load_file(tmp_path / "model.apr"), tensors)


def test_everything_in_one_shard_writes_a_plain_file(tmp_path):
    tensors = model(3)
    aprfast.save_file(tensors, tmp_path / "model.apr", max_shard_size="1MB")
    assert os.listdir(tmp_path) == ["model.apr"]
    assert aprfast.inspect(tmp_path / "model.apr")["layout"] == "aprender"
    assert_same(aprfast.load_file(tmp_path / "model.apr"), tensors)


DTYPES = [np.float32, np.float16, np.float64, np.int8, np.uint8, np.int32, np.int64, np.bool_]


@pytest.mark.parametrize("max_shard_size", [1, 64, 700, 1500])
def test_many_shapes_and_dtypes_round_trip_across_boundaries(tmp_path, max_shard_size):
    rng = np.random.default_rng(max_shard_size)
    tensors = {}
    for i, dtype in enumerate(DTYPES * 2):
        shape = [(3, 7), (0,), (), (2, 3, 5), (129,)][i % 5]
        values = rng.standard_normal(shape) * 100
        tensors[f"t{i:02d}.{np.dtype(dtype).name}"] = (values > 0) if dtype is np.bool_ else values.astype(dtype)
    aprfast.save_file(tensors, tmp_path / "model.apr", {"note": "x"}, max_shard_size=max_shard_size)
    assert manifest_of(tmp_path)["shard_count"] > 1
    for mmap in (True, False):
        assert_same(aprfast.load_file(tmp_path / "model.apr", mmap=mmap), tensors)
    with aprfast.open(tmp_path) as f:
        assert f.keys() == sorted(tensors)
        assert f.metadata == {"note": "x"}
        for name, array in tensors.items():
            assert f.get_tensor(name, copy=True).tobytes() == array.tobytes()
        f.verify()


@pytest.mark.parametrize("layout", ["aprender", "apr2"])
def test_layout_and_compression_apply_to_every_shard(tmp_path, layout):
    tensors = model(4, 1000)
    extra = {"compression": "zstd"} if layout == "apr2" else {}
    aprfast.save_file(tensors, tmp_path / "m.apr", layout=layout, max_shard_size=8000, **extra)
    for entry in manifest_of(tmp_path, "m")["shards"]:
        assert aprfast.inspect(tmp_path / entry["file"])["layout"] == layout
    assert_same(aprfast.load_file(tmp_path / "m.apr", mmap=False), tensors)


def test_max_shard_size_takes_unit_strings():
    assert shards.parse_size(123) == 123
    assert shards.parse_size("5GB") == 5 * 10**9
    assert shards.parse_size("2 GiB") == 2 * 2**30
    assert shards.parse_size("500kb") == 500_000
    for bad in ("", "GB", "1.5GB", "-3", "12 parsecs", 0, -1):
        with pytest.raises(ValueError):
            shards.parse_size(bad)
    for bad in (True, 1.5, None):
        with pytest.raises(TypeError):
            shards.parse_size(bad)


def test_sharded_writes_refuse_what_they_cannot_hold(tmp_path):
    with pytest.raises(LayoutError, match="encrypted or signed"):
        aprfast.save_file(model(2), tmp_path / "m.apr", max_shard_size=10, password="pw")
    with pytest.raises(LayoutError, match="sharding"):
        aprfast.save_file(model(2), tmp_path / "m.apr", {"sharding": 1}, max_shard_size=10)
    with open(os.devnull, "wb") as sink, pytest.raises(TypeError, match="file object"):
        aprfast.save_file(model(2), sink, max_shard_size=10)
    assert os.listdir(tmp_path) == []


# --- atomicity -------------------------------------------------------------------------------
def test_a_failure_while_writing_shards_leaves_nothing(tmp_path, monkeypatch):
    import aprfast.api as api

    real, calls = api.save_to, []

    def failing(target, plan, **kw):
        calls.append(target)
        if len(calls) == 3:
            raise OSError(28, "No space left on device")
        return real(target, plan, **kw)

    monkeypatch.setattr(api, "save_to", failing)
    with pytest.raises(AprError) as caught:
        aprfast.save_file(model(6), tmp_path / "model.apr", max_shard_size=800)
    assert caught.value.code == "E007"
    assert os.listdir(tmp_path) == []


def test_a_failure_while_renaming_removes_the_shards_placed(tmp_path, monkeypatch):
    real = os.replace

    def failing(src, dst):
        if str(dst).endswith(shards.MANIFEST_SUFFIX):
            raise OSError(5, "Input/output error")
        return real(src, dst)

    monkeypatch.setattr(shards.os, "replace", failing)
    with pytest.raises(AprError):
        aprfast.save_file(model(6), tmp_path / "model.apr", max_shard_size=800)
    monkeypatch.setattr(shards.os, "replace", real)
    assert os.listdir(tmp_path) == []


# --- reading ---------------------------------------------------------------------------------
def test_shards_are_opened_only_when_a_tensor_in_them_is_asked_for(tmp_path):
    tensors = model(6)
    aprfast.save_file(tensors, tmp_path / "model.apr", max_shard_size=800)
    with aprfast.open(tmp_path / "model.apr") as f:
        assert isinstance(f, shards.ShardedFile)
        assert len(f) == 6 and "layer.5.weight" in f and "nope" not in f
        assert f.opened_shards() == []
        assert f.get_tensor("layer.3.weight").tolist() == [3.0] * 100
        assert f.opened_shards() == ["model-00002-of-00003.apr"]
        assert f.get_slice("layer.4.weight")[10:13].tolist() == [4.0] * 3
        assert f.opened_shards() == ["model-00002-of-00003.apr", "model-00003-of-00003.apr"]
        assert f.shard_of("layer.0.weight") == "model-00001-of-00003.apr"
        assert f.info("layer.0.weight").shape == (100,)
        with pytest.raises(TensorNotFoundError, match="nope"):
            f.get_tensor("nope")
    assert f.closed
    with pytest.raises(AprIOError, match="closed"):
        f.get_tensor("layer.3.weight")


def test_threads_reading_one_model_open_each_shard_once(tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    tensors = model(12)
    aprfast.save_file(tensors, tmp_path / "model.apr", max_shard_size=800)
    with aprfast.open(tmp_path) as f, ThreadPoolExecutor(4) as pool:
        got = dict(zip(tensors, pool.map(lambda n: f.get_tensor(n, copy=True), list(tensors) * 4)))
        assert len(f.opened_shards()) == 6 and len(f._open) == 6
    assert_same(got, tensors)


@pytest.mark.parametrize("how", ["directory", "manifest", "apr_path"])
def test_open_load_and_inspect_by_every_name(tmp_path, how):
    tensors = model(4)
    aprfast.save_file(tensors, tmp_path / "model.apr", {"k": [1, 2]}, max_shard_size=800)
    target = {"directory": tmp_path, "manifest": tmp_path / "model.apr.index.json",
              "apr_path": tmp_path / "model.apr"}[how]
    assert_same(aprfast.load_file(target), tensors)
    assert_same(aprfast.load_file(target, mmap=False), tensors)
    info = aprfast.inspect(target)
    assert info["layout"] == "sharded" and info["metadata"] == {"k": [1, 2]}
    assert info["header"]["shard_count"] == 2
    assert info["tensors"]["layer.3.weight"]["shard"] == "model-00002-of-00002.apr"
    assert info["tensors"]["layer.3.weight"]["dtype"] == "F32"


def test_a_directory_must_hold_exactly_one_manifest(tmp_path):
    with pytest.raises(AprIOError) as caught:  # no manifest: a directory is no file (E007)
        aprfast.open(tmp_path)
    assert str(tmp_path) in str(caught.value)
    aprfast.save_file(model(4), tmp_path / "a.apr", max_shard_size=800)
    aprfast.save_file(model(4), tmp_path / "b.apr", max_shard_size=800)
    with pytest.raises(FormatError, match="a.apr.index.json, b.apr.index.json"):
        aprfast.open(tmp_path)


def test_streaming_a_manifest_is_not_supported(tmp_path):
    aprfast.save_file(model(4), tmp_path / "model.apr", max_shard_size=800)
    with pytest.raises(FormatError):
        list(aprfast.stream(tmp_path / "model.apr.index.json"))


# --- missing and altered shards --------------------------------------------------------------------
def test_a_missing_shard_fails_at_open_naming_it(tmp_path):
    aprfast.save_file(model(6), tmp_path / "model.apr", max_shard_size=800)
    os.unlink(tmp_path / "model-00002-of-00003.apr")
    with pytest.raises(AprFileNotFoundError) as caught:
        aprfast.open(tmp_path)
    assert caught.value.code == "E007" and "model-00002-of-00003.apr" in str(caught.value)


def test_a_shard_of_another_size_fails_at_open_naming_it(tmp_path):
    aprfast.save_file(model(6), tmp_path / "model.apr", max_shard_size=800)
    with open(tmp_path / "model-00003-of-00003.apr", "ab") as f:
        f.write(b"\0")
    with pytest.raises(ChecksumError) as caught:
        aprfast.open(tmp_path)
    assert caught.value.code == "E004" and "model-00003-of-00003.apr" in str(caught.value)


def test_an_altered_shard_fails_verify_and_loads_naming_it(tmp_path):
    aprfast.save_file(model(6), tmp_path / "model.apr", max_shard_size=800)
    path = tmp_path / "model-00001-of-00003.apr"
    data = bytearray(path.read_bytes())
    data[400] ^= 0x40  # inside a tensor: the size stays, the CRC changes
    path.write_bytes(bytes(data))
    with aprfast.open(tmp_path) as f:  # sizes match: the lazy open reads no shard
        with pytest.raises(ChecksumError, match="model-00001-of-00003.apr"):
            f.verify()
    with pytest.raises(ChecksumError, match="model-00001-of-00003.apr"):
        aprfast.load_file(tmp_path, mmap=False)
    with pytest.raises(ChecksumError, match="model-00001-of-00003.apr"):
        aprfast.load_file(tmp_path, verify=True)
    with pytest.raises(ChecksumError, match="model-00001-of-00003.apr"):
        aprfast.open(tmp_path, verify=True)


def test_swapped_shards_are_refused(tmp_path):
    aprfast.save_file(model(6), tmp_path / "model.apr", max_shard_size=800)
    a, b = tmp_path / "model-00001-of-00003.apr", tmp_path / "model-00002-of-00003.apr"
    da, db = a.read_bytes(), b.read_bytes()
    a.write_bytes(db)
    b.write_bytes(da)  # same sizes: caught when opened, by the CRC its footer stores (no data read)
    with aprfast.open(tmp_path) as f:
        with pytest.raises(ChecksumError, match="'model-00001-of-00003.apr' has CRC32"):
            f.get_tensor("layer.0.weight")
        with pytest.raises(ChecksumError):
            f.verify()


# --- hostile manifests -------------------------------------------------------------------------------
def _good(tmp_path):
    aprfast.save_file(model(4), tmp_path / "model.apr", max_shard_size=800)
    return manifest_of(tmp_path)


def _refused(tmp_path, manifest, error, *words, limits=None, raw=None):
    if raw is not None:
        path = tmp_path / ("model" + shards.MANIFEST_SUFFIX)
        path.write_bytes(raw)
    else:
        path = write_manifest(tmp_path, manifest)
    with pytest.raises(error) as caught:
        aprfast.open(path, limits=limits)
    for word in words:
        assert word in str(caught.value)
    return caught.value


@pytest.mark.parametrize("name", ["../model-00001-of-00002.apr", "/etc/passwd", "sub/model.apr",
                                  "..\\model.apr", "C:model.apr", "..", ".", "", "a\x00b"])
def test_shard_paths_outside_the_directory_are_refused(tmp_path, name):
    m = _good(tmp_path)
    m["shards"][0]["file"] = name
    _refused(tmp_path, m, CorruptError, "plain file name")


def test_duplicate_tensor_names_are_refused(tmp_path):
    m = _good(tmp_path)
    text = json.dumps(m).replace('"tensor_shard_map": {', '"tensor_shard_map": {"layer.0.weight": 1, ', 1)
    _refused(tmp_path, None, CorruptError, "appears twice", raw=text.encode())


@pytest.mark.parametrize("key", ["apr_version", "sharded", "shard_count", "shards", "tensor_shard_map"])
def test_missing_keys_are_refused(tmp_path, key):
    m = _good(tmp_path)
    del m[key]
    _refused(tmp_path, m, CorruptError, key)


@pytest.mark.parametrize("change, words", [
    (lambda m: m.update(shard_count=10**12), ["10", "shards lists 2"]),
    (lambda m: m.update(shard_count=0), ["positive"]),
    (lambda m: m.update(shard_count=True), ["positive"]),
    (lambda m: m.update(sharded=False), ["sharded=False"]),
    (lambda m: m.update(shards={"a": 1}), ["shards lists dict"]),
    (lambda m: m.update(tensor_shard_map=[1]), ["tensor_shard_map"]),
    (lambda m: m["tensor_shard_map"].update({"layer.0.weight": 2}), ["layer.0.weight", "2"]),
    (lambda m: m["tensor_shard_map"].update({"layer.0.weight": -1}), ["-1"]),
    (lambda m: m["tensor_shard_map"].update({"layer.0.weight": 2**70}), [str(2**70)]),
    (lambda m: m["shards"][0].update(size=-5), ["size", "-5"]),
    (lambda m: m["shards"][0].update(size="12"), ["size"]),
    (lambda m: m["shards"][0].update(crc32="XYZ"), ["crc32"]),
    (lambda m: m["shards"][0].update(crc32=12345678), ["crc32"]),
    (lambda m: m["shards"][0].pop("crc32"), ["shards[0]"]),
    (lambda m: m["shards"].__setitem__(1, dict(m["shards"][0])), ["twice"]),
    (lambda m: m.update(metadata=[1]), ["metadata"]),
    (lambda m: m.update(shard_count=5, shards=m["shards"] + [dict(m["shards"][0], file=f"x{i}.apr") for i in range(3)]),
     ["5 shards for 4 tensors"]),
])
def test_inconsistent_manifests_are_refused(tmp_path, change, words):
    m = _good(tmp_path)
    change(m)
    _refused(tmp_path, m, CorruptError, *words)


def test_a_huge_tensor_map_is_refused_by_the_limit(tmp_path):
    m = _good(tmp_path)
    m["tensor_shard_map"].update({f"extra.{i}": 0 for i in range(50)})
    _refused(tmp_path, m, LimitError, "MAX_TENSOR_COUNT", limits=Limits(max_tensor_count=10))


@pytest.mark.parametrize("raw", [b"{not json", b"{" + b'"a":[' * 3000 + b"]" * 3000 + b"}",
                                 b'{"a": NaN}', b'{"a": "\xff"}'])
def test_malformed_manifest_json_is_refused(tmp_path, raw):
    _good(tmp_path)
    _refused(tmp_path, None, CorruptError, raw=raw)


def test_a_manifest_mapping_a_tensor_to_the_wrong_shard_is_refused_when_it_opens(tmp_path):
    m = _good(tmp_path)
    m["tensor_shard_map"]["layer.0.weight"] = 1
    path = write_manifest(tmp_path, m)
    with aprfast.open(path) as f:
        with pytest.raises(CorruptError, match="layer.0.weight"):
            f.get_tensor("layer.3.weight")


def test_the_converters_apr_source_reads_a_sharded_model(tmp_path):
    from aprfast.convert.apr import AprSource

    tensors = model(4)
    aprfast.save_file(tensors, tmp_path / "model.apr", {"k": 1}, max_shard_size=800)
    source = AprSource(tmp_path / "model.apr.index.json")
    try:
        assert source.metadata == {"k": 1}
        assert_same(dict(source.tensors()), tensors)
    finally:
        source.close()
