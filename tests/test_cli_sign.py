"""`apr keygen`, `apr sign`, `apr verify` on v1 files: key files (private mode 0600),
signing in place or to -o (encrypted files without their key), verification that
catches tampering and untrusted signers (exit 5), keys only from files and the
environment, and v2 files refused until v2 signing exists."""

import json
import os
import stat

import numpy as np
import pytest

import aprfast
from aprfast import v1
from aprfast.cli import main
from aprfast.crypto import load_key


@pytest.fixture
def keys(tmp_path):
    assert main(["keygen", str(tmp_path / "signer")]) == 0
    assert main(["keygen", str(tmp_path / "other")]) == 0
    return tmp_path / "signer", tmp_path / "other"


@pytest.fixture
def model(tmp_path):
    path = tmp_path / "m.apr"
    v1.save_model({"w": np.arange(12, dtype=np.float32).reshape(3, 4)}, path, metadata={"model_name": "m"},
                  compression="zstd")
    return path


def test_keygen_writes_a_private_file_only_the_owner_reads(tmp_path, capsys):
    assert main(["keygen", str(tmp_path / "k"), "--type", "x25519", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert stat.S_IMODE(os.stat(tmp_path / "k").st_mode) == 0o600
    assert doc["kind"] == "x25519" and doc["public"] == str(tmp_path / "k.pub")
    assert load_key(tmp_path / "k.pub", kind="x25519-public")[1].hex() == doc["public_key"]
    assert len((tmp_path / "k").read_bytes()) == 32
    before = (tmp_path / "k").read_bytes()
    assert main(["keygen", str(tmp_path / "k")]) == 1  # never replaced without --force
    assert (tmp_path / "k").read_bytes() == before
    assert main(["keygen", str(tmp_path / "k"), "--force"]) == 0
    assert (tmp_path / "k").read_bytes() != before


def test_sign_in_place_then_verify_with_the_trusted_key(model, keys, capsys):
    signer, _ = keys
    assert main(["verify", str(model)]) == 5  # not signed yet
    assert main(["sign", str(model), "--signing-key", str(signer)]) == 0
    assert main(["verify", str(model), "--trusted-key", f"{signer}.pub"]) == 0
    out = capsys.readouterr().out
    public = load_key(f"{signer}.pub", kind="ed25519-public")[1]
    assert f"signature valid, by a trusted key: {public.hex()}" in out
    loaded = v1.load_model(model, trusted_keys=[public])
    assert loaded.signature == v1.TRUSTED and loaded.metadata["model_name"] == "m"
    np.testing.assert_array_equal(loaded.payload["w"], np.arange(12, dtype=np.float32).reshape(3, 4))


def test_verify_refuses_another_signer_and_a_flipped_byte(model, keys, tmp_path, capsys):
    signer, other = keys
    out = tmp_path / "signed.apr"
    assert main(["sign", str(model), "--signing-key", str(signer), "-o", str(out)]) == 0
    assert main(["verify", str(out)]) == 0  # self-signed: valid, not trusted
    assert "self-signed" in capsys.readouterr().out
    assert main(["verify", str(out), "--trusted-key", f"{other}.pub", "--json"]) == 5
    doc = json.loads(capsys.readouterr().out)
    assert doc["valid"] is False and doc["code"] == "E006"
    data = bytearray(out.read_bytes())
    data[40] ^= 1
    out.write_bytes(bytes(data))
    assert main(["verify", str(out)]) == 5
    assert "[E004]" in capsys.readouterr().err


def test_an_encrypted_file_is_signed_without_its_key(model, keys, tmp_path, monkeypatch):
    signer, _ = keys
    monkeypatch.setenv("APR_TEST_PW", "hunter2")
    enc = tmp_path / "enc.apr"
    assert main(["encrypt", str(model), "-o", str(enc), "--password-env", "APR_TEST_PW"]) == 0
    assert main(["sign", str(enc), "--signing-key", str(signer)]) == 0
    assert main(["verify", str(enc), "--trusted-key", f"{signer}.pub"]) == 0
    public = load_key(f"{signer}.pub", kind="ed25519-public")[1]
    loaded = v1.load_model(enc, password="hunter2", trusted_keys=[public])
    assert loaded.encryption == "password" and loaded.signature == v1.TRUSTED


def test_a_signed_file_is_not_resigned_without_resign(model, keys, capsys):
    signer, other = keys
    assert main(["sign", str(model), "--signing-key", str(signer)]) == 0
    before = model.read_bytes()
    assert main(["sign", str(model), "--signing-key", str(other)]) == 1
    assert "--resign" in capsys.readouterr().err and model.read_bytes() == before
    assert main(["sign", str(model), "--signing-key", str(other), "--resign"]) == 0
    assert main(["verify", str(model), "--trusted-key", f"{other}.pub"]) == 0
    assert main(["verify", str(model), "--trusted-key", f"{signer}.pub"]) == 5


def test_keys_never_come_from_argv(model, keys):
    for argv in (["sign", str(model), "--key", "00" * 32], ["sign", str(model), "--signing", "x"],
                 ["encrypt", str(model), "-o", "x.apr", "--password", "secret"],
                 ["decrypt", str(model), "-o", "x.apr", "--password", "secret"]):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 2
    assert main(["sign", str(model)]) == 2  # a key file is required


def test_wrong_key_kind_is_a_format_error(model, tmp_path):
    assert main(["keygen", str(tmp_path / "x"), "--type", "x25519", "--format", "pem"]) == 0
    assert main(["sign", str(model), "--signing-key", str(tmp_path / "x")]) == 4


def test_v2_files_and_streaming_files_are_refused_for_now(tmp_path, keys, capsys):
    signer, _ = keys
    v2 = tmp_path / "v2.apr"
    aprfast.save_file({"w": np.ones(3, np.float32)}, v2)
    assert main(["sign", str(v2), "--signing-key", str(signer)]) == 1
    assert "v2 encryption and signing API" in capsys.readouterr().err
    assert main(["verify", str(v2)]) == 1
    stream = tmp_path / "s.apr"
    v1.save_model({"w": np.ones(3, np.float32)}, stream, streaming=True)
    before = stream.read_bytes()
    assert main(["sign", str(stream), "--signing-key", str(signer)]) == 1
    assert stream.read_bytes() == before


def test_missing_and_junk_files(tmp_path, keys):
    signer, _ = keys
    assert main(["verify", str(tmp_path / "nope.apr")]) == 3
    junk = tmp_path / "junk.apr"
    junk.write_bytes(b"APRN" + b"\0" * 8)
    assert main(["verify", str(junk)]) == 4
    assert main(["sign", str(junk), "--signing-key", str(signer)]) == 4
