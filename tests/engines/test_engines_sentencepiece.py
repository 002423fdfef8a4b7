"""Llama 2 / Mistral style checkpoints with a SentencePiece vocabulary (issue 26): the
tokenizer is ``tokenizer.model`` (``kind="model"``) or only the byte-fallback BPE
``tokenizer.json`` transformers writes from it (``kind="json"``, LlamaTokenizerFast).

Hugging Face -> GGUF: the GGUF is the reference converter's (tokens, scores, token
types, special ids, every tensor), llama.cpp splits text into the ids sentencepiece and
transformers give, and its logits are transformers'.  GGUF -> Hugging Face: a
``tokenizer.model`` comes back that transformers loads and that gives the same ids.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import tiny_models
from gguf_compare import differences
from gguf_compare import read as read_gguf
from test_engines_llama import LOGIT_TOLERANCE, llama_cpp_logits

import aprfast
from aprfast.convert.hf_arch import ModelConversionWarning

KINDS = ["model", "json"]
#: Texts both tokenizers must split alike: words, digits, punctuation, runs of inner
#: spaces, a newline and a tab, characters outside the vocabulary (byte fallback).
TEXTS = ["hello world, the model runs 12345 times!", "a  b   c", "line one\nline two\tend",
         "ünïcödé ✓ 日本語 emoji 🙂", "abc", ""]
#: Leading spaces: transformers 5's tokenizer.json from a tokenizer.model (Metaspace,
#: prepend_scheme "first") drops one where sentencepiece itself and llama.cpp keep it,
#: so these are checked against sentencepiece only.
LEADING_SPACES = ["  two leading spaces", " "]
#: Token ids fed to both engines (below SP_VOCAB, BOS first).
TOKENS = [1, 17, 300, 45, 99, 310, 7, 256, 128, 64, 3, 500]


@pytest.fixture(scope="module")
def sp_model(tmp_path_factory, transformers_lib):
    """``sp_model(kind)``: (directory, model, SentencePieceProcessor) of the tiny Llama
    with a SentencePiece vocabulary, built once per module."""
    import sentencepiece

    built = {}

    def get(kind):
        if kind not in built:
            directory = tmp_path_factory.mktemp(f"hf-sp-{kind}")
            model = tiny_models.make_sentencepiece_model(directory, "model")
            processor = sentencepiece.SentencePieceProcessor(model_file=str(directory / "tokenizer.model"))
            if kind == "json":
                (directory / "tokenizer.model").unlink()
            built[kind] = (directory, model, processor)
        return built[kind]

    return get


@pytest.fixture(scope="module")
def sp_gguf(sp_model, tmp_path_factory):
    done = {}

    def get(kind):
        if kind not in done:
            directory, _, _ = sp_model(kind)
            out = tmp_path_factory.mktemp(f"gguf-sp-{kind}") / "model.gguf"
            with warnings.catch_warnings():
                warnings.simplefilter("error", ModelConversionWarning)
                report = aprfast.convert(directory, out)
            assert report["names"]["direction"] == "hf-to-gguf"
            done[kind] = out
        return done[kind]

    return get


@pytest.mark.parametrize("kind", KINDS)
def test_sentencepiece_gguf_is_the_reference_converters(kind, sp_model, sp_gguf, reference_converter, tmp_path):
    directory, _, processor = sp_model(kind)
    ours = sp_gguf(kind)
    assert differences(ours, reference_converter(directory, tmp_path / "reference.gguf", "f32", "default")) == []
    keys, _ = read_gguf(ours)
    assert keys["tokenizer.ggml.model"][1] == "llama" and keys["tokenizer.ggml.pre"][1] == "default"
    tokens, types = keys["tokenizer.ggml.tokens"][1], keys["tokenizer.ggml.token_type"][1]
    assert len(tokens) == tiny_models.SP_VOCAB
    assert tokens[3] == "<0x00>" and types[3] == 6  # byte pieces typed BYTE
    assert keys["tokenizer.ggml.bos_token_id"][1] == 1 and keys["tokenizer.ggml.eos_token_id"][1] == 2
    if kind == "model":  # the pieces and scores of tokenizer.model itself
        assert tokens == [processor.IdToPiece(i) for i in range(processor.vocab_size())]
        assert np.array_equal(np.float32(keys["tokenizer.ggml.scores"][1]),
                              np.float32([processor.GetScore(i) for i in range(processor.vocab_size())]))
        assert keys["tokenizer.ggml.unknown_token_id"][1] == 0


@pytest.mark.parametrize("kind", KINDS)
def test_llama_cpp_tokenizes_as_sentencepiece_and_transformers(kind, sp_model, sp_gguf, llama_cpp_lib,
                                                               transformers_lib):
    directory, _, processor = sp_model(kind)
    tokenizer = transformers_lib.AutoTokenizer.from_pretrained(directory)
    llm = llama_cpp_lib.Llama(model_path=str(sp_gguf(kind)), vocab_only=True, verbose=True)
    try:
        for text in TEXTS:
            ids = llm.tokenize(text.encode("utf-8"), add_bos=False, special=False)
            assert ids == processor.encode(text), text
            assert ids == tokenizer(text, add_special_tokens=False)["input_ids"], text
        for text in LEADING_SPACES:
            assert llm.tokenize(text.encode("utf-8"), add_bos=False, special=False) == processor.encode(text), text
    finally:
        llm.close()


@pytest.mark.parametrize("kind", KINDS)
def test_llama_cpp_runs_it_with_transformers_logits(kind, sp_model, sp_gguf, llama_cpp_lib):
    _, model, _ = sp_model(kind)
    expected = tiny_models.hf_logits(model, TOKENS)
    got = llama_cpp_logits(llama_cpp_lib, sp_gguf(kind), TOKENS)
    assert got.shape == expected.shape
    assert np.abs(got - expected).max() <= LOGIT_TOLERANCE


@pytest.mark.parametrize("via_apr", [False, True])
@pytest.mark.parametrize("kind", KINDS)
def test_sentencepiece_gguf_to_hugging_face(kind, via_apr, sp_model, sp_gguf, transformers_lib, tmp_path):
    """GGUF -> HF (directly or through .apr) gives back a tokenizer.model transformers
    loads, with the original tokenizer's ids, and the model loads with its logits."""
    from safetensors.numpy import load_file

    directory, original, _ = sp_model(kind)
    source = sp_gguf(kind)
    if via_apr:
        aprfast.convert(source, tmp_path / "model.apr")
        source = tmp_path / "model.apr"
    out = tmp_path / "hf"
    aprfast.convert(source, f"{out}/")
    assert (out / "tokenizer.model").is_file()
    model, info = transformers_lib.AutoModelForCausalLM.from_pretrained(out, output_loading_info=True)
    assert {k: v for k, v in info.items() if v} == {}
    assert np.abs(tiny_models.hf_logits(model.eval(), TOKENS) - tiny_models.hf_logits(original, TOKENS)).max() \
        <= LOGIT_TOLERANCE
    before, after = load_file(directory / "model.safetensors"), load_file(out / "model.safetensors")
    assert sorted(before) == sorted(after) and all(before[n].tobytes() == after[n].tobytes() for n in before)
    back = transformers_lib.AutoTokenizer.from_pretrained(out)
    first = transformers_lib.AutoTokenizer.from_pretrained(directory)
    for text in TEXTS:
        assert back(text)["input_ids"] == first(text)["input_ids"], text


def test_sentencepiece_through_apr_to_gguf(sp_model, sp_gguf, tmp_path):
    """HF -> .apr -> GGUF is HF -> GGUF: the .apr records the parsed tokenizer.model."""
    directory, _, _ = sp_model("model")
    aprfast.convert(directory, tmp_path / "model.apr")
    aprfast.convert(tmp_path / "model.apr", tmp_path / "model.gguf")
    assert (tmp_path / "model.gguf").read_bytes() == sp_gguf("model").read_bytes()
