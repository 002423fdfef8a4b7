"""BERT converted by aprfast is llama.cpp's embedding model and comes back to
transformers (issue 26).

The tiny BERT is a sentence-transformers model (``modules.json`` with mean pooling, as
bge and MiniLM are), so both converters write ``bert.pooling_type`` = MEAN; its
WordPiece vocabulary becomes llama.cpp's WPM vocabulary (tokens in "phantom space"
form), which must tokenize a text into the ids transformers gives.  llama.cpp's
embeddings are compared with transformers' ``last_hidden_state``: per token (pooling
NONE), its CLS row (pooling CLS) and its mean (the file's own pooling).  BERT's GELU is
the erf one; llama.cpp computes the tanh approximation through an fp16 table, hence a
bound of 1e-3 against transformers (measured 3.1e-5 per token, 4.3e-6 pooled) and 1e-4
against llama.cpp running the reference converter's GGUF (measured 0.0).  The pooler
(``pooler.dense``) is dropped by both converters: it cannot come back from a GGUF, so
GGUF -> HF reports exactly it missing, and transformers' hidden states are compared.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from gguf_compare import apr_names, differences, same_files
from gguf_compare import read as read_gguf

import aprfast
from aprfast.convert.hf_arch import ModelConversionWarning

TO_TRANSFORMERS, TO_REFERENCE, ROUND_TRIP = 1e-3, 1e-4, 1e-4
TEXTS = ("Hello world, the model runs 12345 times!", "Café au lait? ÜBER naïve #tags & [brackets]")
#: what a BERT GGUF cannot hold (the reference converter drops it too)
POOLER = {"pooler.dense.weight", "pooler.dense.bias"}


@pytest.fixture(scope="module")
def bert(tiny_model):
    return tiny_model("bert")


@pytest.fixture(scope="module")
def converted(bert, tmp_path_factory):
    done = {}

    def get(quantize=None):
        if quantize not in done:
            out = tmp_path_factory.mktemp("gguf-bert") / f"bert-{quantize or 'f32'}.gguf"
            with warnings.catch_warnings():
                warnings.simplefilter("error", ModelConversionWarning)
                report = aprfast.convert(bert[0], out, quantize=quantize)
            assert report["names"]["direction"] == "hf-to-gguf" and report["names"]["unknown"] == []
            assert set(report["names"]["dropped"]) == POOLER
            done[quantize] = out
        return done[quantize]

    return get


@pytest.fixture(scope="module")
def reference(bert, reference_converter, tmp_path_factory):
    done = {}

    def get(outtype="f32"):
        if outtype not in done:
            out = tmp_path_factory.mktemp("ref-bert") / f"reference-{outtype}.gguf"
            done[outtype] = reference_converter(bert[0], out, outtype, "bert-bge")
        return done[outtype]

    return get


def hf_hidden(model, tokenizer, text):
    """(token ids, transformers' last hidden state) for ``text``."""
    import torch

    ids = tokenizer(text)["input_ids"]
    with torch.no_grad():
        return ids, model(torch.tensor([ids])).last_hidden_state[0].float().numpy()


def llama_cpp_embed(llama_cpp, path, text, pooling):
    """(llama.cpp's token ids, its embeddings) for ``text`` with ``pooling`` (a
    LLAMA_POOLING_TYPE_*; UNSPECIFIED: the file's own)."""
    llm = llama_cpp.Llama(model_path=str(path), embedding=True, n_ctx=128, n_batch=128, n_threads=2,
                          pooling_type=pooling, verbose=True)  # verbose=False leaks /dev/null handles
    try:
        return llm.tokenize(text.encode("utf-8")), np.array(llm.embed(text), dtype=np.float32)
    finally:
        llm.close()


@pytest.mark.parametrize("quantize,outtype", [(None, "f32"), ("Q8_0", "q8_0")])
def test_gguf_is_the_reference_converters(quantize, outtype, converted, reference):
    assert differences(converted(quantize), reference(outtype)) == []
    keys, tensors = read_gguf(converted(quantize))
    assert keys["tokenizer.ggml.model"][1] == "bert" and keys["bert.pooling_type"] == (["UINT32"], 1)
    assert keys["bert.attention.causal"] == (["BOOL"], False)
    assert tensors["token_types.weight"][0] == "F32" and tensors["position_embd.weight"][0] == "F32"


@pytest.mark.parametrize("text", TEXTS)
def test_llama_cpp_embeds_it_with_transformers_hidden_states(text, bert, converted, reference, transformers_lib,
                                                             llama_cpp_lib):
    directory, model = bert
    ids, hidden = hf_hidden(model, transformers_lib.AutoTokenizer.from_pretrained(directory), text)
    lib = llama_cpp_lib
    for pooling, want in ((lib.LLAMA_POOLING_TYPE_NONE, hidden), (lib.LLAMA_POOLING_TYPE_CLS, hidden[0]),
                          (lib.LLAMA_POOLING_TYPE_UNSPECIFIED, hidden.mean(axis=0))):  # the file's: MEAN
        got_ids, got = llama_cpp_embed(lib, converted(), text, pooling)
        assert got_ids == ids  # llama.cpp's WPM tokenizer on our vocabulary: transformers' ids
        assert got.shape == want.shape
        assert np.abs(got - want).max() <= TO_TRANSFORMERS
        _, theirs = llama_cpp_embed(lib, reference(), text, pooling)
        assert np.abs(got - theirs).max() <= TO_REFERENCE


def _check_hugging_face(out, bert, transformers_lib, *, exact=True):
    from safetensors.numpy import load_file

    directory, original = bert
    model, info = transformers_lib.AutoModel.from_pretrained(out, output_loading_info=True)
    problems = {k: set(v) for k, v in info.items() if v}
    assert problems == {"missing_keys": POOLER} and type(model).__name__ == "BertModel"
    tokenizer, reference_tokenizer = (transformers_lib.AutoTokenizer.from_pretrained(d) for d in (out, directory))
    worst = 0.0
    for text in TEXTS:
        ids, want = hf_hidden(original, reference_tokenizer, text)
        got_ids, got = hf_hidden(model.eval(), tokenizer, text)
        assert got_ids == ids
        worst = max(worst, float(np.abs(got - want).max()))
    if exact:
        assert worst <= ROUND_TRIP
        before, after = load_file(directory / "model.safetensors"), load_file(out / "model.safetensors")
        assert set(before) - set(after) == POOLER and set(after) <= set(before)
        for name in after:
            assert before[name].tobytes() == after[name].tobytes(), name
    return worst


@pytest.mark.parametrize("which", ["aprfast", "reference"])
def test_gguf_to_hugging_face(which, bert, converted, reference, transformers_lib, tmp_path):
    gguf_path = converted() if which == "aprfast" else reference()
    report = aprfast.convert(gguf_path, f"{tmp_path / 'hf'}/")
    assert report["names"]["direction"] == "gguf-to-hf" and report["names"]["unknown"] == []
    _check_hugging_face(tmp_path / "hf", bert, transformers_lib)


def test_q8_0_gguf_to_hugging_face(bert, converted, transformers_lib, tmp_path):
    aprfast.convert(converted("Q8_0"), f"{tmp_path / 'hf'}/")
    assert _check_hugging_face(tmp_path / "hf", bert, transformers_lib, exact=False) < 0.05


@pytest.mark.parametrize("quantize", [None, "Q8_0"])
def test_through_apr(quantize, bert, converted, transformers_lib, tmp_path):
    """HF -> .apr -> GGUF is HF -> GGUF (the pooling module recorded too); GGUF -> .apr
    -> GGUF the same bytes, and GGUF -> .apr -> HF is GGUF -> HF."""
    aprfast.convert(bert[0], tmp_path / "model.apr")
    assert "token_type_embedding" in apr_names(tmp_path / "model.apr")  # the canonical names
    aprfast.convert(tmp_path / "model.apr", tmp_path / "model.gguf", quantize=quantize)
    assert (tmp_path / "model.gguf").read_bytes() == converted(quantize).read_bytes()
    if quantize is None:
        aprfast.convert(converted(), tmp_path / "from-gguf.apr")
        assert "token_type_embedding" in apr_names(tmp_path / "from-gguf.apr")
        aprfast.convert(tmp_path / "from-gguf.apr", tmp_path / "back.gguf")
        assert (tmp_path / "back.gguf").read_bytes() == converted().read_bytes()
        aprfast.convert(tmp_path / "from-gguf.apr", f"{tmp_path / 'hf'}/")
        aprfast.convert(converted(), f"{tmp_path / 'direct'}/")
        same_files(tmp_path / "hf", tmp_path / "direct")
        _check_hugging_face(tmp_path / "hf", bert, transformers_lib)
