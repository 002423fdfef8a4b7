"""A plain v1 file (bytes payload, not compressed, encrypted or signed) loaded from a
path is read once with pread straight into the bytes returned, its CRC32 computed on
the way (v1.load._load_read), instead of mapping the file, checksumming the map and copying
the payload out (issue 9: v1 plain load).  Whatever the bytes, it must answer exactly as
the full path does: the same payload, or the same error, in the same order of checks.
Also the save side: an uncompressed payload is not copied first, and a save that is
not fsynced reserves its blocks (v1.writer._reserve) and still leaves nothing when it fails."""

import errno
import os
import zlib

import numpy as np
import pytest

from aprfast import _memory, v1
from aprfast.errors import AprError, AprIOError, ChecksumError
from aprfast.layouts import v1 as layout

META = {"created_at": "1", "aprender_version": "0.0"}


def _outcome(fn):
    try:
        model = fn()
    except AprError as exc:
        return type(exc), exc.message
    return (type(model.payload), bytes(model.payload), model.header, model.metadata, model.signature,
            model.encryption, model.flags, model.license)


def _both(path, **kwargs):
    """(outcome from the path: the read path, outcome from the bytes: the full path)."""
    with open(path, "rb") as f:
        data = f.read()
    return _outcome(lambda: v1.load_model(path, **kwargs)), _outcome(lambda: v1.load_model(data, **kwargs))


def _refix_crc(data: bytearray) -> bytearray:
    data[-4:] = zlib.crc32(data[:-4]).to_bytes(4, "little")
    return data


def test_the_read_path_is_taken_and_gives_bytes(tmp_path, monkeypatch):
    path = tmp_path / "m.apr"
    payload = os.urandom(3 << 20)
    v1.save_model(payload, path, model_type="Custom", metadata=META)
    calls = []
    real = v1.load._load_read
    monkeypatch.setattr(v1.load, "_load_read", lambda *a: calls.append(real(*a)) or calls[-1])
    model = v1.load_model(path)
    assert calls and calls[0] is model
    assert type(model.payload) is bytes and model.payload == payload
    # nothing maps the file on this path: the source's map was never made
    monkeypatch.setattr(v1.load, "whole_file", lambda src: pytest.fail("the file was mapped"))
    assert v1.load_model(path).payload == payload


# Sizes around the 16 KiB first read, the 1 MiB pread chunk, the 8 MiB split between
# threads and the 32 MiB huge-page threshold.
@pytest.mark.parametrize("size", [0, 1, 16 << 10, (16 << 10) + 1, (1 << 20) + 3, (8 << 20) + 1, (32 << 20) + 4097])
def test_every_size_loads_as_the_full_path_does(tmp_path, size):
    path = tmp_path / "m.apr"
    payload = np.random.default_rng(size).bytes(size)
    v1.save_model(payload, path, model_type="Custom", metadata=META)
    fast, full = _both(path)
    assert fast == full and fast[1] == payload


def test_metadata_beyond_the_first_read_and_a_license(tmp_path):
    path = tmp_path / "m.apr"
    meta = {**META, "description": "x" * (40 << 10)}  # the header and metadata need a second read
    v1.save_model(b"payload" * 1000, path, model_type="Custom", metadata=meta)
    fast, full = _both(path)
    assert fast == full and fast[3]["description"] == meta["description"]


@pytest.mark.parametrize("size", [100, 100_000])
def test_hostile_files_answer_as_the_full_path(tmp_path, size):
    """Every byte of the header, bytes of the metadata and payload, and the CRC, each
    flipped (with and without the CRC fixed after it), truncations and extensions: the
    read path gives the full path's payload or error for every one."""
    good = bytearray(v1.save_model(os.urandom(size), None, model_type="Custom", metadata=META))
    meta_end = layout.HEADER_SIZE + int.from_bytes(good[8:12], "little")
    spots = list(range(layout.HEADER_SIZE)) + [layout.HEADER_SIZE, meta_end - 1, meta_end, len(good) - 5,
                                               len(good) - 1]
    variants = []
    for at in spots:
        for bit in (0x01, 0x80):
            bad = bytearray(good)
            bad[at] ^= bit
            variants.append(bytes(bad))
            if at < len(good) - 4:
                variants.append(bytes(_refix_crc(bad)))
    variants += [bytes(good[:n]) for n in (0, 3, 4, 35, meta_end, len(good) - 1)]
    variants += [bytes(_refix_crc(bytearray(good[:-4]) + b"\0" * 5)), bytes(good) + b"\0"]
    path = tmp_path / "m.apr"
    for data in variants:
        path.write_bytes(data)
        fast, full = _both(path)
        assert fast == full, data[:40]
    path.write_bytes(good)
    for kwargs in ({"expected_type": "LinearRegression"}, {"password": "pw"}, {"trusted_keys": [bytes(32)]},
                   {"max_uncompressed": size - 1}, {"password": "pw", "allow_unencrypted": True}):
        fast, full = _both(path, **kwargs)
        assert fast == full, kwargs


def test_a_crc_mismatch_is_reported_by_the_full_path(tmp_path):
    path = tmp_path / "m.apr"
    data = bytearray(v1.save_model(os.urandom(50_000), None, model_type="Custom", metadata=META))
    data[30_000] ^= 1
    path.write_bytes(data)
    with pytest.raises(ChecksumError, match="CRC32 stored in the last 4 bytes"):
        v1.load_model(path)


@pytest.mark.parametrize("kind", ["zstd", "signed", "tensors", "password"])
def test_other_files_take_the_full_path(tmp_path, kind):
    from aprfast.crypto import core as crypto

    path = tmp_path / "m.apr"
    if kind == "tensors":
        v1.save_model({"w": np.arange(10.0)}, path, metadata=META)
    else:
        kwargs = {"zstd": {"compression": "zstd"}, "signed": {"signing_key": crypto.generate_signing_key()[0]},
                  "password": {"password": "pw"}}[kind]
        v1.save_model(b"abc" * 1000, path, model_type="Custom", metadata=META, **kwargs)
    src = v1.open_source(path)
    try:
        assert v1.load._load_read(src, None, None, None, None, False, v1.MAX_UNCOMPRESSED_SIZE, True) is None
    finally:
        src.close()


def test_pread_to_bytes_matches_its_pure_twin(tmp_path):
    from aprfast._pure import _memory as pure

    data = os.urandom((33 << 20) + 5)
    path = tmp_path / "f"
    path.write_bytes(data)
    fd = os.open(path, os.O_RDONLY)
    try:
        for mod in (_memory, pure):
            got, crc = mod.pread_to_bytes(fd, 7, len(data) - 7, 0, 5)
            assert type(got) is bytes and got == data[7:] and crc == zlib.crc32(data[7:], 5)
            assert mod.pread_to_bytes(fd, 3, 10) == (data[3:13], None)
            assert mod.pread_to_bytes(fd, 0, 0, crc=0) == (b"", 0)
            with pytest.raises(EOFError):
                mod.pread_to_bytes(fd, len(data) - 2, 3)
            with pytest.raises(ValueError):
                mod.pread_to_bytes(fd, 0, -1)
            with pytest.raises(OverflowError):
                mod.pread_to_bytes(fd, -1, 1)
    finally:
        os.close(fd)


# --- saving --------------------------------------------------------------------------
@pytest.mark.parametrize("password", [None, "pw"])
@pytest.mark.parametrize("durable", [False, True])
@pytest.mark.parametrize("kind", ["bytes", "bytearray", "ndarray"])
def test_saved_files_are_the_in_memory_bytes(tmp_path, monkeypatch, password, durable, kind):
    import functools

    from aprfast.crypto import core as crypto

    monkeypatch.setattr(crypto, "password_sealing",
                        functools.partial(crypto.password_sealing, salt=bytes(16), nonce=bytes(12)))
    raw = os.urandom((4 << 20) + 17)
    value = {"bytes": raw, "bytearray": bytearray(raw), "ndarray": np.frombuffer(raw[:-1], np.int16)}[kind]
    path = tmp_path / "m.apr"
    v1.save_model(value, path, model_type="Custom", metadata=META, password=password, durable=durable)
    expected = v1.save_model(value, None, model_type="Custom", metadata=META, password=password)
    assert path.read_bytes() == expected
    assert bytes(v1.load_model(path, password=password).payload) == bytes(memoryview(value).cast("B"))


@pytest.mark.parametrize("password", [None, "pw"])
def test_a_full_disk_at_reservation_leaves_nothing(tmp_path, monkeypatch, password):
    from aprfast.io import atomic

    monkeypatch.setattr(atomic, "preallocate", lambda fd, size: errno.ENOSPC)
    with pytest.raises(AprIOError, match="No space"):
        v1.save_model(os.urandom(1 << 20), tmp_path / "m.apr", model_type="Custom", password=password,
                      durable=False)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("password", [None, "pw"])
def test_a_failure_mid_save_leaves_nothing(tmp_path, monkeypatch, password):
    calls = []

    def failing(fd, data):
        calls.append(len(data))
        if len(calls) == 3:
            raise OSError(errno.EIO, "Input/output error")
        os.write(fd, bytes(data))

    monkeypatch.setattr(v1.writer, "_write_all", failing)
    with pytest.raises(AprIOError, match="Input/output"):
        v1.save_model(os.urandom(9 << 20), tmp_path / "m.apr", model_type="Custom", password=password,
                      durable=False)
    assert os.listdir(tmp_path) == []


def test_the_reservation_is_the_file_size(tmp_path, monkeypatch):
    from aprfast.io import atomic

    sizes = []
    real = atomic.preallocate
    monkeypatch.setattr(atomic, "preallocate", lambda fd, size: sizes.append(size) or real(fd, size))
    for password in (None, "pw"):
        path = tmp_path / f"m{password}.apr"
        v1.save_model(os.urandom(100_000), path, model_type="Custom", password=password, durable=False)
        assert sizes[-1] == os.path.getsize(path)
    v1.save_model(os.urandom(1000), tmp_path / "d.apr", model_type="Custom", durable=True)
    assert len(sizes) == 2  # durable saves do not reserve (see aprfast.io.atomic.reserve_blocks)


@pytest.mark.parametrize("forced", [0, 1, 2])
def test_every_thread_count_reads_the_same(tmp_path, monkeypatch, forced):
    monkeypatch.setattr(v1.load, "_READ_THREADS", forced)
    path = tmp_path / "m.apr"
    payload = os.urandom((9 << 20) + 3)
    v1.save_model(payload, path, model_type="Custom", metadata=META)
    assert v1.load_model(path).payload == payload
    v1.save_model(payload, path, model_type="Custom", metadata=META, password="pw")
    assert v1.load_model(path, password="pw").payload == payload


def test_the_thread_count_is_left_to_the_idle_core_rule(monkeypatch):
    # 0: pread_into's default, which counts the cores idle at the call (csrc/parallel.h)
    monkeypatch.setattr(v1.load, "_READ_THREADS", None)
    assert v1.load._read_threads() == 0


def test_password_files_answer_as_the_full_path(tmp_path):
    """The one-read password load (ciphertext read into the bytearray it is decrypted
    in) gives the full path's payload or error for altered files, wrong passwords and
    arguments the file refutes; its plaintext is a bytearray, the tag cut off."""
    value = os.urandom(70_000)
    good = bytearray(v1.save_model(value, None, model_type="Custom", metadata=META, password="pw"))
    path = tmp_path / "m.apr"
    path.write_bytes(good)
    model = v1.load_model(path, password="pw")
    assert type(model.payload) is bytearray and model.payload == value and model.encryption == "password"
    start = layout.HEADER_SIZE + int.from_bytes(good[8:12], "little")
    spots = [4, 6, 8, 12, 16, 20, 21, start, start + 15, start + 16, start + 27, start + 28, start + 5000,
             len(good) - 21, len(good) - 20, len(good) - 5, len(good) - 1]
    variants = []
    for at in spots:
        bad = bytearray(good)
        bad[at] ^= 0x01
        variants.append(bytes(bad))
        if at < len(good) - 4:
            variants.append(bytes(_refix_crc(bad)))
    variants += [bytes(good[:-1]), bytes(good[:start + 30])]
    for data in variants:
        path.write_bytes(data)
        fast, full = _both(path, password="pw")
        assert fast == full, data[:40]
    path.write_bytes(good)
    for kwargs in ({"password": "wrong"}, {"password": b"pw"}, {"password": 123},
                   {"password": "pw", "expected_type": 1},
                   {"password": "pw", "trusted_keys": [bytes(32)]}, {"password": "pw", "max_uncompressed": 100}, {}):
        try:
            fast, full = _both(path, **kwargs)
        except TypeError as exc:  # not an AprError: both paths must raise it alike
            with pytest.raises(type(exc), match=str(exc)[:20]):
                v1.load_model(bytes(good), **kwargs)
            continue
        assert fast == full, kwargs


def test_a_tensor_payload_decrypted_in_its_buffer(tmp_path):
    tensors = {"w": np.arange(300_000, dtype=np.float32).reshape(600, 500), "b": np.ones(7, np.int8)}
    path = tmp_path / "t.apr"
    v1.save_model(tensors, path, metadata=META, password="pw", compression="lz4")
    got = v1.load_model(path, password="pw").payload
    for name, array in tensors.items():
        np.testing.assert_array_equal(got[name], array)
    v1.save_model(tensors, path, metadata=META, password="pw")
    got = v1.load_model(path, password="pw").payload
    np.testing.assert_array_equal(got["w"], tensors["w"])
