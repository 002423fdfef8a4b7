"""Open handles pickle by reopening (issue 15 part 5): AprFile, V1File and sharded models
travel as the path and arguments that opened them, never as their bytes, through pickle,
a multiprocessing pool and a Dask LocalCluster on 127.0.0.1."""

import multiprocessing
import os
import pickle

import numpy as np
import pytest
from servers import http_server, s3_server  # noqa: F401 - fixtures
from test_open_every_variant import PUBLIC, SEED, VARIANTS

import aprfast
from aprfast.distributed import PicklingRefusedError, allow_pickled_keys
from aprfast.errors import AprIOError, SignatureError
from aprfast.files.reader import AprFile
from aprfast.files.shards import ShardedFile
from aprfast.v1.reader import V1File

SECRET_VARIANTS = sorted(k for k, (_, keys) in VARIANTS.items() if "password" in keys or "private_key" in keys)
BIG = {"w": np.arange(256 * 1024, dtype=np.float32).reshape(1024, 256), "b": np.arange(7, dtype=np.int16)}


def _written(tmp_path, variant):
    write, keys = VARIANTS[variant]
    path = tmp_path / "model.apr"
    write(path)
    return path, keys


def _same_tensors(a, b):
    assert a.keys() == b.keys()
    for name in a.keys():
        np.testing.assert_array_equal(a.get_tensor(name), b.get_tensor(name))


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_variant_reopens_with_the_same_arguments(tmp_path, variant):
    path, keys = _written(tmp_path, variant)
    with aprfast.open(path, **keys) as f:
        if variant in SECRET_VARIANTS:
            with pytest.raises(PicklingRefusedError, match="carry that secret in clear"):
                pickle.dumps(f)
            allow_pickled_keys(f)
        data = pickle.dumps(f)
        assert len(data) < 1024 + (256 if "trusted_keys" in keys else 0)
        with pickle.loads(data) as g:
            assert type(g) is type(f) and type(g) in (AprFile, V1File) and g.path == f.path
            assert g.metadata == f.metadata
            _same_tensors(f, g)
            if variant in SECRET_VARIANTS:
                assert pickle.loads(pickle.dumps(g)).keys() == f.keys()  # the permission travels too


def test_pickle_is_small_whatever_the_model_size(tmp_path):
    path = tmp_path / "big.apr"
    aprfast.save_file(BIG, path)
    with aprfast.open(path) as f:
        f.get_tensor("w")  # mapped and touched: still nothing of it in the pickle
        data = pickle.dumps(f)
    assert len(data) < 512 < os.path.getsize(path) // 1000
    with pickle.loads(data) as g:
        np.testing.assert_array_equal(g.get_tensor("w"), BIG["w"])


def test_sharded_models_and_open_options_travel(tmp_path):
    path = tmp_path / "m.apr"
    aprfast.save_file(BIG, path, max_shard_size=100 << 10)
    with aprfast.open(path, mode="pread") as f:
        assert isinstance(f, ShardedFile)
        f.get_tensor("b")
        with pickle.loads(pickle.dumps(f)) as g:
            assert isinstance(g, ShardedFile) and g.opened_shards() == []  # reopened lazily, as opened
            w = g.get_tensor("w")
            assert w.flags.writeable  # mode="pread" travelled: owned arrays
            np.testing.assert_array_equal(w, BIG["w"])
    with aprfast.open(path, verify=True) as f, pickle.loads(pickle.dumps(f)) as g:
        assert len(g.opened_shards()) == 2  # verify=True travelled: every shard checked again at reopen


def test_trusted_keys_travel_and_are_checked_again(tmp_path):
    path = tmp_path / "signed.apr"
    aprfast.save_file(BIG, path, signing_key=SEED)
    with aprfast.open(path, trusted_keys=[PUBLIC]) as f:
        data = pickle.dumps(f)
    with pickle.loads(data) as g:
        assert g.security["signature"] == "trusted"
    aprfast.save_file(BIG, path)  # now unsigned: the reopened handle must refuse it
    with pytest.raises((SignatureError, AprIOError)):
        pickle.loads(data)


def test_relative_paths_are_made_absolute(tmp_path, monkeypatch):
    (tmp_path / "a").mkdir()
    aprfast.save_file(BIG, tmp_path / "a" / "m.apr")
    monkeypatch.chdir(tmp_path / "a")
    with aprfast.open("m.apr") as f:
        data = pickle.dumps(f)
    monkeypatch.chdir(tmp_path)
    with pickle.loads(data) as g:
        assert g.path == str(tmp_path / "a" / "m.apr")


def test_a_changed_file_is_refused(tmp_path):
    path = tmp_path / "m.apr"
    aprfast.save_file(BIG, path)
    with aprfast.open(path) as f:
        data = pickle.dumps(f)
    aprfast.save_file({"w": BIG["w"] + 1, "b": BIG["b"]}, path)  # same size, another version
    with pytest.raises(AprIOError, match="changed since this handle was pickled"):
        pickle.loads(data)


def test_closed_and_unreopenable_handles_raise(tmp_path):
    path = tmp_path / "m.apr"
    aprfast.save_file(BIG, path)
    f = aprfast.open(path)
    f.close()
    with pytest.raises(AprIOError, match="closed AprFile cannot be pickled"):
        pickle.dumps(f)
    refused = pytest.raises(PicklingRefusedError, match="not opened by aprfast.open from a path")
    with aprfast.open(path.read_bytes()) as g, refused:
        pickle.dumps(g)
    with open(path, "rb") as fileobj, aprfast.open(fileobj) as g:
        with pytest.raises(PicklingRefusedError, match="bytes are not shipped"):
            pickle.dumps(g)


# --- across processes ---------------------------------------------------------------------
def _sums(handle):
    """Run in another process: read every tensor of the handle it was given."""
    with handle:
        return os.getpid(), {name: float(np.asarray(handle.get_tensor(name), np.float64).sum())
                             for name in handle.keys()}


def test_multiprocessing_pool(tmp_path):
    path = tmp_path / "m.apr"
    aprfast.save_file(BIG, path, max_shard_size=100 << 10)
    single = tmp_path / "one.apr"
    aprfast.save_file(BIG, single)
    expected = {name: float(v.astype(np.float64).sum()) for name, v in BIG.items()}
    with aprfast.open(path) as sharded, aprfast.open(single) as one:
        with multiprocessing.get_context("spawn").Pool(2) as pool:
            results = pool.map(_sums, [sharded, one, sharded, one])
    assert all(sums == expected for _, sums in results)
    assert os.getpid() not in {pid for pid, _ in results}


@pytest.fixture(scope="module")
def dask_client():
    distributed = pytest.importorskip("distributed")
    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                                       dashboard_address=None, worker_dashboard_address=None)
    client = distributed.Client(cluster)
    yield client
    client.close()
    cluster.close()


def test_dask_workers_take_handles(tmp_path, dask_client):
    path = tmp_path / "m.apr"
    aprfast.save_file(BIG, path, max_shard_size=100 << 10)
    expected = {name: float(v.astype(np.float64).sum()) for name, v in BIG.items()}
    with aprfast.open(path) as f:
        futures = [dask_client.submit(_sums, f, pure=False) for _ in range(4)]
        results = dask_client.gather(futures)
    assert all(sums == expected for _, sums in results)
    assert len({pid for pid, _ in results}) >= 1 and os.getpid() not in {pid for pid, _ in results}
    # a refusal reaches the caller with the typed error as its cause (Dask wraps it in a TypeError)
    with aprfast.open(aprfast.save(BIG)) as g:
        with pytest.raises((PicklingRefusedError, TypeError)) as raised:
            dask_client.submit(_sums, g, pure=False).result()
    causes, error = [], raised.value
    while error is not None:
        causes.append(error)
        error = error.__cause__ or error.__context__
    assert any(isinstance(c, PicklingRefusedError) for c in causes)


def test_dask_slices_on_workers(tmp_path, dask_client):
    from aprfast.distributed import load_shard

    path = tmp_path / "m.apr"
    aprfast.save_file(BIG, path)
    with aprfast.open(path) as f:
        futures = [dask_client.submit(load_shard, f, rank=r, world_size=2, rules={"w": 1}, pure=False)
                   for r in range(2)]
        parts = dask_client.gather(futures)
    np.testing.assert_array_equal(np.concatenate([p["w"] for p in parts], axis=1), BIG["w"])
    np.testing.assert_array_equal(parts[1]["b"], BIG["b"])


# --- remote handles (aprfast.remote) --------------------------------------------------------
def test_http_handles_reopen_by_url_and_refuse_a_changed_object(http_server):  # noqa: F811
    pytest.importorskip("aprfast.remote")
    url = http_server.put("pickled/m.apr", aprfast.save(BIG))
    with aprfast.open(url) as f:
        data = pickle.dumps(f)
    assert len(data) < 512 and url.encode() in data
    with pickle.loads(data) as g:
        assert g.path == url
        np.testing.assert_array_equal(g.get_slice("w")[10:20], BIG["w"][10:20])
    http_server.put("pickled/m.apr", aprfast.save({"w": BIG["w"] + 1, "b": BIG["b"]}))  # a new version, same size
    with pytest.raises(AprIOError, match="changed since this handle was pickled"):
        pickle.loads(data)


def test_s3_handles_travel_with_their_storage_options(s3_server, dask_client):  # noqa: F811
    pytest.importorskip("aprfast.remote")
    bucket = s3_server.make_bucket()
    s3_server.fs().pipe_file(f"{bucket}/m.apr", aprfast.save(BIG))
    with aprfast.open(f"s3://{bucket}/m.apr", storage_options=s3_server.storage_options) as f:
        expected = {name: float(v.astype(np.float64).sum()) for name, v in BIG.items()}
        _, sums = dask_client.submit(_sums, f, pure=False).result()
    assert sums == expected
