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

__all__ = ["METADATA_KEY", "FORMATS", "WEIGHT_NDIMS", "check_record", "weight_values", "values_dtype",
           "output_dtype", "unpack_int32_stream", "mxfp4_repackable",
           "ct_mxfp4_to_ggml", "ggml_mxfp4_to_ct", "mxfp4_quantization_config"]

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
    "pack-quantized": ("weight_packed", ("I32",), None, False),  # 1-8 bit ints, a bit stream in int32
}
#: dtypes of pack-quantized's ``weight_shape`` (torch.tensor(weight.shape): int64)
_SHAPE_DTYPES = ("I64", "I32")
_FLOATS = ("F32", "F16", "BF16", "F64")
_FP_PACKED = ("nvfp4-pack-quantized", "mxfp4-pack-quantized", "mxfp6-pack-quantized")
_FLOAT8 = ("F8_E4M3", "F8_E5M2")


#: Dimensions a compressed-tensors weight may have: a Linear's [out, in], or experts
#: stacked [E, out, in] (MoE), each expert quantized as its own 2-D weight.
WEIGHT_NDIMS = (2, 3)


def _logical_shape(fmt: str, shape) -> tuple:
    cols = shape[-1]
    if fmt == "mxfp6-pack-quantized":
        return (*shape[:-1], cols * 4 // 3)
    return (*shape[:-1], cols * FORMATS[fmt][2])


def _lead(shape) -> tuple:
    """The expert dimensions of a weight's shape (() for a 2-D weight)."""
    return tuple(shape[:-2])


def _count(lead) -> int:
    n = 1
    for d in lead:
        n *= d
    return n


def _int_bits(name: str, record: dict) -> int:
    bits = record.get("num_bits")
    if type(bits) is not int or not 1 <= bits <= 8:
        raise CorruptError(f"compressed-tensors pack-quantized weight {name!r}: num_bits {bits!r} is not 1 to 8")
    if record.get("type") not in (None, "int"):
        raise LayoutError(f"compressed-tensors pack-quantized weight {name!r} is of type {record.get('type')!r}; "
                          "aprfast decodes int")
    return bits


def _packed_shape(name: str, record: dict, shape, info, read) -> tuple:
    """The logical shape of a pack-quantized weight: its ``weight_shape`` tensor's two
    values (``read``), each checked against the packed words; without ``read`` (an
    import's check, tensor specs only) the columns the scales or the words imply."""
    words = shape[-1]
    bits = _int_bits(name, record)
    shape_name = record.get("weight_shape")
    found = info(shape_name) if isinstance(shape_name, str) else None
    if found is None:
        raise CorruptError(f"compressed-tensors weight {name!r}: its weight_shape tensor {shape_name!r} is missing")
    if found[0] not in _SHAPE_DTYPES or tuple(found[1]) != (len(shape),):
        raise CorruptError(f"compressed-tensors weight_shape {shape_name!r} of {name!r} is {found[0]} of shape "
                           f"{list(found[1])}; it must be I64 or I32 of shape [{len(shape)}]")
    if read is None:
        g = record.get("group_size")
        scale = info(record.get("scale")) if isinstance(record.get("scale"), str) else None
        if (record.get("strategy") in ("group", "tensor_group") and type(g) is int and scale
                and len(scale[1]) == len(shape)):
            return (*shape[:-1], scale[1][-1] * g)
        return (*shape[:-1], words * 32 // bits)
    value = np.asarray(read(shape_name)).reshape(-1)
    logical = tuple(int(v) for v in value)
    if logical[:-1] != tuple(shape[:-1]) or logical[-1] < 1 or -(-logical[-1] * bits // 32) != words:
        raise CorruptError(f"compressed-tensors weight {name!r}: weight_shape {list(logical)} does not fit its "
                           f"{list(shape)} words of {bits}-bit values")
    return logical


def unpack_int32_stream(data, rows: int, count: int, bits: int) -> np.ndarray:
    """The unsigned ``bits``-bit fields of each row of little-endian int32 words, value i
    at bits ``i*bits`` onwards of the row's stream (compressed-tensors' ``pack_to_int32``;
    rows padded to whole groups of 32 values, so a row's stream starts a word).

    Args:
        data: The words as stored: ``rows`` rows of the same whole number of 4-byte words.
        rows: How many rows.
        count: Values wanted a row (at most ``words * 32 // bits``).
        bits: 1 to 8.

    Returns:
        uint8 ``[rows, count]``.

    Example:
        >>> unpack_int32_stream(np.int32([0x76543210]), 1, 8, 4).tolist()
        [[0, 1, 2, 3, 4, 5, 6, 7]]
    """
    b = np.ascontiguousarray(data).reshape(-1).view(np.uint8).reshape(rows, -1)
    if bits == 8:
        return b[:, :count]
    if bits == 4:
        out = np.empty((rows, b.shape[1] * 2), np.uint8)
        out[:, 0::2] = b & 0x0F
        out[:, 1::2] = b >> 4
        return out[:, :count]
    stream = np.unpackbits(b, axis=1, count=count * bits, bitorder="little").reshape(rows, count, bits)
    return np.packbits(stream, axis=2, bitorder="little").reshape(rows, count)


def _scale_shape(record: dict, shape) -> tuple:
    """The scale shapes compressed-tensors makes for ``record``'s strategy; a 3-D
    (experts) weight's scales have its leading dimension too, as each expert's 2-D
    scales stacked (a per-tensor scale: one for all, or one an expert)."""
    lead, (rows, cols) = _lead(shape), shape[-2:]
    strategy = record.get("strategy")
    if strategy in ("group", "tensor_group"):
        return ((*lead, rows, cols // record["group_size"]),)
    if strategy == "channel":
        return ((*lead, rows, 1), (*lead, rows))
    if strategy == "block":
        bh, bw = record["block_structure"]
        return ((*lead, -(-rows // bh), -(-cols // bw)),)
    return ((1,), (), (1, 1)) + (((*lead, 1, 1),) if lead else ())  # tensor


def _global_shapes(shape) -> tuple:
    """A global scale's shapes: one value, or (experts) one an expert."""
    lead = _lead(shape)
    return ((1,), ()) + ((lead, (*lead, 1)) if lead else ())


def check_record(name: str, record, info, read=None) -> tuple:
    """Check one weight's record against the tensors it names; return the logical shape.

    Args:
        name: The weight tensor's name (the record's key).
        record: Its record (format, scheme, the names of its scale tensors).
        info: ``info(tensor_name)`` -> ``(dtype name, shape)``, or None when the file has
            no such tensor.
        read: ``read(tensor_name)`` -> its values, for the pack-quantized
            ``weight_shape`` (whose two values give the columns); None: what the
            shapes imply.

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
    if dtype not in weight_dtypes or len(shape) not in WEIGHT_NDIMS:
        raise CorruptError(f"compressed-tensors {fmt} weight {name!r} is {dtype} of shape {list(shape)}; "
                           f"it must be a 2-D (or 3-D: experts) {' or '.join(weight_dtypes)} tensor")
    if fmt == "mxfp6-pack-quantized" and shape[-1] % 3:
        raise CorruptError(f"compressed-tensors {fmt} weight {name!r} has {shape[-1]} bytes a row, not whole "
                           "groups of 3 (4 values)")
    packed_ints = fmt == "pack-quantized"
    logical = _packed_shape(name, record, shape, info, read) if packed_ints else _logical_shape(fmt, shape)
    strategy = record.get("strategy")
    if strategy in ("group", "tensor_group"):
        g = record.get("group_size")
        if type(g) is not int or g <= 0 or logical[-1] % g:
            raise CorruptError(f"compressed-tensors weight {name!r}: group_size {g!r} does not divide its "
                               f"{logical[-1]} columns")
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
    zp_shapes = _scale_shape(record, logical)
    if packed_ints and strategy in ("group", "channel"):  # pack_to_int32(zero_point, packed_dim=0), per expert
        zp_shapes = ((*_lead(logical), -(-logical[-2] * record["num_bits"] // 32), zp_shapes[0][-1]),)
    for key, shapes in (("global_scale", _global_shapes(logical)), ("zero_point", zp_shapes)):
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
    if fmt in _FP_PACKED or FORMATS[fmt][3]:
        return "BF16"
    return scale_dtype


def values_dtype(record: dict, info) -> str:
    """The dtype that holds every value :func:`weight_values` gives for ``record``'s
    weight exactly: what compressed-tensors decompresses it to (bfloat16 for the packed
    FP4/FP6 and MX formats, else the scale's dtype, promoted with a global scale's).

    Args:
        record: A checked record (see :func:`check_record`).
        info: ``info(tensor_name)`` -> ``(dtype name, shape)``.

    Returns:
        "BF16", "F16", "F32" or "F64".

    Example:
        >>> values_dtype({"format": "float-quantized", "scale": "s"}, lambda name: ("F16", (8, 1)))
        'F16'
    """
    fmt = record["format"]
    if fmt in _FP_PACKED or FORMATS[fmt][3]:
        return "BF16"
    compute = info(record["scale"])[0]
    if record.get("global_scale") is not None:
        dtype, shape = info(record["global_scale"])
        if shape:  # a 0-d tensor does not take part in promotion
            compute = _promote(compute, dtype)
    return compute


def _ints(data, rows: int, count: int, bits: int) -> np.ndarray:
    """Signed values of pack_to_int32's stream: the unsigned fields less 2**(bits-1)."""
    return unpack_int32_stream(data, rows, count, bits).astype(np.int16) - (1 << (bits - 1))


def _codes(fmt: str, weight, shape, bits=None) -> np.ndarray:
    """Exact float32 values of the quantized weight (fp4/fp6 codes, fp8, int8, packed
    ints), of its logical ``shape`` (each row of a packed weight starts a byte or word)."""
    rows = _count(shape[:-1])
    if fmt == "pack-quantized":
        data = weight.data if isinstance(weight, RawTensor) else np.asarray(weight)
        return _ints(data, rows, shape[-1], bits).astype(np.float32).reshape(shape)
    if fmt in _FP_PACKED:
        kind = "F4_E2M1" if "fp4" in fmt else "F6_E2M3"
        data = np.ascontiguousarray(weight.data if isinstance(weight, RawTensor) else weight).view(np.uint8)
        assert SUBBYTE_FLOATS[kind]
        return subbyte_values(kind, data.reshape(-1), shape)
    if _dtype_name(weight) == "I8":
        return np.asarray(weight).astype(np.float32)
    return _float_values(weight)


def _compact(values: np.ndarray, record: dict, n: int, rows: int, cols: int) -> np.ndarray:
    """A scale (or zero point) as ``[n, a, b]``: each of the ``n`` experts' 2-D scales
    (a per-tensor one: ``[1, 1, 1]``, or ``[n, 1, 1]`` one an expert)."""
    strategy = record["strategy"]
    if strategy in ("group", "tensor_group"):
        return values.reshape(n, rows, -1)
    if strategy == "channel":
        return values.reshape(n, rows, 1)
    if strategy == "block":
        bh, bw = record["block_structure"]
        return values.reshape(n, -(-rows // bh), -(-cols // bw))
    return values.reshape(-1, 1, 1)


def _expand(values: np.ndarray, record: dict, rows: int, cols: int) -> np.ndarray:
    """A compact ``[n, a, b]`` scale repeated over the values it scales (groups,
    blocks); channel and tensor scales broadcast as they are."""
    strategy = record["strategy"]
    if strategy in ("group", "tensor_group"):
        return np.repeat(values, record["group_size"], axis=2)
    if strategy == "block":
        bh, bw = record["block_structure"]
        return np.repeat(np.repeat(values, bh, axis=1), bw, axis=2)[:, :rows, :cols]
    return values


def weight_values(name: str, record: dict, get, info) -> np.ndarray:
    """The values compressed-tensors' decompression gives for the weight ``name``.

    A 3-D weight (MoE experts stacked ``[E, out, in]``, scales ``[E, ...]``) gives each
    expert's values as its own 2-D weight decompresses (compressed-tensors itself
    decompresses 3-D FP8 per tensor/channel, MXFP8 and pack-quantized weights; NVFP4,
    MXFP4, MXFP6 and FP8 blocks it takes only 2-D, and they are decompressed here
    expert by expert as it decompresses each 2-D slice).

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
    shape = check_record(name, record, info, get)
    fmt = record["format"]
    lead, (rows, cols) = _lead(shape), shape[-2:]
    n = _count(lead)
    q = _codes(fmt, get(name), shape, record.get("num_bits")).reshape(n, rows, cols)
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
    s = _compact(np.asarray(s).reshape(-1), record, n, rows, cols)
    compute = s_dtype
    if record.get("global_scale") is not None:
        g_t = get(record["global_scale"])
        g = _float_values(g_t).reshape(-1)
        g = g[:1].reshape(1, 1, 1) if g.size == 1 else g.reshape(n, 1, 1)  # one, or one an expert
        if info(record["global_scale"])[1]:  # a 0-d tensor does not take part in promotion
            compute = _promote(s_dtype, _dtype_name(g_t))
        wide = np.float64 if compute == "F64" else np.float32
        s = _round(s.astype(wide) / g.astype(wide), compute)
    wide = np.float64 if compute == "F64" else np.float32
    s = _expand(s.astype(wide), record, rows, cols)
    x = _round(q.astype(wide), compute)
    if record.get("zero_point") is not None:
        zp_t = get(record["zero_point"])
        if fmt == "pack-quantized" and record["strategy"] in ("group", "channel"):  # packed along each expert's rows
            words = np.asarray(zp_t).astype("<i4")
            words = words.reshape(n, words.shape[-2], words.shape[-1])
            groups = words.shape[2]
            zp = _ints(np.ascontiguousarray(words.transpose(0, 2, 1)), n * groups, rows, record["num_bits"])
            zp_t = zp.reshape(n, groups, rows).transpose(0, 2, 1).astype(np.float32)
        zp = _round(_float_values(zp_t).astype(wide), compute)
        zp = _expand(_compact(zp.reshape(-1), record, n, rows, cols), record, rows, cols)
        x = _round(x - zp, compute)
    with np.errstate(over="ignore", invalid="ignore"):
        values = _round(x * s, compute)
    values = _round(values, output_dtype(record, compute))
    assert element_count(values.shape) == n * rows * cols
    return values.reshape(shape)


# --- MXFP4: compressed-tensors' packing <-> GGML's block_mxfp4 ------------------------
# The same numbers in two packings: an E2M1 code (sign bit 3) per value and an E8M0
# exponent per 32 consecutive values of a row.  compressed-tensors keeps the codes two to
# a byte in row order (value 2k in the low nibble, 2k+1 in the high one) and the
# exponents in a separate [rows, cols / 32] uint8 tensor; GGML's 17-byte block is the
# exponent, then 16 bytes whose low nibbles are values 0-15 and high nibbles 16-31.
MXFP4_BLOCK = 32
#: The E8M0 exponent OCP MX reserves for NaN: compressed-tensors reads it as 2**128
#: (inf), GGML as 2**127; no value both agree on, so it is refused both ways.
E8M0_NAN = 255


def mxfp4_repackable(record) -> bool:
    """Whether a compressed-tensors record is MXFP4 that GGML's MXFP4 blocks hold as they
    are: format ``mxfp4-pack-quantized``, groups of 32, no zero point, no global scale.

    Args:
        record: A weight's record (see :func:`check_record`), from a file: any value.

    Returns:
        True when the weight converts by repacking.

    Example:
        >>> mxfp4_repackable({"format": "mxfp4-pack-quantized", "strategy": "group", "group_size": 32})
        True
    """
    return (isinstance(record, dict) and record.get("format") == "mxfp4-pack-quantized"
            and record.get("strategy") == "group" and record.get("group_size") == MXFP4_BLOCK
            and record.get("zero_point") is None and record.get("global_scale") is None)


def _u8(value) -> np.ndarray:
    data = value.data if isinstance(value, RawTensor) else np.asarray(value)
    return np.ascontiguousarray(data).reshape(-1).view(np.uint8)


def _refuse_nan_scale(name: str, exponents: np.ndarray, what: str) -> None:
    if exponents.size and int(exponents.max()) == E8M0_NAN:
        at = int(np.argmax(exponents == E8M0_NAN))
        raise LayoutError(f"tensor {name!r}: {what} {at} has the E8M0 exponent 255 (NaN in OCP MX), which "
                          "compressed-tensors reads as 2**128 and GGML as 2**127; it is not converted")


def ct_mxfp4_to_ggml(name: str, packed, scale, shape) -> np.ndarray:
    """GGML MXFP4 blocks (flat uint8, 17 bytes per 32 values) holding exactly the codes and
    exponents of a compressed-tensors MXFP4 weight: a bit repack, no rounding.

    Args:
        name: The weight's name (for errors).
        packed: Its ``weight_packed`` tensor, uint8 ``[rows, cols / 2]``.
        scale: Its ``weight_scale`` tensor, uint8 E8M0 exponents ``[rows, cols / 32]``.
        shape: The logical ``(rows, cols)`` (or ``(experts, rows, cols)``).

    Returns:
        ``rows * cols / 32 * 17`` bytes of ``block_mxfp4``.

    Raises:
        CorruptError: A tensor of the wrong size.
        LayoutError: An exponent of 255 (NaN in OCP MX; see :data:`E8M0_NAN`).

    Example:
        >>> import numpy as np
        >>> blocks = ct_mxfp4_to_ggml("w", np.full((1, 16), 0x21, np.uint8), np.uint8([[127]]), (1, 32))
        >>> blocks[:3].tolist()  # e, then qs[0] = values 0 and 16 (codes 1, 1), qs[1] = values 1 and 17 (2, 2)
        [127, 17, 34]
    """
    rows, cols = _count(shape[:-1]), shape[-1]  # experts' rows one after the other
    if cols % MXFP4_BLOCK:
        raise CorruptError(f"compressed-tensors MXFP4 weight {name!r} has {cols} columns, not whole groups of 32")
    nb = rows * cols // MXFP4_BLOCK
    codes, exps = _u8(packed), _u8(scale)
    if codes.size != nb * 16 or exps.size != nb:
        raise CorruptError(f"compressed-tensors MXFP4 weight {name!r}: {codes.size} packed bytes and {exps.size} "
                           f"scales, but a {list(shape)} weight has {nb * 16} and {nb}")
    _refuse_nan_scale(name, exps, "group")
    pairs = codes.reshape(nb, 16)
    values = np.empty((nb, MXFP4_BLOCK), np.uint8)  # one code a byte, in row order
    values[:, 0::2] = pairs & 0x0F
    values[:, 1::2] = pairs >> 4
    out = np.empty((nb, 17), np.uint8)
    out[:, 0] = exps
    np.bitwise_or(values[:, :16], values[:, 16:] << 4, out=out[:, 1:])
    return out.reshape(-1)


def ggml_mxfp4_to_ct(name: str, blocks, shape) -> tuple:
    """The compressed-tensors ``(weight_packed, weight_scale)`` of GGML MXFP4 blocks: the
    inverse of :func:`ct_mxfp4_to_ggml`.

    Args:
        name: The tensor's name (for errors).
        blocks: ``block_mxfp4`` bytes of a ``(rows, cols)`` tensor.
        shape: ``(rows, cols)`` (or with a leading experts dimension).

    Returns:
        uint8 arrays ``[rows, cols / 2]`` and ``[rows, cols / 32]`` (leading
        dimensions kept).

    Raises:
        CorruptError: ``blocks`` of the wrong size.
        LayoutError: A block with the exponent 255 (see :data:`E8M0_NAN`).

    Example:
        >>> import numpy as np
        >>> packed, scale = ggml_mxfp4_to_ct("w", np.uint8([127] + [0x11] * 16), (1, 32))
        >>> packed[0, :2].tolist(), scale.tolist()
        ([17, 17], [[127]])
    """
    rows, cols = _count(shape[:-1]), shape[-1]
    nb = rows * cols // MXFP4_BLOCK
    data = _u8(blocks)
    if cols % MXFP4_BLOCK or data.size != nb * 17:
        raise CorruptError(f"MXFP4 tensor {name!r}: {data.size} bytes are not the blocks of a {list(shape)} tensor")
    b = data.reshape(nb, 17)
    exps = b[:, 0]
    _refuse_nan_scale(name, exps, "block")
    qs = b[:, 1:]
    values = np.empty((nb, MXFP4_BLOCK), np.uint8)
    values[:, :16] = qs & 0x0F
    values[:, 16:] = qs >> 4
    packed = values[:, 0::2] | (values[:, 1::2] << 4)
    lead = tuple(shape[:-1])
    return packed.reshape(*lead, cols // 2), exps.reshape(*lead, cols // MXFP4_BLOCK).copy()


def mxfp4_quantization_config(modules) -> dict:
    """The ``quantization_config`` (config.json) of a checkpoint whose ``modules`` hold
    MXFP4 weights in compressed-tensors' ``mxfp4-pack-quantized`` format, as its
    ModelCompressor writes it for the MXFP4A16 preset.

    Args:
        modules: The module names (``M`` of ``M.weight_packed``); the targets, exactly.

    Returns:
        The JSON object.

    Example:
        >>> config = mxfp4_quantization_config(["model.layers.0.mlp.up_proj"])
        >>> config["format"], config["config_groups"]["group_0"]["targets"]
        ('mxfp4-pack-quantized', ['model.layers.0.mlp.up_proj'])
    """
    weights = {"dynamic": False, "group_size": MXFP4_BLOCK, "num_bits": 4, "scale_dtype": "torch.uint8",
               "strategy": "group", "symmetric": True, "type": "float"}
    fmt = "mxfp4-pack-quantized"
    return {"config_groups": {"group_0": {"format": fmt, "input_activations": None, "output_activations": None,
                                          "targets": sorted(modules), "weights": weights}},
            "format": fmt, "global_compression_ratio": None, "ignore": [], "kv_cache_scheme": None,
            "quant_method": "compressed-tensors", "quantization_status": "compressed", "sparsity_config": {}}
