"""``aprfast.jax``: the functions of ``safetensors.flax``/JAX users import, same signatures.

Arrays go through NumPy: saved from host copies, loaded as ``jax.Array`` on the
default device (or ``device``).  Needs the ``jax`` package.
"""

from __future__ import annotations

import numpy as np

from . import api
from ._optional import require
from .files.frameworks import check_metadata, check_names, to_framework
from .files.reader import AprFile
from .files.safe_open import safe_open

# fail at import when JAX is missing, as safetensors.flax does, with the extra to install
require("jax")

__all__ = ["save_file", "save", "load_file", "load"]


def save_file(tensors, filename, metadata=None, **options) -> None:
    check_names(tensors)
    check_metadata(metadata)
    api.save_file(_to_numpy(tensors), filename, metadata, **options)


def save(tensors, metadata=None, **options) -> bytes:
    check_names(tensors)
    check_metadata(metadata)
    return api.save(_to_numpy(tensors), metadata, **options)


def load_file(filename, *, backend: str = "mmap", device="cpu") -> dict:
    """Every tensor of ``filename`` as a ``jax.Array`` on ``device``.  ``backend`` is
    safetensors.flax's: "mmap" reads through a private map, "pread" into owned memory;
    JAX copies either into its own buffers."""
    with safe_open(filename, "jax", device=device, backend=backend) as f:
        return f.get_tensors()


def load(data, device="cpu") -> dict:
    with AprFile(data) as f:
        return {name: to_framework(name, a, f.info(name).dtype, "jax", device)
                for name, a in f.load_all().items()}


def _to_numpy(tensors) -> dict:
    out = {}
    for name, value in tensors.items():
        if not hasattr(value, "__array__"):
            raise ValueError(f"tensor {name!r} is {type(value).__name__}, not an array")
        out[name] = np.asarray(value)
    return out
