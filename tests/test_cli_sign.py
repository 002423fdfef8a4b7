"""`apr keygen`, `apr sign`, `apr verify` on v1 and v2 files: key files (private mode
0600), signing in place or to -o (encrypted v1 files without their key, encrypted v2
files re-sealed with it), verification that catches tampering and untrusted signers
(exit 5) and checks an encrypted v2 file's chunk digests without its key, keys only
from files and the environment."""

import json
import os
import stat

import numpy as np
import pytest

import aprfast
from aprfast import v1
from aprfast.cli import main
from aprfast.crypto.core import load_key


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
    # self-describing by default (issue 28 item 2): the files say which key they hold
    assert (tmp_path / "k").read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----")
    assert load_key(tmp_path / "k")[0] == "x25519-private" and load_key(tmp_path / "k.pub")[0] == "x25519-public"
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
    # --key is the ECDSA key FILE of `apr sign --format sigstore`; on an .apr signature it is refused
    assert main(["sign", str(model), "--key", "00" * 32]) == 2
    for argv in (["sign", str(model), "--signing", "x"],
                 ["encrypt", str(model), "-o", "x.apr", "--password", "secret"],
                 ["decrypt", str(model), "-o", "x.apr", "--password", "secret"]):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 2
    assert main(["sign", str(model)]) == 2  # a key file is required


def test_wrong_key_kind_is_a_format_error(model, tmp_path):
    assert main(["keygen", str(tmp_path / "x"), "--type", "x25519", "--format", "pem"]) == 0
    assert main(["sign", str(model), "--signing-key", str(tmp_path / "x")]) == 4


def test_streaming_v1_files_are_not_signed_in_place(tmp_path, keys):
    signer, _ = keys
    stream = tmp_path / "s.apr"
    v1.save_model({"w": np.ones(3, np.float32)}, stream, streaming=True)
    before = stream.read_bytes()
    assert main(["sign", str(stream), "--signing-key", str(signer)]) == 1
    assert stream.read_bytes() == before


# --- v2 (APR2) files ------------------------------------------------------------------
V2_TENSORS = {"big": np.arange(600_000, dtype=np.float32).reshape(1000, 600),  # 2.3 MiB: three 1 MiB chunks
              "bias": np.linspace(-1, 1, 7).astype(np.float16), "empty": np.zeros((0, 4), np.float32)}


def public_of(path):
    return load_key(f"{path}.pub", kind="ed25519-public")[1]


def assert_v2_tensors(path, **keys):
    with aprfast.open(path, **keys) as f:
        assert sorted(f.keys()) == sorted(V2_TENSORS) and f.metadata == {"model_name": "m2"}
        for name, want in V2_TENSORS.items():
            np.testing.assert_array_equal(f.get_tensor(name), want)
            assert f.get_tensor(name).dtype == want.dtype


@pytest.fixture
def v2_model(tmp_path):
    path = tmp_path / "m2.apr"
    aprfast.save_file(V2_TENSORS, path, {"model_name": "m2"})
    return path


def test_v2_sign_in_place_then_verify(v2_model, keys, capsys):
    signer, other = keys
    assert main(["verify", str(v2_model)]) == 5  # not signed yet
    assert "not signed" in capsys.readouterr().err
    assert main(["sign", str(v2_model), "--signing-key", str(signer)]) == 0
    assert f"(Ed25519 public key {public_of(signer).hex()})" in capsys.readouterr().out
    assert main(["verify", str(v2_model), "--trusted-key", f"{signer}.pub", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["valid"] is True and doc["container"] == "v2" and doc["trusted"] is True
    assert doc["signer"] == public_of(signer).hex() and doc["digest"] == "sha256"
    assert doc["chunks"] == 4 and doc["encrypted"] is False  # 3 chunks of 'big', 1 of 'bias'
    with aprfast.open(v2_model, trusted_keys=[public_of(signer)]) as f:
        assert f.security["signature"] == "trusted"
    assert_v2_tensors(v2_model)
    assert main(["verify", str(v2_model), "--trusted-key", f"{other}.pub"]) == 5
    assert "[E006]" in capsys.readouterr().err
    before = v2_model.read_bytes()
    assert main(["sign", str(v2_model), "--signing-key", str(other)]) == 1  # signed already
    assert "--resign" in capsys.readouterr().err and v2_model.read_bytes() == before
    assert main(["sign", str(v2_model), "--signing-key", str(other), "--resign"]) == 0
    assert main(["verify", str(v2_model), "--trusted-key", f"{other}.pub"]) == 0


def flip(path, offset):
    data = bytearray(path.read_bytes())
    data[offset] ^= 1
    path.write_bytes(bytes(data))


def fix_footer(path):
    """Recompute the footer CRC (an attacker's edit the footer alone would not catch)."""
    import struct
    import zlib

    data = bytearray(path.read_bytes())
    struct.pack_into("<I", data, len(data) - 16, zlib.crc32(data[:-16]))  # footer: crc32, magic, total
    path.write_bytes(bytes(data))


def test_v2_verify_catches_a_flipped_tensor_byte(v2_model, keys, tmp_path, capsys):
    signer, _ = keys
    signed = tmp_path / "signed.apr"
    assert main(["sign", str(v2_model), "--signing-key", str(signer), "-o", str(signed)]) == 0
    with aprfast.open(signed) as f:
        at = f.info("big").offset + (2 << 20) + 5  # inside the third chunk
    flip(signed, at)
    assert main(["verify", str(signed)]) == 5
    assert "[E004]" in capsys.readouterr().err  # footer CRC first


def test_v2_encrypted_and_signed_verifies_without_its_key(v2_model, keys, tmp_path, password_env, capsys):
    signer, _ = keys
    enc = tmp_path / "enc.apr"
    assert main(["encrypt", str(v2_model), "-o", str(enc), "--password-env", password_env,
                 "--signing-key", str(signer)]) == 0
    capsys.readouterr()
    assert main(["verify", str(enc), "--trusted-key", f"{signer}.pub", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["encrypted"] is True and doc["chunks"] == 4 and doc["tags_checked"] is False
    assert main(["verify", str(enc), "--password-env", password_env, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["tags_checked"] is True
    assert_v2_tensors(enc, password="hunter2", trusted_keys=[public_of(signer)])


def test_v2_verify_names_the_tampered_chunk_when_the_footer_is_fixed(v2_model, keys, tmp_path, password_env,
                                                                     capsys):
    signer, _ = keys
    enc = tmp_path / "enc.apr"
    assert main(["encrypt", str(v2_model), "-o", str(enc), "--password-env", password_env,
                 "--signing-key", str(signer)]) == 0
    with aprfast.open(enc, password="hunter2") as f:
        at = f.info("big").offset + (1 << 20) + 3  # chunk 1 of 3
    flip(enc, at)
    fix_footer(enc)
    capsys.readouterr()
    assert main(["verify", str(enc)]) == 5
    err = capsys.readouterr().err
    assert "[E006]" in err and "'big': chunk 1 of 3" in err and "digest" in err


def test_v2_encrypted_file_is_signed_with_its_key(v2_model, keys, tmp_path, password_env, capsys):
    signer, _ = keys
    enc = tmp_path / "enc.apr"
    assert main(["encrypt", str(v2_model), "-o", str(enc), "--password-env", password_env]) == 0
    before = enc.read_bytes()
    assert main(["sign", str(enc), "--signing-key", str(signer)]) == 4  # DecryptError (E005): needs the key
    assert "needs the key" in capsys.readouterr().err and enc.read_bytes() == before
    assert main(["sign", str(enc), "--signing-key", str(signer), "--password-env", password_env]) == 0
    with aprfast.open(enc, password="hunter2", trusted_keys=[public_of(signer)]) as f:
        assert f.security["encrypted"] and f.security["signature"] == "trusted"
    assert_v2_tensors(enc, password="hunter2")


def test_v2_names_encrypted_needs_the_key_to_verify_chunks(v2_model, keys, tmp_path, password_env, capsys):
    signer, _ = keys
    enc = tmp_path / "enc.apr"
    assert main(["encrypt", str(v2_model), "-o", str(enc), "--password-env", password_env, "--encrypt-names",
                 "--signing-key", str(signer)]) == 0
    capsys.readouterr()
    assert main(["verify", str(enc), "--trusted-key", f"{signer}.pub"]) == 5
    err = capsys.readouterr().err
    assert "[E005]" in err and "signature are valid" in err and "--password-env" in err
    assert main(["verify", str(enc), "--trusted-key", f"{signer}.pub", "--password-env", password_env]) == 0
    assert "4 chunk(s): sha256 digests and AES-GCM tags valid" in capsys.readouterr().out


def test_v2_unsigned_manifest_is_checked_chunk_by_chunk(tmp_path):
    from aprfast.errors import ChecksumError
    from aprfast.tools.protection import verify_file

    path = tmp_path / "d.apr"
    aprfast.save_file(V2_TENSORS, path, {"model_name": "m2"}, digest="sha256")
    with pytest.raises(aprfast.errors.SignatureError, match="not signed"):
        verify_file(path)
    result = verify_file(path, require_signature=False)
    assert result["digest"] == "sha256" and result["chunks"] == 4 and not result["signed"]
    with aprfast.open(path) as f:
        at = f.info("big").offset + 10  # chunk 0 of 3
    flip(path, at)
    fix_footer(path)
    with pytest.raises(ChecksumError, match="'big': chunk 0 of 3 does not match its sha256 digest"):
        verify_file(path, require_signature=False)


def test_v2_multi_recipient_file_is_not_resigned(v2_model, keys, tmp_path, capsys):
    from aprfast.crypto.core import generate_x25519_key

    signer, _ = keys
    alice, alice_public = generate_x25519_key()
    _, bob_public = generate_x25519_key()
    enc = tmp_path / "enc.apr"
    aprfast.save_file(V2_TENSORS, enc, {"model_name": "m2"}, recipients=[alice_public, bob_public])
    (tmp_path / "alice").write_bytes(alice)
    before = enc.read_bytes()
    assert main(["sign", str(enc), "--signing-key", str(signer), "--key-file", str(tmp_path / "alice")]) == 1
    assert "several recipients" in capsys.readouterr().err and enc.read_bytes() == before


def test_key_options_are_refused_for_v1_files(model, keys, password_env, capsys):
    signer, _ = keys
    assert main(["sign", str(model), "--signing-key", str(signer), "--password-env", password_env]) == 1
    assert "without its key" in capsys.readouterr().err


@pytest.fixture
def password_env(monkeypatch):
    monkeypatch.setenv("APR_TEST_PW", "hunter2")
    return "APR_TEST_PW"


def test_missing_and_junk_files(tmp_path, keys):
    signer, _ = keys
    assert main(["verify", str(tmp_path / "nope.apr")]) == 3
    junk = tmp_path / "junk.apr"
    junk.write_bytes(b"APRN" + b"\0" * 8)
    assert main(["verify", str(junk)]) == 4
    assert main(["sign", str(junk), "--signing-key", str(signer)]) == 4


# --- keys that say what they are (issue 28 item 2) -----------------------------------
def test_keygen_raw_only_on_request_and_prints_the_fingerprint(tmp_path, capsys):
    from aprfast.crypto.core import key_fingerprint

    assert main(["keygen", str(tmp_path / "me.key")]) == 0
    out = capsys.readouterr().out
    kind, public = load_key(tmp_path / "me.key.pub")
    assert kind == "ed25519-public" and f"fingerprint: {key_fingerprint(public)}" in out
    assert main(["keygen", str(tmp_path / "raw.key"), "--format", "raw"]) == 0
    assert len((tmp_path / "raw.key").read_bytes()) == 32 and len((tmp_path / "raw.key.pub").read_bytes()) == 32


def test_keygen_pem_needs_no_package_and_matches_cryptography(tmp_path, monkeypatch):
    import builtins

    from aprfast.crypto import core

    real_import = builtins.__import__

    def no_cryptography(name, *args, **kwargs):
        if name.startswith("cryptography"):
            raise ImportError("no cryptography here")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_cryptography)
    assert main(["keygen", str(tmp_path / "k")]) == 0
    kind, seed = load_key(tmp_path / "k")
    assert kind == "ed25519-private" and load_key(tmp_path / "k.pub")[1] == core.public_key_of(seed)
    monkeypatch.undo()
    serialization = pytest.importorskip("cryptography.hazmat.primitives.serialization")
    key = serialization.load_pem_private_key((tmp_path / "k").read_bytes(), password=None)
    assert key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption()) == (tmp_path / "k").read_bytes()


@pytest.mark.parametrize("fmt", ["pem", "raw"])
def test_sign_refuses_a_public_key_as_the_signing_key(model, tmp_path, capsys, fmt):
    assert main(["keygen", str(tmp_path / "me.key"), "--format", fmt]) == 0
    capsys.readouterr()
    before = model.read_bytes()
    assert main(["sign", str(model), "--signing-key", str(tmp_path / "me.key.pub")]) == 4
    err = capsys.readouterr().err
    assert "public key" in err and str(tmp_path / "me.key") in err
    assert model.read_bytes() == before


def test_sign_refuses_a_raw_copy_of_the_public_key_and_a_mismatched_pair(model, tmp_path, capsys):
    assert main(["keygen", str(tmp_path / "me.key"), "--format", "raw"]) == 0
    assert main(["keygen", str(tmp_path / "other.key"), "--format", "raw"]) == 0
    copy = tmp_path / "copy"
    copy.write_bytes((tmp_path / "me.key.pub").read_bytes())  # a public key under a private name ...
    (tmp_path / "copy.pub").write_bytes((tmp_path / "me.key.pub").read_bytes())  # ... beside its .pub
    capsys.readouterr()
    assert main(["sign", str(model), "--signing-key", str(copy)]) == 4
    assert "copy of the public key" in capsys.readouterr().err
    (tmp_path / "me.key.pub").write_bytes((tmp_path / "other.key.pub").read_bytes())
    assert main(["sign", str(model), "--signing-key", str(tmp_path / "me.key")]) == 4
    assert "not the private key of" in capsys.readouterr().err


def test_sign_and_verify_print_the_signers_fingerprint(model, keys, capsys):
    from aprfast.crypto.core import key_fingerprint

    signer, _ = keys
    fingerprint = key_fingerprint(load_key(f"{signer}.pub")[1])
    assert main(["sign", str(model), "--signing-key", str(signer)]) == 0
    assert f"signed by {fingerprint}" in capsys.readouterr().out
    assert main(["verify", str(model)]) == 0  # no trusted key: it still says who signed
    out = capsys.readouterr().out
    assert f"signed by {fingerprint}" in out and "self-signed" in out
    assert main(["verify", str(model), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["fingerprint"] == fingerprint
