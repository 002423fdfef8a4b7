"""Inline validation (seed 001 §10.10, §13.6): every tensor checked against the expected
statistics of §10.9 (:mod:`aprfast.numerics.expectations`) as it is written, before its bytes
reach the destination.

The statistics are :func:`aprfast.stats.tensor_stats` of the value being written (after
``precision=``/``quantize=``: an f32 value that overflows f16 is caught as Inf), one
pass in C with the GIL released.  A tensor that no rule names can only fail for NaN or
Inf: when :func:`aprfast.stats.known_finite` shows it holds neither without decoding it
(a GGML block tensor whose float16 scales are all finite, which bounds every value), its
verdict is "-" without statistics, the verdict they would give; anything else goes
through ``tensor_stats``, so every reported number is the one it computes.  A FAIL
verdict (NaN/Inf, a LayerNorm mean outside its acceptable range) is, by mode:

* ``"strict"``: :class:`TensorValidationError` naming the tensor and the numbers; the
  conversion aborts and leaves no destination (the writers are atomic);
* ``"relaxed"``, or ``"strict"`` with ``force=True`` (seed §10.10's override): a
  :class:`ValidationWarning` and the tensor is written;
* ``"off"``: nothing is computed.

WARN verdicts (std outside the expected range, "mean ~0.0") never stop a conversion and
raise no Python warning (real models often sit outside them): they are listed in the
report ``convert()`` returns, as are tensors without statistics (complex dtypes).
"""

from __future__ import annotations

import warnings

from ..errors import ValidationError
from ..numerics.expectations import check_value, expectation_for
from ..numerics.stats import known_finite

__all__ = ["MODES", "TensorValidationError", "ValidationWarning", "InlineValidator"]

MODES = ("strict", "relaxed", "off")


class TensorValidationError(ValidationError):
    """E009: a tensor's values contradict what its name says it is (seed 001 §10.9):
    NaN/Inf, or a LayerNorm mean outside its acceptable range.  ``tensor``, ``role``,
    ``reasons`` and ``stats`` (a dict of the numbers) say which and why.  ``apr
    convert``/``import``/``export`` exit 5 on it.

    A :class:`~aprfast.errors.ValidationError` (E009, a ``ValueError``), not a
    :class:`~aprfast.errors.CorruptError`: the file read was intact.  Before issue 28 it
    carried E002, the code of corrupted data; ``except TensorValidationError`` (and
    ``except ValueError``) catch it as before.

    Raised by :func:`aprfast.convert.convert` with ``validate="strict"`` (the default)
    before anything is written; ``validate="relaxed"`` or ``force=True`` write the tensor
    with a :class:`ValidationWarning` instead.  docs/guide/converting.md.

    Attributes:
        tensor: The tensor's name.
        role: What its name says it is ("layernorm weight", ...), or None.
        reasons: Why it fails, a tuple of str.
        stats: Its statistics (:meth:`aprfast.stats.TensorStats.as_dict`).

    Examples:
        >>> import numpy as np, aprfast
        >>> from aprfast.convert import TensorValidationError, convert
        >>> aprfast.save_file({"encoder.layer_norm.weight": np.float32([1, np.nan])}, "m.apr")
        >>> try:
        ...     convert("m.apr", "m.safetensors")
        ... except TensorValidationError as exc:
        ...     print(exc.code, exc.tensor, exc.role, exc.reasons)
        E009 encoder.layer_norm.weight layernorm weight ('1 NaN, 0 Inf in 2 values',)
    """

    def __init__(self, message: str, *, path=None, tensor=None, role=None, reasons=(), stats=None):
        super().__init__(message, path=path)
        self.tensor, self.role, self.reasons, self.stats = tensor, role, tuple(reasons), stats

    def __reduce__(self):
        return (_rebuild, (self.message, self.path, self.tensor, self.role, self.reasons, self.stats))


def _rebuild(message, path, tensor, role, reasons, stats):
    return TensorValidationError(message, path=path, tensor=tensor, role=role, reasons=reasons, stats=stats)


class ValidationWarning(UserWarning):
    """A tensor that fails seed 001 §10.9 written anyway (``validate="relaxed"`` or
    ``force=True``)."""


def check_mode(validate) -> str:
    if validate not in MODES:
        raise ValueError(f"validate={validate!r}: one of 'strict', 'relaxed', 'off'")
    return validate


class InlineValidator:
    """Checks tensors one at a time and keeps the report.  ``check(name, value)``
    returns the value (so it sits in the write path) or raises."""

    def __init__(self, mode: str, *, force: bool = False, destination=None, threads: int = 0):
        self.mode = check_mode(mode)
        self.abort = mode == "strict" and not force
        self.destination = None if destination is None else str(destination)
        self.threads = threads
        self.checked = 0
        self.failed, self.warned, self.skipped = [], [], []

    @property
    def active(self) -> bool:
        return self.mode != "off"

    def check(self, name: str, value):
        if not self.active:
            return value
        if expectation_for(name) is None and known_finite(value):
            # No rule names it, so only NaN or Inf could fail it, and it has none: the
            # verdict tensor_stats would lead to ("-"), without decoding every block.
            self.checked += 1
            return value
        stats, verdict = check_value(name, value, threads=self.threads)
        if stats is None:
            self.skipped.append(name)
            return value
        self.checked += 1
        if verdict.status == "WARN":
            self.warned.append({"name": name, "role": verdict.role, "reasons": list(verdict.reasons),
                                "rules": list(verdict.rules)})
        elif verdict.status == "FAIL":
            self._fail(name, stats, verdict)
        return value

    def _fail(self, name, stats, verdict):
        role = f" ({verdict.role})" if verdict.role else ""
        numbers = (f"mean {_num(stats.mean)}, std {_num(stats.std)}, min {_num(stats.min)}, max {_num(stats.max)}, "
                   f"{stats.nan_count} NaN, {stats.inf_count} Inf")
        what = f"tensor {name!r}{role} fails the expected statistics (seed 001 §10.9): {'; '.join(verdict.reasons)}"
        if self.abort:
            raise TensorValidationError(
                f"{what} [{numbers}]; conversion aborted, nothing written (validate='relaxed' or force=True "
                "writes it anyway)", path=self.destination, tensor=name, role=verdict.role,
                reasons=verdict.reasons, stats=stats.as_dict())
        self.failed.append({"name": name, "role": verdict.role, "reasons": list(verdict.reasons),
                            "rules": list(verdict.rules)})
        warnings.warn(f"{what} [{numbers}]; written anyway (validate={self.mode!r}"
                      + (", force=True)" if self.mode == "strict" else ")"), ValidationWarning, stacklevel=4)

    def report(self) -> dict:
        """``{"mode", "checked", "failed", "warned", "skipped"}`` (failed: written anyway)."""
        return {"mode": self.mode, "checked": self.checked, "failed": self.failed, "warned": self.warned,
                "skipped": self.skipped}


def _num(value) -> str:
    return "-" if value is None else f"{value:.4g}"
