"""The quality gate of seed 001 §4.8.4 for lossy conversions (``quantize=``,
``precision=``, ``prune=``, ``lowrank=``): each changed tensor's drift from its source,
measured while the source values are in memory (no second read).

Per tensor: the relative L2 distance ``||W - W'|| / ||W||`` and the largest ``|W - W'|``
(computed as ``aprfast.tools.diff`` computes them: float64, chunk by chunk, the statistics
engine over the difference), ``W'`` being the values written, decoded (a factored
tensor's ``A @ B``).  A zero source has drift 0 when the output is zero too, else
infinite; a NaN/Inf on one side only is infinite drift.  Tensors the conversion leaves
alone, or only widens (f16/bf16 -> f32/f64, dequantizing to f32), are not measured.

A drift above ``max_drift`` (default :data:`DEFAULT_MAX_DRIFT`, the seed's ``--max-drift
0.1``) stops the conversion at that tensor with :class:`QualityGateError`, nothing
written; with ``force=True`` it is a :class:`QualityGateWarning` and the tensor is
written.  ``max_drift=None`` measures and reports without a limit.
"""

from __future__ import annotations

import math
import warnings

import numpy as np

from ..numerics.drift import compare_values
from .validation import TensorValidationError, ValidationWarning

__all__ = ["DEFAULT_MAX_DRIFT", "QualityGate", "QualityGateError", "QualityGateWarning"]

#: Seed 001 §4.8.4's example gate (``--max-drift 0.1``), as a relative L2 distance.
DEFAULT_MAX_DRIFT = 0.1
#: Elements compared per step: the float64 temporaries stay near 4 MiB (convert's bound
#: is a few tensors' worth plus a constant).
_CHUNK = 1 << 16
_LOSSLESS = {("F16", "F32"), ("F16", "F64"), ("BF16", "F32"), ("BF16", "F64"), ("F32", "F64")}


class QualityGateError(TensorValidationError):
    """E009 (a :class:`TensorValidationError`, so ``apr convert`` exits 5): a tensor's
    drift from its source exceeds ``max_drift``.  ``tensor``, ``drift`` (relative L2),
    ``max_abs_delta`` and ``max_drift`` say which and by how much."""

    def __init__(self, message, *, path=None, tensor=None, drift=None, max_abs_delta=None, max_drift=None):
        super().__init__(message, path=path, tensor=tensor, reasons=(f"relative L2 {drift:.4g} > {max_drift:g}",),
                         stats={"relative_l2": drift, "max_abs_delta": max_abs_delta})
        self.drift, self.max_abs_delta, self.max_drift = drift, max_abs_delta, max_drift

    def __reduce__(self):
        return (_rebuild, (self.message, self.path, self.tensor, self.drift, self.max_abs_delta, self.max_drift))


def _rebuild(message, path, tensor, drift, max_abs_delta, max_drift):
    return QualityGateError(message, path=path, tensor=tensor, drift=drift, max_abs_delta=max_abs_delta,
                            max_drift=max_drift)


class QualityGateWarning(ValidationWarning):
    """A tensor over ``max_drift`` written anyway (``force=True``)."""


def lossy(src, out) -> bool:
    """Whether converting dtype ``src`` to ``out`` (``aprfast.dtypes`` objects) can
    change a value: not for the same dtype, a widening, or dequantizing to F32."""
    if src is out or (src.name, out.name) in _LOSSLESS:
        return False
    return not (src.packed and out.name == "F32")


class QualityGate:
    """Measures tensors one at a time and keeps the report."""

    def __init__(self, max_drift=DEFAULT_MAX_DRIFT, *, force: bool = False, destination=None, active: bool = True):
        if max_drift is not None and (isinstance(max_drift, bool) or not isinstance(max_drift, (int, float))
                                      or not max_drift >= 0):
            raise ValueError(f"max_drift={max_drift!r}: a relative L2 distance >= 0, or None for no limit")
        self.max_drift = None if max_drift is None else float(max_drift)
        self.force, self.active = force, active
        self.destination = None if destination is None else str(destination)
        self.tensors, self.failed = [], []

    def measure(self, name: str, source: np.ndarray, output: np.ndarray, op: str) -> dict:
        """Record ``name``'s drift (``source``/``output``: float arrays of one shape);
        raise QualityGateError over the limit unless forced."""
        r = compare_values(np.asarray(source).reshape(-1), np.asarray(output).reshape(-1), 0, _CHUNK)
        if r["nonfinite"]:
            drift = math.inf
        elif r["norm_a"] == 0.0:
            drift = 0.0 if r["l2"] == 0.0 else math.inf
        else:
            drift = r["l2"] / r["norm_a"]
        entry = {"name": name, "op": op, "relative_l2": drift, "max_abs_delta": r["max_abs"], "l2": r["l2"]}
        self.tensors.append(entry)
        if self.max_drift is not None and drift > self.max_drift:
            self._fail(entry)
        return entry

    def _fail(self, entry):
        what = (f"quality gate (seed 001 §4.8.4): tensor {entry['name']!r} ({entry['op']}) drifts "
                f"{entry['relative_l2']:.4g} relative L2 from its source (max {self.max_drift:g}), "
                f"max |delta| {entry['max_abs_delta']:.4g}")
        if not self.force:
            raise QualityGateError(f"{what}; conversion aborted, nothing written (max_drift= raises the limit, "
                                   "force=True writes it anyway)", path=self.destination, tensor=entry["name"],
                                   drift=entry["relative_l2"], max_abs_delta=entry["max_abs_delta"],
                                   max_drift=self.max_drift)
        self.failed.append(entry["name"])
        warnings.warn(f"{what}; written anyway (force=True)", QualityGateWarning, stacklevel=4)

    def report(self) -> dict | None:
        """``{"max_drift", "measured", "worst", "failed", "tensors"}``, or None when the
        conversion is lossless (nothing to gate)."""
        if not self.active:
            return None
        worst = max(self.tensors, key=lambda t: t["relative_l2"], default=None)
        return {"max_drift": self.max_drift, "measured": len(self.tensors), "worst": worst, "failed": self.failed,
                "tensors": self.tensors}
