"""Tensor values that are not plain NumPy arrays, and how writer inputs become bytes.

* :class:`TensorInfo` describes one stored tensor (what ``info(name)`` returns).
* :class:`RawTensor` is bytes with a declared dtype and logical shape: the form of a
  tensor whose dtype id is unknown (when raw access is asked for), and a way to save
  bytes of a dtype NumPy lacks (bf16 without ml_dtypes).
* :class:`QuantizedTensor` is a RawTensor of a packed block type (Q4_K, APR_Q4, ...).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from . import dtypes as _dtypes
from ._inputs import TensorInput, inputs_of
from .dtypes import DType
from .errors import CorruptError, LayoutError, UnknownDTypeError

__all__ = ["TensorInfo", "RawTensor", "QuantizedTensor", "TensorInput", "as_input", "as_inputs"]


@dataclass(frozen=True)
class TensorInfo:
    """One index entry: ``offset`` is absolute in the file, ``nbytes`` the stored size.

    What ``AprFile.info(name)`` returns; frozen.

    Attributes:
        name: The tensor's name.
        dtype: Its :class:`aprfast.DType`, or None for a dtype id this build does not know.
        dtype_id: The dtype id stored in the file (the layout's numbering).
        shape: The logical shape, a tuple of ints.
        offset: Where its bytes start, counted from the start of the file.
        nbytes: How many bytes it takes in the file (compressed: the stored size).
        flags: The index entry's flags (APR2: the codec of a compressed tensor).

    Examples:
        >>> import numpy as np, aprfast
        >>> with aprfast.open(aprfast.save({"w": np.zeros((2, 2), np.float32)})) as f:
        ...     info = f.info("w")
        >>> info.name, info.dtype_name, info.shape, info.end - info.offset
        ('w', 'F32', (2, 2), 16)
        >>> info.as_dict()["shape"]
        [2, 2]
    """

    name: str
    dtype: DType | None
    dtype_id: int
    shape: tuple
    offset: int
    nbytes: int
    flags: int = 0

    @property
    def dtype_name(self) -> str:
        """The dtype's name ("F32", "Q4_K"), or ``"unknown(ID)"``."""
        return self.dtype.name if self.dtype else f"unknown({self.dtype_id})"

    @property
    def end(self) -> int:
        """The offset just past the tensor's bytes."""
        return self.offset + self.nbytes

    def as_dict(self) -> dict:
        """``{"dtype", "shape", "offset", "nbytes"}``: the entry as ``aprfast.inspect``
        lists it (dtype by name, shape as a list)."""
        return {"dtype": self.dtype_name, "shape": list(self.shape), "offset": self.offset,
                "nbytes": self.nbytes}


@dataclass(frozen=True, eq=False)
class RawTensor:
    """Stored bytes with their dtype (``None`` if unknown) and logical shape.

    What a reader returns for a tensor of an unknown dtype id (``unknown_dtypes="raw"``),
    and a way to save the bytes of a dtype NumPy lacks.  ``data`` is any array or buffer:
    it is kept as a flat ``uint8`` view of its bytes (copied first only if not
    C-contiguous).  ``dtype`` may be given by name.

    Attributes:
        dtype: An :class:`aprfast.DType` (or its name), or None when unknown.
        shape: The logical shape the bytes hold.
        data: The bytes, as a 1-D ``uint8`` array.
        dtype_id: The stored dtype id of an unknown dtype; None otherwise.

    Raises:
        LayoutError: ``data`` is not the size ``dtype`` and ``shape`` take.

    Examples:
        >>> import numpy as np, aprfast
        >>> bf16 = aprfast.RawTensor("BF16", (2,), np.uint16([0x3F80, 0x4000]))
        >>> bf16, bf16.nbytes
        (RawTensor(BF16, shape=[2], nbytes=4), 4)
        >>> aprfast.to_float32(aprfast.load(aprfast.save({"x": bf16}))["x"])
        array([1., 2.], dtype=float32)
    """

    dtype: DType | None
    shape: tuple
    data: np.ndarray = field(repr=False)
    dtype_id: int | None = None

    def __post_init__(self):
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))
        if isinstance(self.dtype, str):
            object.__setattr__(self, "dtype", _dtypes.by_name(self.dtype))
        data = np.asarray(self.data)
        if data.dtype != np.uint8 or data.ndim != 1:
            data = _c_order(data).reshape(-1).view(np.uint8)
        object.__setattr__(self, "data", data)
        if self.dtype is not None and not self.dtype.opaque and self.dtype.nbytes(self.shape) != data.nbytes:
            raise LayoutError(
                f"{self.dtype.name} tensor of shape {list(self.shape)} takes "
                f"{self.dtype.nbytes(self.shape)} bytes, but {data.nbytes} were given")

    @property
    def nbytes(self) -> int:
        """The size of ``data`` in bytes."""
        return self.data.nbytes

    def __eq__(self, other):
        return (type(other) is type(self) and self.dtype == other.dtype
                and self.shape == other.shape and np.array_equal(self.data, other.data))

    def __repr__(self):
        name = self.dtype.name if self.dtype else f"unknown({self.dtype_id})"
        return f"{type(self).__name__}({name}, shape={list(self.shape)}, nbytes={self.nbytes})"


class QuantizedTensor(RawTensor):
    """Packed blocks of a quantized dtype, with the logical shape they decode to.

    What :func:`aprfast.quantize` makes and readers return for packed dtypes; save it
    as any tensor, turn it into float32 with :func:`aprfast.dequantize`.  See
    docs/guide/quantization.md.

    Raises:
        LayoutError: The dtype is not a packed one, or ``data`` is not the size the
            dtype and shape take.

    Examples:
        >>> import numpy as np, aprfast
        >>> q = aprfast.quantize(np.ones((2, 32), np.float32), "q8_0")
        >>> q, q.dtype.name, q.shape
        (QuantizedTensor(Q8_0, shape=[2, 32], nbytes=68), 'Q8_0', (2, 32))
    """

    def __post_init__(self):
        super().__post_init__()
        if self.dtype is None or not self.dtype.packed:
            raise LayoutError(f"QuantizedTensor needs a packed dtype, not {self.dtype}")


def as_inputs(tensors) -> list:
    """TensorInputs for a name -> value mapping (plain arrays take a compiled path)."""
    return inputs_of(tensors, _NATIVE_DTYPES, as_input)


def as_input(name, value) -> TensorInput:
    """Turn an array, buffer, ``__array__`` object or RawTensor into a TensorInput."""
    if type(name) is not str:
        raise LayoutError(f"tensor names must be str, not {type(name).__name__}: {name!r}")
    if type(value) is np.ndarray:
        dtype = _NATIVE_DTYPES.get(value.dtype)
        if dtype is not None and value.flags.c_contiguous:  # the common case, kept cheap
            return TensorInput(name, dtype, value.shape, value, value.nbytes)
    if isinstance(value, RawTensor):
        dtype = value.dtype
        if dtype is None:  # read with unknown_dtypes="raw": written back under the same APR2 id
            try:
                dtype = _dtypes.unknown_id_dtype(value.dtype_id)
            except UnknownDTypeError:
                raise LayoutError(f"tensor {name!r}: cannot write a tensor of unknown dtype id "
                                  f"{value.dtype_id}") from None
        return TensorInput(name, dtype, value.shape, _c_order(value.data), value.nbytes)
    array = _as_array(name, value)
    try:
        dtype = _dtypes.from_numpy(array.dtype)
    except LayoutError as exc:  # name the entry of the caller's dict (issue 28 item 9)
        raise LayoutError(f"tensor {name!r}: {exc.message}", path=exc.path) from None
    if dtype.name in _dtypes.SUBBYTE_FLOATS:  # ml_dtypes' float4/float6: one value a byte, stored packed
        packed = _dtypes.pack_subbyte(array, _dtypes.SUBBYTE_FLOATS[dtype.name][0])
        return TensorInput(name, dtype, tuple(int(d) for d in array.shape), packed, packed.nbytes)
    if array.dtype.byteorder == ">" or (array.dtype.byteorder == "=" and not _LITTLE):
        array = array.astype(array.dtype.newbyteorder("<"))
    array = _c_order(array)
    return TensorInput(name, dtype, tuple(int(d) for d in array.shape), _bytes_of(array), array.nbytes)


_LITTLE = np.little_endian
# Arrays of these dtypes (little-endian on this host) export their bytes as they are.
_NATIVE_DTYPES = {np.dtype(d.numpy): d for d in _dtypes.DTYPES.values() if d.numpy} if _LITTLE else {}


def _c_order(array: np.ndarray) -> np.ndarray:
    # Not np.ascontiguousarray: it turns 0-d arrays into 1-d ones.
    return array if array.flags.c_contiguous else array.copy(order="C")


def _as_array(name, value) -> np.ndarray:
    if isinstance(value, np.ma.MaskedArray):
        raise LayoutError(f"tensor {name!r} is a masked array; its mask has no place in the file "
                          "(save .filled(...) or .data explicitly)")
    if isinstance(value, np.ndarray):
        return value.view(np.ndarray) if type(value) is not np.ndarray else value
    if isinstance(value, (bytes, bytearray)):
        return np.frombuffer(value, np.uint8)  # raw bytes are uint8, not a NumPy string
    try:
        return np.asarray(value)
    except Exception as exc:  # torch bf16, exotic buffers: say which tensor failed
        raise LayoutError(f"tensor {name!r}: cannot read {type(value).__name__} as an array ({exc})") from exc


def _bytes_of(array: np.ndarray) -> memoryview:
    if array.size == 0:
        return memoryview(b"")
    # A uint8 view first: custom dtypes such as ml_dtypes' bfloat16 export no buffer format.
    return memoryview(array.reshape(-1).view(np.uint8))


def check_stored_size(info: TensorInfo, path=None) -> None:
    """A stored size must equal shape x dtype; the message names both numbers."""
    if info.dtype is None:
        return
    expected = info.dtype.nbytes(info.shape)
    if expected != info.nbytes:
        raise CorruptError(
            f"tensor {info.name!r}: {info.dtype.name} of shape {list(info.shape)} needs "
            f"{expected} bytes but the index says {info.nbytes}", path=path)
