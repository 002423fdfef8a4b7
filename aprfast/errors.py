"""Typed errors with the seed's codes (APR spec 2.0 §7).

Every error aprfast raises on bad input is an :class:`AprError` carrying one of the
codes E001-E008 of the spec, or E009 (:class:`ValidationError`: an intact file whose
contents break a validation rule, which the spec's table has no code for).  Each
subclass also inherits the builtin a caller would already catch (``ValueError`` for
malformed files, ``KeyError`` for a missing tensor, ``OSError`` for I/O), so code
written for safetensors or numpy keeps working.
"""

from __future__ import annotations

__all__ = [
    "AprError",
    "FormatError",
    "CorruptError",
    "VersionError",
    "ChecksumError",
    "DecryptError",
    "SignatureError",
    "AprIOError",
    "AprFileInUseError",
    "LimitError",
    "TensorNotFoundError",
    "UnknownDTypeError",
    "LayoutError",
    "ModelTypeMismatchError",
    "LicenseError",
    "ValidationError",
    "CODES",
]

#: code -> category: the table of APR spec 2.0 §7 (E001-E008), then aprfast's E009.
#: The spec's table has no code for "the bytes are intact but the values break a rule"
#: (NaN weights, a drift past the quality gate): filed under E002 they read as
#: "Corrupted data" (issue 28 item 4), so they get their own code; the spec's exit code
#: for them, 5 "Validation failed", was always separate from corruption's 4.
CODES = {
    "E001": "FORMAT",
    "E002": "CORRUPT",
    "E003": "VERSION",
    "E004": "CHECKSUM",
    "E005": "DECRYPT",
    "E006": "SIGNATURE",
    "E007": "IO",
    "E008": "MEMORY",
    "E009": "VALIDATION",
}


class AprError(Exception):
    """Base of every aprfast error; ``code`` is one of E001-E009."""

    code = "E001"

    def __init__(self, message: str, *, path=None):
        self.message = message
        self.path = None if path is None else str(path)
        where = f"{self.path}: " if self.path else ""
        super().__init__(f"[{self.code}] {where}{message}")

    @property
    def category(self) -> str:
        return CODES[self.code]

    def __reduce__(self):
        # Keep the keyword-only ``path`` when errors cross process boundaries.
        return (_rebuild_error, (type(self), self.message, self.path))

    def __str__(self) -> str:  # KeyError would otherwise quote the message
        return self.args[0] if self.args else ""


def _rebuild_error(cls, message, path):
    return cls(message, path=path)


class FormatError(AprError, ValueError):
    """E001: the bytes are not a file of a layout aprfast knows."""

    code = "E001"


class CorruptError(AprError, ValueError):
    """E002: a known layout whose sizes, offsets or contents contradict each other."""

    code = "E002"


class VersionError(AprError, ValueError):
    """E003: a layout version or feature this build does not read."""

    code = "E003"


class ChecksumError(CorruptError):
    """E004: a stored CRC32 does not match the bytes it covers."""

    code = "E004"


class ValidationError(AprError, ValueError):
    """E009: the file is intact (it parses, its checksums match) but its contents break
    a validation rule: a tensor with NaN/Inf or statistics its role rules out, a lossy
    conversion drifting past its quality gate (seed 001 §10.9, §4.8.4).

    Not a :class:`CorruptError`: corruption means the bytes were damaged (fetch the file
    again), a validation failure means the values are what the writer wrote and a rule
    refuses them (fix the model, relax the rule, or ``force=True``).  ``except
    ValueError`` catches both.  ``apr`` prints ``validation failed: [E009] ...`` and
    exits 5; corruption is exit 4 (exit 5 when a whole-file CRC check finds it, E004).
    Subclasses: :class:`aprfast.convert.TensorValidationError` (``convert(...,
    validate="strict")``) and :class:`aprfast.convert.gate.QualityGateError`.

    Examples:
        >>> import numpy as np, aprfast
        >>> aprfast.save_file({"encoder.layer_norm.weight": np.float32([1, np.nan])}, "nan.apr")
        >>> try:
        ...     aprfast.convert("nan.apr", "nan.safetensors")
        ... except aprfast.ValidationError as exc:
        ...     print(exc.code, exc.category, isinstance(exc, aprfast.CorruptError))
        E009 VALIDATION False
    """

    code = "E009"


class DecryptError(AprError, ValueError):
    """E005: decryption failed (wrong key, wrong password or tampering)."""

    code = "E005"


class SignatureError(AprError, ValueError):
    """E006: a signature is missing, untrusted or does not verify."""

    code = "E006"


class AprIOError(AprError, OSError):
    """E007: the operating system refused a read or write."""

    code = "E007"


class AprFileNotFoundError(AprIOError, FileNotFoundError):
    """E007 for a path that does not exist: ``except FileNotFoundError`` catches it, as
    it catches safetensors' and open()'s."""


class AprPermissionError(AprIOError, PermissionError):
    """E007 for a path the process may not open: also a ``PermissionError``."""


class AprFileInUseError(AprPermissionError):
    """E007: a save cannot replace its destination because a handle has it open or
    memory-mapped (Windows refuses such a rename; POSIX systems allow it)."""


def os_error(exc: OSError, message: str, *, path=None) -> AprIOError:
    """The AprIOError subclass matching ``exc`` (missing, forbidden, other), carrying
    its ``errno`` and ``filename`` like the builtin would."""
    cls = (AprFileNotFoundError if isinstance(exc, FileNotFoundError)
           else AprPermissionError if isinstance(exc, PermissionError) else AprIOError)
    error = cls(message, path=path)
    error.errno, error.strerror, error.filename = exc.errno, exc.strerror, exc.filename
    return error


class LimitError(AprError, ValueError):
    """E008: honouring the file would exceed a limit from :mod:`aprfast.limits`."""

    code = "E008"


class TensorNotFoundError(AprError, KeyError):
    """E001: the file has no tensor of that name."""

    code = "E001"


class UnknownDTypeError(FormatError):
    """E001: a dtype id that the layout does not define."""


class LayoutError(AprError, ValueError):
    """E001: a write request the chosen layout cannot represent."""

    code = "E001"


class ModelTypeMismatchError(FormatError):
    """E001: the file holds another model type than the caller expected (Andon
    ModelTypeMismatch, v1 containers)."""


class LicenseError(AprError, PermissionError):
    """E006: the license refuses this use of the model (expired, too many seats or
    inferences, another licensee).

    The seed's error table has no license code.  E006 (SIGNATURE) is the family of
    "provenance or authorization refused", and seed 002 §9.1 binds the license to the
    signature, so a refusal shares its code.  It is deliberately *not* a
    :class:`~aprfast.errors.SignatureError`: ``except SignatureError`` around a
    signature check must not swallow an expired license.  The builtin is
    ``PermissionError`` ("not allowed to do this"), which is an ``OSError``: code that
    turns every ``OSError`` into an I/O error should let ``LicenseError`` through.
    """

    code = "E006"
