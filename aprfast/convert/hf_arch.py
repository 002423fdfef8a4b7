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

from ..errors import CorruptError, LayoutError
from ..io.atomic import AtomicFile
from ..tensors import RawTensor
from ._common import DestinationExistsError
from .gguf import TYPES_KEY, gguf_metadata
from .safetensors import _write_all
from .tokenizer import _read_json

__all__ = ["ARCHS", "TENSORS", "HFArch", "ModelConversionWarning", "arch_for_config", "arch_for_gguf",
           "read_model_dir", "hf_to_gguf_name", "gguf_to_hf_name", "rope_rows", "permute_rows", "gguf_keys",
           "gguf_tensor_dtype", "file_type", "hf_files", "PRE_TOKENIZER_REGEX", "HF_CONFIG_KEY", "llama_cpp_names"]


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
    only)."""

    model_type: str
    gguf: str
    hf_class: str
    pre: str
    permute: bool
    llama_keys: bool


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

_PLACEHOLDERS = {"{n}": r"(?P<n>\d+)", "{w}": r"(?P<w>weight|bias)"}


def _regex(pattern: str):
    parts = re.split(r"(\{[nw]\})", pattern)
    return re.compile("^" + "".join(_PLACEHOLDERS.get(p, re.escape(p)) for p in parts) + "$")


_HF_TO_GGUF = [(_regex(hf), gguf) for hf, gguf in TENSORS]
_GGUF_TO_HF = [(_regex(gguf), hf) for hf, gguf in TENSORS if gguf is not None]
_UNKNOWN = object()


def _apply(rules, name):
    for regex, target in rules:
        m = regex.match(name)
        if m is not None:
            return None if target is None else target.format(**m.groupdict())
    return _UNKNOWN


def hf_to_gguf_name(name: str):
    """llama.cpp's name for a Hugging Face tensor name: a str, None (dropped) or
    ``...`` (no rule knows it)."""
    out = _apply(_HF_TO_GGUF, name)
    return ... if out is _UNKNOWN else out


def gguf_to_hf_name(name: str):
    """Hugging Face's name for a llama.cpp tensor name, or ``...`` (no rule knows it)."""
    out = _apply(_GGUF_TO_HF, name)
    return ... if out is _UNKNOWN else out


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
    required to be a JSON object; ``chat_template.jinja`` as text when there is one."""
    out = {}
    for name in _MODEL_FILES:
        path = os.path.join(directory, name)
        if os.path.isfile(path):
            doc = _read_json(path)
            if not isinstance(doc, dict):
                raise CorruptError(f"{name} is not a JSON object", path=path)
            out[name] = doc
    template = os.path.join(directory, "chat_template.jinja")
    if os.path.isfile(template) and os.path.getsize(template) < (4 << 20):
        with open(template, encoding="utf-8") as f:
            out["chat_template.jinja"] = f.read()
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
    elif rope_type not in (None, "default"):
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
    ``_set_vocab_gpt2`` and gguf-py's ``SpecialVocab`` write them.  Other tokenizers
    (SentencePiece ``tokenizer.model``, WordPiece, Unigram) are not converted yet:
    warned, and the GGUF has no vocabulary."""
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


def _special_keys(tokenizer, tok_config, config, added, files) -> list:
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
        if type(found) is int and found >= 0:
            ids.setdefault(typ, found)
    for typ, _ in _SPECIAL_KEYS:
        value = config.get(f"{typ}_token_id")
        if type(value) is int and value >= 0:
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
              "Q4_K": 15, "Q5_K": 17, "Q6_K": 18, "BF16": 32, "TQ1_0": 36, "TQ2_0": 37, "MXFP4": 38}


def file_type(specs) -> int:
    """general.file_type of the tensors ``specs``: ALL_F32 (0) when every tensor is F32,
    else that of the most common type among the 2-D weights (the reference converter's
    ``--outtype``), F16 (1) when that type has no file type."""
    types = [s.dtype.name for s in specs if len(s.shape) == 2 and s.name.endswith(".weight")]
    if all(s.dtype.name == "F32" for s in specs) or not types:
        return 0
    common = max(sorted(set(types)), key=types.count)
    return FILE_TYPES.get(common, 1)


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
    CPU kernels take only F32 there)."""
    if dtype_name not in ("F16", "BF16", "F64", "F32"):
        return None
    if len(shape) <= 1 or gguf_name.endswith("_norm.weight") or not gguf_name.endswith(".weight"):
        return "F32"
    return "F32" if dtype_name == "F64" else None


# --- GGUF -> Hugging Face ----------------------------------------------------------
def _kv_int(kv, key):
    value = kv.get(key)
    return value if type(value) is int else None


def _kv_float(kv, key):
    value = kv.get(key)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def hf_files(arch: HFArch, kv: dict, specs, dtype: str) -> dict:
    """``{"config.json": ..., "generation_config.json": ..., "tokenizer.json": ...,
    "tokenizer_config.json": ...}`` for a GGUF of ``arch`` (its keys ``kv``, its output
    tensors ``specs`` with Hugging Face names): the config the GGUF recorded under
    :data:`HF_CONFIG_KEY` when it has one, else one built from its keys; the tokenizer
    files only when the GGUF holds a byte-level BPE vocabulary."""
    names = {s.name for s in specs}
    stored = kv.get(HF_CONFIG_KEY)
    config = None
    if isinstance(stored, str):
        try:
            config = json.loads(stored)
        except ValueError:
            config = None
    if not isinstance(config, dict):
        config = _config_from_keys(arch, kv, names)
    config["tie_word_embeddings"] = "lm_head.weight" not in names
    config["dtype"] = {"F16": "float16", "BF16": "bfloat16"}.get(dtype, "float32")
    config.pop("torch_dtype", None)
    out = {"config.json": config}
    generation = {"_from_model_config": True}
    for which in ("bos", "eos"):
        if f"{which}_token_id" in config:
            generation[f"{which}_token_id"] = config[f"{which}_token_id"]
    out["generation_config.json"] = generation
    out.update(_hf_tokenizer(arch, kv))
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


# --- the conversion plan -----------------------------------------------------------
#: Files a Hugging Face destination gets beside its weights.
SIDE_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json")


class ModelConversion:
    """What a model conversion does on top of the container one: ``direction`` is
    "hf-to-gguf" or "gguf-to-hf"; :meth:`name` the destination's name of a source
    tensor (None: dropped), ``rows`` the row order of each source tensor whose rows
    move (the rotary permutation), :meth:`out_dtype` the dtype an engine needs,
    :meth:`metadata` the destination's metadata once the output tensors are known,
    :meth:`finish` the side files of a Hugging Face directory."""

    def __init__(self, direction: str, arch: HFArch, source, files: dict | None = None, kv: dict | None = None):
        self.direction, self.arch, self.files = direction, arch, files or {}
        self.unknown, self.rows = [], {}
        self._kv = kv or {}
        self._source_path = source.path
        to_dest = hf_to_gguf_name if direction == "hf-to-gguf" else gguf_to_hf_name
        self._names = {}
        for spec in source.specs:
            out = to_dest(spec.name)
            if out is ...:
                self.unknown.append(spec.name)
                out = spec.name
            self._names[spec.name] = out
        if self.unknown:
            shown = ", ".join(repr(n) for n in self.unknown[:5]) + (", ..." if len(self.unknown) > 5 else "")
            warnings.warn(f"{len(self.unknown)} tensor name(s) of this {arch.model_type} model have no "
                          f"{'llama.cpp' if direction == 'hf-to-gguf' else 'Hugging Face'} name, kept as they are "
                          f"(the engine will not use them): {shown}", ModelConversionWarning, stacklevel=4)
        if arch.permute:
            self._plan_rows(source.specs)

    def _heads(self):
        if self.direction == "hf-to-gguf":
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
        n_head, n_kv = self._heads()
        for spec in specs:
            gguf_name = self._names[spec.name] if self.direction == "hf-to-gguf" else spec.name
            m = re.match(r"^blk\.\d+\.attn_([qk])\.(weight|bias)$", gguf_name or "")
            if m is None or not spec.shape:
                continue
            order = rope_rows(spec.shape[0], n_head if m.group(1) == "q" else n_kv)
            self.rows[spec.name] = order if self.direction == "hf-to-gguf" else np.argsort(order)

    def report(self) -> dict:
        """What ``convert()`` returns under ``names``: ``arch`` (general.architecture),
        ``model`` (config.json's model_type), ``direction``, ``renamed``, ``dropped``,
        ``unknown`` (kept) and ``permuted`` (source tensors whose rows moved)."""
        return {"arch": self.arch.gguf, "model": self.arch.model_type, "direction": self.direction,
                "detected": True, "reason": "from config.json" if self.direction == "hf-to-gguf"
                else "from general.architecture",
                "renamed": sum(1 for s, d in self._names.items() if d is not None and s != d),
                "dropped": sorted(s for s, d in self._names.items() if d is None),
                "unknown": list(self.unknown), "permuted": sorted(self.rows)}

    def name(self, source_name: str):
        """The destination name of a source tensor (None: the engines recompute it)."""
        return self._names.get(source_name, source_name)

    def out_dtype(self, name: str, shape, dtype_name: str, packed: bool):
        """The dtype name an engine needs for output tensor ``name``, or None to keep."""
        if self.direction == "hf-to-gguf":
            return gguf_tensor_dtype(name, shape, dtype_name)
        return "F32" if packed else None  # transformers cannot load GGML blocks

    def metadata(self, specs) -> dict:
        """The destination's metadata: typed GGUF keys (``gguf.kv_types`` holds their
        types, which the GGUF writer honours) or safetensors' ``{"format": "pt"}``."""
        if self.direction == "gguf-to-hf":
            return {"format": "pt"}
        name = self.files["config.json"].get("_name_or_path")
        if not isinstance(name, str) or not name:
            name = os.path.basename(os.path.dirname(os.path.abspath(self._source_path))) or self.arch.model_type
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
        return hf_files(self.arch, self._kv, specs, dtype)


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
    """The model files beside a safetensors source, or None when it has no config.json."""
    if getattr(source, "format", None) not in ("safetensors", "safetensors-sharded"):
        return None
    directory = os.path.dirname(os.path.abspath(source.path))
    if not os.path.isfile(os.path.join(directory, "config.json")):
        return None
    return read_model_dir(directory)


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
    a container conversion (not Hugging Face <-> GGUF, or an architecture with no
    table: warned when the source says what it is).  An .apr source converts as the
    model it was made from: a Hugging Face one (:data:`HF_FILES_KEY`) to GGUF, a GGUF
    one (its ``gguf.kv_types``) to Hugging Face."""
    fmt = getattr(source, "format", None)
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
    """Write ``files`` (name -> JSON object) in ``directory``, each atomically; an
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
        data = (json.dumps(doc, indent=2, ensure_ascii=False) + "\n").encode("utf-8")
        atomic = AtomicFile(os.path.join(directory, name), durable=durable)
        try:
            _write_all(atomic.fd, data)
            atomic.commit()
        except BaseException:
            atomic.abort()
            raise
