"""transformers' own GGUF loader is a second oracle for aprfast's GGUFs (issue 26 item 2).

``AutoModelForCausalLM.from_pretrained(dir, gguf_file=name)`` reads a GGUF with its own
code (gguf-py's reader and dequantizers, its own llama.cpp -> Hugging Face name tables
and Q/K un-permutation, a config built from the ``{arch}.*`` keys) and
``AutoTokenizer.from_pretrained(dir, gguf_file=name)`` builds a tokenizer from the
``tokenizer.ggml.*`` keys.  On aprfast's GGUF of each tiny model both must give the
original model's logits and token ids.

What transformers 5 cannot load, and why (docs/FORMAT.md "Model conversions",
tests/engines/README.md): BERT (``bert`` is not among its GGUF architectures, for the
model or the tokenizer); a Qwen3 whose ``head_dim`` is not 128 (its qwen3 key table
does not read ``qwen3.attention.key_length``, so Qwen3Config's default 128 applies) and a
GPT-2 whose ``n_positions`` is not 1024 (its gpt2 table reads ``gpt2.context_length`` as
``n_ctx`` only, so GPT2Config's default ``n_positions`` 1024 applies): those two are
tested on variants of the tiny models that have the defaults.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import tiny_models

import aprfast
from aprfast.convert.hf_arch import ModelConversionWarning

#: issue 26: F32 logits within 1e-4 (measured 0.0: transformers reads the same floats).
LOGIT_TOLERANCE = 1e-4
#: (name, tiny_models arch, config overrides transformers' GGUF loader needs)
MODELS = {
    "llama": ("llama", {}),
    "mistral": ("mistral", {}),
    "qwen2": ("qwen2", {}),
    "qwen3": ("qwen3", {"head_dim": 128}),  # transformers reads no head_dim for qwen3
    "gpt2": ("gpt2", {"n_positions": 1024}),  # ... nor n_positions for gpt2
    "sentencepiece": ("sentencepiece", {}),  # a Llama with a tokenizer.model
}
TEXTS = ["hello world, the model runs 12345 times!", "a  b   c", "line one\nline two\tend",
         "ünïcödé ✓ 日本語 emoji 🙂", ""]


@pytest.fixture(scope="module")
def model(tmp_path_factory, transformers_gguf):
    """``model(name)``: (checkpoint directory, transformers model) built once."""
    built = {}

    def get(name):
        if name not in built:
            arch, overrides = MODELS[name]
            directory = tmp_path_factory.mktemp(f"tf-gguf-{name}")
            if arch == "sentencepiece":
                built[name] = (directory, tiny_models.make_sentencepiece_model(directory, "model"))
            else:
                built[name] = (directory, tiny_models.make_model(arch, directory, **overrides))
        return built[name]

    return get


@pytest.fixture(scope="module")
def gguf_of(model, tmp_path_factory):
    """``gguf_of(name, quantize)``: aprfast's GGUF of the model, alone in a directory."""
    done = {}

    def get(name, quantize=None):
        key = (name, quantize)
        if key not in done:
            out = tmp_path_factory.mktemp(f"tf-gguf-{name}-{quantize or 'f32'}") / "model.gguf"
            with warnings.catch_warnings():
                warnings.simplefilter("error", ModelConversionWarning)
                report = aprfast.convert(model(name)[0], out, quantize=quantize)
            assert report["names"]["direction"] == "hf-to-gguf"
            done[key] = out
        return done[key]

    return get


def _load_gguf(transformers_lib, path):
    loaded, info = transformers_lib.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                                                         output_loading_info=True)
    return loaded.eval(), {k: v for k, v in info.items() if v}


@pytest.mark.parametrize("name", list(MODELS))
def test_transformers_loads_the_gguf_with_the_original_logits(name, model, gguf_of, transformers_gguf):
    directory, original = model(name)
    loaded, problems = _load_gguf(transformers_gguf, gguf_of(name))
    assert problems == {}
    # Mistral comes back as LlamaForCausalLM (transformers says mistral only for a GGUF
    # whose general.name is exactly "mistral"): the same computation without a window
    assert type(loaded).__name__ in (type(original).__name__, "LlamaForCausalLM")
    tokens = tiny_models.TOKENS if name != "sentencepiece" else [1, 17, 300, 45, 99, 310, 7, 256, 128, 64, 3, 500]
    got, want = tiny_models.hf_logits(loaded, tokens), tiny_models.hf_logits(original, tokens)
    assert got.shape == want.shape
    assert np.abs(got - want).max() <= LOGIT_TOLERANCE


@pytest.mark.parametrize("name", ["llama", "qwen3", "gpt2"])
def test_transformers_dequantizes_q8_0_as_aprfast_does(name, gguf_of, transformers_gguf, tmp_path):
    """Q8_0: transformers' dequantized model and aprfast's GGUF -> HF of the same file
    (GGML blocks to F32) give the same logits."""
    path = gguf_of(name, "Q8_0")
    loaded, problems = _load_gguf(transformers_gguf, path)
    assert problems == {}
    aprfast.convert(path, f"{tmp_path / 'hf'}/")
    ours = transformers_gguf.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    assert np.abs(tiny_models.hf_logits(loaded) - tiny_models.hf_logits(ours)).max() <= LOGIT_TOLERANCE


@pytest.mark.parametrize("name", list(MODELS))
def test_transformers_tokenizer_from_the_gguf(name, model, gguf_of, transformers_gguf):
    """The tokenizer transformers builds from the GGUF's keys splits text as the
    original does.  SentencePiece: compared without special tokens, since the GGUF (as
    the reference converter's) states no add_bos_token and transformers' GGUF tokenizer
    then adds BOS, as llama.cpp does, where transformers 5's tokenizer saved from the
    tokenizer.model does not."""
    directory, _ = model(name)
    path = gguf_of(name)
    from_gguf = transformers_gguf.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    first = transformers_gguf.AutoTokenizer.from_pretrained(directory)
    special = name != "sentencepiece"
    for text in TEXTS:
        assert from_gguf(text, add_special_tokens=special)["input_ids"] == \
            first(text, add_special_tokens=special)["input_ids"], text
