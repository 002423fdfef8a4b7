"""s3:// models through fsspec/s3fs, against moto's standalone S3 server on 127.0.0.1
(tests/servers.py): reads equal local reads, writes are published only when complete."""

import numpy as np
import pytest
from servers import s3_server  # noqa: F401 - the fixture

import aprfast
from aprfast import remote
from aprfast.errors import AprFileNotFoundError, AprIOError
from aprfast.files import writer
from aprfast.remote import RemoteChangedError

pytest.importorskip("s3fs")
pytest.importorskip("moto")


@pytest.fixture(autouse=True)
def fast_backoff(monkeypatch):
    monkeypatch.setattr(remote.RangedSource, "backoff", 0.001)


@pytest.fixture
def bucket(s3_server):
    s3_server.reset()  # no fault left over from another test (the server is the session's)
    yield s3_server.make_bucket()
    s3_server.reset()


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
        with aprfast.Writer(url, plan=_planned(tensors)):
            raise RuntimeError("before any tensor")
    assert not (tmp_path / "m.apr").exists()
    aprfast.save_file(tensors, url)
    np.testing.assert_array_equal(aprfast.load_file(url)["a"], tensors["a"])
    assert (tmp_path / "m.apr").read_bytes() == aprfast.save(tensors)


def test_a_sharded_save_to_a_url_is_refused_before_anything_is_written(tmp_path):
    with pytest.raises(aprfast.errors.LayoutError, match="sharded"):
        aprfast.save_file({"a": np.ones(4)}, "memory://aprfast-test/sharded.apr", max_shard_size=8)


def _range_sizes(gets):
    sizes = []
    for _path, rng in gets:
        a, b = rng.removeprefix("bytes=").split("-")
        sizes.append(int(b) - int(a) + 1)
    return sizes


@pytest.mark.parametrize("way", ["presigned", "s3fs"])
def test_load_file_from_s3_reads_parallel_parts(s3_server, bucket, way):
    tensors = {f"t{i}": np.full(1 << 20, i, np.float32) for i in range(8)}  # 32 MiB
    tensors["r"] = np.random.default_rng(5).standard_normal(1 << 18).astype(np.float32)
    data = aprfast.save(tensors)
    s3_server.fs().pipe(f"{bucket}/big.apr", data)
    s3_server.reset()
    loaded = aprfast.load_file(f"s3://{bucket}/big.apr", storage_options=_options(s3_server, way))
    assert sorted(loaded) == sorted(tensors)
    for name, value in tensors.items():
        assert loaded[name].tobytes() == value.tobytes()  # bit for bit
    assert [_presigned(d) for d in s3_server.details[1:]] == [way == "presigned"] * (s3_server.count - 1)
    gets = s3_server.gets()
    assert len(gets) == s3_server.count  # GETs only: no HEAD, no listing
    parts = [n for n in _range_sizes(gets) if n >= remote.PART_BYTES]
    assert len(parts) >= 3 and sum(parts) >= 31 << 20
    # open (first 64 KiB) + the parts + the footer (64 bytes), nothing else
    assert len(gets) == 1 + len(parts) + 1


@pytest.mark.parametrize("layout", ["aprender", "apr2"])
def test_s3_request_counts(s3_server, bucket, layout):
    """Counted by the server: opening (and inspect) is one GET for the first 64 KiB,
    which also gives the object's length and ETag (no HEAD); a tensor is one more; the
    footer comes only when a CRC is checked."""
    tensors = {f"layer.{i:03d}.w": np.full((8, 8), i, np.float32) for i in range(200)}
    tensors["big"] = np.arange(1 << 19, dtype=np.float32)  # 2 MiB, beyond the first 64 KiB
    data = aprfast.save(tensors, layout=layout)
    s3_server.fs().pipe(f"{bucket}/m.apr", data)
    url, options = f"s3://{bucket}/m.apr", s3_server.storage_options
    key = f"/{bucket}/m.apr"

    s3_server.reset()
    assert len(aprfast.inspect(url, storage_options=options)["tensors"]) == 201
    assert s3_server.requests == [("GET", key, "bytes=0-65535")]

    s3_server.reset()
    with aprfast.open(url, storage_options=options) as f:  # a fresh handle plus one 2 MiB tensor: 2
        np.testing.assert_array_equal(f.get_tensor("big"), tensors["big"])
        assert s3_server.count == 2
        big = f._file.row("big")
        # its bytes from where the first 64 KiB (already here) end
        assert big[1] < remote.HEAD_BYTES
        assert s3_server.requests[1] == ("GET", key, f"bytes={remote.HEAD_BYTES}-{big[1] + big[2] - 1}")
        s3_server.reset()
        np.testing.assert_array_equal(f.get_tensor("layer.150.w"), tensors["layer.150.w"])  # open handle: 1
        assert s3_server.count == 1
        s3_server.reset()
        f.verify()  # the data from byte 0 (one 8 MiB chunk here) and the footer, once
        assert (key, f"bytes={len(data) - 64}-{len(data) - 1}") in s3_server.gets()
        assert s3_server.count == 2
        s3_server.reset()
        f.verify()
        assert s3_server.count == 1

    s3_server.reset()
    loaded = aprfast.load_file(url, storage_options=options)
    assert loaded["big"].tobytes() == tensors["big"].tobytes()
    assert s3_server.count == 3  # open, the data section (2 MiB: one part), the footer


#: The two ways of the GETs after open: presigned URLs over aprfast's own connections,
#: or s3fs's client (taken for what a presigned URL cannot express: requester_pays here).
WAYS = ["presigned", "s3fs"]


def _options(s3_server, way):
    if way == "s3fs":
        return dict(s3_server.storage_options, requester_pays=True)
    return s3_server.storage_options


def _presigned(detail) -> bool:
    return "Signature=" in detail["query"]  # SigV2's Signature= or SigV4's X-Amz-Signature=


@pytest.mark.parametrize("way", WAYS)
def test_s3_later_gets_take_the_way_asked_and_carry_if_match(s3_server, bucket, monkeypatch, way):
    """The If-Match header is what makes S3 refuse a replaced object (412), so a read is
    never a mix of two versions even if the ETag check here were fooled.  Checked on
    what reached the server; the first GET (open) is always s3fs's, signed in headers."""
    tensors = {"pad": np.zeros(1 << 16, np.float32), "w": np.arange(10, dtype=np.float32)}
    s3_server.fs().pipe(f"{bucket}/m.apr", aprfast.save(tensors))
    s3_server.reset()
    with aprfast.open(f"s3://{bucket}/m.apr", storage_options=_options(s3_server, way)) as f:
        source = f._source
        etag = source.version[0]
        assert etag and etag.startswith('"')
        assert (source.direct is not None) == (way == "presigned")
        assert way == "presigned" or "requester_pays" in source.direct_off
        calls = []
        real = source.fs._call_s3

        async def spying(method, *args, **kwargs):
            calls.append(method)
            return await real(method, *args, **kwargs)

        monkeypatch.setattr(source.fs, "_call_s3", spying)
        np.testing.assert_array_equal(f.get_tensor("w"), tensors["w"])
        f.verify()
    assert s3_server.count == 4  # open, the tensor, the data from byte 0, the footer
    first, *later = s3_server.details
    assert not _presigned(first) and first["if_match"] is None
    assert all(d["if_match"] == etag for d in later)
    assert all(_presigned(d) == (way == "presigned") for d in later)
    assert calls == ([] if way == "presigned" else ["get_object"] * 3)
    if way == "presigned":
        # Signature Version 4 (botocore would presign with Version 2 in us-east-1, a
        # deprecated signature); the filesystem's own presigning is untouched
        assert all("X-Amz-Algorithm=AWS4-HMAC-SHA256" in d["query"] for d in later)
        assert "AWSAccessKeyId=" in source.fs.url(f"{bucket}/m.apr")


def test_s3_a_refused_presigned_get_falls_back_to_s3fs(s3_server, bucket):
    tensors = {"pad": np.zeros(1 << 16, np.float32), "w": np.arange(10, dtype=np.float32)}
    s3_server.fs().pipe(f"{bucket}/m.apr", aprfast.save(tensors))
    with aprfast.open(f"s3://{bucket}/m.apr", storage_options=s3_server.storage_options) as f:
        s3_server.reset()
        s3_server.refuse_presigned = True  # e.g. a bucket policy refusing query-string auth
        np.testing.assert_array_equal(f.get_tensor("w"), tensors["w"])
        assert s3_server.count == 2  # the refused presigned GET, then s3fs's
        assert [_presigned(d) for d in s3_server.details] == [True, False]
        assert f._source.direct is None and "403" in f._source.direct_off
        s3_server.reset()
        np.testing.assert_array_equal(f.get_tensor("pad"), tensors["pad"])
        assert s3_server.count == 1 and not _presigned(s3_server.details[0])  # s3fs's from then on


def test_s3_a_proxy_sends_the_later_gets_through_s3fs(s3_server, bucket, monkeypatch):
    """http.client would not go through the proxy botocore uses: such a client keeps s3fs."""
    from aprfast.remote import s3

    real = s3._session_settings

    def proxied(client):
        _proxy_for, verify, cert = real(client)
        return (lambda url: "http://proxy.invalid:3128"), verify, cert

    monkeypatch.setattr(s3, "_session_settings", proxied)
    tensors = {"pad": np.zeros(1 << 16, np.float32), "w": np.arange(10, dtype=np.float32)}
    s3_server.fs().pipe(f"{bucket}/m.apr", aprfast.save(tensors))
    with aprfast.open(f"s3://{bucket}/m.apr", storage_options=s3_server.storage_options) as f:
        s3_server.reset()
        np.testing.assert_array_equal(f.get_tensor("w"), tensors["w"])
        assert s3_server.count == 1 and not _presigned(s3_server.details[0])  # nothing sent, then s3fs's
        assert "proxy" in f._source.direct_off


def test_s3_presigned_urls_are_signed_again_after_presign_reuse(s3_server, bucket, monkeypatch):
    from aprfast.remote import s3

    tensors = {"pad": np.zeros(1 << 16, np.float32), "w": np.arange(10, dtype=np.float32)}
    s3_server.fs().pipe(f"{bucket}/m.apr", aprfast.save(tensors))
    signed = []
    real = s3._Direct._presign

    def counting(self):
        signed.append(1)
        return real(self)

    monkeypatch.setattr(s3._Direct, "_presign", counting)
    with aprfast.open(f"s3://{bucket}/m.apr", storage_options=s3_server.storage_options) as f:
        for _ in range(3):
            f.get_tensor("w", copy=True)
        assert len(signed) == 1  # one URL for the three GETs
        monkeypatch.setattr(s3, "PRESIGN_REUSE", -1)  # every URL too old
        for _ in range(2):
            f.get_tensor("w", copy=True)
        assert len(signed) == 3


def _secrets_in(exc, secrets):
    """The secrets found in the text of ``exc`` and of every exception chained to it."""
    found, seen = [], 0
    while exc is not None and seen < 10:
        text = f"{exc} {exc!r}"
        found += [s for s in secrets if s in text]
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return found


def test_s3_errors_never_carry_the_presigned_url_query(s3_server, bucket, monkeypatch):
    import http.client
    import urllib.parse

    from aprfast.remote import http as remote_http

    tensors = {"pad": np.zeros(1 << 16, np.float32), "w": np.arange(10, dtype=np.float32)}
    s3_server.fs().pipe(f"{bucket}/m.apr", aprfast.save(tensors))
    targets = []

    def quoting_send(self, target, headers, clock=None):  # as http.client quotes a request line it refuses
        targets.append(target)
        try:
            raise http.client.InvalidURL(f"URL can't contain control characters. {target!r}")
        except http.client.InvalidURL as exc:
            raise remote_http.TransientError(f"{type(exc).__name__}: {exc}") from None

    with aprfast.open(f"s3://{bucket}/m.apr", storage_options=s3_server.storage_options) as f:
        monkeypatch.setattr(remote_http.Endpoint, "send", quoting_send)
        with pytest.raises(AprIOError) as caught:
            f.get_tensor("w")
    assert len(targets) == 1 + remote.RangedSource.retries
    query = urllib.parse.parse_qs(targets[0].partition("?")[2])
    secrets = [v[0] for k, v in query.items() if "signature" in k.lower() or "credential" in k.lower()
               or "accesskey" in k.lower()] + ["testing"]
    assert len(secrets) >= 2
    assert _secrets_in(caught.value, secrets) == []
    assert f"s3://{bucket}/m.apr" in str(caught.value)

    monkeypatch.undo()
    with aprfast.open(f"s3://{bucket}/m.apr", storage_options=s3_server.storage_options) as f:
        s3_server.status_500 = 100  # never recovers, on the presigned way
        with pytest.raises(AprIOError) as caught:
            f.get_tensor("w")
        assert f._source.direct is not None
    assert _secrets_in(caught.value, ["Signature=", "testing"]) == []


@pytest.mark.parametrize("way", ["presigned", "s3fs"])
@pytest.mark.parametrize("when", ["tensor", "footer"])
def test_s3_object_replaced_after_open_is_refused_by_the_server(s3_server, bucket, when, way):
    first = {"pad": np.zeros(1 << 16, np.float32), "w": np.arange(10, dtype=np.float32)}
    second = {"pad": np.zeros(1 << 16, np.float32), "w": np.arange(10, dtype=np.float32) + 1}
    fs = s3_server.fs()
    fs.pipe(f"{bucket}/m.apr", aprfast.save(first))
    with aprfast.open(f"s3://{bucket}/m.apr", storage_options=_options(s3_server, way)) as f:
        if when == "footer":
            f.get_tensor("w")
        fs.pipe(f"{bucket}/m.apr", aprfast.save(second))  # same length, other bytes
        s3_server.reset()
        with pytest.raises(RemoteChangedError):
            f.get_tensor("w") if when == "tensor" else f.verify()
        assert s3_server.count == 1  # refused at once (412), not retried
        assert _presigned(s3_server.details[0]) == (way == "presigned")


@pytest.mark.parametrize("fault", ["status_500", "drop_mid_body"])
def test_s3_transient_faults_are_retried(s3_server, bucket, fault):
    tensors = {"pad": np.zeros(1 << 16, np.float32), "w": np.arange(1 << 16, dtype=np.float32)}
    s3_server.fs().pipe(f"{bucket}/m.apr", aprfast.save(tensors))
    url, options = f"s3://{bucket}/m.apr", s3_server.storage_options
    with aprfast.open(url, storage_options=options) as f:
        s3_server.reset()
        setattr(s3_server, fault, 1)
        np.testing.assert_array_equal(f.get_tensor("w"), tensors["w"])
        assert s3_server.count == 2  # the failed GET and its retry
    # never recovers: a typed error, not a hang or wrong bytes (botocore retries 5xx itself;
    # 2 attempts here, not its default 5 with seconds of backoff)
    quick = dict(options, config_kwargs={"retries": {"max_attempts": 2, "mode": "standard"}})
    with aprfast.open(url, storage_options=quick) as f:
        s3_server.reset()
        setattr(s3_server, fault, 100)
        with pytest.raises(AprIOError):
            f.get_tensor("pad")
        assert s3_server.count <= 5  # retries are not multiplied layer by layer
    s3_server.reset()
    s3_server.status_500 = 1
    assert aprfast.inspect(url, storage_options=options)["tensors"]["w"]["shape"] == [1 << 16]
    assert s3_server.count == 2


def test_s3_small_and_empty_objects(s3_server, bucket):
    fs = s3_server.fs()
    tensors = {"w": np.arange(7, dtype=np.float32)}
    fs.pipe(f"{bucket}/small.apr", aprfast.save(tensors))
    s3_server.reset()
    with aprfast.open(f"s3://{bucket}/small.apr", storage_options=s3_server.storage_options) as f:
        np.testing.assert_array_equal(f.get_tensor("w"), tensors["w"])
        f.verify()
    assert s3_server.count == 1  # the whole object came with the first GET
    fs.pipe(f"{bucket}/empty.apr", b"")
    with pytest.raises(aprfast.errors.AprError):
        aprfast.open(f"s3://{bucket}/empty.apr", storage_options=s3_server.storage_options)
    with pytest.raises(AprFileNotFoundError):
        aprfast.inspect(f"s3://{bucket}/missing.apr", storage_options=s3_server.storage_options)
    with pytest.raises(AprIOError, match="bucket"):
        aprfast.open(f"s3://{bucket}", storage_options=s3_server.storage_options)


def test_stream_from_s3(s3_server, bucket):
    tensors = _model()
    s3_server.fs().pipe(f"{bucket}/m.apr", aprfast.save(tensors))
    seen = dict(aprfast.stream(f"s3://{bucket}/m.apr", storage_options=s3_server.storage_options))
    assert sorted(seen) == sorted(tensors)
    assert all(seen[k].tobytes() == tensors[k].tobytes() for k in tensors)


def test_s3_a_version_id_goes_into_the_presigned_url(s3_server, bucket):
    """s3://bucket/key?versionId=... reads that version on both ways (the presigned URL
    carries it in its query), not the newest one."""
    import boto3

    boto3.client("s3", endpoint_url=s3_server.endpoint_url, aws_access_key_id="testing",
                 aws_secret_access_key="testing", region_name="us-east-1").put_bucket_versioning(
        Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    options = dict(s3_server.storage_options, version_aware=True)
    first = {"pad": np.zeros(1 << 16, np.float32), "w": np.arange(10, dtype=np.float32)}
    second = {"pad": np.zeros(1 << 16, np.float32), "w": np.arange(10, dtype=np.float32) + 1}
    fs = s3_server.fs()
    fs.pipe(f"{bucket}/m.apr", aprfast.save(first))
    version = s3_server.fs().info(f"{bucket}/m.apr")["VersionId"]
    assert version
    fs.pipe(f"{bucket}/m.apr", aprfast.save(second))
    s3_server.reset()
    with aprfast.open(f"s3://{bucket}/m.apr?versionId={version}", storage_options=options) as f:
        assert f._source.direct is not None
        np.testing.assert_array_equal(f.get_tensor("w"), first["w"])
    assert s3_server.count == 2 and _presigned(s3_server.details[1])
    assert f"versionId={version}" in s3_server.details[1]["query"]


def test_s3_additional_kwargs_keep_the_later_gets_on_s3fs(s3_server, bucket):
    """s3_additional_kwargs become headers of s3fs's requests (SSE-C keys, ...), which a
    presigned URL does not carry: such a filesystem keeps s3fs's client for every GET."""
    tensors = {"pad": np.zeros(1 << 16, np.float32), "w": np.arange(10, dtype=np.float32)}
    s3_server.fs().pipe(f"{bucket}/m.apr", aprfast.save(tensors))
    options = dict(s3_server.storage_options, s3_additional_kwargs={"ChecksumMode": "ENABLED"})
    s3_server.reset()
    with aprfast.open(f"s3://{bucket}/m.apr", storage_options=options) as f:
        assert f._source.direct is None and "s3_additional_kwargs" in f._source.direct_off
        np.testing.assert_array_equal(f.get_tensor("w"), tensors["w"])
    assert s3_server.count == 2 and not any(_presigned(d) for d in s3_server.details)


@pytest.mark.parametrize("verify, cert, proxy, expected", [
    (True, None, None, "https"),                     # botocore's own CA bundle
    ("/etc/my-ca.pem", None, None, "https"),         # a CA bundle given as verify=
    (False, None, None, "TLS checks off"),
    (True, "/etc/client.pem", None, "client certificate"),
    (True, None, "http://proxy.invalid:3128", "proxy"),
])
def test_s3_presigned_https_keeps_the_clients_tls_and_proxy_settings(verify, cert, proxy, expected):
    """http.client must check a server as botocore would, or leave the GET to s3fs."""
    import types
    import urllib.parse

    from botocore.httpsession import get_cert_path

    from aprfast.remote import s3

    session = types.SimpleNamespace(_verify=verify, _cert_file=cert,
                                    _proxy_config=types.SimpleNamespace(proxy_url_for=lambda url: proxy))
    client = types.SimpleNamespace(_endpoint=types.SimpleNamespace(http_session=session),
                                   meta=types.SimpleNamespace(config=types.SimpleNamespace(read_timeout=7)))
    url = "https://bucket.s3.example.invalid/m.apr?X-Amz-Signature=x"
    direct = s3._Direct.__new__(s3._Direct)
    if expected != "https":
        with pytest.raises(s3._Refused, match=expected):
            direct._endpoint_for(urllib.parse.urlsplit(url), client, url)
        return
    endpoint = direct._endpoint_for(urllib.parse.urlsplit(url), client, url)
    assert (endpoint.scheme, endpoint.host, endpoint.port, endpoint.timeout) == ("https", "bucket.s3.example.invalid",
                                                                                 None, 7)
    assert endpoint.cafile == (get_cert_path(True) if verify is True else verify)
