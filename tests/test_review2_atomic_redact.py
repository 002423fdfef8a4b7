"""Issue 25 N17 (leftovers): a sharded ``.apr`` model at a URL (``aprfast.files.shards``) and a
conversion from a URL (``aprfast.convert._remote``) show URLs redacted
(``aprfast.remote.redact_url``: no userinfo, no query) in ``path=``, ``f.path`` and every message.
Before the fix ``ShardedFile._path`` was the raw URL, and the index and shard-name errors of a
conversion quoted it."""

import json

import numpy as np
import pytest
from servers import http_server  # noqa: F401 - the fixture

import aprfast
from aprfast.errors import AprError, ChecksumError, CorruptError

SECRETS = ("SECRETPW", "SECRET-TOKEN", "alice")


def _with_secrets(url: str) -> str:
    return url.replace("http://", "http://alice:SECRETPW@", 1) + "?token=SECRET-TOKEN"


def _chain_text(exc) -> str:
    texts, seen = [], set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        texts.append(f"{type(exc).__name__}: {exc} {getattr(exc, 'path', '')}")
        exc = exc.__cause__ or exc.__context__
    return "\n".join(texts)


def _clean(exc) -> str:
    text = _chain_text(exc)
    assert not any(secret in text for secret in SECRETS), text
    return text


def _put(server, prefix, files):
    for name, data in files.items():
        server.put(f"{prefix}/{name}", data)
    # the manifest also under its name with the query: the test server matches whole paths
    name = next(n for n in files if n.endswith(".json"))
    server.put(f"{prefix}/{name}?token=SECRET-TOKEN", files[name])
    return _with_secrets(server.url(f"{prefix}/{name}"))


@pytest.fixture
def sharded(tmp_path):
    tensors = {f"t{i}": np.full((64, 64), i, np.float32) for i in range(4)}
    aprfast.save_file(tensors, tmp_path / "model.apr", max_shard_size=40_000)
    return {p.name: p.read_bytes() for p in tmp_path.iterdir()}


def test_a_remote_sharded_model_shows_its_url_redacted(http_server, sharded):
    url = _put(http_server, "n17a", sharded)
    with aprfast.open(url) as f:
        assert f.layout == "sharded"
        assert f.path == f"http://127.0.0.1:{http_server.port}/n17a/model.apr.index.json?…"
        assert not any(secret in repr(f) for secret in SECRETS)
        np.testing.assert_array_equal(f.get_tensor("t3"), np.full((64, 64), 3, np.float32))


def test_a_remote_shard_of_the_wrong_size_is_named_redacted(http_server, sharded):
    files = dict(sharded)
    files["model-00002-of-00002.apr"] += b"\0"
    url = _put(http_server, "n17b", files)
    with aprfast.open(url) as f:
        with pytest.raises(ChecksumError) as info:
            f.get_tensor("t3")
    assert "model-00002-of-00002.apr" in _clean(info.value)


def test_a_remote_manifest_naming_a_url_is_refused_redacted(http_server, sharded):
    files = dict(sharded)
    manifest = json.loads(files["model.apr.index.json"])
    manifest["shards"][0]["file"] = "a?b.apr"
    files["model.apr.index.json"] = json.dumps(manifest).encode()
    url = _put(http_server, "n17c", files)
    with pytest.raises(CorruptError) as info:
        aprfast.open(url)
    assert "a?b.apr" in _clean(info.value)
    assert info.value.path == f"http://127.0.0.1:{http_server.port}/n17c/model.apr.index.json?…"


@pytest.mark.parametrize("index", [b"{not json", json.dumps({"weight_map": {"w": "a?b.safetensors"}}).encode(),
                                   json.dumps({"weight_map": {"w": 3}}).encode()])
def test_a_conversion_from_a_url_shows_it_redacted(http_server, tmp_path, index):
    url = _put(http_server, "n17d", {"model.safetensors.index.json": index})
    with pytest.raises(AprError) as info:
        aprfast.convert(url, tmp_path / "out.apr")
    _clean(info.value)
    assert f"127.0.0.1:{http_server.port}/n17d/model.safetensors.index.json?…" in str(info.value)
    assert not (tmp_path / "out.apr").exists()
