"""compressed-tensors checkpoints (issue 27 item 5): built here with the package's own
compressors, imported with ``aprfast.convert(dir, "x.apr")``, and their weights' values
compared bit for bit with the package's own decompression on the CPU."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

import aprfast
from aprfast.cli.tensors import list_tensors
from aprfast.numerics.compressed import METADATA_KEY


def _require(module):
    """Skip without the package, unless CI requires it (APRFAST_REQUIRE_COMPRESSED_TENSORS)."""
    try:
        return pytest.importorskip(module)
    except pytest.skip.Exception:
        if os.environ.get("APRFAST_REQUIRE_COMPRESSED_TENSORS", "").strip() not in ("", "0"):
            pytest.fail(f"APRFAST_REQUIRE_COMPRESSED_TENSORS is set but {module} is not installed", pytrace=False)
        raise


torch = _require("torch")
ct = _require("compressed_tensors")

from compressed_tensors.compressors import ModelCompressor  # noqa: E402
from compressed_tensors.compressors.base import BaseCompressor  # noqa: E402
from compressed_tensors.quantization import (  # noqa: E402
    QuantizationArgs,
    QuantizationConfig,
    QuantizationScheme,
    apply_quantization_config,
    preset_name_to_scheme,
)
from compressed_tensors.quantization.utils.helpers import (  # noqa: E402
    calculate_qparams,
    compute_dynamic_scales_and_zp,
    generate_gparam,
)
from safetensors.torch import load_file, save_file  # noqa: E402

#: preset -> (weight name, weight shape): NVFP4, MXFP4, MXFP6, MXFP8 and FP8 per tensor,
#: per channel (FP8_DYNAMIC) and per 128x128 block
PRESETS = {"NVFP4A16": "proj.weight_packed", "MXFP4A16": "proj.weight_packed", "MXFP6A16": "proj.weight_packed",
           "MXFP8A16": "proj.weight", "FP8": "proj.weight", "FP8_DYNAMIC": "proj.weight",
           "FP8_BLOCK": "proj.weight"}


def build(preset, out, shape=(64, 256), dtype=None):
    """A two-layer checkpoint directory whose ``proj`` is quantized with ``preset`` (a
    preset name or a QuantizationScheme; scales and zero points from the weight's own
    min/max, as a calibration would give) and compressed by compressed-tensors'
    ModelCompressor; ``head`` is left alone (``ignore``)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential()
    model.add_module("proj", torch.nn.Linear(shape[1], shape[0], bias=False))
    model.add_module("head", torch.nn.Linear(shape[0], 8, bias=False))
    model = model.to(dtype or torch.bfloat16)
    with torch.no_grad():
        model.proj.weight[0, :32] *= 40  # one group far from the others: scales that differ
    scheme = preset_name_to_scheme(preset, ["re:proj"]) if isinstance(preset, str) else preset
    apply_quantization_config(model, QuantizationConfig(config_groups={"group_0": scheme}, ignore=["head"]))
    m, args, w = model.proj, scheme.weights, model.proj.weight.data
    global_scale = None
    if hasattr(m, "weight_global_scale"):
        global_scale = generate_gparam(w.float().min(), w.float().max())
        m.weight_global_scale.data.copy_(global_scale)
    if args.strategy == "block":
        bh, bw = args.block_structure
        peak = w.float().reshape(w.shape[0] // bh, bh, w.shape[1] // bw, bw).abs().amax(dim=(1, 3))
        scale, zero_point = calculate_qparams(-peak, peak, args)
    elif args.strategy == "channel":
        scale, zero_point = calculate_qparams(w.amin(dim=1, keepdim=True), w.amax(dim=1, keepdim=True), args)
    elif args.strategy == "tensor":
        scale, zero_point = calculate_qparams(w.amin().reshape(1), w.amax().reshape(1), args)
    else:
        scale, zero_point = compute_dynamic_scales_and_zp(w, args, m, global_scale=global_scale)
    m.weight_scale.data.copy_(scale.to(m.weight_scale.dtype).reshape(m.weight_scale.shape))
    if hasattr(m, "weight_zero_point") and zero_point is not None:
        m.weight_zero_point.data.copy_(zero_point.to(m.weight_zero_point.dtype).reshape(m.weight_zero_point.shape))
    compressor = ModelCompressor.from_pretrained_model(model)
    compressor.compress_model(model)
    os.makedirs(out, exist_ok=True)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, os.path.join(out, "model.safetensors"))
    compressor.update_config(out)
    return out


def reference(directory, module="proj"):
    """compressed-tensors' own decompression of ``module``'s weight, as float32."""
    with open(os.path.join(directory, "config.json")) as f:
        config = QuantizationConfig.model_validate(json.load(f)["quantization_config"])
    scheme = config.config_groups["group_0"]
    compressor = BaseCompressor.get_value_from_registry(scheme.format or config.format)
    state = {k[len(module) + 1:]: v for k, v in load_file(os.path.join(directory, "model.safetensors")).items()
             if k.startswith(module + ".")}
    return compressor.decompress(state, scheme)["weight"].float().numpy()


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("ct")
    return {p: build(p, str(root / p), shape=(256, 256) if p == "FP8_BLOCK" else (64, 256)) for p in PRESETS}


@pytest.mark.parametrize("preset", PRESETS)
def test_import_gives_compressed_tensors_values_bit_for_bit(checkpoints, tmp_path, preset):
    directory = checkpoints[preset]
    aprfast.convert(directory, tmp_path / "x.apr")
    want = reference(directory)
    name = PRESETS[preset]
    with aprfast.open(tmp_path / "x.apr") as f:
        record = f.compressed_weights[name]
        assert list(f.compressed_weights) == [name]  # head is ignored: not quantized
        with open(os.path.join(directory, "config.json")) as config:
            assert record["format"] == json.load(config)["quantization_config"]["format"]
        assert record["scale"] == "proj.weight_scale"
        if preset == "NVFP4A16":
            assert record["global_scale"] == "proj.weight_global_scale"
        got = f.get_tensor(name, dequantize=True)
        assert got.dtype == np.float32 and got.shape == want.shape
        assert got.view(np.uint32).tolist() == want.view(np.uint32).tolist()
        assert f.get_tensor("proj.weight_scale").shape  # every stored tensor is kept as it is
        rows = {r["name"]: r for r in list_tensors(f, stats=True)}
    stats = rows[name]["stats"]  # apr tensors --stats: the values, not the packed bytes
    assert stats["max"] == pytest.approx(float(want.max())) and stats["mean"] == pytest.approx(float(want.mean()),
                                                                                              rel=1e-5)
    assert METADATA_KEY in aprfast.inspect(tmp_path / "x.apr")["metadata"]


def test_the_stored_tensors_survive_apr_to_apr(checkpoints, tmp_path):
    aprfast.convert(checkpoints["NVFP4A16"], tmp_path / "a.apr")
    aprfast.convert(tmp_path / "a.apr", tmp_path / "b.apr")
    with aprfast.open(tmp_path / "b.apr") as f:
        got = f.get_tensor("proj.weight_packed", dequantize=True)
    assert got.view(np.uint32).tolist() == reference(checkpoints["NVFP4A16"]).view(np.uint32).tolist()


def _edited(directory, tmp_path, drop=(), reshape=None, config=None):
    tensors = load_file(os.path.join(directory, "model.safetensors"))
    for name in drop:
        del tensors[name]
    if reshape:
        name, shape = reshape
        tensors[name] = tensors[name].reshape(-1)[: int(np.prod(shape))].reshape(shape).contiguous()
    out = tmp_path / "edited"
    out.mkdir()
    save_file(tensors, str(out / "model.safetensors"))
    with open(os.path.join(directory, "config.json")) as f:
        doc = json.load(f)
    if config:
        config(doc["quantization_config"])
    (out / "config.json").write_text(json.dumps(doc))
    return out


def test_a_missing_scale_is_refused_naming_it(checkpoints, tmp_path):
    bad = _edited(checkpoints["NVFP4A16"], tmp_path, drop=["proj.weight_scale"])
    with pytest.raises(aprfast.CorruptError, match="'proj.weight_scale' is missing"):
        aprfast.convert(bad, tmp_path / "x.apr")
    assert not (tmp_path / "x.apr").exists()


def test_a_wrong_shaped_scale_is_refused_naming_it(checkpoints, tmp_path):
    bad = _edited(checkpoints["MXFP4A16"], tmp_path, reshape=("proj.weight_scale", (64, 4)))
    with pytest.raises(aprfast.CorruptError, match=r"'proj.weight_scale'.*shape \[64, 4\].*\[64, 8\]"):
        aprfast.convert(bad, tmp_path / "x.apr")


def test_a_missing_global_scale_is_refused(checkpoints, tmp_path):
    bad = _edited(checkpoints["NVFP4A16"], tmp_path, drop=["proj.weight_global_scale"])
    with pytest.raises(aprfast.CorruptError, match="'proj.weight_packed'.*global scale"):
        aprfast.convert(bad, tmp_path / "x.apr")


def test_a_group_size_that_does_not_divide_is_refused(checkpoints, tmp_path):
    def odd(qc):
        qc["config_groups"]["group_0"]["weights"]["group_size"] = 48

    bad = _edited(checkpoints["NVFP4A16"], tmp_path, config=odd)
    with pytest.raises(aprfast.CorruptError, match="'proj.weight_packed': group_size 48"):
        aprfast.convert(bad, tmp_path / "x.apr")


def test_a_hostile_record_in_the_file_is_refused_when_values_are_asked(checkpoints, tmp_path):
    aprfast.convert(checkpoints["FP8_DYNAMIC"], tmp_path / "a.apr")
    with aprfast.open(tmp_path / "a.apr") as f:
        tensors = {name: f.get_tensor(name, copy=True) for name in f.keys()}
        metadata = dict(f.metadata)
    block = json.loads(json.dumps(metadata[METADATA_KEY]))
    block["weights"]["proj.weight"]["scale"] = "head.weight"  # a tensor of another shape
    aprfast.save_file(tensors, tmp_path / "b.apr", {**metadata, METADATA_KEY: block})
    with aprfast.open(tmp_path / "b.apr") as f:
        with pytest.raises(aprfast.CorruptError, match="'head.weight'"):
            f.get_tensor("proj.weight", dequantize=True)
    block["weights"]["proj.weight"]["format"] = "marlin-24"
    aprfast.save_file(tensors, tmp_path / "c.apr", {**metadata, METADATA_KEY: block})
    with aprfast.open(tmp_path / "c.apr") as f:
        with pytest.raises(aprfast.LayoutError, match="'marlin-24', a format aprfast cannot decode"):
            f.get_tensor("proj.weight", dequantize=True)


def test_mxfp6_packing_is_aprfasts_f6_e2m3(checkpoints):
    from compressed_tensors.compressors.mxfp6.helpers import pack_fp6_to_uint8

    from aprfast import dtypes

    codes = np.arange(64, dtype=np.uint8).reshape(4, 16)
    values = torch.from_numpy(dtypes.subbyte_values("F6_E2M3", dtypes.pack_subbyte(codes, 6), (4, 16)))
    theirs = pack_fp6_to_uint8(values).numpy().reshape(-1)
    assert theirs.tolist() == dtypes.pack_subbyte(codes, 6).tolist()  # the same bit stream as safetensors' F6


# --- pack-quantized: 1-8 bit ints packed in int32 (W4A16 and its kin) ------------------
def _int_scheme(bits, strategy, symmetric, group_size=None):
    return QuantizationScheme(targets=["re:proj"], weights=QuantizationArgs(
        num_bits=bits, type="int", strategy=strategy, symmetric=symmetric, group_size=group_size))


#: name -> (preset or scheme, weight shape, model dtype): the presets, asymmetric zero
#: points packed along the rows, odd widths split across words, columns that do not
#: fill the last word, per-tensor, and float16/float32 scales
PACKED = {
    "W4A16": ("W4A16", (64, 256), None),
    "W4A16_ASYM": ("W4A16_ASYM", (64, 256), None),
    "W8A16": ("W8A16", (64, 256), None),
    "W5A16": ("W5A16", (40, 256), None),
    "W2A16": ("W2A16", (64, 256), None),
    "int3-channel-asym-200-cols": (_int_scheme(3, "channel", False), (64, 200), None),
    "int6-group-asym-f16": (_int_scheme(6, "group", False, 32), (72, 96), torch.float16),
    "int7-channel-sym-f32": (_int_scheme(7, "channel", True), (16, 37), torch.float32),
    "int4-tensor-sym": (_int_scheme(4, "tensor", True), (8, 64), None),
}


@pytest.fixture(scope="module")
def packed_checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("ct-packed")
    return {name: build(preset, str(root / name), shape=shape, dtype=dtype)
            for name, (preset, shape, dtype) in PACKED.items()}


@pytest.mark.parametrize("name", PACKED)
def test_pack_quantized_gives_compressed_tensors_values_bit_for_bit(packed_checkpoints, tmp_path, name):
    directory = packed_checkpoints[name]
    with open(os.path.join(directory, "config.json")) as f:
        assert json.load(f)["quantization_config"]["format"] == "pack-quantized"
    aprfast.convert(directory, tmp_path / "x.apr")
    want = reference(directory)
    with aprfast.open(tmp_path / "x.apr") as f:
        record = f.compressed_weights["proj.weight_packed"]
        assert record["weight_shape"] == "proj.weight_shape" and record["format"] == "pack-quantized"
        assert ("zero_point" in record) == (not PACKED[name][0].weights.symmetric
                                            if not isinstance(PACKED[name][0], str) else name.endswith("ASYM"))
        got = f.get_tensor("proj.weight_packed", dequantize=True)
    assert got.dtype == np.float32 and got.shape == want.shape == PACKED[name][1]
    assert got.view(np.uint32).tolist() == want.view(np.uint32).tolist()


def test_pack_quantized_stream_is_compressed_tensors_packing():
    from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32

    from aprfast.numerics.compressed import unpack_int32_stream

    rng = np.random.default_rng(1)
    for bits in range(1, 9):
        for cols in (1, 31, 32, 33, 100):
            values = rng.integers(-(1 << (bits - 1)), 1 << (bits - 1), (3, cols), dtype=np.int8)
            words = pack_to_int32(torch.from_numpy(values), bits).numpy()
            got = unpack_int32_stream(words, 3, cols, bits).astype(np.int16) - (1 << (bits - 1))
            assert got.tolist() == values.tolist(), (bits, cols)


def test_a_weight_shape_that_does_not_fit_the_words_is_refused(packed_checkpoints, tmp_path):
    directory = packed_checkpoints["int3-channel-asym-200-cols"]
    tensors = load_file(os.path.join(directory, "model.safetensors"))
    tensors["proj.weight_shape"] = torch.tensor([64, 300])  # 300 3-bit values need 29 words, not 19
    out = tmp_path / "edited"
    out.mkdir()
    save_file(tensors, str(out / "model.safetensors"))
    (out / "config.json").write_bytes((Path(directory) / "config.json").read_bytes())
    aprfast.convert(out, tmp_path / "x.apr")  # the shapes alone cannot tell: the values are checked on read
    with aprfast.open(tmp_path / "x.apr") as f:
        with pytest.raises(aprfast.CorruptError, match=r"'proj.weight_packed': weight_shape \[64, 300\]"):
            f.get_tensor("proj.weight_packed", dequantize=True)


def test_a_missing_weight_shape_or_bad_bits_is_refused(packed_checkpoints, tmp_path):
    directory = packed_checkpoints["W4A16"]
    bad = _edited(directory, tmp_path, drop=["proj.weight_shape"])
    with pytest.raises(aprfast.CorruptError, match="'proj.weight_packed'.*'proj.weight_shape' is missing"):
        aprfast.convert(bad, tmp_path / "x.apr")

    def nine(qc):
        qc["config_groups"]["group_0"]["weights"]["num_bits"] = 9

    bad = tmp_path / "nine"
    bad.mkdir()
    edited = _edited(directory, bad, config=nine)
    with pytest.raises(aprfast.CorruptError, match="'proj.weight_packed': num_bits 9"):
        aprfast.convert(edited, tmp_path / "y.apr")
