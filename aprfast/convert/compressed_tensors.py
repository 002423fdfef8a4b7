"""Checkpoints in the compressed-tensors layout (vLLM, llm-compressor): the
``quantization_config`` of ``config.json`` is read, each quantized weight is matched to
its config group and its scale tensors, checked, and recorded in the ``.apr`` metadata
(:data:`aprfast.numerics.compressed.METADATA_KEY`), so that ``get_tensor(name,
dequantize=True)`` gives the values compressed-tensors' decompression gives.  The
tensors themselves are kept as they are.

A conversion that needs the values (a GGUF destination, ``precision=``, ``quantize=``
choosing the weight) reads each weight through :class:`DequantizedSource`: one plain
tensor ``<module>.weight`` of those values, its scale tensors and record gone, the
``quantization_config`` no longer describing it (docs/FORMAT.md "compressed-tensors").
"""

from __future__ import annotations

import functools
import os

import numpy as np

from .. import dtypes as _dtypes
from ..errors import CorruptError, LayoutError
from ..numerics.compressed import (
    FORMATS,
    METADATA_KEY,
    check_record,
    ct_mxfp4_to_ggml,
    ggml_mxfp4_to_ct,
    mxfp4_quantization_config,
    mxfp4_repackable,
    values_dtype,
    weight_values,
)
from ..tensors import QuantizedTensor, RawTensor
from ._common import DestinationExistsError, Spec, read_exact
from .patterns import compile_pattern

__all__ = ["records_for", "source_records", "records_of", "source_values", "logical_shapes", "METADATA_KEY",
           "repack_mxfp4", "MXFP4Source", "dequantize_weights", "DequantizedSource", "without_config",
           "ACTIVATION_TENSORS", "mxfp4_layout",
           "MXFP4LayoutWriter", "layout_side_files", "renamed_records"]

#: Most characters of one target / ignore pattern (a regex from the file: bounded).
MAX_PATTERN = 1000
_WEIGHT_DTYPES = {"F8_E4M3", "F8_E5M2", "I8"}


#: Compiled target patterns: a checkpoint names a few, each matched against every module.
_compiled = functools.lru_cache(maxsize=256)(compile_pattern)


def _matches(target: str, module: str) -> bool | None:
    """True/False for a regex (``re:``) or exact-name target; None for a class name
    (``Linear``), which names cannot tell."""
    if not isinstance(target, str) or len(target) > MAX_PATTERN:
        raise CorruptError(f"quantization_config target {target!r:.80} is not a string of at most "
                           f"{MAX_PATTERN} characters")
    if target.startswith("re:"):
        return _compiled(target[3:]).match(module)
    if target == module:
        return True
    return None if target[:1].isupper() and "." not in target else False


def _group_for(module: str, groups: dict, ignore: list, packed: bool):
    if any(_matches(t, module) for t in ignore):
        return None
    named, by_class = [], []
    for key, group in groups.items():
        if not isinstance(group, dict):
            raise CorruptError(f"quantization_config config_groups[{key!r}] is not an object")
        targets = group.get("targets") or []
        if not isinstance(targets, list):
            raise CorruptError(f"quantization_config config_groups[{key!r}].targets is not a list")
        hits = [_matches(t, module) for t in targets]
        if any(hits):
            named.append(group)
        elif None in hits:
            by_class.append(group)
    chosen = named or by_class
    if len(chosen) > 1:  # the stored tensors tell a packed scheme from an unpacked one
        fitting = [g for g in chosen if (_format(g, {}) or "").endswith("pack-quantized") == packed]
        chosen = fitting or chosen
    return chosen[0] if chosen else None


def _format(group: dict, config: dict):
    return group.get("format") or config.get("format")


def records_for(config: dict, specs) -> dict:
    """The ``{METADATA_KEY: ...}`` metadata for a checkpoint whose ``config.json`` is
    ``config`` and whose tensors are ``specs`` (names, dtypes, shapes); {} when it is
    not a compressed-tensors checkpoint.

    Raises:
        CorruptError: A malformed ``quantization_config``, or a quantized weight whose
            scale tensors are missing or of the wrong shape (named).
        LayoutError: A quantized weight in a format aprfast cannot decode.
    """
    qc = config.get("quantization_config") if isinstance(config, dict) else None
    if not isinstance(qc, dict) or qc.get("quant_method") != "compressed-tensors":
        return {}
    groups = qc.get("config_groups") or {}
    ignore = qc.get("ignore") or []
    if not isinstance(groups, dict) or not isinstance(ignore, list):
        raise CorruptError("quantization_config config_groups must be an object and ignore a list")
    infos = {spec.name: (spec.dtype.name, tuple(spec.shape)) for spec in specs}
    modules = {}
    for name, (dtype, _) in infos.items():
        if name.endswith(".weight_packed"):
            modules[name[:-len(".weight_packed")]] = True
        elif name.endswith(".weight") and (dtype in _WEIGHT_DTYPES or name[:-len("weight")] + "weight_scale" in infos):
            modules.setdefault(name[:-len(".weight")], False)
    weights = {}
    for module, packed in sorted(modules.items()):
        group = _group_for(module, groups, ignore, packed)
        if group is None:
            continue
        fmt = _format(group, qc)
        args = group.get("weights")
        if not isinstance(args, dict):
            raise CorruptError(f"quantization_config group for {module!r} has no weights arguments")
        suffix = FORMATS[fmt][0] if fmt in FORMATS else ("weight_packed" if packed else "weight")
        record = {"format": fmt, "strategy": args.get("strategy"), "num_bits": args.get("num_bits"),
                  "type": args.get("type"), "group_size": args.get("group_size"),
                  "block_structure": args.get("block_structure"), "symmetric": args.get("symmetric", True),
                  "scale": f"{module}.weight_scale"}
        if fmt == "pack-quantized" or f"{module}.weight_shape" in infos:  # the weight's own shape
            record["weight_shape"] = f"{module}.weight_shape"
        for key in ("global_scale", "zero_point"):
            if f"{module}.weight_{key}" in infos or (key == "zero_point" and record["symmetric"] is False):
                record[key] = f"{module}.weight_{key}"
        if fmt in FORMATS:  # another format is kept as it is; its values are refused when asked for
            check_record(f"{module}.{suffix}", record, infos.get)
        weights[f"{module}.{suffix}"] = record
    if not weights:
        return {}
    return {METADATA_KEY: {"quantization_config": qc, "weights": weights}}


def source_records(source) -> dict:
    """:func:`records_for` of a safetensors source beside a ``config.json`` (a model
    directory), else {}."""
    from .hf_arch import _hf_dir_files

    files = _hf_dir_files(source)
    return records_for(files["config.json"], source.specs) if files and "config.json" in files else {}


# --- MXFP4: compressed-tensors <-> GGML blocks (docs/FORMAT.md "compressed-tensors") -----
def records_of(src) -> dict:
    """The compressed-tensors records (``{weight name: record}``) of a convert source: an
    .apr's metadata, or a safetensors model directory's config.json; {} for others.

    Raises:
        CorruptError: A malformed ``quantization_config`` (see :func:`records_for`).
    """
    block = (src.metadata or {}).get(METADATA_KEY)
    if block is None:
        block = source_records(src).get(METADATA_KEY)
    weights = block.get("weights") if isinstance(block, dict) else None
    return weights if isinstance(weights, dict) else {}


def _spec_info(specs: dict):
    """``info(name) -> (dtype name, shape) | None`` over ``{name: Spec}``: what
    :func:`aprfast.numerics.compressed.weight_values` asks of a source's tensors."""

    def info(name):
        spec = specs.get(name) if isinstance(name, str) else None
        return None if spec is None else (spec.dtype.name, tuple(spec.shape))

    return info


def source_values(src, name: str, record: dict):
    """compressed-tensors' values of the weight ``name`` of a convert source (see
    :func:`aprfast.numerics.compressed.weight_values`)."""
    specs = {spec.name: spec for spec in src.specs}
    return weight_values(name, record, lambda tensor: src.read(specs[tensor]), _spec_info(specs))


def logical_shapes(records: dict, info, read) -> dict:
    """``{weight name: logical shape}`` of the records, each checked (CorruptError /
    LayoutError naming the weight); a record of a format aprfast cannot decode is left out."""
    out = {}
    for name, record in records.items():
        if isinstance(record, dict) and record.get("format") in FORMATS:
            out[name] = check_record(name, record, info, read)
    return out


def repack_mxfp4(src, select):
    """``src`` with its compressed-tensors MXFP4 weights read as GGML MXFP4 blocks (a
    :class:`MXFP4Source`), or ``src`` itself when it has none that ``select`` takes.

    Args:
        src: A convert source (``specs``, ``metadata``, ``read``).
        select: ``select(name, shape) -> bool`` for each repackable weight, by the name
            it gets (``<module>.weight``) and its logical shape.

    Returns:
        A source.

    Raises:
        CorruptError: A record whose tensors are missing or of the wrong shape.
        LayoutError: The weight's new name is already a tensor's.
    """
    records = records_of(src)
    if not records:
        return src
    infos = {spec.name: spec for spec in src.specs}

    info = _spec_info(infos)

    chosen = {}
    for packed, record in records.items():
        if not mxfp4_repackable(record) or packed not in infos:
            continue
        shape = check_record(packed, record, info)
        name = packed[:-len("_packed")] if packed.endswith("_packed") else packed
        if name != packed and name in infos:
            raise LayoutError(f"compressed-tensors weight {packed!r} becomes {name!r}, which the source holds "
                              "already")
        if select(name, shape):
            chosen[packed] = (name, shape, infos[record["scale"]])
    return MXFP4Source(src, chosen) if chosen else src


class _RewrittenSource:
    """What the two rewriting sources below share: ``_src`` is the wrapped source and
    ``_parts`` the names they build themselves; everything else is ``_src``'s."""

    _src = None  # until __init__ sets it: __getattr__ then finds nothing, not itself

    def __getattr__(self, name):
        return getattr(self._src, name)

    def raw_range(self, spec):
        if spec.name in self._parts:
            return None
        raw_range = getattr(self._src, "raw_range", None)
        return raw_range(spec) if raw_range is not None else None

    def tensors(self, wanted=None):
        for spec in self.specs:
            if wanted is None or spec.name in wanted:
                yield spec.name, self.read(spec)

    def close(self) -> None:
        self._src.close()


class MXFP4Source(_RewrittenSource):
    """A source whose chosen compressed-tensors MXFP4 weights (``weight_packed`` with
    its ``weight_scale``) read as one GGML MXFP4 tensor ``<module>.weight``: the same
    E2M1 codes and E8M0 exponents, repacked (no rounding); their records leave the
    metadata.  Everything else is the wrapped source's."""

    def __init__(self, src, chosen: dict):
        self._src = src
        mxfp4 = _dtypes.by_name("MXFP4")
        scales = {scale.name for _, _, scale in chosen.values()}
        self._parts = {}
        specs = []
        for spec in src.specs:
            if spec.name in chosen:
                name, shape, scale = chosen[spec.name]
                new = Spec(name, mxfp4, shape)
                self._parts[name] = (spec, scale)
                specs.append(new)
            elif spec.name not in scales:
                specs.append(spec)
        self.specs = specs
        metadata = dict(src.metadata or {})
        block = metadata.get(METADATA_KEY)
        if isinstance(block, dict) and isinstance(block.get("weights"), dict):
            left = {k: v for k, v in block["weights"].items() if k not in chosen}
            if left:
                metadata[METADATA_KEY] = dict(block, weights=left)
            else:
                del metadata[METADATA_KEY]
        self.metadata = metadata


    def read(self, spec, scratch=None):
        parts = self._parts.get(spec.name)
        if parts is None:
            return self._src.read(spec, scratch)
        packed, scale = parts
        blocks = ct_mxfp4_to_ggml(spec.name, self._src.read(packed), self._src.read(scale), spec.shape)
        return QuantizedTensor(spec.dtype, spec.shape, blocks)



#: A quantized module's activation parameters (static input/output quantization): a
#: module whose weight is dequantized leaves them too, as its config entry goes.
ACTIVATION_TENSORS = ("input_scale", "input_zero_point", "input_global_scale", "output_scale",
                      "output_zero_point")


# --- the values instead of the packed layout (docs/FORMAT.md "compressed-tensors") ----
def dequantize_weights(src, select):
    """``src`` with the compressed-tensors weights ``select`` takes read as their values
    (a :class:`DequantizedSource`), or ``src`` itself when it takes none.

    Args:
        src: A convert source (``specs``, ``metadata``, ``read``).
        select: ``select(name, shape) -> bool`` by the name the weight gets
            (``<module>.weight``) and its logical shape; or True: every weight, each
            one aprfast must decode (a GGUF destination cannot hold the packed layout).

    Returns:
        A source.

    Raises:
        CorruptError: A record whose tensors are missing or of the wrong shape (named).
        LayoutError: With ``select=True``, a weight in a format aprfast cannot decode;
            or the weight's new name is already a tensor's.
    """
    records = records_of(src)
    if not records:
        return src
    specs = {spec.name: spec for spec in src.specs}

    info = _spec_info(specs)

    def read(name):
        return src.read(specs[name])

    chosen = {}
    for packed, record in records.items():
        if select is not True and (not isinstance(record, dict) or record.get("format") not in FORMATS):
            continue  # kept as it is, as it came; its values are refused when asked for
        shape = check_record(packed, record, info, read)
        name = packed[:-len("_packed")] if packed.endswith("_packed") else packed
        if name != packed and name in specs:
            raise LayoutError(f"compressed-tensors weight {packed!r} becomes {name!r}, which the source holds "
                              "already")
        if select is True or select(name, shape):
            chosen[packed] = (name, shape, values_dtype(record, info), record)
    if not chosen:
        return src
    kept = set()  # tensors a weight left compressed still needs
    for packed, record in records.items():
        if packed not in chosen and isinstance(record, dict):
            kept.update(record.get(key) for key in _TENSOR_FIELDS)
    dropped = {record[key] for _, _, _, record in chosen.values() for key in _TENSOR_FIELDS
               if isinstance(record.get(key), str)}
    for _, _, _, record in chosen.values():  # a plain weight's module quantizes no activations either
        module = record["scale"].rsplit(".", 1)[0] if isinstance(record.get("scale"), str) else None
        dropped.update(f"{module}.{kind}" for kind in ACTIVATION_TENSORS if f"{module}.{kind}" in specs)
    dropped -= kept
    return DequantizedSource(src, chosen, dropped, keep=len(chosen) < len(records))


def without_config(config, modules, keep: bool):
    """``config`` (a config.json object) whose ``quantization_config`` no longer
    describes the dequantized ``modules``: gone when no quantized weight is left
    (``keep`` False), else with the modules added to its ``ignore`` list, so that
    transformers loads their plain weights as they are.

    Args:
        config: The config.json object (any value: returned as it is unless a
            compressed-tensors one).
        modules: The module names whose weights are now plain.
        keep: Whether other weights stay compressed.

    Returns:
        The config, a new object when changed.

    Example:
        >>> qc = {"quant_method": "compressed-tensors", "ignore": ["lm_head"]}
        >>> without_config({"quantization_config": qc}, ["proj"], keep=True)["quantization_config"]["ignore"]
        ['lm_head', 'proj']
        >>> without_config({"quantization_config": qc, "model_type": "llama"}, ["proj"], keep=False)
        {'model_type': 'llama'}
    """
    qc = config.get("quantization_config") if isinstance(config, dict) else None
    if not isinstance(qc, dict) or qc.get("quant_method") != "compressed-tensors":
        return config
    config = dict(config)
    if not keep:
        del config["quantization_config"]
        return config
    ignore = qc.get("ignore") if isinstance(qc.get("ignore"), list) else []
    config["quantization_config"] = dict(qc, ignore=list(ignore) + sorted(set(modules) - set(ignore)))
    return config


class DequantizedSource(_RewrittenSource):
    """A source whose chosen compressed-tensors weights read as one plain tensor
    ``<module>.weight`` each: the values compressed-tensors' decompression gives
    (:func:`aprfast.numerics.compressed.weight_values`), in the dtype that holds them
    exactly (bfloat16 for NVFP4/MXFP4/MXFP6/MXFP8, else the scale's).  Their scale,
    global scale, zero point and weight_shape tensors, their modules' activation scales
    (:data:`ACTIVATION_TENSORS`) and their records leave, and the
    ``quantization_config`` of the model files (an .apr's recorded config.json, or the
    one beside a safetensors source, as :meth:`edit_model_files` gives it) stops
    describing them.  Everything else is the wrapped source's."""

    def __init__(self, src, chosen: dict, dropped: set, keep: bool):
        self._src = src
        self._keep = keep
        by_name = {spec.name: spec for spec in src.specs}
        self._parts = {}
        specs = []
        for spec in src.specs:
            if spec.name in chosen:
                name, shape, dtype, record = chosen[spec.name]
                self._parts[name] = (spec.name, record, dtype)
                specs.append(Spec(name, _dtypes.by_name(dtype), shape))
            elif spec.name not in dropped:
                specs.append(spec)
        self.specs = specs
        self._specs = by_name
        self.modules = sorted(name[:-len(".weight")] if name.endswith(".weight") else name
                              for name, _, _, _ in chosen.values())
        metadata = dict(src.metadata or {})
        block = metadata.get(METADATA_KEY)
        if isinstance(block, dict) and isinstance(block.get("weights"), dict):
            left = {k: v for k, v in block["weights"].items() if k not in chosen}
            if left:
                qc = without_config({"quantization_config": block.get("quantization_config")}, self.modules, True)
                metadata[METADATA_KEY] = dict(block, weights=left, quantization_config=qc["quantization_config"])
            else:
                del metadata[METADATA_KEY]
        from .hf_arch import HF_FILES_KEY

        files = metadata.get(HF_FILES_KEY)
        if isinstance(files, dict) and isinstance(files.get("config.json"), dict):
            metadata[HF_FILES_KEY] = self.edit_model_files(files)
        self.metadata = metadata


    def edit_model_files(self, files: dict) -> dict:
        """The model files (``{"config.json": {...}, ...}``) with the quantization_config
        adjusted for the dequantized weights (:func:`without_config`)."""
        if not isinstance(files, dict) or "config.json" not in files:
            return files
        inner = getattr(self._src, "edit_model_files", None)
        files = inner(files) if inner is not None else files
        return dict(files, **{"config.json": without_config(files["config.json"], self.modules, self._keep)})

    def read(self, spec, scratch=None):
        parts = self._parts.get(spec.name)
        if parts is None:
            return self._src.read(spec, scratch)
        packed, record, dtype = parts

        info = _spec_info(self._specs)

        values = weight_values(packed, record, lambda tensor: self._src.read(self._specs[tensor]), info)
        return _exactly(values, dtype, spec)



def _exactly(values, dtype: str, spec):
    """``values`` (float32, or float64) in ``dtype``, which holds each of them exactly:
    a bfloat16 value is the upper half of its float32 bits (NaN payloads kept)."""
    if dtype == "BF16":
        bits = (np.ascontiguousarray(values, np.float32).view(np.uint32) >> 16).astype(np.uint16)
        if _dtypes.bfloat16 is not None:
            return bits.view(_dtypes.bfloat16)
        return RawTensor(spec.dtype, spec.shape, bits)
    if dtype == "F16":
        return values.astype(np.float16)
    if dtype == "F64":
        return values.astype(np.float64)
    return values.astype(np.float32)


def mxfp4_layout(specs) -> dict:
    """How a safetensors destination holds the GGML MXFP4 tensors among ``specs``: ``{name:
    (weight_packed spec, weight_scale spec)}`` in compressed-tensors' layout ({} when
    there are none).

    Raises:
        LayoutError: An MXFP4 tensor that is not 2-D or whose name does not end in
            ``.weight``, or whose new names clash with another tensor's.
    """
    names = {spec.name for spec in specs}
    out = {}
    u8 = _dtypes.by_name("U8")
    for spec in specs:
        if spec.dtype.name != "MXFP4":
            continue
        if len(spec.shape) != 2 or not spec.name.endswith(".weight"):
            raise LayoutError(f"tensor {spec.name!r}: safetensors holds MXFP4 in compressed-tensors' layout, "
                              f"for 2-D tensors named <module>.weight, not {len(spec.shape)}-D {spec.name!r}; "
                              "convert with precision='f32' to dequantize")
        rows, cols = spec.shape
        packed, scale = spec.name + "_packed", spec.name + "_scale"
        for new in (packed, scale):
            if new in names:
                raise LayoutError(f"tensor {spec.name!r} is written as {new!r} in compressed-tensors' layout, "
                                  "a name another tensor has")
        out[spec.name] = (Spec(packed, u8, (rows, cols // 2)), Spec(scale, u8, (rows, cols // 32)))
    return out


class MXFP4LayoutWriter:
    """A safetensors writer (declared the specs :func:`mxfp4_layout` gives) taking the
    GGML MXFP4 tensors as they are declared to :func:`aprfast.convert`: each is written
    as its ``weight_packed`` and ``weight_scale``."""

    def __init__(self, inner, layout: dict):
        self._inner = inner
        self._layout = layout

    @staticmethod
    def specs_for(specs, layout: dict) -> list:
        """The specs the inner writer declares, each MXFP4 tensor's pair in its place."""
        out = []
        for spec in specs:
            out.extend(layout.get(spec.name, (spec,)))
        return out

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def add(self, name: str, value) -> None:
        pair = self._layout.get(name)
        if pair is None:
            self._inner.add(name, value)
            return
        packed, scale = pair
        rows, half = packed.shape
        codes, exps = ggml_mxfp4_to_ct(name, value, (rows, half * 2))
        self._inner.add(packed.name, codes)
        self._inner.add(scale.name, exps)

    def add_range(self, name: str, fd: int, offset: int) -> None:
        pair = self._layout.get(name)
        if pair is None:
            self._inner.add_range(name, fd, offset)
            return
        rows, half = pair[0].shape
        size = _dtypes.by_name("MXFP4").nbytes((rows, half * 2))
        data = read_exact(fd, offset, size, f"tensor {name!r}", None)
        self.add(name, QuantizedTensor("MXFP4", (rows, half * 2), bytearray(data)))

    def close(self) -> None:
        self._inner.close()

    def abort(self) -> None:
        self._inner.abort()


def layout_side_files(side: dict, layout: dict, directory, *, force: bool) -> dict:
    """``side`` (the JSON files written beside a safetensors destination) with the
    ``quantization_config`` of the MXFP4 weights :func:`mxfp4_layout` placed: in the
    model conversion's config.json, else in the destination's config.json (an existing
    one is refused unless ``force``, which keeps its other keys).

    Raises:
        DestinationExistsError: config.json exists beside the destination and
            ``force`` is False.
        CorruptError: An existing config.json that is not a JSON object.
    """
    if not layout:
        return side
    config = mxfp4_quantization_config(name[:-len(".weight")] for name in layout)
    side = dict(side)
    if "config.json" in side:
        side["config.json"] = dict(side["config.json"], quantization_config=config)
        return side
    path = os.path.join(directory or ".", "config.json")
    doc = {}
    if os.path.lexists(path):
        if not force:
            raise DestinationExistsError("config.json exists beside the destination (its MXFP4 weights need a "
                                         "quantization_config there); pass force=True to add it", path=path)
        from .tokenizer import _read_json

        doc = _read_json(path)
        if not isinstance(doc, dict):
            raise CorruptError("config.json is not a JSON object", path=path)
    side["config.json"] = dict(doc, quantization_config=config)
    return side


#: The record fields that name tensors (besides the record's key, the weight itself).
_TENSOR_FIELDS = ("scale", "global_scale", "zero_point", "weight_shape")


def renamed_records(metadata: dict, names: dict) -> dict:
    """``metadata`` with the compressed-tensors records' tensor names (each weight's key
    and the tensors its record names) rewritten as a conversion renames the tensors
    (``names``: source name -> output name, the tensors written).  A weight not written
    loses its record.

    Raises:
        LayoutError: A weight is written but a tensor its record needs is not.
    """
    block = metadata.get(METADATA_KEY) if isinstance(metadata, dict) else None
    weights = block.get("weights") if isinstance(block, dict) else None
    if not isinstance(weights, dict):
        return metadata
    out = {}
    for name, record in weights.items():
        if name not in names:
            continue
        if isinstance(record, dict):
            record = dict(record)
            for key in _TENSOR_FIELDS:
                tensor = record.get(key)
                if isinstance(tensor, str):
                    if tensor not in names:
                        raise LayoutError(f"compressed-tensors weight {name!r} is written (as {names[name]!r}) but "
                                          f"its {key} tensor {tensor!r} is not; keep it or drop both")
                    record[key] = names[tensor]
        out[names[name]] = record
    metadata = dict(metadata)
    if out:
        metadata[METADATA_KEY] = dict(block, weights=out)
    else:
        del metadata[METADATA_KEY]
    return metadata
