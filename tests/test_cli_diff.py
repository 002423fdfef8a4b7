"""`apr diff` and aprfast.tools.diff.diff_models: identity (QA #56), detection of a change
(QA #57), tolerance, metadata and vocabulary changes, safetensors/GGUF references with a
tensor mapping, and the exit codes (0 same, 5 different, 3 missing, 4 unreadable)."""

import json

import numpy as np
import pytest

import aprfast
from aprfast.cli import main
from aprfast.tools.diff import diff_models


def weights(rng):
    return {"encoder.conv1.weight": rng.standard_normal((8, 4)).astype(np.float32),
            "encoder.layer_norm.weight": (1 + 0.01 * rng.standard_normal(8)).astype(np.float32),
            "step": np.array([3, 4], np.int64)}


@pytest.fixture
def pair(tmp_path, rng):
    """(a.apr, its tensors): a small model."""
    tensors = weights(rng)
    path = tmp_path / "a.apr"
    aprfast.save_file(tensors, path, metadata={"license": "MIT"})
    return path, tensors


def save(path, tensors, metadata=None):
    aprfast.save_file(tensors, path, metadata=metadata if metadata is not None else {"license": "MIT"})
    return path


def test_same_file_is_100_percent_identical_and_exits_0(pair, capsys):
    a, tensors = pair
    assert main(["diff", str(a), str(a)]) == 0
    out, err = capsys.readouterr()
    assert "Similarity: 100.00% (3 of 3 tensors identical)" in out
    assert "Max delta 0, L2 distance 0" in out and "result: IDENTICAL" in out
    assert out.count(": MATCH (identical)") == 3 and err == ""


def test_nan_in_the_same_place_is_identical(tmp_path, rng):
    tensors = weights(rng)
    tensors["encoder.conv1.weight"][1, 2] = np.nan
    a = save(tmp_path / "a.apr", tensors)
    copy = {k: v.copy() for k, v in tensors.items()}
    b = save(tmp_path / "b.apr", copy, {"license": "MIT"})
    report = diff_models(a, b)
    assert report.similarity == 1.0 and report.tensors_match and not report.metadata_differs


def test_one_changed_value_is_a_drift_with_its_delta_and_exit_5(pair, tmp_path, capsys):
    a, tensors = pair
    changed = {k: v.copy() for k, v in tensors.items()}
    changed["encoder.layer_norm.weight"][3] += 10.25
    b = save(tmp_path / "b.apr", changed)
    assert main(["diff", str(a), str(b)]) == 5
    out, err = capsys.readouterr()
    assert "encoder.layer_norm.weight: DRIFT (max delta 10.25 > 1e-06" in out and "!!!" in out
    assert "encoder.conv1.weight: MATCH (identical)" in out and "result: DIFFERENT" in out
    assert "Similarity: 100.00%" not in out
    assert "differ" in err
    report = diff_models(a, b)
    t = {d.name: d for d in report.tensors}["encoder.layer_norm.weight"]
    x, y = tensors["encoder.layer_norm.weight"].astype(np.float64), changed["encoder.layer_norm.weight"]
    y = y.astype(np.float64)
    assert t.max_abs_delta == pytest.approx(10.25, rel=1e-6)
    assert t.l2_distance == pytest.approx(np.linalg.norm(x - y))
    assert t.cosine == pytest.approx(x @ y / (np.linalg.norm(x) * np.linalg.norm(y)))
    assert t.identical == 7 and t.count == 8


def test_tiny_change_within_tolerance_matches(pair, tmp_path, capsys):
    a, tensors = pair
    changed = {k: v.copy() for k, v in tensors.items()}
    changed["encoder.conv1.weight"][0, 0] += np.float32(1e-4)
    b = save(tmp_path / "b.apr", changed)
    assert main(["diff", str(a), str(b)]) == 5
    assert main(["diff", str(a), str(b), "--tolerance", "1e-3"]) == 0
    out = capsys.readouterr().out
    assert "encoder.conv1.weight: MATCH (delta" in out and "result: MATCH" in out


def test_nan_on_one_side_drifts_whatever_the_tolerance(pair, tmp_path):
    a, tensors = pair
    changed = {k: v.copy() for k, v in tensors.items()}
    changed["encoder.conv1.weight"][2, 2] = np.nan
    b = save(tmp_path / "b.apr", changed)
    report = diff_models(a, b, tolerance=1e9)
    t = {d.name: d for d in report.tensors}["encoder.conv1.weight"]
    assert t.status == "DRIFT" and t.nonfinite_mismatch == 1 and "NaN/Inf on one side only" in t.detail


def test_metadata_and_vocabulary_changes_are_listed(pair, tmp_path, capsys):
    a, tensors = pair
    aprfast.save_file(tensors, tmp_path / "v1.apr",
                      metadata={"license": "MIT", "tokenizer.vocabulary": ["a", "b", "c"]})
    aprfast.save_file(tensors, tmp_path / "v2.apr", metadata={"license": "Apache-2.0", "author": "x",
                                                              "tokenizer.vocabulary": ["a", "c", "d", "e"]})
    assert main(["diff", str(tmp_path / "v1.apr"), str(tmp_path / "v2.apr")]) == 6  # metadata only: 6
    out = capsys.readouterr().out
    assert "Vocab Changes: Added 2 tokens, Removed 1 tokens" in out
    assert "~ license: 'MIT' -> 'Apache-2.0'" in out and "+ author: 'x'" in out
    assert main(["diff", str(tmp_path / "v1.apr"), str(tmp_path / "v2.apr"), "--ignore-metadata"]) == 0


def test_tensors_on_one_side_only_and_shape_changes(pair, tmp_path, capsys):
    a, tensors = pair
    other = {"encoder.conv1.weight": tensors["encoder.conv1.weight"].reshape(4, 8).copy(),
             "encoder.extra": np.ones(2, np.float32), "step": tensors["step"]}
    b = save(tmp_path / "b.apr", other)
    assert main(["diff", str(a), str(b), "--json"]) == 5
    doc = json.loads(capsys.readouterr().out)
    assert doc["only_in_a"] == ["encoder.layer_norm.weight"] and doc["only_in_b"] == ["encoder.extra"]
    status = {t["name"]: t["status"] for t in doc["tensors"]}
    assert status == {"encoder.conv1.weight": "SHAPE", "step": "MATCH"}
    assert doc["result"] == "DIFFERENT" and doc["tensors_match"] is False
    assert 0 < doc["similarity"] < 1


def test_f16_copy_against_f32_reference_within_tolerance(pair, tmp_path):
    a, tensors = pair
    half = tmp_path / "h.apr"
    aprfast.convert(a, half, precision="f16")
    report = diff_models(half, a, tolerance=1e-2)
    assert report.tensors_match
    assert {t.dtype_a for t in report.tensors} == {"F16", "I64"}
    assert 0 < report.max_abs_delta < 1e-2
    assert not diff_models(half, a).tensors_match  # the default 1e-6 sees the rounding


def test_safetensors_reference_with_a_tensor_mapping(pair, tmp_path, capsys):
    pytest.importorskip("safetensors")
    from safetensors.numpy import save_file

    a, tensors = pair
    ref = tmp_path / "ref.safetensors"
    save_file({"model.encoder.conv1.weight": tensors["encoder.conv1.weight"],
               "model.encoder.layer_norm.weight": tensors["encoder.layer_norm.weight"] + 10.2,
               "step": tensors["step"]}, str(ref))
    mapping = tmp_path / "mapping.json"
    mapping.write_text(json.dumps({"encoder.conv1.weight": "model.encoder.conv1.weight",
                                   "encoder.layer_norm.weight": "model.encoder.layer_norm.weight"}))
    assert main(["diff", str(a), str(ref), "--tensor-mapping", str(mapping), "--ignore-metadata"]) == 5
    out = capsys.readouterr().out
    assert "encoder.conv1.weight -> model.encoder.conv1.weight: MATCH (identical)" in out
    assert "encoder.layer_norm.weight -> model.encoder.layer_norm.weight: DRIFT (max delta 10.2" in out
    assert "ONLY IN" not in out


def test_gguf_reference(pair, tmp_path):
    a, _ = pair
    ref = tmp_path / "ref.gguf"
    aprfast.convert(a, ref)
    report = diff_models(a, ref)
    assert report.tensors_match and all(t.identical == t.count for t in report.tensors)


def test_quantized_tensors_are_compared_dequantized(tmp_path, rng):
    a = save(tmp_path / "a.apr", {"w": rng.standard_normal((4, 64)).astype(np.float32)})
    q = tmp_path / "q.apr"
    aprfast.convert(a, q, quantize="Q8_0")
    report = diff_models(q, a, tolerance=0.05)
    (t,) = report.tensors
    assert t.dtype_a == "Q8_0" and t.status == "MATCH" and 0 < t.max_abs_delta < 0.05 and t.cosine > 0.999


@pytest.mark.parametrize("content", [b"not json", b'["a"]', b'{"a": 1}', b'{"a": "x", "b": "x"}'])
def test_bad_mapping_file_is_a_format_error(pair, tmp_path, content, capsys):
    a, _ = pair
    mapping = tmp_path / "m.json"
    mapping.write_bytes(content)
    assert main(["diff", str(a), str(a), "--tensor-mapping", str(mapping)]) == 4
    assert "[E001]" in capsys.readouterr().err


def test_missing_file_exits_3_and_bad_file_exits_4(pair, tmp_path, capsys):
    a, _ = pair
    assert main(["diff", str(a), str(tmp_path / "nope.apr")]) == 3
    junk = tmp_path / "junk.apr"
    junk.write_bytes(b"APR2" + b"\0" * 20)
    assert main(["diff", str(a), str(junk)]) == 4
    assert main(["diff", str(a), str(a), "--tolerance", "-1"]) == 2


def test_password_is_never_accepted_on_the_command_line(pair):
    a, _ = pair
    with pytest.raises(SystemExit) as exc:
        main(["diff", str(a), str(a), "--password", "secret"])
    assert exc.value.code == 2


def test_bf16_copy_is_compared_by_value(pair, tmp_path):
    a, tensors = pair
    half = tmp_path / "b.apr"
    aprfast.convert(a, half, precision="bf16")
    report = diff_models(a, half, tolerance=0.05)
    assert report.tensors_match and {t.dtype_b for t in report.tensors} == {"BF16", "I64"}
    t = {d.name: d for d in report.tensors}["encoder.conv1.weight"]
    x = tensors["encoder.conv1.weight"]
    assert 0 < t.max_abs_delta <= np.abs(x).max() * 2 ** -8  # bf16 keeps 8 significant bits


def test_one_tensor_pair_is_alive_at_a_time(tmp_path, rng, monkeypatch):
    import gc
    import weakref

    from aprfast.tools import diff as diff_module

    tensors = {f"layer.{i}.weight": rng.standard_normal((16, 16)).astype(np.float32) for i in range(6)}
    a = save(tmp_path / "a.apr", tensors)
    changed = {k: v + 1e-3 for k, v in tensors.items()}  # not bit-identical: the float path runs
    b = save(tmp_path / "b.apr", changed)
    alive, most = [], [0]
    real_read = diff_module._Side.read

    def tracking_read(self, name):
        value = real_read(self, name)
        gc.collect()
        alive[:] = [r for r in alive if r() is not None]
        alive.append(weakref.ref(value))
        most[0] = max(most[0], len(alive))
        return value

    monkeypatch.setattr(diff_module._Side, "read", tracking_read)
    report = diff_models(a, b)
    assert len(report.tensors) == 6 and not report.tensors_match
    assert most[0] <= 2


def test_tensors_identical_metadata_differs_has_its_own_result_and_exit_code(tmp_path, capsys):
    """Issue 28 item 4: a model and its faithful export (or GGUF round trip) said
    "100.00% identical" and then "result: DIFFERENT", exit 5."""
    a, g, b = tmp_path / "a.apr", tmp_path / "a.gguf", tmp_path / "b.apr"
    tensors = {"w": np.arange(64, dtype=np.float32).reshape(2, 32), "b": np.ones(2, np.float32)}
    aprfast.save_file(tensors, a, metadata={"license": "MIT"})
    aprfast.convert(a, g)
    aprfast.convert(g, b)  # the round trip adds gguf.* keys
    assert main(["diff", str(a), str(b)]) == 6
    out, err = capsys.readouterr()
    assert "result: METADATA DIFFERS (tensors identical)" in out and "only the metadata differs" in err
    assert main(["diff", str(a), str(b), "--json"]) == 6
    assert json.loads(capsys.readouterr().out)["result"] == "METADATA DIFFERS"
    assert main(["diff", str(a), str(b), "--ignore-metadata"]) == 0
    c = tmp_path / "c.apr"
    aprfast.save_file({"w": np.arange(64, dtype=np.float32).reshape(2, 32) + 1, "b": np.ones(2, np.float32)}, c)
    assert main(["diff", str(a), str(c)]) == 5  # a tensor differs: DIFFERENT, whatever the metadata
    assert "result: DIFFERENT" in capsys.readouterr().out
