"""LLaMA-family models (LLaMA with grouped-query attention, Mistral, Qwen2 with
attention biases and a tied output, Qwen3 with Q/K norms) converted by aprfast run in
llama.cpp and transformers with the same logits (issue 26).

Hugging Face -> GGUF: the GGUF is the one llama.cpp's convert_hf_to_gguf.py writes
(every tensor byte and every defining key), and llama.cpp's logits match
transformers'.  GGUF -> Hugging Face: transformers loads the directory with nothing
missing or unexpected, the weights are the original's bit for bit, and so are the
logits; the same from the reference converter's GGUF.
"""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import tiny_models
from gguf_compare import apr_names, differences, same_files
from gguf_compare import read as read_gguf

import aprfast
from aprfast.convert.hf_arch import ModelConversionWarning

pytestmark = pytest.mark.slow("llama.cpp and transformers engines")

ARCHS = list(tiny_models.ARCHS)
#: issue 26: llama.cpp (F32 KV cache) against transformers, and HF -> GGUF -> HF.
LOGIT_TOLERANCE = 1e-4


def _pre(path) -> str:
    return read_gguf(path)[0]["tokenizer.ggml.pre"][1]


@pytest.fixture(scope="module")
def converted(tiny_model, tmp_path_factory):
    """``converted(arch, **options)``: aprfast's GGUF of the tiny ``arch`` model."""
    done = {}

    def get(arch, quantize=None):
        key = (arch, quantize)
        if key not in done:
            directory, _ = tiny_model(arch)
            out = tmp_path_factory.mktemp(f"gguf-{arch}") / f"{arch}-{quantize or 'f32'}.gguf"
            with warnings.catch_warnings():
                warnings.simplefilter("error", ModelConversionWarning)
                report = aprfast.convert(directory, out, quantize=quantize)
            assert report["names"]["direction"] == "hf-to-gguf"
            done[key] = out
        return done[key]

    return get


def llama_cpp_logits(llama_cpp, path, tokens=tiny_models.TOKENS) -> np.ndarray:
    """llama.cpp's logits for ``tokens``, every position, with an F32 KV cache."""
    f32 = 0  # GGML_TYPE_F32
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=64, n_batch=64, n_threads=2, logits_all=True,
                          type_k=f32, type_v=f32, verbose=True)  # verbose=False leaks /dev/null handles
    try:
        llm.eval(tokens)
        return np.array(llm.scores[:len(tokens)], dtype=np.float32)
    finally:
        llm.close()


@pytest.mark.parametrize("arch", ARCHS)
def test_gguf_is_the_reference_converters(arch, tiny_model, converted, reference_converter, tmp_path):
    ours = converted(arch)
    directory, _ = tiny_model(arch)
    reference = reference_converter(directory, tmp_path / "reference.gguf", "f32", _pre(ours))
    assert differences(ours, reference) == []


@pytest.mark.parametrize("arch", ARCHS)
def test_q8_0_is_the_reference_converters(arch, tiny_model, converted, reference_converter, tmp_path):
    ours = converted(arch, "Q8_0")
    directory, _ = tiny_model(arch)
    reference = reference_converter(directory, tmp_path / "reference-q8_0.gguf", "q8_0", _pre(ours))
    assert differences(ours, reference) == []
    keys, tensors = read_gguf(ours)
    assert keys["general.file_type"] == (["UINT32"], 7)  # MOSTLY_Q8_0


@pytest.mark.parametrize("arch", ARCHS)
def test_llama_cpp_runs_it_with_transformers_logits(arch, tiny_model, converted, llama_cpp_lib):
    _, model = tiny_model(arch)
    expected = tiny_models.hf_logits(model)
    got = llama_cpp_logits(llama_cpp_lib, converted(arch))
    assert got.shape == expected.shape
    assert np.abs(got - expected).max() <= LOGIT_TOLERANCE


def _load(transformers_lib, directory):
    model, info = transformers_lib.AutoModelForCausalLM.from_pretrained(directory, output_loading_info=True)
    return model.eval(), {k: v for k, v in info.items() if v}


@pytest.mark.parametrize("which", ["aprfast", "reference"])
@pytest.mark.parametrize("arch", ARCHS)
def test_gguf_to_hugging_face(arch, which, tiny_model, converted, reference_converter, transformers_lib, tmp_path):
    from safetensors.numpy import load_file

    directory, original = tiny_model(arch)
    gguf_path = converted(arch)
    if which == "reference":
        gguf_path = reference_converter(directory, tmp_path / "reference.gguf", "f32", _pre(gguf_path))
    out = tmp_path / "hf"
    report = aprfast.convert(gguf_path, f"{out}/")  # a directory: model.safetensors and the side files
    assert report["names"]["direction"] == "gguf-to-hf" and report["names"]["unknown"] == []
    model, problems = _load(transformers_lib, out)
    assert problems == {}
    assert np.abs(tiny_models.hf_logits(model) - tiny_models.hf_logits(original)).max() <= LOGIT_TOLERANCE
    before, after = load_file(directory / "model.safetensors"), load_file(out / "model.safetensors")
    assert sorted(before) == sorted(after)
    for name in before:  # bit-identical, Q/K rows back in Hugging Face's order
        assert before[name].dtype == after[name].dtype and before[name].tobytes() == after[name].tobytes(), name
    # the tokenizer comes back: the same ids for a text
    text = "hello world, the model runs 12345 times!"
    tokenizer = transformers_lib.AutoTokenizer.from_pretrained(out)
    assert tokenizer(text)["input_ids"] == transformers_lib.AutoTokenizer.from_pretrained(directory)(text)["input_ids"]
    config = json.loads((out / "config.json").read_text())
    if which == "aprfast":  # the config the GGUF recorded: the same class (Mistral stays Mistral)
        assert config["architectures"] == json.loads((directory / "config.json").read_text())["architectures"]


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_q8_0_gguf_to_hugging_face_dequantizes(arch, converted, transformers_lib, tmp_path):
    out = tmp_path / "hf"
    aprfast.convert(converted(arch, "Q8_0"), f"{out}/")
    model, problems = _load(transformers_lib, out)
    assert problems == {}
    assert all(p.dtype.is_floating_point for p in model.parameters())


@pytest.mark.parametrize("arch", ["llama"])
def test_names_keep_is_a_container_conversion(arch, tiny_model, tmp_path):
    directory, _ = tiny_model(arch)
    out = tmp_path / "kept.gguf"
    report = aprfast.convert(directory, out, names="keep")
    keys, tensors = read_gguf(out)
    assert "general.architecture" not in keys and "model.embed_tokens.weight" in tensors
    assert report["names"] is None


@pytest.mark.parametrize("quantize", [None, "Q8_0"])
@pytest.mark.parametrize("arch", ARCHS)
def test_through_apr_to_gguf(arch, quantize, tiny_model, converted, tmp_path):
    """HF -> .apr -> GGUF is HF -> GGUF, byte for byte: the .apr holds the canonical
    names (seed 001 §10.8) in Hugging Face's row order and records the model's files."""
    directory, _ = tiny_model(arch)
    aprfast.convert(directory, tmp_path / "model.apr")
    assert {"token_embedding", "layers.0.attn.q_proj.weight", "layers.1.mlp.down_proj.weight"} <= \
        apr_names(tmp_path / "model.apr")
    report = aprfast.convert(tmp_path / "model.apr", tmp_path / "model.gguf", quantize=quantize)
    assert report["names"]["direction"] == "hf-to-gguf"
    assert (tmp_path / "model.gguf").read_bytes() == converted(arch, quantize).read_bytes()


@pytest.mark.parametrize("which", ["aprfast", "reference"])
@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_gguf_through_apr(arch, which, tiny_model, converted, reference_converter, transformers_lib, tmp_path):
    """GGUF -> .apr -> GGUF gives the same bytes; GGUF -> .apr -> HF is GGUF -> HF (the
    same files); the .apr holds the canonical names."""
    from safetensors.numpy import load_file

    directory, original = tiny_model(arch)
    gguf_path = converted(arch)
    if which == "reference":
        gguf_path = reference_converter(directory, tmp_path / "reference.gguf", "f32", _pre(gguf_path))
    aprfast.convert(gguf_path, tmp_path / "model.apr")
    assert "layers.0.attn.q_proj.weight" in apr_names(tmp_path / "model.apr")
    aprfast.convert(tmp_path / "model.apr", tmp_path / "back.gguf")
    assert (tmp_path / "back.gguf").read_bytes() == gguf_path.read_bytes()
    aprfast.convert(tmp_path / "model.apr", f"{tmp_path / 'hf'}/")
    aprfast.convert(gguf_path, f"{tmp_path / 'direct'}/")
    same_files(tmp_path / "hf", tmp_path / "direct")
    model, problems = _load(transformers_lib, tmp_path / "hf")
    assert problems == {}
    assert np.abs(tiny_models.hf_logits(model) - tiny_models.hf_logits(original)).max() <= LOGIT_TOLERANCE
    before, after = load_file(directory / "model.safetensors"), load_file(tmp_path / "hf" / "model.safetensors")
    assert all(before[n].tobytes() == after[n].tobytes() for n in before) and sorted(before) == sorted(after)
