"""The 100-point quality assessment of seed 001 §11, as far as one file can decide it.

:func:`quality_report` opens a file and scores each of the checklist's 100 claims as
``PASS``, ``FAIL`` or ``N/A``.  A claim is N/A when this file cannot decide it: it needs
an inference runtime (the trace items of §11 B), a reference model, the network, another
machine, or it is a property of the tool rather than of a file (most of §11 C and D, which
aprfast's own test suite covers), or the file has nothing it applies to (no LayerNorm,
no quantized tensor, no ``n_vocab``).  N/A items are left out of the denominator and
never counted as passed: ``score = round(100 * passed / applicable)``.

:func:`shape_checks` is ``apr validate --shapes``: metadata sizes (``n_vocab``,
``hidden_size``, ``n_mels``, context lengths) against the dimensions of the tensors
that carry them.  Statistics come from :func:`aprfast.stats.tensor_stats` only.
``apr qa`` and ``apr validate`` print these reports (docs/cli/reference.md).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import os
import re
import time

import numpy as np

from ..errors import AprError, AprIOError, ChecksumError, DecryptError, SignatureError
from ..io.progress import progress_to
from ..numerics.expectations import check_expected, expectation_for
from ..numerics.stats import tensor_stats

__all__ = ["quality_report", "shape_checks", "grade", "CATEGORIES"]

CATEGORIES = {"A": "Format & Structural Integrity", "B": "Tensor Physics & Statistics",
              "C": "Tooling & Operations", "D": "Conversion & Interoperability"}

PASS, FAIL, NA = "PASS", "FAIL", "N/A"

#: §11 #16: metadata above this is a "huge header".
HUGE_METADATA = 100 * 1024 * 1024
#: §11 #51 / QA #51: `apr inspect` of any file under 100 ms.
INSPECT_BUDGET_S = 0.1
MAX_DIMS = 8
FP16_MAX = 65504.0

# Metadata keys (aprender's, Hugging Face's and whisper.cpp's spellings) and the tensors
# whose dimension must equal them: (keys, tensor name globs, dim index, item number).
_SHAPE_RULES = (
    (("n_vocab", "vocab_size", "tokenizer.vocab_size"),
     ("*embed_tokens.weight", "*token_embedding*", "*tok_embeddings.weight", "*wte.weight", "lm_head.weight",
      "output.weight"), 0, 33),
    (("hidden_size", "n_embd", "d_model", "dim"), ("*embed_tokens.weight", "*tok_embeddings.weight",
                                                   "*wte.weight"), -1, 32),
    (("n_text_state",), ("decoder.token_embedding*",), -1, 32),
    (("n_audio_state",), ("encoder.positional_embedding*",), -1, 32),
    (("n_mels", "num_mel_bins"), ("encoder.conv1.weight",), 1, 48),
    (("n_mels", "num_mel_bins"), ("*mel_filters*", "*filterbank*"), 0, 48),
    (("n_ctx", "max_position_embeddings", "n_positions"), ("*wpe.weight", "*embed_positions.weight",
                                                           "*position_embedding*"), 0, 38),
    (("n_audio_ctx",), ("encoder.positional_embedding*", "encoder.embed_positions.weight"), 0, 38),
    (("n_text_ctx",), ("decoder.positional_embedding*", "decoder.embed_positions.weight"), 0, 49),
)

#: Where a vocabulary and its size are stored: seed 001 §5.2's embedded tokenizer first.
VOCAB_KEYS = ("tokenizer.vocabulary", "vocabulary", "vocab", "tokenizer.vocab")
VOCAB_SIZE_KEYS = ("tokenizer.vocab_size", "n_vocab", "vocab_size")

_RUNTIME = "needs an inference runtime (a trace of a forward pass)"
_TOOL = "a property of the tool, not of one file (aprfast's test suite checks it)"


def grade(score: int) -> str:
    """The word for a score: EXCELLENT (90+), GOOD (75+), FAIR (50+) or POOR.

    Args:
        score: 0-100.

    Returns:
        The grade.

    Examples:
        >>> from aprfast.tools.quality import grade
        >>> grade(95), grade(80), grade(60), grade(10)
        ('EXCELLENT', 'GOOD', 'FAIR', 'POOR')
    """
    if score >= 90:
        return "EXCELLENT"
    if score >= 75:
        return "GOOD"
    if score >= 50:
        return "FAIR"
    return "POOR"


# --- shapes ----------------------------------------------------------------------------
def shape_checks(metadata, infos) -> list:
    """One ``{"key", "value", "tensor", "dim", "actual", "status", "item"}`` per metadata
    size that names a tensor dimension present in the file (nothing for the others).
    A v1 container's sizes are read from its ``custom``/``hyperparameters`` tables.

    Args:
        metadata: The file's metadata dict.
        infos: The :class:`aprfast.TensorInfo` of its tensors.

    Returns:
        A list of dicts, ``status`` PASS or FAIL each, ``item`` the §11 item number.

    Examples:
        >>> import numpy as np, aprfast
        >>> from aprfast.tools.quality import shape_checks
        >>> blob = aprfast.save({"model.embed_tokens.weight": np.zeros((16, 4), np.float32)})
        >>> with aprfast.open(blob) as f:
        ...     checks = shape_checks({"vocab_size": 32}, [f.info(n) for n in f.keys()])
        >>> [(c["key"], c["value"], c["actual"], c["status"]) for c in checks]
        [('vocab_size', 32, 16, 'FAIL')]
    """
    out = []
    metadata = _flat_metadata(metadata)
    for keys, globs, dim, item in _SHAPE_RULES:
        key = next((k for k in keys if _is_size(metadata.get(k))), None)
        if key is None:
            continue
        for info in infos:
            if not any(fnmatch.fnmatchcase(info.name, g) for g in globs) or len(info.shape) <= max(dim, -dim - 1):
                continue
            actual = info.shape[dim]
            out.append({"key": key, "value": metadata[key], "tensor": info.name, "dim": dim, "actual": actual,
                        "status": PASS if actual == metadata[key] else FAIL, "item": item})
    return out


def _is_size(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


# --- what the items read ---------------------------------------------------------------
class _Facts:
    """Everything the items look at, read once: header, metadata, index, the padding
    between tensors and each tensor's statistics."""

    def __init__(self, f, path, threads, keys, progress=None):
        self.f, self.path, self.keys = f, path, keys
        self.layout = getattr(f, "layout", "v1")
        self.header = dict(getattr(f, "header", {}) or {})
        self.metadata = _flat_metadata(f.metadata or {})
        self.names = list(f.keys())
        self.infos = [f.info(n) for n in self.names]
        self.size = os.path.getsize(path)
        # compressed-tensors weights (issue 27 item 5) are judged by their values, under
        # their module's weight name (M.weight_packed -> M.weight) and logical shape
        self.records = dict(getattr(f, "compressed_weights", None) or {})
        self.broken, self.logical = {}, {}
        self.stats, self.unscored = self._statistics(threads, progress)
        self.shapes = shape_checks(self.metadata, [self._as_values(i) for i in self.infos])

    def _as_values(self, info):
        if info.name not in self.logical:
            return info
        return dataclasses.replace(info, name=self.role_name(info.name), shape=tuple(self.logical[info.name]))

    def role_name(self, name: str) -> str:
        """The name a tensor's §10.9 role and shape rules see: a compressed-tensors
        weight's module weight name."""
        if name in self.logical and name.endswith(".weight_packed"):
            return name[:-len("_packed")]
        return name

    def _value(self, name):
        if name in self.records:
            try:
                value = self.f.get_tensor(name, dequantize=True)
                self.logical[name] = value.shape
                return value
            except AprError as exc:  # judged as stored; item 21 names it
                self.broken[name] = f"[{exc.code}] {exc.message}"
        return self.f.get_tensor(name)

    def _statistics(self, threads, progress):
        stats, unscored = {}, []
        total = sum(i.nbytes for i in self.infos)
        done = 0
        with progress_to(progress, f"aprfast quality {os.path.basename(self.path)}") as update:
            for name, info in zip(self.names, self.infos):
                try:
                    stats[name] = tensor_stats(self._value(name), threads=threads)
                except TypeError:  # complex or unknown dtype: no statistics
                    unscored.append(name)
                done += info.nbytes
                if update is not None:
                    update(done, total)
        return stats, unscored

    @property
    def v2(self) -> bool:
        return self.layout in ("apr2", "aprender")

    def matching(self, role_prefix):
        """(name, stats, verdict) of tensors whose §10.9 role starts with ``role_prefix``."""
        out = []
        for name, s in self.stats.items():
            rule = expectation_for(self.role_name(name))
            if rule is not None and rule.role.startswith(role_prefix):
                out.append((name, s, check_expected(self.role_name(name), s)))
        return out


def _flat_metadata(metadata) -> dict:
    """The metadata with aprender's v1 ``custom`` and ``hyperparameters`` tables merged
    in (a v1 container's typed Metadata keeps model sizes there); top-level keys win."""
    flat = {}
    for table in ("hyperparameters", "custom"):
        if isinstance(metadata.get(table), dict):
            flat.update(metadata[table])
    flat.update(metadata)
    return flat


def _result(failures, what) -> tuple:
    if failures:
        return FAIL, f"{len(failures)} {what}: {', '.join(map(str, failures[:8]))}"
    return PASS, None


# --- A. format & structural integrity ---------------------------------------------------
def _a1_magic(x):
    return PASS, f"magic {x.header.get('magic', 'APRN')!r}"


def _a2_header(x):
    if not x.v2:
        return NA, "v1 container: no section offsets"
    h = x.header
    index_at = h.get("index_offset", h.get("tensor_index_offset"))
    meta_at, meta_size, data_at = h.get("metadata_offset"), h.get("metadata_size", 0), h.get("data_offset")
    fixed = {"apr2": 32, "aprender": 64}[x.layout]
    if None in (meta_at, index_at, data_at):
        return FAIL, f"section offsets missing: metadata {meta_at}, index {index_at}, data {data_at}"
    if meta_at < fixed or index_at < fixed:
        return FAIL, f"metadata at {meta_at}, index at {index_at}: inside the {fixed}-byte header"
    # metadata then index is how every writer lays them out; a file saved with room for
    # edits (reserve=) may hold them the other way round after aprfast.edit, never overlapping
    index_end = index_at + h.get("index_size", 0)
    if meta_at + meta_size > data_at or index_at > data_at or index_end > data_at:
        return FAIL, f"metadata [{meta_at}, +{meta_size}) or index at {index_at} lies past the data at {data_at}"
    if meta_at < index_at < meta_at + meta_size or (index_at <= meta_at < index_end):
        return FAIL, f"metadata [{meta_at}, +{meta_size}) and index at {index_at} overlap"
    if meta_at == fixed and meta_at + meta_size <= index_at:
        return PASS, f"{fixed}-byte header, sections in order"
    return PASS, f"{fixed}-byte header, metadata at {meta_at} and index at {index_at} (room for in-place edits)"


def _a4_checksum(x):
    try:
        x.f.verify()
    except (ChecksumError, SignatureError, DecryptError) as exc:
        return FAIL, f"[{exc.code}] {exc.message}"
    return PASS, "CRC32 matches"


def _a6_alignment(x):
    unaligned = [i.name for i in x.infos if i.nbytes and i.offset % 64]
    return _result(unaligned, "tensor(s) not aligned to 64 bytes") if x.v2 else (NA, "v1: one payload")


def _a7_sorted(x):
    keys = [n.encode() for n in x.names]
    return _result([] if keys == sorted(keys) else ["index"], "unsorted index")


def _a8_compression(x):
    names = " ".join(x.header.get("flag_names", ()))
    if "COMPRESS" not in names and str(x.header.get("compression_name")).lower() in ("none", ""):
        return NA, "not compressed"
    return PASS, "compression read"


def _a11_flags(x):
    if not x.v2:
        return NA, "v1 flags are checked when the header is read"
    from ..layouts import apr2, aprender

    known = sum((apr2 if x.layout == "apr2" else aprender).FLAGS.values())
    undefined = x.header.get("flags", 0) & ~known
    return (FAIL, f"undefined flag bits {undefined:#x}") if undefined else (PASS, None)


def _a12_footer(x):
    return (PASS, "footer read at open") if x.layout == "apr2" else (NA, f"the {x.layout} layout has no footer")


def _a13_size(x):
    stated = x.header.get("file_size")
    if stated is None:
        return NA, "the header states no file size"
    return (PASS, None) if stated == x.size else (FAIL, f"header says {stated} bytes, file has {x.size}")


def _a14_offsets(x):
    start = x.header.get("data_offset", 0)
    bad = [i.name for i in x.infos if i.offset < start or i.end > x.size]
    return _result(bad, "tensor(s) outside the data section") if x.v2 else (NA, "v1: one payload")


def _a15_empty(x):
    return (PASS, "0 tensors, read") if not x.names else (NA, "the file has tensors")


def _a16_metadata(x):
    size = x.header.get("metadata_size", 0)
    return (PASS, None) if size <= HUGE_METADATA else (FAIL, f"metadata is {size} bytes")


def _a18_unique(x):
    return _result([] if len(set(x.names)) == len(x.names) else ["index"], "duplicate names")


def _a19_dims(x):
    return _result([i.name for i in x.infos if len(i.shape) > MAX_DIMS], "tensor(s) with more than 8 dims")


def _a20_scalar(x):
    return (PASS, "0-d tensors read") if any(not i.shape for i in x.infos) else (NA, "no 0-d tensor")


def _a21_dtypes(x):
    return _result([f"{i.name} ({i.dtype_name})" for i in x.infos if i.dtype is None]
                   + [f"{n} (compressed-tensors values: {why})" for n, why in x.broken.items()],
                   "unknown dtype id(s) or undecodable compressed-tensors weight(s)")


def _a22_padding(x):
    if not x.v2:
        return NA, "v1: one payload"
    extents = sorted({(i.offset, i.end) for i in x.infos if i.nbytes})
    with open(x.path, "rb") as fh:
        dirty = [end for (_, end), (start, _) in zip(extents, extents[1:])
                 if start > end and _has_nonzero(fh, end, start - end)]
    return _result(dirty, "non-zero padding gap(s) at offset")


def _has_nonzero(fh, offset, size, chunk=1 << 20) -> bool:
    """Any non-zero byte in ``size`` bytes at ``offset``, read in bounded chunks (a
    hostile index can leave a gap as large as the file)."""
    fh.seek(offset)
    while size > 0:
        data = fh.read(min(size, chunk))
        if not data:
            return False
        if data.strip(b"\0"):
            return True
        size -= len(data)
    return False


def _a23_signature(x):
    if "SIGNED" not in x.header.get("flag_names", ()) and not getattr(x.f, "signer", None):
        return NA, "not signed"
    return _a4_checksum(x)


def _a24_encryption(x):
    if "ENCRYPTED" not in x.header.get("flag_names", ()):
        return NA, "not encrypted"
    return PASS, "decrypted with the key given"


# --- B. tensor physics --------------------------------------------------------------------
def _b26_nan(x):
    return _result([n for n, s in x.stats.items() if s.nan_count], "tensor(s) with NaN")


def _b27_inf(x):
    return _result([n for n, s in x.stats.items() if s.inf_count], "tensor(s) with Inf")


def _by_role(role):
    def item(x):
        found = x.matching(role)
        if not found:
            return NA, f"no {role} tensor"
        bad = [f"{n} ({'; '.join(v.reasons)})" for n, _, v in found if v.status == FAIL]
        return _result(bad, f"{role} tensor(s) out of range")
    return item


def _b30_embedding_std(x):
    found = x.matching("token embedding") + x.matching("positional embedding")
    if not found:
        return NA, "no embedding tensor"
    return _result([f"{n} (std {s.std:.3g})" for n, s, _ in found if s.std is not None and s.std >= 0.2],
                   "embedding(s) with std >= 0.2")


def _b31_zero(x):
    zero = [n for n, s in x.stats.items() if s.count and s.zero_count == s.count and not n.endswith("bias")]
    return _result(zero, "all-zero weight tensor(s)")


def _shape_item(number):
    def item(x):
        rows = [r for r in x.shapes if r["item"] == number] if number != 32 else x.shapes
        if not rows:
            return NA, "no metadata size to compare with a tensor"
        bad = [f"{r['key']}={r['value']} vs {r['tensor']} dim {r['dim']} = {r['actual']}" for r in rows
               if r["status"] == FAIL]
        return _result(bad, "mismatch(es)")
    return item


def _b34_q8_range(x):
    q8 = [i for i in x.infos if i.dtype_name == "Q8_0"]
    if not q8:
        return NA, "no Q8_0 tensor"
    bad = []
    for info in q8:
        data = np.asarray(x.f.get_tensor(info.name).data, np.uint8).reshape(-1)
        blocks = data[:data.size - data.size % 34].reshape(-1, 34)
        if np.any(blocks[:, 2:] == 0x80):  # int8 -128: outside symmetric [-127, 127]
            bad.append(info.name)
    return _result(bad, "Q8_0 tensor(s) holding -128")


def _b35_linear_mean(x):
    found = x.matching("attention weight") + x.matching("linear weight")
    if not found:
        return NA, "no attention or linear weight"
    return _result([f"{n} (mean {s.mean:.3g})" for n, s, _ in found if s.mean is not None and abs(s.mean) > 0.1],
                   "weight(s) with mean far from 0")


def _b37_mel(x):
    mel = [n for n in x.stats if re.search(r"mel_filters|filterbank", n)]
    if not mel:
        return NA, "no mel filterbank"
    return _result([n for n in mel if x.stats[n].min is not None and x.stats[n].min < 0], "filterbank(s) below 0")


def _b41_fp16(x):
    f16 = [i.name for i in x.infos if i.dtype_name == "F16" and i.name in x.stats]
    if not f16:
        return NA, "no F16 tensor"
    return _result([n for n in f16 if x.stats[n].inf_count], "F16 tensor(s) overflowed to Inf")


def _b42_sparsity(x):
    claimed = x.metadata.get("sparsity")
    if not isinstance(claimed, (int, float)) or isinstance(claimed, bool):
        return NA, "no sparsity claimed in the metadata"
    counts = [(s.zero_count, s.count) for s in x.stats.values() if s.count]
    actual = sum(z for z, _ in counts) / max(1, sum(c for _, c in counts))
    return (PASS, f"{actual:.1%} zeros") if actual + 0.01 >= claimed else (
        FAIL, f"metadata claims {claimed:.1%} sparsity, tensors hold {actual:.1%} zeros")


# --- C, D: the few decidable from a file --------------------------------------------------
def _c51_inspect_speed(x):
    from .. import api

    started = time.perf_counter()
    if x.keys:  # what `apr inspect --password-env ...` does: open with the keys, list
        with api.open(x.path, unknown_dtypes="raw", **x.keys) as f:
            [f.info(n) for n in f.keys()]
    else:
        api.inspect(x.path)
    took = time.perf_counter() - started
    return (PASS if took < INSPECT_BUDGET_S else FAIL), f"inspect took {took * 1000:.1f} ms"


def _c52_lint(x):
    missing = [k for k in ("license", "model_card") if x.metadata.get(k) in (None, "", {}, [])]
    return _result(missing, "metadata field(s) lint warns about")


def _vocab_size(metadata):
    return next((metadata[k] for k in VOCAB_SIZE_KEYS if _is_size(metadata.get(k))), None)


def _d84_vocab(x):
    vocab = next((x.metadata[k] for k in VOCAB_KEYS if isinstance(x.metadata.get(k), list)), None)
    n = _vocab_size(x.metadata)
    if vocab is None or n is None:
        return NA, "no vocabulary with a stated size"
    return (PASS, None) if len(vocab) == n else (FAIL, f"{len(vocab)} tokens, n_vocab {n}")


def _d85_special(x):
    n = _vocab_size(x.metadata)
    ids = {k: v for k, v in x.metadata.items() if re.fullmatch(r"(tokenizer\.)?(bos|eos|unk|pad)_token_id", k)}
    if not ids or n is None:
        return NA, "no special token ids with a vocabulary size"
    return _result([f"{k}={v}" for k, v in ids.items() if not (isinstance(v, int) and 0 <= v < n)],
                   "special token id(s) outside the vocabulary")


def _d86_metadata(x):
    missing = [k for k in ("license", "model_card", "provenance") if x.metadata.get(k) in (None, "", {}, [])]
    return _result(missing, "missing metadata")


def _d87_names(x):
    return _result([n for n in x.names if n.startswith("model.")], "un-normalised name(s)")


def _d95_architecture(x):
    from .text import detect_architecture

    found = detect_architecture(x.names, x.metadata)
    if found:
        return PASS, f"{found['architecture']} (from tensor names)"
    stated = next((x.metadata[k] for k in ("architecture", "model_type") if x.metadata.get(k)), None)
    if stated:
        return PASS, f"{stated} (from metadata)"
    return FAIL, "architecture neither recognised from tensor names nor stated in the metadata"


# --- the checklist --------------------------------------------------------------------------
_ITEMS = {
    1: ("Magic bytes valid", _a1_magic), 2: ("Header size fixed", _a2_header),
    3: ("Version supported", lambda x: (PASS, f"version {x.header.get('version')}")),
    4: ("Checksum valid", _a4_checksum), 5: ("JSON Metadata", lambda x: (PASS, "metadata parsed")),
    6: ("Tensor Alignment", _a6_alignment), 7: ("Index Sorted", _a7_sorted), 8: ("Compression", _a8_compression),
    9: ("Sharding Manifest", "needs the other shards; one file cannot decide it"),
    10: ("Endianness", "needs a big-endian machine"), 11: ("Flags Parsed", _a11_flags),
    12: ("Footer Magic", _a12_footer), 13: ("File Size", _a13_size), 14: ("Tensor Offsets", _a14_offsets),
    15: ("Empty Model", _a15_empty), 16: ("Huge Header", _a16_metadata),
    17: ("UTF-8 Names", lambda x: (PASS, "names decoded")), 18: ("Duplicate Names", _a18_unique),
    19: ("Dimension Limit", _a19_dims), 20: ("Zero Dims", _a20_scalar), 21: ("Datatypes", _a21_dtypes),
    22: ("Padding Bytes", _a22_padding), 23: ("Signature", _a23_signature), 24: ("Encryption", _a24_encryption),
    25: ("WASM Load", "needs a wasm32 runtime"),
    26: ("No NaNs", _b26_nan), 27: ("No Infs", _b27_inf), 28: ("LayerNorm Mean", _by_role("layernorm weight")),
    29: ("LayerNorm Bias", _by_role("layernorm bias")), 30: ("Embedding Std", _b30_embedding_std),
    31: ("Zero Tensors", _b31_zero), 32: ("Shape Match", _shape_item(32)), 33: ("Vocab Match", _shape_item(33)),
    34: ("Quantization Range", _b34_q8_range), 35: ("Attn/Linear Mean", _b35_linear_mean),
    36: ("Softmax Valid", _RUNTIME), 37: ("Mel Filters", _b37_mel), 38: ("Pos Embeddings", _shape_item(38)),
    39: ("Token IDs", _RUNTIME), 40: ("Audio Range", _RUNTIME), 41: ("FP16 Range", _b41_fp16),
    42: ("Sparsity", _b42_sparsity), 43: ("Dead Neurons", _RUNTIME), 44: ("Exploding Grads", _RUNTIME),
    45: ("Repeat Tokens", _RUNTIME), 46: ("Silence Input", _RUNTIME), 47: ("White Noise", _RUNTIME),
    48: ("Mel Shape", _shape_item(48)), 49: ("Text Context", _shape_item(49)),
    50: ("L2 Distance", "needs a reference model (apr diff)"),
    51: ("Inspect Speed", _c51_inspect_speed), 52: ("Lint Defaults", _c52_lint),
    **{n: (c, _TOOL) for n, c in (
        (53, "Drama Mode"), (54, "TUI Graph"), (55, "TUI Stats"), (56, "Diff Identity"), (57, "Diff Detection"),
        (58, "Merge Average"), (59, "Merge TIES"), (60, "Export ONNX"), (61, "Export GGUF"),
        (62, "Convert Quant"), (63, "Convert Prune"), (65, "Explain Error"), (66, "Explain Tensor"),
        (67, "Analyze Source"), (68, "Inline Valid"), (69, "Force Override"), (70, "Cache Dir"),
        (71, "Config Load"), (72, "Canary Check"), (73, "JSON Output"),
        (76, "SafeTensors"), (77, "PyTorch"), (78, "GGUF Import"), (79, "Roundtrip"), (80, "HF Mapping"),
        (81, "Q-DeepCopy"), (82, "F32->BF16"), (83, "BF16->F32"), (88, "Permutation"), (89, "Scale Factors"),
        (90, "Sharded Import"), (91, "Remote Import"), (92, "Cache Hit"), (96, "Output Path"),
        (97, "Overwrite"), (98, "Disk Full"), (99, "Memory Limit"))},
    64: ("Trace Output", _RUNTIME), 74: ("Trace Payload", _RUNTIME), 75: ("Trace Diff", _RUNTIME),
    84: ("Vocab Import", _d84_vocab), 85: ("Special Tokens", _d85_special), 86: ("Metadata Copy", _d86_metadata),
    87: ("Tensor Name Norm", _d87_names), 93: ("Checksum Verify", "needs the source file the model came from"),
    94: ("License Warning", "a warning at import, not a property of the file"),
    95: ("Arch Detect", _d95_architecture), 100: ("Golden Trace", _RUNTIME),
}


def _category(number) -> str:
    return "ABCD"[(number - 1) // 25]


def _score_item(number, x) -> dict:
    claim, check = _ITEMS[number]
    if isinstance(check, str):
        status, detail = NA, check
    else:
        status, detail = check(x)
    return {"item": number, "category": _category(number), "claim": claim, "status": status, "detail": detail}


def quality_report(path, *, threads: int = 0, progress=None, **keys) -> dict:
    """Score ``path`` against the §11 checklist.  ``keys``: ``password``,
    ``private_key``, ``trusted_keys``, as for :func:`aprfast.open`; ``progress(done,
    total)`` is called with tensor bytes as the statistics pass goes (by default a
    terminal's stderr shows a plain line once the call has run a second).

    Returns ``{"file", "score", "grade", "passed", "failed", "applicable",
    "categories": {A-D: {"name", "passed", "applicable"}}, "items": [{"item",
    "category", "claim", "status", "detail"}], "shapes": [...]}``.  A file that cannot
    be opened at all scores 0 with ``"error"`` set.

    Args:
        path: The model file (anything :func:`aprfast.open` reads).
        threads: Threads for the statistics engine (0: every core).
        progress: None (the default: a plain line on stderr when it is a terminal and the
            call has run a second, else nothing), False (nothing), or a callable
            ``progress(done, total)`` in tensor bytes; see :mod:`aprfast.io.progress`.
        **keys: ``password``, ``private_key``, ``trusted_keys`` for :func:`aprfast.open`.

    Returns:
        The report dict described above.

    Raises:
        AprIOError: The file cannot be read (AprFileNotFoundError when missing).
        DecryptError: An encrypted file without the right key.

    Examples:
        >>> import numpy as np, aprfast
        >>> from aprfast.tools.quality import quality_report
        >>> aprfast.save_file({"model.embed_tokens.weight": np.zeros((16, 4), np.float32)}, "m.apr",
        ...                   metadata={"vocab_size": 16})
        >>> report = quality_report("m.apr")
        >>> report["score"] == round(100 * report["passed"] / report["applicable"])
        True
        >>> report["items"][0]["claim"], report["items"][0]["status"], report["shapes"][0]["status"]
        ('Magic bytes valid', 'PASS', 'PASS')
        >>> with open("junk.apr", "wb") as fh:
        ...     _ = fh.write(b"APR2" + bytes(100))
        >>> quality_report("junk.apr")["score"], quality_report("junk.apr")["error"]["code"]
        (0, 'E003')
    """
    from .. import api

    try:
        f = api.open(path, unknown_dtypes="raw", **keys)
    except (AprIOError, DecryptError):  # not the file's quality: missing, unreadable or no key
        raise
    except AprError as exc:
        return _unreadable(path, exc)
    with f:
        facts = _Facts(f, os.fspath(path), threads, keys, progress)
        items = [_score_item(n, facts) for n in sorted(_ITEMS)]
    return _summary(os.fspath(path), items, facts.shapes)


def _unreadable(path, exc) -> dict:
    item = {"item": 1, "category": "A", "claim": "the file opens", "status": FAIL,
            "detail": f"[{exc.code}] {exc.message}"}
    report = _summary(os.fspath(path), [item], [])
    report["error"] = {"code": exc.code, "message": exc.message}
    return report


def _summary(path, items, shapes) -> dict:
    applicable = [i for i in items if i["status"] != NA]
    passed = sum(i["status"] == PASS for i in applicable)
    score = round(100 * passed / len(applicable)) if applicable else 0
    categories = {}
    for key, name in CATEGORIES.items():
        mine = [i for i in applicable if i["category"] == key]
        categories[key] = {"name": name, "passed": sum(i["status"] == PASS for i in mine), "applicable": len(mine)}
    return {"file": path, "score": score, "grade": grade(score), "passed": passed,
            "failed": len(applicable) - passed, "applicable": len(applicable),
            "not_applicable": len(items) - len(applicable), "categories": categories, "items": items,
            "shapes": shapes}
