"""Merge models tensor by tensor (seed 001 §4.9, ``apr merge``).

:func:`merge_models` opens every input lazily, and for each tensor reads that tensor
from every model, combines it in float64 and writes it to a planned ``.apr`` Writer
before the next is read: memory holds one tensor per input, whatever the models' sizes.

Methods, per float tensor (the same names and shapes in every model are required):

* ``average``: the element-wise mean.  ``[1.0]`` and ``[3.0]`` give ``[2.0]`` (QA #58).
* ``weighted``: ``sum(w_i * x_i) / sum(w_i)`` (weights normalised to sum to 1).
* ``slerp``: spherical linear interpolation of exactly two models at ``t`` (0 gives
  the first, 1 the second) along the great circle between the flattened tensors,
  falling back to linear interpolation when they are (anti)parallel.
* ``ties`` (Yadav et al., 2023, "TIES-Merging: Resolving Interference When Merging
  Models", NeurIPS 2023): task vectors ``tau_i = x_i - base``; (1) *trim*: keep in
  each the ``density`` fraction of entries largest in magnitude, zero the rest;
  (2) *elect*: the sign of each entry is the sign of the sum of the trimmed values
  (the sign carrying the larger total magnitude); (3) *disjoint merge*: each entry is
  the mean of the trimmed values that are non-zero and agree with the elected sign;
  result ``base + lambda * merged``.  The paper trims over the whole task vector; a
  streaming merge sees one tensor at a time, so trimming is per tensor (as mergekit does).
* ``dare`` (Yu et al., 2023, "Language Models are Super Mario: Absorbing Abilities
  from Homologous Models as a Free Lunch", arXiv:2311.03099): each delta
  ``x_i - base`` has every entry dropped with probability ``p = 1 - density`` and the
  survivors rescaled by ``1 / (1 - p)``; the deltas are then combined by task
  arithmetic, ``base + sum(w_i * delta_i)`` with ``w_i = 1/N`` unless weights are given
  (so density 1 is ``average``).  The drop masks come from ``seed`` and each tensor's
  name and model index, so a merge is reproducible whatever order tensors come in.

Tensors that are not floating point (counters, token ids) must be equal in every model
and are copied; float16/bfloat16/float32/float64 results keep the first model's dtype;
quantized inputs are dequantized and the result written as float32.
docs/guide/statistics.md ("Diff and merge") shows it in use; ``apr merge`` runs it.
"""

from __future__ import annotations

import hashlib
import math
import os

import numpy as np

from ..dtypes import by_name, element_count
from ..errors import LayoutError
from ..io.progress import progress_to
from ..layouts.aprender import tensor_counts
from ..numerics.drift import numeric_values
from ..tensors import RawTensor

__all__ = ["merge_models", "merge_tensor", "METHODS", "average", "weighted", "slerp", "ties", "dare"]

METHODS = ("average", "weighted", "ties", "dare", "slerp")
#: Methods that merge task vectors against a base model.
BASE_METHODS = ("ties", "dare")
_FLOAT_DTYPES = ("F32", "F64", "F16", "BF16")
#: Density defaults: TIES keeps the top 20% (the paper's k = 20); DARE keeps half.
DEFAULT_DENSITY = {"ties": 0.2, "dare": 0.5}


# --- the methods, on float64 arrays --------------------------------------------------
def average(values) -> np.ndarray:
    """The element-wise mean of equally shaped float64 arrays.

    Args:
        values: A list of arrays.

    Returns:
        A float64 array.

    Examples:
        >>> import numpy as np
        >>> from aprfast.tools.merge import average
        >>> average([np.float64([1.0]), np.float64([3.0])]).tolist()
        [2.0]
    """
    return sum(values) / len(values)


def weighted(values, weights) -> np.ndarray:
    """``sum(w_i * x_i) / sum(w_i)``.

    Args:
        values: A list of equally shaped arrays.
        weights: One number per array (their sum must not be 0).

    Returns:
        A float64 array.

    Examples:
        >>> import numpy as np
        >>> from aprfast.tools.merge import weighted
        >>> weighted([np.float64([1, 0]), np.float64([0, 1])], [3, 1]).tolist()
        [0.75, 0.25]
    """
    total = float(sum(weights))
    return sum(w * v for w, v in zip(weights, values)) / total


def slerp(a: np.ndarray, b: np.ndarray, t: float) -> np.ndarray:
    """Spherical linear interpolation from ``a`` (``t=0``) to ``b`` (``t=1``); linear when
    either is zero or they are (anti)parallel.

    Args:
        a: The first array.
        b: The second array, of ``a``'s shape.
        t: The position, 0 to 1.

    Returns:
        A float64 array.

    Examples:
        >>> import numpy as np
        >>> from aprfast.tools.merge import slerp
        >>> np.round(slerp(np.float64([1, 0]), np.float64([0, 1]), 0.5), 6).tolist()
        [0.707107, 0.707107]
    """
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    if na == 0.0 or nb == 0.0:
        return (1 - t) * a + t * b
    cos = float(np.dot(a.ravel(), b.ravel())) / (na * nb)
    omega = math.acos(max(-1.0, min(1.0, cos)))
    if math.sin(omega) < 1e-8:  # (anti)parallel: the circle is not defined, the line is
        return (1 - t) * a + t * b
    return (math.sin((1 - t) * omega) * a + math.sin(t * omega) * b) / math.sin(omega)


def _trim(tau: np.ndarray, density: float) -> np.ndarray:
    """``tau`` with all but its ``density`` fraction of largest-magnitude entries zeroed."""
    keep = int(density * tau.size)
    if keep >= tau.size:
        return tau
    out = np.zeros_like(tau)
    if keep > 0:
        flat = tau.ravel()
        top = np.argpartition(np.abs(flat), flat.size - keep)[flat.size - keep:]
        out.ravel()[top] = flat[top]
    return out


def ties(base: np.ndarray, values, density: float, weights=None, lam: float = 1.0) -> np.ndarray:
    """TIES-Merging of one tensor (trim, elect sign, disjoint mean; the module docstring).

    Args:
        base: The base model's values.
        values: The fine-tuned models' values, each of ``base``'s shape.
        density: The fraction of each task vector kept, in (0, 1].
        weights: One factor per model applied to its task vector (default 1 each).
        lam: The scaling of the merged task vector.

    Returns:
        A float64 array: ``base + lam * merged``.

    Examples:
        >>> import numpy as np
        >>> from aprfast.tools.merge import ties
        >>> ties(np.zeros(2), [np.float64([1, -2]), np.float64([3, 1])], density=1.0).tolist()
        [2.0, -2.0]
    """
    weights = weights or [1.0] * len(values)
    trimmed = [_trim(w * (v - base), density) for w, v in zip(weights, values)]
    elected = np.sign(sum(trimmed))
    agreeing = [(np.sign(t) == elected) & (t != 0) for t in trimmed]
    count = sum(a.astype(np.int64) for a in agreeing)
    total = sum(np.where(a, t, 0.0) for a, t in zip(agreeing, trimmed))
    merged = np.divide(total, count, out=np.zeros_like(total), where=count > 0)
    return base + lam * merged


def dare(base: np.ndarray, values, density: float, rngs, weights=None) -> np.ndarray:
    """DARE of one tensor: random drop and rescale of each delta, then task arithmetic.

    Args:
        base: The base model's values.
        values: The fine-tuned models' values, each of ``base``'s shape.
        density: The fraction of each delta kept, in (0, 1] (1: nothing dropped).
        rngs: One ``numpy.random.Generator`` per model (unused at density 1).
        weights: One factor per model (default ``1/N`` each).

    Returns:
        A float64 array.

    Examples:
        >>> import numpy as np
        >>> from aprfast.tools.merge import dare
        >>> dare(np.zeros(2), [np.float64([1, -2]), np.float64([3, 1])], 1.0, [None, None]).tolist()
        [2.0, -0.5]
    """
    weights = weights or [1.0 / len(values)] * len(values)
    out = base.copy()
    for w, v, rng in zip(weights, values, rngs):
        delta = v - base
        if density < 1.0:
            keep = rng.random(delta.shape) < density
            delta = np.where(keep, delta / density, 0.0)
        out += w * delta
    return out


def _tensor_rngs(seed: int, name: str, n: int) -> list:
    """One generator per model for tensor ``name``: independent of the order tensors
    are merged in and of the other tensors."""
    digest = int.from_bytes(hashlib.sha256(name.encode("utf-8")).digest()[:8], "little")
    return [np.random.default_rng([seed, digest, i]) for i in range(n)]


def merge_tensor(method: str, values, *, base=None, weights=None, density=None, t: float = 0.5,
                 lam: float = 1.0, seed: int = 0, name: str = "") -> np.ndarray:
    """One tensor merged from ``values`` (float64 arrays of one shape).

    Options are not checked here (:func:`merge_models` checks them first).

    Args:
        method: One of :data:`METHODS`.
        values: The models' values.
        base: The base model's values (ties, dare).
        weights: One per model (weighted, ties, dare).
        density: The fraction kept (ties, dare).
        t: slerp's position.
        lam: TIES' scaling of the merged task vector.
        seed: DARE's seed.
        name: The tensor's name (DARE's drop masks derive from it).

    Returns:
        A float64 array.

    Examples:
        >>> import numpy as np
        >>> from aprfast.tools.merge import merge_tensor
        >>> merge_tensor("weighted", [np.float64([1, 0]), np.float64([0, 1])], weights=[1, 3]).tolist()
        [0.25, 0.75]
    """
    if method == "average":
        return average(values)
    if method == "weighted":
        return weighted(values, weights)
    if method == "slerp":
        return slerp(values[0], values[1], t)
    if method == "ties":
        return ties(base, values, density, weights, lam)
    return dare(base, values, density, _tensor_rngs(seed, name, len(values)), weights)


# --- options -----------------------------------------------------------------------
def _check_options(method, n_models, base, weights, density, t, lam, seed):
    if method not in METHODS:
        raise ValueError(f"method={method!r}: one of {', '.join(METHODS)}")
    for option, value, owner in (("t", t, "slerp"), ("lam", lam, "ties"), ("seed", seed, "dare")):
        if value is not None and method != owner:
            raise ValueError(f"{option}= is for {owner}, not {method}")
    if method in BASE_METHODS:
        if base is None:
            raise ValueError(f"{method} merges task vectors: give base= (the model the inputs were fine-tuned from)")
        if n_models < 1:
            raise ValueError(f"{method} needs at least one model besides the base")
    elif base is not None:
        raise ValueError(f"base= is for {' and '.join(BASE_METHODS)}, not {method}")
    elif n_models < 2:
        raise ValueError(f"{method} needs at least two models")
    if method == "slerp" and n_models != 2:
        raise ValueError(f"slerp interpolates exactly two models, not {n_models}")
    if t is not None and not (0.0 <= t <= 1.0):
        raise ValueError(f"t={t}: between 0 and 1")
    if weights is not None:
        if method in ("average", "slerp"):
            raise ValueError(f"weights= is for weighted, ties and dare, not {method}")
        weights = [float(w) for w in weights]
        if len(weights) != n_models:
            raise ValueError(f"{len(weights)} weights for {n_models} models")
        if not all(math.isfinite(w) for w in weights):
            raise ValueError("weights must be finite numbers")
        if method == "weighted" and sum(weights) == 0:
            raise ValueError("weights sum to 0")
    elif method == "weighted":
        raise ValueError("weighted needs weights=")
    if method in BASE_METHODS:
        density = DEFAULT_DENSITY[method] if density is None else float(density)
        if not (0.0 < density <= 1.0):
            raise ValueError(f"density={density}: in (0, 1]")
    elif density is not None:
        raise ValueError(f"density= is for ties and dare, not {method}")
    return weights, density


# --- files -------------------------------------------------------------------------
def _open_all(paths, keys, verify=True):
    """The opened files and, for each, a CheckedReader that checks its integrity over
    the bytes the merge reads (no pass of its own; ``finish`` before the output is
    committed)."""
    from ..api import open as open_apr
    from ..files.integrity import CheckedReader

    files, readers = [], []
    try:
        for path in paths:
            files.append(open_apr(path, **(keys or {})))
            readers.append(CheckedReader(files[-1], verify=verify))
    except BaseException:
        for f in files:
            f.close()
        raise
    return files, readers


def _check_same_tensors(files, paths) -> list:
    """The first model's names, once every model is seen to hold the same names and shapes."""
    first = files[0]
    names = list(first.keys())
    for f, path in zip(files[1:], paths[1:]):
        if set(f.keys()) != set(names):
            missing = sorted(set(names) - set(f.keys()))[:5]
            extra = sorted(set(f.keys()) - set(names))[:5]
            raise LayoutError(f"{path} holds other tensors than {paths[0]} (missing {missing}, extra {extra})")
        for name in names:
            if tuple(f.info(name).shape) != tuple(first.info(name).shape):
                raise LayoutError(f"tensor {name!r} is {list(f.info(name).shape)} in {path} but "
                                  f"{list(first.info(name).shape)} in {paths[0]}")
    return names


def _out_dtype(info) -> str:
    if info.dtype_name in _FLOAT_DTYPES:
        return info.dtype_name
    return "F32" if info.dtype.packed else info.dtype_name


def _cast(result: np.ndarray, dtype_name: str, shape):
    from ..numerics.precision import to_bfloat16, to_float16

    result = result.reshape(shape)
    if dtype_name == "F64":
        return result
    if dtype_name == "F32":
        with np.errstate(over="ignore"):
            return result.astype(np.float32)
    if dtype_name == "F16":
        return to_float16(result)
    bits = to_bfloat16(result)
    return bits if bits.dtype != np.uint16 else RawTensor(by_name("BF16"), tuple(shape), bits)


def _copy_equal(name, readers, paths):
    """A non-float tensor, the same in every model (``readers``: CheckedReaders)."""
    value = readers[0].get_tensor(name)
    first = np.asarray(value.data if isinstance(value, RawTensor) else value)
    for r, path in zip(readers[1:], paths[1:]):
        other = r.get_tensor(name)
        if not np.array_equal(first, np.asarray(other.data if isinstance(other, RawTensor) else other)):
            raise LayoutError(f"tensor {name!r} ({readers[0].file.info(name).dtype_name}) is not floating point "
                              "and differs "
                              f"between {paths[0]} and {path}: there is no meaningful merge of it")
    return value


def merge_models(paths, output, *, method: str = "average", base=None, weights=None, density=None,
                 t: float | None = None, lam: float | None = None, seed: int | None = None, keys=None,
                 force: bool = False, progress=None, verify: bool = True) -> dict:
    """Merge the ``.apr`` models at ``paths`` into ``output`` (see the module docstring
    for the methods).  ``base``: the base model's path for ties/dare.  ``weights``: one
    per model.  ``density``: fraction kept by ties/dare.  ``t``: slerp's position (0.5).
    ``lam``: TIES' scaling of the merged task vector (1.0).  ``seed``: DARE's drop masks
    (0).  An option another method has no use for is refused, never ignored.
    ``keys``: ``aprfast.open`` key arguments for encrypted v1 inputs.  An existing
    ``output`` is refused unless ``force``.  Returns a summary dict.

    Args:
        paths: The models to merge (any file :func:`aprfast.open` reads).
        output: The ``.apr`` file to write (atomically).
        method: One of :data:`METHODS`.
        base: The base model's path (ties and dare only).
        weights: One number per model (weighted, ties, dare).
        density: Fraction kept by ties (default 0.2) or dare (default 0.5).
        t: slerp's position, 0 to 1 (default 0.5).
        lam: TIES' scaling of the merged task vector (default 1.0).
        seed: DARE's seed (default 0).
        keys: ``aprfast.open`` keyword arguments for encrypted inputs.
        force: Replace an existing ``output``.
        progress: None (the default: a plain line on stderr when it is a terminal and the
            call has run a second, else nothing), False (nothing), or a callable
            ``progress(done, total)`` called after each tensor; see :mod:`aprfast.io.progress`.
        verify: Check every input's CRC32 (and signature) over the bytes the merge
            reads, before the output is committed (no pass of its own; an encrypted or
            signed input is checked whole at open).

    Returns:
        A dict: ``output``, ``method``, ``models``, ``base``, ``tensors``, ``merged``
        (float tensors combined), ``copied`` (non-float tensors, equal everywhere),
        ``density`` and ``weights``.  The output's metadata records the merge under
        ``"merge"``.

    Raises:
        ValueError: An unknown method, an option the method does not use, a missing
            ``base``/``weights``, or values out of range.
        LayoutError: The models hold other tensor names or shapes, or a non-float
            tensor differs between them.
        DestinationExistsError: ``output`` exists and ``force`` is not set.
        ChecksumError: With ``verify``, an input's bytes do not match its CRC32.
        AprIOError: An input cannot be read or the output written.

    Examples:
        >>> import numpy as np, aprfast
        >>> from aprfast.tools.merge import merge_models
        >>> aprfast.save_file({"w": np.float32([1, 2]), "step": np.int32([5])}, "a.apr")
        >>> aprfast.save_file({"w": np.float32([3, 6]), "step": np.int32([5])}, "b.apr")
        >>> summary = merge_models(["a.apr", "b.apr"], "merged.apr")
        >>> summary["merged"], summary["copied"], aprfast.load_file("merged.apr")["w"].tolist()
        (1, 1, [2.0, 4.0])
        >>> merge_models(["a.apr", "b.apr"], "merged.apr", t=0.3)
        Traceback (most recent call last):
        ...
        ValueError: t= is for slerp, not average
    """
    from ..convert import DestinationExistsError
    from ..files.writer import Writer

    paths = [os.fspath(p) for p in paths]
    weights, density = _check_options(method, len(paths), base, weights, density, t, lam, seed)
    t, lam, seed = 0.5 if t is None else t, 1.0 if lam is None else lam, 0 if seed is None else seed
    output = os.fspath(output)
    if os.path.lexists(output) and not force:
        raise DestinationExistsError("output exists; pass force=True to replace it", path=output)
    all_paths = paths + ([os.fspath(base)] if base is not None else [])
    files, readers = _open_all(all_paths, keys, verify)
    try:
        names = _check_same_tensors(files, all_paths)
        models, base_file = (readers[:-1], readers[-1]) if base is not None else (readers, None)
        plan = [(n, _out_dtype(files[0].info(n)), tuple(files[0].info(n).shape)) for n in names]
        metadata = dict(files[0].metadata or {})
        # aprender's count fields describe the tensors written (issue 28 item 4)
        metadata.update(tensor_counts((element_count(s), by_name(d).nbytes(s)) for _, d, s in plan))
        metadata["merge"] = {"method": method, "models": [os.path.basename(p) for p in paths],
                             "base": os.path.basename(base) if base is not None else None, "weights": weights,
                             "density": density, "t": t if method == "slerp" else None,
                             "lambda": lam if method == "ties" else None, "seed": seed if method == "dare" else None}
        merged = copied = 0
        with Writer(output, metadata, plan=plan) as writer, \
                progress_to(progress, f"aprfast merge ({method})") as update:
            for i, (name, dtype_name, shape) in enumerate(plan):
                info = files[0].info(name)
                if info.dtype_name not in _FLOAT_DTYPES and not info.dtype.packed:
                    writer.add(name, _copy_equal(name, readers, all_paths))
                    copied += 1
                else:
                    values = [numeric_values(f.get_tensor(name)).astype(np.float64) for f in models]
                    base_values = numeric_values(base_file.get_tensor(name)).astype(np.float64) \
                        if base_file is not None else None
                    result = merge_tensor(method, values, base=base_values, weights=weights, density=density, t=t,
                                          lam=lam, seed=seed, name=name)
                    del values, base_values
                    writer.add(name, _cast(result, dtype_name, shape))
                    merged += 1
                if update is not None:
                    update(i + 1, len(plan))
            for reader in readers:  # inside the block: a damaged input aborts the writer, nothing is committed
                reader.finish()
    finally:
        for f in files:
            f.close()
    return {"output": output, "method": method, "models": paths, "base": base, "tensors": len(plan),
            "merged": merged, "copied": copied, "density": density, "weights": weights}
