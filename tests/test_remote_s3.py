"""s3:// models through fsspec/s3fs, against moto's standalone S3 server on 127.0.0.1
(tests/servers.py): reads equal local reads, writes are published only when complete."""

import numpy as np
import pytest
from servers import s3_server  # noqa: F401 - the fixture

import aprfast
from aprfast import remote, writer
from aprfast.errors import AprFileNotFoundError, AprIOError
from aprfast.remote import RemoteChangedError

pytest.importorskip("s3fs")
pytest.importorskip("moto")


@pytest.fixture(autouse=True)
def fast_backoff(monkeypatch):
    monkeypatch.setattr(remote.RangedSource, "backoff", 0.001)


@pytest.fixture
def bucket(s3_server):
    return s3_server.make_bucket()


def _model():
    rng = np.random.default_rng(3)
    tensors = {f"layer.{i:02d}.w": rng.standard_normal((32, 16)).astype(np.float32) for i in range(40)}
    tensors["emb"] = rng.standard_normal((1000, 64)).astype(np.float16)
    return tensors


def test_save_file_to_s3_writes_the_same_bytes_as_locally(s3_server, bucket, tmp_path):
    tensors = _model()
    url = f"s3://{bucket}/m.apr"
    aprfast.save_file(tensors, url, metadata={"k": "v"}, storage_options=s3_server.storage_options)
    local = tmp_path / "m.apr"
    aprfast.save_file(tensors, local, metadata={"k": "v"})
    assert s3_server.fs().cat_file(f"{bucket}/m.apr") == local.read_bytes()


def test_reads_from_s3_equal_local_reads(s3_server, bucket, tmp_path):
    tensors = _model()
    local = tmp_path / "m.apr"
    aprfast.save_file(tensors, local)
    s3_server.fs().pipe(f"{bucket}/m.apr", local.read_bytes())
    url, options = f"s3://{bucket}/m.apr", s3_server.storage_options
    assert aprfast.inspect(url, storage_options=options) == aprfast.inspect(local)
    with aprfast.open(url, storage_options=options) as f:
        assert f.keys() == sorted(tensors)
        for name in ("emb", "layer.07.w"):
            assert f.get_tensor(name).tobytes() == tensors[name].tobytes()
        np.testing.assert_array_equal(f.get_slice("emb")[10:20, 5:9], tensors["emb"][10:20, 5:9])
    loaded = aprfast.load_file(url, storage_options=options)
    for name, value in tensors.items():
        assert loaded[name].tobytes() == value.tobytes()


def test_load_file_from_s3_checks_the_crc(s3_server, bucket):
    data = bytearray(aprfast.save({"a": np.arange(100_000, dtype=np.float32)}))
    data[len(data) // 2] ^= 1
    s3_server.fs().pipe(f"{bucket}/bad.apr", bytes(data))
    with pytest.raises(aprfast.errors.ChecksumError):
        aprfast.load_file(f"s3://{bucket}/bad.apr", storage_options=s3_server.storage_options)


def test_a_missing_object_is_file_not_found(s3_server, bucket):
    with pytest.raises(AprFileNotFoundError):
        aprfast.open(f"s3://{bucket}/nothing.apr", storage_options=s3_server.storage_options)


def test_an_object_replaced_after_open_is_an_error(s3_server, bucket):
    first = {"pad": np.zeros(1 << 16, np.float32), "w": np.arange(10, dtype=np.float32)}
    second = {"pad": np.ones(1 << 16, np.float32), "w": -np.arange(10, dtype=np.float32)}
    fs = s3_server.fs()
    fs.pipe(f"{bucket}/m.apr", aprfast.save(first))
    with aprfast.open(f"s3://{bucket}/m.apr", storage_options=s3_server.storage_options) as f:
        fs.pipe(f"{bucket}/m.apr", aprfast.save(second))
        with pytest.raises(RemoteChangedError):
            f.get_tensor("w")


def _planned(tensors):
    return [(name, value.dtype, value.shape) for name, value in tensors.items()]


def _pending_uploads(s3_server, bucket):
    import boto3

    client = boto3.client("s3", endpoint_url=s3_server.endpoint_url, aws_access_key_id="testing",
                          aws_secret_access_key="testing", region_name="us-east-1")
    return client.list_multipart_uploads(Bucket=bucket).get("Uploads", [])


@pytest.mark.parametrize("size_mib", [1, 12])
def test_a_planned_writer_that_fails_midway_leaves_no_object(s3_server, bucket, size_mib):
    # 12 MiB with 5 MiB parts: parts were uploaded before the failure; the upload is aborted
    options = dict(s3_server.storage_options, default_block_size=5 << 20)
    n = size_mib * (1 << 18) // 4
    tensors = {f"t{i}": np.full(n, i, np.float32) for i in range(4)}
    url = f"s3://{bucket}/fail.apr"
    with pytest.raises(RuntimeError, match="midway"):
        with aprfast.Writer(url, plan=_planned(tensors), storage_options=options) as w:
            for i, (name, value) in enumerate(tensors.items()):
                if i == 3:
                    raise RuntimeError("failed midway")
                w.add(name, value)
    fs = s3_server.fs()
    assert not fs.exists(f"{bucket}/fail.apr")
    assert _pending_uploads(s3_server, bucket) == []


def test_a_planned_writer_streams_to_s3(s3_server, bucket):
    options = dict(s3_server.storage_options, default_block_size=5 << 20)
    tensors = {f"t{i}": np.full(1 << 20, i, np.float32) for i in range(4)}  # 16 MiB: a multipart upload
    url = f"s3://{bucket}/ok.apr"
    with aprfast.Writer(url, plan=_planned(tensors), storage_options=options) as w:
        for name, value in tensors.items():
            w.add(name, value)
            assert not s3_server.fs().exists(f"{bucket}/ok.apr")  # published only at close
        assert w._spool is None  # nothing spooled locally
    assert s3_server.fs().cat_file(f"{bucket}/ok.apr") == aprfast.save(tensors)


def test_an_unplanned_writer_uploads_on_close_and_abort_leaves_nothing(s3_server, bucket):
    tensors = _model()
    options = s3_server.storage_options
    with aprfast.Writer(f"s3://{bucket}/spooled.apr", storage_options=options) as w:
        for name, value in tensors.items():
            w.add(name, value)
    assert s3_server.fs().cat_file(f"{bucket}/spooled.apr") == aprfast.save(tensors)
    w = aprfast.Writer(f"s3://{bucket}/aborted.apr", storage_options=options)
    w.add("a", np.ones(4))
    w.abort()
    assert not s3_server.fs().exists(f"{bucket}/aborted.apr")


def test_save_file_that_fails_midway_leaves_no_object(s3_server, bucket, monkeypatch):
    tensors = {f"t{i}": np.full(1 << 18, i, np.float32) for i in range(4)}
    real = writer._write_tensor
    calls = []

    def failing(sink, item, pad, *args):
        calls.append(item.name)
        if len(calls) == 3:
            raise OSError(28, "No space left on device")
        return real(sink, item, pad, *args)

    monkeypatch.setattr(writer, "_write_tensor", failing)
    with pytest.raises(AprIOError, match="write failed"):
        aprfast.save_file(tensors, f"s3://{bucket}/m.apr", storage_options=s3_server.storage_options)
    assert not s3_server.fs().exists(f"{bucket}/m.apr")


def test_memory_urls_go_through_fsspec(tmp_path):
    pytest.importorskip("fsspec")
    import fsspec

    tensors = _model()
    fsspec.filesystem("memory").pipe("/aprfast-test/m.apr", aprfast.save(tensors))
    with aprfast.open("memory://aprfast-test/m.apr") as f:
        np.testing.assert_array_equal(f.get_tensor("emb"), tensors["emb"])
    seen = dict(aprfast.stream("memory://aprfast-test/m.apr"))
    assert sorted(seen) == sorted(tensors)
    fsspec.filesystem("memory").rm("/aprfast-test/m.apr")


def test_file_urls_write_atomically(tmp_path):
    pytest.importorskip("fsspec")
    url = f"file://{tmp_path}/m.apr"
    tensors = {"a": np.arange(5, dtype=np.float32)}
    with pytest.raises(RuntimeError):
        with aprfast.Writer(url, plan=_planned(tensors)) as w:
            raise RuntimeError("before any tensor")
    assert not (tmp_path / "m.apr").exists()
    aprfast.save_file(tensors, url)
    np.testing.assert_array_equal(aprfast.load_file(url)["a"], tensors["a"])
    assert (tmp_path / "m.apr").read_bytes() == aprfast.save(tensors)


def test_a_sharded_save_to_a_url_is_refused_before_anything_is_written(tmp_path):
    with pytest.raises(aprfast.errors.LayoutError, match="sharded"):
        aprfast.save_file({"a": np.ones(4)}, "memory://aprfast-test/sharded.apr", max_shard_size=8)


def test_load_file_from_s3_reads_parallel_parts(s3_server, bucket, monkeypatch):
    from aprfast.remote.fsspec import FsspecSource

    tensors = {f"t{i}": np.full(1 << 20, i, np.float32) for i in range(8)}  # 32 MiB
    s3_server.fs().pipe(f"{bucket}/big.apr", aprfast.save(tensors))
    seen = []
    real = FsspecSource._fetch_into

    def counting(self, offset, out):
        seen.append((offset, out.nbytes))
        return real(self, offset, out)

    monkeypatch.setattr(FsspecSource, "_fetch_into", counting)
    loaded = aprfast.load_file(f"s3://{bucket}/big.apr", storage_options=s3_server.storage_options)
    for name, value in tensors.items():
        np.testing.assert_array_equal(loaded[name], value)
    parts = [n for _offset, n in seen if n >= remote.PART_BYTES]
    assert len(parts) >= 3 and sum(parts) >= 31 << 20


def test_s3_request_counts(s3_server, bucket, monkeypatch):
    """Opening: the file object's HEAD, then the first 64 KiB and the last 64 bytes;
    a tensor on an open handle: one ranged GET."""
    from aprfast.remote.fsspec import FsspecSource

    tensors = {f"layer.{i:03d}.w": np.full((8, 8), i, np.float32) for i in range(200)}
    tensors["big"] = np.arange(1 << 19, dtype=np.float32)  # 2 MiB, beyond the first 64 KiB
    s3_server.fs().pipe(f"{bucket}/m.apr", aprfast.save(tensors))
    url, options = f"s3://{bucket}/m.apr", s3_server.storage_options
    gets = []
    real = FsspecSource._fetch_into
    monkeypatch.setattr(FsspecSource, "_fetch_into", lambda self, offset, out: gets.append(out.nbytes) or
                        real(self, offset, out))
    assert len(aprfast.inspect(url, storage_options=options)["tensors"]) == 201
    assert len(gets) == 2
    with aprfast.open(url, storage_options=options) as f:
        gets.clear()
        np.testing.assert_array_equal(f.get_tensor("big"), tensors["big"])
        assert gets == [2 << 20]


def test_stream_from_s3(s3_server, bucket):
    tensors = _model()
    s3_server.fs().pipe(f"{bucket}/m.apr", aprfast.save(tensors))
    seen = dict(aprfast.stream(f"s3://{bucket}/m.apr", storage_options=s3_server.storage_options))
    assert sorted(seen) == sorted(tensors)
    assert all(seen[k].tobytes() == tensors[k].tobytes() for k in tensors)
