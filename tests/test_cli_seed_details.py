"""Issue 28 item 10: seed 001 §4's CLI details.  `apr validate` catches a vocabulary
size that disagrees with the embedding rows (acceptance item 33, "Vocab Match");
`--precision fp16` and `--quantize fp16` (the seed's spellings) are accepted;
`APR_LOG_LEVEL=debug` adds debug lines to stderr; `apr inspect` of a v1 file shows the
v1 header fields (model type, flags, compression, sizes)."""

import json

import numpy as np
import pytest

import aprfast
from aprfast import v1
from aprfast.cli import main


@pytest.fixture
def model(tmp_path, rng):
    path = tmp_path / "m.apr"
    aprfast.save_file({"decoder.token_embedding": rng.normal(0, 0.03, (512, 64)).astype(np.float32),
                       "layers.0.attn.q_proj.weight": rng.normal(0, 0.03, (64, 64)).astype(np.float32)},
                      path, metadata={"n_vocab": 512})
    return path


def test_validate_catches_n_vocab_against_the_embedding_rows_by_default(tmp_path, rng, capsys):
    path = tmp_path / "v.apr"
    aprfast.save_file({"decoder.token_embedding": rng.normal(0, 0.03, (512, 64)).astype(np.float32)}, path,
                      metadata={"n_vocab": 500})
    assert main(["validate", str(path)]) == 5
    out, err = capsys.readouterr()
    assert "[FAIL] shapes [E009]: n_vocab=500 but decoder.token_embedding dim 0 is 512" in out
    assert "shapes failed" in err


def test_validate_of_a_matching_vocabulary_passes(model, capsys):
    assert main(["validate", str(model), "--json"]) == 0
    checks = {c["name"]: c["status"] for c in json.loads(capsys.readouterr().out)["checks"]}
    assert checks == {"checksum": "PASS", "nan-check": "PASS", "zero-check": "PASS", "shapes": "PASS"}


@pytest.mark.parametrize("argv", [["--precision", "fp16"], ["--quantize", "fp16"], ["--precision", "float16"],
                                  ["--quantize", "f16", "--precision", "fp16"]])
def test_the_seeds_fp16_spellings(model, tmp_path, argv):
    out = tmp_path / "h.apr"
    assert main(["convert", str(model), str(out), *argv]) == 0
    with aprfast.open(out) as f:
        assert {f.info(n).dtype_name for n in f.keys()} == {"F16"}


def test_quantize_bf16_and_disagreeing_precisions(model, tmp_path, capsys):
    assert main(["convert", str(model), str(tmp_path / "b.apr"), "--quantize", "bf16"]) == 0
    with aprfast.open(tmp_path / "b.apr") as f:
        assert {f.info(n).dtype_name for n in f.keys()} == {"BF16"}
    assert main(["convert", str(model), str(tmp_path / "x.apr"), "--quantize", "fp16", "--precision", "bf16"]) == 2
    assert "disagree" in capsys.readouterr().err


def test_apr_log_level_debug_adds_debug_lines(model, tmp_path, monkeypatch, capsys):
    assert main(["tensors", str(model), "--stats"]) == 0
    assert "DEBUG" not in capsys.readouterr().err
    monkeypatch.setenv("APR_LOG_LEVEL", "debug")
    assert main(["tensors", str(model), "--stats"]) == 0
    err = capsys.readouterr().err
    debug = [line for line in err.splitlines() if line.startswith("apr: DEBUG: ")]
    assert any("command: apr tensors" in line for line in debug)
    assert any(f"opened {model}" in line for line in debug)
    assert any(f"{model}: CRC32 checked while reading" in line for line in debug)  # issue 28 item 1: no own pass
    assert any("exit 0 after" in line for line in debug)
    assert main(["convert", str(model), str(tmp_path / "c.safetensors")]) == 0
    assert "apr: DEBUG: convert " in capsys.readouterr().err


def test_inspect_of_a_v1_file_shows_the_v1_header(tmp_path, capsys):
    path = tmp_path / "v1.apr"
    v1.save_model({"w": np.ones((4, 4), np.float32)}, path, compression="zstd", password="pw")
    assert main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    assert "v1 model container (APRN, version 1.0)" in out
    assert "model type: NeuralCustom (0x0021)" in out
    assert "flags: 0x01 ENCRYPTED" in out
    assert "compression ZstdDefault" in out and "uncompressed" in out and "bytes stored" in out
    assert main(["inspect", str(path), "--json"]) == 0
    header = json.loads(capsys.readouterr().out)["header"]
    assert {"model_type_name", "flag_names", "compression_name", "payload_size", "uncompressed_size",
            "metadata_size"} <= set(header)
