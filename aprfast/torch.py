"""torch tensors in and out: ``aprfast.torch.save_file/save/load_file/load``.

A thin adapter over the NumPy API (torch is an optional extra), with the signatures
of ``safetensors.torch``.  Tensors are moved to the CPU and made contiguous before
saving; bf16 and float8 travel as their raw bits, so ml_dtypes is not needed for
them.  ``load_file`` gives writable tensors over a private copy-on-write map by
default, or owned memory with ``backend="pread"``, on ``device``.
"""

from __future__ import annotations

import torch

from . import api
from .frameworks import from_torch, to_framework, torch_meta
from .reader import AprFile

__all__ = ["save_file", "save", "load_file", "load"]


def save_file(tensors, filename, metadata=None, **options) -> None:
    api.save_file(_to_numpy(tensors), filename, metadata, **options)


def save(tensors, metadata=None, **options) -> bytes:
    return api.save(_to_numpy(tensors), metadata, **options)


def load_file(filename, device="cpu", *, backend: str = "mmap", verify: bool = True) -> dict:
    """Every tensor of ``filename`` on ``device``, writable.

    ``backend="mmap"`` (the default, as in safetensors) gives CPU tensors over a private
    copy-on-write map: no copy, writes never reach the file.  ``backend="pread"`` reads
    the data section into one owned buffer with parallel ``pread``.  The whole-file CRC
    is checked unless ``verify=False``.  ``device="meta"`` reads only the index: tensors
    with shapes and dtypes and no data."""
    if str(device) == "meta":
        return _meta_tensors(filename)
    if backend == "mmap":
        with AprFile(filename, mode="private", verify=verify) as f:
            return _to_torch(f, f.tensors(), device)
    if backend != "pread":
        raise ValueError(f"backend must be 'mmap' or 'pread', not {backend!r}")
    with AprFile(filename, mode="pread") as f:
        return _to_torch(f, f.load_all(verify=verify), device)


def _meta_tensors(path) -> dict:
    with AprFile(path) as f:
        return {name: torch_meta(name, f.info(name)) for name in f.keys()}


def load(data, device="cpu", *, verify: bool = True) -> dict:
    with AprFile(data) as f:
        return _to_torch(f, f.load_all(verify=verify), device)


def _to_numpy(tensors) -> dict:
    return {name: from_torch(name, t) for name, t in tensors.items()}


def _to_torch(file, arrays, device) -> dict:
    return {name: _array_to_torch(name, a, file.info(name).dtype, device) for name, a in arrays.items()}


def _array_to_torch(name, array, dtype, device):
    return to_framework(name, array, dtype, "torch", device)
