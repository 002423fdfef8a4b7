"""`apr inspect --header / --vocab / --quantization / --full`, and keys for sealed files and
streams (`apr inspect -` of an encrypted or signed APR2 stream)."""

import io
import json
import sys

import numpy as np
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

import aprfast
from aprfast.cli import main
from aprfast.numerics.quantization import quantize

VOCAB = [f"tok{i}" for i in range(30)]


@pytest.fixture
def model(tmp_path, rng):
    path = tmp_path / "m.apr"
    tensors = {"embed_tokens.weight": rng.standard_normal((30, 64)).astype(np.float32),
               "layers.0.w": quantize(rng.standard_normal((4, 64)).astype(np.float32), "q4_0"),
               "layers.1.w": quantize(rng.standard_normal((2, 256)).astype(np.float32), "q8_0")}
    meta = {"tokenizer.vocabulary": VOCAB, "tokenizer.vocab_size": 30, "tokenizer.bos_token_id": 1,
            "long": "x" * 500, "quantization": {"method": "Q4_0", "original_dtype": "F32"}}
    aprfast.save_file(tensors, path, metadata=meta, layout="apr2")
    return path


def run_json(capsys, *argv):
    assert main(["inspect", "--json", *argv]) == 0
    return json.loads(capsys.readouterr().out)


def test_header_alone(model, capsys):
    assert main(["inspect", "--header", str(model)]) == 0
    out = capsys.readouterr().out
    assert "magic: APR2" in out and "data_offset:" in out and "tensors (" not in out and "metadata (" not in out
    report = run_json(capsys, "--header", str(model))
    assert set(report) == {"layout", "header"}
    assert report["header"]["file_size"] == model.stat().st_size and report["header"]["metadata_offset"] == 32


def test_vocab_shows_the_first_tokens_and_special_ids(model, capsys):
    assert main(["inspect", "--vocab", "--max-tokens", "3", str(model)]) == 0
    out = capsys.readouterr().out
    assert "vocabulary (tokenizer.vocabulary): 30 tokens" in out and "bos_token_id=1" in out
    section = out[out.index("vocabulary ("):]
    assert '     2  "tok2"' in section and '"tok3"' not in section and "... 27 more" in section
    vocab = run_json(capsys, "--vocab", str(model))["vocab"]
    assert vocab["tokens"] == VOCAB[:20] and vocab["size"] == 30 and vocab["truncated"] is True
    assert vocab["stated_size"] == 30 and vocab["special_tokens"] == {"bos_token_id": 1}


def test_vocab_absent_says_so(tmp_path, capsys):
    path = tmp_path / "plain.apr"
    aprfast.save_file({"a": np.zeros(4, np.float32)}, path, layout="apr2")
    assert main(["inspect", "--vocab", str(path)]) == 0
    assert "vocabulary: none in the metadata" in capsys.readouterr().out


def test_quantization_type_block_bits_and_original(model, capsys):
    assert main(["inspect", "--quantization", str(model)]) == 0
    out = capsys.readouterr().out
    assert "layers.0.w: Type: Q4_0, Block size: 32, Bits/weight: 4.5, Original: F32" in out  # seed 002 §6.2.6
    assert "layers.1.w: Type: Q8_0, Block size: 32, Bits/weight: 8.5" in out
    quant = run_json(capsys, "--quantization", str(model))["quantization"]
    assert set(quant["tensors"]) == {"layers.0.w", "layers.1.w"}  # the f32 embedding is not quantized
    assert quant["tensors"]["layers.0.w"] == {"type": "Q4_0", "block_size": 32, "bits_per_weight": 4.5,
                                              "original_dtype": "F32"}


def test_quantization_of_a_float_model(tmp_path, capsys):
    path = tmp_path / "f.apr"
    aprfast.save_file({"a": np.zeros(64, np.float32)}, path, layout="apr2")
    assert main(["inspect", "--quantization", str(path)]) == 0
    assert "quantization: none" in capsys.readouterr().out


def test_full_prints_long_values_whole_and_every_section(model, capsys):
    assert main(["inspect", str(model)]) == 0
    short = capsys.readouterr().out
    assert "(502 characters; --full shows all)" in short and "x" * 500 not in short
    assert main(["inspect", "--full", str(model)]) == 0
    full = capsys.readouterr().out
    assert "x" * 500 in full and "vocabulary (" in full and "quantization:" in full and '"tok29"' in full
    report = run_json(capsys, "--full", str(model))
    assert {"header", "metadata", "tensors", "vocab", "quantization"} <= set(report)
    assert len(report["vocab"]["tokens"]) == 30


@pytest.fixture
def sealed(tmp_path, rng):
    """An APR2 file with encrypted names, signed; the Ed25519 public key in a file."""
    signer = Ed25519PrivateKey.generate()
    seed = signer.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                                serialization.NoEncryption())
    public = tmp_path / "signer.pub"
    public.write_bytes(signer.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw))
    path = tmp_path / "sealed.apr"
    aprfast.save_file({"secret.weight": rng.standard_normal((8, 8)).astype(np.float32)}, path,
                      metadata={"owner": "x"}, password="hunter22", encrypt_names=True, signing_key=seed)
    return path, public


def stdin_of(monkeypatch, path):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(path.read_bytes())))


def test_sealed_file_needs_its_key(sealed, capsys, monkeypatch):
    path, public = sealed
    assert main(["inspect", str(path)]) == 4
    assert "E005" in capsys.readouterr().err
    monkeypatch.setenv("APR_TEST_PW", "hunter22")
    report = run_json(capsys, "--password-env", "APR_TEST_PW", "--trusted-key", str(public), str(path))
    assert list(report["tensors"]) == ["secret.weight"] and report["metadata"]["owner"] == "x"
    assert report["header"]["security"]["signed"] is True
    assert main(["inspect", "--password-env", "APR_TEST_PW", str(path)]) == 0
    assert "security: encryption password, signature" in capsys.readouterr().out


def test_inspect_stdin_of_an_encrypted_signed_stream(sealed, capsys, monkeypatch):
    path, public = sealed
    monkeypatch.setenv("APR_TEST_PW", "hunter22")
    stdin_of(monkeypatch, path)
    report = run_json(capsys, "--password-env", "APR_TEST_PW", "--trusted-key", str(public), "-")
    assert list(report["tensors"]) == ["secret.weight"] and report["tensors"]["secret.weight"]["shape"] == [8, 8]
    stdin_of(monkeypatch, path)
    assert main(["inspect", "-"]) == 4  # no key: E005, never a listing of sealed names
    assert "E005" in capsys.readouterr().err
    monkeypatch.setenv("APR_TEST_PW", "wrong")
    stdin_of(monkeypatch, path)
    assert main(["inspect", "--password-env", "APR_TEST_PW", "-"]) == 4


def test_wrong_trusted_key_on_a_signed_stream_fails(sealed, tmp_path, capsys, monkeypatch):
    path, _ = sealed
    other = tmp_path / "other.pub"
    other.write_bytes(Ed25519PrivateKey.generate().public_key().public_bytes(serialization.Encoding.Raw,
                                                                            serialization.PublicFormat.Raw))
    monkeypatch.setenv("APR_TEST_PW", "hunter22")
    stdin_of(monkeypatch, path)
    assert main(["inspect", "--password-env", "APR_TEST_PW", "--trusted-key", str(other), "-"]) == 4
    assert "E006" in capsys.readouterr().err


def test_missing_password_variable_is_a_usage_error(sealed, capsys):
    path, _ = sealed
    assert main(["inspect", "--password-env", "APR_NO_SUCH_VARIABLE_SET", str(path)]) == 2
