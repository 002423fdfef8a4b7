"""aprfast.convert from a URL: hf:// through huggingface_hub's cache (HF_HUB_OFFLINE=1,
no request), and http(s):// / s3:// through the loopback servers (tests/servers.py),
with the requests and bytes the servers saw counted."""

import json
import os

import numpy as np
import pytest
from servers import http_server, s3_server  # noqa: F401 - the fixtures

import aprfast
from aprfast import remote
from aprfast.errors import AprFileNotFoundError, AprIOError, CorruptError

sn = pytest.importorskip("safetensors.numpy")

COMMIT = "89abcdef0123456789abcdef0123456789abcdef"
TOKENIZER = {"model": {"vocab": {"a": 0, "b": 1, "c": 2}}, "added_tokens": [{"content": "<s>", "id": 3}]}


@pytest.fixture(autouse=True)
def fast_backoff(monkeypatch):
    monkeypatch.setattr(remote.RangedSource, "backoff", 0.001)


def _tensors(seed=0):
    rng = np.random.default_rng(seed)
    return {f"model.layers.{i}.weight": rng.standard_normal((128, 96)).astype(np.float32) for i in range(4)}


def _checkpoint(directory, tensors, sharded=False):
    """A safetensors checkpoint (one file, or an index and two shards) with a tokenizer."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "tokenizer.json").write_text(json.dumps(TOKENIZER))
    if not sharded:
        sn.save_file(tensors, directory / "model.safetensors", metadata={"format": "pt"})
        return directory / "model.safetensors"
    names = sorted(tensors)
    halves = {"model-00001-of-00002.safetensors": names[:2], "model-00002-of-00002.safetensors": names[2:]}
    for shard, members in halves.items():
        sn.save_file({n: tensors[n] for n in members}, directory / shard, metadata={"format": "pt"})
    index = {"metadata": {}, "weight_map": {n: s for s, ms in halves.items() for n in ms}}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    return directory / "model.safetensors.index.json"


def _same_output(got, expected):
    assert got.read_bytes() == expected.read_bytes()


# --- hf:// ------------------------------------------------------------------------------
@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    """A huggingface_hub cache (HF_HUB_CACHE in tmp_path) holding org/repo at main: a
    safetensors file, a sharded checkpoint in sub/, a GGUF, tokenizers; offline."""
    hub = pytest.importorskip("huggingface_hub")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # a mistake here must fail, not reach the Hub
    from huggingface_hub import constants

    cache = tmp_path / "hub"
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    repo = cache / "models--org--repo"
    snapshot = repo / "snapshots" / COMMIT
    tensors = _tensors()
    _checkpoint(snapshot, tensors)
    _checkpoint(snapshot / "sub", tensors, sharded=True)
    aprfast.convert(snapshot / "model.safetensors", snapshot / "model.gguf", tokenizer=False)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    return hub, snapshot, tensors


@pytest.mark.parametrize("name", ["model.safetensors", "sub/model.safetensors.index.json", "model.gguf"])
def test_convert_from_hf_uses_the_hub_cache_offline(hub_cache, tmp_path, monkeypatch, name):
    hub, snapshot, tensors = hub_cache
    monkeypatch.setattr(hub, "hf_hub_download", None)  # offline and cached: nothing may be downloaded
    out, expected = tmp_path / "out.apr", tmp_path / "expected.apr"
    report = aprfast.convert(f"hf://org/repo/{name}", out)
    aprfast.convert(snapshot / name, expected)
    _same_output(out, expected)  # as if the cached file had been given by path
    assert report["tensors"] == len(tensors)
    loaded = aprfast.load_file(out)
    assert all(loaded[k].tobytes() == tensors[k].tobytes() for k in tensors)
    if name.endswith(("safetensors", "index.json")):
        assert aprfast.open(out).metadata["tokenizer.vocab_size"] == 4  # the tokenizer beside it came along
    assert aprfast.convert(f"hf://org/repo@main/{name}", tmp_path / "at-main.apr")["tensors"] == len(tensors)


def test_convert_from_hf_offline_and_not_cached_sends_nothing(hub_cache, tmp_path, monkeypatch):
    hub, snapshot, _tensors_ = hub_cache
    monkeypatch.setattr(hub, "hf_hub_download", None)
    with pytest.raises(AprFileNotFoundError, match="HF_HUB_OFFLINE"):
        aprfast.convert("hf://org/repo/missing.safetensors", tmp_path / "a.apr")
    os.remove(snapshot / "sub" / "model-00002-of-00002.safetensors")  # a shard the cache lacks
    with pytest.raises(AprFileNotFoundError, match="model-00002-of-00002"):
        aprfast.convert("hf://org/repo/sub/model.safetensors.index.json", tmp_path / "b.apr")
    assert not (tmp_path / "a.apr").exists() and not (tmp_path / "b.apr").exists()


def test_convert_from_hf_online_downloads_what_the_cache_lacks(hub_cache, tmp_path, monkeypatch):
    """Online, a file missing from the cache goes through hf_hub_download (replaced here:
    no test touches the Hub) and cached ones do not."""
    hub, snapshot, tensors = hub_cache
    monkeypatch.delenv("HF_HUB_OFFLINE")
    asked = []
    elsewhere = tmp_path / "downloaded"
    _checkpoint(elsewhere, tensors)

    def fake_download(repo_id, filename, **kwargs):
        asked.append((repo_id, filename, kwargs.get("revision"), kwargs.get("token")))
        if filename == "tokenizer.json":
            raise type("EntryNotFoundError", (Exception,), {})("no such file")
        return str(elsewhere / "model.safetensors")

    monkeypatch.setattr(hub, "hf_hub_download", fake_download)
    os.remove(snapshot / "tokenizer.json")
    report = aprfast.convert("hf://org/repo/other.safetensors", tmp_path / "o.apr",
                             storage_options={"token": "hf_x"})
    assert report["tensors"] == len(tensors)
    assert asked == [("org/repo", "other.safetensors", None, "hf_x"), ("org/repo", "tokenizer.json", None, "hf_x")]
    asked.clear()
    aprfast.convert("hf://org/repo/model.safetensors", tmp_path / "cached.apr", tokenizer=False)
    assert asked == []  # cached: no download


# --- http(s):// and s3:// -------------------------------------------------------------------
def _put(server, prefix, directory):
    for name in sorted(os.listdir(directory)):
        if os.path.isfile(directory / name):
            server.put(f"{prefix}/{name}", (directory / name).read_bytes())


def _range_bytes(requests, sizes=None):
    """Bytes the ranges asked for, clamped to each object's size when ``sizes`` (path ->
    size) is given (what a server sends; a suffix range ``-n`` is the last n bytes)."""
    total = 0
    for _method, path, rng in requests:
        for spec in rng.removeprefix("bytes=").split(","):
            a, b = spec.split("-")
            size = sizes[path] if sizes else None
            if a == "":
                total += min(int(b), size) if size is not None else int(b)
                continue
            last = int(b) if size is None else min(int(b), size - 1)
            total += last - int(a) + 1
    return total


@pytest.mark.parametrize("sharded", [False, True])
def test_convert_from_http(http_server, tmp_path, sharded):
    tensors = _tensors()
    local = _checkpoint(tmp_path / "src", tensors, sharded=sharded)
    _put(http_server, f"ckpt-{sharded}", tmp_path / "src")
    out, expected = tmp_path / "out" / "model.apr", tmp_path / "expected.apr"
    out.parent.mkdir()
    http_server.reset()
    report = aprfast.convert(http_server.url(f"ckpt-{sharded}/{local.name}"), out)
    aprfast.convert(local, expected)
    _same_output(out, expected)
    assert report["tensors"] == len(tensors)
    assert os.listdir(out.parent) == ["model.apr"]  # the fetched copy is gone
    files = [p for p in os.listdir(tmp_path / "src")]
    # every file once: its first request (with the last bytes), then the rest, if any
    assert {path.rsplit("/", 1)[1] for _m, path, _r in http_server.requests} == set(files)
    sizes = {path: len(data) for path, data in http_server.objects.items()}
    # nothing read twice: each object once, plus the last 64 bytes its first request asks for
    assert _range_bytes(http_server.requests, sizes) <= sum(os.path.getsize(tmp_path / "src" / f) for f in files) \
        + 64 * len(files)
    assert len(http_server.requests) <= 2 * len(files)


def test_convert_from_s3_gguf(s3_server, tmp_path):
    tensors = _tensors()
    local = _checkpoint(tmp_path / "src", tensors)
    aprfast.convert(local, tmp_path / "m.gguf", tokenizer=False)
    bucket = s3_server.make_bucket()
    s3_server.fs().pipe(f"{bucket}/models/m.gguf", (tmp_path / "m.gguf").read_bytes())
    s3_server.reset()
    report = aprfast.convert(f"s3://{bucket}/models/m.gguf", tmp_path / "out.apr", quantize="Q8_0",
                             storage_options=s3_server.storage_options)
    assert report["source_format"] == "gguf"
    assert all(method == "GET" for method, _p, _r in s3_server.requests)
    assert _range_bytes(s3_server.requests) == os.path.getsize(tmp_path / "m.gguf")  # each byte once
    expected = tmp_path / "expected.apr"
    aprfast.convert(tmp_path / "m.gguf", expected, quantize="Q8_0")
    _same_output(tmp_path / "out.apr", expected)


def test_convert_from_a_url_refusals(http_server, tmp_path):
    tensors = _tensors()
    local = _checkpoint(tmp_path / "src", tensors, sharded=True)
    _put(http_server, "hostile", tmp_path / "src")
    index = json.loads(local.read_text())
    index["weight_map"]["model.layers.0.weight"] = "../../etc/passwd"
    http_server.put("hostile/model.safetensors.index.json", json.dumps(index).encode())
    http_server.reset()
    with pytest.raises(CorruptError, match="plain file name"):
        aprfast.convert(http_server.url("hostile/model.safetensors.index.json"), tmp_path / "h.apr")
    assert [path for _m, path, _r in http_server.requests] == ["/hostile/model.safetensors.index.json"]

    (tmp_path / "exists.apr").write_bytes(b"keep")
    http_server.reset()
    with pytest.raises(aprfast.convert.DestinationExistsError if hasattr(aprfast.convert, "DestinationExistsError")
                       else aprfast.errors.AprIOError):
        aprfast.convert(http_server.url("hostile/model-00001-of-00002.safetensors"), tmp_path / "exists.apr")
    assert http_server.count == 0 and (tmp_path / "exists.apr").read_bytes() == b"keep"

    http_server.faults.status_500 = 100
    with pytest.raises(AprIOError):
        aprfast.convert(http_server.url("hostile/model-00001-of-00002.safetensors"), tmp_path / "failed.apr")
    http_server.reset()
    assert sorted(os.listdir(tmp_path)) == ["exists.apr", "src"]  # no output, no fetched copy left
    with pytest.raises(AprFileNotFoundError):
        aprfast.convert(http_server.url("hostile/nothing.safetensors"), tmp_path / "n.apr")


def test_apr_convert_takes_a_url(hub_cache, tmp_path, http_server, capsys):
    from aprfast.cli import main

    _hub, snapshot, tensors = hub_cache
    out = tmp_path / "cli.apr"
    assert main(["convert", "hf://org/repo/model.safetensors", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["tensors"] == len(tensors)
    aprfast.convert(snapshot / "model.safetensors", tmp_path / "expected.apr")
    _same_output(out, tmp_path / "expected.apr")
    url = http_server.put("cli/model.safetensors", (snapshot / "model.safetensors").read_bytes())
    assert main(["convert", url, str(tmp_path / "http.apr"), "--no-tokenizer"]) == 0
    assert aprfast.load_file(tmp_path / "http.apr").keys() == tensors.keys()
