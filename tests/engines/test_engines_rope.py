"""Llama 3.1's ``llama3`` RoPE scaling (issue 26): llama.cpp is told about it by a
``rope_freqs.weight`` tensor (one factor per rotary frequency) that the reference
converter computes from config.json; aprfast writes the same tensor.

The tiny model's ``original_max_position_embeddings`` is 16, so most of its frequencies
are scaled and every position past the first rotates differently from an unscaled
model: llama.cpp's logits match transformers' only when the tensor is right.
"""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import tiny_models
from gguf_compare import differences
from gguf_compare import read as read_gguf
from test_engines_llama import LOGIT_TOLERANCE, llama_cpp_logits

import aprfast
from aprfast.convert.hf_arch import ModelConversionWarning

ROPE = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 16}
#: 48 positions (llama.cpp runs them with n_ctx 64), BOS first.
TOKENS = [1] + [(i * 37 + 11) % 383 + 1 for i in range(47)]


def _model(directory, rope):
    import torch
    import transformers

    tiny_models.make_tokenizer(directory, ("<s>", "</s>"), "llama-bpe")
    config = transformers.LlamaConfig(vocab_size=tiny_models.VOCAB, hidden_size=64, intermediate_size=128,
                                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                      max_position_embeddings=256, rms_norm_eps=1e-6, bos_token_id=1,
                                      eos_token_id=2, tie_word_embeddings=False, rope_parameters=rope)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(("q_proj.weight", "k_proj.weight")):
                param.normal_(0.0, 0.3)
    model.save_pretrained(directory)
    return model


@pytest.fixture(scope="module")
def llama3(tmp_path_factory, transformers_lib):
    """(directory, model, aprfast's GGUF) of the tiny Llama with llama3 RoPE scaling."""
    directory = tmp_path_factory.mktemp("hf-llama3-rope")
    model = _model(directory, ROPE)
    out = tmp_path_factory.mktemp("gguf-llama3-rope") / "model.gguf"
    with warnings.catch_warnings():
        warnings.simplefilter("error", ModelConversionWarning)  # llama3 is converted, not warned about
        aprfast.convert(directory, out)
    return directory, model, out


def test_rope_freqs_is_the_reference_converters(llama3, reference_converter, tmp_path):
    directory, _, ours = llama3
    reference = reference_converter(directory, tmp_path / "reference.gguf", "f32", "llama-bpe")
    assert differences(ours, reference) == []
    kind, shape, data = read_gguf(ours)[1]["rope_freqs.weight"]
    assert (kind, shape) == ("F32", [8])  # head_dim / 2
    factors = np.frombuffer(data, np.float32)
    assert factors[0] > 1 and np.all(factors[1:] == 8.0)  # one blended frequency, the rest scaled fully


def test_llama_cpp_runs_it_with_transformers_logits(llama3, llama_cpp_lib, tmp_path):
    _, model, ours = llama3
    expected = tiny_models.hf_logits(model, TOKENS)
    got = llama_cpp_logits(llama_cpp_lib, ours, TOKENS)
    assert np.abs(got - expected).max() <= LOGIT_TOLERANCE
    # the scaling matters at these positions: the same weights without it are far off
    unscaled = _model(tmp_path / "unscaled", {"rope_type": "default", "rope_theta": 10000.0})
    assert np.abs(tiny_models.hf_logits(unscaled, TOKENS) - expected).max() > 100 * LOGIT_TOLERANCE


def test_gguf_to_hugging_face_gives_the_rope_scaling_back(llama3, transformers_lib, tmp_path):
    from safetensors.numpy import load_file

    directory, original, ours = llama3
    report = aprfast.convert(ours, f"{tmp_path / 'hf'}/")
    assert report["names"]["dropped"] == ["rope_freqs.weight"]
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["rope_parameters"] == json.loads((directory / "config.json").read_text())["rope_parameters"]
    model = transformers_lib.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    assert np.abs(tiny_models.hf_logits(model, TOKENS) - tiny_models.hf_logits(original, TOKENS)).max() \
        <= LOGIT_TOLERANCE
    assert sorted(load_file(tmp_path / "hf" / "model.safetensors")) == \
        sorted(load_file(directory / "model.safetensors"))


def test_reference_gguf_without_a_recorded_config_warns(llama3, reference_converter, tmp_path):
    """The reference's GGUF records no config.json, and these parameters are not Llama
    3.1's: the scaling cannot be recovered from the factors, and aprfast says so."""
    directory, _, _ = llama3
    reference = reference_converter(directory, tmp_path / "reference.gguf", "f32", "llama-bpe")
    with pytest.warns(ModelConversionWarning, match="rope_freqs"):
        aprfast.convert(reference, f"{tmp_path / 'hf'}/")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["rope_parameters"]["rope_type"] == "default"
