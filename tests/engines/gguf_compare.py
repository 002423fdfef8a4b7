"""Compare two GGUF files as the engine tests need: tensors (names, types, shapes,
bytes) and keys (types and values), descriptive keys aside."""

from __future__ import annotations

import numpy as np

#: Keys that describe the model rather than define it: they may differ.
DESCRIPTIVE = ("general.name", "general.size_label", "general.basename", "general.finetune", "general.version",
               "general.description", "general.author", "general.organization", "general.license",
               "general.url", "general.repo_url", "general.source.", "general.base_model", "general.tags",
               "general.languages", "general.datasets")


def read(path):
    """(keys: name -> (types, value), tensors: name -> (type, shape, bytes))."""
    import gguf

    reader = gguf.GGUFReader(path)
    keys = {}
    for name, field in reader.fields.items():
        if name.startswith("GGUF."):
            continue
        types = [gguf.GGUFValueType(t).name for t in field.types]
        keys[name] = (types, field.contents())
    tensors = {t.name: (t.tensor_type.name, [int(n) for n in t.shape], np.asarray(t.data).tobytes())
               for t in reader.tensors}
    return keys, tensors


def differences(ours_path, ref_path, allow_extra=("aprfast.",)) -> list:
    """What differs between our GGUF and the reference one: every tensor and every
    non-descriptive key of the reference must be in ours, equal; keys only we have must
    start with one of ``allow_extra``."""
    ours, ours_t = read(ours_path)
    ref, ref_t = read(ref_path)
    out = []
    for name in sorted(set(ref_t) | set(ours_t)):
        if name not in ours_t or name not in ref_t:
            out.append(f"tensor {name}: only in {'the reference' if name in ref_t else 'ours'}")
            continue
        (rt, rs, rb), (ot, os_, ob) = ref_t[name], ours_t[name]
        if (rt, rs) != (ot, os_):
            out.append(f"tensor {name}: {ot} {os_} vs reference {rt} {rs}")
        elif rb != ob:
            out.append(f"tensor {name}: bytes differ")
    for key in sorted(set(ref) | set(ours)):
        if key.startswith(DESCRIPTIVE):
            continue
        if key not in ours:
            out.append(f"key {key}: missing (reference {ref[key]!r:.80})")
        elif key not in ref:
            if not key.startswith(tuple(allow_extra)):
                out.append(f"key {key}: only in ours ({ours[key]!r:.80})")
        elif ours[key] != ref[key]:
            out.append(f"key {key}: {ours[key]!r:.120} vs reference {ref[key]!r:.120}")
    return out


def same_files(a, b) -> None:
    """Two directories hold the same files, byte for byte (GGUF -> .apr -> HF against
    GGUF -> HF)."""
    from pathlib import Path

    a, b = Path(a), Path(b)
    assert sorted(p.name for p in a.iterdir()) == sorted(p.name for p in b.iterdir())
    for path in a.iterdir():
        assert path.read_bytes() == (b / path.name).read_bytes(), path.name


def apr_names(path) -> set:
    """The tensor names of an .apr file."""
    import aprfast

    with aprfast.open(path) as f:
        return set(f.keys())
