"""`apr encrypt` / `apr decrypt` on v1 files: password from the environment or X25519
key files, the round trip gives the same model (tensors, bytes payloads, metadata,
header fields), wrong keys fail with E005, outputs are never replaced without --force."""

import json

import numpy as np
import pytest

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

    from aprfast import licensing

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
