"""llama.cpp's named quantization mixes (``Q4_K_M``, ``Q5_K_M``, ``Q6_K``, ...): which
GGML type each tensor of a model gets.

A mix is one of llama.cpp's file types (``LLAMA_FTYPE_MOSTLY_*``, recorded in a GGUF
as ``general.file_type``).  ``llama-quantize`` does not give every tensor the mix's
base type: ``llama_tensor_get_type`` in ``src/llama-quant.cpp`` picks a type per
tensor from its name (GGUF names: ``token_embd``, ``blk.N.attn_v``, ``ffn_down``,
``output``, ...), its layer, its row length and a few hyper-parameters (grouped-query
attention, the number of experts, the 70B LLaMA).  :func:`mix_types` applies those
rules, written out here from llama.cpp 0.3.36's sources (docs/FORMAT.md, "K-quant
mixes", prints the table), without an importance matrix: the path ``llama-quantize``
takes when it is given none.

What the rules read, in the order llama.cpp reads it:

* which tensors may be quantized at all (``tensor_allows_quantization``): two or more
  dimensions, a name ending in ``weight``, not a norm, not a MoE router
  (``ffn_gate_inp``), not a positional or token-type embedding, and a few small
  tensors of other architectures;
* the tensors are visited in llama.cpp's order (those outside ``blk.N`` first, then
  block by block, names sorted within each): the ``attn_v`` and ``ffn_down`` counters
  that "use more bits" layers depend on count in that order;
* ``output.weight`` (and ``token_embd.weight`` when the model has no
  ``output.weight``: tied embeddings) gets Q6_K, or Q8_0 when its rows are not whole
  blocks of the base type;
* the per-category rules of ``llama_tensor_get_type_impl``;
* a type whose blocks do not divide the row length falls back (``tensor_type_fallback``):
  Q4_K to Q5_0, Q5_K to Q5_1, Q6_K to Q8_0, Q2_K/Q3_K/TQ1_0/TQ2_0 to Q4_0, IQ4_XS and
  IQ3_S to IQ4_NL, and to F16 when even 32 does not divide the row.  Q1_0 (blocks of 128)
  has no fallback: llama-quantize stops on such a tensor, and so does :func:`mix_types`.

MXFP4_MOE gives the 3-D expert tensors (more than one matrix along GGML's ``ne[2]``)
MXFP4 and every other quantizable tensor, output included, Q8_0.  IQ3_S and IQ3_M are
IQ3_S mixes (attn_v Q4_K at grouped-query factor 4 or more for IQ3_S, always for IQ3_M,
whose attn_output and first eighth of ffn_down are Q4_K too); Q1_0 gives every
quantizable tensor Q1_0 but output's Q6_K.  The file types that need an importance
matrix (Q2_K_S, IQ1_*, IQ2_*, IQ3_XXS, IQ3_XS), and NVFP4, which llama-quantize cannot
write, are refused by :func:`mix` with the reason (:data:`NOT_OFFERED`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import LayoutError

__all__ = ["Mix", "MIXES", "NOT_OFFERED", "MixParams", "mix", "mix_types", "mix_params", "quantizable"]


@dataclass(frozen=True)
class Mix:
    """One llama.cpp file type: ``name`` as ``llama-quantize`` spells it, ``ftype`` its
    ``LLAMA_FTYPE_MOSTLY_*`` number (``general.file_type``), ``base`` the GGML type most
    tensors get (``llama_ftype_get_default_type``)."""

    name: str
    ftype: int
    base: str

    @property
    def suffixed(self) -> bool:
        """A name that is not also a GGML type's (``Q4_K_M``, not ``Q6_K``)."""
        return self.name != self.base

    @property
    def types(self) -> tuple:
        """Every GGML type the rules may give a tensor of this mix (F16 aside), sorted."""
        found = {self.base, "Q8_0", *_EXTRA.get(self.name, ())}
        if self.base not in ("Q8_0", "MXFP4"):  # MXFP4_MOE's output is Q8_0
            found.add("Q6_K")
        found |= {_FALLBACK[t] for t in found if t in _FALLBACK}
        return tuple(sorted(found))

    def __repr__(self):
        return f"<llama.cpp mix {self.name} (file type {self.ftype}, base {self.base})>"


#: llama-quantize's names -> mixes.  ``Q3_K``, ``Q4_K`` and ``Q5_K`` are its aliases of
#: the _M mixes; here they stay GGML type names (see :func:`mix`).  The file types that
#: are not offered are in :data:`NOT_OFFERED`, each with the reason.
MIXES = {m.name: m for m in (
    Mix("Q4_0", 2, "Q4_0"), Mix("Q4_1", 3, "Q4_1"), Mix("Q8_0", 7, "Q8_0"), Mix("Q5_0", 8, "Q5_0"),
    Mix("Q5_1", 9, "Q5_1"), Mix("Q2_K", 10, "Q2_K"), Mix("Q3_K_S", 11, "Q3_K"), Mix("Q3_K_M", 12, "Q3_K"),
    Mix("Q3_K_L", 13, "Q3_K"), Mix("Q4_K_S", 14, "Q4_K"), Mix("Q4_K_M", 15, "Q4_K"), Mix("Q5_K_S", 16, "Q5_K"),
    Mix("Q5_K_M", 17, "Q5_K"), Mix("Q6_K", 18, "Q6_K"), Mix("IQ4_NL", 25, "IQ4_NL"), Mix("IQ4_XS", 30, "IQ4_XS"),
    Mix("TQ1_0", 36, "TQ1_0"), Mix("TQ2_0", 37, "TQ2_0"), Mix("MXFP4_MOE", 38, "MXFP4"),
    Mix("IQ3_S", 26, "IQ3_S"), Mix("IQ3_M", 27, "IQ3_S"), Mix("Q1_0", 40, "Q1_0"),
)}

_IMATRIX = ("needs an importance matrix: llama-quantize refuses it without one (tensor_requires_imatrix: "
            "its {types} tensors), and aprfast quantizes without one")
#: llama.cpp file types ``llama-quantize`` offers that aprfast does not, and why
#: (llama.cpp 0.3.36's ``llama_ftype_get_default_type`` and ``tensor_requires_imatrix``).
NOT_OFFERED = {
    "Q2_K_S": _IMATRIX.format(types="Q2_K"),
    "IQ2_XXS": _IMATRIX.format(types="IQ2_XXS"),
    "IQ2_XS": _IMATRIX.format(types="IQ2_XS"),
    "IQ2_S": _IMATRIX.format(types="IQ2_XS"),
    "IQ2_M": _IMATRIX.format(types="IQ2_S"),
    "IQ1_S": _IMATRIX.format(types="IQ1_S"),
    "IQ1_M": _IMATRIX.format(types="IQ1_M"),
    "IQ3_XXS": _IMATRIX.format(types="IQ3_XXS"),
    "IQ3_XS": _IMATRIX.format(types="IQ3_XXS attn_q/attn_k"),
    "NVFP4": "llama-quantize itself has no NVFP4 file type to write (llama_ftype_get_default_type refuses it)",
}


def mix(name, *, suffixed_only: bool = False):
    """The mix called ``name`` (case-insensitive), or None.  With ``suffixed_only`` only
    the names that are not GGML types too (``Q4_K_M`` yes, ``Q6_K`` no).

    Args:
        name: A mix name ("q4_k_m", "Q6_K") or a :class:`Mix`.
        suffixed_only: Answer None for names that are also GGML types.

    Returns:
        The :class:`Mix`, or None.

    Raises:
        LayoutError: ``name`` is a llama.cpp file type aprfast does not offer
            (:data:`NOT_OFFERED`, the reason in the message), unless it is also a GGML
            type name and ``suffixed_only`` asks for mixes alone.

    Examples:
        >>> from aprfast.numerics.mixes import mix
        >>> mix("q4_k_m")
        <llama.cpp mix Q4_K_M (file type 15, base Q4_K)>
        >>> mix("Q6_K", suffixed_only=True) is None
        True
    """
    if isinstance(name, Mix):
        return name
    if not isinstance(name, str):
        return None
    key = name.strip().upper()
    found = MIXES.get(key)
    if found is None and key in NOT_OFFERED and not (suffixed_only and key in _TYPE_NAMES):
        raise LayoutError(f"llama.cpp's {key} mix is not offered: {NOT_OFFERED[key]}")
    if found is not None and suffixed_only and not found.suffixed:
        return None
    return found


@dataclass(frozen=True)
class MixParams:
    """The hyper-parameters the rules read: ``arch`` (general.architecture), ``n_layer``
    (``block_count``), ``n_head``/``n_head_kv`` of the first layer (their ratio is the
    grouped-query factor), ``n_expert`` (0 for a dense model)."""

    arch: str = "llama"
    n_layer: int = 0
    n_head: int = 0
    n_head_kv: int = 0
    n_expert: int = 0

    @property
    def n_gqa(self) -> int:
        return self.n_head // self.n_head_kv if self.n_head_kv else 0

    @property
    def is_70b(self) -> bool:
        """llama.cpp's LLM_TYPE_70B (the one model size its rules name)."""
        if self.arch == "llama":
            return self.n_expert != 8 and self.n_layer == 80 and self.n_head != self.n_head_kv
        return (self.arch in ("qwen2", "deci", "olmo") and self.n_layer == 80) or \
            (self.arch == "jais2" and self.n_layer == 68)


def _first_int(value):
    if isinstance(value, list):  # per-layer arrays (head_count_kv of some models): layer 0
        value = value[0] if value else None
    return value if type(value) is int else None


def mix_params(metadata=None, config=None, names=()) -> MixParams:
    """:class:`MixParams` from GGUF keys (``metadata``: ``{arch}.block_count``,
    ``{arch}.attention.head_count(_kv)``, ``{arch}.expert_count``) or a Hugging Face
    ``config.json`` (``config``); the layer count from the names' ``blk.N`` when
    neither says.

    Args:
        metadata: A mapping of GGUF keys (a GGUF's, or an .apr's from one), or None.
        config: A config.json mapping, or None.
        names: The GGUF tensor names (the layer count's last resort).

    Returns:
        The :class:`MixParams`.

    Examples:
        >>> from aprfast.numerics.mixes import mix_params
        >>> p = mix_params({"general.architecture": "llama", "llama.block_count": 32,
        ...                 "llama.attention.head_count": 32, "llama.attention.head_count_kv": 8})
        >>> p.n_layer, p.n_gqa
        (32, 4)
    """
    metadata, config = metadata or {}, config or {}
    arch = metadata.get("general.architecture")
    if not isinstance(arch, str):
        model_type = config.get("model_type")
        arch = {"mistral": "llama"}.get(model_type, model_type) if isinstance(model_type, str) else "llama"
    n_layer = _first_int(metadata.get(f"{arch}.block_count")) or _first_int(config.get("num_hidden_layers"))
    n_head = _first_int(metadata.get(f"{arch}.attention.head_count")) or \
        _first_int(config.get("num_attention_heads")) or 0
    n_head_kv = _first_int(metadata.get(f"{arch}.attention.head_count_kv")) or \
        _first_int(config.get("num_key_value_heads")) or n_head
    n_expert = _first_int(metadata.get(f"{arch}.expert_count")) or _first_int(config.get("num_local_experts")) or \
        _first_int(config.get("num_experts")) or 0
    if not n_layer:
        layers = [int(m.group(1)) for m in map(_LAYER.match, names) if m]
        n_layer = max(layers) + 1 if layers else 0
    return MixParams(arch, n_layer, n_head, n_head_kv, n_expert if n_expert > 1 else 0)


# --- which tensors may be quantized ------------------------------------------------------
#: Substrings that keep a tensor as it is (llama.cpp's ``tensor_allows_quantization``;
#: the GLM5-next-only ones are left out).
_NEVER = ("_norm.weight", "ffn_gate_inp.weight", "ffn_gate_tid2eid.weight", "altup", "laurel",
          "per_layer_model_proj", "ssm_conv1d", "shortconv.conv.weight", "indexer.k_proj.weight",
          "indexer.q_proj.weight", "time_mix_first.weight", "time_mix_w0.weight", "time_mix_w1.weight",
          "time_mix_w2.weight", "time_mix_v0.weight", "time_mix_v1.weight", "time_mix_v2.weight",
          "time_mix_a0.weight", "time_mix_a1.weight", "time_mix_a2.weight", "time_mix_g1.weight",
          "time_mix_g2.weight", "time_mix_decay_w1.weight", "time_mix_decay_w2.weight",
          "time_mix_lerp_fused.weight", "attn_rel_b.weight", ".position_embd", "sam.pos_embd", "sam.neck.",
          "sam.net_", ".rel_pos", ".patch_embd", ".patch_merger", "a.rvq.codebook", "mm.a.code_embd")
#: Whole names kept (LLM_TN's position and token-type embeddings).
_NEVER_NAMES = ("position_embd.weight", "token_types.weight")


def quantizable(name: str, shape) -> bool:
    """Whether llama-quantize quantizes a tensor called ``name`` of ``shape`` at all.

    Args:
        name: The GGUF tensor name.
        shape: Its shape (any order: only the number of dimensions counts).

    Returns:
        True when the mixes give it a quantized type.

    Examples:
        >>> from aprfast.numerics.mixes import quantizable
        >>> quantizable("blk.0.attn_q.weight", (64, 64)), quantizable("blk.0.attn_norm.weight", (64,))
        (True, False)
    """
    if len(shape) < 2 or not name.endswith("weight") or name in _NEVER_NAMES:
        return False
    return not any(part in name for part in _NEVER)


# --- categories (llama.cpp's tensor_get_category) -----------------------------------------
_CATEGORIES = (("attn_qkv.weight", "qkv"), ("attn_kv_b.weight", "kv_b"), ("attn_v.weight", "v"),
               ("attn_k.weight", "k"), ("attn_q.weight", "q"), ("attn_output.weight", "o"),
               ("ffn_up", "up"), ("ffn_gate", "gate"), ("ffn_down", "down"))
_ATTN_V = ("v", "qkv", "kv_b")
_LAYER = re.compile(r"blk\.(\d+)\.")


def _category(name: str) -> str:
    if name == "output.weight":
        return "output"
    if name in ("token_embd.weight", "per_layer_token_embd.weight"):
        return "token_embd"
    for part, category in _CATEGORIES:
        if part in name:
            return category
    return "other"


def _layer_of(name: str) -> int:
    m = _LAYER.match(name)
    return int(m.group(1)) if m else -1


def _more_bits(i: int, n: int) -> bool:
    """llama.cpp's ``use_more_bits``: the first and last eighth of the layers and every
    third one between."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


#: Types a mix's rules use beyond its base, output's Q6_K and Q8_0 (70B, 8 experts).
_EXTRA = {"Q2_K": ("Q3_K", "Q4_K", "Q5_K"), "Q3_K_S": ("Q5_K",), "Q3_K_M": ("Q4_K", "Q5_K"),
          "Q3_K_L": ("Q4_K", "Q5_K"), "Q4_K_S": ("Q5_K",), "Q4_K_M": ("Q5_K",), "Q4_0": (), "Q4_1": (),
          "IQ4_NL": ("Q5_K",), "IQ4_XS": ("Q5_K",), "TQ1_0": ("Q4_K",), "TQ2_0": ("Q4_K",),
          "IQ3_S": ("Q4_K", "Q5_K"), "IQ3_M": ("Q4_K", "Q5_K")}
#: GGML block sizes of the types the rules name.
_BLOCK = {"Q4_0": 32, "Q4_1": 32, "Q5_0": 32, "Q5_1": 32, "Q8_0": 32, "Q2_K": 256, "Q3_K": 256, "Q4_K": 256,
          "Q5_K": 256, "Q6_K": 256, "IQ4_NL": 32, "IQ4_XS": 256, "TQ1_0": 256, "TQ2_0": 256, "MXFP4": 32,
          "IQ3_S": 256, "Q1_0": 128}
#: tensor_type_fallback: a 256-block type whose blocks do not divide the row (a 32-block
#: type that does not fit goes to F16; Q1_0 has none).
_FALLBACK = {"Q2_K": "Q4_0", "Q3_K": "Q4_0", "Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0", "IQ4_XS": "IQ4_NL",
             "IQ3_S": "IQ4_NL", "TQ1_0": "Q4_0", "TQ2_0": "Q4_0"}
#: Names of NOT_OFFERED that are GGML type names too.
_TYPE_NAMES = ("IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ1_S", "IQ1_M", "IQ3_XXS", "NVFP4")
#: 8-expert models: attn_output -> Q5_K for these mixes.
_MOE8_O = ("Q2_K", "Q3_K_S", "Q3_K_M", "Q4_K_S", "Q4_K_M", "IQ4_NL", "IQ4_XS", "IQ3_S", "IQ3_M")


class _State:
    """llama.cpp's ``quantize_state_impl`` counters."""

    def __init__(self, names, params: MixParams):
        self.n_attention_wv = sum(1 for n in names if _category(n) in _ATTN_V)
        self.tied = "output.weight" not in names
        self.n_layer = params.n_layer
        self.i_attention_wv = self.i_ffn_down = self.i_ffn_gate = self.i_ffn_up = 0


def _layer(state: _State, params: MixParams, counter: int, name: str):
    """(layer, layer count) as llama.cpp's ``layer_info``: the counter for dense models,
    the name's ``blk.N`` for MoE ones (their expert tensors are not in layer order)."""
    if max(1, params.n_expert) > 1:
        i = _layer_of(name)
        if not 0 <= i < state.n_layer:
            raise ValueError(f"tensor {name!r}: no layer in [0, {state.n_layer}) in its name")
        return i, state.n_layer
    return counter, state.n_layer


def _pick(m: Mix, state: _State, params: MixParams, name: str, shape: tuple, category: str) -> str:  # noqa: C901
    """``llama_tensor_get_type_impl`` for the mixes of :data:`MIXES` (no importance
    matrix, no overrides)."""
    ftype, arch, t, row = m.name, params.arch, m.base, shape[-1]
    falcon = arch == "falcon"
    if category == "output" or (state.tied and category == "token_embd"):
        if ftype == "MXFP4_MOE" or falcon or row % _BLOCK[t]:
            return "Q8_0"
        return t if t == "Q8_0" else "Q6_K"
    if ftype == "MXFP4_MOE":
        # expert tensors (GGML's ne[2] > 1: the third dimension from the row) -> MXFP4, the rest Q8_0;
        # BailingMoE3's 3-D MLA projections are not experts
        experts = len(shape) >= 3 and shape[-3] > 1
        if experts and (arch != "bailingmoe3" or category in ("up", "gate", "down")):
            return "MXFP4"
        return "Q8_0"
    if category == "token_embd":
        return "Q4_K" if ftype in ("TQ1_0", "TQ2_0") else t
    if category in _ATTN_V:
        if ftype == "Q2_K":
            t = "Q4_K" if params.n_gqa >= 4 else "Q3_K"
        elif ftype == "IQ3_S" and params.n_gqa >= 4:
            t = "Q4_K"
        elif ftype == "IQ3_M":
            t = "Q4_K"
        elif ftype == "Q3_K_M":
            t = "Q5_K" if state.i_attention_wv < 2 else "Q4_K"
        elif ftype == "Q3_K_L":
            t = "Q5_K"
        elif ftype in ("IQ4_NL", "IQ4_XS") and params.n_gqa >= 4:
            t = "Q5_K"
        elif ftype in ("Q4_K_M", "Q5_K_M") and _more_bits(state.i_attention_wv, state.n_attention_wv):
            t = "Q6_K"
        elif ftype == "Q4_K_S" and state.i_attention_wv < 4:
            t = "Q5_K"
        if params.is_70b and t in ("Q3_K", "Q4_K"):
            t = "Q5_K"
        if params.n_expert == 8:
            t = "Q8_0"
        state.i_attention_wv += 1
    elif category == "k":
        if params.n_expert == 8:
            t = "Q8_0"
    elif category == "down":
        i, n = _layer(state, params, state.i_ffn_down, name)
        if ftype == "Q2_K":
            t = "Q3_K"
        elif ftype == "Q3_K_M":
            t = "Q5_K" if i < n // 16 else ("Q4_K" if not falcon or _more_bits(i, n) else "Q3_K")
        elif ftype == "IQ3_M" and (i < n // 8 or (params.n_expert == 8 and _more_bits(i, n))):
            t = "Q4_K"
        elif ftype == "Q3_K_L":
            t = "Q4_K" if falcon else "Q5_K"
        elif ftype == "Q4_K_M":
            if falcon:
                t = "Q6_K" if i < n // 16 else ("Q5_K" if _more_bits(i, n) else "Q4_K")
            elif _more_bits(i, n):
                t = "Q6_K"
        elif ftype in ("IQ4_NL", "IQ4_XS") and i < n // 8:  # (llama.cpp: without an importance matrix)
            t = "Q5_K"
        elif ftype == "Q5_K_M" and _more_bits(i, n):
            t = "Q6_K"
        elif ftype == "Q4_K_S" and not falcon and i < n // 8:
            t = "Q5_K"
        state.i_ffn_down += 1
    elif category == "o":
        if not falcon:
            if params.n_expert == 8:
                if ftype in _MOE8_O:
                    t = "Q5_K"
            elif ftype == "Q2_K":
                t = "Q3_K"
            elif ftype == "Q3_K_M":
                t = "Q4_K"
            elif ftype == "Q3_K_L":
                t = "Q5_K"
            elif ftype == "IQ3_M":
                t = "Q4_K"
        elif ftype == "Q3_K_L":
            t = "Q4_K"
    elif category == "gate":
        _layer(state, params, state.i_ffn_gate, name)
        state.i_ffn_gate += 1
    elif category == "up":
        _layer(state, params, state.i_ffn_up, name)
        state.i_ffn_up += 1
    return t


def _fallback(t: str, row: int, name: str) -> str:
    if row % _BLOCK[t] == 0:
        return t
    if t == "Q1_0":  # llama-quantize: "no tensor type fallback is defined for type q1_0"
        raise LayoutError(f"tensor {name!r}: rows of {row} are not whole Q1_0 blocks of 128, and llama-quantize "
                          "has no fallback type for Q1_0 (it stops there too)")
    t = _FALLBACK.get(t, t)
    return t if row % _BLOCK[t] == 0 else "F16"


def _order(name: str):
    """llama.cpp's ``weight_name_comparer``: tensors outside blocks first, then by block,
    then by name."""
    return (_layer_of(name), name)


def mix_types(m, tensors, params: MixParams | None = None) -> dict:
    """The GGML type ``llama-quantize`` gives each tensor for mix ``m``.

    ``tensors`` are ``(name, shape)`` pairs of the whole model, with GGUF names and the
    row (the fastest-varying dimension, GGML's ``ne[0]``) last, as NumPy and aprfast
    write shapes.  Every tensor must be there: the rules count ``attn_v`` tensors and
    look for ``output.weight``.

    Args:
        m: A :class:`Mix` or a mix name ("Q4_K_M").
        tensors: ``(name, shape)`` pairs.
        params: The model's :class:`MixParams` (default: the layer count from the names).

    Returns:
        ``{name: type}``: a GGML type name ("Q4_K", "Q6_K", "Q5_0", "F16", ...) for each
        tensor llama-quantize quantizes, None for those it keeps as they are.

    Raises:
        ValueError: ``m`` is not a mix, or a MoE tensor's name has no layer.
        LayoutError: a tensor's rows are not whole blocks of Q1_0 under the Q1_0 mix
            (llama-quantize has no fallback for it).

    Examples:
        >>> from aprfast.numerics.mixes import mix_types
        >>> tensors = [("token_embd.weight", (32, 256)), ("output.weight", (32, 256))]
        >>> tensors += [(f"blk.{i}.{t}.weight", (256, 256)) for i in range(8) for t in ("attn_v", "ffn_down")]
        >>> tensors += [("blk.0.attn_norm.weight", (256,))]
        >>> types = mix_types("Q4_K_M", tensors)
        >>> types["output.weight"], types["blk.0.attn_v.weight"], types["blk.1.attn_v.weight"]
        ('Q6_K', 'Q6_K', 'Q4_K')
        >>> types["blk.0.attn_norm.weight"] is None
        True
    """
    found = mix(m)
    if found is None:
        raise ValueError(f"{m!r} is not a llama.cpp mix; one of {', '.join(MIXES)}")
    tensors = [(name, tuple(shape)) for name, shape in tensors]
    names = [name for name, _ in tensors]
    if params is None:
        params = mix_params(names=names)
    state = _State(names, params)
    out = {}
    for name, shape in sorted(tensors, key=lambda item: _order(item[0])):
        if not quantizable(name, shape):
            out[name] = None
            continue
        out[name] = _fallback(_pick(found, state, params, name, shape, _category(name)), shape[-1], name)
    return {name: out[name] for name in names}
