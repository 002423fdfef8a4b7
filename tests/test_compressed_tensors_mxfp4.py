"""MXFP4 of compressed-tensors and GGML's MXFP4 blocks are the same numbers in two packings
(issue 27 item 5): a compressed-tensors checkpoint converts to GGUF, and a GGUF's MXFP4
tensors to a compressed-tensors checkpoint, by repacking bits, and every value is kept,
as compressed-tensors' own decompression, gguf-py's dequantize and aprfast read them."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from test_compressed_tensors import build, reference, torch  # noqa: F401 - skips without the packages

import aprfast
from aprfast.convert import DestinationExistsError, open_source
from aprfast.numerics.compressed import METADATA_KEY, ct_mxfp4_to_ggml, ggml_mxfp4_to_ct

gguf = pytest.importorskip("gguf")

from compressed_tensors.compressors import ModelCompressor  # noqa: E402
from compressed_tensors.quantization import QuantizationConfig, apply_quantization_config  # noqa: E402
from safetensors.numpy import load_file, save_file  # noqa: E402
from safetensors.torch import load_file as load_torch  # noqa: E402


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """compressed-tensors' MXFP4A16 preset on a [64, 256] ``proj`` (``head`` left BF16)."""
    return build("MXFP4A16", str(tmp_path_factory.mktemp("ct") / "mxfp4"))


def _gguf_tensor(path, name):
    """(aprfast's dequantized values, gguf-py's, the stored block bytes) of one GGUF tensor."""
    source = open_source(path)
    try:
        spec = next(s for s in source.specs if s.name == name)
        assert spec.dtype.name == "MXFP4"
        stored = source.read(spec)
        ours = aprfast.dequantize(stored)
    finally:
        source.close()
    tensor = next(t for t in gguf.GGUFReader(path).tensors if t.name == name)
    assert tensor.tensor_type == gguf.GGMLQuantizationType.MXFP4
    theirs = gguf.quants.dequantize(tensor.data, tensor.tensor_type).reshape(ours.shape)
    return ours, theirs, np.asarray(stored.data)


def _same_values(got, want):
    """Bit for bit, except where compressed-tensors gives -0.0 (the E2M1 code 8) and GGML's
    table gives +0.0 for the same code: its MXFP4 has no negative zero (docs/FORMAT.md)."""
    assert got.dtype == want.dtype == np.float32 and got.shape == want.shape
    assert np.array_equal(got, want)
    differ = got.view(np.uint32) != want.view(np.uint32)
    assert np.array_equal(differ, (want == 0) & np.signbit(want))
    assert not np.signbit(got[got == 0]).any()


def _load_with_compressed_tensors(directory, modules):
    """``{module: weight}`` of a model whose Linear ``modules`` (name -> (out, in)) get
    the checkpoint's config.json applied, its safetensors loaded (strict), and are then
    decompressed by compressed-tensors' ModelCompressor, as transformers loads one."""
    with open(os.path.join(directory, "config.json")) as f:
        config = QuantizationConfig.model_validate(json.load(f)["quantization_config"])
    model = torch.nn.Sequential()
    for name, (rows, cols) in modules.items():
        model.add_module(name, torch.nn.Linear(cols, rows, bias=False))
    model = model.to(torch.bfloat16)
    apply_quantization_config(model, config)
    for name in modules:
        if hasattr(getattr(model, name), "weight_scale"):
            with torch.no_grad():
                getattr(model, name).weight_scale.fill_(1)
    compressor = ModelCompressor(quantization_config=config)
    compressor.compress_model(model)  # the compressed parameters a checkpoint loads into
    state = {}
    for file in os.listdir(directory):
        if file.endswith(".safetensors"):
            state.update(load_torch(os.path.join(directory, file)))
    model.load_state_dict(state, strict=True)
    compressor.decompress_model(model)
    return {name: getattr(model, name).weight.detach().float().numpy() for name in modules}


@pytest.mark.parametrize("quantize", [None, "MXFP4", {"proj.*": "MXFP4"}], ids=["plain", "mxfp4", "rules"])
def test_compressed_tensors_mxfp4_to_gguf_keeps_every_value(checkpoint, tmp_path, quantize):
    out = tmp_path / "x.gguf"
    # "MXFP4" quantizes the BF16 head too (a lossy change past the gate's default limit)
    summary = aprfast.convert(checkpoint, out, names="keep", quantize=quantize,
                              max_drift=None if quantize == "MXFP4" else 0.1)
    assert summary["tensors"] == 2  # proj.weight_packed + proj.weight_scale became one tensor
    ours, theirs, _ = _gguf_tensor(str(out), "proj.weight")
    want = reference(checkpoint)
    assert np.array_equal(ours.view(np.uint32), theirs.view(np.uint32))  # gguf-py reads what aprfast reads
    _same_values(ours, want)
    assert ((want == 0) & np.signbit(want)).any()  # the checkpoint does hold compressed-tensors' -0.0
    names = [t.name for t in gguf.GGUFReader(str(out)).tensors]
    assert sorted(names) == ["head.weight", "proj.weight"]
    assert not any(METADATA_KEY in key for key in gguf.GGUFReader(str(out)).fields)


def test_the_repack_is_exact_both_ways_through_gguf(checkpoint, tmp_path):
    aprfast.convert(checkpoint, tmp_path / "x.gguf", names="keep")
    aprfast.convert(tmp_path / "x.gguf", f"{tmp_path / 'back'}{os.sep}")  # a directory: model.safetensors + config.json
    assert sorted(os.listdir(tmp_path / "back")) == ["config.json", "model.safetensors"]
    before, after = load_file(os.path.join(checkpoint, "model.safetensors")), load_file(tmp_path / "back" /
                                                                                       "model.safetensors")
    assert sorted(before) == sorted(after)
    for name in before:  # every stored code, exponent and BF16 value as compressed-tensors wrote it
        assert before[name].dtype == after[name].dtype and np.array_equal(before[name], after[name]), name
    assert reference(str(tmp_path / "back")).view(np.uint32).tolist() == reference(checkpoint).view(np.uint32).tolist()


def test_a_gguf_becomes_a_checkpoint_compressed_tensors_loads(checkpoint, tmp_path):
    aprfast.convert(checkpoint, tmp_path / "x.gguf", names="keep")
    (tmp_path / "out").mkdir()
    aprfast.convert(tmp_path / "x.gguf", tmp_path / "out" / "model.safetensors", quantize={"proj.*": "MXFP4"})
    with open(tmp_path / "out" / "config.json") as f:
        qc = json.load(f)["quantization_config"]
    assert qc["quant_method"] == "compressed-tensors" and qc["format"] == "mxfp4-pack-quantized"
    assert qc["config_groups"]["group_0"]["targets"] == ["proj"]
    got = _load_with_compressed_tensors(str(tmp_path / "out"), {"proj": (64, 256), "head": (8, 64)})
    assert got["proj"].view(np.uint32).tolist() == reference(checkpoint).view(np.uint32).tolist()
    ours, _, _ = _gguf_tensor(str(tmp_path / "x.gguf"), "proj.weight")
    _same_values(ours, got["proj"])
    # and aprfast imports it back as a compressed-tensors checkpoint
    aprfast.convert(tmp_path / "out", tmp_path / "y.apr")
    with aprfast.open(tmp_path / "y.apr") as f:
        assert list(f.compressed_weights) == ["proj.weight_packed"]
        assert f.get_tensor("proj.weight_packed", dequantize=True).view(np.uint32).tolist() == \
            got["proj"].view(np.uint32).tolist()


def test_float_weights_quantized_to_mxfp4_are_written_in_compressed_tensors_layout(tmp_path):
    rng = np.random.default_rng(3)
    weights = {"layer.up.weight": rng.standard_normal((32, 128)).astype(np.float32),
               "layer.norm.weight": np.ones(128, np.float32)}
    (tmp_path / "src").mkdir()
    save_file(weights, str(tmp_path / "src" / "model.safetensors"))
    aprfast.convert(tmp_path / "src", f"{tmp_path / 'out'}{os.sep}", quantize="MXFP4", max_drift=None)
    with open(tmp_path / "out" / "config.json") as f:
        config = QuantizationConfig.model_validate(json.load(f)["quantization_config"])
    assert config.config_groups["group_0"].targets == ["layer.up"]
    state = load_file(tmp_path / "out" / "model.safetensors")
    assert sorted(state) == ["layer.norm.weight", "layer.up.weight_packed", "layer.up.weight_scale"]
    from compressed_tensors.compressors.base import BaseCompressor

    compressor = BaseCompressor.get_value_from_registry("mxfp4-pack-quantized")
    scheme = config.config_groups["group_0"]
    parts = {k.split(".")[-1]: torch.from_numpy(v) for k, v in state.items() if k.startswith("layer.up.")}
    got = compressor.decompress(parts, scheme)["weight"].float().numpy()
    want = aprfast.dequantize(aprfast.quantize(weights["layer.up.weight"], "MXFP4"))  # gguf-py's MXFP4, bit-exact
    assert got.view(np.uint32).tolist() == want.view(np.uint32).tolist()  # GGML's quantizer writes no -0


def test_compressed_tensors_through_apr_to_gguf(checkpoint, tmp_path):
    aprfast.convert(checkpoint, tmp_path / "direct.gguf", names="keep")
    aprfast.convert(checkpoint, tmp_path / "kept.apr", names="keep")  # the compressed-tensors layout, recorded
    with aprfast.open(tmp_path / "kept.apr") as f:
        assert list(f.compressed_weights) == ["proj.weight_packed"]
    aprfast.convert(tmp_path / "kept.apr", tmp_path / "via-kept.gguf")  # the records leave with the repack
    assert not any(METADATA_KEY in key for key in gguf.GGUFReader(str(tmp_path / "via-kept.gguf")).fields)
    assert (tmp_path / "via-kept.gguf").read_bytes() == (tmp_path / "direct.gguf").read_bytes()
    # quantize="MXFP4" into .apr: GGML blocks in the .apr, the same bytes
    aprfast.convert(checkpoint, tmp_path / "blocks.apr", names="keep", quantize={"proj.*": "MXFP4"})
    with aprfast.open(tmp_path / "blocks.apr") as f:
        assert f.info("proj.weight").dtype_name == "MXFP4" and f.compressed_weights == {}
        assert "proj.weight_scale" not in f
        _same_values(f.get_tensor("proj.weight", dequantize=True), reference(checkpoint))
    aprfast.convert(tmp_path / "blocks.apr", tmp_path / "via-blocks.gguf")
    _, _, direct = _gguf_tensor(str(tmp_path / "direct.gguf"), "proj.weight")
    _, _, via = _gguf_tensor(str(tmp_path / "via-blocks.gguf"), "proj.weight")
    assert np.array_equal(direct, via)
    # and an .apr of GGML blocks -> a compressed-tensors checkpoint
    aprfast.convert(tmp_path / "blocks.apr", f"{tmp_path / 'back'}{os.sep}")
    assert reference(str(tmp_path / "back")).view(np.uint32).tolist() == reference(checkpoint).view(np.uint32).tolist()


def test_without_quantize_an_apr_keeps_the_compressed_tensors_layout(checkpoint, tmp_path):
    aprfast.convert(checkpoint, tmp_path / "x.apr", names="keep", quantize={"head*": "Q8_0"})
    with aprfast.open(tmp_path / "x.apr") as f:
        assert f.info("proj.weight_packed").dtype_name == "U8" and "proj.weight_scale" in f
        assert f.info("head.weight").dtype_name == "Q8_0"


def _edited(checkpoint, tmp_path, edit):
    state = load_file(os.path.join(checkpoint, "model.safetensors"))
    edit(state)
    out = tmp_path / "edited"
    out.mkdir()
    save_file(state, str(out / "model.safetensors"))
    (out / "config.json").write_bytes((Path(checkpoint) / "config.json").read_bytes())
    return out


def test_a_nan_exponent_is_refused_naming_the_tensor(checkpoint, tmp_path):
    def nan(state):
        state["proj.weight_scale"] = state["proj.weight_scale"].copy()
        state["proj.weight_scale"][3, 2] = 255

    bad = _edited(checkpoint, tmp_path, nan)
    with pytest.raises(aprfast.LayoutError, match=r"'proj.weight': group 26 has the E8M0 exponent 255"):
        aprfast.convert(bad, tmp_path / "x.gguf", names="keep")
    assert not (tmp_path / "x.gguf").exists()


def test_a_hostile_record_is_refused_before_the_repack(checkpoint, tmp_path):
    aprfast.convert(checkpoint, tmp_path / "a.apr", names="keep")
    with aprfast.open(tmp_path / "a.apr") as f:
        tensors = {name: f.get_tensor(name, copy=True) for name in f.keys()}
        metadata = dict(f.metadata)
    block = json.loads(json.dumps(metadata[METADATA_KEY]))
    block["weights"]["proj.weight_packed"]["scale"] = "head.weight"
    aprfast.save_file(tensors, tmp_path / "b.apr", {**metadata, METADATA_KEY: block})
    with pytest.raises(aprfast.CorruptError, match="'head.weight' of 'proj.weight_packed'"):
        aprfast.convert(tmp_path / "b.apr", tmp_path / "x.gguf")
    block["weights"]["proj.weight_packed"]["scale"] = "proj.weight_scale"
    tensors["proj.weight"] = np.zeros(2, np.float32)  # the name the repacked weight would take
    aprfast.save_file(tensors, tmp_path / "c.apr", {**metadata, METADATA_KEY: block})
    with pytest.raises(aprfast.LayoutError, match="'proj.weight_packed' becomes 'proj.weight'"):
        aprfast.convert(tmp_path / "c.apr", tmp_path / "x.gguf")


def test_a_gguf_block_with_a_nan_exponent_is_refused(tmp_path):
    q = aprfast.quantize(np.ones((2, 64), np.float32), "MXFP4")
    data = np.array(q.data)
    data[17] = 255  # block 1
    aprfast.save_file({"m.weight": aprfast.QuantizedTensor("MXFP4", (2, 64), data)}, tmp_path / "a.apr")
    with pytest.raises(aprfast.LayoutError, match=r"'m.weight': block 1 has the E8M0 exponent 255"):
        aprfast.convert(tmp_path / "a.apr", f"{tmp_path / 'out'}{os.sep}", validate="off")
    assert not (tmp_path / "out" / "config.json").exists()


def test_what_compressed_tensors_layout_cannot_hold_is_refused(tmp_path):
    q3 = aprfast.quantize(np.ones((2, 4, 32), np.float32), "MXFP4")
    aprfast.save_file({"experts.weight": q3}, tmp_path / "a.apr")
    with pytest.raises(aprfast.LayoutError, match="'experts.weight'.*2-D tensors named <module>.weight"):
        aprfast.convert(tmp_path / "a.apr", tmp_path / "a.safetensors")
    aprfast.save_file({"proj": aprfast.quantize(np.ones((2, 32), np.float32), "MXFP4")}, tmp_path / "b.apr")
    with pytest.raises(aprfast.LayoutError, match="not 2-D 'proj'|'proj'.*<module>.weight"):
        aprfast.convert(tmp_path / "b.apr", tmp_path / "b.safetensors")
    q = aprfast.quantize(np.ones((2, 32), np.float32), "MXFP4")
    aprfast.save_file({"p.weight": q, "p.weight_scale": np.ones(2, np.float32)}, tmp_path / "c.apr")
    with pytest.raises(aprfast.LayoutError, match="'p.weight' is written as 'p.weight_scale'.*a name another"):
        aprfast.convert(tmp_path / "c.apr", tmp_path / "c.safetensors")


def test_an_existing_config_json_is_kept_unless_forced_then_extended(tmp_path):
    q = aprfast.quantize(np.linspace(-3, 3, 64, dtype=np.float32).reshape(2, 32), "MXFP4")
    aprfast.save_file({"p.weight": q}, tmp_path / "a.apr")
    out = tmp_path / "out"
    out.mkdir()
    (out / "config.json").write_text(json.dumps({"model_type": "mine", "hidden_size": 32}))
    with pytest.raises(DestinationExistsError, match="config.json exists"):
        aprfast.convert(tmp_path / "a.apr", out / "model.safetensors")
    assert not (out / "model.safetensors").exists()
    aprfast.convert(tmp_path / "a.apr", out / "model.safetensors", force=True)
    doc = json.loads((out / "config.json").read_text())
    assert doc["model_type"] == "mine" and doc["hidden_size"] == 32
    assert doc["quantization_config"]["config_groups"]["group_0"]["targets"] == ["p"]


def test_repack_matches_a_value_by_value_reading_of_both_layouts():
    rng = np.random.default_rng(7)
    rows, cols = 3, 96
    codes = rng.integers(0, 16, (rows, cols), dtype=np.uint8)
    exps = rng.integers(0, 255, (rows, cols // 32), dtype=np.uint8)
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8)  # compressed-tensors: low nibble first
    blocks = ct_mxfp4_to_ggml("w", packed, exps, (rows, cols)).reshape(-1, 17)
    for b in range(rows * cols // 32):  # ggml-common.h block_mxfp4: e, then qs[j] = v[j] | v[j + 16] << 4
        r, g = divmod(b, cols // 32)
        values = codes[r, g * 32:(g + 1) * 32]
        assert blocks[b, 0] == exps[r, g]
        assert blocks[b, 1:].tolist() == [int(values[j]) | int(values[j + 16]) << 4 for j in range(16)]
    again_packed, again_exps = ggml_mxfp4_to_ct("w", blocks.reshape(-1), (rows, cols))
    assert np.array_equal(again_packed, packed) and np.array_equal(again_exps, exps)
    with pytest.raises(aprfast.CorruptError, match="'w'"):
        ct_mxfp4_to_ggml("w", packed[:, :-1], exps, (rows, cols))
    with pytest.raises(aprfast.CorruptError, match="'w'"):
        ggml_mxfp4_to_ct("w", blocks.reshape(-1)[:-1], (rows, cols))
