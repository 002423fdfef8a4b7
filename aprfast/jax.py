"""``aprfast.jax``: the functions of ``safetensors.flax``/JAX users import, same signatures.

Arrays go through NumPy: saved from host copies, loaded as ``jax.Array`` on the
default device (or ``device``).  Needs the ``jax`` package.  See
docs/guide/safetensors.md.
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
    """Write ``tensors`` (name -> jax.Array) to ``filename`` atomically, from host copies.

    Args:
        tensors: A dict of name (str) to array (anything with ``__array__``).
        filename: The path to write.
        metadata: A dict of str to str, or None (as safetensors.flax).
        **options: Keyword arguments of :func:`aprfast.save_file`.

    Raises:
        ValueError: A value that is not an array.
        TypeError: A name that is not a str, or metadata that is not str to str.
        LayoutError: As for :func:`aprfast.save_file`.
        AprIOError: The operating system refused the write.

    Examples:
        >>> import jax.numpy as jnp
        >>> from aprfast.jax import save_file, load_file
        >>> save_file({"w": jnp.arange(3, dtype=jnp.float32)}, "model.apr")
        >>> load_file("model.apr")["w"].tolist()
        [0.0, 1.0, 2.0]
    """
    check_names(tensors)
    check_metadata(metadata)
    api.save_file(_to_numpy(tensors), filename, metadata, **options)


def save(tensors, metadata=None, **options) -> bytes:
    """The bytes :func:`save_file` would write.

    Args:
        tensors: A dict of name (str) to array.
        metadata: A dict of str to str, or None.
        **options: Keyword arguments of :func:`aprfast.save`.

    Returns:
        The complete file.

    Raises:
        ValueError: A value that is not an array.
        TypeError: A name that is not a str, or metadata that is not str to str.

    Examples:
        >>> import jax.numpy as jnp
        >>> from aprfast.jax import save, load
        >>> load(save({"b": jnp.ones(2)}))["b"].tolist()
        [1.0, 1.0]
    """
    check_names(tensors)
    check_metadata(metadata)
    return api.save(_to_numpy(tensors), metadata, **options)


def load_file(filename, *, backend: str = "mmap", device="cpu") -> dict:
    """Every tensor of ``filename`` as a ``jax.Array`` on ``device``.  ``backend`` is
    safetensors.flax's: "mmap" reads through a private map, "pread" into owned memory;
    JAX copies either into its own buffers.

    Args:
        filename: The path to read.
        backend: "mmap", "pread" or "direct".
        device: The JAX device ("cpu", or a ``jax.Device``).

    Returns:
        A dict of name to ``jax.Array``, in file order.

    Raises:
        UsageError: An unknown ``backend`` or device (an AprError and a ValueError).
        AprFileNotFoundError: ``filename`` does not exist.
        FormatError: Not an ``.apr`` file.

    Examples:
        >>> import jax.numpy as jnp
        >>> from aprfast.jax import save_file, load_file
        >>> save_file({"w": jnp.zeros((2, 2))}, "model.apr")
        >>> load_file("model.apr", backend="pread")["w"].shape
        (2, 2)
    """
    with safe_open(filename, "jax", device=device, backend=backend) as f:
        return f.get_tensors()


def load(data, device="cpu") -> dict:
    """Every tensor of the file held in ``data`` (bytes-like), as ``jax.Array``.

    Args:
        data: The file's bytes.
        device: The JAX device.

    Returns:
        A dict of name to ``jax.Array``.

    Raises:
        FormatError: Not an ``.apr`` file.
        ChecksumError: The CRC does not match the bytes.

    Examples:
        >>> import jax.numpy as jnp
        >>> from aprfast.jax import save, load
        >>> load(save({"w": jnp.float32(2.5)}))["w"].tolist()
        2.5
    """
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
