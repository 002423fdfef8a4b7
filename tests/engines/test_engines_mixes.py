"""llama.cpp's named mixes (Q4_K_M, Q5_K_M, Q3_K_M, Q2_K, ...): aprfast's HF -> GGUF with
``quantize="Q4_K_M"`` gives the GGUF ``llama-quantize`` makes from the F32 GGUF (issue
27 item 3): the same tensors, each of the same GGML type with the same bytes, and the
same keys (``general.file_type`` the mix's llama_ftype).

The oracle is ``llama_model_quantize`` of llama-cpp-python (what the ``llama-quantize``
tool calls), without an importance matrix, on aprfast's F32 GGUF of tiny LLaMA and
Qwen2 models built with transformers: one whose rows are all whole 256-blocks (10
layers, so that the "more bits" layers of attn_v and ffn_down differ from the others),
one with a tied output (token_embd takes output's rule), and one whose rows are not
(96 and 200: the fallbacks to Q5_0/Q5_1/Q8_0/IQ4_NL and F16; Q1_0 has no fallback, and
there both llama-quantize and aprfast refuse the model).  MoE models (MXFP4_MOE's
expert tensors, the 8-expert rules) are compared GGUF -> GGUF from a tiny Mixtral-style
F32 GGUF written with gguf-py (``tiny_models.make_moe_gguf``): aprfast converts no
Hugging Face MoE model.
"""

from __future__ import annotations

import ctypes
import warnings

import pytest
import tiny_models
from gguf_compare import differences
from gguf_compare import read as read_gguf

import aprfast
from aprfast.convert.hf_arch import ModelConversionWarning
from aprfast.errors import LayoutError
from aprfast.numerics.mixes import MIXES, mix_params, mix_types

#: name -> (architecture, config sizes)
MODELS = {
    "k256": ("llama", dict(hidden_size=256, intermediate_size=512, num_hidden_layers=10, num_attention_heads=4,
                           num_key_value_heads=2)),
    "tied": ("qwen2", dict(hidden_size=256, intermediate_size=512, num_hidden_layers=3, num_attention_heads=4,
                           num_key_value_heads=1)),
    "odd": ("llama", dict(hidden_size=96, intermediate_size=200, num_hidden_layers=2, num_attention_heads=4,
                          num_key_value_heads=2)),
}
MIX_NAMES = ("Q4_K_M", "Q5_K_M", "Q4_K_S", "Q5_K_S", "Q6_K", "Q8_0", "Q3_K_S", "Q3_K_M", "Q3_K_L", "Q2_K", "IQ4_NL",
             "IQ4_XS", "TQ1_0", "TQ2_0", "MXFP4_MOE", "IQ3_S", "IQ3_M", "Q1_0")
#: (model, mix) that llama-quantize refuses: Q1_0 has no fallback for rows of 96 and 200.
REFUSED = {("odd", "Q1_0")}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, transformers_lib):
    built = {}

    def get(which):
        if which not in built:
            arch, sizes = MODELS[which]
            directory = tmp_path_factory.mktemp(f"hf-mix-{which}")
            tiny_models.make_model(arch, directory, sizes=sizes)
            built[which] = directory
        return built[which]

    return get


@pytest.fixture(scope="module")
def f32_gguf(model_dir, tmp_path_factory):
    done = {}

    def get(which):
        if which not in done:
            out = tmp_path_factory.mktemp(f"gguf-mix-{which}") / "f32.gguf"
            with warnings.catch_warnings():
                warnings.simplefilter("error", ModelConversionWarning)
                aprfast.convert(model_dir(which), out)
            done[which] = out
        return done[which]

    return get


def llama_quantize(llama_cpp, source, out, mix_name, refused=False):
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = MIXES[mix_name].ftype
    params.nthread = 1
    rc = llama_cpp.llama_model_quantize(str(source).encode(), str(out).encode(), ctypes.byref(params))
    if refused:
        assert rc != 0, f"llama_model_quantize({mix_name}) was expected to refuse"
        return None
    assert rc == 0, f"llama_model_quantize({mix_name}) failed"
    return out


@pytest.mark.parametrize("which", list(MODELS))
@pytest.mark.parametrize("mix_name", MIX_NAMES)
def test_hf_to_gguf_mix_is_llama_quantize(which, mix_name, llama_cpp_lib, model_dir, f32_gguf, tmp_path):
    refused = (which, mix_name) in REFUSED
    reference = llama_quantize(llama_cpp_lib, f32_gguf(which), tmp_path / "reference.gguf", mix_name, refused)
    ours = tmp_path / "ours.gguf"
    if refused:
        with pytest.raises(LayoutError, match=f"no fallback type for {mix_name}"):
            aprfast.convert(model_dir(which), ours, quantize=mix_name.lower(), max_drift=None)
        assert not ours.exists()
        return
    with warnings.catch_warnings():
        warnings.simplefilter("error", ModelConversionWarning)
        aprfast.convert(model_dir(which), ours, quantize=mix_name.lower(), max_drift=None)
    assert differences(ours, reference) == []


@pytest.mark.parametrize("mix_name", ("Q4_K_M", "Q5_K_M"))
def test_gguf_to_gguf_mix_is_llama_quantize(mix_name, llama_cpp_lib, f32_gguf, tmp_path):
    reference = llama_quantize(llama_cpp_lib, f32_gguf("k256"), tmp_path / "reference.gguf", mix_name)
    ours = tmp_path / "ours.gguf"
    aprfast.convert(f32_gguf("k256"), ours, quantize=mix_name, max_drift=None)
    assert differences(ours, reference) == []


def test_mix_types_are_llama_quantizes(llama_cpp_lib, f32_gguf, tmp_path):
    """mix_types alone (names, shapes, keys) gives the reference's types, every mix and model."""
    for which in MODELS:
        keys, tensors = read_gguf(f32_gguf(which))
        metadata = {k: v for k, (_, v) in keys.items()}
        params = mix_params(metadata)
        shapes = [(name, tuple(reversed(shape))) for name, (_, shape, _) in tensors.items()]
        for mix_name in MIX_NAMES:
            if (which, mix_name) in REFUSED:
                continue
            reference = read_gguf(llama_quantize(llama_cpp_lib, f32_gguf(which), tmp_path / "r.gguf", mix_name))[1]
            types = mix_types(mix_name, shapes, params)
            got = {name: types[name] or tensors[name][0] for name in types}
            assert got == {name: t for name, (t, _, _) in reference.items()}, (which, mix_name)


@pytest.fixture(scope="module")
def moe_gguf(tmp_path_factory):
    done = {}

    def get(n_expert):
        if n_expert not in done:
            out = tmp_path_factory.mktemp(f"gguf-moe-{n_expert}") / "moe-f32.gguf"
            done[n_expert] = tiny_models.make_moe_gguf(out, n_expert=n_expert)
        return done[n_expert]

    return get


@pytest.mark.parametrize("n_expert", (4, 8))
@pytest.mark.parametrize("mix_name", MIX_NAMES)
def test_moe_gguf_to_gguf_mix_is_llama_quantize(n_expert, mix_name, llama_cpp_lib, moe_gguf, tmp_path):
    """3-D expert tensors: MXFP4 under MXFP4_MOE (everything else Q8_0), the layer from the
    name for ffn_down, and with 8 experts attn_v/attn_k in Q8_0 and attn_output in Q5_K."""
    reference = llama_quantize(llama_cpp_lib, moe_gguf(n_expert), tmp_path / "reference.gguf", mix_name)
    ours = tmp_path / "ours.gguf"
    aprfast.convert(moe_gguf(n_expert), ours, quantize=mix_name, max_drift=None)
    assert differences(ours, reference) == []
