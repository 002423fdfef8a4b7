"""The dtype registry: every element type aprfast knows, and each layout's ids for it.

A :class:`DType` says how many bytes a tensor of a given shape takes and which NumPy
dtype (if any) views those bytes.  Packed (block-quantized) types have no NumPy
dtype; they travel as :class:`aprfast.tensors.QuantizedTensor` with their logical
shape.  :class:`IdTable` maps one layout's on-disk dtype byte to a DType and back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np

from .errors import LayoutError, LimitError, UnknownDTypeError

__all__ = [
    "DType",
    "IdTable",
    "DTYPES",
    "by_name",
    "from_numpy",
    "numpy_dtype",
    "bfloat16",
    "check_shape",
    "MAX_SHAPE_BYTES",
    "APRENDER_IDS",
    "APR2_IDS",
    "opaque_dtype",
    "unknown_id_dtype",
    "OPAQUE_APR2_ID",
    "OPAQUE_NAMES_KEY",
    "SUBBYTE_FLOATS",
    "pack_subbyte",
    "unpack_subbyte",
    "subbyte_values",
]

try:  # bf16 and float8 arrays need ml_dtypes; without it they come back as unsigned ints.
    import ml_dtypes
    from ml_dtypes import bfloat16
except ImportError:  # pragma: no cover - exercised only without the optional extra
    ml_dtypes = None
    bfloat16 = None

#: Types NumPy lacks, by aprfast name -> ml_dtypes' name.  With ml_dtypes installed
#: their arrays have ml_dtypes' dtype; without it they are unsigned integers of the
#: same width (the bits, unchanged), and TensorInfo still names the type.
ML_DTYPES = {"BF16": "bfloat16", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2",
             "F8_E4M3FNUZ": "float8_e4m3fnuz", "F8_E5M2FNUZ": "float8_e5m2fnuz",
             "F8_E8M0": "float8_e8m0fnu"}
_ML_NUMPY = {name: np.dtype(getattr(ml_dtypes, attr)) for name, attr in ML_DTYPES.items()
             if ml_dtypes is not None and hasattr(ml_dtypes, attr)}
#: Sub-byte floats: aprfast name -> (bits per value, ml_dtypes' name).  ml_dtypes keeps
#: one value per byte (the code in the low bits); files keep them packed
#: (:func:`pack_subbyte`), so their arrays are packed on the way in and unpacked on the
#: way out.
SUBBYTE_FLOATS = {"F4_E2M1": (4, "float4_e2m1fn"), "F6_E2M3": (6, "float6_e2m3fn"),
                  "F6_E3M2": (6, "float6_e3m2fn")}
_SUBBYTE_NUMPY = {name: np.dtype(getattr(ml_dtypes, attr)) for name, (_, attr) in SUBBYTE_FLOATS.items()
                  if ml_dtypes is not None and hasattr(ml_dtypes, attr)}


@dataclass(frozen=True, eq=False)
class DType:
    """One element type.  ``itemsize`` is 0 for packed block types.  Each exists once
    (in ``DTYPES``), so identity is equality and hashing is cheap.

    Look one up with ``aprfast.dtypes.by_name`` (case-insensitive) or read it from
    ``TensorInfo.dtype``; there is no need to make one.

    Attributes:
        name: The aprfast name ("F32", "BF16", "Q4_K", ...).
        numpy: The NumPy dtype string of an elementwise type; None when NumPy lacks it.
        itemsize: Bytes per element; 0 for packed block types.
        block_elems: Elements per block of a packed type.
        block_bytes: Bytes per block of a packed type.
        blocks_per_row: Blocks never span rows (GGML); False for aprender's APR_Q4.
        tensor_header: Bytes of the one header of a per-tensor type (APR_Q8: 4,
            Q8_TENSOR: 8); 0 otherwise.

    Examples:
        >>> from aprfast.dtypes import by_name
        >>> by_name("f16").itemsize, by_name("q4_0").packed
        (2, True)
        >>> by_name("Q4_0").nbytes((2, 64))  # 2 rows of 2 blocks of 18 bytes
        72
    """

    name: str
    numpy: str | None = None
    itemsize: int = 0
    block_elems: int = 0
    block_bytes: int = 0
    blocks_per_row: bool = True  # GGML blocks never span rows; aprender's APR_Q4 does
    # Per-tensor types: one header (scale, zero point) for the whole tensor, then one
    # byte per element.  APR_Q8: 4 (f32 scale); Q8_TENSOR: 8 (f32 scale, i32 zero point).
    tensor_header: int = 0
    # A type aprfast does not know, carried as bytes (issue 27 item 4): its name in the
    # file it came from (a safetensors dtype string), or ``raw_id``, the APR2 id it was
    # read with.  It has no size rule (each tensor brings its byte count) and no values.
    opaque: bool = False
    raw_id: int | None = None

    @property
    def packed(self) -> bool:
        """True for packed block (quantized) types (not for an opaque, unknown one)."""
        return self.itemsize == 0 and not self.opaque

    def nbytes(self, shape) -> int:
        """Bytes a tensor of ``shape`` takes in this dtype.

        Args:
            shape: The tensor's logical shape.

        Returns:
            The stored size in bytes (blocks rounded up per row when
            ``blocks_per_row``).

        Raises:
            UnknownDTypeError: the dtype is opaque (a type aprfast does not know): its
                tensors' sizes come from their files.
        """
        if self.opaque:
            raise UnknownDTypeError(f"{self.name} is a dtype aprfast does not know: its tensors' sizes come "
                                    "from their files, not from a rule")
        count = element_count(shape)
        if not self.packed:
            return count * self.itemsize
        if count == 0:
            return 0
        if self.tensor_header:  # one header for the whole tensor, then i8 values
            return self.tensor_header + count
        if not self.blocks_per_row:
            return -(-count // self.block_elems) * self.block_bytes
        row = shape[-1] if len(shape) else 1
        rows = count // row
        return rows * -(-row // self.block_elems) * self.block_bytes

    def __repr__(self) -> str:
        return f"aprfast.dtypes.{self.name}"


def element_count(shape) -> int:
    count = 1
    for dim in shape:
        count *= dim
    return count


#: Largest shape x item size a tensor may declare, counting only its non-zero dims (as
#: NumPy does, so an empty array of a shape beyond it can't be made either).  No file
#: holds that much; the index check (aprfast._index) uses the same bound.
MAX_SHAPE_BYTES = 1 << 62
#: NPY_MAXDIMS: 64 in NumPy 2, 32 before.
NUMPY_MAX_DIMS = 64 if int(np.__version__.split(".")[0]) >= 2 else 32


def check_shape(shape, itemsize: int, what: str = "tensor") -> None:
    """LimitError unless NumPy can make an array of ``shape`` with ``itemsize``-byte
    items: at most NUMPY_MAX_DIMS dims, and non-zero dims whose product times
    ``itemsize`` is at most MAX_SHAPE_BYTES (even when another dim is 0)."""
    if len(shape) > NUMPY_MAX_DIMS:
        raise LimitError(f"{what} has {len(shape)} dims; NumPy arrays hold at most {NUMPY_MAX_DIMS}")
    count = 1
    for dim in shape:
        if dim:
            count *= dim
    if count * itemsize > MAX_SHAPE_BYTES:
        raise LimitError(f"{what} of shape {list(shape)} would take {count} x {itemsize} bytes counting its "
                         f"non-zero dims, more than 2**62: NumPy cannot shape an array of it, even empty")


def _fixed(name, numpy_str):
    return DType(name, numpy_str, np.dtype(numpy_str).itemsize)


def _blocks(name, elems, nbytes, per_row=True):
    return DType(name, None, 0, elems, nbytes, per_row)


DTYPES: dict[str, DType] = {
    d.name: d
    for d in (
        _fixed("F32", "<f4"),
        _fixed("F16", "<f2"),
        DType("BF16", None, 2),
        _fixed("F64", "<f8"),
        _fixed("I8", "i1"),
        _fixed("I16", "<i2"),
        _fixed("I32", "<i4"),
        _fixed("I64", "<i8"),
        _fixed("U8", "u1"),
        _fixed("U16", "<u2"),
        _fixed("U32", "<u4"),
        _fixed("U64", "<u8"),
        _fixed("BOOL", "?"),
        _fixed("C64", "<c8"),
        _fixed("C128", "<c16"),
        # float8 (OCP FP8 and the "fnuz" variants; E8M0 is the MX block scale type)
        DType("F8_E4M3", None, 1),
        DType("F8_E5M2", None, 1),
        DType("F8_E4M3FNUZ", None, 1),
        DType("F8_E5M2FNUZ", None, 1),
        DType("F8_E8M0", None, 1),
        # FP4 e2m1 (OCP MX), two values per byte, low nibble first, packed across the
        # flat tensor like torch's float4_e2m1fn_x2; an odd count pads the last nibble.
        _blocks("F4_E2M1", 2, 1, per_row=False),
        # FP6 (OCP MX e2m3 / e3m2, safetensors' F6_E2M3 / F6_E3M2): a little-endian bit
        # stream, value i in bits [6i, 6i + 6), so four values fill three bytes; a count
        # that is not a multiple of 4 pads the last group with zero bits (docs/FORMAT.md).
        _blocks("F6_E2M3", 4, 3, per_row=False),
        _blocks("F6_E3M2", 4, 3, per_row=False),
        # GGML blocks (llama.cpp ggml-common.h sizes).
        _blocks("Q8_0", 32, 34),
        _blocks("Q4_0", 32, 18),
        _blocks("Q4_1", 32, 20),
        _blocks("Q5_0", 32, 22),
        _blocks("Q5_1", 32, 24),
        _blocks("Q4_K", 256, 144),
        _blocks("Q6_K", 256, 210),
        # The other GGML types, in GGML id order (ggml-common.h's block structs).  Q8_1 is
        # ggml's 36 bytes (f16 d, f16 s, 32 x i8); gguf-py's size table still says 40,
        # from when d and s were f32 (docs/FORMAT.md §4).
        _blocks("Q8_1", 32, 36),
        _blocks("Q2_K", 256, 84),
        _blocks("Q3_K", 256, 110),
        _blocks("Q5_K", 256, 176),
        _blocks("Q8_K", 256, 292),
        _blocks("IQ2_XXS", 256, 66),
        _blocks("IQ2_XS", 256, 74),
        _blocks("IQ3_XXS", 256, 98),
        _blocks("IQ1_S", 256, 50),
        _blocks("IQ4_NL", 32, 18),
        _blocks("IQ3_S", 256, 110),
        _blocks("IQ2_S", 256, 82),
        _blocks("IQ4_XS", 256, 136),
        _blocks("IQ1_M", 256, 56),
        _blocks("TQ1_0", 256, 54),
        _blocks("TQ2_0", 256, 66),
        _blocks("MXFP4", 32, 17),
        _blocks("NVFP4", 64, 36),
        _blocks("Q1_0", 128, 18),
        # aprender's own: APR_Q4 = per-32 f16 scale + 16 nibble bytes, blocks run across
        # rows; APR_Q8 = one f32 scale + i8 per element (see nbytes).
        _blocks("APR_Q4", 32, 18, per_row=False),
        DType("APR_Q8", None, 0, 1, 1, False, tensor_header=4),
        # The spec's Q8_TENSOR (seed 002 §6.2): f32 scale, i32 zero point, i8 per element.
        DType("Q8_TENSOR", None, 0, 1, 1, False, tensor_header=8),
        # aprender's format-quantize Q8_0/Q4_0 (APRENDER-COMPAT §3.2): blocks of 32 run
        # across the flat tensor, the last one padded.
        _blocks("APR_FQ8_0", 32, 34, per_row=False),
        _blocks("APR_FQ4_0", 32, 18, per_row=False),
    )
}

_ALIASES = {
    "FLOAT32": "F32", "FLOAT16": "F16", "HALF": "F16", "BFLOAT16": "BF16",
    "FLOAT64": "F64", "DOUBLE": "F64", "INT8": "I8", "INT16": "I16", "INT32": "I32",
    "INT64": "I64", "UINT8": "U8", "UINT16": "U16", "UINT32": "U32", "UINT64": "U64",
    "Q4K": "Q4_K", "Q6K": "Q6_K", "Q2K": "Q2_K", "Q3K": "Q3_K", "Q5K": "Q5_K", "Q8K": "Q8_K",
    "APRQ4": "APR_Q4", "APRQ8": "APR_Q8",
    "Q8TENSOR": "Q8_TENSOR", "COMPLEX64": "C64", "COMPLEX128": "C128",
    "FLOAT8_E4M3FN": "F8_E4M3", "F8_E4M3FN": "F8_E4M3", "FLOAT8_E5M2": "F8_E5M2",
    "FLOAT8_E4M3FNUZ": "F8_E4M3FNUZ", "FLOAT8_E5M2FNUZ": "F8_E5M2FNUZ",
    "FLOAT8_E8M0FNU": "F8_E8M0", "F8_E8M0FNU": "F8_E8M0", "F4": "F4_E2M1",
    "FLOAT4_E2M1FN": "F4_E2M1", "FLOAT4_E2M1FN_X2": "F4_E2M1",
    "FLOAT6_E2M3FN": "F6_E2M3", "FLOAT6_E3M2FN": "F6_E3M2",
}


#: APR2 id of tensors whose dtype is known only by a foreign name (a safetensors dtype
#: aprfast lacks); the name of each is kept in the metadata under OPAQUE_NAMES_KEY.
OPAQUE_APR2_ID = 255
OPAQUE_NAMES_KEY = "aprfast.opaque_dtypes"
_OPAQUE: dict = {}
#: A foreign dtype name is kept verbatim, up to this length.
MAX_OPAQUE_NAME = 64


def opaque_dtype(name: str) -> DType:
    """The opaque DType for a dtype name aprfast does not know (``"F6_E2M3"`` in a
    safetensors header): one object per name, carried as bytes, never given values.

    Raises:
        UnknownDTypeError: ``name`` is not a short printable string.
    """
    if not isinstance(name, str) or not name or len(name) > MAX_OPAQUE_NAME or not name.isprintable():
        raise UnknownDTypeError(f"dtype {name!r} is not a dtype name (a printable string of 1-{MAX_OPAQUE_NAME} "
                                "characters)")
    key = ("name", name)
    if key not in _OPAQUE:
        _OPAQUE[key] = DType(name, opaque=True)
    return _OPAQUE[key]


def unknown_id_dtype(type_id: int) -> DType:
    """The opaque DType for an APR2 dtype id aprfast does not define (a file from a newer
    writer), named ``unknown(<id>)`` as :class:`aprfast.tensors.TensorInfo` names it.

    Raises:
        UnknownDTypeError: ``type_id`` is not a byte, or the APR2 table defines it.
    """
    if isinstance(type_id, bool) or not isinstance(type_id, int) or not 0 <= type_id <= 255 \
            or APR2_IDS.knows(type_id) or type_id == OPAQUE_APR2_ID:
        raise UnknownDTypeError(f"dtype id {type_id!r} is not an unknown APR2 id (one byte the table does not "
                                f"define, other than {OPAQUE_APR2_ID})")
    key = ("id", type_id)
    if key not in _OPAQUE:
        _OPAQUE[key] = DType(f"unknown({type_id})", opaque=True, raw_id=type_id)
    return _OPAQUE[key]


def by_name(name) -> DType:
    """The DType called ``name`` ("F32", "bf16", "q4_k", ... case-insensitive)."""
    if isinstance(name, DType):
        return name
    key = str(name).upper()
    key = _ALIASES.get(key, key)
    try:
        return DTYPES[key]
    except KeyError:
        raise UnknownDTypeError(f"unknown dtype name {name!r}; known: {', '.join(DTYPES)}") from None


def add_dtype(dtype: DType) -> DType:
    """Register a new packed type (custom quantizers); refuses a name or alias in use."""
    key = dtype.name.upper()
    if key != dtype.name or key in DTYPES or key in _ALIASES:
        raise LayoutError(f"dtype name {dtype.name!r} is taken or not upper-case; known: {', '.join(DTYPES)}")
    DTYPES[key] = dtype
    return dtype


def remove_dtype(name: str) -> None:
    """Forget a dtype added with :func:`add_dtype`."""
    DTYPES.pop(name, None)


_FROM_NUMPY = {np.dtype(d.numpy).newbyteorder("<"): d for d in DTYPES.values() if d.numpy}


def from_numpy(dtype) -> DType:
    """The DType that stores arrays of NumPy ``dtype`` (any byte order)."""
    dtype = np.dtype(dtype)
    for name, ml_dtype in _ML_NUMPY.items():
        if dtype == ml_dtype:
            return DTYPES[name]
    for name, ml_dtype in _SUBBYTE_NUMPY.items():  # packed by the writer (pack_subbyte)
        if dtype == ml_dtype:
            return DTYPES[name]
    found = _FROM_NUMPY.get(dtype.newbyteorder("<"))
    if found is None:
        raise LayoutError(f"arrays of dtype {dtype} cannot be stored; supported: "
                          + ", ".join(sorted(str(np.dtype(d.numpy)) for d in DTYPES.values() if d.numpy))
                          + "".join(f", {t}" for t in (*_ML_NUMPY.values(), *_SUBBYTE_NUMPY.values())))
    return found


def pack_subbyte(codes, bits: int) -> np.ndarray:
    """Pack sub-byte codes (one per byte, in the low ``bits`` bits) the way files keep
    them: a little-endian bit stream, value ``i`` in bits ``[bits*i, bits*(i+1))``.  FP4:
    two a byte, the first in the low nibble; FP6: four in three bytes.  The last group is
    padded with zero bits.

    Args:
        codes: uint8 codes (any shape; read flat), or an ml_dtypes float4/float6 array.
        bits: 4 or 6.

    Returns:
        The packed bytes as a flat uint8 array (``ceil(n*4/8)`` bytes for FP4, ``ceil(n/4)*3`` for FP6).

    Example:
        >>> pack_subbyte(np.array([1, 2, 3], np.uint8), 4)
        array([33,  3], dtype=uint8)
    """
    c = np.ascontiguousarray(codes).reshape(-1).view(np.uint8) & ((1 << bits) - 1)
    if bits == 4:
        if c.size % 2:
            c = np.concatenate([c, np.zeros(1, np.uint8)])
        return (c[0::2] | (c[1::2] << 4)).astype(np.uint8)
    if bits != 6:
        raise LayoutError(f"sub-byte packing takes 4 or 6 bits, not {bits}")
    if c.size % 4:
        c = np.concatenate([c, np.zeros(4 - c.size % 4, np.uint8)])
    g = c.reshape(-1, 4).astype(np.uint32)
    word = g[:, 0] | (g[:, 1] << 6) | (g[:, 2] << 12) | (g[:, 3] << 18)
    return word.astype("<u4").view(np.uint8).reshape(-1, 4)[:, :3].reshape(-1).copy()


def unpack_subbyte(data, bits: int, count: int) -> np.ndarray:
    """The ``count`` codes (uint8, one a byte) of bytes packed by :func:`pack_subbyte`.

    Args:
        data: The packed bytes (any uint8 array or bytes-like).
        bits: 4 or 6.
        count: How many values to unpack.

    Returns:
        A flat uint8 array of ``count`` codes.

    Raises:
        LayoutError: ``data`` holds fewer than ``count`` values.

    Example:
        >>> unpack_subbyte(np.array([33, 3], np.uint8), 4, 3)
        array([1, 2, 3], dtype=uint8)
    """
    raw = np.frombuffer(data, np.uint8) if not isinstance(data, np.ndarray) else data.reshape(-1).view(np.uint8)
    if raw.size * 8 // bits < count:
        raise LayoutError(f"{raw.size} bytes hold fewer than {count} {bits}-bit values")
    if bits == 4:
        out = np.empty(raw.size * 2, np.uint8)
        out[0::2] = raw & 0x0F
        out[1::2] = raw >> 4
        return out[:count]
    if bits != 6:
        raise LayoutError(f"sub-byte packing takes 4 or 6 bits, not {bits}")
    groups = raw[: raw.size // 3 * 3].reshape(-1, 3).astype(np.uint32)
    word = groups[:, 0] | (groups[:, 1] << 8) | (groups[:, 2] << 16)
    out = np.empty((groups.shape[0], 4), np.uint8)
    for k in range(4):
        out[:, k] = (word >> (6 * k)) & 0x3F
    return out.reshape(-1)[:count]


def _minifloat_table(exp_bits: int, man_bits: int) -> np.ndarray:
    """float32 value of every code of an OCP MX minifloat without Inf/NaN (E2M1,
    E2M3, E3M2): sign, exponent (bias ``2**(e-1) - 1``), mantissa; exponent 0 subnormal."""
    bias = (1 << (exp_bits - 1)) - 1
    codes = np.arange(1 << (1 + exp_bits + man_bits))
    sign = np.where(codes >> (exp_bits + man_bits) & 1, -1.0, 1.0)
    e = (codes >> man_bits) & ((1 << exp_bits) - 1)
    m = codes & ((1 << man_bits) - 1)
    mag = np.where(e == 0, m / (1 << man_bits) * 2.0 ** (1 - bias),
                   (1 + m / (1 << man_bits)) * 2.0 ** (e - bias))
    return (sign * mag).astype(np.float32)


_SUBBYTE_TABLES = {"F4_E2M1": _minifloat_table(2, 1), "F6_E2M3": _minifloat_table(2, 3),
                   "F6_E3M2": _minifloat_table(3, 2)}


def subbyte_values(dtype, data, shape) -> np.ndarray:
    """float32 values of a packed FP4/FP6 tensor (exact: every code is a float32).

    Args:
        dtype: F4_E2M1, F6_E2M3 or F6_E3M2 (a DType or its name).
        data: The packed bytes.
        shape: The tensor's logical shape.

    Returns:
        A float32 array of ``shape``.

    Example:
        >>> subbyte_values("F4_E2M1", np.array([0x21], np.uint8), (2,))
        array([0.5, 1. ], dtype=float32)
    """
    d = by_name(dtype)
    bits = SUBBYTE_FLOATS[d.name][0]
    return _SUBBYTE_TABLES[d.name][unpack_subbyte(data, bits, element_count(shape))].reshape(shape)


def subbyte_array(dtype, data, shape):
    """A packed FP4/FP6 tensor as ml_dtypes' one-value-a-byte array of ``shape``, or
    None without ml_dtypes (or a type ml_dtypes lacks)."""
    d = by_name(dtype)
    kind = _SUBBYTE_NUMPY.get(d.name)
    if kind is None:
        return None
    return unpack_subbyte(data, SUBBYTE_FLOATS[d.name][0], element_count(shape)).view(kind).reshape(shape)


def numpy_dtype(dtype: DType) -> np.dtype:
    """The little-endian NumPy dtype that views ``dtype``'s bytes (bf16 needs ml_dtypes)."""
    if dtype.name in ML_DTYPES:
        return _ML_NUMPY.get(dtype.name) or np.dtype(f"<u{dtype.itemsize}")
    if dtype.opaque:
        raise UnknownDTypeError(f"{dtype.name} is a dtype aprfast does not know; it has bytes but no values")
    if dtype.packed:
        raise LayoutError(f"{dtype.name} is a packed block type with no NumPy dtype")
    return np.dtype(dtype.numpy)


class IdTable:
    """One layout's dtype bytes: ``write`` ids (one per dtype) plus read-only legacy ids."""

    def __init__(self, layout: str, write: Mapping[int, str], legacy: Mapping[int, str] = {}):
        self.layout = layout
        self._by_id = {i: DTYPES[n] for i, n in {**legacy, **write}.items()}
        self._by_name = {n: i for i, n in write.items()}

    def dtype(self, type_id: int) -> DType:
        try:
            return self._by_id[type_id]
        except KeyError:
            raise UnknownDTypeError(f"dtype id {type_id} is not defined by the {self.layout} layout") from None

    def id_of(self, dtype: DType) -> int:
        try:
            return self._by_name[dtype.name]
        except KeyError:
            raise LayoutError(f"the {self.layout} layout has no id for dtype {dtype.name}") from None

    def knows(self, type_id: int) -> bool:
        return type_id in self._by_id

    def items(self):
        """(id, dtype) of every id this layout reads, legacy ids included."""
        return self._by_id.items()

    def holds(self, dtype: DType) -> bool:
        return dtype.name in self._by_name

    def names(self):
        return list(self._by_name)

    #: callables(table, type_id) told of every add/remove: the layouts keep per-table caches
    #: (size rules, names) that must follow a custom quantizer registered at run time
    watchers: list = []

    def _changed(self, type_id: int) -> None:
        for watcher in IdTable.watchers:
            watcher(self, type_id)

    def add(self, type_id: int, dtype: DType) -> None:
        """Give ``dtype`` the id ``type_id`` (custom quantizers); refuses an id or dtype in use."""
        if type_id in self._by_id or dtype.name in self._by_name:
            taken = self._by_id.get(type_id)
            raise LayoutError(f"the {self.layout} layout already uses dtype id {type_id} "
                              f"({taken.name if taken else 'free'}) or has an id for {dtype.name}")
        self._by_id[type_id] = dtype
        self._by_name[dtype.name] = type_id
        self._changed(type_id)

    def remove(self, type_id: int) -> None:
        """Drop an id given with :meth:`add`."""
        dtype = self._by_id.pop(type_id, None)
        if dtype is not None:
            self._by_name.pop(dtype.name, None)
        self._changed(type_id)


#: aprender's `TensorDType` (apr-format 0.72): current ids, plus the pre-GH-438 ids
#: 2 (BF16), 8 (APR_Q4) and 9 (APR_Q8) that older files carry.
APRENDER_IDS = IdTable(
    "aprender",
    write={0: "F32", 1: "F16", 3: "F64", 4: "I32", 5: "I64", 6: "I8", 7: "U8",
           12: "Q4_K", 14: "Q6_K", 30: "BF16", 128: "APR_Q4", 129: "APR_Q8"},
    legacy={2: "BF16", 8: "APR_Q4", 9: "APR_Q8"},
)

#: The APR2 spec's ids (seed 001 §3.5) plus aprfast's extensions from 32 up for types
#: the spec lacks (docs/FORMAT.md); 128/129 are shared with aprender.
APR2_IDS = IdTable(
    "apr2",
    write={0: "F32", 1: "F16", 2: "BF16", 3: "I8", 4: "I16", 5: "I32", 6: "I64", 7: "U8",
           16: "Q8_0", 17: "Q4_0", 18: "Q4_1", 19: "Q5_0", 20: "Q5_1",
           32: "F64", 33: "BOOL", 34: "U16", 35: "U32", 36: "U64", 37: "Q4_K", 38: "Q6_K",
           39: "Q8_TENSOR", 40: "APR_FQ8_0", 41: "APR_FQ4_0", 42: "F8_E4M3", 43: "F8_E5M2",
           44: "F8_E4M3FNUZ", 45: "F8_E5M2FNUZ", 46: "F8_E8M0", 47: "C64", 48: "C128", 49: "F4_E2M1",
           # the other GGML types, in GGML id order (docs/FORMAT.md §4)
           50: "Q8_1", 51: "Q2_K", 52: "Q3_K", 53: "Q5_K", 54: "Q8_K", 55: "IQ2_XXS", 56: "IQ2_XS",
           57: "IQ3_XXS", 58: "IQ1_S", 59: "IQ4_NL", 60: "IQ3_S", 61: "IQ2_S", 62: "IQ4_XS", 63: "IQ1_M",
           64: "TQ1_0", 65: "TQ2_0", 66: "MXFP4", 67: "NVFP4", 68: "Q1_0",
           # safetensors' 6-bit floats (docs/FORMAT.md)
           69: "F6_E2M3", 70: "F6_E3M2",
           128: "APR_Q4", 129: "APR_Q8"},
)
