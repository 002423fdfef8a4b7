"""The safetensors-shaped public API: save_file, save, load_file, load, open, inspect."""

from __future__ import annotations

import io
import os

from . import layouts
from .limits import Limits
from .reader import AprFile
from .sources import open_source
from .tensors import as_inputs
from .writer import save_to

__all__ = ["save_file", "save", "load_file", "load", "open", "inspect"]


def _plan(tensors, metadata, layout, alignment):
    if not hasattr(tensors, "items"):
        raise TypeError(f"tensors must be a mapping of name to array, not {type(tensors).__name__}")
    inputs = as_inputs(tensors)
    return layouts.plan(inputs, metadata, layout=layout, alignment=alignment)


def save_file(tensors, path, metadata=None, *, layout: str = "auto", alignment: int = 64,
              durable: bool = True) -> None:
    """Write ``tensors`` (name -> array) to ``path`` atomically.

    ``layout`` is "aprender" (APR\\0, readable by aprender), "apr2" (the spec's APR2) or
    "auto": aprender's layout whenever it can hold everything asked for, else apr2.
    ``durable=False`` skips the fsyncs (the rename is still atomic).  ``path`` may also
    be a writable file object, including a pipe.
    """
    save_to(path, _plan(tensors, metadata, layout, alignment), durable=durable)


def save(tensors, metadata=None, *, layout: str = "auto", alignment: int = 64) -> bytes:
    """The bytes ``save_file`` would write."""
    plan = _plan(tensors, metadata, layout, alignment)
    out = io.BytesIO()
    save_to(out, plan)
    return out.getvalue()


def open(target, *, mode: str | None = None, limits: Limits | None = None, unknown_dtypes: str = "error",
         verify: bool = False, alignment: int = 64) -> AprFile:  # noqa: A001 - mirrors safe_open
    """Open a path, file object or bytes-like for lazy tensor access (see AprFile)."""
    return AprFile(target, mode=mode, limits=limits, unknown_dtypes=unknown_dtypes, verify=verify,
                   alignment=alignment)


def load_file(path, *, mmap: bool = True, verify: bool | None = None, limits: Limits | None = None,
              unknown_dtypes: str = "error", threads: int = 0) -> dict:
    """Every tensor of ``path``, by name.

    With ``mmap`` (the default) arrays are read-only views of the mapped file, valid
    as long as they live.  With ``mmap=False`` the data section is read with parallel
    ``pread`` into one aligned buffer and the arrays are owned and writable; the
    whole-file CRC is checked on the way unless ``verify=False``.
    """
    if mmap:
        with AprFile(path, mode="mmap", limits=limits, unknown_dtypes=unknown_dtypes,
                     verify=bool(verify)) as f:
            return f.tensors()
    with AprFile(path, mode="pread", limits=limits, unknown_dtypes=unknown_dtypes) as f:
        return f.load_all(verify=verify is not False, threads=threads)


def load(data, *, verify: bool = True, limits: Limits | None = None, unknown_dtypes: str = "error") -> dict:
    """Every tensor of an in-memory file (bytes, bytearray, memoryview), as owned arrays."""
    if isinstance(data, (str, os.PathLike)):
        raise TypeError("load() takes the file's bytes; use load_file() for a path")
    with AprFile(data, limits=limits, unknown_dtypes=unknown_dtypes) as f:
        return f.load_all(verify=verify)


def inspect(target, *, limits: Limits | None = None) -> dict:
    """Header, metadata and index of a file, reading nothing else (for a v1 container:
    its header and metadata, without checking the CRC or decrypting anything)."""
    source = open_source(target)  # opened once: AprFile takes it over for v2 files
    try:
        is_v1 = layouts.is_v1(source)
    except BaseException:
        source.close()
        raise
    if is_v1:
        try:
            return layouts.v1.inspect(source)
        finally:
            source.close()
    with AprFile(source, limits=limits, unknown_dtypes="raw") as f:
        return {
            "layout": f.layout,
            "header": f.header,
            "metadata": f.metadata,
            "tensors": f._file.describe(),
        }

