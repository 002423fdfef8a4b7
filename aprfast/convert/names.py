"""Tensor names from Hugging Face, GGUF (llama.cpp / whisper.cpp) and ONNX to the
canonical ``.apr`` names of seed 001 §10.8 and §13.5, for Whisper, LLaMA and BERT.

Each architecture is a table of rules ``canonical <- {naming: source pattern}``.  A
pattern is the name with placeholders: ``{n}`` a layer number, ``{w}`` ``weight`` or
``bias``, and an optional leading ``[model.]`` (Hugging Face's task models wrap the
base model in ``model.``/``bert.``).  Every canonical name also maps to itself, so an
already-canonical model passes through unchanged.  ONNX initializer names are first
normalised as :func:`aprfast.convert.onnx.normalise_name` does (``/encoder/conv1/weight``
-> ``encoder.conv1.weight``) and then read as Hugging Face names (a model exported by
``torch.onnx`` keeps its state-dict names).

:func:`detect_arch` finds the architecture from GGUF's ``general.architecture`` when
the metadata has it, else from the tensor names (the one detector: ``apr explain`` and
the quality score use it too).  :func:`map_names` maps a model's names and says which
it could not.  docs/FORMAT.md ("Tensor names") has the tables and the decisions.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .onnx import normalise_name

__all__ = ["ARCHS", "ARCHITECTURES", "NAMINGS", "NameMapping", "NameMappingWarning", "detect_arch", "map_names",
           "map_name", "rules"]

#: Architectures with a built-in mapper (``convert(arch=...)``).
ARCHS = ("whisper", "llama", "bert")
#: The namings a mapper reads, besides the canonical one ("apr").
NAMINGS = ("hf", "gguf", "onnx")

#: Architectures the detector recognises: id -> (display name, purpose).  GPT-2 is
#: recognised (``apr explain``) but has no mapper.
ARCHITECTURES = {
    "whisper": ("Whisper", "Automatic Speech Recognition (encoder-decoder transformer over Mel spectrograms)"),
    "llama": ("LLaMA", "Causal language model (decoder-only transformer)"),
    "bert": ("BERT", "Masked language model (encoder-only transformer)"),
    "gpt2": ("GPT-2", "Causal language model (decoder-only transformer)"),
}

_PARTS = ("encoder", "decoder")
_QKVO_HF = (("q", "q"), ("k", "k"), ("v", "v"), ("out", "out"))
_QKVO_OPENAI = (("q", "query"), ("k", "key"), ("v", "value"), ("out", "out"))


def _whisper():
    # HF's WhisperModel has no "model." prefix, WhisperForConditionalGeneration has it.
    # The GGUF naming is whisper.cpp's, which is OpenAI's checkpoint naming (seed §10.8
    # lists "GGUF encoder.conv1.weight" and "PyTorch encoder.conv1.weight").
    attention = [(f"{apr}_proj", openai) for (apr, _), (_, openai) in zip(_QKVO_HF, _QKVO_OPENAI)]
    per_layer = [("self_attn_layer_norm", "attn_ln"), ("fc1", "mlp.0"), ("fc2", "mlp.2"),
                 ("final_layer_norm", "mlp_ln")] + [(f"self_attn.{a}", f"attn.{o}") for a, o in attention]
    table = []
    for part in _PARTS:
        post_norm = "encoder.ln_post.{w}" if part == "encoder" else "decoder.ln.{w}"
        if part == "encoder":  # the audio stem: two 1-D convolutions over the Mel frames
            table += [(f"encoder.{conv}.{{w}}", f"[model.]encoder.{conv}.{{w}}", f"encoder.{conv}.{{w}}")
                      for conv in ("conv1", "conv2")]
        table += [(f"{part}.positional_embedding", f"[model.]{part}.embed_positions.weight",
                   f"{part}.positional_embedding"),
                  (f"{part}.layer_norm.{{w}}", f"[model.]{part}.layer_norm.{{w}}", post_norm)]
        table += [(f"{part}.layers.{{n}}.{apr}.{{w}}", f"[model.]{part}.layers.{{n}}.{apr}.{{w}}",
                   f"{part}.blocks.{{n}}.{openai}.{{w}}") for apr, openai in per_layer]
    cross = [("encoder_attn_layer_norm", "cross_attn_ln")] + [(f"encoder_attn.{a}", f"cross_attn.{o}")
                                                              for a, o in attention]
    table += [(f"decoder.layers.{{n}}.{apr}.{{w}}", f"[model.]decoder.layers.{{n}}.{apr}.{{w}}",
               f"decoder.blocks.{{n}}.{openai}.{{w}}") for apr, openai in cross]
    table += [
        ("decoder.token_embedding", "[model.]decoder.embed_tokens.weight", "decoder.token_embedding.weight"),
        # WhisperForConditionalGeneration's output projection (tied to the token embedding).
        ("proj_out.weight", "proj_out.weight", None),
    ]
    return [(apr, {"hf": hf, "gguf": gguf}) for apr, hf, gguf in table]


def _llama():
    table = [
        ("token_embedding", "[model.]embed_tokens.weight", "token_embd.weight"),
        ("norm.weight", "[model.]norm.weight", "output_norm.weight"),
        ("lm_head.weight", "lm_head.weight", "output.weight"),
        ("rope_freqs.weight", None, "rope_freqs.weight"),
        ("layers.{n}.attn_norm.weight", "[model.]layers.{n}.input_layernorm.weight", "blk.{n}.attn_norm.weight"),
        ("layers.{n}.mlp_norm.weight", "[model.]layers.{n}.post_attention_layernorm.weight", "blk.{n}.ffn_norm.weight"),
        ("layers.{n}.attn.rotary_emb.inv_freq", "[model.]layers.{n}.self_attn.rotary_emb.inv_freq", None),
        # Qwen3's per-head RMSNorms on the queries and keys
        ("layers.{n}.attn.q_norm.weight", "[model.]layers.{n}.self_attn.q_norm.weight", "blk.{n}.attn_q_norm.weight"),
        ("layers.{n}.attn.k_norm.weight", "[model.]layers.{n}.self_attn.k_norm.weight", "blk.{n}.attn_k_norm.weight"),
    ]
    for apr, hf, gguf in (("q", "q", "q"), ("k", "k", "k"), ("v", "v", "v"), ("out", "o", "output")):
        table.append((f"layers.{{n}}.attn.{apr}_proj.{{w}}", f"[model.]layers.{{n}}.self_attn.{hf}_proj.{{w}}",
                      f"blk.{{n}}.attn_{gguf}.{{w}}"))
    for part in ("gate", "up", "down"):
        table.append((f"layers.{{n}}.mlp.{part}_proj.{{w}}", f"[model.]layers.{{n}}.mlp.{part}_proj.{{w}}",
                      f"blk.{{n}}.ffn_{part}.{{w}}"))
    return [(apr, {"hf": hf, "gguf": gguf}) for apr, hf, gguf in table]


def _bert():
    # HF: BertModel has no prefix, the task models (BertForMaskedLM, ...) use "bert.";
    # TF-converted checkpoints name LayerNorm parameters gamma/beta.
    table = [
        ("token_embedding", "[bert.]embeddings.word_embeddings.weight", "token_embd.weight"),
        ("positional_embedding", "[bert.]embeddings.position_embeddings.weight", "position_embd.weight"),
        ("token_type_embedding", "[bert.]embeddings.token_type_embeddings.weight", "token_types.weight"),
        ("position_ids", "[bert.]embeddings.position_ids", None),
        ("embeddings.layer_norm.{w}", "[bert.]embeddings.LayerNorm.{w}", "token_embd_norm.{w}"),
        ("layers.{n}.attn.q_proj.{w}", "[bert.]encoder.layer.{n}.attention.self.query.{w}", "blk.{n}.attn_q.{w}"),
        ("layers.{n}.attn.k_proj.{w}", "[bert.]encoder.layer.{n}.attention.self.key.{w}", "blk.{n}.attn_k.{w}"),
        ("layers.{n}.attn.v_proj.{w}", "[bert.]encoder.layer.{n}.attention.self.value.{w}", "blk.{n}.attn_v.{w}"),
        ("layers.{n}.attn.out_proj.{w}", "[bert.]encoder.layer.{n}.attention.output.dense.{w}",
         "blk.{n}.attn_output.{w}"),
        ("layers.{n}.attn_layer_norm.{w}", "[bert.]encoder.layer.{n}.attention.output.LayerNorm.{w}",
         "blk.{n}.attn_output_norm.{w}"),
        ("layers.{n}.fc1.{w}", "[bert.]encoder.layer.{n}.intermediate.dense.{w}", "blk.{n}.ffn_up.{w}"),
        ("layers.{n}.fc2.{w}", "[bert.]encoder.layer.{n}.output.dense.{w}", "blk.{n}.ffn_down.{w}"),
        ("layers.{n}.final_layer_norm.{w}", "[bert.]encoder.layer.{n}.output.LayerNorm.{w}",
         "blk.{n}.layer_output_norm.{w}"),
        ("pooler.dense.{w}", "[bert.]pooler.dense.{w}", None),
        ("mlm.dense.{w}", "cls.predictions.transform.dense.{w}", None),
        ("mlm.layer_norm.{w}", "cls.predictions.transform.LayerNorm.{w}", None),
        ("mlm.decoder.{w}", "cls.predictions.decoder.{w}", None),
        ("mlm.bias", "cls.predictions.bias", None),
    ]
    out = [(apr, {"hf": hf, "gguf": gguf}) for apr, hf, gguf in table]
    for apr, sources in list(out):
        hf = sources["hf"]
        if hf and "LayerNorm.{w}" in hf:  # TF-era names: gamma/beta
            for old, new in (("gamma", "weight"), ("beta", "bias")):
                out.append((apr.replace("{w}", new), {"hf": hf.replace("{w}", old), "gguf": None}))
    return out


_TABLES = {"whisper": _whisper(), "llama": _llama(), "bert": _bert()}

_PLACEHOLDERS = {"{n}": r"(?P<n>\d+)", "{w}": r"(?P<w>weight|bias)"}
_OPTIONAL = re.compile(r"^\[([a-z]+\.)\]")


def _compile(pattern: str):
    """A source pattern as a regex: placeholders become groups, ``[model.]`` optional."""
    prefix = ""
    m = _OPTIONAL.match(pattern)
    if m:
        prefix = f"(?:{re.escape(m.group(1))})?"
        pattern = pattern[m.end():]
    parts = re.split(r"(\{[nw]\})", pattern)
    body = "".join(_PLACEHOLDERS[p] if p in _PLACEHOLDERS else re.escape(p) for p in parts)
    return re.compile(f"^{prefix}{body}$")


@dataclass(frozen=True)
class _Rule:
    canonical: str
    naming: str
    source: str
    regex: re.Pattern

    def apply(self, name: str):
        m = self.regex.match(name)
        if m is None:
            return None
        return self.canonical.format(**m.groupdict())


def _compiled(arch):
    out = []
    for canonical, sources in _TABLES[arch]:
        out.append(_Rule(canonical, "apr", canonical, _compile(canonical)))
        for naming, source in sources.items():
            if source is not None:
                out.append(_Rule(canonical, naming, source, _compile(source)))
    return tuple(out)


_RULES = {arch: _compiled(arch) for arch in ARCHS}


def rules(arch: str) -> list:
    """``(canonical, {naming: source pattern or None})`` of an architecture, in order:
    the mapping tables (docs/FORMAT.md prints them)."""
    return list(_TABLES[_check_arch(arch)])


def _check_arch(arch) -> str:
    if arch not in ARCHS:
        raise ValueError(f"arch={arch!r}: one of {', '.join(repr(a) for a in ARCHS)}, 'auto' or None")
    return arch


def map_name(arch: str, name: str):
    """``(canonical name, naming)`` for one source name under ``arch``, or ``(None,
    None)`` when no rule knows it.  ``naming`` is "apr" (already canonical), "hf",
    "gguf" or "onnx" (a name with "/" normalised, then read as Hugging Face's)."""
    key = normalise_name(name)
    for rule in _RULES[_check_arch(arch)]:
        canonical = rule.apply(key)
        if canonical is not None:
            return canonical, ("onnx" if key != name else rule.naming)
    return None, None


class NameMappingWarning(UserWarning):
    """``convert(arch=...)``: source names the mapper does not know (kept as they are),
    or a chosen architecture the names or metadata contradict."""


@dataclass
class NameMapping:
    """The result of :func:`map_names`: ``names`` source -> output name (unknown names
    map to themselves), ``unknown`` the names no rule knew, ``namings`` how many names
    each naming matched, ``detected`` whether ``arch`` came from ``arch="auto"``."""

    arch: str | None
    detected: bool = False
    names: dict = field(default_factory=dict)
    unknown: list = field(default_factory=list)
    namings: dict = field(default_factory=dict)
    reason: str | None = None

    def metadata(self) -> dict:
        """What the output records under ``aprfast.name_mapping``."""
        return {"arch": self.arch, "detected": self.detected, "namings": dict(sorted(self.namings.items())),
                "renamed": sum(1 for s, d in self.names.items() if s != d), "unknown": list(self.unknown)}


def map_names(names, arch, metadata=None) -> NameMapping:
    """Map every name of a model: ``arch`` is one of :data:`ARCHS`, "auto" (detected
    from ``metadata``'s ``general.architecture`` or the names; nothing is mapped when
    nothing is recognised) or None (nothing mapped).  Collisions are not checked here:
    :func:`aprfast.convert.convert` refuses them after ``rename=``."""
    names = list(names)
    detected = arch == "auto"
    reason = None
    if detected:
        arch, reason = _detect(names, metadata)
        if arch not in ARCHS:
            if arch is not None:
                reason = f"{ARCHITECTURES[arch][0]} has no built-in name mapper"
            return NameMapping(None, True, {n: n for n in names}, reason=reason)
    elif arch is None:
        return NameMapping(None, False, {n: n for n in names})
    else:
        _check_arch(arch)
    result = NameMapping(arch, detected, reason=reason)
    for name in names:
        canonical, naming = map_name(arch, name)
        if canonical is None:
            result.names[name] = name
            result.unknown.append(name)
            continue
        result.names[name] = canonical
        result.namings[naming] = result.namings.get(naming, 0) + 1
    return result


# --- detection -----------------------------------------------------------------------------
#: (arch, patterns that must all occur in the joined names), first match wins; one row
#: per naming (canonical, Hugging Face, GGUF).
_SIGNS = (
    ("whisper", (r"encoder\.conv1\.", r"decoder\.")),
    ("llama", (r"layers\.\d+\.self_attn\.q_proj", r"mlp\.")),
    ("llama", (r"(?m)^layers\.\d+\.attn\.q_proj\.", r"(?m)^layers\.\d+\.mlp\.gate_proj\.")),
    ("llama", (r"(?m)^blk\.\d+\.attn_q\.", r"(?m)^blk\.\d+\.ffn_gate\.")),
    ("bert", (r"encoder\.layer\.\d+\.attention",)),
    ("bert", (r"(?m)^token_type_embedding$", r"(?m)^layers\.\d+\.attn_layer_norm\.")),
    ("bert", (r"(?m)^token_types\.weight$", r"(?m)^blk\.\d+\.attn_output_norm\.")),
    ("gpt2", (r"\bh\.\d+\.attn\.c_attn",)),
    ("gpt2", (r"(?m)^layers\.\d+\.attn\.qkv_proj\.",)),  # the canonical names (convert.hf_arch)
)
#: GGUF ``general.architecture`` values that are one of ours.
_GGUF_ARCHS = {"whisper": "whisper", "llama": "llama", "bert": "bert", "gpt2": "gpt2"}


def detect_arch(names, metadata=None) -> str | None:
    """The architecture id (a key of :data:`ARCHITECTURES`) of a model, or None:
    GGUF's ``general.architecture`` when present, else the first row of tensor-name
    patterns that all occur."""
    return _detect(list(names), metadata)[0]


def _detect(names, metadata):
    stated = (metadata or {}).get("general.architecture")
    if isinstance(stated, str) and stated:
        found = _GGUF_ARCHS.get(stated.lower())
        if found is None:
            return None, f"general.architecture is {stated!r}, which has no built-in name mapper"
        return found, "from general.architecture"
    joined = "\n".join(normalise_name(n) for n in names)
    for arch, patterns in _SIGNS:
        if all(re.search(p, joined) for p in patterns):
            return arch, "from the tensor names"
    return None, "no architecture recognised from the tensor names"
