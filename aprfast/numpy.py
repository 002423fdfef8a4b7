"""``aprfast.numpy``: the functions of ``safetensors.numpy``, with the same signatures.

``load_file`` maps the file privately (copy-on-write): the arrays are writable, cost
no copy and no memory for pages never written, and writes never reach the file.
``load`` reads an in-memory file into owned arrays.
"""

from __future__ import annotations

from . import api
from .files.frameworks import UsageError, check_metadata, check_names
from .files.reader import AprFile

__all__ = ["save_file", "save", "load_file", "load"]


def save_file(tensor_dict, filename, metadata=None, **options) -> None:
    """Write ``tensor_dict`` (name -> array) to ``filename`` atomically (see
    :func:`aprfast.save_file` for ``options``).  ``metadata`` is str to str, as in
    safetensors (aprfast.save_file takes any JSON value)."""
    check_names(tensor_dict)
    check_metadata(metadata)
    api.save_file(tensor_dict, filename, metadata, **options)


def save(tensor_dict, metadata=None, **options) -> bytes:
    """The file's bytes."""
    check_names(tensor_dict)
    check_metadata(metadata)
    return api.save(tensor_dict, metadata, **options)


def load_file(filename, *, backend: str = "mmap") -> dict:
    """Every tensor of ``filename`` as a writable array.

    ``backend="mmap"`` (the default) maps the file privately (copy-on-write): no copy,
    no memory for pages never written.  ``backend="pread"`` reads the data section
    into one owned buffer with parallel ``pread``, checking the whole-file CRC."""
    if backend == "mmap":
        with AprFile(filename, mode="private") as f:
            return f.tensors()
    if backend == "pread":
        return api.load_file(filename, mmap=False)
    raise UsageError(f"backend must be 'mmap' or 'pread', not {backend!r}")


def load(data) -> dict:
    """Every tensor of the file held in ``data`` (bytes-like), as owned arrays."""
    if isinstance(data, str):  # aprfast.load would take it for a path
        raise TypeError("load takes the file's bytes, not a str (load_file reads a path)")
    return api.load(data)
