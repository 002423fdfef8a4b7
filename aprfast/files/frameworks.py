"""The array conversions behind ``aprfast.numpy``, ``aprfast.torch``, ``aprfast.jax``
and ``safe_open`` (:mod:`aprfast.files.safe_open`): NumPy arrays and aprfast's packed
tensors to and from torch and JAX, with the checks safetensors users already rely on.
Frameworks are imported only when asked for.
"""

from __future__ import annotations

import numpy as np

from ..dtypes import DTYPES, SUBBYTE_FLOATS, subbyte_array
from ..errors import AprError, LayoutError
from ..tensors import QuantizedTensor, RawTensor

__all__ = ["FRAMEWORKS", "TORCH_VIEWS", "framework_name", "to_framework",
           "torch_dtype", "torch_meta", "from_torch", "check_metadata", "check_names", "UsageError",
           "SliceIndexError", "subbyte_arrays"]


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
        return _subbyte_array(array)
    if framework == "torch" and isinstance(array, QuantizedTensor) and array.dtype.name == "F4_E2M1":
        return _fp4_to_torch(name, array, device)
    if isinstance(array, (QuantizedTensor, RawTensor)):
        raise LayoutError(f"tensor {name!r} is {array!r}; {framework} has no dtype for it "
                          "(read it with aprfast.open and dequantize it first)")
    if framework == "torch":
        return _to_torch(array, dtype, device)
    return _to_jax(array, dtype, device)


def _subbyte_array(value):
    """FP4/FP6 packed tensors as ml_dtypes' one-value-a-byte arrays (when ml_dtypes has
    the type); anything else as it is."""
    if isinstance(value, QuantizedTensor) and value.dtype.name in SUBBYTE_FLOATS:
        unpacked = subbyte_array(value.dtype, value.data, value.shape)
        if unpacked is not None:
            return unpacked
    return value


def subbyte_arrays(tensors: dict) -> dict:
    """``tensors`` with each FP4/FP6 QuantizedTensor as ml_dtypes' array of its values
    (``aprfast.numpy``'s loads; without ml_dtypes they stay QuantizedTensors)."""
    return {name: _subbyte_array(value) for name, value in tensors.items()}


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

    from ..tensors import RawTensor

    if not isinstance(tensor, torch.Tensor):
        raise ValueError(f"tensor {name!r} is {type(tensor).__name__}, not a torch.Tensor")
    if tensor.layout != torch.strided:
        raise ValueError(f"tensor {name!r} is a {tensor.layout} tensor; save its .to_dense()")
    tensor = tensor.detach().to("cpu").contiguous()
    if tensor.dtype == getattr(torch, "float4_e2m1fn_x2", None):  # pairs: the logical last dim doubles
        from ..tensors import QuantizedTensor

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
