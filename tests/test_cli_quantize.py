"""`apr quantize` (seed 002 §6.2.6): --type, --embedding-type / --output-type / --layer
overrides, the per-tensor report (bits/weight, RMSE, max abs error) against values
computed here, the bytes written equal to aprfast.numerics.quantization's, --force, exit codes."""

import json

import numpy as np
import pytest

import aprfast
from aprfast.cli import main
from aprfast.numerics.quantization import dequantize, quantize


@pytest.fixture
def model(tmp_path, rng):
    path = tmp_path / "m.apr"
    tensors = {"model.embed_tokens.weight": (0.02 * rng.standard_normal((64, 64))).astype(np.float32),
               "layers.0.attn.q_proj.weight": (0.05 * rng.standard_normal((64, 64))).astype(np.float32),
               "layers.0.mlp.fc1.weight": (0.05 * rng.standard_normal((128, 64))).astype(np.float32),
               "layers.0.norm.weight": np.ones(64, np.float32),
               "lm_head.weight": (0.02 * rng.standard_normal((64, 64))).astype(np.float32),
               "step": np.array([7], np.int64)}
    aprfast.save_file(tensors, path, metadata={"name": "tiny", "license": "MIT"}, layout="apr2")
    return path, tensors


def run_json(capsys, *argv):
    assert main(["quantize", "--json", *argv]) == 0
    return json.loads(capsys.readouterr().out)


def expected_error(values, kind):
    restored = dequantize(quantize(values, kind)).astype(np.float64)
    diff = restored - values.astype(np.float64)
    return float(np.sqrt(np.mean(diff * diff))), float(np.max(np.abs(diff)))


def test_q8_0_report_and_bytes_match_the_quantization_api(model, tmp_path, capsys):
    src, tensors = model
    out = tmp_path / "q8.apr"
    result = run_json(capsys, str(src), "-o", str(out), "--type", "q8_0")
    report = result["tensors"]
    for name in ("model.embed_tokens.weight", "layers.0.attn.q_proj.weight", "layers.0.mlp.fc1.weight",
                 "lm_head.weight"):
        entry = report[name]
        assert entry["type"] == "Q8_0" and entry["bits_per_weight"] == 8.5 and entry["original_dtype"] == "F32"
        rmse, worst = expected_error(tensors[name], "q8_0")
        assert entry["rmse"] == pytest.approx(rmse, rel=1e-9) and entry["max_abs_error"] == pytest.approx(worst)
    assert report["layers.0.norm.weight"]["type"] is None and "1-D" in report["layers.0.norm.weight"]["reason"]
    assert report["step"]["type"] is None and "not floating point" in report["step"]["reason"]
    assert result["quantized"] == 4 and result["kept"] == 2 and result["bits_per_weight"] == 8.5
    with aprfast.open(out) as f:
        stored = f.get_tensor("layers.0.mlp.fc1.weight")
        assert f.info("layers.0.mlp.fc1.weight").dtype_name == "Q8_0"
        assert bytes(np.asarray(stored.data)) == bytes(np.asarray(quantize(tensors["layers.0.mlp.fc1.weight"],
                                                                           "q8_0").data))
        np.testing.assert_array_equal(f.get_tensor("layers.0.norm.weight"), tensors["layers.0.norm.weight"])
        assert f.metadata["name"] == "tiny" and f.metadata["license"] == "MIT"
    assert result["output_bytes"] < result["input_bytes"] / 3


def test_embedding_and_output_types_override_the_default(model, tmp_path, capsys):
    src, _ = model
    out = tmp_path / "mixed.apr"
    result = run_json(capsys, str(src), "-o", str(out), "--type", "q4_0", "--embedding-type", "q8_0",
                      "--output-type", "keep")
    types = {n: t["type"] for n, t in result["tensors"].items()}
    assert types["model.embed_tokens.weight"] == "Q8_0"
    assert types["layers.0.attn.q_proj.weight"] == "Q4_0" and types["layers.0.mlp.fc1.weight"] == "Q4_0"
    assert types["lm_head.weight"] is None
    assert result["tensors"]["layers.0.attn.q_proj.weight"]["bits_per_weight"] == 4.5
    main(["inspect", "--quantization", "--json", str(out)])
    quant = json.loads(capsys.readouterr().out)["quantization"]
    assert quant["tensors"]["model.embed_tokens.weight"]["original_dtype"] == "F32"  # recorded for inspect


def test_layer_rules_come_first_in_order(model, tmp_path, capsys):
    src, _ = model
    out = tmp_path / "rules.apr"
    result = run_json(capsys, str(src), "-o", str(out), "--type", "q4_0", "--layer", "*.mlp.*=q4_1",
                      "--layer", "*attn*=keep", "--layer", "*=q8_0", "--embedding-type", "q4_0")
    types = {n: t["type"] for n, t in result["tensors"].items()}
    assert types["layers.0.mlp.fc1.weight"] == "Q4_1"
    assert types["layers.0.attn.q_proj.weight"] is None
    assert "'*attn*'" in result["tensors"]["layers.0.attn.q_proj.weight"]["reason"]
    assert types["model.embed_tokens.weight"] == "Q8_0"  # "*" came before --embedding-type


def test_quantize_1d_includes_norms(model, tmp_path, capsys):
    src, tensors = model
    result = run_json(capsys, str(src), "-o", str(tmp_path / "all.apr"), "--type", "q8_0", "--quantize-1d")
    assert result["tensors"]["layers.0.norm.weight"]["type"] == "Q8_0"
    rmse, _ = expected_error(tensors["layers.0.norm.weight"], "q8_0")
    assert result["tensors"]["layers.0.norm.weight"]["rmse"] == pytest.approx(rmse, rel=1e-9)
    assert result["tensors"]["step"]["type"] is None  # 1-D too, but an integer tensor stays as it is


def test_text_report(model, tmp_path, capsys):
    src, _ = model
    assert main(["quantize", str(src), "-o", str(tmp_path / "t.apr"), "--type", "q4_0"]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("layers.0.mlp.fc1.weight"))
    assert "Q4_0" in line and "4.500" in line
    assert "4 tensor(s) quantized (4.500 bits/weight), 2 kept" in out


def test_never_overwrites_without_force(model, tmp_path, capsys):
    src, _ = model
    out = tmp_path / "exists.apr"
    out.write_bytes(b"keep me")
    assert main(["quantize", str(src), "-o", str(out), "--type", "q8_0"]) == 1
    assert "pass --force" in capsys.readouterr().err and out.read_bytes() == b"keep me"
    assert main(["quantize", str(src), "-o", str(out), "--type", "q8_0", "--force"]) == 0
    with aprfast.open(out) as f:
        assert f.info("lm_head.weight").dtype_name == "Q8_0"


@pytest.mark.parametrize("argv, message", [
    (["--type", "q9_9"], "unknown quantization type"),
    (["--type", "iq3_xxs"], "no IQ3_XXS quantizer"),
    (["--type", "keep"], "--type must name"),
    (["--type", "q8_0", "--layer", "nonsense"], "GLOB=TYPE"),
    (["--type", "q8_0", "--embedding-type", "int3"], "--embedding-type int3"),
])
def test_bad_types_exit_2(model, tmp_path, capsys, argv, message):
    src, _ = model
    out = tmp_path / "never.apr"
    assert main(["quantize", str(src), "-o", str(out), *argv]) == 2
    assert message in capsys.readouterr().err and not out.exists()


def test_missing_input_exits_3_and_corrupt_input_4(tmp_path, capsys):
    assert main(["quantize", str(tmp_path / "absent.apr"), "-o", str(tmp_path / "o.apr"), "--type", "q8_0"]) == 3
    junk = tmp_path / "junk.apr"
    junk.write_bytes(b"APR2" + b"\0" * 40)
    assert main(["quantize", str(junk), "-o", str(tmp_path / "o.apr"), "--type", "q8_0"]) == 4
    assert "E00" in capsys.readouterr().err and not (tmp_path / "o.apr").exists()


def test_output_is_required(model, capsys):
    src, _ = model
    assert main(["quantize", str(src), "--type", "q8_0"]) == 2  # OUT or -o OUT (issue 28 item 3)
    assert "no output" in capsys.readouterr().err


def test_type_from_the_config_file_and_missing_type(model, tmp_path, monkeypatch, capsys):
    src, _ = model
    assert main(["quantize", str(src), "-o", str(tmp_path / "no.apr")]) == 2
    assert "--type is required" in capsys.readouterr().err
    cfg = tmp_path / "config.toml"
    cfg.write_text('[quantize]\ntype = "q8_0"\n')
    monkeypatch.setenv("APR_CONFIG", str(cfg))
    result = run_json(capsys, str(src), "-o", str(tmp_path / "cfg.apr"))
    assert result["type"] == "Q8_0"
    result = run_json(capsys, str(src), "-o", str(tmp_path / "cli.apr"), "--type", "q4_0")  # command line wins
    assert result["type"] == "Q4_0"


def test_q8_k_quantizes_whole_256_rows_and_keeps_the_others(tmp_path, rng, capsys):
    """Q8_K (ggml's int8 dot-product operand, issue 27 item 3) through the CLI: the bytes are
    the API's; rows that are not whole 256-blocks stay as they were, with the reason."""
    src, out = tmp_path / "m.apr", tmp_path / "q8k.apr"
    wide = (0.05 * rng.standard_normal((8, 256))).astype(np.float32)
    narrow = (0.05 * rng.standard_normal((8, 64))).astype(np.float32)
    aprfast.save_file({"a.weight": wide, "b.weight": narrow}, src, layout="apr2")
    result = run_json(capsys, str(src), "-o", str(out), "--type", "q8_k")
    entry = result["tensors"]["a.weight"]
    assert entry["type"] == "Q8_K" and entry["bits_per_weight"] == 9.125
    rmse, worst = expected_error(wide, "q8_k")
    assert entry["rmse"] == pytest.approx(rmse, rel=1e-9) and entry["max_abs_error"] == pytest.approx(worst)
    assert result["tensors"]["b.weight"]["type"] is None
    assert "multiple of 256" in result["tensors"]["b.weight"]["reason"]
    with aprfast.open(out) as f:
        assert f.info("a.weight").dtype_name == "Q8_K"
        assert bytes(np.asarray(f.get_tensor("a.weight").data)) == bytes(np.asarray(quantize(wide, "q8_k").data))
        np.testing.assert_array_equal(f.get_tensor("b.weight"), narrow)
