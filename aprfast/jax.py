"""``aprfast.jax``: the functions of ``safetensors.flax``/JAX users import, same signatures.

Arrays go through NumPy: saved from host copies, loaded as ``jax.Array`` on the
default device (or ``device``).  Needs the ``jax`` package.
"""

from __future__ import annotations

import jax  # noqa: F401 - fail at import when JAX is missing, as safetensors.flax does
import numpy as np

from . import api
from .frameworks import to_framework
from .reader import AprFile

__all__ = ["save_file", "save", "load_file", "load"]


def save_file(tensors, filename, metadata=None, **options) -> None:
    api.save_file(_to_numpy(tensors), filename, metadata, **options)


def save(tensors, metadata=None, **options) -> bytes:
    return api.save(_to_numpy(tensors), metadata, **options)


def load_file(filename, device="cpu") -> dict:
    with AprFile(filename) as f:
        return {name: to_framework(name, a, f.info(name).dtype, "jax", device) for name, a in f.tensors().items()}


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
