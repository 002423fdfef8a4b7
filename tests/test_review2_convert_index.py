"""Review 2026-11: shard indexes and remote conversion.

N3: every path a shard index names is checked (a plain name of a regular file beside
the index) before anything is opened: ``detect()`` opened the first shard of a
``pytorch_model.bin.index.json`` (an absolute path, ``../``, a FIFO) before the check.
N15: an index fetched for a remote ``convert`` goes through the parser a local one does,
so a hostile one is a typed error there too (was RecursionError / TypeError).
N12: a typed error of a later ranged GET (the object changed) reaches the caller of a
remote ``convert``, not ``BufferError: cannot close exported pointers exist``."""

import json
import os
import threading

import numpy as np
import pytest
from servers import http_server  # noqa: F401 - the fixture

import aprfast
from aprfast import remote
from aprfast.convert import detect, open_source
from aprfast.convert import pytorch as cpt
from aprfast.convert import safetensors as cst
from aprfast.errors import AprError, CorruptError

fifo_only = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")


@pytest.fixture(autouse=True)
def fast_backoff(monkeypatch):
    monkeypatch.setattr(remote.RangedSource, "backoff", 0.001)


def _fifo_watch(path):
    """A FIFO at ``path`` and a flag set if anybody opens it for reading (the writer's
    open returns then); the daemon writer is released at the end either way."""
    os.mkfifo(path)
    opened = threading.Event()

    def writer():
        try:
            fd = os.open(path, os.O_WRONLY)
        except OSError:
            return
        opened.set()
        try:
            os.write(fd, b"PK\x03\x04")
        except OSError:
            pass
        os.close(fd)

    threading.Thread(target=writer, daemon=True).start()
    return opened


def _release(path):
    try:  # a reader that opens without blocking releases the writer's open()
        os.close(os.open(path, os.O_RDONLY | os.O_NONBLOCK))
    except OSError:
        pass


def _run_with_deadline(fn, seconds=10):
    """fn() in a daemon thread; ("returned" | "raised", value) or ("blocked", None)."""
    out = []

    def call():
        try:
            out.append(("returned", fn()))
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            out.append(("raised", exc))

    t = threading.Thread(target=call, daemon=True)
    t.start()
    t.join(seconds)
    return out[0] if out else ("blocked", None)


# --- N3 ---------------------------------------------------------------------------------
@fifo_only
@pytest.mark.parametrize("how", ["absolute", "dotdot"])
@pytest.mark.parametrize("index_name", [cpt.INDEX_NAME, cst.INDEX_NAME])
def test_detect_never_opens_a_shard_outside_the_directory(tmp_path, how, index_name):
    model, outside = tmp_path / "model", tmp_path / "outside"
    model.mkdir()
    outside.mkdir()
    fifo = outside / "x.bin"
    opened = _fifo_watch(fifo)
    try:
        name = str(fifo) if how == "absolute" else "../outside/x.bin"
        (model / index_name).write_text(json.dumps({"weight_map": {"w": name}}))
        outcome, _ = _run_with_deadline(lambda: detect(model / index_name))
        assert outcome == "returned", f"detect() {outcome}"
        assert not opened.wait(0.3), "detect() opened a file outside the model directory"
        with pytest.raises(CorruptError, match="plain file name"):
            open_source(model / index_name)
        assert not opened.is_set()
    finally:
        _release(fifo)


@fifo_only
@pytest.mark.parametrize("index_name", [cpt.INDEX_NAME, cst.INDEX_NAME])
def test_a_fifo_shard_beside_the_index_is_never_opened(tmp_path, index_name):
    fifo = tmp_path / "x.bin"
    opened = _fifo_watch(fifo)
    try:
        (tmp_path / index_name).write_text(json.dumps({"weight_map": {"w": "x.bin"}}))
        outcome, kind = _run_with_deadline(lambda: detect(tmp_path / index_name))
        assert outcome == "returned" and kind in ("pytorch", "safetensors-sharded")
        outcome, exc = _run_with_deadline(lambda: aprfast.convert(tmp_path / index_name, tmp_path / "o.apr"))
        assert outcome == "raised" and isinstance(exc, CorruptError), (outcome, exc)
        assert "not a regular file" in str(exc)
        assert not opened.wait(0.3), "a FIFO named by the index was opened"
    finally:
        _release(fifo)


@pytest.mark.parametrize("bad", ["/etc/passwd.bin", "../x.bin", "sub/x.bin", "a\\b.bin", ".", "..", ""])
def test_every_shard_name_is_checked_before_any_is_looked_at(tmp_path, monkeypatch, bad):
    (tmp_path / cpt.INDEX_NAME).write_text(json.dumps({"weight_map": {"a": "good.bin", "b": bad}}))
    looked = []
    real_stat = os.stat
    monkeypatch.setattr(os, "stat", lambda p, *a, **k: looked.append(os.fspath(p)) or real_stat(p, *a, **k))
    assert detect(tmp_path / cpt.INDEX_NAME) == "safetensors-sharded"  # not a valid .bin index
    assert not [p for p in looked if p.endswith(".bin")], looked
    with pytest.raises(CorruptError, match="plain file name"):
        cst.read_index(tmp_path / cpt.INDEX_NAME)


def test_honest_sharded_indexes_still_detect_and_convert(tmp_path):
    from test_convert_pytorch import floats, state_dict, tensor, write_pt  # the hand-made torch zips

    write_pt(tmp_path / "pytorch_model-00001-of-00001.bin", state_dict(w=tensor("0", 2, (2,), (1,))),
             {"0": floats(1, 2)})
    (tmp_path / cpt.INDEX_NAME).write_text(json.dumps({"weight_map": {"w": "pytorch_model-00001-of-00001.bin"}}))
    # a symlink to a regular file elsewhere (Hugging Face's cache links its snapshots) is fine
    os.rename(tmp_path / "pytorch_model-00001-of-00001.bin", tmp_path / "blob")
    os.symlink(tmp_path / "blob", tmp_path / "pytorch_model-00001-of-00001.bin")
    assert detect(tmp_path / cpt.INDEX_NAME) == "pytorch"
    aprfast.convert(tmp_path / cpt.INDEX_NAME, tmp_path / "o.apr")
    np.testing.assert_array_equal(aprfast.load_file(tmp_path / "o.apr")["w"], np.float32([1, 2]))


# --- N15 --------------------------------------------------------------------------------
HOSTILE = {
    "deep": ('{"weight_map": ' + "[" * 100000 + "]" * 100000 + "}").encode(),
    "mixed": json.dumps({"weight_map": {"a": 1, "b": "x.safetensors"}}).encode(),
    "unhashable": json.dumps({"weight_map": {"a": ["x"]}}).encode(),
    "not-an-object": b"[1, 2]",
    "many-empty-lists": b'{"weight_map": {"a": "x.safetensors"}, "x": [' + b"[]," * 3_000_000 + b"[]]}",
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
@pytest.mark.parametrize("index_name", [cst.INDEX_NAME, cpt.INDEX_NAME])
def test_a_fetched_index_is_refused_typed_as_the_local_one_is(http_server, tmp_path, case, index_name):
    url = http_server.put(f"n15/{case}/{index_name}", HOSTILE[case])
    with pytest.raises(AprError) as remote_error:
        aprfast.convert(url, tmp_path / "r.apr")
    local = tmp_path / case / index_name
    local.parent.mkdir()
    local.write_bytes(HOSTILE[case])
    with pytest.raises(AprError) as local_error:
        cst.read_index(local)
    assert type(remote_error.value) is type(local_error.value), (remote_error.value, local_error.value)
    # no shard was asked for
    assert all(path.endswith(index_name) for _m, path, _r in http_server.requests), http_server.requests


def test_the_index_parser_bounds_what_it_builds(tmp_path):
    """3 MB of `[],` would decode to 3 M lists (~170 MiB): refused before json.loads."""
    from aprfast.errors import LimitError
    with pytest.raises(LimitError):
        cst.parse_index(HOSTILE["many-empty-lists"], "x.json")


# --- N12 --------------------------------------------------------------------------------
def test_a_changed_object_is_a_typed_error_not_a_buffer_error(http_server, tmp_path):
    data = aprfast.save({"w": np.arange(100_000, dtype=np.float32)})  # > 64 KiB: several ranged GETs
    url = http_server.put("n12/m.apr", data)
    changed = bytearray(data)
    changed[-100] ^= 1
    http_server.faults.change_after = ("/n12/m.apr", 1, bytes(changed))
    with pytest.raises(AprError) as error:
        aprfast.convert(url, tmp_path / "o.apr")
    assert not isinstance(error.value, BufferError)
    assert type(error.value).__name__ in ("RemoteChangedError", "AprIOError"), repr(error.value)
    assert not (tmp_path / "o.apr").exists()
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".aprfast-source-")]
