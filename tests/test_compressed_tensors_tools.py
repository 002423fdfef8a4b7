"""compressed-tensors weights in the tools (issue 27 item 5): ``apr diff`` and the quality
report judge a weight with a record by compressed-tensors' values, not its packed bytes."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from test_compressed_tensors import build, reference, torch  # noqa: F401 - skips without the packages

import aprfast
from aprfast.numerics.compressed import METADATA_KEY
from aprfast.tools.diff import diff_models
from aprfast.tools.quality import quality_report

# safetensors.torch needs torch: imported after test_compressed_tensors skipped without it
_st_torch = pytest.importorskip("safetensors.torch")
load_file, save_file = _st_torch.load_file, _st_torch.save_file


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("ct-tools")
    return {p: build(p, str(root / p)) for p in ("MXFP4A16", "W4A16_ASYM", "FP8_DYNAMIC")}


def _copy(directory, out, edit=None, config=None):
    state = load_file(os.path.join(directory, "model.safetensors"))
    if edit:
        edit(state)
    os.makedirs(out)
    save_file({k: v.contiguous() for k, v in state.items()}, os.path.join(out, "model.safetensors"))
    doc = json.loads((Path(directory) / "config.json").read_text())
    if config:
        config(doc["quantization_config"])
    Path(out, "config.json").write_text(json.dumps(doc))
    return str(out)


@pytest.mark.parametrize("preset", ["MXFP4A16", "W4A16_ASYM", "FP8_DYNAMIC"])
def test_diff_compares_compressed_tensors_values(checkpoints, tmp_path, preset):
    directory = checkpoints[preset]
    name = "proj.weight" if preset == "FP8_DYNAMIC" else "proj.weight_packed"
    aprfast.convert(directory, tmp_path / "x.apr")
    report = diff_models(os.path.join(directory, "model.safetensors"), tmp_path / "x.apr")
    row = next(t for t in report.tensors if t.name == name)
    assert row.status == "MATCH" and row.shape_a == row.shape_b == list(reference(directory).shape)
    assert row.dtype_a.endswith(")") and "quantized" in row.dtype_a  # the stored dtype, then the format
    assert report.tensors_match

    def other_scales(state):  # the same packed codes, other scales: the values differ
        scale = state["proj.weight_scale"]
        state["proj.weight_scale"] = (scale + 1 if scale.dtype == torch.uint8 else scale * 2).to(scale.dtype)

    changed = _copy(directory, tmp_path / "changed", other_scales)
    report = diff_models(tmp_path / "x.apr", os.path.join(changed, "model.safetensors"))
    row = next(t for t in report.tensors if t.name == name)
    want = float(np.max(np.abs(reference(changed).astype(np.float64) - reference(directory))))
    assert row.status == "DRIFT" and row.max_abs_delta == pytest.approx(want) and want > 0


def test_diff_pairs_a_compressed_tensors_weight_with_its_gguf_repack(checkpoints, tmp_path):
    directory = checkpoints["MXFP4A16"]
    aprfast.convert(directory, tmp_path / "x.gguf", names="keep")
    report = diff_models(os.path.join(directory, "model.safetensors"), tmp_path / "x.gguf")
    pairs = {(t.name, t.other_name): t for t in report.tensors}
    row = pairs[("proj.weight_packed", "proj.weight")]
    assert row.status == "MATCH" and row.max_abs_delta == 0.0 and row.dtype_b == "MXFP4"
    assert [n for n, _ in report.only_in_a] == ["proj.weight_scale"] and report.only_in_b == []
    back = diff_models(tmp_path / "x.gguf", os.path.join(directory, "model.safetensors"))
    assert ("proj.weight", "proj.weight_packed") in {(t.name, t.other_name) for t in back.tensors}


def test_diff_against_the_float_model_measures_the_quantization(checkpoints, tmp_path):
    directory = checkpoints["W4A16_ASYM"]
    aprfast.convert(directory, tmp_path / "x.apr")
    original = reference(directory) + np.float32(0.25)  # a "source" model of other values
    aprfast.save_file({"proj.weight": original}, tmp_path / "float.apr")
    report = diff_models(tmp_path / "float.apr", tmp_path / "x.apr")
    row = next(t for t in report.tensors if t.name == "proj.weight")
    assert row.other_name == "proj.weight_packed" and row.max_abs_delta == pytest.approx(0.25)


def test_quality_judges_compressed_tensors_values(checkpoints, tmp_path):
    directory = checkpoints["MXFP4A16"]

    def nan_scale(state):  # 2**128: the group's values are Inf (0 * Inf: NaN) in compressed-tensors
        state["proj.weight_scale"] = state["proj.weight_scale"].clone()
        state["proj.weight_scale"][0, 0] = 255

    bad = _copy(directory, tmp_path / "bad", nan_scale)
    aprfast.convert(bad, tmp_path / "bad.apr", validate="off")
    items = {i["item"]: i for i in quality_report(tmp_path / "bad.apr")["items"]}
    assert items[27]["status"] == "FAIL" and "proj.weight_packed" in items[27]["detail"]
    aprfast.convert(directory, tmp_path / "good.apr")
    items = {i["item"]: i for i in quality_report(tmp_path / "good.apr")["items"]}
    assert items[26]["status"] == items[27]["status"] == items[21]["status"] == "PASS"


def test_quality_uses_the_logical_shape_and_module_name(checkpoints, tmp_path):
    directory = checkpoints["MXFP4A16"]

    def to_lm_head(state):
        for key in [k for k in state if k.startswith("proj.")]:
            state["lm_head." + key[len("proj."):]] = state.pop(key)

    def target(qc):
        qc["config_groups"]["group_0"]["targets"] = ["re:lm_head"]

    lm = _copy(directory, tmp_path / "lm", to_lm_head, target)
    doc = json.loads(Path(lm, "config.json").read_text())
    Path(lm, "config.json").write_text(json.dumps(dict(doc, vocab_size=64)))
    aprfast.convert(lm, tmp_path / "lm.apr", names="keep")
    with aprfast.open(tmp_path / "lm.apr") as f:
        metadata = dict(f.metadata)
        tensors = {n: f.get_tensor(n, copy=True) for n in f.keys()}
    aprfast.save_file(tensors, tmp_path / "sized.apr", dict(metadata, vocab_size=64))
    report = quality_report(tmp_path / "sized.apr")
    shapes = [r for r in report["shapes"] if r["key"] == "vocab_size"]
    assert [(r["tensor"], r["actual"], r["status"]) for r in shapes] == [("lm_head.weight", 64, "PASS")]


def test_quality_names_a_record_that_does_not_decode(checkpoints, tmp_path):
    aprfast.convert(checkpoints["FP8_DYNAMIC"], tmp_path / "a.apr")
    with aprfast.open(tmp_path / "a.apr") as f:
        tensors = {name: f.get_tensor(name, copy=True) for name in f.keys()}
        metadata = dict(f.metadata)
    block = json.loads(json.dumps(metadata[METADATA_KEY]))
    block["weights"]["proj.weight"]["scale"] = "head.weight"
    aprfast.save_file(tensors, tmp_path / "b.apr", {**metadata, METADATA_KEY: block})
    items = {i["item"]: i for i in quality_report(tmp_path / "b.apr")["items"]}
    assert items[21]["status"] == "FAIL" and "proj.weight (compressed-tensors values: [E002]" in items[21]["detail"]
    with pytest.raises(aprfast.CorruptError, match="'head.weight'"):  # diff cannot compare it: typed, named
        diff_models(tmp_path / "a.apr", tmp_path / "b.apr")


# --- renames rewrite the records ---------------------------------------------------------
def _records(path):
    with aprfast.open(path) as f:
        return f.compressed_weights


@pytest.mark.parametrize("preset", ["MXFP4A16", "W4A16_ASYM"])
def test_rename_and_strip_prefix_rewrite_the_records(checkpoints, tmp_path, preset):
    directory = checkpoints[preset]
    want = reference(directory)
    aprfast.convert(directory, tmp_path / "prefixed.apr", rename=lambda name: "model." + name)
    records = _records(tmp_path / "prefixed.apr")
    assert list(records) == ["model.proj.weight_packed"]
    record = records["model.proj.weight_packed"]
    assert record["scale"] == "model.proj.weight_scale"
    if preset == "W4A16_ASYM":
        assert record["zero_point"] == "model.proj.weight_zero_point"
        assert record["weight_shape"] == "model.proj.weight_shape"
    with aprfast.open(tmp_path / "prefixed.apr") as f:
        got = f.get_tensor("model.proj.weight_packed", dequantize=True)
    assert got.view(np.uint32).tolist() == want.view(np.uint32).tolist()
    # .apr -> .apr: strip_prefix, then a dict rename of the scale alone
    aprfast.convert(tmp_path / "prefixed.apr", tmp_path / "stripped.apr", strip_prefix="model.",
                    rename={"proj.weight_scale": "proj.scales"})
    record = _records(tmp_path / "stripped.apr")["proj.weight_packed"]
    assert record["scale"] == "proj.scales"
    with aprfast.open(tmp_path / "stripped.apr") as f:
        got = f.get_tensor("proj.weight_packed", dequantize=True)
    assert got.view(np.uint32).tolist() == want.view(np.uint32).tolist()


def test_dropping_a_scale_the_weight_needs_is_refused_dropping_the_weight_drops_its_record(checkpoints, tmp_path):
    directory = checkpoints["MXFP4A16"]
    with pytest.raises(aprfast.LayoutError, match="'proj.weight_packed' is written .* scale tensor "
                                                  "'proj.weight_scale' is not"):
        aprfast.convert(directory, tmp_path / "a.apr", rename={"proj.weight_scale": None})
    assert not (tmp_path / "a.apr").exists()
    aprfast.convert(directory, tmp_path / "b.apr", rename={"proj.weight_packed": None})
    with aprfast.open(tmp_path / "b.apr") as f:
        assert f.compressed_weights == {} and METADATA_KEY not in f.metadata and "proj.weight_scale" in f


def test_a_renamed_repack_to_gguf(checkpoints, tmp_path):
    gguf = pytest.importorskip("gguf")
    directory = checkpoints["MXFP4A16"]
    aprfast.convert(directory, tmp_path / "x.gguf", names="keep", rename=lambda name: "blk.0." + name)
    names = sorted(t.name for t in gguf.GGUFReader(str(tmp_path / "x.gguf")).tensors)
    assert names == ["blk.0.head.weight", "blk.0.proj.weight"]
    # rules by the output name choose the repack into .apr
    aprfast.convert(directory, tmp_path / "y.apr", names="keep", rename=lambda name: "blk.0." + name,
                    quantize={"blk.0.proj.*": "MXFP4"})
    with aprfast.open(tmp_path / "y.apr") as f:
        assert f.info("blk.0.proj.weight").dtype_name == "MXFP4" and f.compressed_weights == {}
