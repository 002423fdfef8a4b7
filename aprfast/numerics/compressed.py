"""Weights in the compressed-tensors layout (vLLM / llm-compressor checkpoints): a packed
or low-precision weight stored beside its ``_scale`` (and ``_global_scale``,
``_zero_point``) tensors, described by ``quantization_config`` in ``config.json``.

A checkpoint imported to ``.apr`` keeps every tensor as it is and records, per
quantized weight, which tensors belong together and the scheme (metadata key
:data:`METADATA_KEY`, docs/FORMAT.md "compressed-tensors").  :func:`weight_values`
gives the values compressed-tensors' own decompression gives, bit for bit: the same
arithmetic (fp8/fp4/fp6 codes widened exactly, scale divided by the global scale,
zero point subtracted, multiplied) in the same dtypes, each step rounded to nearest
even as torch rounds it on the CPU.
"""

from __future__ import annotations

import numpy as np

from ..dtypes import SUBBYTE_FLOATS, element_count, subbyte_values
from ..errors import CorruptError, LayoutError
from ..tensors import RawTensor

__all__ = ["METADATA_KEY", "FORMATS", "check_record", "weight_values", "output_dtype"]

#: .apr metadata key: ``{"quantization_config": {...}, "weights": {packed name: record}}``.
METADATA_KEY = "aprfast.compressed_tensors"

#: compressed-tensors format -> (weight suffix, weight dtypes, values per stored column, MX scales)
FORMATS = {
    "nvfp4-pack-quantized": ("weight_packed", ("U8",), 2, False),
    "mxfp4-pack-quantized": ("weight_packed", ("U8",), 2, True),
    "mxfp6-pack-quantized": ("weight_packed", ("U8",), None, True),  # 4 values in 3 bytes
    "mxfp8-quantized": ("weight", ("F8_E4M3",), 1, True),
    "float-quantized": ("weight", ("F8_E4M3", "F8_E5M2"), 1, False),
    "naive-quantized": ("weight", ("F8_E4M3", "F8_E5M2", "I8"), 1, False),
    "int-quantized": ("weight", ("I8",), 1, False),
}
_FLOATS = ("F32", "F16", "BF16", "F64")
_FLOAT8 = ("F8_E4M3", "F8_E5M2")


def _logical_shape(fmt: str, shape) -> tuple:
    rows, cols = shape
    if fmt == "mxfp6-pack-quantized":
        return rows, cols * 4 // 3
    return rows, cols * FORMATS[fmt][2]


def _scale_shape(record: dict, shape) -> tuple:
    """The scale shapes compressed-tensors makes for ``record``'s strategy."""
    rows, cols = shape
    strategy = record.get("strategy")
    if strategy in ("group", "tensor_group"):
        return ((rows, cols // record["group_size"]),)
    if strategy == "channel":
        return ((rows, 1), (rows,))
    if strategy == "block":
        bh, bw = record["block_structure"]
        return ((-(-rows // bh), -(-cols // bw)),)
    return ((1,), (), (1, 1))  # tensor


def check_record(name: str, record, info) -> tuple:
    """Check one weight's record against the tensors it names; return the logical shape.

    Args:
        name: The weight tensor's name (the record's key).
        record: Its record (format, scheme, the names of its scale tensors).
        info: ``info(tensor_name)`` -> ``(dtype name, shape)``, or None when the file has
            no such tensor.

    Returns:
        The weight's logical (values) shape.

    Raises:
        CorruptError: A tensor the record names is missing or has the wrong dtype or
            shape, or the scheme is malformed (the message names the tensor).
        LayoutError: A compressed-tensors format aprfast cannot decode.
    """
    if not isinstance(record, dict):
        raise CorruptError(f"compressed-tensors record of {name!r} is not an object")
    fmt = record.get("format")
    if fmt not in FORMATS:
        raise LayoutError(f"tensor {name!r} is compressed-tensors {fmt!r}, a format aprfast cannot decode "
                          f"(it decodes {', '.join(FORMATS)})")
    _, weight_dtypes, _, mx = FORMATS[fmt]
    found = info(name)
    if found is None:
        raise CorruptError(f"compressed-tensors weight {name!r} is missing")
    dtype, shape = found[0], tuple(found[1])
    if dtype not in weight_dtypes or len(shape) != 2:
        raise CorruptError(f"compressed-tensors {fmt} weight {name!r} is {dtype} of shape {list(shape)}; "
                           f"it must be a 2-D {' or '.join(weight_dtypes)} tensor")
    if fmt == "mxfp6-pack-quantized" and shape[1] % 3:
        raise CorruptError(f"compressed-tensors {fmt} weight {name!r} has {shape[1]} bytes a row, not whole "
                           "groups of 3 (4 values)")
    logical = _logical_shape(fmt, shape)
    strategy = record.get("strategy")
    if strategy in ("group", "tensor_group"):
        g = record.get("group_size")
        if type(g) is not int or g <= 0 or logical[1] % g:
            raise CorruptError(f"compressed-tensors weight {name!r}: group_size {g!r} does not divide its "
                               f"{logical[1]} columns")
    elif strategy == "block":
        block = record.get("block_structure")
        if (not isinstance(block, list) or len(block) != 2
                or not all(type(b) is int and b > 0 for b in block)):
            raise CorruptError(f"compressed-tensors weight {name!r}: block_structure {block!r} is not two "
                               "positive ints")
    elif strategy not in ("tensor", "channel"):
        raise LayoutError(f"compressed-tensors weight {name!r}: strategy {strategy!r} is not one aprfast "
                          "decodes (tensor, channel, group, tensor_group, block)")
    scale = record.get("scale")
    found = info(scale) if isinstance(scale, str) else None
    if found is None:
        raise CorruptError(f"compressed-tensors weight {name!r}: its scale tensor {scale!r} is missing")
    want_dtypes = ("U8",) if mx else _FLOATS + (_FLOAT8 if fmt == "nvfp4-pack-quantized" else ())
    if found[0] not in want_dtypes or tuple(found[1]) not in _scale_shape(record, logical):
        raise CorruptError(f"compressed-tensors scale {scale!r} of {name!r} is {found[0]} of shape "
                           f"{list(found[1])}; {strategy} quantization of a {list(logical)} weight needs "
                           f"{' or '.join(want_dtypes)} of shape "
                           f"{' or '.join(str(list(s)) for s in _scale_shape(record, logical))}")
    for key, shapes in (("global_scale", ((1,), ())), ("zero_point", _scale_shape(record, logical))):
        other = record.get(key)
        if other is None:
            if key == "global_scale" and strategy == "tensor_group":
                raise CorruptError(f"compressed-tensors weight {name!r}: tensor_group quantization needs a "
                                   "global scale, and the record names none")
            continue
        found = info(other) if isinstance(other, str) else None
        if found is None:
            raise CorruptError(f"compressed-tensors weight {name!r}: its {key} tensor {other!r} is missing")
        allowed = _FLOATS if key == "global_scale" else _FLOATS + _FLOAT8 + ("I8", "U8", "I32")
        if found[0] not in allowed or tuple(found[1]) not in shapes:
            raise CorruptError(f"compressed-tensors {key} {other!r} of {name!r} is {found[0]} of shape "
                               f"{list(found[1])}; it must be {' or '.join(allowed)} of shape "
                               f"{' or '.join(str(list(s)) for s in shapes)}")
    return logical


# --- rounding as torch rounds on the CPU --------------------------------------------------
def _bf16(values: np.ndarray) -> np.ndarray:
    """float32 -> nearest bfloat16 (ties to even), given back as float32."""
    bits = np.ascontiguousarray(values, np.float32).view(np.uint32)
    nan = (bits & 0x7FFFFFFF) > 0x7F800000
    rounded = (bits + (0x7FFF + ((bits >> 16) & 1))) & 0xFFFF0000
    rounded = np.where(nan, (bits | 0x00400000) & 0xFFFF0000, rounded)
    return rounded.astype(np.uint32).view(np.float32)


def _round(values: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "BF16":
        return _bf16(values)
    if dtype == "F16":
        with np.errstate(over="ignore"):
            return values.astype(np.float16).astype(np.float32)
    if dtype == "F64":
        return values.astype(np.float64)
    return values.astype(np.float32)


def _promote(a: str, b: str) -> str:
    """torch's promotion of two floating dtypes."""
    if a == b:
        return a
    if "F64" in (a, b):
        return "F64"
    return "F32"  # F32 with anything smaller, and BF16 with F16


def _float_values(tensor) -> np.ndarray:
    """float32 (float64 for F64) values of a stored tensor of a plain or float8 dtype."""
    if isinstance(tensor, RawTensor):
        dtype = tensor.dtype.name
        data = np.ascontiguousarray(tensor.data).reshape(-1)
        if dtype == "BF16":
            return (data.view(np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(tensor.shape)
        if dtype in _FLOAT8:
            from .stats import _float8_table
            return _float8_table(dtype)[data.view(np.uint8)].reshape(tensor.shape)
        raise LayoutError(f"a {dtype} tensor has no plain values here")
    array = np.asarray(tensor)
    name = array.dtype.name
    if name == "bfloat16":
        return (array.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    if name.startswith("float8"):
        from .stats import _float8_table
        kind = {"float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2"}.get(name)
        if kind is None:
            raise LayoutError(f"a {name} tensor has no values here")
        return _float8_table(kind)[array.view(np.uint8)]
    return array.astype(np.float64 if array.dtype == np.float64 else np.float32)


def _dtype_name(tensor) -> str:
    if isinstance(tensor, RawTensor):
        return tensor.dtype.name
    name = np.asarray(tensor).dtype.name
    return {"float32": "F32", "float16": "F16", "bfloat16": "BF16", "float64": "F64", "uint8": "U8",
            "int8": "I8", "int32": "I32", "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2"}.get(name, name)


def output_dtype(record: dict, scale_dtype: str) -> str:
    """The dtype compressed-tensors decompresses ``record``'s weight to: bfloat16 for the
    packed FP4/FP6 and MX formats, else the scale's dtype."""
    fmt = record["format"]
    if fmt.endswith("pack-quantized") or FORMATS[fmt][3]:
        return "BF16"
    return scale_dtype


def _codes(fmt: str, weight, shape) -> np.ndarray:
    """Exact float32 values of the quantized weight (fp4/fp6 codes, fp8, int8)."""
    if fmt in ("nvfp4-pack-quantized", "mxfp4-pack-quantized", "mxfp6-pack-quantized"):
        kind = "F4_E2M1" if "fp4" in fmt else "F6_E2M3"
        data = np.ascontiguousarray(weight.data if isinstance(weight, RawTensor) else weight).view(np.uint8)
        assert SUBBYTE_FLOATS[kind]
        return subbyte_values(kind, data.reshape(-1), shape)
    if _dtype_name(weight) == "I8":
        return np.asarray(weight).astype(np.float32)
    return _float_values(weight)


def weight_values(name: str, record: dict, get, info) -> np.ndarray:
    """The values compressed-tensors' decompression gives for the weight ``name``.

    Args:
        name: The weight tensor's name.
        record: Its record (see :func:`check_record`).
        get: ``get(tensor_name)`` -> the stored tensor (array or RawTensor).
        info: ``info(tensor_name)`` -> ``(dtype name, shape)`` or None.

    Returns:
        A float32 array of the logical shape (float64 for F64 scales), each value the
        one compressed-tensors computes (in bfloat16 for the FP4/FP6/MX formats,
        widened exactly).

    Raises:
        CorruptError: As :func:`check_record`.
        LayoutError: A format aprfast cannot decode.

    Example:
        >>> # see tests/test_compressed_tensors.py: checkpoints compressed-tensors writes
    """
    shape = check_record(name, record, info)
    fmt, strategy = record["format"], record["strategy"]
    q = _codes(fmt, get(name), shape)
    scale_t = get(record["scale"])
    if FORMATS[fmt][3]:  # MX: E8M0 exponents -> bfloat16 powers of two
        exps = np.asarray(scale_t).astype(np.int64) - 127
        with np.errstate(over="ignore"):
            s = _bf16(np.ldexp(np.float32(1), exps).astype(np.float32))
        s_dtype = "BF16"
    else:
        stored = _dtype_name(scale_t)
        s = _float_values(scale_t)
        s_dtype = "BF16" if fmt == "nvfp4-pack-quantized" else stored  # nvfp4: scale.to(bfloat16)
        s = _round(s, s_dtype)
    compute = s_dtype
    if record.get("global_scale") is not None:
        g_t = get(record["global_scale"])
        g = _float_values(g_t).reshape(-1)[:1]
        if info(record["global_scale"])[1]:  # a 0-d tensor does not take part in promotion
            compute = _promote(s_dtype, _dtype_name(g_t))
        wide = np.float64 if compute == "F64" else np.float32
        s = _round(s.astype(wide) / g.astype(wide), compute)
    wide = np.float64 if compute == "F64" else np.float32
    s = s.astype(wide).reshape(-1)
    rows, cols = shape
    if strategy in ("group", "tensor_group"):
        s = np.repeat(s.reshape(rows, -1), record["group_size"], axis=1)
    elif strategy == "channel":
        s = s.reshape(rows, 1)
    elif strategy == "block":
        bh, bw = record["block_structure"]
        s = np.repeat(np.repeat(s.reshape(-(-rows // bh), -(-cols // bw)), bh, axis=0), bw, axis=1)[:rows, :cols]
    else:
        s = s.reshape(1, 1)
    x = _round(q.astype(wide), compute)
    if record.get("zero_point") is not None:
        zp = _round(_float_values(get(record["zero_point"])).astype(wide), compute)
        zp = zp.reshape(s.shape if strategy != "group" and strategy != "tensor_group" else (rows, -1))
        if strategy in ("group", "tensor_group"):
            zp = np.repeat(zp, record["group_size"], axis=1)
        x = _round(x - zp, compute)
    with np.errstate(over="ignore", invalid="ignore"):
        values = _round(x * s, compute)
    values = _round(values, output_dtype(record, compute))
    assert element_count(values.shape) == rows * cols
    return values.reshape(shape)
