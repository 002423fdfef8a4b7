"""aprfast: read and write .apr machine-learning model files at C speed.

The API mirrors safetensors: ``save_file``/``save`` write, ``load_file``/``load``
read everything, ``open`` gives lazy zero-copy access, ``Writer`` streams tensors one
at a time, ``inspect`` reads only the header, metadata and index.  Quantization is
explicit: ``quantize``/``dequantize``/``quantize_tensors`` run only when called.
"""

from . import _moved

_moved.install()  # old module paths (aprfast.reader, ...) answer with the moved modules

# First: aprfast._crc, ... become the compiled modules or their pure twins.  ``backend``
# is "c" or "python" (APRFAST_BACKEND; see aprfast._backend).  Nothing else may be
# imported before it: every module below takes the kernels it chose.
from ._backend import BACKEND as backend

# isort: split
from . import distributed  # aprfast.distributed.load_shard: tensor-parallel loading
from ._crc import crc32, crc32_combine
from ._optional import MissingDependencyError
from ._version import __version__
from .api import inspect, load, load_file, open, save, save_file
from .convert import convert
from .dtypes import DType
from .errors import (
    AprError,
    AprFileInUseError,
    AprFileNotFoundError,
    AprIOError,
    AprPermissionError,
    ChecksumError,
    CorruptError,
    DecryptError,
    FormatError,
    LayoutError,
    LicenseError,
    LimitError,
    ModelTypeMismatchError,
    SignatureError,
    TensorNotFoundError,
    UnknownDTypeError,
    ValidationError,
    VersionError,
)
from .files.reader import AprFile, QuantizedSlice, TensorSlice, aligned_empty
from .files.safe_open import safe_open
from .files.writer import Writer
from .layouts import LayoutChangeWarning
from .limits import Limits
from .numerics.precision import to_bfloat16, to_float16, to_float32
from .numerics.quantization import QuantizationReport, dequantize, quantize, quantize_tensors, register_quantizer
from .stream import stream
from .tensors import QuantizedTensor, RawTensor, TensorInfo

__all__ = [
    "__version__", "backend",
    "save_file", "save", "load_file", "load", "open", "inspect", "Writer", "safe_open", "stream",
    "convert", "edit",
    "quantize", "dequantize", "quantize_tensors", "register_quantizer", "QuantizationReport",
    "to_float16", "to_bfloat16", "to_float32",
    "AprFile", "TensorSlice", "QuantizedSlice", "TensorInfo", "RawTensor", "QuantizedTensor", "DType", "Limits",
    "crc32", "crc32_combine", "aligned_empty",
    "MissingDependencyError",
    "AprError", "FormatError", "CorruptError", "VersionError", "ChecksumError", "DecryptError",
    "SignatureError", "AprIOError", "AprFileNotFoundError", "AprPermissionError", "AprFileInUseError",
    "LimitError",
    "TensorNotFoundError", "UnknownDTypeError",
    "LayoutError", "ModelTypeMismatchError", "LicenseError", "ValidationError", "LayoutChangeWarning",
    "sign_model", "verify_model",
]

#: served on first use: aprfast.tools.model_signing loads the model-signing package only
#: when called, and even importing the tools layer is more than ``import aprfast`` needs
_LAZY = {"sign_model": "aprfast.tools.model_signing", "verify_model": "aprfast.tools.model_signing",
         "edit": "aprfast.tools.edit"}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'aprfast' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))
