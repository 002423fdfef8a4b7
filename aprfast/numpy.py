"""``aprfast.numpy``: the functions of ``safetensors.numpy``, with the same signatures.

``load_file`` maps the file privately (copy-on-write): the arrays are writable, cost
no copy and no memory for pages never written, and writes never reach the file.
``load`` reads an in-memory file into owned arrays.  See docs/guide/safetensors.md.

FP4 and FP6 tensors (F4_E2M1, F6_E2M3, F6_E3M2), stored packed, come back as ml_dtypes'
``float4_e2m1fn`` / ``float6_e2m3fn`` / ``float6_e3m2fn`` arrays (one value a byte, an
owned copy), and arrays of those dtypes are packed on the way in.  Without ml_dtypes
they come back as :class:`aprfast.QuantizedTensor` of the packed bytes.
"""

from __future__ import annotations

from . import api
from .files.frameworks import UsageError, check_metadata, check_names, subbyte_arrays
from .files.reader import AprFile

__all__ = ["save_file", "save", "load_file", "load"]


def save_file(tensor_dict, filename, metadata=None, **options) -> None:
    """Write ``tensor_dict`` (name -> array) to ``filename`` atomically (see
    :func:`aprfast.save_file` for ``options``).  ``metadata`` is str to str, as in
    safetensors (aprfast.save_file takes any JSON value).

    Args:
        tensor_dict: A dict of name (str) to NumPy array.
        filename: The path to write.
        metadata: A dict of str to str, or None.
        **options: Keyword arguments of :func:`aprfast.save_file` (``layout``,
            ``compression``, ...).

    Raises:
        TypeError: A name that is not a str, or metadata that is not str to str (as
            safetensors raises).
        LayoutError: As for :func:`aprfast.save_file`.
        AprIOError: The operating system refused the write.

    Examples:
        >>> import numpy as np
        >>> from aprfast.numpy import save_file, load_file
        >>> save_file({"w": np.float32([1, 2])}, "model.apr", metadata={"format": "np"})
        >>> load_file("model.apr")
        {'w': array([1., 2.], dtype=float32)}
    """
    check_names(tensor_dict)
    check_metadata(metadata)
    api.save_file(tensor_dict, filename, metadata, **options)


def save(tensor_dict, metadata=None, **options) -> bytes:
    """The bytes :func:`save_file` would write.

    Args:
        tensor_dict: A dict of name (str) to NumPy array.
        metadata: A dict of str to str, or None.
        **options: Keyword arguments of :func:`aprfast.save`.

    Returns:
        The complete file.

    Raises:
        TypeError: A name that is not a str, or metadata that is not str to str.
        LayoutError: As for :func:`aprfast.save`.

    Examples:
        >>> import numpy as np
        >>> from aprfast.numpy import save, load
        >>> load(save({"w": np.zeros(2, np.float32)}))
        {'w': array([0., 0.], dtype=float32)}
    """
    check_names(tensor_dict)
    check_metadata(metadata)
    return api.save(tensor_dict, metadata, **options)


def load_file(filename, *, backend: str = "mmap") -> dict:
    """Every tensor of ``filename`` as a writable array.

    ``backend="mmap"`` (the default) maps the file privately (copy-on-write): no copy,
    no memory for pages never written.  ``backend="pread"`` reads the data section
    into one owned buffer with parallel ``pread``, checking the whole-file CRC;
    ``backend="direct"`` does the same around the page cache (``O_DIRECT``,
    :mod:`aprfast.io.direct`), leaving no second copy of the model in it.

    Args:
        filename: The path to read.
        backend: "mmap", "pread" or "direct".

    Returns:
        A dict of name to writable array, in file order.

    Raises:
        UsageError: An unknown ``backend`` (an AprError and a ValueError).
        AprFileNotFoundError: ``filename`` does not exist.
        FormatError: Not an ``.apr`` file.
        ChecksumError: With ``backend="pread"`` or ``"direct"``, the CRC does not match.

    Examples:
        >>> import numpy as np
        >>> from aprfast.numpy import save_file, load_file
        >>> save_file({"w": np.zeros(3, np.float32)}, "model.apr")
        >>> w = load_file("model.apr")["w"]
        >>> w[0] = 7  # a private copy-on-write page: the file keeps its zeros
        >>> load_file("model.apr", backend="pread")["w"]
        array([0., 0., 0.], dtype=float32)
    """
    if backend == "mmap":
        with AprFile(filename, mode="private") as f:
            return subbyte_arrays(f.tensors())
    if backend in ("pread", "direct"):
        return subbyte_arrays(api.load_file(filename, backend=backend))
    raise UsageError(f"backend must be 'mmap', 'pread' or 'direct', not {backend!r}")


def load(data) -> dict:
    """Every tensor of the file held in ``data`` (bytes-like), as owned arrays.

    Args:
        data: The file's bytes.

    Returns:
        A dict of name to owned array.

    Raises:
        TypeError: ``data`` is a str (use :func:`load_file` for a path).
        FormatError: Not an ``.apr`` file.
        ChecksumError: The CRC does not match the bytes.

    Examples:
        >>> import numpy as np
        >>> from aprfast.numpy import save, load
        >>> load(save({"b": np.ones(2, np.float32)}))["b"]
        array([1., 1.], dtype=float32)
    """
    if isinstance(data, str):  # aprfast.load would take it for a path
        raise TypeError("load takes the file's bytes, not a str (load_file reads a path)")
    return subbyte_arrays(api.load(data))
