"""GPT-2 converted by aprfast runs in llama.cpp and transformers (issue 26).

GPT-2 differs from the LLaMA family where a converter can go wrong: its attention and
MLP weights are ``Conv1D``s stored ``[in, out]`` (transposed both ways), ``c_attn`` is
Q, K and V fused (llama.cpp's ``attn_qkv``), positions are a learned table
(``position_embd``, always F32), norms have biases, and the output is tied to the
token embedding (no ``output.weight``: llama.cpp falls back to ``token_embd``).

llama.cpp's CPU GELU goes through an fp16 table, so its logits sit about 1e-4 from
transformers' even for the reference converter's file: the bound against transformers
is 1e-3, against llama.cpp running the reference converter's GGUF 1e-4 (measured: 7.7e-5
and 0.0).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import tiny_models
from gguf_compare import apr_names, differences, same_files
from gguf_compare import read as read_gguf

import aprfast
from aprfast.convert.hf_arch import ModelConversionWarning

#: llama.cpp against transformers (GELU through fp16), and against llama.cpp on the
#: reference converter's GGUF; GGUF -> HF against the original model.
TO_TRANSFORMERS, TO_REFERENCE, ROUND_TRIP = 1e-3, 1e-4, 1e-4


@pytest.fixture(scope="module")
def gpt2(tiny_model):
    return tiny_model("gpt2")


@pytest.fixture(scope="module")
def converted(gpt2, tmp_path_factory):
    done = {}

    def get(quantize=None):
        if quantize not in done:
            out = tmp_path_factory.mktemp("gguf-gpt2") / f"gpt2-{quantize or 'f32'}.gguf"
            with warnings.catch_warnings():
                warnings.simplefilter("error", ModelConversionWarning)
                report = aprfast.convert(gpt2[0], out, quantize=quantize)
            assert report["names"]["direction"] == "hf-to-gguf" and report["names"]["unknown"] == []
            assert len(report["names"]["transposed"]) == 8  # 4 Conv1D weights x 2 layers
            done[quantize] = out
        return done[quantize]

    return get


@pytest.fixture(scope="module")
def reference(gpt2, reference_converter, tmp_path_factory):
    done = {}

    def get(outtype="f32"):
        if outtype not in done:
            out = tmp_path_factory.mktemp("ref-gpt2") / f"reference-{outtype}.gguf"
            done[outtype] = reference_converter(gpt2[0], out, outtype, "gpt-2")
        return done[outtype]

    return get


def llama_cpp_logits(llama_cpp, path, tokens=tiny_models.TOKENS) -> np.ndarray:
    f32 = 0  # GGML_TYPE_F32: an F32 KV cache
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=64, n_batch=64, n_threads=2, logits_all=True,
                          type_k=f32, type_v=f32, verbose=True)  # verbose=False leaks /dev/null handles
    try:
        llm.eval(tokens)
        return np.array(llm.scores[:len(tokens)], dtype=np.float32)
    finally:
        llm.close()


@pytest.mark.parametrize("quantize,outtype", [(None, "f32"), ("Q8_0", "q8_0")])
def test_gguf_is_the_reference_converters(quantize, outtype, converted, reference):
    assert differences(converted(quantize), reference(outtype)) == []
    keys, tensors = read_gguf(converted(quantize))
    assert keys["tokenizer.ggml.pre"][1] == "gpt-2" and "output.weight" not in tensors
    assert tensors["position_embd.weight"][0] == "F32"  # whatever the outtype
    assert keys["general.file_type"][1] == (7 if quantize else 0)


def test_llama_cpp_runs_it_with_transformers_logits(gpt2, converted, reference, llama_cpp_lib):
    expected = tiny_models.hf_logits(gpt2[1])
    got = llama_cpp_logits(llama_cpp_lib, converted())
    assert got.shape == expected.shape
    assert np.abs(got - expected).max() <= TO_TRANSFORMERS
    assert np.abs(got - llama_cpp_logits(llama_cpp_lib, reference())).max() <= TO_REFERENCE


def _load(transformers_lib, directory):
    model, info = transformers_lib.AutoModelForCausalLM.from_pretrained(directory, output_loading_info=True)
    return model.eval(), {k: v for k, v in info.items() if v}


def _check_hugging_face(out, gpt2, transformers_lib, *, exact=True):
    from safetensors.numpy import load_file

    directory, original = gpt2
    model, problems = _load(transformers_lib, out)
    assert problems == {} and type(model).__name__ == "GPT2LMHeadModel"
    got, want = tiny_models.hf_logits(model), tiny_models.hf_logits(original)
    if not exact:
        return np.abs(got - want).max()
    assert np.abs(got - want).max() <= ROUND_TRIP
    before, after = load_file(directory / "model.safetensors"), load_file(out / "model.safetensors")
    assert sorted(before) == sorted(after)
    for name in before:  # bit-identical, Conv1D weights back in [in, out]
        assert before[name].dtype == after[name].dtype and before[name].tobytes() == after[name].tobytes(), name
    text = "hello world, the model runs 12345 times!"
    tokenizer = transformers_lib.AutoTokenizer.from_pretrained(out)
    assert tokenizer(text)["input_ids"] == transformers_lib.AutoTokenizer.from_pretrained(directory)(text)["input_ids"]
    return 0.0


@pytest.mark.parametrize("which", ["aprfast", "reference"])
def test_gguf_to_hugging_face(which, gpt2, converted, reference, transformers_lib, tmp_path):
    gguf_path = converted() if which == "aprfast" else reference()
    report = aprfast.convert(gguf_path, f"{tmp_path / 'hf'}/")
    assert report["names"]["direction"] == "gguf-to-hf" and report["names"]["unknown"] == []
    _check_hugging_face(tmp_path / "hf", gpt2, transformers_lib)


def test_q8_0_gguf_to_hugging_face(gpt2, converted, transformers_lib, tmp_path):
    """Quantized Conv1D weights are dequantized, then transposed."""
    aprfast.convert(converted("Q8_0"), f"{tmp_path / 'hf'}/")
    assert _check_hugging_face(tmp_path / "hf", gpt2, transformers_lib, exact=False) < 0.05


@pytest.mark.parametrize("quantize", [None, "Q8_0"])
def test_through_apr(quantize, gpt2, converted, transformers_lib, tmp_path):
    """HF -> .apr -> GGUF is HF -> GGUF (byte for byte); GGUF -> .apr -> GGUF the same bytes, and
    GGUF -> .apr -> HF is GGUF -> HF."""
    aprfast.convert(gpt2[0], tmp_path / "model.apr")
    assert "layers.0.attn.qkv_proj.weight" in apr_names(tmp_path / "model.apr")  # the canonical names
    aprfast.convert(tmp_path / "model.apr", tmp_path / "model.gguf", quantize=quantize)
    assert (tmp_path / "model.gguf").read_bytes() == converted(quantize).read_bytes()
    if quantize is None:
        aprfast.convert(converted(), tmp_path / "from-gguf.apr")
        assert "layers.0.attn.qkv_proj.weight" in apr_names(tmp_path / "from-gguf.apr")
        aprfast.convert(tmp_path / "from-gguf.apr", tmp_path / "back.gguf")
        assert (tmp_path / "back.gguf").read_bytes() == converted().read_bytes()
        aprfast.convert(tmp_path / "from-gguf.apr", f"{tmp_path / 'hf'}/")
        aprfast.convert(converted(), f"{tmp_path / 'direct'}/")
        same_files(tmp_path / "hf", tmp_path / "direct")
        _check_hugging_face(tmp_path / "hf", gpt2, transformers_lib)
