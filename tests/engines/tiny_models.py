"""Tiny random Hugging Face checkpoints for the engine tests, built with transformers
from fixed seeds: the same bytes on every run.

Each model is a real architecture at toy size (hidden 64, 2 layers, 4 heads, 2 KV
heads: grouped-query attention) with a byte-level BPE tokenizer of 384 tokens trained
here on a fixed text, saved with ``save_pretrained`` exactly as a Hub checkpoint is
(``config.json``, ``generation_config.json``, ``model.safetensors``,
``tokenizer.json``, ``tokenizer_config.json``).  The norm weights are moved off 1.0 so
a norm written in the wrong place or order changes the logits, and the query and key
weights are large enough for peaked attention, so rows in the wrong rotary order do.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

VOCAB = 384
#: Token ids fed to both engines (all below VOCAB, BOS first).
TOKENS = [1, 17, 200, 45, 99, 310, 7, 256, 128, 64, 3, 380]

#: arch -> (config class, model class, config overrides, special tokens (bos, eos), the
#: pre-tokenizer's regex: Llama 3's or Qwen2's, as their tokenizer.json files have).
ARCHS = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}, ("<s>", "</s>"), "llama-bpe"),
    "mistral": ("MistralConfig", "MistralForCausalLM", {"sliding_window": None}, ("<s>", "</s>"), "llama-bpe"),
    # Qwen2: q/k/v biases; tied output (as the small Qwen2 checkpoints are).
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {"tie_word_embeddings": True}, (None, "<|endoftext|>"), "qwen2"),
    # Qwen3: per-head RMS norms on q and k, explicit head_dim.
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 16}, (None, "<|endoftext|>"), "qwen2"),
}


def _corpus(seed: int = 0) -> list:
    rng = random.Random(seed)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9))) for _ in range(300)]
    return [" ".join(rng.choice(words) for _ in range(rng.randint(3, 12))) + rng.choice([".", "!", "?", ","])
            for _ in range(400)]


def make_tokenizer(directory, specials, pre) -> None:
    """A byte-level BPE tokenizer of VOCAB tokens (``tokenizer.json`` and
    ``tokenizer_config.json``), its special tokens first, split by the regex of
    llama.cpp's pre-tokenizer ``pre``."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    from aprfast.convert.hf_arch import PRE_TOKENIZER_REGEX

    bos, eos = specials
    special = [t for t in ("<unk>", bos, eos) if t] if bos else [eos]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRE_TOKENIZER_REGEX[pre]), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=special, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_corpus(), trainer)
    assert tok.get_vocab_size() == VOCAB, tok.get_vocab_size()
    kwargs = {"eos_token": eos}
    if bos:
        kwargs.update(bos_token=bos, unk_token="<unk>")
    PreTrainedTokenizerFast(tokenizer_object=tok, **kwargs).save_pretrained(directory)


def make_model(arch: str, directory, seed: int = 0, sizes=None, **overrides):
    """Save the tiny ``arch`` checkpoint (and its tokenizer) in ``directory``; returns the
    model (eval mode, float32).  ``overrides`` (and ``sizes``, a dict of the same) go
    into its config: e.g. Qwen3's ``head_dim``, or rows of 256 for the K-quant mixes."""
    import torch
    import transformers

    if arch in OTHER_ARCHS:
        return OTHER_ARCHS[arch](directory, seed, **overrides)

    config_cls, model_cls, _, specials, pre = ARCHS[arch]
    make_tokenizer(directory, specials, pre)
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast.from_pretrained(directory)
    params = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                  rms_norm_eps=1e-6, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                  tie_word_embeddings=False)
    params.update(ARCHS[arch][2])
    params.update(overrides)
    params.update(sizes or {})
    config = getattr(transformers, config_cls)(**params)
    torch.manual_seed(seed)
    model = getattr(transformers, model_cls)(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.add_(0.1 * torch.randn_like(param))
            elif name.endswith(".bias"):
                param.normal_(0.0, 0.02)
            elif name.endswith(("q_proj.weight", "k_proj.weight")):
                # peaked attention: a query or key row out of place (the rotary
                # permutation) changes the logits by far more than the tolerance
                param.normal_(0.0, 0.3)
    model.save_pretrained(directory)
    return model


def hf_logits(model, tokens=TOKENS):
    """transformers' logits for ``tokens`` (float32 NumPy, one row per position)."""
    import torch

    with torch.no_grad():
        return model(torch.tensor([tokens])).logits[0].float().numpy()


# --- GPT-2 and BERT (their own configs, tokenizers and tensor layouts) ------------
def make_gpt2_tokenizer(directory) -> None:
    """GPT-2's tokenizer at toy size: byte-level BPE whose pre-tokenizer is a bare
    ``ByteLevel`` (GPT-2's own regex), ``<|endoftext|>`` its only special token (BOS,
    EOS and unknown at once, as in the real one)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=["<|endoftext|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_corpus(), trainer)
    assert tok.get_vocab_size() == VOCAB, tok.get_vocab_size()
    end = "<|endoftext|>"
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=end, eos_token=end, unk_token=end)
    tokenizer.save_pretrained(directory)


def _perturb(model, torch) -> None:
    """Norms off 1.0, biases off 0.0: a norm or bias written in the wrong place shows."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "ln" in name.split(".")[-2].lower() or "layernorm" in name.lower():
                param.add_(0.1 * torch.randn_like(param))
            elif name.endswith(".bias"):
                param.normal_(0.0, 0.02)


def make_gpt2(directory, seed: int = 0, n_positions: int = 256):
    """The tiny GPT-2 (``GPT2LMHeadModel``: Conv1D weights stored transposed, fused
    ``c_attn``, learned positions, tied output).  ``n_ctx`` is in config.json as in the
    Hub's GPT-2 checkpoints (transformers 5 no longer writes it; the reference converter
    reads it), equal to ``n_positions``."""
    import torch
    import transformers
    from transformers import PreTrainedTokenizerFast

    make_gpt2_tokenizer(directory)
    tok = PreTrainedTokenizerFast.from_pretrained(directory)
    config = transformers.GPT2Config(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=n_positions,
                                     n_ctx=n_positions, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    torch.manual_seed(seed)
    model = transformers.GPT2LMHeadModel(config).eval()
    _perturb(model, torch)
    with torch.no_grad():  # peaked attention: q/k columns of c_attn out of place show
        for block in model.transformer.h:
            block.attn.c_attn.weight[:, :128].normal_(0.0, 0.3)
    model.save_pretrained(directory)
    return model


def make_bert_tokenizer(directory) -> int:
    """BERT's tokenizer at toy size: a WordPiece vocabulary (``##`` continuations)
    trained here, saved through transformers' ``BertTokenizer`` (lower case, BERT's
    normalizer and pre-tokenizer, ``[CLS] $A [SEP]``) as a Hub BERT's is.  Returns the
    vocabulary size."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers
    from transformers import BertTokenizer

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trainer = trainers.WordPieceTrainer(vocab_size=VOCAB, show_progress=False,
                                        special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])
    tok.train_from_iterator(_corpus(), trainer)
    BertTokenizer(vocab=tok.get_vocab()).save_pretrained(directory)
    return tok.get_vocab_size()


def make_bert(directory, seed: int = 0):
    """The tiny BERT (``BertModel``: post-norm encoder, learned positions and token
    types, a pooler llama.cpp's converter drops), saved as a sentence-transformers model
    with mean pooling."""
    import torch
    import transformers

    vocab = make_bert_tokenizer(directory)
    config = transformers.BertConfig(vocab_size=vocab, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=128, max_position_embeddings=128, pad_token_id=0)
    torch.manual_seed(seed)
    model = transformers.BertModel(config).eval()
    _perturb(model, torch)
    model.save_pretrained(directory)
    # a sentence-transformers model (as bge / MiniLM are): its Pooling module says mean,
    # which the converters write as bert.pooling_type
    (Path(directory) / "1_Pooling").mkdir()
    (Path(directory) / "1_Pooling" / "config.json").write_text(json.dumps(
        {"word_embedding_dimension": 64, "pooling_mode_cls_token": False, "pooling_mode_mean_tokens": True}))
    (Path(directory) / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]))
    return model


OTHER_ARCHS = {"gpt2": make_gpt2, "bert": make_bert}


#: The SentencePiece vocabulary of the Llama 2 style checkpoints (256 byte pieces,
#: <unk>/<s>/</s> and the merges trained on the corpus).
SP_VOCAB = 512


def make_sentencepiece_tokenizer(directory, kind: str = "model") -> None:
    """A Llama 2 style SentencePiece BPE tokenizer with byte fallback, trained here on
    the fixed corpus: ``tokenizer.model`` beside the ``tokenizer.json`` and
    ``tokenizer_config.json`` transformers writes from it (``kind="model"``, as Llama 2
    and Mistral checkpoints ship), or only those two (``kind="json"``: the
    LlamaTokenizerFast kind)."""
    import os
    from pathlib import Path

    import sentencepiece as spm
    from transformers import AutoTokenizer

    directory = Path(directory)
    corpus = directory / "corpus.txt"
    corpus.write_text("\n".join(_corpus()), encoding="utf-8")
    spm.SentencePieceTrainer.train(input=str(corpus), model_prefix=str(directory / "sp"), vocab_size=SP_VOCAB,
                                   model_type="bpe", byte_fallback=True, unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
                                   character_coverage=1.0, num_threads=1, minloglevel=2,
                                   # Llama 2's normalizer: text kept as it is, spaces included
                                   normalization_rule_name="identity", remove_extra_whitespaces=False)
    os.replace(directory / "sp.model", directory / "tokenizer.model")
    for name in ("sp.vocab", "corpus.txt"):
        os.remove(directory / name)
    (directory / "tokenizer_config.json").write_text(
        '{"tokenizer_class": "LlamaTokenizer", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}')
    tok = AutoTokenizer.from_pretrained(directory)
    tok.save_pretrained(directory)
    if kind == "json":
        os.remove(directory / "tokenizer.model")


def make_sentencepiece_model(directory, kind: str = "model", seed: int = 0, **overrides):
    """A tiny LlamaForCausalLM over :func:`make_sentencepiece_tokenizer`'s vocabulary;
    ``overrides`` go into its LlamaConfig.  Returns the model (eval mode, float32)."""
    import torch
    import transformers

    make_sentencepiece_tokenizer(directory, kind)
    params = dict(vocab_size=SP_VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-6,
                  bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)
    params.update(overrides)
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**params)).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.add_(0.1 * torch.randn_like(param))
            elif name.endswith(("q_proj.weight", "k_proj.weight")):
                param.normal_(0.0, 0.3)
    model.save_pretrained(directory)
    return model


def make_moe_gguf(path, n_expert: int = 4, seed: int = 0, n_layer: int = 2, hidden: int = 256, n_ff: int = 256):
    """A tiny Mixtral-style MoE GGUF (llama.cpp's ``llama`` architecture with
    ``expert_count``) in F32, written with gguf-py: per layer a router
    (``ffn_gate_inp``, kept unquantized by llama-quantize) and 3-D expert tensors
    ``ffn_{gate,up,down}_exps`` of ``n_expert`` matrices each, the rest as a dense
    LLaMA's.  aprfast converts no Hugging Face MoE model, so the MoE mixes
    (MXFP4_MOE, the 8-expert rules) are compared from this file: only its keys and
    shapes matter to llama-quantize, which reads the hyper-parameters, not the vocabulary."""
    import gguf
    import numpy as np

    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(n_layer)
    writer.add_context_length(256)
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(4)
    writer.add_head_count_kv(2)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(hidden // 4)
    writer.add_expert_count(n_expert)
    writer.add_expert_used_count(2)
    writer.add_file_type(0)

    def weight(*shape):
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    writer.add_tensor("token_embd.weight", weight(VOCAB, hidden))
    writer.add_tensor("output_norm.weight", np.ones(hidden, np.float32))
    writer.add_tensor("output.weight", weight(VOCAB, hidden))
    kv = hidden // 2
    for i in range(n_layer):
        for name, shape in (("attn_norm", (hidden,)), ("attn_q", (hidden, hidden)), ("attn_k", (kv, hidden)),
                            ("attn_v", (kv, hidden)), ("attn_output", (hidden, hidden)), ("ffn_norm", (hidden,)),
                            ("ffn_gate_inp", (n_expert, hidden)), ("ffn_gate_exps", (n_expert, n_ff, hidden)),
                            ("ffn_up_exps", (n_expert, n_ff, hidden)), ("ffn_down_exps", (n_expert, hidden, n_ff))):
            data = np.ones(shape, np.float32) if len(shape) == 1 else weight(*shape)
            writer.add_tensor(f"blk.{i}.{name}.weight", data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
