"""compressed-tensors checkpoints converted by value (issue 27 item 5): to GGUF (which
cannot hold the packed layout) each weight is written as the values compressed-tensors'
decompression gives, in the dtype that holds them exactly unless ``precision=`` or
``quantize=`` says otherwise; ``precision=`` to any destination dequantizes the weights
and drops their scale tensors, records and quantization_config (docs/FORMAT.md
"compressed-tensors")."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from test_compressed_tensors import build, reference, torch  # noqa: F401 - skips without the packages
from test_compressed_tensors_moe import build_moe

import aprfast
from aprfast.convert.hf_arch import HF_FILES_KEY
from aprfast.numerics.compressed import METADATA_KEY

gguf = pytest.importorskip("gguf")

from safetensors.numpy import load_file  # noqa: E402
from safetensors.torch import load_file as load_torch  # noqa: E402
from safetensors.torch import save_file as save_torch  # noqa: E402

#: preset -> (weight, the GGUF dtype of its values without precision=/quantize=)
PRESETS = {"NVFP4A16": ("proj.weight_packed", "BF16"), "MXFP6A16": ("proj.weight_packed", "BF16"),
           "MXFP8A16": ("proj.weight", "BF16"), "FP8": ("proj.weight", "BF16"),
           "FP8_DYNAMIC": ("proj.weight", "BF16"), "FP8_BLOCK": ("proj.weight", "BF16"),
           "W4A16": ("proj.weight_packed", "BF16"), "W4A16_ASYM": ("proj.weight_packed", "BF16")}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("ct-deq")
    out = {p: build(p, str(root / p), shape=(256, 256) if p == "FP8_BLOCK" else (64, 256)) for p in PRESETS}
    out["W8A16-f16"] = build("W8A16", str(root / "W8A16-f16"), dtype=torch.float16)  # F16 scales
    out["MXFP4A16"] = build("MXFP4A16", str(root / "MXFP4A16"))
    return out


def _gguf_values(path):
    """``{name: (GGML type name, float32 values)}`` of a GGUF, as gguf-py reads it."""
    out = {}
    for t in gguf.GGUFReader(str(path)).tensors:
        values = gguf.quants.dequantize(t.data, t.tensor_type)
        out[t.name] = (t.tensor_type.name, np.asarray(values, np.float32).reshape(tuple(reversed(t.shape.tolist()))))
    return out


def _bits(a):
    return np.ascontiguousarray(a, np.float32).view(np.uint32)


@pytest.mark.parametrize("preset", list(PRESETS) + ["W8A16-f16"])
def test_a_checkpoint_converts_to_gguf_as_its_values(checkpoints, tmp_path, preset):
    directory = checkpoints[preset]
    aprfast.convert(directory, tmp_path / "x.gguf", names="keep")
    got = _gguf_values(tmp_path / "x.gguf")
    assert sorted(got) == ["head.weight", "proj.weight"]  # the scale tensors are gone (and FP8's input_scale)
    dtype, values = got["proj.weight"]
    assert dtype == ("F16" if preset == "W8A16-f16" else PRESETS[preset][1])  # the values' own dtype: lossless
    want = reference(directory)
    assert np.array_equal(_bits(values), _bits(want))
    fields = gguf.GGUFReader(str(tmp_path / "x.gguf")).fields
    assert not any(METADATA_KEY in key for key in fields)


@pytest.mark.parametrize("precision", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("preset", ["NVFP4A16", "FP8_DYNAMIC", "W4A16_ASYM", "MXFP4A16"])
def test_precision_dequantizes_to_gguf_and_safetensors(checkpoints, tmp_path, preset, precision):
    directory = checkpoints[preset]
    want = torch.from_numpy(reference(directory))  # compressed-tensors' values, then torch's rounding
    want = want.to({"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}[precision]).float().numpy()
    aprfast.convert(directory, tmp_path / "x.gguf", names="keep", precision=precision)
    dtype, values = _gguf_values(tmp_path / "x.gguf")["proj.weight"]
    assert dtype == precision.upper() and np.array_equal(_bits(values), _bits(want))
    aprfast.convert(directory, tmp_path / "x.safetensors", names="keep", precision=precision)
    state = load_torch(str(tmp_path / "x.safetensors"))
    assert sorted(state) == ["head.weight", "proj.weight"]
    assert np.array_equal(_bits(state["proj.weight"].float().numpy()), _bits(want))


def test_precision_f32_to_apr_leaves_no_compressed_tensors_record_or_config(checkpoints, tmp_path):
    directory = checkpoints["NVFP4A16"]
    aprfast.convert(directory, tmp_path / "x.apr", precision="f32")
    with aprfast.open(tmp_path / "x.apr") as f:
        assert sorted(f.keys()) == ["head.weight", "proj.weight"]
        assert f.compressed_weights == {} and METADATA_KEY not in f.metadata
        assert "quantization_config" not in f.metadata[HF_FILES_KEY]["config.json"]
        got = f.get_tensor("proj.weight")
    assert got.dtype == np.float32 and np.array_equal(_bits(got), _bits(reference(directory)))
    # and an .apr that kept the layout dequantizes the same way on its way out
    aprfast.convert(directory, tmp_path / "kept.apr")
    with aprfast.open(tmp_path / "kept.apr") as f:
        assert "quantization_config" in f.metadata[HF_FILES_KEY]["config.json"]
    aprfast.convert(tmp_path / "kept.apr", tmp_path / "y.apr", precision="f32")
    with aprfast.open(tmp_path / "y.apr") as f:
        assert sorted(f.keys()) == ["head.weight", "proj.weight"] and METADATA_KEY not in f.metadata
        assert "quantization_config" not in f.metadata[HF_FILES_KEY]["config.json"]
        assert np.array_equal(_bits(f.get_tensor("proj.weight")), _bits(reference(directory)))


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0", "MXFP4"])
@pytest.mark.parametrize("preset", ["NVFP4A16", "FP8_BLOCK"])
def test_quantize_to_gguf_starts_from_the_exact_values(checkpoints, tmp_path, preset, qtype):
    directory = checkpoints[preset]
    aprfast.convert(directory, tmp_path / "x.gguf", names="keep", quantize={"proj.*": qtype}, max_drift=None)
    tensor = next(t for t in gguf.GGUFReader(str(tmp_path / "x.gguf")).tensors if t.name == "proj.weight")
    assert tensor.tensor_type.name == qtype
    want = gguf.quants.quantize(reference(directory), gguf.GGMLQuantizationType[qtype])  # gguf-py, from the values
    assert np.array_equal(np.asarray(tensor.data).reshape(-1).view(np.uint8), want.reshape(-1).view(np.uint8))


def test_a_mix_quantizes_from_the_values(checkpoints, tmp_path):
    directory = checkpoints["FP8_DYNAMIC"]
    aprfast.convert(directory, tmp_path / "x.gguf", names="keep", quantize="Q4_K_M", max_drift=None)
    tensor = next(t for t in gguf.GGUFReader(str(tmp_path / "x.gguf")).tensors if t.name == "proj.weight")
    qtype = tensor.tensor_type.name
    assert qtype not in ("F32", "F16", "BF16")
    want = aprfast.quantize(reference(directory), qtype)
    assert np.array_equal(np.asarray(tensor.data).reshape(-1).view(np.uint8), np.asarray(want.data).view(np.uint8))


def test_mxfp4_keeps_its_lossless_repack_to_gguf(checkpoints, tmp_path):
    aprfast.convert(checkpoints["MXFP4A16"], tmp_path / "x.gguf", names="keep")
    dtype, values = _gguf_values(tmp_path / "x.gguf")["proj.weight"]
    assert dtype == "MXFP4"
    want = reference(checkpoints["MXFP4A16"])
    assert np.array_equal(values, want)  # GGML's MXFP4 has no -0.0: equal values, signs of zero aside


def _two_modules(directory, out):
    """``directory``'s quantized ``proj`` twice: ``proj.a`` and ``proj.b`` (both
    targets of its ``re:proj`` group)."""
    state = load_torch(os.path.join(directory, "model.safetensors"))
    tensors = {}
    for name, value in state.items():
        if name.startswith("proj."):
            tensors["proj.a." + name[5:]] = value
            tensors["proj.b." + name[5:]] = value.clone()
        else:
            tensors[name] = value
    os.makedirs(out)
    save_torch(tensors, os.path.join(out, "model.safetensors"))
    Path(out, "config.json").write_bytes(Path(directory, "config.json").read_bytes())
    return out


def test_quantize_of_some_weights_keeps_the_others_compressed(checkpoints, tmp_path):
    directory = _two_modules(checkpoints["FP8_DYNAMIC"], str(tmp_path / "two"))
    aprfast.convert(directory, tmp_path / "x.apr", quantize={"proj.a.*": "Q8_0"}, max_drift=None)
    want = reference(checkpoints["FP8_DYNAMIC"])
    with aprfast.open(tmp_path / "x.apr") as f:
        assert f.info("proj.a.weight").dtype_name == "Q8_0" and "proj.a.weight_scale" not in f
        assert list(f.compressed_weights) == ["proj.b.weight"] and "proj.b.weight_scale" in f
        assert np.array_equal(_bits(f.get_tensor("proj.b.weight", dequantize=True)), _bits(want))
        config = f.metadata[HF_FILES_KEY]["config.json"]["quantization_config"]
        assert config["ignore"] == ["head", "proj.a"]  # transformers loads proj.a as a plain weight
        assert f.metadata[METADATA_KEY]["quantization_config"]["ignore"] == ["head", "proj.a"]
        q = f.get_tensor("proj.a.weight")
    assert bytes(np.asarray(q.data)) == bytes(np.asarray(aprfast.quantize(want, "Q8_0").data))


def test_stacked_experts_convert_to_gguf(tmp_path):
    directory, want = build_moe("NVFP4A16", str(tmp_path / "nvfp4"))
    aprfast.convert(directory, tmp_path / "x.gguf", names="keep")
    dtype, values = _gguf_values(tmp_path / "x.gguf")["experts.weight"]
    assert dtype == "BF16" and values.shape == want.shape == (3, 32, 128)
    assert np.array_equal(_bits(values), _bits(want))
    directory, want = build_moe("MXFP4A16", str(tmp_path / "mxfp4"))
    aprfast.convert(directory, tmp_path / "y.gguf", names="keep")  # repacked, 3-D, as gpt-oss's experts are
    dtype, values = _gguf_values(tmp_path / "y.gguf")["experts.weight"]
    assert dtype == "MXFP4" and np.array_equal(values, want)


# --- hostile records: typed errors naming the tensor, nothing written ------------------------
def _apr_with_record(checkpoints, tmp_path, preset, edit):
    aprfast.convert(checkpoints[preset], tmp_path / "a.apr", names="keep")
    with aprfast.open(tmp_path / "a.apr") as f:
        tensors = {name: f.get_tensor(name, copy=True) for name in f.keys()}
        metadata = dict(f.metadata)
    block = json.loads(json.dumps(metadata[METADATA_KEY]))
    edit(block["weights"][PRESETS[preset][0]])
    aprfast.save_file(tensors, tmp_path / "b.apr", {**metadata, METADATA_KEY: block})
    return tmp_path / "b.apr"


@pytest.mark.parametrize("edit, error, match", [
    (lambda r: r.update(format="marlin-24"), aprfast.LayoutError, r"'proj.weight_packed'.*'marlin-24'"),
    (lambda r: r.update(scale="head.weight"), aprfast.CorruptError, r"'head.weight' of 'proj.weight_packed'"),
    (lambda r: r.update(global_scale="nowhere"), aprfast.CorruptError, r"'proj.weight_packed'.*'nowhere' is missing"),
    (lambda r: r.update(group_size=48), aprfast.CorruptError, r"'proj.weight_packed': group_size 48"),
], ids=["unknown-format", "wrong-scale", "missing-global-scale", "bad-group"])
def test_a_hostile_record_is_refused_on_the_way_to_gguf(checkpoints, tmp_path, edit, error, match):
    bad = _apr_with_record(checkpoints, tmp_path, "NVFP4A16", edit)
    for dest, options in (("x.gguf", {}), ("x.safetensors", {"precision": "f32"})):
        with pytest.raises(error, match=match):
            aprfast.convert(bad, tmp_path / dest, **options)
        assert not (tmp_path / dest).exists()


def test_a_wrong_weight_shape_is_refused_on_the_way_to_gguf(checkpoints, tmp_path):
    state = load_file(os.path.join(checkpoints["W4A16"], "model.safetensors"))
    state["proj.weight_shape"] = np.array([64, 999], np.int64)
    bad = tmp_path / "bad"
    bad.mkdir()
    from safetensors.numpy import save_file

    save_file(state, str(bad / "model.safetensors"))
    (bad / "config.json").write_bytes(Path(checkpoints["W4A16"], "config.json").read_bytes())
    with pytest.raises(aprfast.CorruptError, match=r"'proj.weight_packed': weight_shape \[64, 999\]"):
        aprfast.convert(bad, tmp_path / "x.gguf", names="keep")
    assert not (tmp_path / "x.gguf").exists()


def test_a_llama_checkpoint_to_gguf_and_back_loses_its_quantization_config(tmp_path):
    from compressed_tensors.compressors.base import BaseCompressor
    from compressed_tensors.quantization import QuantizationConfig, preset_name_to_scheme
    from test_convert_hf_arch import _model_dir

    from aprfast.convert.hf_arch import HF_CONFIG_KEY

    plain = _model_dir(tmp_path / "plain")  # a tiny LLaMA, its MLPs then FP8 per channel by compressed-tensors
    scheme = preset_name_to_scheme("FP8_DYNAMIC", ["re:.*mlp.*"])
    compressor = BaseCompressor.get_value_from_registry("float-quantized")
    state, want = {}, {}
    for name, value in plain.items():
        w = torch.from_numpy(value).to(torch.bfloat16)
        if ".mlp." not in name:
            state[name] = w
            continue
        module = name[:-len(".weight")]
        scale = (w.float().abs().amax(dim=1, keepdim=True) / 448).to(torch.bfloat16)
        parts = compressor.compress({"weight": w, "weight_scale": scale}, scheme)
        want[name] = compressor.decompress(dict(parts), scheme)["weight"].float().numpy()
        state.update({f"{module}.{k}": v.contiguous() for k, v in parts.items()})
    directory = tmp_path / "ct"
    directory.mkdir()
    save_torch(state, str(directory / "model.safetensors"))
    for file in ("tokenizer.json", "tokenizer_config.json"):
        (directory / file).write_bytes((tmp_path / "plain" / file).read_bytes())
    config = json.loads((tmp_path / "plain" / "config.json").read_text())
    config["quantization_config"] = dict(QuantizationConfig(
        config_groups={"group_0": scheme.model_copy(update={"format": "float-quantized"})}, format="float-quantized",
        quantization_status="compressed").model_dump(mode="json"), quant_method="compressed-tensors")
    (directory / "config.json").write_text(json.dumps(config))

    aprfast.convert(directory, tmp_path / "m.gguf")
    reader = gguf.GGUFReader(str(tmp_path / "m.gguf"))
    recorded = json.loads(reader.fields[HF_CONFIG_KEY].contents())
    assert "quantization_config" not in recorded and recorded["model_type"] == "llama"
    types = {t.name: t.tensor_type.name for t in reader.tensors}
    assert types["blk.0.ffn_up.weight"] == "BF16" and not any("scale" in name for name in types)
    aprfast.convert(tmp_path / "m.gguf", f"{tmp_path / 'back'}{os.sep}")
    back_config = json.loads((tmp_path / "back" / "config.json").read_text())
    assert "quantization_config" not in back_config  # transformers loads the plain weights as they are
    back = load_torch(str(tmp_path / "back" / "model.safetensors"))
    for name, values in want.items():
        assert np.array_equal(_bits(back[name].float().numpy()), _bits(values)), name
    assert not any(name.endswith("_scale") for name in back)
