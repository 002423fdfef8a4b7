"""torch tensors in and out: ``aprfast.torch.save_file/save/load_file/load``.

A thin adapter over the NumPy API (torch is an optional extra). Tensors are moved to
the CPU and made contiguous before saving; bf16 travels as its raw 16-bit patterns,
so ml_dtypes is not needed for it.  Loaded tensors own their memory (one aligned
buffer per file, read with parallel ``pread``) and land on ``device``.
"""

from __future__ import annotations

import numpy as np
import torch

from . import api
from .dtypes import DTYPES
from .reader import AprFile
from .tensors import QuantizedTensor, RawTensor

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
        return {name: torch.empty(info.shape, dtype=_torch_dtype(name, info.dtype), device="meta")
                for name, info in ((n, f.info(n)) for n in f.keys())}


def _torch_dtype(name, dtype):
    if dtype is None or dtype.packed:
        raise TypeError(f"tensor {name!r} is {dtype.name if dtype else 'of unknown dtype'}; "
                        "torch has no dtype for it")
    if dtype is DTYPES["BF16"]:
        return torch.bfloat16
    return torch.from_numpy(np.empty(0, dtype.numpy)).dtype


def load(data, device="cpu", *, verify: bool = True) -> dict:
    with AprFile(data) as f:
        return _to_torch(f, f.load_all(verify=verify), device)


def _to_numpy(tensors) -> dict:
    return {name: _tensor_to_numpy(name, t) for name, t in tensors.items()}


def _tensor_to_numpy(name, tensor):
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"tensor {name!r} is {type(tensor).__name__}, not a torch.Tensor")
    tensor = tensor.detach().to("cpu").contiguous()
    if tensor.dtype == torch.bfloat16:
        bits = tensor.view(torch.int16).numpy().view(np.uint16)
        return RawTensor(DTYPES["BF16"], tuple(tensor.shape), bits)
    return tensor.numpy()


def _to_torch(file, arrays, device) -> dict:
    return {name: _array_to_torch(name, a, file.info(name).dtype).to(device) for name, a in arrays.items()}


def _array_to_torch(name, array, dtype):
    if isinstance(array, (QuantizedTensor, RawTensor)):
        raise TypeError(f"tensor {name!r} is {array!r}; torch has no dtype for it")
    if dtype is DTYPES["BF16"]:  # bf16 bits, whether NumPy sees ml_dtypes' bf16 or uint16
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(array)
