"""Pruning, low-rank factorisation and the quality gate on the way through
aprfast.convert and `apr convert` (seed 001 §4.8.1, §4.8.4; issue 13 item 8)."""

import json
import os

import numpy as np
import pytest
import safetensors.numpy as sn

import aprfast
from aprfast.cli import main
from aprfast.convert import QualityGateError, QualityGateWarning, TensorValidationError
from aprfast.convert.optimize import LOWRANK_KEY, PRUNE_KEY, factor, prune_values, reconstruct

FC1, Q = "encoder.layers.0.fc1.weight", "encoder.layers.0.self_attn.q_proj.weight"
LN, EMB = "encoder.layer_norm.weight", "decoder.token_embedding"


def model(rng):
    return {
        EMB: (0.03 * rng.standard_normal((16, 32))).astype(np.float32),
        "encoder.layer_norm.bias": (0.01 * rng.standard_normal(24)).astype(np.float32),
        LN: (1.0 + 0.05 * rng.standard_normal(24)).astype(np.float32),
        FC1: (0.03 * rng.standard_normal((24, 40))).astype(np.float32),
        Q: (0.05 * rng.standard_normal((24, 24))).astype(np.float32),
    }


@pytest.fixture
def src(tmp_path, rng):
    tensors = model(rng)
    path = tmp_path / "m.safetensors"
    sn.save_file(tensors, path)
    return path, tensors


def zeros(a):
    return int(a.size - np.count_nonzero(a))


# --- pruning -----------------------------------------------------------------------------
@pytest.mark.parametrize("sparsity", [0.0, 0.3, 0.5, 0.9, 1.0])
def test_unstructured_pruning_zeroes_exactly_the_fraction_asked(src, tmp_path, sparsity):
    path, tensors = src
    result = aprfast.convert(path, tmp_path / "p.apr", prune={"sparsity": sparsity}, max_drift=None)
    out = aprfast.load_file(tmp_path / "p.apr")
    for name in (FC1, Q):
        n = tensors[name].size
        assert zeros(out[name]) == int(np.floor(sparsity * n + 0.5))
        kept = out[name] != 0  # survivors are unchanged and at least as large as anything zeroed
        np.testing.assert_array_equal(out[name][kept], tensors[name][kept])
        if 0 < sparsity < 1:
            assert np.abs(tensors[name][kept]).min() >= np.abs(tensors[name][~kept]).max()
    assert sorted(t["name"] for t in result["optimize"]["prune"]["tensors"]) == [FC1, Q]


def test_unselected_tensors_are_bit_for_bit_unchanged(src, tmp_path):
    path, tensors = src
    aprfast.convert(path, tmp_path / "p.apr", prune=0.5, lowrank={"rank": 2, "select": [FC1]}, max_drift=None)
    out = aprfast.load_file(tmp_path / "p.apr")
    for name in (EMB, LN, "encoder.layer_norm.bias"):  # norms, biases, embeddings: never by default
        assert out[name].tobytes() == tensors[name].tobytes()


def test_pruning_ties_are_exact_and_by_index(rng):
    values = np.array([[3.0, -1.0, 1.0, 2.0], [1.0, -1.0, 5.0, 0.5]], np.float32)
    pruned, zeroed = prune_values(values, 0.5)  # k = 4: 0.5, then the first three of the five |1|s
    assert zeroed == 4
    np.testing.assert_array_equal(pruned, [[3.0, 0.0, 0.0, 2.0], [0.0, -1.0, 5.0, 0.0]])
    again, _ = prune_values(values, 0.5)
    assert again.tobytes() == pruned.tobytes()


def test_row_pruning_zeroes_whole_rows_with_the_smallest_norms(src, tmp_path):
    path, tensors = src
    aprfast.convert(path, tmp_path / "r.apr", prune={"sparsity": 0.25, "structure": "row", "select": FC1},
                    max_drift=None)
    w, out = tensors[FC1], aprfast.load_file(tmp_path / "r.apr")[FC1]
    zero_rows = np.flatnonzero(~out.any(axis=1))
    norms = np.linalg.norm(w.astype(np.float64), axis=1)
    assert list(zero_rows) == sorted(np.argsort(norms, kind="stable")[:6])  # 0.25 * 24 rows
    kept = np.setdiff1d(np.arange(24), zero_rows)
    np.testing.assert_array_equal(out[kept], w[kept])


def test_pruning_keeps_f16(tmp_path, rng):
    w = rng.standard_normal((8, 16)).astype(np.float16)
    sn.save_file({"fc.weight": w}, tmp_path / "h.safetensors")
    aprfast.convert(tmp_path / "h.safetensors", tmp_path / "h.apr", prune=0.5, max_drift=None)
    out = aprfast.load_file(tmp_path / "h.apr")["fc.weight"]
    assert out.dtype == np.float16 and zeros(out) == 64


def test_pruning_bf16_changes_only_the_zeroed_elements(tmp_path, rng):
    from aprfast.numerics.precision import to_bfloat16, to_float32

    w = to_bfloat16(rng.standard_normal((8, 16)).astype(np.float32))
    aprfast.save_file({"fc.weight": w}, tmp_path / "b.apr")
    aprfast.convert(tmp_path / "b.apr", tmp_path / "p.apr", prune=0.25, max_drift=None)
    with aprfast.open(tmp_path / "p.apr") as f:
        assert f.info("fc.weight").dtype.name == "BF16"
        out = to_float32(f.get_tensor("fc.weight"))
    src = to_float32(w)
    assert zeros(out) == 32
    np.testing.assert_array_equal(out[out != 0], src[out != 0])


def test_tied_pytorch_weights_pruned_and_factored(tmp_path):
    torch = pytest.importorskip("torch")
    weight = torch.randn(32, 48, generator=torch.Generator().manual_seed(0))
    torch.save({"a.weight": weight, "b.weight": weight}, tmp_path / "m.pt")
    aprfast.convert(tmp_path / "m.pt", tmp_path / "p.apr", prune=0.5, max_drift=None)  # stored once
    with aprfast.open(tmp_path / "p.apr") as f:
        assert f.info("a.weight").offset == f.info("b.weight").offset
        assert zeros(f.get_tensor("a.weight")) == 768
    aprfast.convert(tmp_path / "m.pt", tmp_path / "l.apr", lowrank=4, max_drift=None)
    for name in ("a.weight", "b.weight"):
        np.testing.assert_allclose(reconstruct(tmp_path / "l.apr", name), reconstruct(
            *factor(weight.numpy(), 4)), rtol=1e-5, atol=1e-6)


# --- low-rank ----------------------------------------------------------------------------
def test_lowrank_factors_reach_the_svds_optimal_error(src, tmp_path):
    path, tensors = src
    result = aprfast.convert(path, tmp_path / "l.apr", lowrank={"rank": 5, "select": FC1}, max_drift=None)
    out = aprfast.load_file(tmp_path / "l.apr")
    a, b = out[FC1 + ".lowrank_a"], out[FC1 + ".lowrank_b"]
    assert FC1 not in out and a.shape == (24, 5) and b.shape == (5, 40)
    w = tensors[FC1].astype(np.float64)
    s = np.linalg.svd(w, compute_uv=False)
    optimal = np.sqrt(np.sum(s[5:] ** 2))
    error = np.linalg.norm(w - a.astype(np.float64) @ b)
    assert error == pytest.approx(optimal, rel=1e-4)
    np.testing.assert_allclose(reconstruct(tmp_path / "l.apr", FC1), a @ b, rtol=1e-6)
    (entry,) = result["quality"]["tensors"]
    assert entry["name"] == FC1 and entry["op"] == "lowrank"
    assert entry["relative_l2"] == pytest.approx(optimal / np.linalg.norm(w), rel=1e-4)


def test_lowrank_names_and_rank_are_recorded_in_the_metadata(src, tmp_path):
    path, _ = src
    aprfast.convert(path, tmp_path / "l.apr", lowrank=4, max_drift=None)
    with aprfast.open(tmp_path / "l.apr") as f:
        record = f.metadata[LOWRANK_KEY]
    assert set(record) == {FC1, Q}
    assert record[Q] == {"a": Q + ".lowrank_a", "b": Q + ".lowrank_b", "rank": 4, "shape": [24, 24],
                         "dtype": "F32", "scaling": "sqrt"}


def test_lowrank_without_saving_is_skipped_and_reported(src, tmp_path):
    path, tensors = src
    # 24x24: rank 12 stores 12 * 48 = 576 = 24 * 24, no saving; 24x40: 12 * 64 = 768 < 960
    result = aprfast.convert(path, tmp_path / "l.apr", lowrank=12, max_drift=None)
    lr = result["optimize"]["lowrank"]
    assert [t["name"] for t in lr["tensors"]] == [FC1]
    assert [s["name"] for s in lr["skipped"]] == [Q] and "no saving" in lr["skipped"][0]["reason"]
    out = aprfast.load_file(tmp_path / "l.apr")
    assert out[Q].tobytes() == tensors[Q].tobytes()


def test_factor_is_deterministic_and_balanced(rng):
    w = rng.standard_normal((10, 7)).astype(np.float32)
    a, b = factor(w, 3)
    a2, b2 = factor(w.copy(), 3)
    assert a.tobytes() == a2.tobytes() and b.tobytes() == b2.tobytes()
    np.testing.assert_allclose(np.linalg.norm(a, axis=0), np.linalg.norm(b, axis=1), rtol=1e-5)


def test_lowrank_then_quantize_the_factors(tmp_path):
    w = np.random.default_rng(1).standard_normal((64, 96)).astype(np.float32)
    sn.save_file({"fc.weight": w}, tmp_path / "w.safetensors")
    result = aprfast.convert(tmp_path / "w.safetensors", tmp_path / "wq.apr", lowrank=32, quantize="Q8_0",
                             max_drift=None)
    with aprfast.open(tmp_path / "wq.apr") as f:
        assert [f.info(n).dtype.name for n in ("fc.weight.lowrank_a", "fc.weight.lowrank_b")] == ["Q8_0", "Q8_0"]
        restored = reconstruct(f, "fc.weight")
    a, b = factor(w, 32)
    (entry,) = result["quality"]["tensors"]  # measured on the quantized factors, not the exact ones
    assert entry["relative_l2"] == pytest.approx(np.linalg.norm(w - restored) / np.linalg.norm(w), rel=1e-3)
    assert entry["relative_l2"] > np.linalg.norm(w - a @ b) / np.linalg.norm(w)


# --- the quality gate ------------------------------------------------------------------------
def test_the_gate_fails_naming_the_tensor_and_numbers_and_leaves_nothing(src, tmp_path):
    path, _ = src
    with pytest.raises(QualityGateError) as info:
        aprfast.convert(path, tmp_path / "p.apr", prune=0.5)  # ~0.27 relative L2 > 0.1
    err = info.value
    assert isinstance(err, TensorValidationError) and err.code == "E009"
    assert err.tensor in (FC1, Q) and err.drift > 0.1 and err.max_drift == 0.1
    assert err.tensor in str(err) and f"{err.drift:.4g}" in str(err) and "max 0.1" in str(err)
    assert sorted(os.listdir(tmp_path)) == ["m.safetensors"]


def test_force_writes_past_the_gate_with_a_warning(src, tmp_path):
    path, _ = src
    with pytest.warns(QualityGateWarning):
        result = aprfast.convert(path, tmp_path / "p.apr", prune=0.5, force=True)
    assert sorted(result["quality"]["failed"]) == [FC1, Q]
    assert (tmp_path / "p.apr").exists()


def test_max_drift_raises_the_limit(src, tmp_path):
    path, _ = src
    result = aprfast.convert(path, tmp_path / "p.apr", prune=0.5, max_drift=0.5)
    assert result["quality"]["failed"] == [] and 0.1 < result["quality"]["worst"]["relative_l2"] < 0.5


def test_quantize_and_precision_are_measured_lossless_skips_the_gate(src, tmp_path):
    path, tensors = src
    q = aprfast.convert(path, tmp_path / "q.apr", quantize="Q8_0", precision="f16")["quality"]
    ops = {t["name"]: t["op"] for t in q["tensors"]}
    assert ops[EMB] == "quantize" and ops[FC1] == "precision"  # FC1: rows of 40 do not fit Q8_0 blocks
    assert ops[LN] == "precision" and len(ops) == len(tensors)
    for t in q["tensors"]:
        assert 0 < t["relative_l2"] < 0.01 and t["max_abs_delta"] > 0
    assert aprfast.convert(path, tmp_path / "same.apr")["quality"] is None
    widened = aprfast.convert(tmp_path / "q.apr", tmp_path / "w.apr", precision="f32")["quality"]
    assert widened["measured"] == 0  # dequantizing / widening changes no value


# --- the command line --------------------------------------------------------------------------
def test_cli_prune_json_reports_drift(src, tmp_path, capsys):
    path, _ = src
    out = tmp_path / "p.apr"
    assert main(["convert", str(path), "-o", str(out), "--prune", "0.5", "--max-drift", "0.5", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert {t["name"] for t in result["quality"]["tensors"]} == {FC1, Q}
    with aprfast.open(out) as f:
        assert f.metadata[PRUNE_KEY]["tensors"] == [FC1, Q]


def test_cli_gate_exits_5_and_force_overrides(src, tmp_path, capsys):
    path, _ = src
    out = tmp_path / "p.apr"
    assert main(["convert", str(path), str(out), "--prune", "0.5"]) == 5
    err = capsys.readouterr().err
    assert "quality gate failed" in err and "max 0.1" in err and not out.exists()
    assert main(["convert", str(path), str(out), "--prune", "0.5", "--force"]) == 0
    text = capsys.readouterr().out
    assert f"FAIL {FC1}" in text and "quality gate (max 0.1)" in text


def test_cli_lowrank_both_spellings_and_target(src, tmp_path, capsys):
    path, _ = src
    for i, flags in enumerate((["--lowrank", "4"], ["--lowrank", "svd", "--rank", "4"])):
        out = tmp_path / f"l{i}.apr"
        assert main(["convert", str(path), str(out), *flags, "--target", "*fc1*", "--max-drift", "off"]) == 0
        assert "lowrank: rank 4, 1 tensors factored" in capsys.readouterr().out
        with aprfast.open(out) as f:
            assert list(f.metadata[LOWRANK_KEY]) == [FC1]


@pytest.mark.parametrize("flags", [["--prune", "1.5"], ["--lowrank", "svd"], ["--lowrank", "lora"],
                                   ["--rank", "4"], ["--target", "*"], ["--max-drift", "x"],
                                   ["--prune-structure", "row"]])
def test_cli_bad_optimize_flags_are_usage_errors(src, tmp_path, flags):
    path, _ = src
    assert main(["convert", str(path), str(tmp_path / "o.apr"), *flags]) == 2
    assert not (tmp_path / "o.apr").exists()
