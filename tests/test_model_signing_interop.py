"""Signatures in the ecosystem's standard (issue 25 item 3): OpenSSF model signing's
Sigstore bundles, both ways, offline, with local ECDSA keys.

aprfast signs -> the ``model_signing`` CLI (``python -m model_signing verify key``) and
its Python API verify; ``model_signing`` (CLI and API) signs -> aprfast verifies; a file
changed, added or removed is caught both ways, aprfast naming it; for a model directory,
a sharded .apr model's directory and a single .apr file.  Nothing may touch the network:
sockets are refused in this process while the tests run, and the CLI (and one whole
import-sign-verify run of aprfast) runs in a child that refuses them too, inside a
network namespace of its own where ``unshare -n`` works (as root on CI).

The model-signing package is the ``signing`` extra.  Without it (the lower-bounds pass
installs the test extra only, and no model-signing release imports with its cryptography
41; the cibuildwheel tests) these tests skip with the reason;
``APRFAST_REQUIRE_MODEL_SIGNING=1`` (set by .ci/run's main pass) turns that skip into a
failure.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import socket
import stat
import subprocess
import sys

import numpy as np
import pytest

import aprfast
from aprfast.cli import main
from aprfast.errors import AprFileNotFoundError, FormatError, SignatureError
from aprfast.tools.model_signing import BundleError, ModelTamperedError
from aprfast.tools.protection import verify_file

# --- the package, or a skip (a failure where CI requires it) ----------------------------


def _require() -> bool:
    return os.environ.get("APRFAST_REQUIRE_MODEL_SIGNING", "").strip() not in ("", "0")


@pytest.fixture(scope="session")
def ms():
    try:
        import model_signing
        import model_signing.hashing
        import model_signing.signing
        import model_signing.verifying
    except Exception as exc:  # noqa: BLE001 - not installed, or with a sigstore it cannot import (an
        # ImportError, or a deprecation warning that pytest's filterwarnings=error raises)
        reason = f"the model-signing package is not importable here ({type(exc).__name__}: {exc})"
        if _require():
            pytest.fail(f"APRFAST_REQUIRE_MODEL_SIGNING is set but {reason}", pytrace=False)
        pytest.skip(f"{reason}: pip install 'aprfast[signing]' (APRFAST_REQUIRE_MODEL_SIGNING=1 makes this fail)")
    return model_signing


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
    """Any connection or name lookup in this process fails the test: the key method must
    be offline (no Fulcio, Rekor or TUF), importing model_signing included."""
    def refuse(*args, **kwargs):
        raise AssertionError(f"network access attempted: {args[:2]}")

    real_connect = socket.socket.connect

    def connect(self, address):
        if self.family == getattr(socket, "AF_UNIX", None):
            return real_connect(self, address)
        refuse(address)

    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)


# The CLI in a child process whose sockets refuse to connect, as the tests' own process.
_CLI = """
import runpy, socket, sys
def refuse(*args, **kwargs):
    raise SystemExit("network access attempted")
socket.socket.connect = lambda self, address: refuse()
socket.create_connection = refuse
socket.getaddrinfo = refuse
sys.argv = ["model_signing"] + sys.argv[1:]
runpy.run_module("model_signing", run_name="__main__")
"""


def _without_network(command):
    """``command`` in a network namespace of its own (no interface but a downed loopback)
    where this machine lets us make one, as CI's root can; else as is (its sockets are
    refused by the script itself)."""
    unshare = shutil.which("unshare")
    if unshare and subprocess.run([unshare, "-n", "true"], capture_output=True).returncode == 0:
        return [unshare, "-n", *command]
    return command


def model_signing_cli(*args):
    return subprocess.run(_without_network([sys.executable, "-c", _CLI, *map(str, args)]), capture_output=True,
                          text=True, timeout=180)


def cli_verify(model, bundle, public_key, *extra):
    return model_signing_cli("verify", "key", model, "--signature", bundle, "--public_key", public_key, *extra)


def cli_sign(model, bundle, private_key, *extra):
    return model_signing_cli("sign", "key", model, "--signature", bundle, "--private_key", private_key, *extra)


def api_verify(ms, model, bundle, public_key):
    ms.verifying.Config().use_elliptic_key_verifier(public_key=public_key).verify(model, bundle)


def api_sign(ms, model, bundle, private_key, hashing=None):
    config = ms.signing.Config().use_elliptic_key_signer(private_key=private_key)
    if hashing is not None:
        config.set_hashing_config(hashing)
    config.sign(model, bundle)


# --- models and keys ------------------------------------------------------------------


@pytest.fixture
def keys(tmp_path):
    """Two P-256 pairs from apr keygen: the signer's and someone else's."""
    made = {}
    for name in ("signer", "other"):
        assert main(["keygen", str(tmp_path / name), "--type", "ecdsa-p256"]) == 0
        made[name] = (tmp_path / name, tmp_path / f"{name}.pub")
    return made


@pytest.fixture
def model_dir(tmp_path):
    """A Hugging Face style folder: weights, config, a nested tokenizer, a .git to ignore."""
    model = tmp_path / "tiny-model"
    (model / "tokenizer").mkdir(parents=True)
    aprfast.save_file({"w": np.arange(64, dtype=np.float32).reshape(8, 8)}, model / "model.apr")
    (model / "config.json").write_text(json.dumps({"hidden": 8}))
    (model / "tokenizer" / "vocab.txt").write_text("a\nb\nc\n")
    (model / ".git").mkdir()
    (model / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    return model


@pytest.fixture
def sharded(tmp_path, rng):
    """A sharded .apr model: shards plus model.apr.index.json in one directory."""
    out = tmp_path / "sharded"
    out.mkdir()
    tensors = {f"layer{i}.weight": rng.standard_normal((16, 16)).astype(np.float32) for i in range(6)}
    aprfast.save_file(tensors, out / "model.apr", max_shard_size=2500)
    shards = sorted(p.name for p in out.glob("model-*-of-*.apr"))
    assert len(shards) >= 3 and (out / "model.apr.index.json").exists()
    return out, shards


@pytest.fixture
def apr_file(tmp_path):
    path = tmp_path / "single.apr"
    aprfast.save_file({"w": np.arange(32, dtype=np.float32)}, path, metadata={"model_name": "single"})
    return path


def flip_byte(path, offset=-10):
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


# --- keys -----------------------------------------------------------------------------


@pytest.mark.parametrize("curve, name, hash_bits", [("p256", "secp256r1", 256), ("p384", "secp384r1", 384),
                                                    ("p521", "secp521r1", 521)])
def test_keygen_writes_ecdsa_pem_pairs(tmp_path, capsys, curve, name, hash_bits):
    from cryptography.hazmat.primitives import serialization

    from aprfast.crypto.ecdsa import key_hint

    assert main(["keygen", str(tmp_path / "k"), "--type", f"ecdsa-{curve}", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["kind"] == f"ecdsa-{curve}" and doc["format"] == "pem"
    assert stat.S_IMODE(os.stat(tmp_path / "k").st_mode) == 0o600
    private = serialization.load_pem_private_key((tmp_path / "k").read_bytes(), None)
    public = serialization.load_pem_public_key((tmp_path / "k.pub").read_bytes())
    assert private.curve.name == public.curve.name == name and private.curve.key_size == hash_bits
    assert doc["public_key"] == key_hint(public) == key_hint(private.public_key())
    assert (tmp_path / "k").read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----")  # PKCS#8


def test_keygen_ecdsa_is_pem_only_and_refuses_to_overwrite(tmp_path, capsys):
    assert main(["keygen", str(tmp_path / "k"), "--type", "ecdsa-p256", "--format", "raw"]) == 2
    assert "PEM" in capsys.readouterr().err
    assert main(["keygen", str(tmp_path / "k"), "--type", "ecdsa-p256"]) == 0
    assert main(["keygen", str(tmp_path / "k"), "--type", "ecdsa-p256"]) == 1
    assert main(["keygen", str(tmp_path / "k"), "--type", "ecdsa-p256", "--force"]) == 0


def test_an_ed25519_key_is_refused_by_name(tmp_path, model_dir):
    assert main(["keygen", str(tmp_path / "ed"), "--format", "pem"]) == 0
    with pytest.raises(FormatError, match="not an ECDSA key.*ecdsa-p256"):
        aprfast.sign_model(model_dir, tmp_path / "ed")
    assert main(["keygen", str(tmp_path / "ec"), "--type", "ecdsa-p256"]) == 0
    with pytest.raises(FormatError, match="public key"):
        aprfast.verify_model(model_dir, tmp_path / "x.sig", tmp_path / "ec")  # the private key given


def test_import_aprfast_loads_no_model_signing(run_child):
    out = run_child("import sys, aprfast\n"
                    "assert callable(aprfast.sign_model) and callable(aprfast.verify_model)\n"
                    "assert 'sign_model' in dir(aprfast)\n"
                    "loaded = sorted(m for m in sys.modules if m.split('.')[0] in "
                    "('model_signing', 'sigstore', 'cryptography', 'pydantic'))\n"
                    "print(loaded)")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_aprfast_signs_and_verifies_in_a_process_without_network(ms, keys, model_dir, tmp_path):
    """Importing aprfast and model_signing, signing and verifying: in a child with no
    network (its own namespace where possible) and sockets that refuse to connect."""
    signer, signer_pub = keys["signer"]
    script = _CLI.split("sys.argv = ")[0] + (
        "import aprfast\n"
        "aprfast.sign_model(sys.argv[1], sys.argv[2], output=sys.argv[4])\n"
        "print(aprfast.verify_model(sys.argv[1], sys.argv[4], sys.argv[3])['valid'])\n")
    package_parent = os.path.dirname(os.path.dirname(os.path.abspath(aprfast.__file__)))
    out = subprocess.run(_without_network([sys.executable, "-c", script, str(model_dir), str(signer), str(signer_pub),
                                           str(tmp_path / "offline.sig")]),
                         capture_output=True, text=True, timeout=180, cwd=str(tmp_path),
                         env=dict(os.environ, PYTHONPATH=package_parent))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "True"


# --- aprfast signs, model_signing verifies --------------------------------------------


def test_aprfast_signs_a_directory_model_signing_verifies(ms, keys, model_dir):
    signer, signer_pub = keys["signer"]
    result = aprfast.sign_model(model_dir, signer)
    bundle = model_dir.parent / "tiny-model.sig"
    assert result["bundle"] == str(bundle) and bundle.exists()
    assert result["files"] == ["config.json", "model.apr", "tokenizer/vocab.txt"]  # .git is left out
    out = cli_verify(model_dir, bundle, signer_pub)
    assert out.returncode == 0, out.stderr + out.stdout
    assert "Verification succeeded" in out.stdout
    api_verify(ms, model_dir, bundle, signer_pub)
    # the bundle is what model_signing's key method writes: Sigstore v0.3 JSON, DSSE in-toto
    document = json.loads(bundle.read_text())
    assert document["mediaType"] == "application/vnd.dev.sigstore.bundle.v0.3+json"
    assert document["verificationMaterial"]["publicKey"]["hint"] == result["key_hint"]
    statement = json.loads(base64.b64decode(document["dsseEnvelope"]["payload"]))
    assert statement["predicateType"] == "https://model_signing/signature/v1.0"
    assert statement["subject"][0] == {"name": "tiny-model", "digest": {"sha256": result["digest"]}}
    assert aprfast.verify_model(model_dir, bundle, signer_pub)["files"] == 3


def test_aprfast_signs_a_single_apr_file(ms, keys, apr_file):
    signer, signer_pub = keys["signer"]
    from aprfast.crypto.core import generate_signing_key

    aprfast.save_file({"w": np.arange(32, dtype=np.float32)}, apr_file, signing_key=generate_signing_key()[0])
    result = aprfast.sign_model(apr_file, signer)
    bundle = apr_file.with_name("single.apr.sig")
    assert result["bundle"] == str(bundle) and result["files"] == ["."]
    out = cli_verify(apr_file, bundle, signer_pub)
    assert out.returncode == 0, out.stderr + out.stdout
    api_verify(ms, apr_file, bundle, signer_pub)
    # the .apr file's own Ed25519 signature is untouched: both signatures hold
    assert verify_file(apr_file)["container"] == "v2"
    flip_byte(apr_file)
    assert cli_verify(apr_file, bundle, signer_pub).returncode != 0
    with pytest.raises(ValueError, match="Signature mismatch"):
        api_verify(ms, apr_file, bundle, signer_pub)
    with pytest.raises(ModelTamperedError) as caught:
        aprfast.verify_model(apr_file, bundle, signer_pub)
    assert caught.value.changed == (".",) and caught.value.path == str(apr_file)


def test_aprfast_signs_a_sharded_model(ms, keys, sharded):
    directory, shards = sharded
    signer, signer_pub = keys["signer"]
    result = aprfast.sign_model(directory, signer, output=directory / "model.sig")  # inside: left out
    assert result["files"] == sorted(shards + ["model.apr.index.json"])
    assert cli_verify(directory, directory / "model.sig", signer_pub).returncode == 0
    assert aprfast.verify_model(directory, directory / "model.sig", signer_pub)["files"] == len(shards) + 1
    # the index alone covers its shards by CRC32 only: refused, pointing at the directory
    with pytest.raises(ValueError, match="sign the directory"):
        aprfast.sign_model(directory / "model.apr.index.json", signer)
    flip_byte(directory / shards[1], offset=100)
    out = cli_verify(directory, directory / "model.sig", signer_pub)
    assert out.returncode != 0 and shards[1] in out.stderr
    with pytest.raises(ModelTamperedError) as caught:
        aprfast.verify_model(directory, directory / "model.sig", signer_pub)
    assert caught.value.changed == (shards[1],) and not caught.value.added and not caught.value.removed
    assert caught.value.path == str(directory / shards[1]) and caught.value.code == "E006"
    (directory / shards[2]).unlink()
    with pytest.raises(ModelTamperedError) as caught:
        aprfast.verify_model(directory, directory / "model.sig", signer_pub)
    assert caught.value.changed == (shards[1],) and caught.value.removed == (shards[2],)


@pytest.mark.parametrize("tamper", ["change", "add", "remove", "add in a subfolder"])
def test_tampering_an_aprfast_bundle_fails_in_model_signing(ms, keys, model_dir, tamper):
    signer, signer_pub = keys["signer"]
    bundle = model_dir.parent / "m.sig"
    aprfast.sign_model(model_dir, signer, output=bundle)
    name = _tamper(model_dir, tamper)
    out = cli_verify(model_dir, bundle, signer_pub)
    assert out.returncode != 0 and "Signature mismatch" in out.stderr and name in out.stderr
    with pytest.raises(ValueError, match="Signature mismatch"):
        api_verify(ms, model_dir, bundle, signer_pub)


def _tamper(model_dir, how) -> str:
    if how == "change":
        flip_byte(model_dir / "model.apr")
        return "model.apr"
    if how == "add":
        (model_dir / "extra.bin").write_bytes(b"\0" * 8)
        return "extra.bin"
    if how == "remove":
        (model_dir / "config.json").unlink()
        return "config.json"
    (model_dir / "tokenizer" / "merges.txt").write_text("x y\n")
    return "tokenizer/merges.txt"


# --- model_signing signs, aprfast verifies --------------------------------------------


def test_model_signing_cli_signs_aprfast_verifies(ms, keys, model_dir, capsys):
    signer, signer_pub = keys["signer"]
    bundle = model_dir / "model.sig"  # inside the model, as model_signing's docs show
    out = cli_sign(model_dir, bundle, signer)
    assert out.returncode == 0, out.stderr + out.stdout
    result = aprfast.verify_model(model_dir, bundle, signer_pub)
    assert result["valid"] and result["files"] == 3 and result["model_name"] == "tiny-model"
    assert main(["verify", str(model_dir), "--bundle", str(bundle), "--public-key", str(signer_pub)]) == 0
    assert "valid: 3 file(s)" in capsys.readouterr().out


def test_model_signing_api_signs_with_p384_aprfast_verifies(ms, tmp_path, model_dir):
    assert main(["keygen", str(tmp_path / "k384"), "--type", "ecdsa-p384"]) == 0
    bundle = tmp_path / "api.sig"
    api_sign(ms, model_dir, bundle, tmp_path / "k384")
    assert aprfast.verify_model(model_dir, bundle, tmp_path / "k384.pub")["valid"]


def test_model_signing_openssl_keys_and_shard_serialization(ms, tmp_path, model_dir):
    """Keys from openssl's own PEM writers (SEC1 private key) and the shard method."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP521R1())
    (tmp_path / "sec1.pem").write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                                          serialization.PrivateFormat.TraditionalOpenSSL,
                                                          serialization.NoEncryption()))
    (tmp_path / "sec1.pub").write_bytes(key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    bundle = tmp_path / "shards.sig"
    api_sign(ms, model_dir, bundle, tmp_path / "sec1.pem",
             hashing=ms.hashing.Config().use_shard_serialization(shard_size=1024))
    assert aprfast.verify_model(model_dir, bundle, tmp_path / "sec1.pub")["valid"]
    flip_byte(model_dir / "model.apr", offset=-3)
    with pytest.raises(ModelTamperedError) as caught:
        aprfast.verify_model(model_dir, bundle, tmp_path / "sec1.pub")
    assert caught.value.changed == ("model.apr",)  # the shard names map back to their file
    # and aprfast signs with the SEC1 key too
    aprfast.sign_model(model_dir, tmp_path / "sec1.pem", output=tmp_path / "again.sig")
    assert cli_verify(model_dir, tmp_path / "again.sig", tmp_path / "sec1.pub").returncode == 0


@pytest.mark.parametrize("tamper, field", [("change", "changed"), ("add", "added"), ("remove", "removed"),
                                           ("add in a subfolder", "added")])
def test_tampering_a_model_signing_bundle_is_named_by_aprfast(ms, keys, model_dir, tamper, field, capsys):
    signer, signer_pub = keys["signer"]
    bundle = model_dir.parent / "cli.sig"
    assert cli_sign(model_dir, bundle, signer).returncode == 0
    name = _tamper(model_dir, tamper)
    with pytest.raises(ModelTamperedError) as caught:
        aprfast.verify_model(model_dir, bundle, signer_pub)
    error = caught.value
    assert isinstance(error, SignatureError) and error.code == "E006"
    assert getattr(error, field) == (name,) and error.path == str(model_dir / name)
    assert f"{field}: {name}" in str(error)
    assert main(["verify", str(model_dir), "--bundle", str(bundle), "--public-key", str(signer_pub), "--json"]) == 5
    report = json.loads(capsys.readouterr().out)
    assert report["valid"] is False and report[field] == [name] and report["code"] == "E006"


def test_ignore_unsigned_files(ms, keys, model_dir):
    signer, signer_pub = keys["signer"]
    bundle = model_dir.parent / "m.sig"
    aprfast.sign_model(model_dir, signer, output=bundle)
    (model_dir / "README.md").write_text("added after signing")
    with pytest.raises(ModelTamperedError):
        aprfast.verify_model(model_dir, bundle, signer_pub)
    assert aprfast.verify_model(model_dir, bundle, signer_pub, ignore_unsigned_files=True)["valid"]
    flip_byte(model_dir / "config.json", offset=0)
    with pytest.raises(ModelTamperedError) as caught:
        aprfast.verify_model(model_dir, bundle, signer_pub, ignore_unsigned_files=True)
    assert caught.value.changed == ("config.json",) and not caught.value.added


# --- keys and bundles that must be refused --------------------------------------------


def test_wrong_key_and_altered_bundles_are_signature_errors(ms, keys, model_dir, tmp_path):
    signer, signer_pub = keys["signer"]
    bundle = tmp_path / "m.sig"
    aprfast.sign_model(model_dir, signer, output=bundle)
    with pytest.raises(SignatureError, match="another key") as caught:
        aprfast.verify_model(model_dir, bundle, keys["other"][1])
    assert not isinstance(caught.value, ModelTamperedError)
    assert cli_verify(model_dir, bundle, keys["other"][1]).returncode != 0
    # a statement rewritten to match a changed file: its signature no longer verifies
    document = json.loads(bundle.read_text())
    statement = json.loads(base64.b64decode(document["dsseEnvelope"]["payload"]))
    statement["predicate"]["resources"][0]["digest"] = "00" * 32
    document["dsseEnvelope"]["payload"] = base64.b64encode(json.dumps(statement).encode()).decode()
    forged = tmp_path / "forged.sig"
    forged.write_text(json.dumps(document))
    with pytest.raises(SignatureError, match="does not verify"):
        aprfast.verify_model(model_dir, forged, signer_pub)
    assert cli_verify(model_dir, forged, signer_pub).returncode != 0
    # not a bundle at all
    for junk in (b"not json", b"[]", b'{"dsseEnvelope": {"payload": "!!"}}', b"[" * 100000, b'{"dsseEnvelope": {}}'):
        (tmp_path / "junk.sig").write_bytes(junk)
        with pytest.raises(BundleError):
            aprfast.verify_model(model_dir, tmp_path / "junk.sig", signer_pub)
    with pytest.raises(AprFileNotFoundError):
        aprfast.verify_model(model_dir, tmp_path / "missing.sig", signer_pub)
    with pytest.raises(AprFileNotFoundError):
        aprfast.sign_model(tmp_path / "missing-model", signer)
    before = (model_dir / "config.json").read_bytes()
    for output in (model_dir / "config.json", model_dir, tmp_path):  # never over the model, never a folder
        with pytest.raises(ValueError, match="file of its own"):
            aprfast.sign_model(model_dir / "config.json" if output == model_dir / "config.json" else model_dir,
                               signer, output=output)
    assert (model_dir / "config.json").read_bytes() == before
    with pytest.raises(ValueError, match="format="):
        aprfast.sign_model(model_dir, signer, format="apr")


def test_symlinks_are_refused_unless_allowed(ms, keys, model_dir, tmp_path):
    signer, signer_pub = keys["signer"]
    (model_dir / "link.json").symlink_to(model_dir / "config.json")
    with pytest.raises(ValueError, match="symbolic link|symlink"):
        aprfast.sign_model(model_dir, signer, output=tmp_path / "m.sig")
    aprfast.sign_model(model_dir, signer, output=tmp_path / "m.sig", allow_symlinks=True)
    assert aprfast.verify_model(model_dir, tmp_path / "m.sig", signer_pub)["files"] == 4
    assert cli_verify(model_dir, tmp_path / "m.sig", signer_pub, "--allow_symlinks").returncode == 0


# --- the commands -----------------------------------------------------------------------


def test_apr_sign_and_verify_commands(ms, tmp_path, model_dir, apr_file, capsys, monkeypatch):
    monkeypatch.setenv("KEY_PASSWORD", "correct horse")
    assert main(["keygen", str(tmp_path / "enc"), "--type", "ecdsa-p256", "--password-env", "KEY_PASSWORD"]) == 0
    assert b"ENCRYPTED" in (tmp_path / "enc").read_bytes()
    capsys.readouterr()
    # a directory is signed as a bundle without --format; a file needs it
    assert main(["sign", str(model_dir), "--key", str(tmp_path / "enc"), "--key-password-env", "KEY_PASSWORD",
                 "--json"]) == 0
    signed = json.loads(capsys.readouterr().out)
    assert signed["bundle"] == str(model_dir.parent / "tiny-model.sig") and len(signed["files"]) == 3
    assert main(["verify", str(model_dir), "--public-key", str(tmp_path / "enc.pub")]) == 0
    out = model_signing_cli("verify", "key", model_dir, "--signature", signed["bundle"], "--public_key",
                            tmp_path / "enc.pub")
    assert out.returncode == 0, out.stderr
    assert main(["sign", "--format", "sigstore", str(apr_file), "--key", str(tmp_path / "enc"),
                 "--key-password-env", "KEY_PASSWORD", "--output", str(tmp_path / "b.sig")]) == 0
    assert main(["verify", str(apr_file), "--bundle", str(tmp_path / "b.sig"), "--public-key",
                 str(tmp_path / "enc.pub"), "--json"]) == 0
    capsys.readouterr()
    flip_byte(apr_file)
    assert main(["verify", str(apr_file), "--bundle", str(tmp_path / "b.sig"), "--public-key",
                 str(tmp_path / "enc.pub")]) == 5
    assert str(apr_file) in capsys.readouterr().err
    # usage errors: no key, a bundle without a public key, a wrong password
    assert main(["sign", "--format", "sigstore", str(apr_file)]) == 2
    assert main(["verify", str(apr_file), "--bundle", str(tmp_path / "b.sig")]) == 2
    monkeypatch.setenv("KEY_PASSWORD", "wrong")
    assert main(["sign", str(model_dir), "--key", str(tmp_path / "enc"), "--key-password-env", "KEY_PASSWORD"]) == 4
