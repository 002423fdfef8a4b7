"""compressed-tensors weights of stacked experts (MoE: ``[E, out, in]`` with scales
``[E, ...]``; issue 27 item 5): imported and dequantized bit for bit.

compressed-tensors compresses and decompresses 3-D weights itself for FP8 per tensor
and per channel, MXFP8 and pack-quantized ints; there its own 3-D decompression is the
oracle.  NVFP4, MXFP4, MXFP6 and FP8 per block it takes only 2-D ("Expected 2D tensor"
and kin): there each expert is compressed by it as a 2-D weight, the results stacked
(the layout a 3-D checkpoint has), and the oracle is its 2-D decompression of each
expert, stacked."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from test_compressed_tensors import torch  # noqa: F401 - skips without the packages

import aprfast

pytest.importorskip("compressed_tensors")  # test_compressed_tensors has skipped already without it

from compressed_tensors.compressors.base import BaseCompressor  # noqa: E402
from compressed_tensors.quantization import (  # noqa: E402
    QuantizationArgs,
    QuantizationConfig,
    QuantizationScheme,
    preset_name_to_scheme,
)
from compressed_tensors.quantization.utils.helpers import calculate_qparams, generate_gparam  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

E = 3


def _int_scheme(bits, strategy, symmetric, group_size=None):
    return QuantizationScheme(targets=["re:experts"], weights=QuantizationArgs(
        num_bits=bits, type="int", strategy=strategy, symmetric=symmetric, group_size=group_size))


#: case -> (preset or scheme, [out, in] of one expert, compressed-tensors takes 3-D itself,
#: a global scale an expert (NVFP4))
CASES = {
    "NVFP4A16": ("NVFP4A16", (32, 128), False, False),
    "NVFP4A16-global-per-expert": ("NVFP4A16", (32, 128), False, True),
    "MXFP4A16": ("MXFP4A16", (32, 128), False, False),
    "MXFP6A16": ("MXFP6A16", (32, 128), False, False),
    "MXFP8A16": ("MXFP8A16", (32, 128), True, False),
    "FP8": ("FP8", (32, 128), True, False),
    "FP8_DYNAMIC": ("FP8_DYNAMIC", (32, 128), True, False),
    "FP8_BLOCK": ("FP8_BLOCK", (256, 256), False, False),
    "W4A16": ("W4A16", (32, 256), True, False),
    "W4A16_ASYM": ("W4A16_ASYM", (40, 256), True, False),
    "int3-channel-asym-200-cols": (_int_scheme(3, "channel", False), (40, 200), True, False),
    "int8-tensor-sym": (_int_scheme(8, "tensor", True), (16, 64), True, False),
}


def _qparams(w, args, global_scale=None):
    """Scale and zero point of a 2-D (or, per tensor, any) weight from its own
    min/max, as a calibration gives them."""
    w = w.float()
    if args.strategy == "tensor":
        return calculate_qparams(w.amin().reshape(1), w.amax().reshape(1), args)
    if args.strategy == "channel":
        return calculate_qparams(w.amin(dim=-1, keepdim=True), w.amax(dim=-1, keepdim=True), args)
    if args.strategy == "block":
        bh, bw = args.block_structure
        peak = w.reshape(w.shape[0] // bh, bh, w.shape[1] // bw, bw).abs().amax(dim=(1, 3))
        return calculate_qparams(-peak, peak, args)
    g = args.group_size
    wg = w.reshape(*w.shape[:-1], w.shape[-1] // g, g)
    return calculate_qparams(wg.amin(-1), wg.amax(-1), args, global_scale=global_scale)


def _state(w, args, scale, zero_point, global_scale):
    """A module's state before compression: its scale in the model's dtype and its zero
    point in ``zp_dtype``, as apply_quantization_config makes the parameters."""
    state = {"weight": w, "weight_scale": scale.to(w.dtype)}
    if global_scale is not None:
        state["weight_global_scale"] = global_scale
    if zero_point is not None and not args.symmetric:
        state["weight_zero_point"] = zero_point.to(args.zp_dtype or torch.int8)
    return state


def build_moe(case, out):
    """A checkpoint directory holding ``experts.*``: ``E`` experts of one compressed
    weight stacked, compressed by compressed-tensors (3-D where it takes 3-D, else
    each expert 2-D), and the dense ``head.weight`` it ignores.  Returns ``(directory,
    the values compressed-tensors' decompression gives)``."""
    preset, (rows, cols), native, per_expert_global = CASES[case]
    scheme = preset_name_to_scheme(preset, ["re:experts"]) if isinstance(preset, str) else preset
    args = scheme.weights
    torch.manual_seed(0)
    w = torch.randn(E, rows, cols, dtype=torch.bfloat16)
    w[1, 0, :32] *= 40  # one group of one expert far from the others
    fmt_name = _format(scheme)
    compressor = BaseCompressor.get_value_from_registry(fmt_name)
    if native:
        if args.strategy == "tensor":
            scale, zp = _qparams(w, args)
        else:
            parts = [_qparams(w[e], args) for e in range(E)]
            scale = torch.stack([p[0] for p in parts])
            zp = torch.stack([p[1] for p in parts]) if parts[0][1] is not None else None
        compressed = compressor.compress(_state(w, args, scale, zp, None), scheme)
        want = compressor.decompress(dict(compressed), scheme)["weight"]
    else:
        gs_all = generate_gparam(w.float().min(), w.float().max()) if args.strategy == "tensor_group" else None
        pieces, wants = [], []
        for e in range(E):
            gs = gs_all
            if gs is not None and per_expert_global:
                gs = generate_gparam(w[e].float().min(), w[e].float().max())
            scale, zp = _qparams(w[e], args, gs)
            piece = compressor.compress(_state(w[e], args, scale, zp, gs), scheme)
            wants.append(compressor.decompress(dict(piece), scheme)["weight"])
            pieces.append(piece)
        compressed = {}
        for key in pieces[0]:
            if key == "weight_global_scale" and not per_expert_global:
                compressed[key] = pieces[0][key]
            else:
                compressed[key] = torch.stack([p[key] for p in pieces])
        want = torch.stack(wants)
    tensors = {f"experts.{k}": v.contiguous() for k, v in compressed.items()}
    torch.manual_seed(1)
    tensors["head.weight"] = torch.randn(8, cols, dtype=torch.bfloat16)
    os.makedirs(out, exist_ok=True)
    save_file(tensors, os.path.join(out, "model.safetensors"))
    scheme = scheme.model_copy(update={"targets": ["re:experts"], "format": fmt_name})
    config = QuantizationConfig(config_groups={"group_0": scheme}, ignore=["head"], format=fmt_name,
                                quantization_status="compressed").model_dump(mode="json")
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump({"quantization_config": config}, f)
    return out, want.float().numpy()


def _format(scheme):
    """The format compressed-tensors' ModelCompressor picks for a Linear of ``scheme``."""
    from compressed_tensors.compressors.format import infer_module_format

    return infer_module_format(torch.nn.Linear, scheme).value


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    root = tmp_path_factory.mktemp("ct-moe")
    return {case: build_moe(case, str(root / case)) for case in CASES}


def _weight_name(directory):
    names = load_file(os.path.join(directory, "model.safetensors")).keys()
    return "experts.weight_packed" if "experts.weight_packed" in names else "experts.weight"


@pytest.mark.parametrize("case", CASES)
def test_stacked_experts_give_compressed_tensors_values_bit_for_bit(moe, tmp_path, case):
    directory, want = moe[case]
    name = _weight_name(directory)
    assert want.shape == (E, *CASES[case][1])
    aprfast.convert(directory, tmp_path / "x.apr")
    with aprfast.open(tmp_path / "x.apr") as f:
        assert list(f.compressed_weights) == [name]
        got = f.get_tensor(name, dequantize=True)
    assert got.dtype == np.float32 and got.shape == want.shape
    assert got.view(np.uint32).tolist() == want.view(np.uint32).tolist()


def _edited(directory, tmp_path, edit):
    tensors = load_file(os.path.join(directory, "model.safetensors"))
    edit(tensors)
    out = tmp_path / "edited"
    out.mkdir()
    save_file(tensors, str(out / "model.safetensors"))
    (out / "config.json").write_bytes(Path(directory, "config.json").read_bytes())
    return out


def test_a_scale_of_another_expert_count_is_refused_naming_it(moe, tmp_path):
    def fewer(t):
        t["experts.weight_scale"] = t["experts.weight_scale"][:2].contiguous()

    bad = _edited(moe["NVFP4A16"][0], tmp_path, fewer)
    with pytest.raises(aprfast.CorruptError, match=r"'experts.weight_scale' of 'experts.weight_packed'.*\[2, 32, 8\]"):
        aprfast.convert(bad, tmp_path / "x.apr")


def test_a_global_scale_of_another_expert_count_is_refused(moe, tmp_path):
    def wrong(t):
        t["experts.weight_global_scale"] = torch.ones(E + 1, 1)

    bad = _edited(moe["NVFP4A16-global-per-expert"][0], tmp_path, wrong)
    with pytest.raises(aprfast.CorruptError, match=r"global_scale 'experts.weight_global_scale'.*\[4, 1\]"):
        aprfast.convert(bad, tmp_path / "x.apr")


def test_a_4d_weight_is_refused_naming_it(moe, tmp_path):
    def four(t):
        t["experts.weight"] = t["experts.weight"].reshape(1, E, 32, 128).contiguous()

    bad = _edited(moe["FP8"][0], tmp_path, four)
    with pytest.raises(aprfast.CorruptError, match=r"'experts.weight' is F8_E4M3 of shape \[1, 3, 32, 128\]"):
        aprfast.convert(bad, tmp_path / "x.apr")


def test_a_weight_shape_of_another_expert_count_is_refused_on_read(moe, tmp_path):
    def other(t):
        t["experts.weight_shape"] = torch.tensor([E + 1, 32, 256])

    bad = _edited(moe["W4A16"][0], tmp_path, other)
    aprfast.convert(bad, tmp_path / "x.apr")
    with aprfast.open(tmp_path / "x.apr") as f:
        with pytest.raises(aprfast.CorruptError, match=r"'experts.weight_packed': weight_shape \[4, 32, 256\]"):
            f.get_tensor("experts.weight_packed", dequantize=True)


def test_a_2d_weight_shape_of_a_3d_weight_is_refused(moe, tmp_path):
    def flat(t):
        t["experts.weight_shape"] = torch.tensor([32, 256])

    bad = _edited(moe["W4A16"][0], tmp_path, flat)
    with pytest.raises(aprfast.CorruptError, match=r"weight_shape 'experts.weight_shape'.*shape \[3\]"):
        aprfast.convert(bad, tmp_path / "x.apr")
