"""Importing checkpoints in the compressed-tensors layout (vLLM, llm-compressor): the
``quantization_config`` of ``config.json`` is read, each quantized weight is matched to
its config group and its scale tensors, checked, and recorded in the ``.apr`` metadata
(:data:`aprfast.numerics.compressed.METADATA_KEY`), so that ``get_tensor(name,
dequantize=True)`` gives the values compressed-tensors' decompression gives.  The
tensors themselves are kept as they are.
"""

from __future__ import annotations

import functools

from ..errors import CorruptError
from ..numerics.compressed import FORMATS, METADATA_KEY, check_record
from .patterns import compile_pattern

__all__ = ["records_for", "source_records", "METADATA_KEY"]

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
