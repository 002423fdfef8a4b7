"""``aprfast.convert``: models in and out of ``.apr``, one tensor at a time.

Every format module gives a *source* (``specs`` and ``metadata`` known before any data
is read, ``read(spec, scratch)``, and ``raw_range(spec)`` where the stored bytes can be
copied file to file; see ``_common``) and a *writer* (declared specs up front, then
``add(name, value)`` or ``add_range(name, fd, offset)`` in that order,
``close()``/``abort()``).  :func:`convert` joins one to the other through a per-tensor
transform (names: ``names``; pruning and low-rank: ``optimize``; precision, quantize)
and checks each value before it is written (``validation``; the drift of lossy ones:
``gate``), so peak memory is the largest tensor (twice,
while it is converted) plus a constant, whatever the model's size.
"""

from __future__ import annotations

import logging
import os
import warnings

import numpy as np

from .. import dtypes as _dtypes
from ..errors import AprError, ChecksumError, FormatError, LayoutError, os_error
from ..io.progress import progress_to
from ..numerics.drift import numeric_values
from ..numerics.mixes import Mix, mix_params, mix_types
from ..numerics.mixes import mix as _mix
from ..numerics.precision import to_bfloat16, to_float16, to_float32
from ..numerics.quantization import dequantize as _dequantize
from ..numerics.quantization import quant_type, type_selector
from ..numerics.quantization import quantize as _quantize
from ..tensors import RawTensor
from . import apr as _apr
from . import burnpack as _bpk
from . import compressed_tensors as _ct
from . import gguf as _gguf
from . import hf_arch as _hf
from . import mle as _mle
from . import onnx as _onnx
from . import pytorch as _pt
from . import safetensors as _st
from ._common import DestinationExistsError, Scratch, Spec
from .gate import DEFAULT_MAX_DRIFT, QualityGate, QualityGateError, QualityGateWarning
from .gate import lossy as _lossy
from .names import NameMapping, NameMappingWarning, detect_arch, map_names
from .optimize import Optimizer
from .tokenizer import tokenizer_metadata
from .validation import InlineValidator, TensorValidationError, ValidationWarning, check_mode

__all__ = ["convert", "detect", "open_source", "tensor_mix_types", "DestinationExistsError", "TensorValidationError",
           "ValidationWarning", "NameMappingWarning", "QualityGateError", "QualityGateWarning", "FORMATS"]

FORMATS = ("apr", "safetensors", "gguf", "burnpack")  # destinations; sources add "pytorch", "onnx" and "mle"
_APR_MAGICS = (b"APR\0", b"APR2", b"APRN", b"APR1")
_EXTENSIONS = {".apr": "apr", ".safetensors": "safetensors", ".gguf": "gguf", _bpk.EXTENSION: "burnpack"}
_PRECISIONS = {"f32": "F32", "float32": "F32", "f16": "F16", "float16": "F16", "bf16": "BF16", "bfloat16": "BF16"}
_FLOATS = {"F32", "F16", "BF16", "F64"}
#: Where the output's metadata records the name mapping applied (``arch=``).
NAME_MAPPING_KEY = "aprfast.name_mapping"
log = logging.getLogger("aprfast.convert")


# --- sources -------------------------------------------------------------------------
def detect(path) -> str:
    """The format of ``path`` from its bytes: "apr", "safetensors", "gguf", "pytorch"
    (a torch.save zip, or torch < 1.6's legacy pickle, refused when opened), "onnx"
    (a ModelProto: ``ir_version`` then another model field), or
    "safetensors-sharded" (an index file, or a directory holding one), "burnpack"
    or "mle".  Only the first bytes are read.

    Args:
        path: A file or directory path.

    Returns:
        The format's name.

    Raises:
        FormatError: The bytes are no format aprfast reads, or a directory holds no
            model it knows.
        AprFileNotFoundError: ``path`` does not exist.

    Examples:
        >>> import numpy as np, aprfast
        >>> from aprfast.convert import detect
        >>> aprfast.save_file({"w": np.zeros(2, np.float32)}, "model.apr")
        >>> detect("model.apr")
        'apr'
        >>> with open("notes.txt", "w") as f:
        ...     _ = f.write("not a model")
        >>> detect("notes.txt")
        Traceback (most recent call last):
        ...
        aprfast.errors.FormatError: [E001] notes.txt: unrecognised source format ...
    """
    from ..files.shards import MANIFEST_SUFFIX, find_manifest

    path = os.fspath(path)
    manifest = find_manifest(path)
    if manifest is not None and manifest.endswith(MANIFEST_SUFFIX):  # a sharded .apr model
        return "apr"
    if os.path.isdir(path):
        if os.path.isfile(os.path.join(path, _st.INDEX_NAME)):
            return "safetensors-sharded"
        if os.path.isfile(os.path.join(path, "model.safetensors")):
            return "safetensors"
        if os.path.isfile(os.path.join(path, _pt.INDEX_NAME)) or os.path.isfile(os.path.join(path, _pt.WEIGHTS_NAME)):
            return "pytorch"
        raise FormatError(f"directory holds no {_st.INDEX_NAME}, model.safetensors, {_pt.INDEX_NAME} or "
                          f"{_pt.WEIGHTS_NAME}", path=path)
    try:
        with open(path, "rb") as f:
            head = f.read(max(16, len(_pt.LEGACY_MAGIC)))
            size = os.fstat(f.fileno()).st_size
    except OSError as exc:
        raise os_error(exc, "cannot open the source", path=path) from exc
    if head[:4] == _gguf.MAGIC:
        return "gguf"
    if head[:4] == _bpk.MAGIC:
        return "burnpack"
    if head[:4] == _mle.MAGIC:
        return "mle"
    if head[:4] in _APR_MAGICS:
        return "apr"
    if _st.is_safetensors(head, size):
        return "safetensors"
    if (head[:4] == _pt.ZIP_MAGIC and _pt.is_pytorch_zip(path)) or _pt.is_legacy(head):
        return "pytorch"
    if _onnx.is_onnx(head):
        return "onnx"
    if head.lstrip()[:1] == b"{":  # JSON: only an index makes sense; the sharded sources check it is one
        return "pytorch" if _pt.is_bin_index(path) else "safetensors-sharded"
    raise FormatError(f"unrecognised source format (first bytes {head[:8]!r}): not .apr, safetensors, "
                      "a safetensors index, GGUF, a torch.save checkpoint, ONNX, Burnpack or MLE", path=path)


def open_source(path, *, tokenizer: bool = True, verify: bool = True):
    """The tensor stream of any supported source, metadata mapped to .apr's.

    What :func:`convert` reads from: ``specs`` (each tensor's name, dtype and shape,
    known before any data is read), ``metadata``, ``read(spec, scratch)`` for one
    tensor's values, ``tensors()`` to iterate them, and ``close()``.

    Args:
        path: A file or directory of any format :func:`detect` names.
        tokenizer: Embed a sibling ``tokenizer.json`` of a safetensors source in the
            metadata.
        verify: An ``.apr`` source checks its CRC (and signature) as it is read;
            its ``check()`` compares (see ``convert.apr.AprSource``).

    Returns:
        A source object; its ``format`` is what :func:`detect` said.

    Raises:
        FormatError: An unrecognised or malformed source.
        AprFileNotFoundError: ``path`` does not exist.

    Examples:
        >>> import numpy as np, aprfast
        >>> from aprfast.convert import open_source
        >>> aprfast.save_file({"w": np.zeros((2, 3), np.float32)}, "model.apr")
        >>> source = open_source("model.apr")
        >>> source.format, [(spec.name, spec.shape) for spec in source.specs]
        ('apr', [('w', (2, 3))])
        >>> source.close()
    """
    kind = detect(path)
    if kind == "apr":
        source = _apr.AprSource(path, verify=verify)
    elif kind == "gguf":
        source = _gguf.GGUFSource(path)
    elif kind == "pytorch":
        source = _pt.open_source(path)
    elif kind == "onnx":
        source = _onnx.OnnxSource(path)
    elif kind == "burnpack":
        source = _bpk.BurnpackSource(path)
    elif kind == "mle":
        source = _mle.MLESource(path)
    else:
        source = _safetensors_source(path, tokenizer)
    source.format = kind
    return source


def _safetensors_source(path, tokenizer: bool):
    source = _st.open_source(path)
    try:
        source.metadata = _st.metadata_from_strings(source.metadata, source.path)
        if tokenizer:
            source.metadata.update(tokenizer_metadata(os.path.dirname(os.path.abspath(source.path))))
    except BaseException:
        source.close()
        raise
    return source


# --- the per-tensor transform --------------------------------------------------------
def _quant_dtype(quantize, spec: Spec, name: str):
    """The packed dtype ``spec`` (written as ``name``) is quantized to, or None to keep
    it: 2-D float weights whose rows fit the type's blocks (GGML blocks never span
    rows).  ``quantize`` is a type name or a selector ``(name, shape) -> QuantType |
    None`` (see :func:`_quant_selector`)."""
    if quantize is None or spec.dtype.name not in _FLOATS or len(spec.shape) < 2:
        return None
    mixed = isinstance(quantize, _MixPlan)
    if len(spec.shape) != 2 and not mixed:  # a mix quantizes 3-D expert tensors too, as llama.cpp
        return None
    choice = quantize(name, spec.shape) if callable(quantize) else quantize
    if choice is None:
        return None
    if mixed and choice == "F16":  # llama.cpp's fallback for rows that are not whole 32-blocks
        return _dtypes.by_name("F16")
    dtype = quant_type(choice).dtype
    if _dtypes.element_count(spec.shape) == 0 or (dtype.blocks_per_row and spec.shape[-1] % dtype.block_elems):
        return None
    return dtype


def _out_spec(spec: Spec, name: str, precision, quantize) -> Spec:
    qdtype = _quant_dtype(quantize, spec, name)
    if qdtype is not None:
        return Spec(name, qdtype, spec.shape)
    if precision is not None and (spec.dtype.name in _FLOATS or spec.dtype.packed):
        return Spec(name, _dtypes.by_name(precision), spec.shape)
    return Spec(name, spec.dtype, spec.shape, spec.size)  # an opaque dtype keeps its stored size


def _float_values(value):
    """A float NumPy array of a tensor value (packed blocks dequantized to float32)."""
    if isinstance(value, RawTensor):
        if value.dtype.packed:
            return _dequantize(value)
        return to_float32(value)  # BF16 bits without ml_dtypes
    return value


def _transform(value, src: Spec, out: Spec, ggml: bool = False):
    """``value`` as ``out`` holds it; ``ggml``: a GGUF destination, whose BF16 NaNs are
    rounded as ggml and gguf-py round them (docs/FORMAT.md "BF16 NaNs")."""
    if out.dtype is src.dtype:
        return value
    values = _float_values(value)
    if out.dtype.packed:
        return _quantize(values, out.dtype.name, name=src.name)
    if out.dtype.name == "F32":
        return to_float32(values) if values.dtype.itemsize == 2 else np.asarray(values, np.float32)
    if out.dtype.name == "F16":
        return to_float16(values)
    result = to_bfloat16(values, ggml=ggml)
    return result if result.dtype != np.uint16 else RawTensor(out.dtype, out.shape, result)


_FLOAT_DTYPES = {np.dtype(np.float16): "F16", np.dtype(np.float32): "F32", np.dtype(np.float64): "F64"}


def _convert_tensor(value, spec: Spec, outs, optimizer, gate, validator, ggml: bool = False) -> list:
    """The value(s) written for one source tensor (``outs``: one spec, or a factored
    tensor's two): pruned or factored (``optimize``), then precision/quantize, each
    checked (``validator``: NaN/Inf and §10.9 first), then the drift of a lossy change
    measured (``gate``) while the source is in memory."""
    op, name = optimizer.op(spec.name) if optimizer is not None else (None, None)
    if op is None:
        (out,) = outs
        result = validator.check(out.name, _transform(value, spec, out, ggml))
        if gate is not None and gate.active and _lossy(spec.dtype, out.dtype):
            gate.measure(out.name, numeric_values(value), numeric_values(result),
                         "quantize" if out.dtype.packed else "precision")
        return [result]
    source = _float_values(value)
    if source.dtype not in _FLOAT_DTYPES:  # bfloat16 (ml_dtypes): exact in f32, written back as BF16
        source = to_float32(source)
    parts = optimizer.apply(op, name, source)
    results = [validator.check(o.name, _transform(p, Spec(o.name, _dtypes.by_name(_FLOAT_DTYPES[p.dtype]),
                                                          p.shape), o, ggml))
               for p, o in zip(parts, outs)]
    if gate is not None and gate.active:
        decoded = [numeric_values(r).reshape(o.shape) for r, o in zip(results, outs)]
        output = decoded[0] if op == "prune" else np.matmul(*decoded)
        gate.measure(name, source, output, op)
    return results


# --- destinations --------------------------------------------------------------------
def _destination_format(destination, to, max_shard_size) -> str:
    if to is not None:
        if to not in FORMATS:
            raise ValueError(f"to={to!r}: choose one of {', '.join(FORMATS)}")
        kind = to
    else:
        dest = os.fspath(destination)
        if dest.endswith(".json") or os.path.isdir(dest) or dest.endswith(os.sep):
            kind = "safetensors"
        else:
            kind = _EXTENSIONS.get(os.path.splitext(dest)[1].lower())
        if kind is None and max_shard_size is not None:  # a new directory of shards
            kind = "safetensors"
        if kind is None:
            raise ValueError(f"cannot tell the destination format from {dest!r}: use a .apr, .safetensors, "
                             ".gguf or .bpk name, or pass to=")
    if max_shard_size is not None and kind != "safetensors":
        raise ValueError(f"max_shard_size= is for safetensors destinations, not {kind}")
    if max_shard_size is not None and _shards_beside(destination) \
            and os.path.basename(os.fspath(destination)) != "model.safetensors":
        raise ValueError(f"max_shard_size= writes transformers' names (model-0000i-of-0000n.safetensors and "
                         f"model.safetensors.index.json), not {os.path.basename(os.fspath(destination))!r}: give "
                         "the directory, or a destination named model.safetensors or model.safetensors.index.json")
    return kind


def _shards_beside(destination) -> bool:
    """A ``.safetensors`` file name (not an existing directory) that shards go beside."""
    dest = os.fspath(destination)
    return dest.endswith(".safetensors") and not os.path.isdir(dest)


def _open_writer(kind, destination, specs, metadata, *, compression, max_shard_size, force, durable,
                 q8_headers=None):
    dest = os.fspath(destination)
    sharded = kind == "safetensors" and (max_shard_size is not None or dest.endswith(".json")
                                         or os.path.isdir(dest) or dest.endswith(os.sep))
    if sharded:
        # a name (model.safetensors, model.safetensors.index.json): the shards go beside
        # it, in its directory (issue 26 item 5), not in a directory of that name
        directory = os.path.dirname(dest) if dest.endswith(".json") or _shards_beside(dest) else dest
        size = max_shard_size if max_shard_size is not None else 1 << 62
        return _st.ShardedWriter(directory or ".", specs, metadata, max_shard_size=size, force=force, durable=durable)
    if os.path.lexists(dest) and not force:
        raise DestinationExistsError("destination exists; pass force=True to replace it", path=dest)
    if compression is not None and kind != "apr":
        raise ValueError(f"compression= applies to .apr destinations, not {kind}")
    if kind == "apr":
        return _apr.apr_writer(dest, specs, metadata, compression=compression, durable=durable)
    if kind == "gguf":
        return _gguf.GGUFWriter(dest, specs, metadata, durable=durable, q8_headers=q8_headers)
    if kind == "burnpack":
        return _bpk.BurnpackWriter(dest, specs, metadata, durable=durable)
    return _st.SafetensorsWriter(dest, specs, metadata, durable=durable)


def _strip(name: str, prefixes) -> str:
    for prefix in prefixes:
        if prefix and name.startswith(prefix):
            return name[len(prefix):]
    return name


def _plan(source, rename, precision, quantize, strip_prefix=(), mapping: NameMapping | None = None,
          optimizer: Optimizer | None = None, model=None):
    """(source spec, output spec) pairs of the tensors kept, output names unique.  Each
    name: ``strip_prefix``, then the ``arch`` mapping or the model conversion's names
    (``model``: llama.cpp's or Hugging Face's), then ``rename``.  A tensor
    ``lowrank=`` factors gives two consecutive pairs of one source spec (its factors)."""
    pairs, seen = [], {}
    for spec in source.specs:
        stripped = _strip(spec.name, strip_prefix)
        mapped = mapping.names[stripped] if mapping is not None and mapping.arch else stripped
        if model is not None:
            mapped = model.name(spec.name)
            if mapped is None:
                continue
        name = _renamed(rename, mapped, spec.name)
        if name is None:
            continue
        if name in seen:
            raise LayoutError(f"two source tensors, {seen[name]!r} and {spec.name!r}, both become {name!r}"
                              f"{_how(mapping, rename)}; drop or rename one of them (rename=)")
        seen[name] = spec.name
        if optimizer is not None and optimizer.decide(spec.name, name, spec.dtype.name, spec.shape) == "lowrank":
            record = optimizer.factored[name]
            (m, n), r = record["shape"], record["rank"]
            for factor_name, shape in ((record["a"], (m, r)), (record["b"], (r, n))):
                if factor_name in seen:
                    raise LayoutError(f"the low-rank factor {factor_name!r} of {spec.name!r} clashes with the "
                                      f"source tensor {seen[factor_name]!r}")
                seen[factor_name] = spec.name
                pairs.append((spec, _out_spec(Spec(factor_name, spec.dtype, shape), factor_name, precision,
                                              quantize)))
            continue
        shaped = spec
        if model is not None and spec.name in model.transposed:  # planned in the destination's shape
            shaped = Spec(spec.name, spec.dtype, tuple(reversed(spec.shape)))
        out = _out_spec(shaped, name, precision, quantize)
        if model is not None:
            forced = model.out_dtype(name, out.shape, out.dtype.name, out.dtype.packed)
            if out.dtype.name == "MXFP4" and _selects_mxfp4(quantize, name, out.shape):
                forced = None  # asked for: a Hugging Face destination holds it in compressed-tensors' layout
            if forced is not None and forced != out.dtype.name:
                out = Spec(name, _dtypes.by_name(forced), out.shape)
        pairs.append((spec, out))
    return pairs


def _selects_mxfp4(quantize, name: str, shape) -> bool:
    """Whether ``quantize=`` (a type name or a selector) chooses MXFP4 for ``name``."""
    if quantize is None:
        return False
    choice = quantize(name, shape) if callable(quantize) else quantize
    return choice is not None and quant_type(choice).dtype.name == "MXFP4"


def _repack_selector(kind, quantize, prefixes, rename, precision=None):
    """Which compressed-tensors MXFP4 weights read as GGML MXFP4 blocks: all of them for
    a GGUF destination given neither ``precision=`` nor ``quantize=`` (a lossless
    repack), else those ``quantize=`` gives MXFP4 by their name after ``strip_prefix``
    and ``rename`` (``<module>.weight``); None: none."""
    if kind == "gguf" and precision is None and quantize is None:
        return lambda name, shape: True
    if quantize is None or isinstance(quantize, Mix):  # a mix's types are planned later, from the values
        return None

    def select(name, shape):
        out = _renamed(rename, _strip(name, prefixes), name)
        return out is not None and _selects_mxfp4(quantize, out, shape)
    return select


def _dequant_selector(kind, precision, quantize, prefixes, rename):
    """Which compressed-tensors weights (those :func:`_repack_selector` left) read as
    their values (docs/FORMAT.md "compressed-tensors"): every one for a GGUF destination
    (it cannot hold the packed layout) or with ``precision=``; else those ``quantize=``
    gives a type by their name after ``strip_prefix`` and ``rename``; None: none."""
    if kind == "gguf" or precision is not None or isinstance(quantize, Mix):
        return True
    if quantize is None:
        return None
    f32 = _dtypes.by_name("F32")

    def select(name, shape):
        out = _renamed(rename, _strip(name, prefixes), name)
        return out is not None and _quant_dtype(quantize, Spec(out, f32, shape), out) is not None
    return select


def _renamed(rename, name: str, source_name: str):
    """``rename`` (a callable, or a dict whose missing names are kept) applied to ``name``."""
    if rename is None:
        return name
    out = rename.get(name, name) if hasattr(rename, "get") else rename(name)
    if out is not None and not isinstance(out, str):
        raise LayoutError(f"rename({name!r}) (source {source_name!r}) returned {out!r}; names are str (or None "
                          "to drop)")
    return out


def _how(mapping, rename) -> str:
    steps = ([f"the {mapping.arch} name mapper"] if mapping is not None and mapping.arch else []) + \
        (["rename"] if rename is not None else [])
    return f" (after {' and '.join(steps)})" if steps else ""


def _map_names(src, arch, prefixes) -> NameMapping | None:
    """The ``arch`` mapping of the source's (prefix-stripped) names, with warnings for
    the names it does not know and an architecture other than the names show."""
    if arch is None:
        return None
    if arch != "auto" and not isinstance(arch, str):
        raise ValueError(f"arch={arch!r}: one of 'whisper', 'llama', 'bert', 'auto' or None")
    names = [_strip(spec.name, prefixes) for spec in src.specs]
    mapping = map_names(names, arch, src.metadata)
    if mapping.arch is None:
        return mapping
    if not mapping.detected:
        shown = detect_arch(names, src.metadata)
        if shown is not None and shown != mapping.arch:
            warnings.warn(f"arch={mapping.arch!r} but the source looks like {shown!r} (tensor names / "
                          "general.architecture)", NameMappingWarning, stacklevel=3)
    if mapping.unknown:
        shown = ", ".join(repr(n) for n in mapping.unknown[:5]) + (", ..." if len(mapping.unknown) > 5 else "")
        warnings.warn(f"the {mapping.arch} name mapper does not know {len(mapping.unknown)} tensor name(s), kept "
                      f"as they are: {shown}", NameMappingWarning, stacklevel=3)
    return mapping


def _check_options(validate, precision, quantize):
    check_mode(validate)
    if precision is not None:
        if str(precision).lower() not in _PRECISIONS:
            raise ValueError(f"precision={precision!r}: one of 'f32', 'f16', 'bf16'")
        precision = _PRECISIONS[str(precision).lower()]
    return precision, _quant_selector(quantize)


def _quant_selector(quantize):
    """``quantize=`` as a type name, a llama.cpp mix (a :class:`Mix`, planned once the
    tensors are known: :func:`_plan_mix`), a callable, or per-layer rules (a dict or list
    of ``(glob, type | None)``, first match wins, unmatched tensors kept: the rules of
    :func:`aprfast.quantize_tensors`).  Every type named is checked before any write."""
    if quantize is None or callable(quantize) or isinstance(quantize, Mix):
        return quantize
    if isinstance(quantize, str):
        found = _mix(quantize, suffixed_only=True)
        if found is not None:
            return found
        quant_type(quantize).require_quantizer()  # unknown or dequantize-only types refused before any write
        return quantize
    if isinstance(quantize, (dict, list, tuple)):
        select = type_selector(None, quantize)
        return lambda name, shape: select(name, shape)[0]
    raise TypeError(f"quantize= takes a type name, a dict/list of (glob, type) rules or a callable, "
                    f"not {type(quantize).__name__}")


class _MixPlan:
    """A mix's type for each output tensor (``{name: type | None}``), as a selector."""

    def __init__(self, found: Mix, types: dict):
        self.mix, self.types = found, types

    def __call__(self, name, shape):
        return self.types.get(name)


def _wants_mix(quantize, kind, src, model):
    """The mix a type name that is also llama.cpp's file type (``Q6_K``, ``Q8_0``, ...)
    stands for when the destination is a GGUF of a model llama.cpp knows (a model
    conversion, or a source with ``general.architecture``), else ``quantize`` itself."""
    if not isinstance(quantize, str) or kind != "gguf":
        return quantize
    if model is None and not isinstance((src.metadata or {}).get("general.architecture"), str):
        return quantize
    return _mix(quantize) or quantize


def _plan_mix(found: Mix, src, rename, prefixes, mapping, model) -> _MixPlan:
    """The types ``llama-quantize`` gives each output tensor for ``found``: the whole
    plan's names and shapes are needed first (numerics.mixes), then every type used is
    checked for a quantizer before anything is written."""
    outs = [out for _, out in _plan(src, rename, None, None, prefixes, mapping, None, model)]
    types = tensor_mix_types(found, [(o.name, o.shape) for o in outs], src.metadata,
                             model.files.get("config.json") if model is not None and model.direction == "hf-to-gguf"
                             else None)
    for name in sorted({t for t in types.values() if t not in (None, "F16")}):
        quant_type(name).require_quantizer()
    return _MixPlan(found, types)


def tensor_mix_types(found, tensors, metadata=None, config=None) -> dict:
    """``{name: GGML type | "F16" | None}`` llama-quantize gives each of ``tensors``
    (``(name, shape)`` pairs of a whole model) for the mix ``found``: Hugging Face names
    of the LLaMA family are read as their GGUF names; the hyper-parameters come from
    GGUF keys in ``metadata``, a ``config`` (config.json), or the ``config.json`` an
    .apr made from a Hugging Face directory records.

    Args:
        found: A :class:`~aprfast.numerics.mixes.Mix` or a mix name ("Q4_K_M").
        tensors: ``(name, shape)`` pairs.
        metadata: The model's metadata (GGUF keys, or an .apr's), or None.
        config: A config.json mapping, or None.

    Returns:
        The type of each tensor (None: kept as it is).

    Examples:
        >>> from aprfast.convert import tensor_mix_types
        >>> types = tensor_mix_types("Q4_K_M", [("model.embed_tokens.weight", (32, 256)),
        ...                                      ("lm_head.weight", (32, 256))])
        >>> types["lm_head.weight"], types["model.embed_tokens.weight"]
        ('Q6_K', 'Q4_K')
    """
    metadata = metadata or {}
    if config is None:
        files = metadata.get(_hf.HF_FILES_KEY)
        config = files.get("config.json") if isinstance(files, dict) else None
    tensors = [(name, tuple(shape)) for name, shape in tensors]
    gguf_names = _hf.llama_cpp_names(name for name, _ in tensors)
    if len(set(gguf_names.values())) != len(gguf_names):  # two spellings of one tensor: read the names as given
        gguf_names = {name: name for name, _ in tensors}
    params = mix_params(metadata, config if isinstance(config, dict) else None, list(gguf_names.values()))
    types = mix_types(found, [(gguf_names[name], shape) for name, shape in tensors], params)
    return {name: types[gguf_names[name]] for name, _ in tensors}


def _mix_metadata(metadata: dict, found: Mix) -> dict:
    """``general.file_type`` = the mix's llama_ftype and ``general.quantization_version``
    2 (GGML_QNT_VERSION), as llama-quantize writes them, with their GGUF types."""
    out = dict(metadata, **{"general.file_type": found.ftype, "general.quantization_version": 2})
    types = out.get(_gguf.TYPES_KEY)
    if isinstance(types, dict):
        out[_gguf.TYPES_KEY] = dict(types, **{"general.file_type": "U32", "general.quantization_version": "U32"})
    return out


def convert(source, destination, *, to=None, quantize=None, precision=None, compression=None, arch=None,
            rename=None, strip_prefix=None, validate="strict", force=False, progress=None, max_shard_size=None,
            tokenizer=True, durable=True, prune=None, lowrank=None, max_drift=DEFAULT_MAX_DRIFT,
            storage_options=None, names="auto", verify=True) -> dict:
    """Convert a model between ``.apr``, safetensors (one file or a sharded checkpoint)
    and GGUF, streaming one tensor at a time.

    ``source``: a path; its format comes from its bytes (an ``.apr`` of any variant,
    safetensors, GGUF, a ``model.safetensors.index.json`` or a directory holding one,
    a ``torch.save`` checkpoint read without running pickle: see ``convert.pytorch``,
    or an ONNX model's initializers: see ``convert.onnx``).  Or a URL of such a file
    (``convert._remote``): ``hf://org/repo[@rev]/path`` through huggingface_hub's cache
    (``HF_HUB_OFFLINE`` honoured), any other (``https://``, ``s3://``, ...) fetched with
    parallel ranged requests into a temporary directory beside the destination, removed
    afterwards; an index's shards and a safetensors ``tokenizer.json`` come with it.
    ``storage_options`` go to fsspec / huggingface_hub (``token``) as for ``aprfast.open``.
    ``destination``: a path whose extension (``.apr``, ``.safetensors``, ``.gguf``; a
    directory or an ``.index.json`` for sharded safetensors) or ``to=`` names the format.
    ``max_shard_size`` (bytes, or "5GB"/"2GiB") writes a sharded safetensors checkpoint
    named as transformers names it, in the destination directory or beside a destination
    named ``model.safetensors`` (one shard: that file; other ``.safetensors`` names are
    refused, as the shards could not carry them).  An existing destination is refused
    (DestinationExistsError) unless ``force=True``.

    Names, in this order: ``strip_prefix`` (a str or a tuple of them, e.g. "module.")
    is removed from the front of every name that starts with it (the first that
    matches); ``arch`` ("whisper", "llama", "bert", or "auto": detected from GGUF's
    ``general.architecture`` or the names; see ``convert.names``) maps Hugging Face,
    GGUF and ONNX names to the canonical ``.apr`` names (docs/guide/converting.md), names the
    mapper does not know kept (NameMappingWarning) and the mapping recorded in the
    output's metadata under ``aprfast.name_mapping``; ``rename`` (``callable(name) ->
    name | None``, or a dict; None drops a tensor) renames what the mapper gave.  Two
    tensors ending with one name are a LayoutError naming both.
    ``names`` ("auto" or "keep"): with "auto" (the default) a model conversion between
    a Hugging Face checkpoint and GGUF gives what the destination's engine loads
    (``convert.hf_arch``, docs/FORMAT.md "Model conversions"): a safetensors model
    whose directory holds a ``config.json`` of a known architecture (LLaMA, Mistral,
    Qwen2, Qwen3, GPT-2, BERT) becomes a GGUF llama.cpp runs (its tensor names, the Q/K rotary row
    order, the hyper-parameters and tokenizer as typed keys, norms in F32), and a GGUF
    of such an architecture becomes a Hugging Face directory (``config.json``,
    ``generation_config.json``, tokenizer files beside the weights; GGML blocks
    dequantized to F32) that transformers loads; either to ``.apr`` gets the canonical
    names of seed 001 §10.8 in Hugging Face's row order, with what gives the source
    back (``aprfast.canonical``), and such an ``.apr`` converts as the model it was
    made from (docs/FORMAT.md "Canonical names in .apr").  "keep" (and any ``arch=``)
    leaves names, rows and keys as they are: a container conversion.
    ``precision`` ("f32", "f16", "bf16") converts float tensors and dequantizes packed
    ones.  ``quantize`` (a type such as "Q8_0"; per-layer rules ``{glob: type | None}``,
    first match wins, unmatched kept; or ``callable(name, shape) -> type | None``;
    names are the output names) quantizes 2-D float tensors whose rows fit the type's
    blocks; others are kept.  MXFP4 weights of a compressed-tensors checkpoint become
    GGML MXFP4 tensors (``M.weight``) by a bit repack for a GGUF destination, or where
    ``quantize`` gives them MXFP4; GGML MXFP4 tensors to safetensors are written in
    compressed-tensors' layout with a ``config.json`` ``quantization_config`` beside
    them (docs/FORMAT.md "compressed-tensors"); every value is kept.  Renames
    (``strip_prefix``, ``arch``, ``rename``) rewrite the names compressed-tensors
    records hold.  A llama.cpp mix ("Q4_K_M", "Q5_K_M", "Q4_K_S", ...; and
    "Q6_K", "Q8_0", ... when the destination is a GGUF of a model llama.cpp knows) gives
    each tensor the type ``llama-quantize`` gives it (:func:`tensor_mix_types`,
    ``numerics.mixes``; docs/FORMAT.md "K-quant mixes") and a GGUF its
    ``general.file_type``.  ``compression`` ("lz4"/"zstd", .apr only) uses a spooled
    Writer (see ``convert.apr.apr_writer``: memory then grows with the compressed model)
    and the APR2 layout (from an aprender-layout source: a LayoutChangeWarning, as
    aprender does not read APR2).
    ``validate`` (``convert.validation``; docs/guide/converting.md): "strict" checks every
    tensor written against its expected statistics and aborts at the first failure
    (TensorValidationError, nothing written) unless ``force=True``; "relaxed" warns
    (ValidationWarning) and writes; "off" computes nothing.
    ``progress``: by default (None) a plain line on stderr when it is a terminal and the
    conversion has run a second (``aprfast.convert model.apr: 42% (3 s)``), else nothing;
    False shows nothing; a callable gets ``progress(done_bytes, total_bytes)`` after each
    tensor (source bytes) and nothing is printed (:mod:`aprfast.io.progress`).
    ``tokenizer``: embed a sibling ``tokenizer.json`` of a safetensors source.
    ``prune`` (a sparsity, or ``{"sparsity", "structure": "unstructured" | "row",
    "method": "magnitude", "select"}``) zeroes the smallest-magnitude elements or rows;
    ``lowrank`` (a rank, or ``{"rank", "select"}``) stores a 2-D ``W`` as the factors
    ``W.lowrank_a @ W.lowrank_b`` recorded under ``aprfast.lowrank`` in the metadata
    (``convert.optimize``: default selection, ties, skips; ``optimize.reconstruct``).
    The quality gate (``convert.gate``) measures every tensor a lossy
    option changes (relative L2 ``||W - W'|| / ||W||``, max ``|W - W'|``) and stops at
    the first above ``max_drift`` (default 0.1; None: no limit) with QualityGateError
    (E009, nothing written) unless ``force=True`` (QualityGateWarning).

    Returns ``{"source_format", "format", "tensors", "bytes", "arch", "names",
    "validation", "optimize", "quality"}``: ``names`` the mapping (None without
    ``arch``), ``validation`` the report (tensors checked, failed but written, warned,
    skipped), ``optimize`` what pruning/low-rank did and skipped, ``quality`` the
    gate's per-tensor drift (None for a lossless conversion).  See
    docs/guide/converting.md.

    Args:
        source: A path or URL of the model to read.
        destination: The path to write.
        to: The destination format ("apr", "safetensors", "gguf", "burnpack") when its
            extension does not say.
        quantize: A quantization type, a llama.cpp mix, per-layer rules or a callable, as above.
        precision: "f32", "f16" or "bf16".
        compression: "lz4" or "zstd" (``.apr`` destinations).
        arch: "whisper", "llama", "bert" or "auto": map names to ``.apr``'s.
        rename: ``callable(name) -> name | None`` or a dict.
        strip_prefix: A prefix (or tuple of them) removed from names.
        validate: "strict", "relaxed" or "off".
        force: Replace an existing destination; write despite failed checks.
        progress: None (a plain progress line on a terminal's stderr after a second),
            False (none), or a callable ``progress(done_bytes, total_bytes)`` called
            after each tensor.
        max_shard_size: Write a sharded safetensors checkpoint of shards this large.
        tokenizer: Embed a safetensors source's sibling ``tokenizer.json``.
        durable: fsync the output before returning.
        prune: A sparsity, or a dict of pruning options, as above.
        lowrank: A rank, or a dict of low-rank options, as above.
        max_drift: The quality gate's limit on relative L2 drift (None: no limit).
        storage_options: Options for a URL ``source``, as for :func:`aprfast.open`.
        verify: Check an ``.apr`` source's footer CRC32 (and signature) while it is
            read, before the output is published (ChecksumError otherwise); False
            converts a damaged file as it is.

    Returns:
        The summary dict described above.

    Raises:
        DestinationExistsError: ``destination`` exists and ``force`` is False (an
            AprIOError and a FileExistsError).
        FormatError: The source format is not recognised or is malformed.
        LayoutError: The destination cannot hold a tensor, two tensors end with one
            name, or an option is invalid.
        TensorValidationError: With ``validate="strict"``, a tensor failed its checks
            (a ValidationError, E009; nothing written).
        QualityGateError: A lossy option drifted a tensor past ``max_drift`` (a
            ValidationError, E009; nothing written).
        ChecksumError: With ``verify``, an ``.apr`` source's bytes do not match its
            CRC32 (E004; nothing written).
        AprFileNotFoundError: ``source`` does not exist.

    Examples:
        >>> import numpy as np, aprfast
        >>> aprfast.save_file({"w": np.ones((2, 32), np.float32)}, "model.apr")
        >>> summary = aprfast.convert("model.apr", "model.safetensors")
        >>> summary["source_format"], summary["format"], summary["tensors"]
        ('apr', 'safetensors', 1)
        >>> summary = aprfast.convert("model.safetensors", "model-q8.apr", quantize="q8_0")
        >>> aprfast.load_file("model-q8.apr")["w"], summary["quality"]["failed"]
        (QuantizedTensor(Q8_0, shape=[2, 32], nbytes=68), [])
    """
    precision, quantize = _check_options(validate, precision, quantize)
    label = os.path.basename(os.fspath(source)) if isinstance(source, (str, os.PathLike)) else type(source).__name__
    reporter = progress_to(progress, f"aprfast.convert {label}")  # a bad progress= fails before any work
    if names not in ("auto", "keep"):
        raise ValueError(f"names={names!r}: 'auto' (the destination's engine names) or 'keep'")
    kind = _destination_format(destination, to, max_shard_size)
    prefixes = (strip_prefix,) if isinstance(strip_prefix, str) else tuple(strip_prefix or ())
    validator = InlineValidator(validate, force=force, destination=destination)
    optimizer = Optimizer(prune, lowrank)
    gate = QualityGate(max_drift, force=force, destination=destination,
                       active=optimizer.active or precision is not None or quantize is not None)
    local = None
    if isinstance(source, str) and "://" in source:
        from ..remote import is_url

        if is_url(source):
            from ._remote import local_source

            dest = os.fspath(destination)
            if os.path.lexists(dest) and not os.path.isdir(dest) and not force:  # before anything is fetched
                raise DestinationExistsError("destination exists; pass force=True to replace it", path=destination)
            local = local_source(source, storage_options=storage_options, destination=destination,
                                 tokenizer=tokenizer)
            source = local.path
    try:
        with reporter as update:
            return _convert(source, destination, kind, precision, quantize, prefixes, validator, optimizer, gate,
                            arch, rename, compression, max_shard_size, force, durable, update, tokenizer, names,
                            verify)
    finally:
        if local is not None:
            local.close()


def _convert(source, destination, kind, precision, quantize, prefixes, validator, optimizer, gate, arch, rename,
             compression, max_shard_size, force, durable, progress, tokenizer, naming="auto",
             verify=True) -> dict:
    src = open_source(source, tokenizer=tokenizer, verify=verify)
    model = side = None
    try:
        if naming == "auto" and arch is None and kind != "apr":
            # an .apr under canonical names converts as the model it was made from
            src = _hf.restore_source_names(src)
        select = _repack_selector(kind, quantize, prefixes, rename, precision)
        if select is not None:  # compressed-tensors MXFP4 weights as GGML MXFP4 blocks (a bit repack)
            src = _ct.repack_mxfp4(src, select)
        select = _dequant_selector(kind, precision, quantize, prefixes, rename)
        if select is not None:  # the other compressed-tensors weights as their values
            src = _ct.dequantize_weights(src, select)
        if naming == "auto" and arch is None:
            model = _hf.plan_model(src, kind, destination)
            if model is not None and model.generated:  # llama.cpp's rope_freqs, made from config.json
                src = _hf.WithGeneratedTensors(src, model.generated)
            if kind == "apr":  # what a later .apr -> GGUF needs (a GGUF's keys are all kept already)
                src.metadata = dict(src.metadata, **_hf.apr_record(src))
        if kind == "apr":  # compressed-tensors weights keep their scales' names (docs/FORMAT.md)
            src.metadata = dict(src.metadata, **_ct.source_records(src))
        mapping = _map_names(src, arch, prefixes)
        quantize = _wants_mix(quantize, kind, src, model)
        if isinstance(quantize, Mix):
            quantize = _plan_mix(quantize, src, rename, prefixes, mapping, model)
        pairs = _plan(src, rename, precision, quantize, prefixes, mapping, optimizer, model)
        if _ct.METADATA_KEY in (src.metadata or {}):  # the records name the tensors as they are written
            src.metadata = _ct.renamed_records(src.metadata, {spec.name: out.name for spec, out in pairs})
        if model is not None and kind != "apr":
            outs = [out for _, out in pairs]
            src.metadata = model.metadata(outs)
            side = model.side_files(outs)
        elif kind in ("gguf", "apr") and _retyped(pairs) and "general.file_type" in (src.metadata or {}):
            # a GGUF's keys carried over (to GGUF, or kept in .apr for a later GGUF): the
            # file type follows the tensors as written, not the source's (issue 26 item 5)
            src.metadata = dict(src.metadata, **{"general.file_type": _hf.file_type([out for _, out in pairs])})
        layout = _ct.mxfp4_layout([out for _, out in pairs]) if kind == "safetensors" else {}
        if layout:  # GGML MXFP4 in compressed-tensors' layout, its quantization_config in config.json
            side = _ct.layout_side_files(side or {}, layout, _hf.side_file_dir(destination), force=force)
        if side:  # refused before anything is written
            _hf.write_side_files(side, _hf.side_file_dir(destination), force=force, check_only=True)
        if isinstance(quantize, _MixPlan) and kind == "gguf":
            src.metadata = _mix_metadata(src.metadata or {}, quantize.mix)
        if model is not None and kind == "apr":  # canonical names: what gives the source back
            src.metadata = dict(src.metadata, **{_hf.CANONICAL_KEY: model.record(pairs)})
        if mapping is not None and mapping.arch:
            src.metadata = dict(src.metadata, **{NAME_MAPPING_KEY: mapping.metadata()})
        log.debug("convert %s (%s, %d tensors, %d bytes) -> %s (%s): %d tensors written", source, src.format,
                  len(src.specs), sum(s.nbytes for s in src.specs), destination, kind, len(pairs))
        recorded = optimizer.metadata()  # aprfast.lowrank / aprfast.prune
        if recorded:
            src.metadata = dict(src.metadata, **recorded)
        if kind == "apr" and compression is not None and getattr(src, "layout", None) == "aprender":
            from ..layouts import warn_layout_change

            warn_layout_change(source, destination, f"compression={compression!r}", stacklevel=4)
        if kind == "apr" and compression is None and getattr(src, "aliases", None) and not optimizer.factored:
            total = _save_shared(src, destination, pairs, force, durable, progress, validator, optimizer, gate)
        else:
            outs = [out for _, out in pairs]
            writer = _open_writer(kind, destination, _ct.MXFP4LayoutWriter.specs_for(outs, layout), src.metadata,
                                  compression=compression, max_shard_size=max_shard_size, force=force,
                                  durable=durable, q8_headers=_q8_headers(src, pairs) if kind == "gguf" else None)
            if layout:
                writer = _ct.MXFP4LayoutWriter(writer, layout)
            total = _stream(src, writer, pairs, progress, validator, optimizer, gate,
                            model.rows if model is not None else None,
                            model.transposed if model is not None else None, ggml=kind == "gguf")
        if side:
            _hf.write_side_files(side, _hf.side_file_dir(destination), force=True, durable=durable)
    finally:
        src.close()
    names = None
    if mapping is not None:
        names = dict(mapping.metadata(), reason=mapping.reason)
    if model is not None:
        names = model.report()
    return {"source_format": src.format, "format": kind, "tensors": len(pairs), "bytes": total,
            "arch": mapping.arch if mapping is not None else (model.arch.gguf if model is not None else None),
            "names": names, "validation": validator.report(),
            "optimize": optimizer.report(), "quality": gate.report()}


def _retyped(pairs) -> bool:
    """Whether the conversion writes any tensor in another dtype than its source's."""
    return any(out.dtype is not spec.dtype for spec, out in pairs)


def _save_shared(src, destination, pairs, force, durable, progress, validator, optimizer=None, gate=None) -> int:
    """Tied tensors (a PyTorch source's ``aliases``) stored once: see ``pytorch.save_shared``.
    Each value is checked as it is computed, before anything is written."""
    if os.path.lexists(os.fspath(destination)) and not force:
        raise DestinationExistsError("destination exists; pass force=True to replace it", path=destination)

    def transform(value, spec, out):
        return _convert_tensor(value, spec, [out], optimizer, gate, validator)[0]
    return _pt.save_shared(src, destination, pairs, transform, progress, durable)


def _q8_headers(src, pairs) -> dict:
    """Scale and zero point of each Q8_TENSOR going to GGUF, read before the metadata is
    written (for an .apr source a view of the map: no data is copied)."""
    return {out.name: _gguf.q8_tensor_header(src.read(spec)) for spec, out in pairs
            if out.dtype.name == "Q8_TENSOR" and out.nbytes}


def _copy_unchanged(src, writer, spec: Spec, out: Spec, validator) -> bool:
    """Copy a tensor the transform leaves alone file to file in the kernel, when both
    sides allow it (the .apr Writer does not: it needs every byte for its CRC) and no
    validation needs its values."""
    if out.dtype is not spec.dtype or not hasattr(writer, "add_range") or validator.active:
        return False
    where = src.raw_range(spec) if hasattr(src, "raw_range") else None
    if where is None:
        return False
    writer.add_range(out.name, *where)
    return True


def _grouped(pairs):
    """(source spec, [output specs]) of consecutive pairs of one source (a factored
    tensor's two factors)."""
    groups = []
    for spec, out in pairs:
        if groups and groups[-1][0] is spec:
            groups[-1][1].append(out)
        else:
            groups.append((spec, [out]))
    return groups


def _stream(src, writer, pairs, progress, validator, optimizer=None, gate=None, rows=None, transposed=None,
            ggml=False) -> int:
    groups = _grouped(pairs)
    total = sum(spec.nbytes for spec, _ in groups)
    done, scratch = 0, Scratch()
    transposed = transposed or ()
    try:
        for spec, outs in groups:
            changed = (optimizer is not None and optimizer.op(spec.name)[0] is not None) or \
                (rows is not None and spec.name in rows) or spec.name in transposed
            if changed or not _copy_unchanged(src, writer, spec, outs[0], validator):
                # one tensor in memory at a time, read into the same buffer each time:
                # writer.add has consumed the value before the next read overwrites it;
                # the validator sees the value before any of its bytes are written
                value = src.read(spec, scratch)
                if rows is not None and spec.name in rows:  # the rotary row order of the destination's engine
                    value = _hf.permute_rows(value, rows[spec.name])
                if spec.name in transposed:  # GPT-2's Conv1D weights: [in, out] in Hugging Face
                    value, spec = _hf.transpose_value(value, spec)
                values = _convert_tensor(value, spec, outs, optimizer, gate, validator, ggml)
                for out, value in zip(outs, values):
                    writer.add(out.name, value)
            done += spec.nbytes
            if progress is not None:
                progress(done, total)
        _check_source(src)
        writer.close()
    except AprError as exc:
        writer.abort()
        if not isinstance(exc, ChecksumError):
            _check_source(src, exc)  # a damaged source says so, not what the damage broke
        raise
    except BaseException:
        writer.abort()
        raise
    return total


def _check_source(src, cause=None) -> None:
    """The source's own integrity check (an ``.apr`` source's CRC, issue 28 item 1),
    before the output is published; after another failure (``cause``), a ChecksumError
    it finds replaces that failure's error."""
    check = getattr(src, "check", None)
    if check is None:
        return
    if cause is None:
        check()
        log.debug("source integrity checked before publishing (%s)", type(src).__name__)
        return
    try:
        check()
    except ChecksumError as exc:
        raise exc from cause
    except Exception:  # noqa: BLE001 - any other trouble of the check: the first error stands
        return
