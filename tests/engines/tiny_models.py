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

import random

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


def make_model(arch: str, directory, seed: int = 0, sizes=None):
    """Save the tiny ``arch`` checkpoint (and its tokenizer) in ``directory``; returns the
    model (eval mode, float32).  ``sizes`` overrides config values (hidden_size,
    num_hidden_layers, ...: the K-quant mix tests need rows of 256)."""
    import torch
    import transformers

    config_cls, model_cls, overrides, specials, pre = ARCHS[arch]
    make_tokenizer(directory, specials, pre)
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast.from_pretrained(directory)
    params = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                  rms_norm_eps=1e-6, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                  tie_word_embeddings=False)
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
