"""A password-encrypted v1 file is decrypted in place, in a private copy-on-write map of
the file: the process holds the payload once, and the file is never written (issue 9)."""

import json
import os

import numpy as np
import pytest

import aprfast
from aprfast import v1
from aprfast.crypto import core as crypto
from aprfast.errors import DecryptError


def test_in_place_decrypt_round_trips_and_refuses_a_wrong_password():
    blob = bytearray(crypto.encrypt_with_password(b"secret weights" * 1000, "pw"))
    plain = crypto.decrypt_with_password_in_place(blob, "pw")
    assert bytes(plain) == b"secret weights" * 1000
    blob = bytearray(crypto.encrypt_with_password(b"x" * 100, "pw"))
    with pytest.raises(DecryptError):
        crypto.decrypt_with_password_in_place(blob, "wrong")
    with pytest.raises(ValueError, match="writable"):
        crypto.decrypt_with_password_in_place(bytes(blob), "pw")


@pytest.mark.parametrize("payload", ["bytes", "tensors"])
def test_the_file_is_never_written_and_results_are_the_plaintext(tmp_path, payload):
    path = tmp_path / "m.apr"
    if payload == "bytes":
        value = os.urandom(300_000)
        v1.save_model(value, path, model_type="Custom", password="pw")
    else:
        value = {"w": np.arange(100_000, dtype=np.float32)}
        v1.save_model(value, path, password="pw")
    before = path.read_bytes()
    model = v1.load_model(path, password="pw")
    if payload == "bytes":
        assert bytes(model.payload) == value
        model.payload[:4] = b"\0\0\0\0"  # the caller may wipe it; the file stays as it was
    else:
        np.testing.assert_array_equal(model.payload["w"], value["w"])
        model.payload["w"][:] = 0
    assert path.read_bytes() == before
    with pytest.raises(DecryptError):
        v1.load_model(path, password="wrong")
    assert path.read_bytes() == before


def test_a_tampered_payload_is_refused_in_place_too(tmp_path):
    path = tmp_path / "m.apr"
    v1.save_model(os.urandom(100_000), path, model_type="Custom", password="pw")
    data = bytearray(path.read_bytes())
    data[-200] ^= 1  # inside the ciphertext; fix the CRC so the tag is what catches it
    data[-4:] = aprfast.crc32(bytes(data[:-4])).to_bytes(4, "little")
    path.write_bytes(bytes(data))
    with pytest.raises(DecryptError):
        v1.load_model(path, password="pw")


@pytest.mark.peak_memory
def test_peak_memory_is_about_the_payload_once(tmp_path, run_child):
    path = tmp_path / "big.apr"
    size = 64 << 20
    v1.save_model(os.urandom(size), path, model_type="Custom", password="pw", durable=False)
    script = """
import json, sys
from aprfast import v1
# The crypto libraries (OpenSSL, libsodium: about 8 MiB resident) load on first use; they
# are a fixed cost, not a copy of the payload, so they are loaded before the baseline.
import aprfast.crypto, cryptography.hazmat.primitives.ciphers.aead, nacl.bindings, argon2
def status(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
base = status("VmRSS")
model = v1.load_model(sys.argv[1], password="pw")
print(json.dumps({"peak": status("VmHWM") - base, "n": len(model.payload)}))
"""
    done = run_child(script, path)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["n"] == size
    assert result["peak"] <= 1.15 * size, f"peak {result['peak'] / size:.2f}x the payload"
