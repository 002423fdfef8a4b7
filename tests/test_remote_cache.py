"""apr download / apr cache info|clear (seed 001 §13.9): files land in APR_CACHE,
interrupted downloads leave nothing, clear removes only what download recorded."""

import hashlib
import json

import numpy as np
import pytest
from servers import http_server  # noqa: F401 - the fixture

import aprfast
from aprfast.cli import main
from aprfast.remote.cache import cache_clear, cache_info, cache_path_for, download


@pytest.fixture
def apr_cache(tmp_path, monkeypatch):
    root = tmp_path / "apr-cache"
    monkeypatch.setenv("APR_CACHE", str(root))
    monkeypatch.delenv("APR_CONFIG", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))  # no user configuration
    return root


def test_download_puts_the_file_in_apr_cache(http_server, apr_cache, capsys):
    data = aprfast.save({"w": np.arange(1000, dtype=np.float32)})
    url = http_server.put("models/m.apr", data)
    assert main(["download", url]) == 0
    path = apr_cache / "http" / f"127.0.0.1_{http_server.port}" / "models" / "m.apr"
    assert capsys.readouterr().out.strip() == str(path)
    assert path.read_bytes() == data
    records = json.loads((apr_cache / "checksum.json").read_text())
    record = records[f"http/127.0.0.1_{http_server.port}/models/m.apr"]
    assert record == {"url": url, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    http_server.reset()
    assert main(["download", url]) == 0  # cached: no request
    assert http_server.count == 0
    np.testing.assert_array_equal(aprfast.load_file(path)["w"], np.arange(1000))


def test_cache_info_and_clear(http_server, apr_cache, capsys):
    url = http_server.put("a.apr", aprfast.save({"w": np.ones(10)}))
    download(url)
    keep = apr_cache / "mine.txt"
    keep.write_text("not aprfast's")
    assert main(["cache", "info", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["count"] == 1 and report["files"][0]["present"] and report["bytes"] > 0
    assert main(["cache", "clear"]) == 0
    assert "removed 1 files" in capsys.readouterr().out
    assert keep.exists()  # only what download recorded is removed
    assert not (apr_cache / "http").exists()
    assert cache_info()["count"] == 0


def test_an_interrupted_download_leaves_no_file(http_server, apr_cache):
    url = http_server.put("big.apr", bytes(1 << 20))
    http_server.faults.drop_mid_body = 1
    with pytest.raises(aprfast.errors.AprIOError, match="ended after"):
        download(url)
    relative = cache_path_for(url)
    assert not (apr_cache / relative).exists()
    assert list((apr_cache / relative).parent.iterdir()) == []
    assert cache_clear()["removed"] == 0


@pytest.mark.parametrize("url", ["http://host/", "http://host/a/../../etc/passwd", "s3://bucket"])
def test_urls_that_name_no_file_inside_the_cache_are_refused(url, apr_cache):
    with pytest.raises(ValueError):
        cache_path_for(url)
    assert main(["download", url]) == 2


def test_hf_paths_in_the_cache():
    assert cache_path_for("hf://org/repo/sub/model.apr").as_posix() == "hf/org/repo/sub/model.apr"
    assert cache_path_for("hf://datasets/org/d@v1/x.apr").as_posix() == "hf/datasets/org/d@v1/x.apr"


def test_a_repository_download_offline_is_refused(apr_cache, monkeypatch):
    pytest.importorskip("huggingface_hub")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert main(["download", "hf://openai/whisper-tiny"]) == 3
