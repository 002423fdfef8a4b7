"""Model architectures between Hugging Face checkpoints and llama.cpp's GGUF.

A container conversion keeps names, rows and keys; a *model* conversion gives what the
destination's engine loads.  For each architecture here this module holds what
llama.cpp's ``convert_hf_to_gguf.py`` does to a Hugging Face checkpoint, and its
inverse: the tensor names both ways, the rows of ``attn_q``/``attn_k`` llama.cpp's
rotary embedding expects (LLaMA's interleaved pairs; Hugging Face stores the two
halves), the hyper-parameters from ``config.json`` as typed GGUF keys, the
``tokenizer.ggml.*`` keys from ``tokenizer.json``/``tokenizer_config.json``, and back
again a ``config.json``, ``generation_config.json`` and a tokenizer transformers loads.

The tables are data (:data:`ARCHS`, :data:`TENSORS`); docs/FORMAT.md ("Model
conversions") prints them with the decisions.  Everything read from a model directory
is untrusted: JSON files are bounded in size (``tokenizer.MAX_TOKENIZER_BYTES``) and
every value used is type-checked before it goes into a key.
"""

from __future__ import annotations

import json
import os
import re
import warnings
from dataclasses import dataclass

import numpy as np

from .. import dtypes as _dtypes
from ..errors import CorruptError, LayoutError
from ..io.atomic import AtomicFile
from ..numerics.quantization import dequantize as _dequantize
from ..tensors import RawTensor
from . import names as _names
from . import spm as _spm
from ._common import DestinationExistsError, Spec
from .gguf import TYPES_KEY, gguf_metadata
from .safetensors import _write_all
from .tokenizer import _read_json

__all__ = ["ARCHS", "TENSORS", "HFArch", "ModelConversionWarning", "arch_for_config", "arch_for_gguf",
           "read_model_dir", "hf_to_gguf_name", "gguf_to_hf_name", "rope_rows", "permute_rows", "gguf_keys",
           "gguf_tensor_dtype", "file_type", "hf_files", "PRE_TOKENIZER_REGEX", "HF_CONFIG_KEY", "llama_cpp_names",
           "CANONICAL_KEY", "GPT2_CANONICAL", "canonical_name", "transpose_value", "restore_source_names"]


class ModelConversionWarning(UserWarning):
    """A model conversion that llama.cpp or transformers may not run as the source does:
    an architecture with no table (names kept), or a detail not converted (a RoPE
    scaling llama.cpp is not told about, a tokenizer kind not carried over)."""


@dataclass(frozen=True)
class HFArch:
    """One architecture: ``model_type`` (config.json), ``gguf`` (general.architecture),
    ``hf_class`` (config.json's ``architectures``), ``pre`` (tokenizer.ggml.pre when
    the pre-tokenizer is not recognised), ``permute`` (attn_q/attn_k rows permuted for
    llama.cpp's rotary embedding), ``llama_keys`` (also ``vocab_size`` and
    ``rope.dimension_count``, which the reference converter writes for its LLaMA class
    only), ``family`` (the tensor table, keys and config.json that apply)."""

    model_type: str
    gguf: str
    hf_class: str
    pre: str
    permute: bool
    llama_keys: bool
    #: which tensor table, keys and config.json apply: "llama" (the LLaMA family:
    #: :data:`TENSORS`), "gpt2" or "bert" (:data:`FAMILY_TENSORS`)
    family: str = "llama"


#: config.json ``model_type`` -> architecture.  Mistral is llama.cpp's ``llama``.
ARCHS = {
    "llama": HFArch("llama", "llama", "LlamaForCausalLM", "llama-bpe", True, True),
    "mistral": HFArch("mistral", "llama", "MistralForCausalLM", "llama-bpe", True, True),
    "qwen2": HFArch("qwen2", "qwen2", "Qwen2ForCausalLM", "qwen2", False, False),
    "qwen3": HFArch("qwen3", "qwen3", "Qwen3ForCausalLM", "qwen2", False, False),
}
#: GGUF general.architecture -> the architecture its config.json gets back.
_BY_GGUF = {"llama": ARCHS["llama"], "qwen2": ARCHS["qwen2"], "qwen3": ARCHS["qwen3"]}

#: (Hugging Face pattern, GGUF pattern or None: dropped), ``{n}`` a layer, ``{w}``
#: weight or bias.  One table for the LLaMA family (a tensor a model lacks is simply
#: not there: Qwen2's biases, Qwen3's q/k norms, a tied model's output).
TENSORS = (
    ("model.embed_tokens.weight", "token_embd.weight"),
    ("model.norm.weight", "output_norm.weight"),
    ("lm_head.weight", "output.weight"),
    ("model.layers.{n}.input_layernorm.weight", "blk.{n}.attn_norm.weight"),
    ("model.layers.{n}.post_attention_layernorm.weight", "blk.{n}.ffn_norm.weight"),
    ("model.layers.{n}.self_attn.q_proj.{w}", "blk.{n}.attn_q.{w}"),
    ("model.layers.{n}.self_attn.k_proj.{w}", "blk.{n}.attn_k.{w}"),
    ("model.layers.{n}.self_attn.v_proj.{w}", "blk.{n}.attn_v.{w}"),
    ("model.layers.{n}.self_attn.o_proj.{w}", "blk.{n}.attn_output.{w}"),
    ("model.layers.{n}.self_attn.q_norm.weight", "blk.{n}.attn_q_norm.weight"),
    ("model.layers.{n}.self_attn.k_norm.weight", "blk.{n}.attn_k_norm.weight"),
    ("model.layers.{n}.mlp.gate_proj.weight", "blk.{n}.ffn_gate.weight"),
    ("model.layers.{n}.mlp.up_proj.weight", "blk.{n}.ffn_up.weight"),
    ("model.layers.{n}.mlp.down_proj.weight", "blk.{n}.ffn_down.weight"),
    # buffers older checkpoints saved: recomputed by both engines
    ("model.layers.{n}.self_attn.rotary_emb.inv_freq", None),
)

#: Tensors the reference converter generates from config.json (no Hugging Face tensor
#: has them): dropped on the way back, their meaning returned to config.json.
GGUF_ONLY = ("rope_freqs.weight",)

#: The pre-tokenizer regexes of the tokenizer.json files llama.cpp names (its
#: tokenizer.ggml.pre), as Hugging Face writes them.
PRE_TOKENIZER_REGEX = {
    "llama-bpe": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+",
    "qwen2": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
             r"|\s*[\r\n]+|\s+(?!\S)|\s+",
}
#: GGUF key holding the source's config.json (JSON text), so GGUF -> Hugging Face gives
#: back the same config (Mistral stays Mistral, every field kept).
HF_CONFIG_KEY = "aprfast.hf.config"

_PLACEHOLDERS = {"{n}": r"(?P<n>\d+)", "{w}": r"(?P<w>weight|bias)", "{x}": r"(?P<x>.+)"}
#: A leading ``[prefix.]`` of a Hugging Face pattern: the task models' wrapper
#: (``bert.`` of BertForMaskedLM), optional when reading, not written back (the base model).
_OPTIONAL = re.compile(r"^\[([^\]]*)\]")


def _regex(pattern: str):
    optional = _OPTIONAL.match(pattern)
    head = f"(?:{re.escape(optional.group(1))})?" if optional else ""
    parts = re.split(r"(\{[nwx]\})", pattern[optional.end():] if optional else pattern)
    return re.compile("^" + head + "".join(_PLACEHOLDERS.get(p, re.escape(p)) for p in parts) + "$")


def _rules(table):
    """(HF -> GGUF, GGUF -> HF) rules of a tensor table: the first matching row wins."""
    to_gguf = [(_regex(hf), gguf) for hf, gguf in table]
    to_hf = [(_regex(gguf), _OPTIONAL.sub("", hf)) for hf, gguf in table if gguf is not None and "{x}" not in hf]
    return to_gguf, to_hf


_HF_TO_GGUF, _GGUF_TO_HF = _rules(TENSORS)
_UNKNOWN = object()


def _apply(rules, name):
    for regex, target in rules:
        m = regex.match(name)
        if m is not None:
            return None if target is None else target.format(**m.groupdict())
    return _UNKNOWN


def hf_to_gguf_name(name: str, family: str = "llama"):
    """llama.cpp's name for a Hugging Face tensor name of an architecture ``family``
    (:attr:`HFArch.family`): a str, None (dropped) or ``...`` (no rule knows it)."""
    rules = _HF_TO_GGUF if family == "llama" else _FAMILY_RULES[family][0]
    out = _apply(rules, name)
    return ... if out is _UNKNOWN else out


def gguf_to_hf_name(name: str, family: str = "llama"):
    """Hugging Face's name for a llama.cpp tensor name of an architecture ``family``,
    None for one llama.cpp alone has (:data:`GGUF_ONLY`: dropped), or ``...`` (no rule
    knows it)."""
    if name in GGUF_ONLY:
        return None
    rules = _GGUF_TO_HF if family == "llama" else _FAMILY_RULES[family][1]
    out = _apply(rules, name)
    return ... if out is _UNKNOWN else out


# --- GPT-2 and BERT: their own tables --------------------------------------------
#: GPT-2 (``GPT2LMHeadModel``; llama.cpp ``gpt2``).  Its attention and MLP weights are
#: ``Conv1D``s stored ``[in, out]``, the transpose of a Linear's: they are transposed
#: both ways (:data:`CONV1D`).  The output is tied to ``wte`` (no ``lm_head``/``output``).
GPT2_TENSORS = (
    ("transformer.wte.weight", "token_embd.weight"),
    ("transformer.wpe.weight", "position_embd.weight"),
    ("transformer.ln_f.{w}", "output_norm.{w}"),
    ("lm_head.weight", "output.weight"),
    ("transformer.h.{n}.ln_1.{w}", "blk.{n}.attn_norm.{w}"),
    ("transformer.h.{n}.attn.c_attn.{w}", "blk.{n}.attn_qkv.{w}"),
    ("transformer.h.{n}.attn.c_proj.{w}", "blk.{n}.attn_output.{w}"),
    ("transformer.h.{n}.ln_2.{w}", "blk.{n}.ffn_norm.{w}"),
    ("transformer.h.{n}.mlp.c_fc.{w}", "blk.{n}.ffn_up.{w}"),
    ("transformer.h.{n}.mlp.c_proj.{w}", "blk.{n}.ffn_down.{w}"),
    # the causal-mask buffers older checkpoints saved: both engines build the mask
    ("transformer.h.{n}.attn.bias", None),
    ("transformer.h.{n}.attn.masked_bias", None),
)
#: GPT-2's Conv1D weights (Hugging Face names): stored transposed relative to llama.cpp.
CONV1D = re.compile(r"^transformer\.h\.\d+\.(?:attn\.c_attn|attn\.c_proj|mlp\.c_fc|mlp\.c_proj)\.weight$")

#: BERT (``BertModel``; llama.cpp's embedding model ``bert``).  ``[bert.]``: the task
#: models' wrapper (BertForMaskedLM, ...), read and not written back (a BertModel).  The
#: pooler and the task heads are dropped, as the reference converter drops them
#: (llama.cpp pools by ``bert.pooling_type`` instead).  TF-era ``LayerNorm.gamma``/
#: ``.beta`` map as ``.weight``/``.bias``.
BERT_TENSORS = (
    ("[bert.]embeddings.word_embeddings.weight", "token_embd.weight"),
    ("[bert.]embeddings.position_embeddings.weight", "position_embd.weight"),
    ("[bert.]embeddings.token_type_embeddings.weight", "token_types.weight"),
    ("[bert.]embeddings.LayerNorm.{w}", "token_embd_norm.{w}"),
    ("[bert.]encoder.layer.{n}.attention.self.query.{w}", "blk.{n}.attn_q.{w}"),
    ("[bert.]encoder.layer.{n}.attention.self.key.{w}", "blk.{n}.attn_k.{w}"),
    ("[bert.]encoder.layer.{n}.attention.self.value.{w}", "blk.{n}.attn_v.{w}"),
    ("[bert.]encoder.layer.{n}.attention.output.dense.{w}", "blk.{n}.attn_output.{w}"),
    ("[bert.]encoder.layer.{n}.attention.output.LayerNorm.{w}", "blk.{n}.attn_output_norm.{w}"),
    ("[bert.]encoder.layer.{n}.intermediate.dense.{w}", "blk.{n}.ffn_up.{w}"),
    ("[bert.]encoder.layer.{n}.output.dense.{w}", "blk.{n}.ffn_down.{w}"),
    ("[bert.]encoder.layer.{n}.output.LayerNorm.{w}", "blk.{n}.layer_output_norm.{w}"),
    ("[bert.]embeddings.LayerNorm.gamma", "token_embd_norm.weight"),
    ("[bert.]embeddings.LayerNorm.beta", "token_embd_norm.bias"),
    ("[bert.]encoder.layer.{n}.attention.output.LayerNorm.gamma", "blk.{n}.attn_output_norm.weight"),
    ("[bert.]encoder.layer.{n}.attention.output.LayerNorm.beta", "blk.{n}.attn_output_norm.bias"),
    ("[bert.]encoder.layer.{n}.output.LayerNorm.gamma", "blk.{n}.layer_output_norm.weight"),
    ("[bert.]encoder.layer.{n}.output.LayerNorm.beta", "blk.{n}.layer_output_norm.bias"),
    ("[bert.]embeddings.position_ids", None),
    ("[bert.]pooler.dense.{w}", None),
    ("cls.{x}", None),
)

#: Families outside the LLaMA one: family -> tensor table.
FAMILY_TENSORS = {"gpt2": GPT2_TENSORS, "bert": BERT_TENSORS}
_FAMILY_RULES = {family: _rules(table) for family, table in FAMILY_TENSORS.items()}

ARCHS.update({
    "gpt2": HFArch("gpt2", "gpt2", "GPT2LMHeadModel", "gpt-2", False, False, "gpt2"),
    "bert": HFArch("bert", "bert", "BertModel", "bert-bge", False, False, "bert"),
})
_BY_GGUF.update({"gpt2": ARCHS["gpt2"], "bert": ARCHS["bert"]})


# --- canonical .apr names (seed 001 §10.8; issue 26 item 3) -------------------------
#: .apr metadata key of a model written under its canonical names: what gives the
#: source back (``{"arch", "model_type", "from", "names", "rows", "transposed"}``,
#: docs/FORMAT.md "Canonical names in .apr").
CANONICAL_KEY = "aprfast.canonical"

#: GPT-2's canonical names (seed 001 §10.8 has no GPT-2 table): (canonical, Hugging
#: Face, GGUF or None).  Its block is Whisper's decoder block without cross-attention,
#: so the LayerNorms take Whisper's words (``self_attn_layer_norm`` before attention,
#: ``final_layer_norm`` before the MLP, ``layer_norm`` after the stack) and the MLP its
#: ``fc1``/``fc2``; the attention projections take LLaMA's and BERT's ``attn.*_proj``
#: (fused: ``qkv_proj``).  Weights are held as a Linear's, ``[out, in]`` (GGUF's layout;
#: Hugging Face's Conv1D stores the transpose).
GPT2_CANONICAL = (
    ("token_embedding", "transformer.wte.weight", "token_embd.weight"),
    ("positional_embedding", "transformer.wpe.weight", "position_embd.weight"),
    ("layer_norm.{w}", "transformer.ln_f.{w}", "output_norm.{w}"),
    ("lm_head.weight", "lm_head.weight", "output.weight"),
    ("layers.{n}.self_attn_layer_norm.{w}", "transformer.h.{n}.ln_1.{w}", "blk.{n}.attn_norm.{w}"),
    ("layers.{n}.attn.qkv_proj.{w}", "transformer.h.{n}.attn.c_attn.{w}", "blk.{n}.attn_qkv.{w}"),
    ("layers.{n}.attn.out_proj.{w}", "transformer.h.{n}.attn.c_proj.{w}", "blk.{n}.attn_output.{w}"),
    ("layers.{n}.final_layer_norm.{w}", "transformer.h.{n}.ln_2.{w}", "blk.{n}.ffn_norm.{w}"),
    ("layers.{n}.fc1.{w}", "transformer.h.{n}.mlp.c_fc.{w}", "blk.{n}.ffn_up.{w}"),
    ("layers.{n}.fc2.{w}", "transformer.h.{n}.mlp.c_proj.{w}", "blk.{n}.ffn_down.{w}"),
    # the causal-mask buffers of older checkpoints (llama.cpp has none)
    ("layers.{n}.attn.causal_mask", "transformer.h.{n}.attn.bias", None),
    ("layers.{n}.attn.masked_bias", "transformer.h.{n}.attn.masked_bias", None),
)
_GPT2_TO_CANONICAL = {naming: [(_regex(pattern), canonical) for canonical, *columns in GPT2_CANONICAL
                               for pattern in [columns[i]] if pattern is not None]
                      for i, naming in enumerate(("hf", "gguf"))}


def canonical_name(family: str, naming: str, name: str):
    """The canonical ``.apr`` name (seed 001 §10.8) of a tensor named ``name`` in
    ``naming`` ("hf" or "gguf") of an architecture ``family`` (:attr:`HFArch.family`),
    or None when no rule knows it.  LLaMA's and BERT's tables are the ``arch=`` mapper's
    (:func:`aprfast.convert.names.map_name`), GPT-2's :data:`GPT2_CANONICAL`."""
    if family == "gpt2":
        out = _apply(_GPT2_TO_CANONICAL[naming], name)
        return None if out is _UNKNOWN else out
    return _names.map_name(family, name)[0]


def transpose_value(value, spec: Spec):
    """A 2-D tensor value and its spec, transposed.  Packed blocks are dequantized to
    F32 first (a block never spans a column); other raw bytes (BF16 without ml_dtypes)
    move as whole elements."""
    if isinstance(value, RawTensor) and value.dtype.packed:
        value, spec = _dequantize(value), Spec(spec.name, _dtypes.by_name("F32"), spec.shape)
    shape = tuple(reversed(spec.shape))
    if isinstance(value, RawTensor):
        elements = value.data.reshape(spec.shape[0], spec.shape[1], -1).transpose(1, 0, 2)
        return RawTensor(value.dtype, shape, np.ascontiguousarray(elements).reshape(-1)), \
            Spec(spec.name, spec.dtype, shape)
    return np.ascontiguousarray(np.asarray(value).reshape(spec.shape).T), Spec(spec.name, spec.dtype, shape)


def _gpt2_hparams(config: dict) -> list:
    """GPT-2's ``gpt2.*`` keys as the reference converter's ``GPT2Model`` writes them.
    ``context_length`` is ``n_positions`` (the rows of ``wpe``, which llama.cpp checks),
    ``n_ctx`` when there is none (the reference reads ``n_ctx``: the two are equal in
    GPT-2's checkpoints); ``feed_forward_length`` is ``n_inner``, else 4 x ``n_embd``."""
    n_embd = _int(config, "n_embd", required=True)
    n_ctx = _int(config, "n_positions")
    if n_ctx is None:
        n_ctx = _int(config, "n_ctx", required=True)
    n_ff = _int(config, "n_inner")
    eps = _float(config, "layer_norm_epsilon")
    keys = [("gpt2.block_count", "U32", _int(config, "n_layer", required=True)),
            ("gpt2.context_length", "U32", n_ctx), ("gpt2.embedding_length", "U32", n_embd),
            ("gpt2.feed_forward_length", "U32", 4 * n_embd if n_ff is None else n_ff),
            ("gpt2.attention.head_count", "U32", _int(config, "n_head", required=True))]
    return keys + [("gpt2.attention.layer_norm_epsilon", "F32", 1e-5 if eps is None else eps)]


def _gpt2_config(arch: HFArch, kv: dict, specs) -> dict:
    """GPT-2's config.json from a GGUF's keys (a GGUF with no :data:`HF_CONFIG_KEY`)."""
    n_embd, n_head = _kv_int(kv, "gpt2.embedding_length"), _kv_int(kv, "gpt2.attention.head_count")
    n_layer, n_ctx = _kv_int(kv, "gpt2.block_count"), _kv_int(kv, "gpt2.context_length")
    if None in (n_embd, n_head, n_layer, n_ctx):
        raise CorruptError("the GGUF has no gpt2.embedding_length, gpt2.attention.head_count, gpt2.block_count "
                           "or gpt2.context_length")
    n_ff = _kv_int(kv, "gpt2.feed_forward_length")
    config = {"architectures": [arch.hf_class], "model_type": "gpt2", "n_embd": n_embd, "n_layer": n_layer,
              "n_head": n_head, "n_positions": n_ctx, "n_ctx": n_ctx,
              "n_inner": None if n_ff in (None, 4 * n_embd) else n_ff,
              "layer_norm_epsilon": _kv_float(kv, "gpt2.attention.layer_norm_epsilon") or 1e-5,
              "activation_function": "gelu_new", "vocab_size": _gguf_vocab_size(kv, specs, "transformer.wte.weight")}
    return _with_special_ids(config, kv)


def _gguf_vocab_size(kv, specs, embedding: str):
    """The rows of the token embedding (the vocabulary llama.cpp and transformers use),
    else the number of tokens."""
    rows = next((s.shape[0] for s in specs if s.name == embedding and s.shape), None)
    tokens = kv.get("tokenizer.ggml.tokens")
    return rows if rows is not None else (len(tokens) if isinstance(tokens, list) else None)


def _with_special_ids(config: dict, kv: dict) -> dict:
    for which, key in (("bos", "bos_token_id"), ("eos", "eos_token_id"), ("pad", "padding_token_id")):
        value = _kv_int(kv, f"tokenizer.ggml.{key}")
        if value is not None:
            config[f"{which}_token_id"] = value
    return config


#: llama.cpp's pooling types (``{arch}.pooling_type``) by sentence-transformers' mode.
POOLING = {"mean": 1, "cls": 2, "lasttoken": 3}
#: model-directory key of the sentence-transformers Pooling module's config.json
#: (``modules.json`` names its folder), which :func:`read_model_dir` reads for BERT.
POOLING_FILE = "pooling.json"


def _bert_hparams(config: dict) -> list:
    """BERT's ``bert.*`` keys as the reference converter's ``BertModel`` writes them:
    the usual hyper-parameters, ``attention.causal`` false, and ``pooling_type`` only when
    the directory is a sentence-transformers model whose Pooling module says which."""
    eps = _float(config, "layer_norm_eps")
    keys = [("bert.block_count", "U32", _int(config, "num_hidden_layers", required=True)),
            ("bert.context_length", "U32", _int(config, "max_position_embeddings", required=True)),
            ("bert.embedding_length", "U32", _int(config, "hidden_size", required=True)),
            ("bert.feed_forward_length", "U32", _int(config, "intermediate_size", required=True)),
            ("bert.attention.head_count", "U32", _int(config, "num_attention_heads", required=True)),
            ("bert.attention.layer_norm_epsilon", "F32", 1e-12 if eps is None else eps)]
    return keys + [("bert.attention.causal", "BOOL", False)]


def _bert_pooling(files: dict) -> list:
    pooling = files.get(POOLING_FILE)
    if not isinstance(pooling, dict):
        return []
    for mode, flag in (("mean", "pooling_mode_mean_tokens"), ("cls", "pooling_mode_cls_token"),
                       ("lasttoken", "pooling_mode_lasttoken")):
        if pooling.get(flag) is True:
            return [("bert.pooling_type", "U32", POOLING[mode])]
    if pooling.get("pooling_mode") in POOLING:
        return [("bert.pooling_type", "U32", POOLING[pooling["pooling_mode"]])]
    warnings.warn("the sentence-transformers Pooling module is not mean, CLS or last-token pooling: "
                  "bert.pooling_type is not written (llama.cpp then gives per-token embeddings)",
                  ModelConversionWarning, stacklevel=5)
    return []


def _bert_config(arch: HFArch, kv: dict, specs) -> dict:
    """BERT's config.json from a GGUF's keys (a GGUF with no :data:`HF_CONFIG_KEY`)."""
    get = {key: _kv_int(kv, f"bert.{key}") for key in ("embedding_length", "attention.head_count", "block_count",
                                                        "feed_forward_length", "context_length")}
    if None in get.values():
        raise CorruptError("the GGUF lacks one of bert.embedding_length, attention.head_count, block_count, "
                           "feed_forward_length, context_length")
    config = {"architectures": [arch.hf_class], "model_type": "bert", "hidden_size": get["embedding_length"],
              "num_attention_heads": get["attention.head_count"], "num_hidden_layers": get["block_count"],
              "intermediate_size": get["feed_forward_length"], "max_position_embeddings": get["context_length"],
              "type_vocab_size": _kv_int(kv, "tokenizer.ggml.token_type_count") or 1,
              "layer_norm_eps": _kv_float(kv, "bert.attention.layer_norm_epsilon") or 1e-12,
              "hidden_act": "gelu", "vocab_size": _gguf_vocab_size(kv, specs, "embeddings.word_embeddings.weight")}
    config = _with_special_ids(config, kv)
    config.setdefault("pad_token_id", 0)
    return config


def _wordpiece_keys(files: dict) -> list:
    """tokenizer.ggml.* for a WordPiece tokenizer.json (BERT), as the reference
    converter's ``BertModel.set_vocab`` and gguf-py's ``SpecialVocab`` write them:
    ``token_type_count`` (``type_vocab_size``), model ``bert`` (llama.cpp's WPM), the
    tokens in llama.cpp's "phantom space" form (a word start gets U+2581 in front, a
    ``##`` continuation loses its ``##``, control tokens stay as they are), CLS/SEP as
    BOS/EOS when tokenizer_config.json names no BOS/EOS, and the normalizer's
    ``lowercase``/``strip_accents``.  ``tokenizer.ggml.pre`` is ``bert-bge`` (llama.cpp
    ignores it for WPM vocabularies)."""
    config = files["config.json"]
    keys = [("tokenizer.ggml.token_type_count", "U32", _int(config, "type_vocab_size") or 1)]
    tokenizer = files.get("tokenizer.json")
    model = tokenizer.get("model") if isinstance(tokenizer, dict) else None
    if not isinstance(model, dict) or model.get("type") != "WordPiece" or not isinstance(model.get("vocab"), dict):
        warnings.warn("the tokenizer is not a WordPiece tokenizer.json: the GGUF gets no vocabulary (llama.cpp "
                      "needs one)", ModelConversionWarning, stacklevel=5)
        return keys
    vocab = dict(model["vocab"])
    added = [t for t in tokenizer.get("added_tokens") or [] if isinstance(t, dict)]
    added_by_content = {}
    for t in added:
        if isinstance(t.get("content"), str) and type(t.get("id")) is int:
            vocab[t["content"]] = t["id"]
            added_by_content.setdefault(t["content"], t)
    size = config.get("vocab_size")
    size = size if type(size) is int else len(vocab)
    ids = [i for i in vocab.values() if type(i) is int and i >= 0]
    if len(ids) != len(vocab) or (ids and max(ids) >= size) or size > 4 * len(vocab) + 1024:
        raise CorruptError(f"tokenizer.json ids do not fit the vocabulary size {size}")
    reverse = {i: t for t, i in vocab.items()}
    tokens, types = [], []
    for i in range(size):
        token = reverse.get(i)
        if token is None:
            tokens.append(f"[PAD{i}]")
            types.append(UNUSED)
            continue
        entry = added_by_content.get(token)
        if entry is not None and (entry.get("special") or _looks_special(token)):
            tokens.append(token)
            types.append(CONTROL)
            continue
        if entry is not None:
            token = token.replace("\u2581", " ")
        tokens.append(token[2:] if token.startswith("##") else "\u2581" + token)
        types.append(USER_DEFINED if entry is not None else NORMAL)
    keys += [("tokenizer.ggml.model", "STRING", "bert"), ("tokenizer.ggml.pre", "STRING", "bert-bge"),
             ("tokenizer.ggml.tokens", ["ARRAY", "STRING"], tokens),
             ("tokenizer.ggml.token_type", ["ARRAY", "I32"], types)]
    tok_config = dict(files.get("tokenizer_config.json") or {})
    if not _token_text(tok_config.get("bos_token")) and _token_text(tok_config.get("cls_token")):
        tok_config["bos_token"] = tok_config["cls_token"]
    if not _token_text(tok_config.get("eos_token")) and _token_text(tok_config.get("sep_token")):
        tok_config["eos_token"] = tok_config["sep_token"]
    special = [k for k in _special_keys(tokenizer, tok_config, config, added, files)
               if k[0] != "tokenizer.ggml.add_sep_token"]
    keys += special
    add_sep = _add_sep(tokenizer.get("post_processor"), tok_config)
    if add_sep is not None:
        keys.append(("tokenizer.ggml.add_sep_token", "BOOL", add_sep))
    keys += _normalizer_keys(tokenizer.get("normalizer"))
    return keys


def _add_sep(processor, tok_config: dict):
    """Whether llama.cpp puts a separator between two sequences of a BERT-style pair
    (gguf-py SpecialVocab's reading of a TemplateProcessing's ``pair``): true when the
    middle of ``A ... B`` is a SEP/EOS and ``single`` does not already end with one, or
    when it holds two; None when the processor is not a simple template."""
    if not isinstance(processor, dict) or processor.get("type") != "TemplateProcessing":
        return None
    single, pair = processor.get("single") or [], processor.get("pair") or []
    if not isinstance(single, list) or not isinstance(pair, list) or not pair:
        return None

    def special(item):
        return item.get("SpecialToken", {}).get("id") if isinstance(item, dict) else None

    def sequence(item):
        return item.get("Sequence", {}).get("id") if isinstance(item, dict) else None

    first = special(single[0]) if len(single) > 1 else None
    last = special(single[-1]) if len(single) > 1 else None
    start = 1 if first and special(pair[0]) == first else 0
    stop = len(pair) - 1 if last and special(pair[-1]) == last else len(pair)
    pair = pair[start:stop]
    if len(pair) < 3 or sequence(pair[0]) != "A" or sequence(pair[-1]) != "B":
        return None
    middle = pair[1:-1]
    seps = (_token_text(tok_config.get("sep_token")), _token_text(tok_config.get("eos_token")))
    add = bool(special(middle[0]) in seps and not last)
    if len(middle) == 2 and special(middle[1]) in seps:
        add = True
    return add


def _normalizer_keys(normalizer) -> list:
    """tokenizer.ggml.normalizer.lowercase / strip_accents from a tokenizer.json
    normalizer (BertNormalizer, Lowercase, StripAccents, or a Sequence of them)."""
    found = {}

    def walk(node):
        if not isinstance(node, dict):
            return
        kind = node.get("type")
        if kind == "Lowercase":
            found["lowercase"] = True
        elif kind == "StripAccents":
            found["strip_accents"] = True
        elif kind == "BertNormalizer":
            for key in ("lowercase", "strip_accents"):
                if isinstance(node.get(key), bool):
                    found[key] = node[key]
        elif kind == "Sequence":
            for child in node.get("normalizers") or []:
                walk(child)

    walk(normalizer)
    return [(f"tokenizer.ggml.normalizer.{key}", "BOOL", found[key]) for key in ("lowercase", "strip_accents")
            if key in found]


#: family -> (config.json -> its ``{arch}.*`` keys, GGUF keys -> config.json).
_FAMILY_PARAMS = {"gpt2": (_gpt2_hparams, _gpt2_config), "bert": (_bert_hparams, _bert_config)}


def _family_keys(arch: HFArch, files: dict, ftype: int, name: str) -> list:
    """:func:`gguf_keys` of an architecture outside the LLaMA family."""
    config = files["config.json"]
    keys = [("general.architecture", "STRING", arch.gguf), ("general.type", "STRING", "model"),
            ("general.name", "STRING", name)]
    keys += _FAMILY_PARAMS[arch.family][0](config)
    keys.append(("general.file_type", "U32", ftype))
    if arch.family == "bert":
        keys += _bert_pooling(files)
    keys.append(("general.quantization_version", "U32", 2))
    keys += _wordpiece_keys(files) if arch.family == "bert" else _tokenizer_keys(arch, files)
    keys.append((HF_CONFIG_KEY, "STRING", json.dumps(config, sort_keys=True)))
    return keys


# --- the rotary permutation --------------------------------------------------------
def rope_rows(n_rows: int, n_head: int) -> np.ndarray:
    """Row order llama.cpp wants for a Hugging Face ``q_proj``/``k_proj`` of ``n_rows``
    rows and ``n_head`` heads: row ``i`` of the GGUF tensor is row ``order[i]`` of the
    Hugging Face one (``convert_hf_to_gguf.py``'s ``LlamaModel.permute``: within each
    head, the two halves of the head dimension interleaved).  ``np.argsort`` of it is
    the way back."""
    if n_head <= 0 or n_rows % (2 * n_head):
        raise LayoutError(f"cannot permute {n_rows} rows for {n_head} heads: the rows are not 2 x heads x "
                          "half the head size")
    return np.arange(n_rows).reshape(n_head, 2, n_rows // n_head // 2).swapaxes(1, 2).reshape(-1)


def permute_rows(value, order: np.ndarray):
    """``value`` with its rows (first axis) in ``order``: a NumPy array, or a
    RawTensor's bytes (whole rows, quantized blocks included, since blocks never span
    rows)."""
    if isinstance(value, RawTensor):
        rows = value.data.reshape(len(order), -1)[order]
        return RawTensor(value.dtype, value.shape, rows.reshape(-1))
    return np.ascontiguousarray(np.asarray(value)[order])


# --- reading a model directory ---------------------------------------------------
_MODEL_FILES = ("config.json", "generation_config.json", "tokenizer_config.json", "tokenizer.json")


def read_model_dir(directory) -> dict:
    """The JSON files of a Hugging Face model directory that a model conversion reads:
    ``{"config.json": {...}, ...}``, absent files left out, each bounded in size and
    required to be a JSON object; ``chat_template.jinja`` as text when there is one; a
    sentence-transformers Pooling module's config under :data:`POOLING_FILE`."""
    out = {}
    for name in _MODEL_FILES:
        path = os.path.join(directory, name)
        if os.path.isfile(path):
            doc = _read_json(path)
            if not isinstance(doc, dict):
                raise CorruptError(f"{name} is not a JSON object", path=path)
            out[name] = doc
    out.update(_pooling_file(directory))
    out.update(_read_sentencepiece_files(directory))
    template = os.path.join(directory, "chat_template.jinja")
    if os.path.isfile(template) and os.path.getsize(template) < (4 << 20):
        with open(template, encoding="utf-8") as f:
            out["chat_template.jinja"] = f.read()
    return out


def _pooling_file(directory) -> dict:
    """``{POOLING_FILE: config}``: the config.json of a sentence-transformers model's
    Pooling module (``modules.json`` names its folder, a relative path inside the
    directory), or {}."""
    modules_path = os.path.join(directory, "modules.json")
    if not os.path.isfile(modules_path):
        return {}
    modules = _read_json(modules_path)
    for module in modules if isinstance(modules, list) else []:
        if not (isinstance(module, dict) and str(module.get("type", "")).endswith("Pooling")):
            continue
        folder = module.get("path")
        if not isinstance(folder, str) or os.path.isabs(folder) or ".." in folder.replace("\\", "/").split("/"):
            return {}
        path = os.path.join(directory, folder, "config.json")
        doc = _read_json(path) if os.path.isfile(path) else None
        return {POOLING_FILE: doc} if isinstance(doc, dict) else {}
    return {}


def _read_sentencepiece_files(directory) -> dict:
    """A SentencePiece checkpoint's ``tokenizer.model`` (parsed by :mod:`.spm` into a
    JSON-able dict, so an .apr can record it) and ``added_tokens.json``."""
    out = {}
    path = os.path.join(directory, "tokenizer.model")
    if os.path.isfile(path):
        out["tokenizer.model"] = _spm.read_model(path)
    path = os.path.join(directory, "added_tokens.json")
    if os.path.isfile(path):
        doc = _read_json(path)
        if not isinstance(doc, dict):
            raise CorruptError("added_tokens.json is not a JSON object", path=path)
        out["added_tokens.json"] = doc
    return out


def arch_for_config(config) -> HFArch | None:
    """The architecture of a config.json (its ``model_type``), or None."""
    model_type = config.get("model_type") if isinstance(config, dict) else None
    return ARCHS.get(model_type) if isinstance(model_type, str) else None


def arch_for_gguf(kv: dict) -> HFArch | None:
    """The architecture of a GGUF's keys (``general.architecture``), or None."""
    stated = kv.get("general.architecture")
    return _BY_GGUF.get(stated) if isinstance(stated, str) else None


# --- Hugging Face -> GGUF: keys --------------------------------------------------
_U32_MAX = (1 << 32) - 1


def _int(config, key, *, required=False):
    value = config.get(key)
    if value is None and not required:
        return None
    if type(value) is not int or not 0 <= value <= _U32_MAX:
        raise CorruptError(f"config.json {key!r} is {value!r}, not an integer from 0 to {_U32_MAX}")
    return value


def _float(config, key):
    value = config.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise CorruptError(f"config.json {key!r} is {value!r}, not a number")
    return float(value)


def _rope(config: dict) -> dict:
    """The RoPE parameters: transformers 5's ``rope_parameters``, else the older
    top-level ``rope_theta`` and ``rope_scaling``."""
    params = config.get("rope_parameters")
    if isinstance(params, dict):
        params = params.get("full_attention", params)
        if isinstance(params, dict):
            return params
    out = dict(config["rope_scaling"]) if isinstance(config.get("rope_scaling"), dict) else {}
    if "rope_theta" in config:
        out.setdefault("rope_theta", config["rope_theta"])
    if "type" in out and "rope_type" not in out:
        out["rope_type"] = out["type"]
    return out


def gguf_keys(arch: HFArch, files: dict, ftype: int, name: str) -> list:
    """The GGUF ``(key, type, value)`` triples of a Hugging Face model, in the order the
    reference converter writes them: general.*, the ``{arch}.*`` hyper-parameters from
    config.json, ``general.file_type`` (``ftype``), the tokenizer, and
    :data:`HF_CONFIG_KEY`.  ``name`` is general.name (descriptive)."""
    if arch.family != "llama":
        return _family_keys(arch, files, ftype, name)
    config = files["config.json"]
    a = arch.gguf
    keys = [("general.architecture", "STRING", a), ("general.type", "STRING", "model"),
            ("general.name", "STRING", name)]

    def u32(key, value):
        if value is not None:
            keys.append((f"{a}.{key}", "U32", value))

    def f32(key, value):
        if value is not None:
            keys.append((f"{a}.{key}", "F32", value))

    u32("block_count", _int(config, "num_hidden_layers", required=True))
    u32("context_length", _int(config, "max_position_embeddings"))
    u32("embedding_length", _int(config, "hidden_size", required=True))
    u32("feed_forward_length", _int(config, "intermediate_size"))
    n_head = _int(config, "num_attention_heads", required=True)
    u32("attention.head_count", n_head)
    u32("attention.head_count_kv", _int(config, "num_key_value_heads"))
    rope = _rope(config)
    rope_type = rope.get("rope_type")
    factor = rope.get("factor")
    if rope_type in ("linear", "yarn") and isinstance(factor, (int, float)) and not isinstance(factor, bool):
        keys.append((f"{a}.rope.scaling.type", "STRING", rope_type))
        keys.append((f"{a}.rope.scaling.factor", "F32", float(factor)))
        if rope_type == "yarn":
            u32("rope.scaling.original_context_length", _int(rope, "original_max_position_embeddings",
                                                               required=True))
    elif rope_type not in (None, "default") and not _is_llama3_rope(arch, rope_type):
        warnings.warn(f"RoPE scaling {rope_type!r} is not written to the GGUF: llama.cpp will run the model "
                      "without it (long contexts differ from transformers)", ModelConversionWarning, stacklevel=4)
    f32("rope.freq_base", _float(rope, "rope_theta"))
    f32("attention.layer_norm_rms_epsilon", _float(config, "rms_norm_eps"))
    head_dim = _int(config, "head_dim")
    u32("attention.key_length", head_dim)
    u32("attention.value_length", head_dim)
    keys.append(("general.file_type", "U32", ftype))
    if arch.llama_keys:
        u32("vocab_size", _int(config, "vocab_size", required=True))
        u32("rope.dimension_count", head_dim if head_dim is not None else
            _int(config, "hidden_size", required=True) // n_head)
    keys.append(("general.quantization_version", "U32", 2))
    keys += _tokenizer_keys(arch, files)
    keys.append((HF_CONFIG_KEY, "STRING", json.dumps(config, sort_keys=True)))
    return keys


# GGUF token types (llama.cpp's llama_token_type)
NORMAL, CONTROL, USER_DEFINED, UNUSED = 1, 3, 4, 5
_SPECIAL_KEYS = (("bos", "bos_token_id"), ("eos", "eos_token_id"), ("unk", "unknown_token_id"),
                 ("sep", "seperator_token_id"), ("pad", "padding_token_id"), ("mask", "mask_token_id"))


def _looks_special(token: str) -> bool:
    """The reference converter's ``does_token_look_special``."""
    return (token in ("<pad>", "<mask>", "<2mass>", "[@BOS@]") or (token.startswith("<|") and token.endswith("|>"))
            or (token.startswith("<｜") and token.endswith("｜>"))
            or (token.startswith("<unused") and token.endswith(">")))


def pre_tokenizer_name(tokenizer: dict):
    """llama.cpp's tokenizer.ggml.pre for a tokenizer.json's pre-tokenizer, read from its
    structure (not the reference converter's hash of one text's tokens): a byte-level
    split with the Llama 3 or Qwen2 regex, or GPT-2's own (a bare ByteLevel); None when
    it is none of these."""
    pre = tokenizer.get("pre_tokenizer")
    if not isinstance(pre, dict):
        return None
    steps = pre.get("pretokenizers") if pre.get("type") == "Sequence" else [pre]
    if not isinstance(steps, list):
        return None
    if len(steps) == 1 and isinstance(steps[0], dict) and steps[0].get("type") == "ByteLevel" \
            and steps[0].get("use_regex", True):
        return "gpt-2"
    for step in steps:
        if isinstance(step, dict) and step.get("type") == "Split":
            pattern = step.get("pattern")
            regex = pattern.get("Regex") if isinstance(pattern, dict) else None
            for name, known in PRE_TOKENIZER_REGEX.items():
                if regex == known:
                    return name
    return None


def _tokenizer_keys(arch: HFArch, files: dict) -> list:
    """tokenizer.ggml.* for a byte-level BPE tokenizer.json, as the reference converter's
    ``_set_vocab_gpt2`` and gguf-py's ``SpecialVocab`` write them; for LLaMA and
    Mistral first a SentencePiece vocabulary (:func:`_sentencepiece_keys`).  Other
    tokenizers (WordPiece, Unigram) are not converted yet: warned, and the GGUF has no
    vocabulary."""
    if arch.model_type in _SENTENCEPIECE_ARCHS:
        keys = _sentencepiece_keys(arch, files)
        if keys is not None:
            return keys
    tokenizer = files.get("tokenizer.json")
    model = tokenizer.get("model") if tokenizer else None
    if not isinstance(model, dict) or model.get("type", "BPE") != "BPE" or not isinstance(model.get("vocab"), dict) \
            or model.get("byte_fallback"):
        if tokenizer is not None:
            warnings.warn("the tokenizer is not a byte-level BPE tokenizer.json: the GGUF gets no vocabulary "
                          "(llama.cpp needs one)", ModelConversionWarning, stacklevel=5)
        return []
    config = files["config.json"]
    tok_config = files.get("tokenizer_config.json") or {}
    keys = []
    if arch.llama_keys and isinstance(tok_config.get("add_prefix_space"), bool):
        keys.append(("tokenizer.ggml.add_space_prefix", "BOOL", tok_config["add_prefix_space"]))
    vocab = dict(model["vocab"])
    added = [t for t in tokenizer.get("added_tokens") or [] if isinstance(t, dict)]
    added_by_content = {}
    for t in added:
        if isinstance(t.get("content"), str) and type(t.get("id")) is int:
            vocab[t["content"]] = t["id"]
            added_by_content.setdefault(t["content"], t)
    ids = [i for i in vocab.values() if type(i) is int and i >= 0]
    size = config.get("vocab_size")
    if type(size) is not int:
        size = len(vocab)
    if len(ids) != len(vocab) or (ids and max(ids) >= size) or size > 4 * len(vocab) + 1024:
        raise CorruptError(f"tokenizer.json ids do not fit the vocabulary size {size}")
    reverse = {i: t for t, i in vocab.items()}
    tokens, types = [], []
    for i in range(size):
        token = reverse.get(i)
        if token is None:
            tokens.append(f"[PAD{i}]")
            types.append(UNUSED)
        elif token in added_by_content:
            entry = added_by_content[token]
            if entry.get("special") or _looks_special(token):
                types.append(CONTROL)
            else:
                token = token.replace("\u2581", " ")
                types.append(USER_DEFINED)
            tokens.append(token)
        else:
            tokens.append(token)
            types.append(NORMAL)
    pre = pre_tokenizer_name(tokenizer)
    if pre is None:
        pre = arch.pre
        warnings.warn(f"the tokenizer's pre-tokenizer is not one aprfast recognises: tokenizer.ggml.pre is "
                      f"{pre!r}, {arch.model_type}'s usual one; llama.cpp may split text differently",
                      ModelConversionWarning, stacklevel=5)
    keys += [("tokenizer.ggml.model", "STRING", "gpt2"), ("tokenizer.ggml.pre", "STRING", pre),
             ("tokenizer.ggml.tokens", ["ARRAY", "STRING"], tokens),
             ("tokenizer.ggml.token_type", ["ARRAY", "I32"], types)]
    merges = _merges(model.get("merges"))
    if merges:
        keys.append(("tokenizer.ggml.merges", ["ARRAY", "STRING"], merges))
    keys += _special_keys(tokenizer, tok_config, config, added, files)
    return keys


# --- SentencePiece vocabularies (tokenizer.ggml.model "llama") ---------------------
#: model_types whose reference converter class (``LlamaModel.set_vocab``) reads a
#: SentencePiece vocabulary: ``tokenizer.model``, else a byte-fallback BPE
#: tokenizer.json (Llama 2's LlamaTokenizerFast), before the byte-level BPE path.
_SENTENCEPIECE_ARCHS = ("llama", "mistral")
UNKNOWN, BYTE = _spm.UNKNOWN, _spm.BYTE
_BYTE_TOKEN = re.compile(r"<0x[0-9A-Fa-f]{2}>")


def _sentencepiece_keys(arch: HFArch, files: dict):
    """tokenizer.ggml.* of a SentencePiece vocabulary (the reference converter's
    ``_set_vocab_sentencepiece`` from tokenizer.model, else ``_set_vocab_llama_hf`` from
    a byte-fallback BPE tokenizer.json), or None when the model has neither."""
    config = files["config.json"]
    tok_config = files.get("tokenizer_config.json") or {}
    tokenizer = files.get("tokenizer.json")
    if isinstance(files.get("tokenizer.model"), dict):
        tokens, scores, types = _vocab_from_model(files["tokenizer.model"], config, tok_config,
                                                  files.get("added_tokens.json") or {})
    elif _is_llama_hf(tokenizer):
        tokens, scores, types = _vocab_from_llama_hf(tokenizer, tok_config)
    else:
        return None
    keys = []
    if isinstance(tok_config.get("add_prefix_space"), bool):
        keys.append(("tokenizer.ggml.add_space_prefix", "BOOL", tok_config["add_prefix_space"]))
    keys += [("tokenizer.ggml.model", "STRING", "llama"), ("tokenizer.ggml.pre", "STRING", "default"),
             ("tokenizer.ggml.tokens", ["ARRAY", "STRING"], tokens),
             ("tokenizer.ggml.scores", ["ARRAY", "F32"], scores),
             ("tokenizer.ggml.token_type", ["ARRAY", "I32"], types)]
    added = [t for t in (tokenizer or {}).get("added_tokens") or [] if isinstance(t, dict)]
    keys += _special_keys(tokenizer or {}, tok_config, config, added, files, n_vocab=len(tokens))
    return keys


def _vocab_size(config, default: int) -> int:
    size = config.get("vocab_size", default)
    if type(size) is not int or not 0 < size <= 4 * default + 1024:
        raise CorruptError(f"config.json vocab_size {size!r} does not fit a vocabulary of {default} tokens")
    return size


def _token_id(value, what: str) -> int:
    if isinstance(value, str) and value.isdigit():  # tokenizer_config.json's added_tokens_decoder keys
        value = int(value)
    if type(value) is not int or value < 0:
        raise CorruptError(f"{what}: token id {value!r} is not a non-negative integer")
    return value


def _vocab_from_model(model: dict, config: dict, tok_config: dict, added_tokens: dict):
    """(tokens, scores, types) as ``_create_vocab_sentencepiece`` makes them: the
    pieces (user-defined ones typed normal, as ``SentencePieceProcessor`` has no
    ``IsUserDefined`` there), padded to config.json's vocab_size with ``[PADi]``, then
    added_tokens.json and tokenizer_config.json's ``added_tokens_decoder`` over them."""
    pieces = model.get("pieces")
    if not isinstance(pieces, list) or not pieces:
        raise CorruptError("tokenizer.model has no pieces")
    size = _vocab_size(config, len(pieces))
    tokens = [f"[PAD{i}]" for i in range(size)]
    scores, types = [-10000.0] * size, [UNUSED] * size
    kinds = {UNKNOWN: UNKNOWN, CONTROL: CONTROL, UNUSED: UNUSED, BYTE: BYTE}
    for i, piece in enumerate(pieces[:size]):
        if not (isinstance(piece, list) and len(piece) == 3 and isinstance(piece[0], str)
                and isinstance(piece[1], (int, float)) and type(piece[2]) is int):
            raise CorruptError(f"tokenizer.model piece {i} is not [text, score, type]")
        tokens[i], scores[i], types[i] = piece[0], float(piece[1]), kinds.get(piece[2], NORMAL)
    for text, i in added_tokens.items():
        i = _token_id(i, "added_tokens.json")
        if i < size:
            tokens[i], scores[i], types[i] = text, -1000.0, USER_DEFINED
    decoder = tok_config.get("added_tokens_decoder")
    decoder = {} if decoder is None else decoder
    if not isinstance(decoder, dict):
        raise CorruptError("tokenizer_config.json added_tokens_decoder is not an object")
    for key, entry in decoder.items():
        i = _token_id(key, "tokenizer_config.json added_tokens_decoder")
        text = _token_text(entry) if isinstance(entry, dict) else None
        if text is None:
            raise CorruptError(f"tokenizer_config.json added_tokens_decoder {key!r} has no content")
        if i >= size:
            continue
        if entry.get("special") or _looks_special(text):
            types[i] = CONTROL
        else:
            text = text.replace("\u2581", " ")
            types[i] = USER_DEFINED
        tokens[i], scores[i] = text, -1000.0
    return tokens, scores, types


def _is_llama_hf(tokenizer) -> bool:
    """gguf-py ``LlamaHfVocab``'s test: a BPE tokenizer.json with byte fallback and a
    Sequence decoder (Llama 2's LlamaTokenizerFast), not Llama 3's."""
    model = tokenizer.get("model") if isinstance(tokenizer, dict) else None
    if not isinstance(model, dict) or model.get("type") != "BPE" or not isinstance(model.get("vocab"), dict):
        return False
    decoder = tokenizer.get("decoder")
    return bool(model.get("byte_fallback")) and isinstance(decoder, dict) and decoder.get("type") == "Sequence"


def _special_texts(tok_config: dict) -> set:
    """transformers' ``all_special_tokens``: the named special tokens of
    tokenizer_config.json and its extra/additional ones."""
    out = set()
    for typ in ("bos", "eos", "unk", "sep", "pad", "cls", "mask"):
        text = _token_text(tok_config.get(f"{typ}_token"))
        if text is not None:
            out.add(text)
    for key in ("extra_special_tokens", "additional_special_tokens"):
        extra = tok_config.get(key)
        for entry in extra if isinstance(extra, list) else []:
            text = _token_text(entry)
            if text is not None:
                out.add(text)
    return out


def _vocab_from_llama_hf(tokenizer: dict, tok_config: dict):
    """(tokens, scores, types) as gguf-py's ``LlamaHfVocab`` makes them: the model's
    vocabulary in id order (``<0xXX>`` byte tokens, transformers' special tokens
    control, the rest normal), then the added tokens past it; every score -1000."""
    vocab = tokenizer["model"]["vocab"]
    base = len(vocab)
    reverse = {}
    for text, i in vocab.items():
        reverse[_token_id(i, "tokenizer.json vocab")] = text
    added = {}
    for entry in tokenizer.get("added_tokens") or []:
        if isinstance(entry, dict) and isinstance(entry.get("content"), str):
            i = _token_id(entry.get("id"), "tokenizer.json added_tokens")
            reverse[i] = entry["content"]
            added[entry["content"]] = i
    if len(reverse) > 4 * base + 1024:
        raise CorruptError(f"tokenizer.json has {len(reverse)} ids for a vocabulary of {base}")
    specials = {reverse_id for text in _special_texts(tok_config)
                for reverse_id in [vocab.get(text, added.get(text))] if type(reverse_id) is int}
    beyond = sorted((i, text) for text, i in added.items() if i >= base)
    skipped = {i for i, _ in beyond}
    tokens, types = [], []
    for i in range(base):
        if i in skipped:
            continue
        if i not in reverse:
            raise CorruptError(f"tokenizer.json has no token with id {i} (of {base})")
        text = reverse[i]
        tokens.append(text)
        types.append(BYTE if _BYTE_TOKEN.fullmatch(text) else CONTROL if i in specials else NORMAL)
    for i, text in beyond:
        tokens.append(text)
        types.append(CONTROL if i in specials else USER_DEFINED)
    return tokens, [-1000.0] * len(tokens), types


def _merges(merges) -> list:
    if not isinstance(merges, list) or not merges:
        return []
    if all(isinstance(m, str) for m in merges):
        return list(merges)
    out = []
    for pair in merges:
        if not (isinstance(pair, list) and len(pair) == 2 and all(isinstance(p, str) for p in pair)):
            raise CorruptError("tokenizer.json merges are neither strings nor pairs of strings")
        # spaces inside a part become U+0120 as in gguf-py (a space separates the pair)
        out.append(" ".join("".join(chr(ord(c) + 256) if c == " " else c for c in part) for part in pair))
    return out


def _special_keys(tokenizer, tok_config, config, added, files, n_vocab=None) -> list:
    """Special ids, add_bos/add_eos, chat template: gguf-py SpecialVocab's rules for
    the simple post-processors (ByteLevel, a TemplateProcessing with the BOS first /
    the EOS last)."""
    ids, add = {}, {}
    processor = tokenizer.get("post_processor")
    if isinstance(processor, dict):
        steps = processor.get("processors", [processor])
        for step in steps if isinstance(steps, list) else []:
            if not isinstance(step, dict):
                continue
            if step.get("type") == "ByteLevel":
                add.setdefault("bos", False)
                add.setdefault("eos", False)
            elif step.get("type") == "TemplateProcessing":
                single = step.get("single") or []
                first = single[0].get("SpecialToken", {}).get("id") if len(single) > 1 else None
                last = single[-1].get("SpecialToken", {}).get("id") if len(single) > 1 else None
                if first:
                    add["bos"] = first == _token_text(tok_config.get("bos_token"))
                if last:
                    add["eos"] = last == _token_text(tok_config.get("eos_token"))
    for typ, _ in _SPECIAL_KEYS:
        entry = tok_config.get(f"add_{typ}_token")
        if isinstance(entry, bool):
            add.setdefault(typ, entry)
        text = _token_text(tok_config.get(f"{typ}_token"))
        if text is None:
            continue
        found = next((t.get("id") for t in added if t.get("content") == text), None)
        if type(found) is int and 0 <= found < (n_vocab if n_vocab is not None else found + 1):
            ids.setdefault(typ, found)
    for typ, _ in _SPECIAL_KEYS:
        value = config.get(f"{typ}_token_id")
        if type(value) is int and 0 <= value < (n_vocab if n_vocab is not None else value + 1):
            ids.setdefault(typ, value)
    names = dict(_SPECIAL_KEYS)
    keys = [(f"tokenizer.ggml.{names[typ]}", "U32", i) for typ, i in ids.items()]
    keys += [(f"tokenizer.ggml.add_{typ}_token", "BOOL", v) for typ, v in add.items() if typ in ("bos", "eos", "sep")]
    template = tok_config.get("chat_template", files.get("chat_template.jinja"))
    if isinstance(template, str):
        keys.append(("tokenizer.chat_template", "STRING", template))
    return keys


def _token_text(value):
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


#: GGML type name -> llama.cpp's general.file_type (LlamaFileType) when the 2-D
#: weights are of that type.
#: (A K type stands for its _M mix, llama-quantize's default; MXFP4 for MXFP4_MOE.)
FILE_TYPES = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q5_0": 8, "Q5_1": 9, "Q2_K": 10, "Q3_K": 12,
              "Q4_K": 15, "Q5_K": 17, "Q6_K": 18, "IQ2_XXS": 19, "IQ2_XS": 20, "IQ3_XXS": 23, "IQ1_S": 24,
              "IQ4_NL": 25, "IQ3_S": 26, "IQ2_S": 28, "IQ4_XS": 30, "IQ1_M": 31, "BF16": 32, "TQ1_0": 36,
              "TQ2_0": 37, "MXFP4": 38, "NVFP4": 39, "Q1_0": 40}


def file_type(specs) -> int:
    """general.file_type of the tensors ``specs``: ALL_F32 (0) when every tensor is F32,
    else that of the most common type among the 2-D weights (the reference converter's
    ``--outtype``), F16 (1) when that type has no file type."""
    types = [s.dtype.name for s in specs if len(s.shape) == 2 and s.name.endswith(".weight")]
    if all(s.dtype.name == "F32" for s in specs) or not types:
        return 0
    common = max(sorted(set(types)), key=types.count)
    return FILE_TYPES.get(common, 1)


#: Tensors the reference converter always writes in F32 (quantized or F16 runs too).
_ALWAYS_F32 = ("position_embd.weight", "token_types.weight")


def llama_cpp_names(names) -> dict:
    """``{name: GGUF name}``: a Hugging Face name of the LLaMA family as llama.cpp names
    it, any other (a GGUF name already, or one with no GGUF name) as it is; what the
    per-tensor rules of llama.cpp's mixes (numerics.mixes) read."""
    out = {}
    for name in names:
        gguf_name = hf_to_gguf_name(name)
        out[name] = gguf_name if isinstance(gguf_name, str) else name
    return out


def gguf_tensor_dtype(gguf_name: str, shape, dtype_name: str):
    """The dtype llama.cpp needs a float tensor in, or None to keep it: 1-D tensors,
    norms and anything not a ``.weight`` are F32 (the reference converter's rule; its
    CPU kernels take only F32 there), and so are learned position and token-type
    embeddings (:data:`_ALWAYS_F32`), even when ``quantize=`` chose a type."""
    if gguf_name in _ALWAYS_F32:  # learned positions and token types, whatever --outtype says
        return "F32"
    if dtype_name not in ("F16", "BF16", "F64", "F32"):
        return None
    if len(shape) <= 1 or gguf_name.endswith("_norm.weight") or not gguf_name.endswith(".weight"):
        return "F32"
    return "F32" if dtype_name == "F64" else None


# --- Llama 3.1's "llama3" RoPE scaling: the rope_freqs.weight tensor --------------
#: model_types whose reference converter class (``LlamaModel.generate_extra_tensors``)
#: turns a ``llama3`` RoPE scaling into ``rope_freqs.weight``.
_LLAMA3_ROPE_ARCHS = ("llama", "mistral")
#: Llama 3.1's own llama3 parameters (3.1, 3.2 and 3.3 differ only in ``factor``): what
#: GGUF -> Hugging Face tries when the GGUF has no recorded config.json.
LLAMA3_ROPE_DEFAULTS = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


def _is_llama3_rope(arch: HFArch, rope_type) -> bool:
    return arch.model_type in _LLAMA3_ROPE_ARCHS and isinstance(rope_type, str) and rope_type.lower() == "llama3"


def _rdiv(number: float, x: np.ndarray) -> np.ndarray:
    """``number / x`` as PyTorch computes a Python number over a float32 tensor: the
    reciprocal times the number, both in float32 (the reference converter's arithmetic,
    reproduced to the bit)."""
    return (np.float32(1) / x) * np.float32(number)


def llama3_rope_factors(dim: int, theta: float, factor: float, low_freq_factor: float, high_freq_factor: float,
                        original_max_position_embeddings: int) -> np.ndarray:
    """The ``rope_freqs.weight`` llama.cpp divides each rotary frequency by, for a
    ``llama3`` RoPE scaling: 1 for wavelengths below ``original / high_freq_factor``,
    ``factor`` above ``original / low_freq_factor``, and between them the smooth blend
    (transformers' ``_compute_llama3_parameters`` and the reference converter's
    ``generate_extra_tensors``), float32, ``dim // 2`` values.

    The arithmetic is the reference's float32 operation for operation; only its
    ``theta ** x`` is computed in float64 and rounded, where PyTorch's vectorized float32
    power may differ by an ulp or two (for Llama 3.1/3.2's own parameters the two agree
    bit for bit).

    Args:
        dim: The rotary dimension (``head_dim``, else hidden size / heads).
        theta: ``rope_theta``.
        factor: The scaling factor.
        low_freq_factor: The low-frequency factor.
        high_freq_factor: The high-frequency factor.
        original_max_position_embeddings: The context the model was trained at.

    Returns:
        A float32 NumPy array of ``dim // 2`` factors.

    Raises:
        CorruptError: A parameter out of range (non-positive, or equal high and low factors).

    Example:
        >>> llama3_rope_factors(8, 10000.0, 8.0, 1.0, 4.0, 16).tolist()
        [1.7359412908554077, 8.0, 8.0, 8.0]
    """
    values = (theta, factor, low_freq_factor, high_freq_factor, original_max_position_embeddings)
    if dim <= 0 or dim % 2 or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and np.isfinite(v)
                                      and v > 0 for v in values) or high_freq_factor == low_freq_factor:
        raise CorruptError(f"llama3 RoPE scaling parameters out of range: dim {dim}, theta, factor, low/high "
                           f"frequency factors, original context {values}")
    f32 = np.float32
    exponents = np.arange(0, dim, 2, dtype=f32) / f32(dim)
    freqs = _rdiv(1.0, np.power(float(theta), exponents.astype(np.float64)).astype(f32))
    wavelen = _rdiv(2 * np.pi, freqs)
    smooth = (_rdiv(original_max_position_embeddings, wavelen) - f32(low_freq_factor)) \
        / f32(high_freq_factor - low_freq_factor)
    blended = _rdiv(1.0, (f32(1) - smooth) / f32(factor) + smooth)
    return np.where(wavelen < f32(original_max_position_embeddings / high_freq_factor), f32(1),
                    np.where(wavelen > f32(original_max_position_embeddings / low_freq_factor), f32(factor),
                             blended)).astype(f32)


def _rope_dim(config: dict) -> int:
    head_dim = _int(config, "head_dim")
    if head_dim is not None:
        return head_dim
    n_head = _int(config, "num_attention_heads", required=True)
    if not n_head:
        raise CorruptError("config.json num_attention_heads is 0")
    return _int(config, "hidden_size", required=True) // n_head


def generated_tensors(arch: HFArch, config: dict) -> dict:
    """Tensors the reference converter adds for this config.json (name -> float32
    array): ``rope_freqs.weight`` for a ``llama3`` RoPE scaling, else none."""
    rope = _rope(config)
    if not _is_llama3_rope(arch, rope.get("rope_type")):
        return {}
    theta = _float(rope, "rope_theta")

    def number(key, default):
        value = rope.get(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise CorruptError(f"config.json llama3 RoPE {key!r} is {value!r}, not a number")
        return value

    factors = llama3_rope_factors(
        _rope_dim(config), theta if theta is not None else 10000.0, number("factor", 8.0),
        number("low_freq_factor", 1.0), number("high_freq_factor", 4.0),
        number("original_max_position_embeddings", 8192))
    return {"rope_freqs.weight": factors}


def rope_from_factors(arch: HFArch, kv: dict, factors) -> dict | None:
    """config.json's ``rope_parameters`` for a GGUF's ``rope_freqs.weight`` when it is
    Llama 3.1's ``llama3`` scaling (:data:`LLAMA3_ROPE_DEFAULTS`, ``factor`` its largest
    value) recomputed to the same values within an ulp, else None: the four parameters
    cannot be solved for from the factors in general."""
    a = arch.gguf
    values = np.asarray(factors, dtype=np.float32).reshape(-1)
    if not values.size or not np.all(np.isfinite(values)) or values.max() <= 1:
        return None
    theta = _kv_float(kv, f"{a}.rope.freq_base") or 10000.0
    dim = _kv_int(kv, f"{a}.rope.dimension_count")
    if dim is None or dim != 2 * values.size:
        return None
    guess = dict(LLAMA3_ROPE_DEFAULTS, factor=float(values.max()))
    try:
        again = llama3_rope_factors(dim, theta, guess["factor"], guess["low_freq_factor"],
                                    guess["high_freq_factor"], guess["original_max_position_embeddings"])
    except CorruptError:
        return None
    if not np.allclose(again, values, rtol=1e-6, atol=0):
        return None
    return dict(guess, rope_type="llama3", rope_theta=theta)


class WithGeneratedTensors:
    """A source with the tensors of :func:`generated_tensors` before its own (the
    reference converter writes them first); everything else is the source's."""

    def __init__(self, source, tensors: dict):
        from .. import dtypes

        self._source = source
        self._values = {name: np.ascontiguousarray(value, dtype=np.float32) for name, value in tensors.items()}
        self._generated = [Spec(name, dtypes.by_name("F32"), tuple(value.shape))
                           for name, value in self._values.items()]
        self.specs = self._generated + [s for s in source.specs if s.name not in self._values]

    def read(self, spec, scratch=None):
        """The generated value, else the source's tensor."""
        if any(spec is g for g in self._generated):
            return self._values[spec.name].copy()
        return self._source.read(spec, scratch)

    def raw_range(self, spec):
        """None for a generated tensor (no bytes in a file), else the source's."""
        if any(spec is g for g in self._generated):
            return None
        return self._source.raw_range(spec) if hasattr(self._source, "raw_range") else None

    def __getattr__(self, name):
        return getattr(self._source, name)


# --- GGUF -> Hugging Face ----------------------------------------------------------
def _kv_int(kv, key):
    value = kv.get(key)
    return value if type(value) is int else None


def _kv_float(kv, key):
    value = kv.get(key)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def hf_files(arch: HFArch, kv: dict, specs, dtype: str) -> dict:
    """``{"config.json": ..., "generation_config.json": ..., "tokenizer.json" or
    "tokenizer.model": ..., "tokenizer_config.json": ...}`` for a GGUF of ``arch`` (its keys ``kv``, its output
    tensors ``specs`` with Hugging Face names): the config the GGUF recorded under
    :data:`HF_CONFIG_KEY` when it has one, else one built from its keys; the tokenizer
    files when the GGUF holds a byte-level BPE vocabulary (tokenizer.json) or a
    SentencePiece one (tokenizer.model)."""
    names = {s.name for s in specs}
    stored = kv.get(HF_CONFIG_KEY)
    config = None
    if isinstance(stored, str):
        try:
            config = json.loads(stored)
        except ValueError:
            config = None
    if not isinstance(config, dict):
        config = _config_from_keys(arch, kv, names) if arch.family == "llama" else \
            _FAMILY_PARAMS[arch.family][1](arch, kv, specs)
    config["tie_word_embeddings"] = "lm_head.weight" not in names
    config["dtype"] = {"F16": "float16", "BF16": "bfloat16"}.get(dtype, "float32")
    config.pop("torch_dtype", None)
    out = {"config.json": config}
    generation = {"_from_model_config": True}
    for which in ("bos", "eos"):
        if f"{which}_token_id" in config:
            generation[f"{which}_token_id"] = config[f"{which}_token_id"]
    out["generation_config.json"] = generation
    out.update(_hf_wordpiece(kv) if kv.get("tokenizer.ggml.model") == "bert" else _hf_tokenizer(arch, kv))
    return out


def _config_from_keys(arch: HFArch, kv: dict, names) -> dict:
    a = arch.gguf
    n_embd, n_head = _kv_int(kv, f"{a}.embedding_length"), _kv_int(kv, f"{a}.attention.head_count")
    n_layer = _kv_int(kv, f"{a}.block_count")
    if n_embd is None or n_head is None or n_layer is None:
        raise CorruptError(f"the GGUF has no {a}.embedding_length, {a}.attention.head_count or {a}.block_count")
    vocab = kv.get("tokenizer.ggml.tokens")
    config = {"architectures": [arch.hf_class], "model_type": arch.model_type, "hidden_size": n_embd,
              "num_hidden_layers": n_layer, "num_attention_heads": n_head,
              "num_key_value_heads": _kv_int(kv, f"{a}.attention.head_count_kv") or n_head,
              "intermediate_size": _kv_int(kv, f"{a}.feed_forward_length"),
              "max_position_embeddings": _kv_int(kv, f"{a}.context_length") or 2048,
              "rms_norm_eps": _kv_float(kv, f"{a}.attention.layer_norm_rms_epsilon") or 1e-6,
              "vocab_size": _kv_int(kv, f"{a}.vocab_size") or (len(vocab) if isinstance(vocab, list) else None),
              "hidden_act": "silu"}
    head_dim = _kv_int(kv, f"{a}.attention.key_length")
    if head_dim is not None:
        config["head_dim"] = head_dim
    rope = {"rope_type": "default", "rope_theta": _kv_float(kv, f"{a}.rope.freq_base") or 10000.0}
    scaling = kv.get(f"{a}.rope.scaling.type")
    if scaling in ("linear", "yarn"):
        rope.update(rope_type=scaling, factor=_kv_float(kv, f"{a}.rope.scaling.factor"))
        if scaling == "yarn":
            rope["original_max_position_embeddings"] = _kv_int(kv, f"{a}.rope.scaling.original_context_length")
    config["rope_parameters"] = rope
    if arch.model_type == "llama":
        config["attention_bias"] = any(n.endswith("self_attn.q_proj.bias") for n in names)
    for which, key in (("bos", "bos_token_id"), ("eos", "eos_token_id"), ("pad", "padding_token_id")):
        value = _kv_int(kv, f"tokenizer.ggml.{key}")
        if value is not None:
            config[f"{which}_token_id"] = value
    return config


def _hf_tokenizer(arch: HFArch, kv: dict) -> dict:
    """tokenizer.json and tokenizer_config.json from a GGUF's byte-level BPE vocabulary
    (tokenizer.ggml.model "gpt2"), or {} for any other."""
    tokens, types = kv.get("tokenizer.ggml.tokens"), kv.get("tokenizer.ggml.token_type")
    if kv.get("tokenizer.ggml.model") == "llama" and isinstance(tokens, list):
        return _hf_sentencepiece(kv, tokens, types)
    if kv.get("tokenizer.ggml.model") != "gpt2" or not isinstance(tokens, list):
        return {}
    if not isinstance(types, list) or len(types) != len(tokens):
        types = [NORMAL] * len(tokens)
    vocab, added = {}, []
    for i, (token, kind) in enumerate(zip(tokens, types)):
        if kind == UNUSED:
            continue
        if kind in (CONTROL, USER_DEFINED):
            added.append({"id": i, "content": token, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": kind == USER_DEFINED, "special": kind == CONTROL})
        vocab.setdefault(token, i)
    merges = [m.split(" ", 1) for m in kv.get("tokenizer.ggml.merges") or [] if isinstance(m, str) and " " in m]
    pre = kv.get("tokenizer.ggml.pre")
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    if pre in PRE_TOKENIZER_REGEX:
        pre_tokenizer = {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": PRE_TOKENIZER_REGEX[pre]}, "behavior": "Isolated", "invert": False},
            dict(byte_level, use_regex=False)]}
    else:
        pre_tokenizer = byte_level
    tokenizer = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
                 "pre_tokenizer": pre_tokenizer,
                 "post_processor": dict(byte_level, trim_offsets=False),
                 "decoder": dict(byte_level),
                 "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                           "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                           "ignore_merges": False, "vocab": vocab, "merges": merges}}
    tok_config = {"tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False}
    for which, key in (("bos", "bos_token_id"), ("eos", "eos_token_id"), ("unk", "unknown_token_id"),
                       ("pad", "padding_token_id")):
        i = _kv_int(kv, f"tokenizer.ggml.{key}")
        if i is not None and 0 <= i < len(tokens):
            tok_config[f"{which}_token"] = tokens[i]
    for which in ("bos", "eos"):
        value = kv.get(f"tokenizer.ggml.add_{which}_token")
        if isinstance(value, bool):
            tok_config[f"add_{which}_token"] = value
    template = kv.get("tokenizer.chat_template")
    if isinstance(template, str):
        tok_config["chat_template"] = template
    return {"tokenizer.json": tokenizer, "tokenizer_config.json": tok_config}


def _hf_wordpiece(kv: dict) -> dict:
    """tokenizer.json and tokenizer_config.json (``BertTokenizer``) from a GGUF's
    WordPiece vocabulary (tokenizer.ggml.model "bert"): the phantom-space tokens back
    to WordPiece's (U+2581 dropped from a word start, ``##`` put back on the rest),
    control tokens as special added tokens, BERT's normalizer with the GGUF's
    lowercase/strip_accents (llama.cpp's defaults: lower case, accents stripped when
    lower-casing), ``[CLS] $A [SEP]`` from the BOS (CLS) and SEP/EOS tokens."""
    tokens, types = kv.get("tokenizer.ggml.tokens"), kv.get("tokenizer.ggml.token_type")
    if not isinstance(tokens, list):
        return {}
    if not isinstance(types, list) or len(types) != len(tokens):
        types = [NORMAL] * len(tokens)
    vocab, added = {}, []
    for i, (token, kind) in enumerate(zip(tokens, types)):
        if kind == UNUSED or not isinstance(token, str):
            continue
        if kind == CONTROL:
            added.append({"id": i, "content": token, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True})
        else:
            token = token[1:] if token.startswith("\u2581") else "##" + token
        vocab.setdefault(token, i)

    def text(key):
        i = _kv_int(kv, f"tokenizer.ggml.{key}")
        return tokens[i] if i is not None and 0 <= i < len(tokens) and isinstance(tokens[i], str) else None

    cls, unk = text("bos_token_id"), text("unknown_token_id")
    sep = text("seperator_token_id") or text("eos_token_id")
    lowercase = kv.get("tokenizer.ggml.normalizer.lowercase")
    lowercase = lowercase if isinstance(lowercase, bool) else True
    strip = kv.get("tokenizer.ggml.normalizer.strip_accents")
    strip = strip if isinstance(strip, bool) else None
    post = None
    if cls is not None and sep is not None:
        post = {"type": "TemplateProcessing",
                "single": [{"SpecialToken": {"id": cls, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                           {"SpecialToken": {"id": sep, "type_id": 0}}],
                "pair": [{"SpecialToken": {"id": cls, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                         {"SpecialToken": {"id": sep, "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}},
                         {"SpecialToken": {"id": sep, "type_id": 1}}],
                "special_tokens": {t: {"id": t, "ids": [vocab[t]], "tokens": [t]} for t in (cls, sep)}}
    tokenizer = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
                 "normalizer": {"type": "BertNormalizer", "clean_text": True, "handle_chinese_chars": True,
                                "strip_accents": strip, "lowercase": lowercase},
                 "pre_tokenizer": {"type": "BertPreTokenizer"}, "post_processor": post,
                 "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": True},
                 "model": {"type": "WordPiece", "unk_token": unk or "[UNK]", "continuing_subword_prefix": "##",
                           "max_input_chars_per_word": 100, "vocab": vocab}}
    tok_config = {"tokenizer_class": "BertTokenizer", "do_lower_case": lowercase, "strip_accents": strip,
                  "tokenize_chinese_chars": True, "clean_up_tokenization_spaces": True}
    for which, value in (("cls", cls), ("sep", sep), ("unk", unk), ("pad", text("padding_token_id")),
                         ("mask", text("mask_token_id"))):
        if value is not None:
            tok_config[f"{which}_token"] = value
    return {"tokenizer.json": tokenizer, "tokenizer_config.json": tok_config}


def _hf_sentencepiece(kv: dict, tokens: list, types) -> dict:
    """tokenizer.model and tokenizer_config.json from a GGUF's SentencePiece vocabulary
    (tokenizer.ggml.model "llama"): a BPE ModelProto of its tokens, scores and types
    (llama.cpp's SentencePiece tokenizer merges by score, as a BPE model does), which
    transformers' LlamaTokenizer loads."""
    scores = kv.get("tokenizer.ggml.scores")
    if not isinstance(scores, list) or len(scores) != len(tokens):
        scores = [0.0] * len(tokens)
    if not isinstance(types, list) or len(types) != len(tokens):
        types = [NORMAL] * len(tokens)
    pieces = []
    for i, (token, score, kind) in enumerate(zip(tokens, scores, types)):
        if not isinstance(token, str) or isinstance(score, bool) or not isinstance(score, (int, float)):
            raise CorruptError(f"tokenizer.ggml token {i} is not a string with a numeric score")
        kind = kind if kind in (NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE) else NORMAL
        pieces.append((token, float(score) if np.isfinite(score) else -1e9, kind))

    def special(key, default):
        i = _kv_int(kv, f"tokenizer.ggml.{key}")
        return i if i is not None and 0 <= i < len(tokens) else default

    ids = {"unk": special("unknown_token_id", 0), "bos": special("bos_token_id", -1),
           "eos": special("eos_token_id", -1), "pad": special("padding_token_id", -1)}
    add_prefix = kv.get("tokenizer.ggml.add_space_prefix")
    model = _spm.write_model(pieces, model_type="BPE", unk_id=ids["unk"], bos_id=ids["bos"], eos_id=ids["eos"],
                             pad_id=ids["pad"], byte_fallback=any(t == BYTE for _, _, t in pieces),
                             add_dummy_prefix=add_prefix if isinstance(add_prefix, bool) else True)
    tok_config = {"tokenizer_class": "LlamaTokenizer", "clean_up_tokenization_spaces": False, "legacy": False}
    for which, i in ids.items():
        if i >= 0:
            tok_config[f"{which}_token"] = tokens[i]
    for which in ("bos", "eos"):
        value = kv.get(f"tokenizer.ggml.add_{which}_token")
        if isinstance(value, bool):
            tok_config[f"add_{which}_token"] = value
    if isinstance(add_prefix, bool):
        tok_config["add_prefix_space"] = add_prefix
    template = kv.get("tokenizer.chat_template")
    if isinstance(template, str):
        tok_config["chat_template"] = template
    return {"tokenizer.model": model, "tokenizer_config.json": tok_config}


# --- the conversion plan -----------------------------------------------------------
#: Files a Hugging Face destination gets beside its weights.
SIDE_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "tokenizer.model")


def _to_canonical(naming: str):
    def to_dest(name, family):
        out = canonical_name(family, naming, name)
        return ... if out is None else out
    return to_dest


#: direction -> (the source's naming, the destination's name of a source tensor)
_DIRECTIONS = {"hf-to-gguf": ("hf", hf_to_gguf_name), "gguf-to-hf": ("gguf", gguf_to_hf_name),
               "hf-to-apr": ("hf", _to_canonical("hf")), "gguf-to-apr": ("gguf", _to_canonical("gguf"))}


class ModelConversion:
    """What a model conversion does on top of the container one: ``direction`` is
    "hf-to-gguf", "gguf-to-hf", or "hf-to-apr"/"gguf-to-apr" (the canonical ``.apr``
    names and layout: Hugging Face's row order, Linear weights ``[out, in]``);
    :meth:`name` the destination's name of a source tensor (None: dropped), ``rows``
    the row order of each source tensor whose rows move (the rotary permutation),
    ``transposed`` the source tensors transposed (GPT-2's Conv1D weights),
    :meth:`out_dtype` the dtype an engine needs, :meth:`metadata` the destination's
    metadata once the output tensors are known, :meth:`side_files` the side files of a
    Hugging Face directory, :meth:`record` what an ``.apr`` records to give the source
    back."""

    def __init__(self, direction: str, arch: HFArch, source, files: dict | None = None, kv: dict | None = None):
        self.direction, self.arch, self.files = direction, arch, files or {}
        self.unknown, self.rows, self.heads = [], {}, {}
        self._kv = kv or {}
        self._source_path = source.path
        #: the Hugging Face directory's name (general.name without a _name_or_path): an
        #: .apr made from it records it, so .apr -> GGUF writes the same bytes
        self._dir_name = getattr(source, "hf_dir_name", None) or \
            os.path.basename(os.path.dirname(os.path.abspath(source.path)))
        naming, to_dest = _DIRECTIONS[direction]
        self._from = naming
        self._to_apr = direction.endswith("-to-apr")
        self._names = {}
        #: source tensors transposed on the way (GPT-2's Conv1D weights: stored [in, out]
        #: in Hugging Face, [out, in] in GGUF and in the canonical .apr layout)
        self.transposed = set()
        for spec in source.specs:
            out = to_dest(spec.name, arch.family)
            if out is ...:
                self.unknown.append(spec.name)
                out = spec.name
            self._names[spec.name] = out
            hf_name = spec.name if naming == "hf" else (out if direction == "gguf-to-hf" else None)
            if arch.family == "gpt2" and len(spec.shape) == 2 and CONV1D.match(hf_name or ""):
                self.transposed.add(spec.name)
        if self.unknown and not self._to_apr:  # an .apr keeps them, and gives them back
            shown = ", ".join(repr(n) for n in self.unknown[:5]) + (", ..." if len(self.unknown) > 5 else "")
            warnings.warn(f"{len(self.unknown)} tensor name(s) of this {arch.model_type} model have no "
                          f"{'llama.cpp' if direction == 'hf-to-gguf' else 'Hugging Face'} name, kept as they are "
                          f"(the engine will not use them): {shown}", ModelConversionWarning, stacklevel=4)
        if arch.permute and direction != "hf-to-apr":  # .apr holds Hugging Face's row order
            self._plan_rows(source.specs)
        #: tensors the destination's engine needs that the source has no tensor for
        self.generated = generated_tensors(arch, self.files["config.json"]) if direction == "hf-to-gguf" else {}
        self._rope = self._rope_back(source) if direction == "gguf-to-hf" else None

    def _rope_back(self, source):
        """rope_parameters for a GGUF's rope_freqs.weight when its config.json is not
        recorded (see :func:`rope_from_factors`); warned when it cannot be recovered."""
        spec = next((s for s in source.specs if s.name == "rope_freqs.weight"), None)
        if spec is None or isinstance(self._kv.get(HF_CONFIG_KEY), str):
            return None
        value = source.read(spec)
        rope = None
        if not isinstance(value, RawTensor):
            rope = rope_from_factors(self.arch, self._kv, value)
        if rope is None:
            warnings.warn("the GGUF's rope_freqs.weight is not Llama 3.1's llama3 RoPE scaling and it records no "
                          "config.json: config.json gets no rope scaling (transformers' logits will differ "
                          "from llama.cpp's); add the source's rope_parameters by hand", ModelConversionWarning,
                          stacklevel=5)
        return rope

    def _heads(self):
        if self._from == "hf":
            config = self.files["config.json"]
            n_head = _int(config, "num_attention_heads", required=True)
            return n_head, _int(config, "num_key_value_heads") or n_head
        a = self.arch.gguf
        n_head = _kv_int(self._kv, f"{a}.attention.head_count")
        if n_head is None:
            raise CorruptError(f"the GGUF has no {a}.attention.head_count: its attn_q/attn_k rows cannot be "
                               "put back in Hugging Face's order", path=self._source_path)
        return n_head, _kv_int(self._kv, f"{a}.attention.head_count_kv") or n_head

    def _plan_rows(self, specs) -> None:
        heads = None
        for spec in specs:
            gguf_name = self._names[spec.name] if self.direction == "hf-to-gguf" else spec.name
            m = re.match(r"^blk\.\d+\.attn_([qk])\.(weight|bias)$", gguf_name or "")
            if m is None or not spec.shape:
                continue
            heads = heads or self._heads()  # asked only of a model with Q/K tensors
            n = heads[0] if m.group(1) == "q" else heads[1]
            order = rope_rows(spec.shape[0], n)
            self.rows[spec.name] = order if self.direction == "hf-to-gguf" else np.argsort(order)
            self.heads[spec.name] = n

    def report(self) -> dict:
        """What ``convert()`` returns under ``names``: ``arch`` (general.architecture),
        ``model`` (config.json's model_type), ``direction``, ``renamed``, ``dropped``,
        ``unknown`` (kept), ``permuted`` (source tensors whose rows moved) and
        ``transposed`` (source tensors transposed: GPT-2's Conv1D weights)."""
        return {"arch": self.arch.gguf, "model": self.arch.model_type, "direction": self.direction,
                "detected": True, "reason": "from config.json" if self._from == "hf"
                else "from general.architecture",
                "renamed": sum(1 for s, d in self._names.items() if d is not None and s != d),
                "dropped": sorted(s for s, d in self._names.items() if d is None),
                "unknown": list(self.unknown), "permuted": sorted(self.rows),
                "transposed": sorted(self.transposed)}

    def name(self, source_name: str):
        """The destination name of a source tensor (None: the engines recompute it)."""
        return self._names.get(source_name, source_name)

    def out_dtype(self, name: str, shape, dtype_name: str, packed: bool):
        """The dtype name an engine needs for output tensor ``name``, or None to keep."""
        if self.direction == "hf-to-gguf":
            return gguf_tensor_dtype(name, shape, dtype_name)
        if self._to_apr:
            return None  # .apr holds every dtype
        return "F32" if packed else None  # transformers cannot load GGML blocks

    def record(self, pairs) -> dict:
        """What an ``.apr`` written under the canonical names records under
        :data:`CANONICAL_KEY` to give the source back (:func:`restore_source_names`):
        ``names`` (output name -> the source's, for each tensor renamed), ``rows``
        (output name -> heads: the source held these rows in llama.cpp's rotary order),
        ``transposed`` (output names the source held transposed), ``from`` (the source's
        naming, "hf" or "gguf"), ``arch``, ``model_type`` and, from Hugging Face,
        ``directory`` (the directory's name: a GGUF's ``general.name``)."""
        names, rows, transposed = {}, {}, []
        for spec, out in pairs:
            if out.name != self._names.get(spec.name):  # renamed again (rename=) or a low-rank factor
                continue
            if out.name != spec.name:
                names[out.name] = spec.name
            if spec.name in self.heads:
                rows[out.name] = self.heads[spec.name]
            if spec.name in self.transposed:
                transposed.append(out.name)
        out = {"arch": self.arch.gguf, "model_type": self.arch.model_type, "from": self._from,
               "names": names, "rows": rows, "transposed": transposed}
        if self._from == "hf":
            out["directory"] = self._dir_name
        return out

    def metadata(self, specs) -> dict:
        """The destination's metadata: typed GGUF keys (``gguf.kv_types`` holds their
        types, which the GGUF writer honours) or safetensors' ``{"format": "pt"}``
        (an ``.apr`` keeps the source's metadata, with :meth:`record`)."""
        if self.direction == "gguf-to-hf":
            return {"format": "pt"}
        name = self.files["config.json"].get("_name_or_path")
        if not isinstance(name, str) or not name:
            name = self._dir_name or self.arch.model_type
        triples = gguf_keys(self.arch, self.files, file_type(specs), name)
        out = {key: value for key, _, value in triples}
        out["gguf.kv_types"] = {key: vtype for key, vtype, _ in triples}
        return out

    def side_files(self, specs) -> dict:
        """The JSON files a Hugging Face destination gets beside the weights."""
        if self.direction != "gguf-to-hf":
            return {}
        types = [s.dtype.name for s in specs if len(s.shape) == 2]
        dtype = max(sorted(set(types)), key=types.count) if types else "F32"
        files = hf_files(self.arch, self._kv, specs, dtype)
        if self._rope:
            config = files["config.json"]
            config["rope_parameters"] = dict(config.get("rope_parameters") or {}, **self._rope)
        return files


def side_file_dir(destination) -> str:
    """The directory a Hugging Face destination's side files go to."""
    dest = os.fspath(destination)
    if dest.endswith(".json") or not dest.endswith(".safetensors"):
        return os.path.dirname(dest) if dest.endswith(".json") else dest
    return os.path.dirname(os.path.abspath(dest))


#: .apr metadata key holding a Hugging Face source's model files (config.json,
#: generation_config.json, tokenizer_config.json, tokenizer.json as JSON objects), so
#: that .apr -> GGUF is the model conversion HF -> GGUF is.
HF_FILES_KEY = "aprfast.hf_files"


def _hf_dir_files(source):
    """The model files beside a safetensors source, or None when it has no config.json;
    a source that changes what they say (``edit_model_files``: compressed-tensors
    weights read as their values) gives them as changed."""
    if getattr(source, "format", None) not in ("safetensors", "safetensors-sharded"):
        return None
    directory = os.path.dirname(os.path.abspath(source.path))
    if not os.path.isfile(os.path.join(directory, "config.json")):
        return None
    files = read_model_dir(directory)
    edit = getattr(source, "edit_model_files", None)
    return edit(files) if edit is not None else files


def apr_record(source) -> dict:
    """What an .apr made from ``source`` records for a later model conversion:
    ``{HF_FILES_KEY: files}`` for a Hugging Face directory with a config.json, else {}.
    (A GGUF's keys are all kept in .apr already.)"""
    files = _hf_dir_files(source)
    return {HF_FILES_KEY: _bounded_ints(files)} if files else {}


def _bounded_ints(value):
    """JSON integers .apr metadata can hold (i64/u64): bigger ones become floats (a
    tokenizer_config.json's ``model_max_length`` of 10**30 means "no limit")."""
    if isinstance(value, dict):
        return {k: _bounded_ints(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_bounded_ints(v) for v in value]
    if type(value) is int and not -(1 << 63) <= value < (1 << 64):
        return float(value)
    return value


def _apr_hf_files(metadata):
    files = metadata.get(HF_FILES_KEY)
    return files if isinstance(files, dict) and isinstance(files.get("config.json"), dict) else None


def plan_model(source, kind: str, destination):
    """The ModelConversion for ``source`` -> a ``kind`` destination, or None when it is
    a container conversion (not Hugging Face <-> GGUF or either to ``.apr``, or an
    architecture with no table: warned when the source says what it is).  An .apr
    source converts as the model it was made from (seen through
    :func:`restore_source_names` first): a Hugging Face one (:data:`HF_FILES_KEY`) to
    GGUF, a GGUF one (its ``gguf.kv_types``) to Hugging Face."""
    fmt = getattr(source, "format", None)
    if kind == "apr":
        return _to_apr(source) if fmt != "apr" else None
    if fmt == "apr":
        metadata = source.metadata or {}
        if kind == "gguf" and _apr_hf_files(metadata) is not None:
            return _from_hf(source, _apr_hf_files(metadata))
        if kind == "safetensors" and isinstance(metadata.get(TYPES_KEY), dict):
            return _from_gguf(source, {key: value for key, _, value in gguf_metadata(metadata)})
        return None
    if kind == "gguf":
        files = _hf_dir_files(source)
        return _from_hf(source, files) if files else None
    if kind == "safetensors" and fmt == "gguf":
        return _from_gguf(source, source.gguf_metadata)
    return None


def _to_apr(source):
    """The canonical names of a Hugging Face directory of a known ``model_type`` or a
    GGUF of a known ``general.architecture``, else None (names kept).  A GGUF that
    cannot give Hugging Face's Q/K row order (no head count) keeps its names, warned."""
    if getattr(source, "format", None) == "gguf":
        kv = source.gguf_metadata
        arch = arch_for_gguf(kv)
        if arch is None:
            return None
        try:
            return ModelConversion("gguf-to-apr", arch, source, kv=kv)
        except (CorruptError, LayoutError) as exc:
            warnings.warn(f"the {arch.gguf} GGUF's attn_q/attn_k rows cannot be put in Hugging Face's order "
                          f"({exc}): the .apr keeps the GGUF's names and rows", ModelConversionWarning, stacklevel=4)
            return None
    files = _hf_dir_files(source)
    arch = arch_for_config(files["config.json"]) if files else None
    return ModelConversion("hf-to-apr", arch, source, files=files) if arch is not None else None


class _Restored:
    """An ``.apr`` written under the canonical names, seen as the source it was made
    from (:func:`restore_source_names`): its names, rows and layout, its metadata
    without :data:`CANONICAL_KEY`; everything else is the ``.apr``'s."""

    def __init__(self, source, record: dict):
        self._source = source
        names, rows, transposed = (record.get(k) for k in ("names", "rows", "transposed"))
        names = names if isinstance(names, dict) else {}
        rows = rows if isinstance(rows, dict) else {}
        transposed = set(transposed) if isinstance(transposed, list) else set()
        self._plan = {}
        self.specs = []
        for spec in source.specs:
            name = names.get(spec.name, spec.name)
            name = name if isinstance(name, str) else spec.name
            if name in self._plan:  # a damaged or edited record: two tensors, one name
                raise LayoutError(f"the .apr's {CANONICAL_KEY} gives two tensors the source name {name!r} "
                                  f"({self._plan[name][0].name!r} and {spec.name!r}); convert it with "
                                  "names='keep'", path=getattr(source, "path", None))
            heads = rows.get(spec.name)
            heads = heads if type(heads) is int and heads > 0 and len(spec.shape) >= 1 else None
            flip = spec.name in transposed and len(spec.shape) == 2
            out = Spec(name, spec.dtype, spec.shape, spec.size)
            if flip:
                out = Spec(name, _dtypes.by_name("F32") if spec.dtype.packed else spec.dtype,
                           tuple(reversed(spec.shape)))
            self._plan[out.name] = (spec, heads, flip)
            self.specs.append(out)
        self.metadata = {k: v for k, v in (source.metadata or {}).items() if k != CANONICAL_KEY}
        directory = record.get("directory")
        #: the Hugging Face directory the .apr was made from (its GGUF's general.name)
        self.hf_dir_name = directory if isinstance(directory, str) and directory else None

    def read(self, spec, scratch=None):
        """The tensor as the source held it: rows back in llama.cpp's rotary order,
        GPT-2's Conv1D weights back to ``[in, out]``."""
        original, heads, flip = self._plan[spec.name]
        value = self._source.read(original, scratch)
        if heads is not None:
            value = permute_rows(value, rope_rows(original.shape[0], heads))
        if flip:
            value = transpose_value(value, original)[0]
        return value

    def raw_range(self, spec):
        """The ``.apr``'s bytes of a tensor only renamed, else None."""
        original, heads, flip = self._plan[spec.name]
        if heads is not None or flip or not hasattr(self._source, "raw_range"):
            return None
        return self._source.raw_range(original)

    def tensors(self, wanted=None):
        for spec in self.specs:
            if wanted is None or spec.name in wanted:
                yield spec.name, self.read(spec)

    def close(self) -> None:
        self._source.close()

    def __getattr__(self, name):
        return getattr(self._source, name)


def restore_source_names(source):
    """An ``.apr`` source with a :data:`CANONICAL_KEY` record seen as the model it was
    made from (names, Q/K rows, GPT-2's Conv1D layout, metadata), so that converting it
    gives exactly what converting that model directly gives; any other source as it
    is.  A tensor the record does not name keeps its name (renamed or added since)."""
    record = (source.metadata or {}).get(CANONICAL_KEY)
    if getattr(source, "format", None) != "apr" or not isinstance(record, dict):
        return source
    return _Restored(source, record)


def _from_hf(source, files):
    arch = arch_for_config(files["config.json"])
    if arch is None:
        warnings.warn(f"config.json's model_type {files['config.json'].get('model_type')!r} has no llama.cpp "
                      "mapping in aprfast: names are kept and llama.cpp will not know the model",
                      ModelConversionWarning, stacklevel=4)
        return None
    return ModelConversion("hf-to-gguf", arch, source, files=files)


def _from_gguf(source, kv):
    arch = arch_for_gguf(kv)
    if arch is None:
        stated = kv.get("general.architecture")
        if stated is not None:
            warnings.warn(f"GGUF architecture {stated!r} has no Hugging Face mapping in aprfast: names are "
                          "kept and transformers will not load the result", ModelConversionWarning, stacklevel=4)
        return None
    return ModelConversion("gguf-to-hf", arch, source, kv=kv)


def write_side_files(files: dict, directory, *, force: bool, durable: bool = True, check_only: bool = False) -> None:
    """Write ``files`` (name -> JSON object, or bytes: tokenizer.model) in ``directory``, each atomically; an
    existing one is refused unless ``force``.  ``check_only``: only the refusal."""
    for name in files:
        path = os.path.join(directory, name)
        if os.path.lexists(path) and not force:
            raise DestinationExistsError(f"{name} exists beside the destination; pass force=True to replace it",
                                         path=path)
    if check_only:
        return
    os.makedirs(directory or ".", exist_ok=True)
    for name, doc in files.items():
        data = doc if isinstance(doc, bytes) else (json.dumps(doc, indent=2, ensure_ascii=False) + "\n").encode("utf-8")
        atomic = AtomicFile(os.path.join(directory, name), durable=durable)
        try:
            _write_all(atomic.fd, data)
            atomic.commit()
        except BaseException:
            atomic.abort()
            raise
