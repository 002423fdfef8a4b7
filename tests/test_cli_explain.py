"""`apr explain`: error codes (E999 says unknown, never crashes), one tensor with fuzzy
suggestions for a missing name, and the architecture from tensor names."""

import json

import numpy as np
import pytest

import aprfast
from aprfast.cli import main
from aprfast.cli.explain import detect_architecture, explain_code, suggest
from aprfast.errors import CODES

APR = "import sys, runpy; sys.argv[0] = 'apr'; runpy.run_module('aprfast.cli', run_name='__main__')"


@pytest.mark.parametrize("code", sorted(CODES))
def test_every_code_is_explained(code, capsys):
    assert main(["explain", code]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{code}: ") and CODES[code] in out and "Troubleshooting" in out


def test_e002_and_lower_case(capsys):
    assert main(["explain", "e002"]) == 0
    out = capsys.readouterr().out
    assert "Corrupted data" in out and "apr validate --checksum" in out


@pytest.mark.parametrize("code", ["E999", "E000", "X1", "E0011"])
def test_unknown_codes_say_unknown_and_exit_1(code, capsys):
    assert main(["explain", code]) == 1
    assert "Unknown Error Code" in capsys.readouterr().out


def test_json(capsys):
    assert main(["explain", "--json", "E004"]) == 0
    e = json.loads(capsys.readouterr().out)
    assert e["known"] and e["category"] == "CHECKSUM"
    assert explain_code("E999")["known"] is False


@pytest.fixture
def whisper(tmp_path, rng):
    path = tmp_path / "w.apr"
    aprfast.save_file({
        "encoder.conv1.weight": (0.04 * rng.standard_normal((8, 4, 3))).astype(np.float32),
        "encoder.layer_norm.weight": np.full(8, 11.0, np.float32),
        "decoder.token_embedding.weight": (0.03 * rng.standard_normal((10, 8))).astype(np.float32),
    }, path)
    return str(path)


def test_tensor_found(whisper, capsys):
    assert main(["explain", "--tensor", "encoder.conv1.weight", whisper]) == 0
    out = capsys.readouterr().out
    assert "Shape: [8, 4, 3]" in out and "Role: convolution" in out and "Mean" in out
    assert main(["explain", "--tensor", "encoder.layer_norm.weight", "--json", whisper]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["status"] == "FAIL" and report["stats"]["mean"] == 11.0


def test_missing_tensor_lists_fuzzy_matches(whisper, capsys):
    assert main(["explain", "--tensor", "encoder.conv.weight", whisper]) == 1
    err = capsys.readouterr().err
    assert "did you mean" in err and "encoder.conv1.weight" in err
    assert main(["explain", "--tensor", "zzzzzzzz", whisper]) == 1
    assert "no similar names" in capsys.readouterr().err
    assert suggest("layer_norm", ["a.layer_norm.weight", "b"]) == ["a.layer_norm.weight"]


def test_architecture(whisper, capsys):
    assert main(["explain", whisper]) == 0
    assert "Whisper" in capsys.readouterr().out
    assert detect_architecture(["model.layers.0.self_attn.q_proj.weight", "model.layers.0.mlp.up.weight"])[
        "architecture"] == "LLaMA"
    assert detect_architecture(["x"]) is None


def test_usage_errors_exit_2(tmp_path, capsys):
    assert main(["explain"]) == 2
    assert main(["explain", "--tensor", "w"]) == 2
    assert main(["explain", "--tensor", "w", str(tmp_path / "missing.apr")]) == 3


def test_as_a_real_command(run_child):
    done = run_child(APR, "explain", "E999")
    assert done.returncode == 1 and "Unknown Error Code" in done.stdout and "Traceback" not in done.stderr
    done = run_child(APR, "explain", "E001")
    assert done.returncode == 0 and "Invalid file format" in done.stdout
