"""Llama 3.1's ``llama3`` RoPE scaling as llama.cpp's ``rope_freqs.weight``
(aprfast.convert.hf_arch), without the engines (tests/engines/test_engines_rope.py runs
the model in llama.cpp)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

import aprfast
from aprfast.convert import hf_arch

gguf = pytest.importorskip("gguf")
safetensors_numpy = pytest.importorskip("safetensors.numpy")

LLAMA_31 = (128, 500000.0, 8.0, 1.0, 4.0, 8192)  # dim, theta, factor, low, high, original
LLAMA_32 = (64, 500000.0, 32.0, 1.0, 4.0, 8192)


def _reference(dim, base, factor, low, high, old):
    """convert_hf_to_gguf.py's LlamaModel.generate_extra_tensors, in PyTorch."""
    torch = pytest.importorskip("torch")
    freqs = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    out = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < old / high:
            out.append(1)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return torch.tensor(out, dtype=torch.float32).numpy()


@pytest.mark.parametrize("params", [LLAMA_31, LLAMA_32, (16, 10000.0, 8.0, 1.0, 4.0, 16)])
def test_factors_are_the_reference_converters_bit_for_bit(params):
    assert hf_arch.llama3_rope_factors(*params).tobytes() == _reference(*params).tobytes()


@pytest.mark.parametrize("dim", [32, 64, 128, 256])
@pytest.mark.parametrize("theta", [10000.0, 30000.0, 1000000.0])
def test_factors_are_within_an_ulp_or_two_elsewhere(dim, theta):
    """Only PyTorch's float32 power can differ (aprfast rounds a float64 one)."""
    params = (dim, theta, 16.0, 2.0, 8.0, 128)
    ours, ref = hf_arch.llama3_rope_factors(*params), _reference(*params)
    assert np.abs(ours.view(np.int32) - ref.view(np.int32)).max() <= 4


@pytest.mark.parametrize("bad", [(0, 1e4, 8.0, 1.0, 4.0, 16), (16, -1.0, 8.0, 1.0, 4.0, 16),
                                 (16, 1e4, 8.0, 4.0, 4.0, 16), (16, 1e4, float("nan"), 1.0, 4.0, 16),
                                 (15, 1e4, 8.0, 1.0, 4.0, 16), (16, 1e4, True, 1.0, 4.0, 16)])
def test_parameters_out_of_range_are_corrupt(bad):
    with pytest.raises(aprfast.CorruptError):
        hf_arch.llama3_rope_factors(*bad)


def test_llama_31_scaling_comes_back_from_the_factors():
    dim, theta, factor, low, high, old = LLAMA_31
    kv = {"llama.rope.freq_base": theta, "llama.rope.dimension_count": dim}
    rope = hf_arch.rope_from_factors(hf_arch.ARCHS["llama"], kv, hf_arch.llama3_rope_factors(*LLAMA_31))
    assert rope == {"rope_type": "llama3", "rope_theta": theta, "factor": factor, "low_freq_factor": low,
                    "high_freq_factor": high, "original_max_position_embeddings": old}
    other = hf_arch.llama3_rope_factors(dim, theta, factor, low, high, 4096)
    assert hf_arch.rope_from_factors(hf_arch.ARCHS["llama"], kv, other) is None


def _hf_dir(tmp_path, rope):
    directory = tmp_path / "hf"
    directory.mkdir()
    config = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 8, "hidden_size": 16,
              "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 2,
              "rms_norm_eps": 1e-6, "max_position_embeddings": 64, "rope_parameters": rope}
    (directory / "config.json").write_text(json.dumps(config))
    safetensors_numpy.save_file({"model.embed_tokens.weight": np.ones((8, 16), np.float32)},
                                str(directory / "model.safetensors"))
    return directory


def test_convert_writes_rope_freqs_first_and_takes_it_back_out(tmp_path):
    rope = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 16}
    aprfast.convert(_hf_dir(tmp_path, rope), tmp_path / "m.gguf", quantize="Q8_0")
    reader = gguf.GGUFReader(str(tmp_path / "m.gguf"))
    first = reader.tensors[0]
    assert first.name == "rope_freqs.weight" and first.tensor_type.name == "F32"  # 1-D: never quantized
    assert np.array_equal(np.asarray(first.data), hf_arch.llama3_rope_factors(8, 10000.0, 8.0, 1.0, 4.0, 16))
    report = aprfast.convert(tmp_path / "m.gguf", f"{tmp_path / 'back'}/")
    assert report["names"]["dropped"] == ["rope_freqs.weight"]
    assert json.loads((tmp_path / "back" / "config.json").read_text())["rope_parameters"] == rope
    assert list(safetensors_numpy.load_file(str(tmp_path / "back" / "model.safetensors"))) == \
        ["model.embed_tokens.weight"]
