"""hf:// models: huggingface_hub's cache is used first, HF_HUB_OFFLINE is honoured.  No
test here sends a request: every file is in a cache built in tmp_path, and the ones
that are not are asked for offline."""

import numpy as np
import pytest

import aprfast
from aprfast.errors import AprFileNotFoundError
from aprfast.remote.hf import parse_hf_url

hub = pytest.importorskip("huggingface_hub")

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    """A huggingface_hub cache holding org/repo's model.apr at main and at tag v1."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # a mistake here must fail, not reach the Hub
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    repo = tmp_path / "models--org--repo"
    snapshot = repo / "snapshots" / COMMIT / "sub"
    snapshot.mkdir(parents=True)
    tensors = {"w": np.arange(12, dtype=np.float32).reshape(3, 4), "b": np.ones(4, np.float16)}
    aprfast.save_file(tensors, snapshot / "model.apr")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    (repo / "refs" / "v1").write_text(COMMIT)
    return tensors


def test_a_cached_file_opens_from_the_cache_memory_mapped(hub_cache):
    with aprfast.open("hf://org/repo/sub/model.apr") as f:
        assert f._source.zero_copy  # the local file, mapped
        np.testing.assert_array_equal(f.get_tensor("w"), hub_cache["w"])
    loaded = aprfast.load_file("hf://org/repo@v1/sub/model.apr")
    assert loaded["b"].tobytes() == hub_cache["b"].tobytes()
    assert len(aprfast.inspect("hf://org/repo/sub/model.apr")["tensors"]) == 2
    assert dict(aprfast.stream("hf://org/repo/sub/model.apr"))["w"].tobytes() == hub_cache["w"].tobytes()


def test_the_cache_is_used_online_too(hub_cache, monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr(hub, "HfFileSystem", None)  # no remote path can be taken
    with aprfast.open("hf://org/repo/sub/model.apr") as f:
        np.testing.assert_array_equal(f.get_tensor("w"), hub_cache["w"])


def test_offline_and_not_cached_is_file_not_found(hub_cache):
    with pytest.raises(AprFileNotFoundError, match="HF_HUB_OFFLINE"):
        aprfast.open("hf://org/repo/other.apr")
    with pytest.raises(AprFileNotFoundError):
        aprfast.open("hf://org/repo@v2/sub/model.apr")  # a revision the cache does not know


@pytest.mark.parametrize("url, parsed", [
    ("hf://org/repo/model.apr", ("model", "org/repo", None, "model.apr")),
    ("hf://org/repo@main/a/b/model.apr", ("model", "org/repo", "main", "a/b/model.apr")),
    ("hf://datasets/org/data/x.apr", ("dataset", "org/data", None, "x.apr")),
    ("hf://spaces/org/app@refs%2Fpr%2F1/x.apr", ("space", "org/app", "refs/pr/1", "x.apr")),
])
def test_hf_urls_parse(url, parsed):
    assert parse_hf_url(url) == parsed


@pytest.mark.parametrize("url", ["hf://org/model.apr", "hf://org//x.apr", "hf://"])
def test_hf_urls_without_repo_and_file_are_refused(url):
    with pytest.raises(ValueError):
        parse_hf_url(url)
