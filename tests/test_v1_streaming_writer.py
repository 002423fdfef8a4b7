"""The v1 STREAMING writer to a path or file object goes chunk by chunk through a spool
file: the bytes are exactly those of the in-memory writer (``save_model(..., None)``)
for every codec, chunk size, signature and encryption, and its peak memory is a few
chunks, not the payload (measured in a child process)."""

import io
import itertools
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import pytest

import aprfast
from aprfast import v1
from aprfast.crypto import core as crypto

METADATA = {"created_at": "1700000000", "aprender_version": "0.1.0", "model_name": "s"}
SEED = bytes(range(32))


def tensors():
    rng = np.random.default_rng(7)
    return {"emb": rng.standard_normal((300, 257)).astype(np.float32),  # 308,400 bytes: 5 chunks of 64 KiB
            "ramp": np.arange(20_000, dtype=np.int32), "tiny": np.array([1.5], np.float16),
            "empty": np.zeros((0, 3), np.float32)}


def save(target, **options):
    return v1.save_model(tensors(), target, metadata=METADATA, streaming=True, **options)


@pytest.mark.parametrize("compression,chunk_size", [("zstd", 4096), ("zstd", 65536), ("zstd", None),
                                                    ("lz4", 4096), ("lz4", None), ("zstd-max", None)])
@pytest.mark.parametrize("signed", [False, True])
def test_spooled_bytes_equal_the_in_memory_writer(tmp_path, compression, chunk_size, signed):
    options = dict(compression=compression, chunk_size=chunk_size, signing_key=SEED if signed else None)
    expected = save(None, **options)
    save(tmp_path / "m.apr", **options)
    assert (tmp_path / "m.apr").read_bytes() == expected
    sink = io.BytesIO()
    save(sink, **options)
    assert sink.getvalue() == expected
    loaded = v1.load_model(tmp_path / "m.apr", trusted_keys=[crypto.public_key_of(SEED)] if signed else None)
    for name, want in tensors().items():
        np.testing.assert_array_equal(loaded.payload[name], want)


@pytest.fixture
def fixed_randomness(monkeypatch):
    """os.urandom made repeatable, so two encrypted saves can be compared byte for byte."""
    counter = itertools.count()

    def urandom(n):
        return bytes((next(counter) * 7 + i) & 0xFF for i in range(n))

    def reset():
        nonlocal counter
        counter = itertools.count()

    monkeypatch.setattr(os, "urandom", urandom)
    return reset


@pytest.mark.parametrize("compression", ["none", "zstd"])
@pytest.mark.parametrize("signed", [False, True])
def test_sealed_spooled_bytes_equal_the_in_memory_writer(tmp_path, fixed_randomness, compression, signed):
    alice_secret, alice_public = crypto.generate_x25519_key()
    options = dict(compression=compression, chunk_size=65536, recipient=alice_public,
                   signing_key=SEED if signed else None)
    fixed_randomness()
    expected = save(None, **options)
    fixed_randomness()
    save(tmp_path / "m.apr", **options)
    data = (tmp_path / "m.apr").read_bytes()
    assert data == expected
    assert tensors()["emb"].tobytes()[:64] not in data  # sealed, not stored in the clear
    with aprfast.open(tmp_path / "m.apr", private_key=alice_secret) as f:
        for name, want in tensors().items():
            np.testing.assert_array_equal(f.get_tensor(name), want)
        f.verify()


def test_password_sealed_file_reads_back(tmp_path):
    save(tmp_path / "m.apr", compression="lz4", chunk_size=8192, password="pw", signing_key=SEED)
    model = v1.load_model(tmp_path / "m.apr", password="pw", trusted_keys=[crypto.public_key_of(SEED)])
    assert model.encryption == "password" and model.signature == v1.TRUSTED
    for name, want in tensors().items():
        np.testing.assert_array_equal(model.payload[name], want)


def test_a_failing_save_leaves_no_file(tmp_path, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("codec failed")

    monkeypatch.setattr(v1.writer.codecs, "compress", broken)
    with pytest.raises(RuntimeError, match="codec failed"):
        save(tmp_path / "m.apr", compression="zstd")
    assert not (tmp_path / "m.apr").exists()


_PEAK_CHILD = """
import json, sys
import numpy as np
from aprfast import crypto, v1

def status(key):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key + ":"))

rng = np.random.default_rng(0)
# 64 MiB of float32 noise: zstd barely shrinks it, so holding every chunk would cost ~64 MiB
model = {f"t{i:02d}": rng.standard_normal(1 << 20).astype(np.float32) for i in range(16)}
_, public = crypto.generate_x25519_key()
options = dict(streaming=True, compression="zstd", chunk_size=1 << 20, recipient=public,
               metadata={"created_at": "1", "aprender_version": "0.1.0"})
v1.save_model({"w": np.ones(4, np.float32)}, sys.argv[1], **options)  # codecs and crypto loaded
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # VmHWM := current RSS
base = status("VmRSS")
v1.save_model(model, sys.argv[1], **options)
print(json.dumps({"grown": status("VmHWM") - base, "size": sum(t.nbytes for t in model.values())}))
"""


@pytest.mark.peak_memory
def test_peak_memory_is_a_few_chunks(tmp_path):
    package_parent = os.path.dirname(os.path.dirname(os.path.abspath(aprfast.__file__)))
    # glibc returns large frees to the system at once, so RSS shows what is really held
    env = dict(os.environ, PYTHONPATH=package_parent, MALLOC_MMAP_THRESHOLD_=str(128 << 10))
    done = subprocess.run([sys.executable, "-c", _PEAK_CHILD, str(tmp_path / "m.apr")], env=env,
                          cwd=tempfile.gettempdir(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["size"] == 64 << 20
    # a chunk in, its compressed and its sealed copy, the copy buffer (8 MiB): well under 24 MiB
    assert report["grown"] < 24 << 20, f"peak RSS grew {report['grown'] / 2**20:.1f} MiB for a 64 MiB payload"
    assert os.path.getsize(tmp_path / "m.apr") > 48 << 20  # noise: zstd keeps most of it


def test_a_spool_that_cannot_be_written_is_an_io_error(tmp_path, monkeypatch):
    from aprfast.errors import AprIOError

    def full(fd, data):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(v1.writer, "_write_all", full)
    with pytest.raises(AprIOError, match="spooling the chunks.*No space left"):
        save(tmp_path / "m.apr", compression="zstd")
    assert not (tmp_path / "m.apr").exists()
