"""Sharded models at a URL (a manifest plus shards next to it) over the loopback HTTP
server and moto's S3 server (tests/servers.py): read as one model, each shard opened
when first needed, request counts as the servers saw them."""

import os
import pickle

import numpy as np
import pytest
from servers import http_server, s3_server  # noqa: F401 - the fixtures

import aprfast
from aprfast import remote
from aprfast.errors import AprFileNotFoundError, ChecksumError, CorruptError

SHARDS = 3


@pytest.fixture(autouse=True)
def fast_backoff(monkeypatch):
    monkeypatch.setattr(remote.RangedSource, "backoff", 0.001)


def _model(seed=0):
    # 6 tensors of 128 KiB: 2 per shard, each beyond a shard's first 64 KiB, so every
    # tensor read is a request of its own and the counts below are exact
    rng = np.random.default_rng(seed)
    return {f"layer.{i}.weight": rng.standard_normal((256, 128)).astype(np.float32) for i in range(6)}


def _save(tmp_path, tensors, layout="aprender", stem="model"):
    out = tmp_path / f"{stem}-{layout}"
    out.mkdir(exist_ok=True)
    aprfast.save_file(tensors, out / f"{stem}.apr", metadata={"k": "v"}, max_shard_size=300_000, layout=layout)
    files = {name: (out / name).read_bytes() for name in sorted(os.listdir(out))}
    assert len(files) == SHARDS + 1
    return out, files


def _put_http(server, prefix, files):
    for name, data in files.items():
        server.put(f"{prefix}/{name}", data)
    return server.url(f"{prefix}/model.apr.index.json")


@pytest.mark.parametrize("layout", ["aprender", "apr2"])
def test_sharded_model_over_http(http_server, tmp_path, layout):
    tensors = _model()
    local, files = _save(tmp_path, tensors, layout)
    url = _put_http(http_server, f"h-{layout}", files)
    http_server.reset()
    with aprfast.open(url) as f:
        assert http_server.count == 1  # the manifest only; no shard is touched at open
        assert f.keys() == sorted(tensors) and f.opened_shards() == []
        assert f.metadata == {"k": "v"}
        np.testing.assert_array_equal(f.get_tensor("layer.3.weight"), tensors["layer.3.weight"])
        assert f.opened_shards() == [f.shard_of("layer.3.weight")]
        assert http_server.count == 3  # + that shard's first bytes + the tensor
        http_server.reset()
        np.testing.assert_array_equal(f.get_tensor("layer.2.weight"), tensors["layer.2.weight"])
        assert http_server.count == 1  # its shard is open: one ranged GET
        np.testing.assert_array_equal(f.get_slice("layer.2.weight")[10:20], tensors["layer.2.weight"][10:20])
        f.verify()
    http_server.reset()
    loaded = aprfast.load_file(url)
    assert sorted(loaded) == sorted(tensors)
    assert all(loaded[k].tobytes() == tensors[k].tobytes() for k in tensors)
    # the manifest, then per shard its first bytes (with the footer: multi-range) and its data
    assert http_server.count == 1 + 2 * SHARDS
    http_server.reset()
    assert aprfast.inspect(url) == aprfast.inspect(local / "model.apr.index.json")
    assert http_server.count == 1 + SHARDS


def test_the_first_shard_or_the_missing_x_apr_url_stands_for_the_model(http_server, tmp_path):
    tensors = _model()
    _local, files = _save(tmp_path, tensors)
    url = _put_http(http_server, "first", files)
    base = url.rsplit("/", 1)[0]
    http_server.reset()
    with aprfast.open(f"{base}/model-00001-of-00003.apr") as f:
        assert f.layout == "sharded" and f.keys() == sorted(tensors)
    assert http_server.count == 1  # the manifest next to it, found by name
    http_server.reset()
    with aprfast.open(f"{base}/model.apr") as f:  # what save_file(..., "model.apr", max_shard_size=) was given
        assert f.layout == "sharded"
        np.testing.assert_array_equal(f.get_tensor("layer.5.weight"), tensors["layer.5.weight"])
    assert http_server.count == 1 + 1 + 2  # the 404, the manifest, the shard and the tensor
    assert aprfast.inspect(f"{base}/model.apr")["header"]["shard_count"] == SHARDS
    # a first shard without a manifest next to it is a single file
    http_server.put("alone/model-00001-of-00003.apr", files["model-00001-of-00003.apr"])
    with aprfast.open(http_server.url("alone/model-00001-of-00003.apr")) as f:
        assert f.layout != "sharded" and f.keys() == ["layer.0.weight", "layer.1.weight"]
    with pytest.raises(AprFileNotFoundError):
        aprfast.open(http_server.url("alone/nothing.apr"))


def test_a_shard_that_does_not_match_the_manifest_is_refused(http_server, tmp_path):
    tensors = _model()
    _local, files = _save(tmp_path, tensors)
    (tmp_path / "other").mkdir()  # another directory: a second save into the first would take tagged names
    _other, others = _save(tmp_path / "other", _model(seed=1), stem="model")  # same names and sizes, other values
    assert others.keys() == files.keys()
    second = "model-00002-of-00003.apr"

    # another save's shard: its own footer CRC holds, the manifest's CRC does not
    swapped = dict(files, **{second: others[second]})
    url = _put_http(http_server, "swapped", swapped)
    assert len(others[second]) == len(files[second]) and others[second] != files[second]
    with pytest.raises(ChecksumError, match="manifest says"):
        aprfast.load_file(url)
    with aprfast.open(url) as f:
        f.get_tensor("layer.0.weight")  # other shards read fine
        with pytest.raises(ChecksumError, match="manifest says"):
            f.verify()

    # a flipped data byte: the shard's own CRC
    damaged = bytearray(files[second])
    damaged[len(damaged) // 2] ^= 1
    url = _put_http(http_server, "damaged", dict(files, **{second: bytes(damaged)}))
    with pytest.raises(ChecksumError):
        aprfast.load_file(url)

    # a shard of another length: refused when opened, before any tensor of it is read
    url = _put_http(http_server, "longer", dict(files, **{second: files[second] + b"\0" * 64}))
    with aprfast.open(url) as f:
        f.get_tensor("layer.0.weight")
        with pytest.raises(ChecksumError, match="manifest says"):
            f.get_tensor("layer.2.weight")

    # a missing shard: not found when first needed
    url = _put_http(http_server, "missing", {k: v for k, v in files.items() if k != second})
    with aprfast.open(url) as f:
        f.get_tensor("layer.0.weight")
        with pytest.raises(AprFileNotFoundError):
            f.get_tensor("layer.2.weight")


@pytest.mark.parametrize("name", ["%2e%2e", "a%2fb.apr", "x.apr?y=1", "x.apr#y", "a b.apr", "../x.apr"])
def test_remote_manifests_refuse_shard_names_that_change_the_url(http_server, tmp_path, name):
    import json

    tensors = _model()
    _local, files = _save(tmp_path, tensors)
    manifest = json.loads(files["model.apr.index.json"])
    manifest["shards"][1]["file"] = name
    files["model.apr.index.json"] = json.dumps(manifest).encode()
    url = _put_http(http_server, "hostile", files)
    http_server.reset()
    with pytest.raises(CorruptError, match="shard"):
        aprfast.open(url)
    assert http_server.count == 1  # refused from the manifest alone


def test_remote_sharded_handles_pickle(http_server, tmp_path):
    tensors = _model()
    _local, files = _save(tmp_path, tensors)
    url = _put_http(http_server, "pickled", files)
    with aprfast.open(url) as f:
        f.get_tensor("layer.0.weight")
        blob = pickle.dumps(f)
    assert len(blob) < 2000
    with pickle.loads(blob) as g:
        assert g.layout == "sharded" and g.opened_shards() == []
        np.testing.assert_array_equal(g.get_tensor("layer.4.weight"), tensors["layer.4.weight"])
    # the manifest replaced since: the reopened handle refuses it
    manifest = files["model.apr.index.json"]
    http_server.put("pickled/model.apr.index.json", manifest.replace(b'"k": "v"', b'"k": "w"'))
    with pytest.raises(aprfast.errors.AprIOError, match="changed"):
        pickle.loads(blob)


@pytest.mark.parametrize("layout", ["aprender", "apr2"])
def test_sharded_model_on_s3(s3_server, tmp_path, layout):
    tensors = _model()
    local, files = _save(tmp_path, tensors, layout)
    bucket = s3_server.make_bucket()
    fs = s3_server.fs()
    for name, data in files.items():
        fs.pipe(f"{bucket}/m/{name}", data)
    options = s3_server.storage_options
    url = f"s3://{bucket}/m/model.apr.index.json"
    s3_server.reset()
    with aprfast.open(url, storage_options=options) as f:
        assert s3_server.count == 1
        np.testing.assert_array_equal(f.get_tensor("layer.4.weight"), tensors["layer.4.weight"])
        assert s3_server.count == 3  # + the shard's first 64 KiB (length, ETag) + the tensor
        s3_server.reset()
        np.testing.assert_array_equal(f.get_tensor("layer.5.weight"), tensors["layer.5.weight"])
        assert s3_server.count == 1
    s3_server.reset()
    loaded = aprfast.load_file(f"s3://{bucket}/m/model-00001-of-00003.apr", storage_options=options)
    assert all(loaded[k].tobytes() == tensors[k].tobytes() for k in tensors)
    # the manifest, then per shard: first bytes, data section, footer (the manifest's CRC
    # is derived from the footer's: no second read of any shard)
    assert s3_server.count == 1 + 3 * SHARDS
    assert all(method == "GET" for method, _path, _range in s3_server.requests)
    assert aprfast.inspect(url, storage_options=options) == aprfast.inspect(local / "model.apr.index.json")


def test_load_shard_of_a_remote_sharded_model_reads_about_half(http_server, tmp_path):
    from aprfast.distributed import load_shard

    tensors = _model()
    _local, files = _save(tmp_path, tensors)
    url = _put_http(http_server, "tp", files)
    data_bytes = sum(t.nbytes for t in tensors.values())
    for rank in range(2):
        http_server.reset()
        part = load_shard(url, rank=rank, world_size=2, rules={"layer.*": 0})
        for name, value in tensors.items():
            np.testing.assert_array_equal(part[name], value[rank * 128:(rank + 1) * 128])
        # the ranges fetched after each shard's first 64 KiB came with its open
        fetched = 0
        for _m, _p, rng in http_server.requests:
            if "," not in rng:
                a, b = rng.removeprefix("bytes=").split("-")
                fetched += int(b) - int(a) + 1
        assert fetched <= 0.55 * data_bytes
