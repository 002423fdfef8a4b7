"""http(s):// models through the native ranged-GET reader, against a real threaded HTTP
server on 127.0.0.1 (tests/servers.py) that counts requests and injects faults."""

import threading

import numpy as np
import pytest
from servers import http_server  # noqa: F401 - the fixture

import aprfast
from aprfast import remote
from aprfast.errors import AprFileNotFoundError, AprIOError, ChecksumError
from aprfast.remote import RemoteChangedError


def _model(n=200, rows=16):
    rng = np.random.default_rng(7)
    return {f"layer.{i:03d}.weight": rng.standard_normal((rows, 8)).astype(np.float32) for i in range(n)}


@pytest.fixture(autouse=True)
def fast_backoff(monkeypatch):
    monkeypatch.setattr(remote.RangedSource, "backoff", 0.001)


def _ranges(server):
    """(first, last) of every single-range request logged, in order (the multi-range
    request that opens a file is left out)."""
    out = []
    for _method, _path, header in server.requests:
        if "," in header:
            continue
        spec = header.split("=", 1)[1]
        a, b = spec.split("-")
        out.append((int(a), int(b)))
    return out


def test_inspect_of_a_200_tensor_model_is_one_request(http_server, tmp_path):
    tensors = _model(200)
    local = tmp_path / "m.apr"
    aprfast.save_file(tensors, local)
    url = http_server.put("m.apr", local.read_bytes())
    info = aprfast.inspect(url)
    assert http_server.count == 1
    assert info == aprfast.inspect(local)
    assert len(info["tensors"]) == 200


def test_a_prefix_larger_than_the_first_read_costs_two_requests(http_server):
    # long names: an index of about 2000 * 150 bytes, far beyond the first 64 KiB
    tensors = {f"{'block.' * 20}{i:05d}": np.full(2, i, np.float32) for i in range(2000)}
    data = aprfast.save(tensors)
    url = http_server.put("big-index.apr", data)
    info = aprfast.inspect(url)
    assert len(info["tensors"]) == 2000
    assert http_server.count == 2
    assert info == aprfast.inspect(data)


def test_get_tensor_on_an_open_handle_is_one_request(http_server):
    tensors = _model(200)
    tensors["big"] = np.arange(1 << 19, dtype=np.float32)  # 2 MiB
    url = http_server.put("m.apr", aprfast.save(tensors))
    with aprfast.open(url) as f:
        assert http_server.count == 1
        for name in ("big", "layer.000.weight", "layer.199.weight"):
            before = http_server.count
            got = f.get_tensor(name)
            assert http_server.count - before <= 1  # 0 when it lies in the first 64 KiB
            assert got.tobytes() == tensors[name].tobytes()
        before = http_server.count
        assert f.keys() == sorted(tensors)
        assert f.metadata == {}
        assert f.info("big").shape == (1 << 19,)
        assert http_server.count == before  # header and index are cached per handle


def test_a_fresh_handle_and_one_tensor_cost_at_most_two_requests(http_server):
    tensors = {"pad": np.zeros(1 << 20, np.float32), "big": np.arange(1 << 19, dtype=np.float32)}
    url = http_server.put("m.apr", aprfast.save(tensors))
    with aprfast.open(url) as f:
        got = f.get_tensor("big")
    assert http_server.count == 2
    np.testing.assert_array_equal(got, tensors["big"])


def test_values_are_bit_identical_to_local_reads(http_server, tmp_path):
    rng = np.random.default_rng(1)
    tensors = {"f16": rng.standard_normal((33, 7)).astype(np.float16), "i8": rng.integers(-128, 127, 999, np.int8),
               "f64": rng.standard_normal(5), "scalar": np.array(3.5, np.float32)}
    local = tmp_path / "m.apr"
    aprfast.save_file(tensors, local)
    url = http_server.put("m.apr", local.read_bytes())
    remote_all = aprfast.load_file(url)
    local_all = aprfast.load_file(local)
    assert sorted(remote_all) == sorted(local_all)
    for name in local_all:
        assert remote_all[name].dtype == local_all[name].dtype
        assert remote_all[name].tobytes() == local_all[name].tobytes()


def test_get_slice_reads_only_the_rows_it_needs(http_server):
    big = np.arange(4096 * 256, dtype=np.float32).reshape(4096, 256)  # 4 MiB, 1 KiB rows
    url = http_server.put("m.apr", aprfast.save({"big": big}))
    with aprfast.open(url) as f:
        http_server.requests.clear()
        part = f.get_slice("big")[100:110, 3:9]
        np.testing.assert_array_equal(part, big[100:110, 3:9])
        [(first, last)] = _ranges(http_server)  # one request: ten nearby runs merged
        assert last - first + 1 <= 10 * 1024
        start = f.info("big").offset
        assert first == start + (100 * 256 + 3) * 4


def test_get_slice_runs_far_apart_are_separate_small_requests(http_server):
    wide = np.arange(8 << 18, dtype=np.float32).reshape(8, 1 << 18)  # rows of 1 MiB
    url = http_server.put("wide.apr", aprfast.save({"wide": wide}))
    with aprfast.open(url) as f:
        http_server.requests.clear()
        part = f.get_slice("wide")[:, 5:7]
        np.testing.assert_array_equal(part, wide[:, 5:7])
    ranges = _ranges(http_server)
    assert len(ranges) == 8  # 1 MiB apart: more than the merge gap
    assert all(b - a + 1 == 8 for a, b in ranges)


def test_load_file_reads_in_parallel_ranged_requests_and_checks_the_crc(http_server):
    tensors = {f"t{i}": np.full(1 << 20, i, np.float32) for i in range(8)}  # 32 MiB
    data = aprfast.save(tensors)
    url = http_server.put("m.apr", data)
    loaded = aprfast.load_file(url)
    for name, value in tensors.items():
        np.testing.assert_array_equal(loaded[name], value)
        assert loaded[name].flags.writeable
    # the open, then the data section (beyond the first 64 KiB) in parts of at least 8 MiB,
    # each byte fetched once
    ranges = sorted(_ranges(http_server))
    assert http_server.count == 1 + len(ranges) and 3 <= len(ranges) <= 8
    assert all(b2 == a1 - 1 for (_a2, b2), (a1, _b1) in zip(ranges, ranges[1:]))
    # the data section's first bytes came with the open (the first 64 KiB): not fetched again
    assert ranges[0][0] == remote.HEAD_BYTES and ranges[-1][1] + 1 >= 32 << 20

    damaged = bytearray(data)
    damaged[len(data) // 2] ^= 0xFF
    bad = http_server.put("bad.apr", bytes(damaged))
    with pytest.raises(ChecksumError):
        aprfast.load_file(bad)
    assert aprfast.load_file(bad, verify=False)["t0"][0] == 0


def test_a_500_is_retried(http_server):
    tensors = {"pad": np.zeros(1 << 16, np.float32), "w": np.arange(1000, dtype=np.float32)}
    url = http_server.put("m.apr", aprfast.save(tensors))
    with aprfast.open(url) as f:
        http_server.faults.status_500 = 1
        before = http_server.count
        np.testing.assert_array_equal(f.get_tensor("w"), tensors["w"])
        assert http_server.count - before == 2


def test_a_500_at_open_is_retried(http_server):
    url = http_server.put("m.apr", aprfast.save(_model(3)))
    http_server.faults.status_500 = 2
    assert len(aprfast.inspect(url)["tensors"]) == 3
    assert http_server.count == 3


def test_persistent_5xx_is_a_typed_error(http_server):
    url = http_server.put("m.apr", aprfast.save({"pad": np.zeros(1 << 16, np.float32), "w": np.ones(9)}))
    with aprfast.open(url) as f:
        http_server.faults.status_500 = 100
        with pytest.raises(AprIOError, match="attempts"):
            f.get_tensor("w")


def test_a_connection_dropped_mid_body_resumes(http_server):
    tensors = {"pad": np.zeros(1 << 16, np.float32), "w": np.arange(1 << 18, dtype=np.float32)}
    url = http_server.put("m.apr", aprfast.save(tensors))
    with aprfast.open(url) as f:
        http_server.faults.drop_mid_body = 1
        http_server.requests.clear()
        np.testing.assert_array_equal(f.get_tensor("w"), tensors["w"])
        (a1, b1), (a2, b2) = _ranges(http_server)
        assert b1 == b2 and a1 < a2 <= b1  # the second request asks only for what was missing


def test_a_connection_dropped_at_open_is_retried(http_server):
    url = http_server.put("m.apr", aprfast.save(_model(5)))
    http_server.faults.drop_mid_body = 1
    assert len(aprfast.inspect(url)["tensors"]) == 5


def test_a_server_that_ignores_range_is_refused_for_a_large_object(http_server):
    url = http_server.put("m.apr", aprfast.save({"w": np.zeros(1 << 17, np.float32)}))
    http_server.faults.ignore_range = True
    with pytest.raises(AprIOError, match="ignores Range"):
        aprfast.open(url)


def test_a_server_that_ignores_range_serves_a_small_object_whole(http_server):
    tensors = {"w": np.arange(100, dtype=np.float32)}
    url = http_server.put("small.apr", aprfast.save(tensors))
    http_server.faults.ignore_range = True
    with aprfast.open(url) as f:
        np.testing.assert_array_equal(f.get_tensor("w"), tensors["w"])
    assert http_server.count == 1


@pytest.mark.parametrize("layout", ["aprender", "apr2"])
def test_a_server_without_multi_range_sends_the_footer_only_when_it_is_needed(http_server, layout):
    tensors = {"pad": np.zeros(1 << 16, np.float32), "w": np.arange(10, dtype=np.float32)}
    url = http_server.put("m.apr", aprfast.save(tensors, layout=layout))
    http_server.faults.no_multi_range = True
    info = aprfast.inspect(url)
    assert len(info["tensors"]) == 2
    assert http_server.count == 1  # the first bytes only: inspect needs no footer
    http_server.reset()
    http_server.faults.no_multi_range = True
    with aprfast.open(url) as f:
        np.testing.assert_array_equal(f.get_tensor("w"), tensors["w"])
        assert http_server.count == 2  # open, then the tensor
        f.verify()  # the footer now: the last 64 bytes, once
        assert http_server.requests[-1][2] == f"bytes={len(aprfast.save(tensors, layout=layout)) - 64}-" \
            f"{len(aprfast.save(tensors, layout=layout)) - 1}"
        n = http_server.count
        f.verify()
        assert http_server.count - n == 1  # the data again, the footer is kept
    http_server.reset()
    http_server.faults.no_multi_range = True
    loaded = aprfast.load_file(url)
    assert loaded["w"].tobytes() == tensors["w"].tobytes()
    assert http_server.count == 3  # open, the data section, the footer


@pytest.mark.parametrize("layout", ["aprender", "apr2"])
def test_a_damaged_footer_fetched_late_is_still_refused(http_server, layout):
    tensors = {"pad": np.zeros(1 << 16, np.float32), "w": np.arange(10, dtype=np.float32)}
    data = bytearray(aprfast.save(tensors, layout=layout))
    data[-3] ^= 0xFF  # the CRC (aprender) or the footer's declared size (apr2)
    url = http_server.put("bad-footer.apr", bytes(data))
    http_server.faults.no_multi_range = True
    with aprfast.open(url) as f:  # the footer is not read at open
        np.testing.assert_array_equal(f.get_tensor("w"), tensors["w"])
        with pytest.raises((aprfast.errors.ChecksumError, aprfast.errors.CorruptError)):
            f.verify()
    with pytest.raises((aprfast.errors.ChecksumError, aprfast.errors.CorruptError)):
        aprfast.load_file(url)


def test_range_ignored_after_open_is_refused(http_server):
    tensors = {"pad": np.zeros(1 << 16, np.float32), "w": np.arange(10, dtype=np.float32)}
    url = http_server.put("m.apr", aprfast.save(tensors))
    with aprfast.open(url) as f:
        http_server.faults.ignore_range = True
        with pytest.raises(AprIOError, match="ignored the Range"):
            f.get_tensor("w")


def test_an_object_changed_between_requests_is_an_error(http_server):
    first = {"pad": np.zeros(1 << 16, np.float32), "w": np.arange(10, dtype=np.float32)}
    second = {"pad": np.ones(1 << 16, np.float32), "w": -np.arange(10, dtype=np.float32)}
    url = http_server.put("m.apr", aprfast.save(first))
    with aprfast.open(url) as f:
        http_server.put("m.apr", aprfast.save(second))
        with pytest.raises(RemoteChangedError, match="changed"):
            f.get_tensor("w")
    assert isinstance(RemoteChangedError("x"), AprIOError)


def test_an_object_changed_during_load_file_is_never_mixed(http_server):
    first = {f"t{i}": np.full(1 << 20, i, np.float32) for i in range(6)}
    second = {f"t{i}": np.full(1 << 20, -i, np.float32) for i in range(6)}
    url = http_server.put("m.apr", aprfast.save(first))
    http_server.faults.change_after = ("/m.apr", 2, aprfast.save(second))
    with pytest.raises(RemoteChangedError):
        aprfast.load_file(url)


def test_a_lying_total_length_at_open_is_refused(http_server):
    url = http_server.put("m.apr", aprfast.save(_model(3)))
    http_server.faults.lie_total = 1 << 50
    with pytest.raises(AprIOError):
        aprfast.open(url)


def test_a_lying_total_length_after_open_is_refused(http_server):
    tensors = {"pad": np.zeros(1 << 16, np.float32), "w": np.arange(10, dtype=np.float32)}
    url = http_server.put("m.apr", aprfast.save(tensors))
    with aprfast.open(url) as f:
        http_server.faults.lie_total = (1 << 50)
        with pytest.raises(RemoteChangedError, match="bytes long"):
            f.get_tensor("w")


def test_a_lying_content_length_allocates_nothing_and_is_refused(http_server):
    tensors = {"pad": np.zeros(1 << 16, np.float32), "w": np.arange(10, dtype=np.float32)}
    url = http_server.put("m.apr", aprfast.save(tensors))
    with aprfast.open(url) as f:
        http_server.faults.lie_length = True
        with pytest.raises(AprIOError, match="Content-Length"):
            f.get_tensor("w")
    http_server.faults.lie_length = True
    with pytest.raises(AprIOError):
        aprfast.open(url)


def test_a_missing_object_is_file_not_found(http_server):
    with pytest.raises(AprFileNotFoundError) as info:
        aprfast.open(http_server.url("nothing-here.apr"))
    assert isinstance(info.value, FileNotFoundError)
    assert info.value.code == "E007"


def test_an_empty_object_is_a_format_error(http_server):
    url = http_server.put("empty.apr", b"")
    with pytest.raises(aprfast.errors.FormatError):
        aprfast.open(url)


def test_many_threads_share_one_handle(http_server):
    tensors = {f"t{i}": np.full(1 << 14, i, np.float32) for i in range(32)}
    url = http_server.put("m.apr", aprfast.save(tensors))
    errors = []
    with aprfast.open(url) as f:
        def work(k):
            try:
                for i in range(k, 32, 4):
                    assert f.get_tensor(f"t{i}")[0] == i
            except BaseException as exc:  # noqa: BLE001
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not errors


def test_a_closed_handle_refuses_reads(http_server):
    url = http_server.put("m.apr", aprfast.save({"pad": np.zeros(1 << 16, np.float32), "w": np.ones(3)}))
    f = aprfast.open(url)
    f.close()
    with pytest.raises(AprIOError, match="closed"):
        f.get_tensor("w")


def test_stream_reads_a_url_front_to_back(http_server):
    tensors = _model(20)
    url = http_server.put("m.apr", aprfast.save(tensors))
    seen = {name: value for name, value in aprfast.stream(url)}
    assert sorted(seen) == sorted(tensors)
    for name in tensors:
        assert seen[name].tobytes() == tensors[name].tobytes()


def test_storage_options_headers_reach_the_server(http_server):
    url = http_server.put("m.apr", aprfast.save(_model(2)))
    f = aprfast.open(url, storage_options={"headers": {"Authorization": "Bearer t"}, "connections": 2})
    with f:
        assert f._source.connections == 2
        assert f._source._headers == {"Authorization": "Bearer t"}


def test_kept_alive_connections_the_server_closed_are_replaced(http_server):
    tensors = {"pad": np.zeros(1 << 16, np.float32), "w": np.arange(10, dtype=np.float32)}
    url = http_server.put("m.apr", aprfast.save(tensors))
    with aprfast.open(url) as f:
        f._source.retries = 0  # a stale connection must not need a retry
        f.get_tensor("w")
        idle = list(f._source._idle.queue)
        assert idle
        for conn in idle:  # what a server's idle timeout does
            conn.sock.shutdown(2)
        np.testing.assert_array_equal(f.get_tensor("w", copy=True), tensors["w"])


def test_merged_slice_requests_stay_bounded(http_server):
    # a column of a 16 MiB tensor: runs 16 KiB apart would merge into one request of the
    # whole tensor; requests stop at 8 MiB, so its temporary buffer does too
    tall = np.arange(1024 * 4096, dtype=np.float32).reshape(1024, 4096)
    url = http_server.put("tall.apr", aprfast.save({"tall": tall}))
    with aprfast.open(url) as f:
        http_server.requests.clear()
        np.testing.assert_array_equal(f.get_slice("tall")[:, 7], tall[:, 7])
    ranges = _ranges(http_server)
    assert 2 <= len(ranges) <= 4
    assert all(b - a + 1 <= remote.PART_BYTES for a, b in ranges)


def test_a_lying_total_with_single_ranges_is_refused(http_server):
    url = http_server.put("m.apr", aprfast.save(_model(3)))
    http_server.faults.no_multi_range = True
    http_server.faults.lie_total = 1 << 50
    with pytest.raises(aprfast.errors.AprError):
        aprfast.open(url)


def test_many_handles_reuse_kept_alive_connections(http_server):
    url = http_server.put("m.apr", aprfast.save(_model(20)))
    aprfast.inspect(url)
    http_server.reset()
    for _ in range(30):
        with aprfast.open(url) as f:
            assert f.get_tensor("layer.003.weight").shape == (16, 8)
    assert http_server.count == 30
    assert http_server.connections <= 1


def test_a_drop_during_a_parallel_load_is_resumed_and_the_crc_still_holds(http_server):
    tensors = {f"t{i}": np.full(1 << 20, i, np.float32) for i in range(6)}  # 24 MiB: parallel parts
    url = http_server.put("m.apr", aprfast.save(tensors))
    with aprfast.open(url) as f:
        http_server.faults.drop_mid_body = 2
        loaded = f.load_all()
    for name, value in tensors.items():
        np.testing.assert_array_equal(loaded[name], value)


def test_persistent_5xx_at_open_is_a_typed_error(http_server):
    url = http_server.put("m.apr", aprfast.save(_model(2)))
    http_server.faults.status_500 = 100
    with pytest.raises(AprIOError, match="attempts"):
        aprfast.open(url)
    assert http_server.count == remote.RangedSource.retries + 1


@pytest.mark.parametrize("body", [
    b"no boundary at all",
    b"--B\r\nContent-Range: bytes 0-9/100\r\n\r\nshort",                       # part longer than the body
    b"--B\r\nContent-Type: x\r\n\r\n0123456789\r\n--B--\r\n",                 # part without Content-Range
    b"--B\r\nContent-Range: bytes 9-0/100\r\n\r\n0123456789\r\n--B--\r\n",     # backwards range
    b"--B\r\nContent-Range: bytes 0-1/100",                                    # headers never end
])
def test_malformed_multipart_answers_are_typed_errors(body):
    from aprfast.remote.http import _split_multipart

    with pytest.raises(AprIOError):
        _split_multipart(body, b"B", "http://127.0.0.1/x")


def test_a_well_formed_multipart_answer_splits_by_content_range():
    from aprfast.remote.http import _split_multipart

    body = (b"--B\r\nContent-Range: bytes 0-3/10\r\n\r\n--B-\r\n"   # the data looks like a boundary
            b"--B\r\ncontent-range: bytes 8-9/10\r\n\r\nxy\r\n--B--\r\n")
    assert _split_multipart(body, b"B", "u") == [(0, 3, 10, b"--B-"), (8, 9, 10, b"xy")]


def test_empty_tensors_cost_no_request(http_server):
    # the empty tensor lies between two large ones: neither in the first nor in the last bytes
    tensors = {"a_big": np.arange(1 << 17, dtype=np.float32), "z_empty": np.zeros((0, 4), np.float32),
               "zz_big": np.ones(1 << 17, np.float32)}
    data = aprfast.save(tensors)
    url = http_server.put("m.apr", data)
    with aprfast.open(url) as f:
        before = http_server.count
        assert f.get_tensor("z_empty").shape == (0, 4)
        assert f.get_slice("z_empty")[:, 1:2].shape == (0, 1)
        assert http_server.count == before
    loaded = aprfast.load_file(url)
    assert loaded["z_empty"].shape == (0, 4)
    np.testing.assert_array_equal(loaded["a_big"], tensors["a_big"])


def test_reads_overlapping_the_cached_first_and_last_bytes_fetch_only_the_rest(http_server):
    """The first 64 KiB and last 64 bytes came with the open: a read across them copies
    those parts and asks only for the bytes between, and its CRC is over all of it."""
    import zlib

    data = np.random.default_rng(5).integers(0, 256, 300_000, dtype=np.uint8).tobytes()
    url = http_server.put("blob.bin", data)
    source = remote.open_url(url)
    try:
        size, head = source.size, remote.HEAD_BYTES
        cases = [(0, size), (100, head), (head - 10, 30), (1000, size - 1000 - 20), (size - 200, 180),
                 (size - 64, 64), (head, size - head - 64), (head + 5, 1000)]
        for offset, n in cases:
            http_server.reset()
            out = bytearray(n)
            crc = source.readinto(offset, out, crc=0)
            assert bytes(out) == data[offset:offset + n] and crc == zlib.crc32(data[offset:offset + n])
            asked = _ranges(http_server)
            fetched = sum(b - a + 1 for a, b in asked)
            outside = max(0, min(offset + n, size - 64) - max(offset, head))
            assert fetched == outside, (offset, n, asked)
    finally:
        source.close()
