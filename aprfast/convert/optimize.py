"""Size reduction on the way through :func:`aprfast.convert` (seed 001 §4.8.1): magnitude
pruning and low-rank (SVD) factorisation, one tensor at a time.

**Which tensors.**  ``select`` (a glob or a list of globs matched with ``fnmatchcase``
against the output names, or ``callable(name, shape) -> bool``) picks them; without it
the default is every float tensor (F32, F16, BF16, F64) of two or more dimensions whose
lower-cased name matches none of :data:`DEFAULT_EXCLUDE` (norms, biases, embeddings).
Only float tensors are ever changed (packed quantized ones are skipped, whatever the
selection); low-rank takes 2-D tensors only.  A tensor both would change is factored
and not pruned (reported as skipped).

**Pruning** (``prune={"sparsity": s, "structure": "unstructured" | "row", "method":
"magnitude", "select": ...}``): ``k = floor(s * count + 0.5)`` elements (unstructured)
or ``floor(s * rows + 0.5)`` rows (``row``: slices along the first axis, the L2 norm of
each computed in float64) with the smallest magnitude are set to zero.  Ties are exact
and deterministic: everything strictly below the k-th smallest magnitude is zeroed,
then the elements (rows) equal to it in increasing index order until exactly k are.
NaN is never the smallest (NumPy orders it last).  Values keep their dtype, so a pruned
f16/bf16 tensor differs from its source only where it was zeroed.

**Low-rank** (``lowrank={"rank": r, "select": ...}``): a 2-D ``W`` (m x n) becomes
``<name>.lowrank_a`` (m x r) and ``<name>.lowrank_b`` (r x n) with ``W ≈ A @ B``: the
truncated SVD ``U S Vt`` (``numpy.linalg.svd``, float64 for F64 sources, float32
otherwise) with the singular values split as ``sqrt(S)`` into both factors (balanced
scales, so a ``quantize=`` of the factors treats both alike).  Each singular vector's
sign is fixed (the largest-magnitude entry of each column of U positive) so the factors
do not depend on the LAPACK build.  A tensor is skipped, and the report says why, when
``r * (m + n) >= m * n`` (two factors would store at least as many elements as ``W``;
this also covers ``r >= min(m, n)``).  The output metadata records every factored
tensor under :data:`LOWRANK_KEY` (see :func:`reconstruct`).
"""

from __future__ import annotations

import fnmatch

import numpy as np

from ..numerics.drift import numeric_values

__all__ = ["DEFAULT_EXCLUDE", "LOWRANK_KEY", "PRUNE_KEY", "SUFFIX_A", "SUFFIX_B", "Optimizer", "prune_values",
           "factor", "reconstruct"]

#: Names (lower-cased, fnmatch) the default selection leaves alone.
DEFAULT_EXCLUDE = ("*norm*", "*.bias", "*_bias", "bias", "*embed*", "*embd*", "*wte*", "*wpe*")
#: Output metadata: ``{W: {"a": W.lowrank_a, "b": W.lowrank_b, "rank", "shape", "dtype", "scaling"}}``.
LOWRANK_KEY = "aprfast.lowrank"
#: Output metadata: ``{"method", "structure", "sparsity", "tensors": [names]}``.
PRUNE_KEY = "aprfast.prune"
SUFFIX_A, SUFFIX_B = ".lowrank_a", ".lowrank_b"
STRUCTURES = ("unstructured", "row")
_FLOATS = {"F32", "F16", "BF16", "F64"}


# --- the math ------------------------------------------------------------------------
def _smallest(magnitudes: np.ndarray, k: int) -> np.ndarray:
    """Flat indices of the ``k`` smallest ``magnitudes``: all strictly below the k-th
    smallest, then those equal to it by increasing index (exact, deterministic ties)."""
    if k <= 0:
        return np.empty(0, np.intp)
    if k >= magnitudes.size:
        return np.arange(magnitudes.size)
    kth = np.partition(magnitudes, k - 1)[k - 1]
    below = np.flatnonzero(magnitudes < kth)
    equal = np.flatnonzero(magnitudes == kth)[:k - below.size]
    return np.sort(np.concatenate([below, equal]))


def _count(fraction: float, n: int) -> int:
    return min(n, int(np.floor(fraction * n + 0.5)))


def prune_values(values: np.ndarray, sparsity: float, structure: str = "unstructured") -> tuple:
    """(a pruned copy of ``values``, elements zeroed by the pruning): see the module's
    docstring for what is zeroed and how ties break."""
    out = np.array(values, copy=True, order="C")
    flat = out.reshape(-1)
    if structure == "row":
        rows = flat.reshape(out.shape[0], -1) if out.ndim else flat.reshape(1, -1)
        wide = rows.astype(np.float64)
        norms = np.sqrt(np.einsum("ij,ij->i", wide, wide))
        chosen = _smallest(norms, _count(sparsity, rows.shape[0]))
        rows[chosen] = 0
        return out, int(chosen.size) * rows.shape[1]
    chosen = _smallest(np.abs(flat), _count(sparsity, flat.size))
    flat[chosen] = 0
    return out, int(chosen.size)


def factor(values: np.ndarray, rank: int) -> tuple:
    """``(A, B)``, ``A @ B`` the best rank-``rank`` approximation of the 2-D ``values``
    in the Frobenius norm; singular values split as sqrt into both factors."""
    work = np.asarray(values, np.float64 if values.dtype == np.float64 else np.float32)
    u, s, vt = np.linalg.svd(work, full_matrices=False)
    u, s, vt = u[:, :rank], s[:rank], vt[:rank]
    # sign convention: each column of U has its largest-magnitude entry positive
    flip = np.sign(u[np.argmax(np.abs(u), axis=0), np.arange(u.shape[1])])
    flip[flip == 0] = 1
    root = np.sqrt(s) * flip
    a = np.ascontiguousarray(u * root)
    b = np.ascontiguousarray((np.sqrt(s)[:, None]) * (vt * flip[:, None]))
    return a.astype(work.dtype, copy=False), b.astype(work.dtype, copy=False)


def reconstruct(source, name):
    """``W ≈ A @ B`` of a factored tensor: ``reconstruct(a, b)`` for the two factors'
    arrays, or ``reconstruct(model, name)`` with ``model`` an open ``.apr``
    (``aprfast.open``) or its path and ``name`` the original tensor's name (recorded
    under :data:`LOWRANK_KEY`).  Computed in float32 (float64 when a factor is)."""
    if not isinstance(name, str):
        return np.matmul(_widened(np.asarray(source)), _widened(np.asarray(name)))
    if isinstance(source, (str, bytes)) or hasattr(source, "__fspath__"):
        from ..api import open as _open

        with _open(source) as handle:
            return reconstruct(handle, name)
    metadata = source.metadata() if callable(source.metadata) else source.metadata
    record = _lowrank_record(metadata, name)
    return reconstruct(_decoded(source.get_tensor(record["a"])), _decoded(source.get_tensor(record["b"])))


def _lowrank_record(metadata, name: str) -> dict:
    from ..errors import TensorNotFoundError

    records = (metadata or {}).get(LOWRANK_KEY) or {}
    if isinstance(records, str):  # a format whose metadata values are strings (GGUF) keeps it as JSON
        import json

        records = json.loads(records)
    if name not in records:
        known = ", ".join(sorted(records)[:5]) or "none"
        raise TensorNotFoundError(f"{name!r} is not a factored tensor (metadata {LOWRANK_KEY!r} names: {known})")
    return records[name]


def _decoded(value) -> np.ndarray:
    """A factor as read (quantized blocks and bf16 bits decoded)."""
    if isinstance(value, np.ndarray):
        return value
    return numeric_values(value).reshape(value.shape)


def _widened(a: np.ndarray) -> np.ndarray:
    return a if a.dtype == np.float64 else a.astype(np.float32, copy=False)


# --- selection and options --------------------------------------------------------------
def _selector(select, *, ndims):
    """``(name, shape) -> bool`` from ``select`` (None: the default rule)."""
    if select is None:
        def default(name, shape):
            low = name.lower()
            return ndims(len(shape)) and len(shape) >= 2 and \
                not any(fnmatch.fnmatchcase(low, p) for p in DEFAULT_EXCLUDE)
        return default
    if callable(select):
        return lambda name, shape: ndims(len(shape)) and bool(select(name, tuple(shape)))
    patterns = (select,) if isinstance(select, str) else tuple(select)
    if not patterns or not all(isinstance(p, str) for p in patterns):
        raise TypeError(f"select= takes a glob, a list of globs or a callable, not {select!r}")
    return lambda name, shape: ndims(len(shape)) and any(fnmatch.fnmatchcase(name, p) for p in patterns)


def _prune_options(prune) -> dict | None:
    if prune is None:
        return None
    if isinstance(prune, (int, float)) and not isinstance(prune, bool):
        prune = {"sparsity": prune}
    if not isinstance(prune, dict):
        raise TypeError(f"prune= takes a sparsity or a dict, not {type(prune).__name__}")
    unknown = set(prune) - {"method", "sparsity", "structure", "select"}
    if unknown:
        raise ValueError(f"prune=: unknown key(s) {', '.join(sorted(unknown))}; keys: method, sparsity, "
                         "structure, select")
    method = prune.get("method", "magnitude")
    if method != "magnitude":
        raise ValueError(f"prune method {method!r}: only 'magnitude'")
    sparsity = prune.get("sparsity")
    if isinstance(sparsity, bool) or not isinstance(sparsity, (int, float)) or not 0.0 <= sparsity <= 1.0:
        raise ValueError(f"prune sparsity {sparsity!r}: a fraction in [0, 1]")
    structure = prune.get("structure", "unstructured")
    if structure not in STRUCTURES:
        raise ValueError(f"prune structure {structure!r}: one of {', '.join(STRUCTURES)}")
    return {"method": method, "sparsity": float(sparsity), "structure": structure,
            "select": _selector(prune.get("select"), ndims=lambda d: d >= 1)}


def _lowrank_options(lowrank) -> dict | None:
    if lowrank is None:
        return None
    if isinstance(lowrank, int) and not isinstance(lowrank, bool):
        lowrank = {"rank": lowrank}
    if not isinstance(lowrank, dict):
        raise TypeError(f"lowrank= takes a rank or a dict, not {type(lowrank).__name__}")
    unknown = set(lowrank) - {"rank", "select", "method"}
    if unknown:
        raise ValueError(f"lowrank=: unknown key(s) {', '.join(sorted(unknown))}; keys: rank, select, method")
    if lowrank.get("method", "svd") != "svd":
        raise ValueError(f"lowrank method {lowrank['method']!r}: only 'svd'")
    rank = lowrank.get("rank")
    if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) or rank < 1:
        raise ValueError(f"lowrank rank {rank!r}: a positive integer")
    return {"rank": int(rank), "select": _selector(lowrank.get("select"), ndims=lambda d: d == 2)}


# --- the plan and the per-tensor step -------------------------------------------------
class Optimizer:
    """What ``prune=``/``lowrank=`` do to each tensor, decided from names, dtypes and
    shapes before any data is read, and the report of what they did."""

    def __init__(self, prune=None, lowrank=None):
        self.prune = _prune_options(prune)
        self.lowrank = _lowrank_options(lowrank)
        self.pruned, self.factored, self.skipped, self.ops = {}, {}, [], {}
        self.report_pruned = []

    @property
    def active(self) -> bool:
        return self.prune is not None or self.lowrank is not None

    def decide(self, source_name: str, name: str, dtype_name: str, shape) -> str | None:
        """"lowrank", "prune" or None for the tensor read as ``source_name`` and written
        as ``name``; remembered for :meth:`op`."""
        op = self._decide(name, dtype_name, tuple(shape))
        if op is not None:
            self.ops[source_name] = (op, name)
        return op

    def op(self, source_name: str) -> tuple:
        """``(op, output name)`` decided for a source tensor, or ``(None, None)``."""
        return self.ops.get(source_name, (None, None))

    def _decide(self, name: str, dtype_name: str, shape: tuple) -> str | None:
        want_lr = self.lowrank is not None and self.lowrank["select"](name, shape)
        want_pr = self.prune is not None and self.prune["select"](name, shape)
        if not (want_lr or want_pr):
            return None
        if dtype_name not in _FLOATS or not int(np.prod(shape, dtype=np.int64)):
            self.skipped.append({"name": name, "op": "lowrank" if want_lr else "prune",
                                 "reason": f"{dtype_name} tensor (only float tensors are changed)"
                                 if dtype_name not in _FLOATS else "empty tensor"})
            return None
        if want_lr:
            m, n = shape
            r = self.lowrank["rank"]
            if r * (m + n) >= m * n:
                self.skipped.append({"name": name, "op": "lowrank", "reason": f"rank {r} stores {r * (m + n)} "
                                     f"elements in two factors, {m}x{n} stores {m * n}: no saving"})
            else:
                self.factored[name] = {"a": name + SUFFIX_A, "b": name + SUFFIX_B, "rank": r, "shape": [m, n],
                                       "dtype": dtype_name, "scaling": "sqrt"}
                if want_pr:
                    self.skipped.append({"name": name, "op": "prune", "reason": "factored by lowrank instead"})
                return "lowrank"
        if want_pr:
            self.pruned[name] = None
            return "prune"
        return None

    def metadata(self) -> dict:
        """What the output's metadata records (known before any tensor is read)."""
        out = {}
        if self.factored:
            out[LOWRANK_KEY] = {k: dict(v) for k, v in self.factored.items()}
        if self.pruned:
            p = self.prune
            out[PRUNE_KEY] = {"method": p["method"], "sparsity": p["sparsity"], "structure": p["structure"],
                              "tensors": list(self.pruned)}
        return out

    def apply(self, op: str, name: str, values: np.ndarray) -> list:
        """The value(s) ``op`` makes of a tensor's float ``values``: ``[pruned]`` or
        ``[A, B]``."""
        if op == "prune":
            pruned, zeroed = prune_values(values, self.prune["sparsity"], self.prune["structure"])
            zeros = int(values.size - np.count_nonzero(pruned))
            self.report_pruned.append({"name": name, "zeroed": zeroed, "zeros": zeros,
                                       "sparsity": zeros / values.size})
            return [pruned]
        return list(factor(values, self.factored[name]["rank"]))

    def report(self) -> dict:
        """``{"prune": {...} | None, "lowrank": {...} | None}``."""
        out = {"prune": None, "lowrank": None}
        if self.prune is not None:
            out["prune"] = {"method": self.prune["method"], "sparsity": self.prune["sparsity"],
                            "structure": self.prune["structure"], "tensors": self.report_pruned,
                            "skipped": [s for s in self.skipped if s["op"] == "prune"]}
        if self.lowrank is not None:
            out["lowrank"] = {"rank": self.lowrank["rank"], "tensors": [dict(v, name=k) for k, v in
                                                                       self.factored.items()],
                              "skipped": [s for s in self.skipped if s["op"] == "lowrank"]}
        return out
