"""``safe_open`` and the array conversions behind ``aprfast.numpy``, ``aprfast.torch``
and ``aprfast.jax``: the names and behaviour safetensors users already rely on.

``safe_open(path, framework, device="cpu")`` is built on :class:`aprfast.AprFile`
opened with ``mode="private"``: tensors are zero-copy views of a copy-on-write map
(writable; writes stay in this process and never reach the file), as safetensors'
own ``safe_open`` gives torch tensors over a private map.  ``metadata()`` is a
method, as in safetensors.  Frameworks are imported only when asked for.
"""

from __future__ import annotations

import numpy as np

from .dtypes import DTYPES
from .errors import AprError, LayoutError
from .reader import AprFile
from .tensors import QuantizedTensor, RawTensor

__all__ = ["safe_open", "SafeSlice", "FRAMEWORKS", "TORCH_VIEWS", "framework_name", "to_framework",
           "torch_dtype", "torch_meta", "from_torch", "check_metadata", "check_names", "UsageError",
           "SliceIndexError"]


class UsageError(AprError, ValueError):
    """E001: an argument safetensors also refuses (framework, device, backend); a
    ValueError too, and an AprError where safetensors raises its SafetensorError."""

    code = "E001"


class SliceIndexError(AprError, IndexError):
    """E001: a ``get_slice(name)[key]`` that selects outside the tensor.  An IndexError,
    as NumPy and torch raise, and an AprError where safetensors raises SafetensorError."""

    code = "E001"


def check_names(tensors) -> None:
    """safetensors' rule for tensor names: str, TypeError otherwise (before anything is
    written; aprfast.save_file raises its LayoutError for the same mistake)."""
    for name in tensors:
        if not isinstance(name, str):
            raise TypeError(f"tensor names must be str, not {type(name).__name__}: {name!r}")


def check_metadata(metadata) -> None:
    """safetensors' rule for the ``metadata`` of its save functions: None or a dict of
    str to str, TypeError otherwise (aprfast.save_file takes any JSON value)."""
    if metadata is None:
        return
    if not isinstance(metadata, dict):
        raise TypeError(f"metadata must be a dict of str to str, not {type(metadata).__name__}")
    for key, value in metadata.items():
        for part in (key, value):
            if not isinstance(part, str):
                raise TypeError(f"metadata {key!r}: {type(part).__name__} {part!r} is not a str (safetensors "
                                "metadata is str to str; aprfast.save_file takes any JSON value)")

#: aprfast types NumPy lacks -> the torch dtype that holds them.  Their bits travel as
#: same-width integers, so no ml_dtypes is needed on either side.
TORCH_VIEWS = {"BF16": "bfloat16", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2",
               "F8_E4M3FNUZ": "float8_e4m3fnuz", "F8_E5M2FNUZ": "float8_e5m2fnuz",
               "F8_E8M0": "float8_e8m0fnu"}
_INT_OF_WIDTH = {1: (np.uint8, "uint8"), 2: (np.int16, "int16")}

#: Accepted spellings -> the framework they mean (safetensors accepts these too).
FRAMEWORKS = {"np": "numpy", "numpy": "numpy", "pt": "torch", "torch": "torch",
              "jax": "jax", "flax": "jax"}


def framework_name(framework: str) -> str:
    try:
        return FRAMEWORKS[framework]
    except (KeyError, TypeError):
        raise UsageError(f"framework {framework!r} is not supported; use one of "
                         f"{', '.join(sorted(FRAMEWORKS))}") from None


def to_framework(name: str, array, dtype, framework: str, device: str = "cpu"):
    """One loaded array as the framework's tensor (``dtype``: the file's aprfast DType)."""
    if framework == "numpy":
        if device not in ("cpu", None):
            raise UsageError(f"NumPy arrays live on the CPU, not on device {device!r}")
        return array
    if framework == "torch" and isinstance(array, QuantizedTensor) and array.dtype.name == "F4_E2M1":
        return _fp4_to_torch(name, array, device)
    if isinstance(array, (QuantizedTensor, RawTensor)):
        raise LayoutError(f"tensor {name!r} is {array!r}; {framework} has no dtype for it "
                          "(read it with aprfast.open and dequantize it first)")
    if framework == "torch":
        return _to_torch(array, dtype, device)
    return _to_jax(array, dtype, device)


def _to_torch(array, dtype, device):
    import torch

    if dtype is not None and dtype.name in TORCH_VIEWS:
        # the bits, whether NumPy sees ml_dtypes' type or an unsigned int
        tensor = torch.from_numpy(array.view(_INT_OF_WIDTH[dtype.itemsize][0])).view(torch_dtype(dtype))
    else:
        tensor = torch.from_numpy(array)
    return tensor if device in ("cpu", None) else tensor.to(device)


def _fp4_to_torch(name, packed, device):
    """FP4 as torch's float4_e2m1fn_x2: one element per byte (a pair of values), so the
    last dimension halves; it must be even for the pairs to stay in their rows."""
    import torch

    kind = getattr(torch, "float4_e2m1fn_x2", None)
    if kind is None:
        raise LayoutError(f"tensor {name!r} is FP4 and this torch ({torch.__version__}) has no float4_e2m1fn_x2")
    shape = tuple(packed.shape)
    if not shape or shape[-1] % 2:
        raise LayoutError(f"tensor {name!r}: FP4 of shape {list(shape)} has an odd last dimension; "
                          "torch's float4_e2m1fn_x2 holds pairs of values within a row")
    data = np.ascontiguousarray(packed.data).view(np.uint8)
    tensor = torch.from_numpy(data).reshape(shape[:-1] + (shape[-1] // 2,)).view(kind)
    return tensor if device in ("cpu", None) else tensor.to(device)


def torch_meta(name: str, info):
    """A tensor on torch's "meta" device with the shape and dtype ``info`` describes."""
    import torch

    if info.dtype is not None and info.dtype.name == "F4_E2M1":
        shape = tuple(info.shape)
        if not shape or shape[-1] % 2:
            raise LayoutError(f"tensor {name!r}: FP4 of shape {list(shape)} has an odd last dimension; "
                              "torch's float4_e2m1fn_x2 holds pairs of values within a row")
        return torch.empty(shape[:-1] + (shape[-1] // 2,), dtype=torch.float4_e2m1fn_x2, device="meta")
    return torch.empty(info.shape, dtype=torch_dtype(info.dtype, name), device="meta")


def torch_dtype(dtype, name: str = "?"):
    """The torch dtype for an aprfast DType; TypeError naming the tensor if none."""
    import torch

    if dtype is None or dtype.packed:
        raise TypeError(f"tensor {name!r} is {dtype.name if dtype else 'of unknown dtype'}; "
                        "torch has no dtype for it")
    if dtype.name in TORCH_VIEWS:
        found = getattr(torch, TORCH_VIEWS[dtype.name], None)
        if found is None:
            raise TypeError(f"tensor {name!r} is {dtype.name}, which this torch ({torch.__version__}) lacks")
        return found
    return torch.from_numpy(np.empty(0, dtype.numpy)).dtype


def from_torch(name: str, tensor):
    """A torch tensor as what the writer stores: a NumPy array, or a RawTensor of the
    bits for the types NumPy lacks (bf16, float8)."""
    import torch

    from .tensors import RawTensor

    if not isinstance(tensor, torch.Tensor):
        raise ValueError(f"tensor {name!r} is {type(tensor).__name__}, not a torch.Tensor")
    if tensor.layout != torch.strided:
        raise ValueError(f"tensor {name!r} is a {tensor.layout} tensor; save its .to_dense()")
    tensor = tensor.detach().to("cpu").contiguous()
    if tensor.dtype == getattr(torch, "float4_e2m1fn_x2", None):  # pairs: the logical last dim doubles
        from .tensors import QuantizedTensor

        shape = tuple(tensor.shape[:-1]) + (2 * tensor.shape[-1],) if tensor.dim() else (2,)
        return QuantizedTensor(DTYPES["F4_E2M1"], shape, tensor.view(torch.uint8).numpy().reshape(-1))
    for aprfast_name, torch_name in TORCH_VIEWS.items():
        if tensor.dtype == getattr(torch, torch_name, None):
            width = DTYPES[aprfast_name].itemsize
            bits = tensor.view(getattr(torch, _INT_OF_WIDTH[width][1])).numpy()
            return RawTensor(DTYPES[aprfast_name], tuple(tensor.shape), bits.view(f"<u{width}"))
    return tensor.numpy()


def _to_jax(array, dtype, device):
    import jax
    import jax.numpy as jnp

    if dtype is not None and dtype.name in TORCH_VIEWS:
        width = dtype.itemsize
        value = jnp.asarray(array.view(f"<u{width}")).view(getattr(jnp, TORCH_VIEWS[dtype.name]))
    else:
        value = jnp.asarray(array)
    if device not in ("cpu", None):
        value = jax.device_put(value, jax.devices(device)[0] if isinstance(device, str) else device)
    return value


class safe_open:  # noqa: N801 - the name safetensors users import
    """``with aprfast.safe_open(path, framework="pt") as f: f.get_tensor(name)``.

    ``framework`` is "np"/"numpy", "pt"/"torch" or "jax"/"flax"; ``device`` places
    torch and JAX tensors ("cpu", "cuda:0", an int, a ``torch.device``; "meta" gives
    torch tensors with shapes and dtypes and no data).  NumPy arrays are always on the
    CPU.  ``backend="mmap"`` (the default) hands out writable zero-copy views of a
    private copy-on-write map; ``backend="pread"`` reads each tensor into owned memory.
    ``keys()`` are sorted, ``offset_keys()`` are in file order; ``metadata()`` returns
    the file's metadata (None when it was saved without).  ``filename`` may also be an
    open binary file object.  Reading a closed handle raises :class:`aprfast.AprIOError`.
    """

    def __init__(self, filename, framework: str, device="cpu", *, backend: str = "mmap"):
        self.framework = framework_name(framework)
        if backend not in _BACKEND_MODES:
            raise UsageError(f"backend must be 'mmap' or 'pread', not {backend!r}")
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
        self._file.close()

    def keys(self) -> list:
        self._require_open()
        return sorted(self._file.keys())

    def offset_keys(self) -> list:
        """Names in the order their data lies in the file."""
        self._require_open()
        return sorted(self._file.keys(), key=lambda name: (self._file.info(name).offset, name))

    def metadata(self):
        """The metadata the file was saved with, or None when there was none (as
        safetensors returns)."""
        self._require_open()
        return self._file.metadata or None

    def get_tensor(self, name: str):
        self._require_open()
        if _is_meta(self.device):
            return torch_meta(name, self._file.info(name))
        if self.framework == "torch" and self.device != "cpu":
            from .torch import tensor_to_device  # through pinned staging, as load_file does

            return tensor_to_device(self._file, name, self.device)
        tensor = self._file.get_tensor(name)
        return to_framework(name, tensor, self._file.info(name).dtype, self.framework, self.device)

    def get_tensors(self) -> dict:
        """Every tensor, by name, in file order (as safetensors' ``get_tensors``)."""
        return {name: self.get_tensor(name) for name in self.offset_keys()}

    def get_slice(self, name: str) -> "SafeSlice":
        self._require_open()
        return SafeSlice(self, name)

    def _require_open(self) -> None:
        if self._file.closed:
            from .errors import AprIOError

            raise AprIOError("the file is closed", path=self._file.path)


#: safe_open's backend -> the AprFile mode serving it.
_BACKEND_MODES = {"mmap": "private", "pread": "pread"}


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
    axis, as in safetensors).  A key outside the tensor raises :class:`SliceIndexError`."""

    def __init__(self, handle: safe_open, name: str):
        self._handle = handle
        self._name = name
        self._info = handle._file.info(name)
        self._dtype = self._info.dtype
        self._reader = None  # the file's slice reader, made at the first read

    def get_shape(self) -> list:
        return list(self._info.shape)

    def get_dtype(self) -> str:
        """The dtype as safetensors names it ("F32", "BF16", "F8_E4M3", "F4", ...)."""
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
    try:
        __import__(framework)
    except ImportError as exc:
        raise ImportError(f"framework {framework!r} needs the {framework} package, which is not "
                          f"installed ({exc})") from exc
