"""``safe_open``: safetensors' file handle, over :class:`aprfast.AprFile`.

``safe_open(path, framework, device="cpu")`` opens the file with ``mode="private"``:
tensors are zero-copy views of a copy-on-write map (writable; writes stay in this
process and never reach the file), as safetensors' own ``safe_open`` gives torch
tensors over a private map.  ``metadata()`` is a method, as in safetensors.  The
conversions to each framework are :mod:`aprfast.files.frameworks`'; torch tensors for a
device other than the CPU come through :func:`aprfast.torch.tensor_to_device`'s pinned
staging.  Frameworks are imported only when asked for.
"""

from __future__ import annotations

import numpy as np

from .._optional import require
from ..errors import AprIOError
from .frameworks import SliceIndexError, UsageError, framework_name, to_framework, torch_meta
from .reader import AprFile

__all__ = ["safe_open", "SafeSlice"]


class safe_open:  # noqa: N801 - the name safetensors users import
    """``with aprfast.safe_open(path, framework="pt") as f: f.get_tensor(name)``.

    ``framework`` is "np"/"numpy", "pt"/"torch" or "jax"/"flax"; ``device`` places
    torch and JAX tensors ("cpu", "cuda:0", an int, a ``torch.device``; "meta" gives
    torch tensors with shapes and dtypes and no data).  NumPy arrays are always on the
    CPU.  ``backend="mmap"`` (the default) hands out writable zero-copy views of a
    private copy-on-write map; ``backend="pread"`` reads each tensor into owned memory,
    ``backend="direct"`` the same around the page cache (:mod:`aprfast.io.direct`).
    ``keys()`` are sorted, ``offset_keys()`` are in file order; ``metadata()`` returns
    the file's metadata (None when it was saved without).  ``filename`` may also be an
    open binary file object.  Reading a closed handle raises :class:`aprfast.AprIOError`.
    See docs/guide/safetensors.md.

    Args:
        filename: A path or an open binary file object.
        framework: "np"/"numpy", "pt"/"torch" or "jax"/"flax".
        device: Where torch and JAX tensors go ("cpu", "cuda:0", an int, a
            ``torch.device``, "meta").
        backend: "mmap" (private copy-on-write views), "pread" (owned copies) or
            "direct" (owned copies read around the page cache).

    Raises:
        UsageError: An unknown framework, device or backend (an AprError and a
            ValueError, from :mod:`aprfast.files.frameworks`).
        ImportError: The framework's package is not installed.
        AprFileNotFoundError: ``filename`` does not exist.
        FormatError: Not an ``.apr`` file.
        CorruptError: The file contradicts itself.

    Examples:
        >>> import numpy as np, aprfast
        >>> aprfast.save_file({"w": np.arange(6, dtype=np.float32).reshape(3, 2)}, "m.apr")
        >>> with aprfast.safe_open("m.apr", framework="np") as f:
        ...     print(f.keys(), f.get_slice("w")[1:].tolist())
        ['w'] [[2.0, 3.0], [4.0, 5.0]]
    """

    def __init__(self, filename, framework: str, device="cpu", *, backend: str = "mmap"):
        self.framework = framework_name(framework)
        if backend not in _BACKEND_MODES:
            raise UsageError(f"backend must be 'mmap', 'pread' or 'direct', not {backend!r}")
        if self.framework != "numpy":
            _import_framework(self.framework)
        self.device = _framework_device(self.framework, device)
        self._file = AprFile(filename, mode=_BACKEND_MODES[backend])

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def close(self) -> None:
        """Close the file (idempotent); tensors already handed out stay valid.

        Examples:
            >>> import numpy as np, aprfast
            >>> aprfast.save_file({"w": np.zeros(2, np.float32)}, "m.apr")
            >>> f = aprfast.safe_open("m.apr", "np")
            >>> f.close()
            >>> f.keys()
            Traceback (most recent call last):
            ...
            aprfast.errors.AprIOError: [E007] ...the file is closed
        """
        self._file.close()

    def keys(self) -> list:
        """The tensor names, sorted (as safetensors returns them).

        Returns:
            A list of str.

        Raises:
            AprIOError: The handle is closed.

        Examples:
            >>> import numpy as np, aprfast
            >>> aprfast.save_file({"b": np.zeros(1), "a": np.zeros(1)}, "m.apr")
            >>> with aprfast.safe_open("m.apr", "np") as f:
            ...     f.keys()
            ['a', 'b']
        """
        self._require_open()
        return sorted(self._file.keys())

    def offset_keys(self) -> list:
        """Names in the order their data lies in the file.

        Returns:
            A list of str.

        Raises:
            AprIOError: The handle is closed.

        Examples:
            >>> import numpy as np, aprfast
            >>> aprfast.save_file({"b": np.zeros(1), "a": np.zeros(1)}, "m.apr")
            >>> with aprfast.safe_open("m.apr", "np") as f:
            ...     sorted(f.offset_keys())
            ['a', 'b']
        """
        self._require_open()
        return sorted(self._file.keys(), key=lambda name: (self._file.info(name).offset, name))

    def metadata(self):
        """The metadata the file was saved with, or None when there was none (as
        safetensors returns).

        Returns:
            A dict, or None.

        Raises:
            AprIOError: The handle is closed.

        Examples:
            >>> import numpy as np, aprfast
            >>> aprfast.save_file({"w": np.zeros(1)}, "m.apr", metadata={"format": "pt"})
            >>> with aprfast.safe_open("m.apr", "np") as f:
            ...     f.metadata()
            {'format': 'pt'}
        """
        self._require_open()
        return self._file.metadata or None

    def get_tensor(self, name: str):
        """The tensor ``name`` in the handle's framework, on its device.

        Args:
            name: The tensor's name.

        Returns:
            A NumPy array, torch tensor or JAX array.

        Raises:
            TensorNotFoundError: The file has no tensor ``name`` (also a KeyError).
            AprIOError: The handle is closed.

        Examples:
            >>> import numpy as np, aprfast
            >>> aprfast.save_file({"w": np.float32([1, 2])}, "m.apr")
            >>> with aprfast.safe_open("m.apr", "np") as f:
            ...     f.get_tensor("w")
            array([1., 2.], dtype=float32)
        """
        self._require_open()
        if _is_meta(self.device):
            return torch_meta(name, self._file.info(name))
        if self.framework == "torch" and self.device != "cpu":
            from .staging import tensor_to_device  # through pinned staging, as load_file does

            return tensor_to_device(self._file, name, self.device)
        tensor = self._file.get_tensor(name)
        return to_framework(name, tensor, self._file.info(name).dtype, self.framework, self.device)

    def get_tensors(self) -> dict:
        """Every tensor, by name, in file order (as safetensors' ``get_tensors``).

        Returns:
            A dict of name to tensor in the handle's framework.

        Raises:
            AprIOError: The handle is closed.

        Examples:
            >>> import numpy as np, aprfast
            >>> aprfast.save_file({"w": np.float32([1, 2])}, "m.apr")
            >>> with aprfast.safe_open("m.apr", "np") as f:
            ...     f.get_tensors()
            {'w': array([1., 2.], dtype=float32)}
        """
        return {name: self.get_tensor(name) for name in self.offset_keys()}

    def get_slice(self, name: str) -> "SafeSlice":
        """A lazy :class:`SafeSlice` of the tensor ``name``: ``[key]`` reads only what the
        key needs.

        Args:
            name: The tensor's name.

        Returns:
            A :class:`SafeSlice`.

        Raises:
            TensorNotFoundError: The file has no tensor ``name``.
            AprIOError: The handle is closed.

        Examples:
            >>> import numpy as np, aprfast
            >>> aprfast.save_file({"w": np.arange(4, dtype=np.float32)}, "m.apr")
            >>> with aprfast.safe_open("m.apr", "np") as f:
            ...     s = f.get_slice("w")
            ...     print(s.get_shape(), s.get_dtype(), s[-2:])
            [4] F32 [2. 3.]
        """
        self._require_open()
        return SafeSlice(self, name)

    def _require_open(self) -> None:
        if self._file.closed:
            raise AprIOError("the file is closed", path=self._file.path)


#: safe_open's backend -> the AprFile mode serving it.
_BACKEND_MODES = {"mmap": "private", "pread": "pread", "direct": "direct"}


def _framework_device(framework: str, device):
    """``device`` as the framework places tensors: "cpu", or a ``torch.device`` for any
    other torch device (an int is CUDA's index, as torch reads it)."""
    if device is None or (isinstance(device, str) and device == "cpu"):
        return "cpu"
    if framework == "torch":
        import torch

        try:
            placed = torch.device(device)
        except (RuntimeError, TypeError) as exc:
            raise UsageError(f"device {device!r} is not a torch device ({exc})") from None
        return "cpu" if placed.type == "cpu" else placed
    return device


def _is_meta(device) -> bool:
    return getattr(device, "type", None) == "meta"


class SafeSlice:
    """``f.get_slice(name)``: shape and dtype without reading, ``[...]`` reads only the
    rows the key needs and returns the framework's tensor.

    Keys are NumPy's: ints (negative ones count from the end), slices with any step,
    ``...``, ``None``, and lists of ints (``[[]]`` selects nothing along the first
    axis, as in safetensors).  A key outside the tensor raises
    :class:`~aprfast.files.frameworks.SliceIndexError` (an IndexError and an AprError).

    Examples:
        >>> import numpy as np, aprfast
        >>> aprfast.save_file({"w": np.arange(6, dtype=np.float32).reshape(3, 2)}, "m.apr")
        >>> with aprfast.safe_open("m.apr", "np") as f:
        ...     print(f.get_slice("w")[[0, 2], 1])
        [1. 5.]
    """

    def __init__(self, handle: safe_open, name: str):
        self._handle = handle
        self._name = name
        self._info = handle._file.info(name)
        self._dtype = self._info.dtype
        self._reader = None  # the file's slice reader, made at the first read

    def get_shape(self) -> list:
        """The tensor's shape, read from the index (no data is read).

        Examples:
            >>> import numpy as np, aprfast
            >>> aprfast.save_file({"w": np.zeros((2, 3), np.float32)}, "m.apr")
            >>> with aprfast.safe_open("m.apr", "np") as f:
            ...     f.get_slice("w").get_shape()
            [2, 3]
        """
        return list(self._info.shape)

    def get_dtype(self) -> str:
        """The dtype as safetensors names it ("F32", "BF16", "F8_E4M3", "F4", ...).

        Examples:
            >>> import numpy as np, aprfast
            >>> aprfast.save_file({"w": np.zeros(2, np.float16)}, "m.apr")
            >>> with aprfast.safe_open("m.apr", "np") as f:
            ...     f.get_slice("w").get_dtype()
            'F16'
        """
        name = self._info.dtype_name
        return _SAFETENSORS_NAMES.get(name, name)

    def __len__(self) -> int:
        if not self._info.shape:
            raise TypeError("len() of a 0-d tensor")
        return self._info.shape[0]

    @property
    def _slice(self):
        # made on first use: shape and dtype need no reader, and a packed type that has
        # no row slices (FP4) still answers them, as in safetensors
        if self._reader is None:
            self._reader = self._handle._file.get_slice(self._name)
        return self._reader

    def __getitem__(self, key):
        h = self._handle
        h._require_open()
        try:
            if _is_meta(h.device):
                return torch_meta(self._name, h._file.info(self._name))[key]
            value = self._read(key)
        except IndexError as exc:
            raise SliceIndexError(f"tensor {self._name!r} of shape {self.get_shape()}: {exc}",
                                  path=h._file.path) from None
        return to_framework(self._name, value, self._dtype, h.framework, h.device)

    def _read(self, key):
        if isinstance(key, list):
            return self._rows(key)
        if isinstance(key, tuple) and any(isinstance(k, (list, np.ndarray)) for k in key):
            # advanced indexing on a later axis: read the tensor, index in memory
            return np.asarray(self._slice[...])[key]
        return self._slice[key]

    def _rows(self, rows: list):
        """A list of row numbers along the first axis, read as the one bounding run."""
        shape = self.get_shape()
        if not shape:
            raise IndexError("a 0-d tensor has no rows to select")
        if not all(isinstance(r, (int, np.integer)) and not isinstance(r, (bool, np.bool_)) for r in rows):
            raise IndexError(f"a list key holds row numbers (ints), not {rows!r}")
        outside = next((int(r) for r in rows if not -shape[0] <= r < shape[0]), None)
        if outside is not None:
            raise IndexError(f"index {outside} is out of bounds for axis 0 with size {shape[0]}")
        if not rows:
            return self._slice[0:0]
        picked = np.asarray(rows, dtype=np.int64) % shape[0]
        lo, hi = int(picked.min()), int(picked.max()) + 1
        return np.ascontiguousarray(self._slice[lo:hi][picked - lo])


#: aprfast dtype names that safetensors spells otherwise (the rest are the same; see
#: aprfast.convert.safetensors.ST_DTYPES, which a test checks this against).
_SAFETENSORS_NAMES = {"F4_E2M1": "F4"}


def _import_framework(framework: str) -> None:
    """Fail at open, with the reason, when the framework is not installed."""
    require(framework)  # MissingDependencyError naming aprfast[torch] or aprfast[jax]
