"""`apr encrypt` / `apr decrypt` on v1 and v2 files: password from the environment or
X25519 key files, the round trip gives the same model (tensors, bytes payloads,
metadata, header fields; a plain v2 file comes back byte for byte), wrong keys fail with
E005, outputs are never replaced without --force."""

import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import pytest

import aprfast
from aprfast import v1
from aprfast.cli import main
from aprfast.layouts.v1 import Flag


@pytest.fixture
def model(tmp_path):
    path = tmp_path / "m.apr"
    v1.save_model({"w": np.arange(24, dtype=np.float32).reshape(4, 6), "b": np.ones(6, np.float16)}, path,
                  metadata={"model_name": "m", "description": "d"}, compression="lz4", quality_score=87)
    return path


@pytest.fixture
def password(monkeypatch):
    monkeypatch.setenv("APR_TEST_PW", "correct horse")
    monkeypatch.setenv("APR_WRONG_PW", "battery staple")
    return "APR_TEST_PW"


def assert_same_model(a, b):
    assert a.header.model_type == b.header.model_type and a.header.compression == b.header.compression
    assert a.header.quality_score == b.header.quality_score
    assert {k: v for k, v in a.metadata.items()} == {k: v for k, v in b.metadata.items()}
    assert a.payload.keys() == b.payload.keys()
    for name in a.payload:
        np.testing.assert_array_equal(a.payload[name], b.payload[name])


def test_password_round_trip(model, password, tmp_path, capsys):
    enc, dec = tmp_path / "enc.apr", tmp_path / "dec.apr"
    assert main(["encrypt", str(model), "-o", str(enc), "--password-env", password]) == 0
    assert "encrypted (password)" in capsys.readouterr().out
    assert b"correct horse" not in enc.read_bytes()
    loaded = v1.load_model(enc, password="correct horse")
    assert loaded.encryption == "password" and loaded.header.flags & Flag.ENCRYPTED
    assert main(["decrypt", str(enc), "-o", str(dec), "--password-env", password, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["was"] == "password"
    plain = v1.load_model(dec)
    assert plain.encryption == "none" and not plain.header.flags & Flag.ENCRYPTED
    assert_same_model(v1.load_model(model), plain)


def test_wrong_password_is_e005_and_writes_nothing(model, password, tmp_path, capsys):
    enc, dec = tmp_path / "enc.apr", tmp_path / "dec.apr"
    assert main(["encrypt", str(model), "-o", str(enc), "--password-env", password]) == 0
    assert main(["decrypt", str(enc), "-o", str(dec), "--password-env", "APR_WRONG_PW"]) == 4
    assert "[E005]" in capsys.readouterr().err and not dec.exists()


def test_recipients_round_trip_and_a_stranger_cannot_decrypt(model, tmp_path, capsys):
    for name in ("alice", "bob", "eve"):
        assert main(["keygen", str(tmp_path / name), "--type", "x25519"]) == 0
    enc = tmp_path / "enc.apr"
    assert main(["encrypt", str(model), "-o", str(enc), "--recipient", str(tmp_path / "alice.pub"),
                 "--recipient", str(tmp_path / "bob.pub")]) == 0
    assert "multi-recipient" in capsys.readouterr().out
    for who in ("alice", "bob"):
        out = tmp_path / f"{who}.apr"
        assert main(["decrypt", str(enc), "-o", str(out), "--key-file", str(tmp_path / who)]) == 0
        assert_same_model(v1.load_model(model), v1.load_model(out))
    assert main(["decrypt", str(enc), "-o", str(tmp_path / "eve.apr"), "--key-file", str(tmp_path / "eve")]) == 4


def test_bytes_payload_and_signing_the_result(tmp_path, password, capsys):
    src = tmp_path / "bytes.apr"
    v1.save_model(b"bincode-model-bytes", src, model_type="LinearRegression")
    assert main(["keygen", str(tmp_path / "signer")]) == 0
    enc = tmp_path / "enc.apr"
    assert main(["encrypt", str(src), "-o", str(enc), "--password-env", password,
                 "--signing-key", str(tmp_path / "signer")]) == 0
    assert main(["verify", str(enc), "--trusted-key", str(tmp_path / "signer.pub")]) == 0
    dec = tmp_path / "dec.apr"
    assert main(["decrypt", str(enc), "-o", str(dec), "--password-env", password,
                 "--trusted-key", str(tmp_path / "signer.pub")]) == 0
    assert "was signed" in capsys.readouterr().err  # the plaintext is not signed: said on stderr
    loaded = v1.load_model(dec)
    assert bytes(loaded.payload) == b"bincode-model-bytes" and loaded.header.model_type == 1


def test_encrypting_an_encrypted_file_or_no_key_is_refused(model, password, tmp_path):
    enc = tmp_path / "enc.apr"
    assert main(["encrypt", str(model), "-o", str(enc), "--password-env", password]) == 0
    assert main(["encrypt", str(enc), "-o", str(tmp_path / "twice.apr"), "--password-env", password]) == 1
    assert main(["encrypt", str(model), "-o", str(tmp_path / "x.apr")]) == 2
    assert main(["decrypt", str(enc), "-o", str(tmp_path / "x.apr")]) == 2
    assert main(["encrypt", str(model), "-o", str(tmp_path / "x.apr"), "--password-env", "APR_UNSET_VAR_XYZ"]) == 2
    assert not (tmp_path / "x.apr").exists() and not (tmp_path / "twice.apr").exists()


def test_existing_output_is_kept_without_force(model, password, tmp_path):
    out = tmp_path / "out.apr"
    out.write_bytes(b"keep me")
    assert main(["encrypt", str(model), "-o", str(out), "--password-env", password]) == 1
    assert out.read_bytes() == b"keep me"
    assert main(["encrypt", str(model), "-o", str(out), "--password-env", password, "--force"]) == 0
    assert v1.load_model(out, password="correct horse").encryption == "password"


def test_streaming_file_stays_streaming(tmp_path, password):
    src = tmp_path / "s.apr"
    v1.save_model({"w": np.arange(10, dtype=np.float32)}, src, streaming=True)
    enc = tmp_path / "enc.apr"
    assert main(["encrypt", str(src), "-o", str(enc), "--password-env", password]) == 0
    loaded = v1.load_model(enc, password="correct horse")
    assert loaded.header.flags & Flag.STREAMING and loaded.encryption == "password"
    np.testing.assert_array_equal(loaded.payload["w"], np.arange(10, dtype=np.float32))


def test_license_block_survives_the_round_trip(tmp_path, password):
    import uuid

    from aprfast.v1 import licensing

    lic = licensing.License(license_id=uuid.UUID(int=7), licensee="ACME", seat_limit=3)
    src = tmp_path / "lic.apr"
    v1.save_model({"w": np.ones(3, np.float32)}, src, license=lic, metadata={"model_name": "x"})
    enc, dec = tmp_path / "enc.apr", tmp_path / "dec.apr"
    assert main(["encrypt", str(src), "-o", str(enc), "--password-env", password]) == 0
    assert main(["decrypt", str(enc), "-o", str(dec), "--password-env", password]) == 0
    for path, key in ((enc, "correct horse"), (dec, None)):
        loaded = v1.load_model(path, password=key)
        assert loaded.license == lic and loaded.flags & Flag.LICENSED
        assert loaded.metadata == v1.load_model(src).metadata


# --- v2 (APR2) files ------------------------------------------------------------------
V2_TENSORS = {"emb": np.arange(400_000, dtype=np.float32).reshape(800, 500),  # 1.5 MiB: two chunks
              "norm": np.ones(500, np.float16), "step": np.array([3], np.int64)}


@pytest.fixture
def v2_model(tmp_path):
    path = tmp_path / "m2.apr"
    aprfast.save_file(V2_TENSORS, path, {"model_name": "m2", "n": "1"})
    return path


def assert_v2_same(path, want=V2_TENSORS, **keys):
    with aprfast.open(path, **keys) as f:
        assert f.metadata == {"model_name": "m2", "n": "1"} and sorted(f.keys()) == sorted(want)
        for name, array in want.items():
            got = f.get_tensor(name)
            assert got.dtype == array.dtype and got.shape == array.shape
            np.testing.assert_array_equal(got, array)
        return f.security


def test_v2_password_round_trip_gives_the_same_bytes(v2_model, password, tmp_path, capsys):
    enc, dec = tmp_path / "enc.apr", tmp_path / "dec.apr"
    assert main(["encrypt", str(v2_model), "-o", str(enc), "--password-env", password]) == 0
    assert "encrypted (password)" in capsys.readouterr().out
    assert enc.read_bytes()[:4] == b"APR2"
    state = assert_v2_same(enc, password="correct horse")
    assert state["encrypted"] and state["encryption"] == "password" and not state["signed"]
    with pytest.raises(aprfast.errors.DecryptError):
        aprfast.open(enc).get_tensor("emb")
    raw = V2_TENSORS["emb"].tobytes()
    assert raw[1000:1064] not in enc.read_bytes()  # the tensor bytes are not stored in the clear
    assert main(["decrypt", str(enc), "-o", str(dec), "--password-env", password, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["was"] == "password" and doc["container"] == "v2"
    assert dec.read_bytes() == v2_model.read_bytes()  # same layout, order and metadata as save_file's


def test_v2_wrong_password_is_e005_and_writes_nothing(v2_model, password, tmp_path, capsys):
    enc, dec = tmp_path / "enc.apr", tmp_path / "dec.apr"
    assert main(["encrypt", str(v2_model), "-o", str(enc), "--password-env", password]) == 0
    assert main(["decrypt", str(enc), "-o", str(dec), "--password-env", "APR_WRONG_PW"]) == 4
    assert "[E005]" in capsys.readouterr().err and not dec.exists()
    assert main(["encrypt", str(enc), "-o", str(dec), "--password-env", password]) == 1
    assert "encrypted already" in capsys.readouterr().err and not dec.exists()


def test_v2_recipients_and_names(v2_model, tmp_path, capsys):
    for name in ("alice", "bob", "eve"):
        assert main(["keygen", str(tmp_path / name), "--type", "x25519"]) == 0
    enc = tmp_path / "enc.apr"
    assert main(["encrypt", str(v2_model), "-o", str(enc), "--recipient", str(tmp_path / "alice.pub"),
                 "--recipient", str(tmp_path / "bob.pub"), "--encrypt-names"]) == 0
    assert "multi-recipient" in capsys.readouterr().out
    # Each name as the plain file stores it, with the bytes around it (length prefix, index
    # fields): "emb" alone turns up by chance in 1.5 MB of ciphertext about one run in ten.
    plain, sealed = v2_model.read_bytes(), enc.read_bytes()
    for name in (b"emb", b"model_name"):
        at = plain.index(name)
        assert plain[max(0, at - 6):at + len(name) + 6] not in sealed, name
    for who in ("alice", "bob"):
        out = tmp_path / f"{who}.apr"
        assert main(["decrypt", str(enc), "-o", str(out), "--key-file", str(tmp_path / who)]) == 0
        assert out.read_bytes() == v2_model.read_bytes()
    assert main(["decrypt", str(enc), "-o", str(tmp_path / "eve.apr"), "--key-file", str(tmp_path / "eve")]) == 4
    assert not (tmp_path / "eve.apr").exists()


def test_v2_compressed_file_keeps_its_codec_and_signature_is_required(tmp_path, password, capsys):
    src, enc, dec = tmp_path / "z.apr", tmp_path / "enc.apr", tmp_path / "dec.apr"
    aprfast.save_file(V2_TENSORS, src, {"model_name": "m2", "n": "1"}, compression="zstd")
    assert main(["keygen", str(tmp_path / "signer")]) == 0
    assert main(["encrypt", str(src), "-o", str(enc), "--password-env", password,
                 "--signing-key", str(tmp_path / "signer")]) == 0
    assert ", signed" in capsys.readouterr().out
    with aprfast.open(enc, password="correct horse") as f:
        assert f.info("emb").flags & 0x0F == 2  # zstd (tensor_codecs.ZSTD)
        assert f.info("emb").nbytes < V2_TENSORS["emb"].nbytes
    assert main(["keygen", str(tmp_path / "other")]) == 0
    assert main(["decrypt", str(enc), "-o", str(dec), "--password-env", password,
                 "--trusted-key", str(tmp_path / "other.pub")]) == 4  # signed by someone else
    assert "[E006]" in capsys.readouterr().err and not dec.exists()
    assert main(["decrypt", str(enc), "-o", str(dec), "--password-env", password,
                 "--trusted-key", str(tmp_path / "signer.pub")]) == 0
    assert "was signed" in capsys.readouterr().err  # the plaintext is not
    assert_v2_same(dec)
    assert dec.read_bytes() == src.read_bytes()


_DECRYPT_PEAK = """
import json, sys
import numpy as np
import aprfast
from aprfast import crypto
from aprfast.tools import protection

def status(key):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key + ":"))

d = sys.argv[1]
secret, public = crypto.generate_x25519_key()
rng = np.random.default_rng(0)
model = {f"t{i:02d}": rng.standard_normal(1 << 20).astype(np.float32) for i in range(16)}  # 16 x 4 MiB
aprfast.save_file(model, d + "/enc.apr", recipients=[public], durable=False)
del model
aprfast.save_file({"w": np.ones(4, np.float32)}, d + "/w.apr", recipients=[public])
protection.decrypt_file(d + "/w.apr", d + "/w2.apr", private_key=secret)  # code paths loaded
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # VmHWM := current RSS
base = status("VmRSS")
protection.decrypt_file(d + "/enc.apr", d + "/dec.apr", private_key=secret)
print(json.dumps({"grown": status("VmHWM") - base}))
"""


@pytest.mark.peak_memory
def test_v2_decrypt_holds_one_tensor_at_a_time(tmp_path):
    package_parent = os.path.dirname(os.path.dirname(os.path.abspath(aprfast.__file__)))
    # glibc returns large frees to the system at once, so RSS shows what is really held
    env = dict(os.environ, PYTHONPATH=package_parent, MALLOC_MMAP_THRESHOLD_=str(128 << 10))
    done = subprocess.run([sys.executable, "-c", _DECRYPT_PEAK, str(tmp_path)], env=env, cwd=tempfile.gettempdir(),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    grown = json.loads(done.stdout)["grown"]
    assert grown < 16 << 20, f"decrypting a 64 MiB file grew the peak RSS by {grown / 2**20:.1f} MiB"
    with aprfast.open(tmp_path / "dec.apr") as f:
        assert len(f) == 16 and f.security is None
