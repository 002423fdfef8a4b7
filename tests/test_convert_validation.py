"""Inline validation (seed 001 §10.9-10.11, §13.6): every tensor checked against its
expected statistics as it is written; strict aborts with a typed error naming the tensor
and the numbers and leaves no output; relaxed and force=True warn and write; off skips.
One rule table (aprfast.numerics.expectations) for convert, `apr tensors --stats` and `apr
validate --stats`.  Also convert(quantize=) with per-layer rules (issue 12 part 10)."""

import json
import os
import warnings

import numpy as np
import pytest
import safetensors.numpy as sn

import aprfast
from aprfast.cli import main
from aprfast.convert import TensorValidationError, ValidationWarning
from aprfast.numerics.stats import tensor_stats_numpy

NAN_BITS, INF_BITS = 0x7FC00000, 0x7F800000


def whisper_like(rng, *, ln_mean=1.0):
    """A small healthy model in canonical Whisper names (sorted order = write order)."""
    return {
        "decoder.token_embedding": (0.03 * rng.standard_normal((16, 32))).astype(np.float32),
        "encoder.conv1.weight": (0.03 * rng.standard_normal((8, 32))).astype(np.float32),
        "encoder.layer_norm.bias": (0.01 * rng.standard_normal(8)).astype(np.float32),
        "encoder.layer_norm.weight": (ln_mean + 0.05 * rng.standard_normal(8)).astype(np.float32),
        "encoder.layers.0.fc1.weight": (0.03 * rng.standard_normal((8, 32))).astype(np.float32),
        "encoder.layers.0.self_attn.q_proj.weight": (0.05 * rng.standard_normal((8, 32))).astype(np.float32),
    }


def write(tmp_path, tensors, name="m.safetensors"):
    path = tmp_path / name
    sn.save_file(tensors, path)
    return path


def only_sources(tmp_path, *names):
    """The directory holds the sources and nothing else: no output, no temp file."""
    assert sorted(os.listdir(tmp_path)) == sorted(names)


def test_a_healthy_model_passes_strict_which_is_the_default(tmp_path, rng):
    src = write(tmp_path, whisper_like(rng))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no Python warning for a healthy model
        result = aprfast.convert(src, tmp_path / "m.apr")
    assert result["validation"] == {"mode": "strict", "checked": 6, "failed": [], "warned": [], "skipped": []}


def test_layernorm_mean_11_aborts_naming_the_tensor_and_leaves_nothing(tmp_path, rng):
    tensors = whisper_like(rng, ln_mean=11.0)  # seed §10.11's failure mode
    src = write(tmp_path, tensors)
    done = []
    with pytest.raises(TensorValidationError) as info:
        aprfast.convert(src, tmp_path / "m.apr", progress=lambda d, t: done.append(d))
    err = info.value
    assert err.code == "E009" and isinstance(err, aprfast.ValidationError) and isinstance(err, ValueError)
    assert err.tensor == "encoder.layer_norm.weight" and err.role == "layernorm weight"
    mean = float(tensors["encoder.layer_norm.weight"].astype(np.float64).mean())
    assert err.stats["mean"] == pytest.approx(mean, rel=1e-6)
    assert err.stats["mean"] == pytest.approx(tensor_stats_numpy(tensors["encoder.layer_norm.weight"]).mean)
    assert err.reasons == (f"mean {mean:.4g} outside [0.5, 3.0]",)
    message = str(err)
    assert "'encoder.layer_norm.weight' (layernorm weight)" in message and f"mean {mean:.4g}" in message
    assert "outside [0.5, 3.0]" in message and "nothing written" in message
    # inline: it stopped at that tensor (the 4th written), the two after it were never read
    assert len(done) == 3
    only_sources(tmp_path, "m.safetensors")


@pytest.mark.parametrize("bits,what", [(NAN_BITS, "1 NaN, 0 Inf"), (INF_BITS, "0 NaN, 1 Inf"),
                                       (INF_BITS | 0x80000000, "0 NaN, 1 Inf")])
def test_nan_or_inf_anywhere_aborts(tmp_path, rng, bits, what):
    tensors = whisper_like(rng)
    weight = tensors["encoder.layers.0.fc1.weight"]
    weight.view(np.uint32)[3, 17] = bits  # seed QA #26/#27: one injected value
    src = write(tmp_path, tensors)
    with pytest.raises(TensorValidationError, match=f"'encoder.layers.0.fc1.weight' \\(linear weight\\).*{what} "
                                                    "in 256 values"):
        aprfast.convert(src, tmp_path / "m.apr")
    only_sources(tmp_path, "m.safetensors")


def test_a_name_without_a_rule_is_still_checked_for_nan(tmp_path, rng):
    values = np.ones(10, np.float32)
    values[4] = np.nan
    src = write(tmp_path, {"something.else": values})
    with pytest.raises(TensorValidationError, match="'something.else' fails.*1 NaN, 0 Inf in 10 values"):
        aprfast.convert(src, tmp_path / "m.apr")


def test_the_value_checked_is_the_value_written(tmp_path, rng):
    # 1e6 is a fine f32 but overflows f16: precision="f16" would write +Inf
    tensors = whisper_like(rng)
    tensors["encoder.layers.0.fc1.weight"][0, 0] = 1e6
    src = write(tmp_path, tensors)
    aprfast.convert(src, tmp_path / "f32.apr")  # as it is: finite, passes
    with pytest.raises(TensorValidationError, match="fc1.weight.*0 NaN, 1 Inf"):
        aprfast.convert(src, tmp_path / "f16.apr", precision="f16")
    assert not (tmp_path / "f16.apr").exists()


def test_quantized_tensors_are_checked_through_their_blocks(tmp_path, rng):
    bad = aprfast.quantize((11 + 0.1 * rng.standard_normal((4, 32))).astype(np.float32), "Q8_0")
    aprfast.save_file({"blk.0.attn_norm.weight": bad}, tmp_path / "q.apr")  # GGUF-style name, packed
    with pytest.raises(TensorValidationError, match="'blk.0.attn_norm.weight'.*mean 11"):
        aprfast.convert(tmp_path / "q.apr", tmp_path / "out.apr")


def test_relaxed_warns_and_writes(tmp_path, rng):
    tensors = whisper_like(rng, ln_mean=11.0)
    src = write(tmp_path, tensors)
    with pytest.warns(ValidationWarning, match="'encoder.layer_norm.weight'.*written anyway \\(validate='relaxed'\\)"):
        result = aprfast.convert(src, tmp_path / "m.apr", validate="relaxed")
    assert [f["name"] for f in result["validation"]["failed"]] == ["encoder.layer_norm.weight"]
    with aprfast.open(tmp_path / "m.apr") as f:
        np.testing.assert_array_equal(f.get_tensor("encoder.layer_norm.weight"), tensors["encoder.layer_norm.weight"])


def test_force_writes_past_a_failure_and_replaces_the_destination(tmp_path, rng):
    src = write(tmp_path, whisper_like(rng, ln_mean=11.0))
    (tmp_path / "m.apr").write_bytes(b"old")
    with pytest.warns(ValidationWarning, match="written anyway \\(validate='strict', force=True\\)"):
        result = aprfast.convert(src, tmp_path / "m.apr", force=True)
    assert result["validation"]["mode"] == "strict" and len(result["validation"]["failed"]) == 1
    with aprfast.open(tmp_path / "m.apr") as f:
        assert len(f.keys()) == 6


def test_off_computes_nothing(tmp_path, rng):
    src = write(tmp_path, whisper_like(rng, ln_mean=11.0))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = aprfast.convert(src, tmp_path / "m.apr", validate="off")
    assert result["validation"] == {"mode": "off", "checked": 0, "failed": [], "warned": [], "skipped": []}


def test_expected_std_ranges_only_warn_in_the_report(tmp_path, rng):
    tensors = whisper_like(rng)
    tensors["decoder.token_embedding"] = rng.standard_normal((16, 32)).astype(np.float32)  # QA #30: std 1.0
    src = write(tmp_path, tensors)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = aprfast.convert(src, tmp_path / "m.apr")
    (warned,) = result["validation"]["warned"]
    assert warned["name"] == "decoder.token_embedding" and warned["role"] == "token embedding"
    assert warned["reasons"][0].endswith("above 0.2")


def test_tensors_without_statistics_are_listed_as_skipped(tmp_path, rng):
    aprfast.save_file({"c": (rng.standard_normal(4) + 1j).astype(np.complex64), "x": np.ones(3, np.float32)},
                      tmp_path / "c.apr")
    result = aprfast.convert(tmp_path / "c.apr", tmp_path / "out.apr")
    assert result["validation"]["skipped"] == ["c"] and result["validation"]["checked"] == 1


@pytest.mark.parametrize("destination,options", [("m.gguf", {}), ("m.safetensors", {}),
                                                 ("shards", {"max_shard_size": 600}),
                                                 ("z.apr", {"compression": "zstd"})])
def test_no_output_is_left_by_any_writer(tmp_path, rng, destination, options):
    if "compression" in options:
        pytest.importorskip("zstandard")
    tensors = whisper_like(rng)
    tensors["encoder.layers.0.self_attn.q_proj.weight"][1, 1] = np.nan  # the last tensor: after the others
    # compressed output is APR2: from an APR2 source, so no LayoutChangeWarning (issue 28 item 8)
    aprfast.save_file(tensors, tmp_path / "m.apr", layout="apr2" if "compression" in options else "auto")
    with pytest.raises(TensorValidationError, match="q_proj"):
        aprfast.convert(tmp_path / "m.apr", tmp_path / destination, **options)
    only_sources(tmp_path, "m.apr")


def test_tied_pytorch_weights_are_checked_before_the_write(tmp_path):
    torch = pytest.importorskip("torch")
    norm = torch.nn.LayerNorm(16)
    with torch.no_grad():
        norm.weight.fill_(11.0)
    embed = torch.nn.Embedding(50, 16)
    head = torch.nn.Linear(16, 50, bias=False)
    head.weight = embed.weight  # tied: the shared-storage path (pytorch.save_shared)
    torch.save(torch.nn.ModuleDict({"embed": embed, "head": head, "final_layer_norm": norm}).state_dict(),
               tmp_path / "m.pt")
    with pytest.raises(TensorValidationError, match="'final_layer_norm.weight'.*mean 11"):
        aprfast.convert(tmp_path / "m.pt", tmp_path / "m.apr")
    only_sources(tmp_path, "m.pt")


# --- one rule table -------------------------------------------------------------------------
def test_convert_tensors_stats_and_validate_stats_agree(tmp_path, rng, capsys):
    src = write(tmp_path, whisper_like(rng, ln_mean=11.0))
    with pytest.warns(ValidationWarning):
        aprfast.convert(src, tmp_path / "m.apr", validate="relaxed")
    path = str(tmp_path / "m.apr")
    assert main(["tensors", "--stats", "--json", path]) == 5
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)["tensors"]}
    assert [n for n, r in rows.items() if r["status"] == "FAIL"] == ["encoder.layer_norm.weight"]
    assert main(["validate", "--stats", "--json", path]) == 5
    (check,) = json.loads(capsys.readouterr().out)["checks"]
    assert check["name"] == "stats" and check["status"] == "FAIL"
    assert list(check["tensors"]) == ["encoder.layer_norm.weight"]
    assert check["tensors"]["encoder.layer_norm.weight"]["reasons"] == rows["encoder.layer_norm.weight"]["reasons"]
    write(tmp_path, whisper_like(rng), "ok.safetensors")
    aprfast.convert(tmp_path / "ok.safetensors", tmp_path / "ok.apr")
    assert main(["validate", "--stats", str(tmp_path / "ok.apr")]) == 0
    assert "[PASS] stats: 5 tensor(s) with an expectation, all within it" in capsys.readouterr().out  # not conv1


# --- the command line -----------------------------------------------------------------------
def test_cli_exit_5_on_validation_failure_with_nothing_written(tmp_path, rng, capsys):
    src = write(tmp_path, whisper_like(rng, ln_mean=11.0))
    out = tmp_path / "m.apr"
    assert main(["import", str(src), str(out)]) == 5
    err = capsys.readouterr().err
    assert "apr import: validation failed: [E009]" in err and "'encoder.layer_norm.weight'" in err
    assert "outside [0.5, 3.0]" in err
    only_sources(tmp_path, "m.safetensors")
    assert main(["convert", str(src), str(out), "--validate", "relaxed"]) == 0
    captured = capsys.readouterr()
    assert "apr convert: warning: tensor 'encoder.layer_norm.weight'" in captured.err
    assert "validation (relaxed): 6 tensors checked, 1 failed, written anyway\n" in captured.out
    assert main(["convert", str(src), str(out), "--force"]) == 0  # replaces, and writes past the failure
    assert "written anyway (--force)" in capsys.readouterr().err  # the flag, not the keyword (issue 28 item 3)
    assert main(["convert", str(src), str(tmp_path / "o.apr"), "--validate", "off"]) == 0
    assert "validation: off" in capsys.readouterr().out


# --- quantize= with per-layer rules (issue 12 part 10) ----------------------------------------
def test_quantize_per_layer_rules(tmp_path, rng):
    tensors = whisper_like(rng)
    src = write(tmp_path, tensors)
    rules = {"*.self_attn.*": "Q8_0", "*token_embedding": None, "*.weight": "Q4_0"}  # first match wins
    aprfast.convert(src, tmp_path / "q.apr", quantize=rules)
    with aprfast.open(tmp_path / "q.apr") as f:
        kinds = {n: f.info(n).dtype_name for n in f.keys()}
        assert f.get_tensor("encoder.layers.0.self_attn.q_proj.weight") == \
            aprfast.quantize(tensors["encoder.layers.0.self_attn.q_proj.weight"], "Q8_0")
    assert kinds == {"decoder.token_embedding": "F32", "encoder.conv1.weight": "Q4_0",
                     "encoder.layer_norm.bias": "F32", "encoder.layer_norm.weight": "F32",  # 1-D: kept
                     "encoder.layers.0.fc1.weight": "Q4_0", "encoder.layers.0.self_attn.q_proj.weight": "Q8_0"}
    # a list of pairs works the same; unmatched tensors are kept
    aprfast.convert(src, tmp_path / "l.apr", quantize=[("*fc1*", "q8_0")])
    with aprfast.open(tmp_path / "l.apr") as f:
        assert [n for n in f.keys() if f.info(n).dtype_name != "F32"] == ["encoder.layers.0.fc1.weight"]


def test_quantize_rules_see_the_mapped_names(tmp_path, rng):
    tensors = {"blk.0.attn_q.weight": (0.05 * rng.standard_normal((4, 32))).astype(np.float32),
               "blk.0.ffn_gate.weight": (0.05 * rng.standard_normal((4, 32))).astype(np.float32)}
    src = write(tmp_path, tensors)
    aprfast.convert(src, tmp_path / "q.apr", arch="llama", quantize={"layers.*.attn.*": "Q8_0"})
    with aprfast.open(tmp_path / "q.apr") as f:
        assert f.info("layers.0.attn.q_proj.weight").dtype_name == "Q8_0"
        assert f.info("layers.0.mlp.gate_proj.weight").dtype_name == "F32"


def test_quantize_rules_with_an_unknown_type_are_refused_before_writing(tmp_path, rng):
    src = write(tmp_path, whisper_like(rng))
    with pytest.raises(aprfast.UnknownDTypeError, match="Q9_9"):
        aprfast.convert(src, tmp_path / "q.apr", quantize={"*": "Q9_9"})
    with pytest.raises(TypeError, match="quantize="):
        aprfast.convert(src, tmp_path / "q.apr", quantize=8)
    only_sources(tmp_path, "m.safetensors")


# --- float8 without ml_dtypes (a core install has only NumPy) ---------------------------------
F8 = {"F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2", "F8_E4M3FNUZ": "float8_e4m3fnuz",
      "F8_E5M2FNUZ": "float8_e5m2fnuz", "F8_E8M0": "float8_e8m0fnu"}


@pytest.mark.parametrize("name", list(F8))
def test_float8_statistics_without_ml_dtypes_are_of_the_values(monkeypatch, name):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    from aprfast import dtypes
    from aprfast.numerics.stats import tensor_stats
    from aprfast.tensors import RawTensor

    codes = np.arange(256, dtype=np.uint8)
    reference = codes.view(getattr(ml_dtypes, F8[name])).astype(np.float64)  # ml_dtypes as the oracle
    monkeypatch.delitem(dtypes._ML_NUMPY, name)  # as if ml_dtypes were not installed: bytes as uint8
    assert dtypes.numpy_dtype(dtypes.by_name(name)) == np.uint8
    raw = RawTensor(dtypes.by_name(name), (16, 16), codes)
    for stats in (tensor_stats(raw), tensor_stats_numpy(raw)):
        finite = reference[np.isfinite(reference)]
        assert stats.nan_count == int(np.isnan(reference).sum()) and stats.inf_count == int(np.isinf(reference).sum())
        assert stats.min == finite.min() and stats.max == finite.max()
        assert stats.mean == pytest.approx(finite.mean()) and stats.std == pytest.approx(finite.std())
