"""Compare two models tensor by tensor (seed 001 §4.5, ``apr diff``).

:func:`diff_models` opens both sides (an ``.apr`` of any variant, or a ``.safetensors``
/ ``.gguf`` reference through the converters' sources), pairs tensors by name (or by a
mapping ``{name in A: name in B}``) and compares one pair at a time, so memory holds
at most one pair of tensors whatever the models' sizes.  Per pair it reports the
cosine similarity, the largest absolute difference, the L2 distance of the difference
and MATCH (every element within ``tolerance``) or DRIFT; tensors whose shapes differ
are SHAPE and are not compared element by element.  Metadata keys added, removed and
changed are listed, and a vocabulary (``tokenizer.vocabulary``) as tokens added and
removed.

Values are compared as float64 after decoding (half floats widened, packed
quantized blocks dequantized, a compressed-tensors weight decoded as compressed-tensors
decodes it), so an ``.apr`` in f16 can be checked against its f32 source with a
tolerance.  A NaN on both sides at the same place, or the same infinity, counts as equal;
a NaN or infinity on one side only is a DRIFT whatever the tolerance.
docs/guide/statistics.md ("Diff and merge") shows it in use; ``apr diff`` prints it.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field

import numpy as np

from ..dtypes import element_count
from ..errors import FormatError, LayoutError
from ..io.progress import progress_to
from ..numerics.drift import compare_values, numeric_values
from ..tensors import RawTensor

__all__ = ["diff_models", "DiffReport", "TensorDiff", "load_mapping", "DEFAULT_TOLERANCE"]

#: MATCH when no element differs by more than this (seed 001 §4.5: "delta < 1e-6").
DEFAULT_TOLERANCE = 1e-6
#: Metadata key whose list of tokens is compared as a vocabulary (convert/tokenizer.py).
VOCAB_KEY = "tokenizer.vocabulary"
#: A mapping file is a small JSON object; anything bigger is the wrong file.
_MAX_MAPPING_BYTES = 64 << 20


@dataclass
class TensorDiff:
    """One tensor pair.  ``status``: MATCH, DRIFT or SHAPE (shapes differ).  Tensors of a
    dtype without numeric values (an unknown dtype read raw) MATCH when their stored
    bytes are the same and DRIFT otherwise.  Made by :func:`diff_models`.

    Examples:
        >>> import numpy as np, aprfast
        >>> from aprfast.tools.diff import diff_models
        >>> aprfast.save_file({"w": np.float32([1, 2, 3]), "b": np.float32([0, 0])}, "a.apr")
        >>> aprfast.save_file({"w": np.float32([1, 2, 3.5]), "b": np.float32([0, 0])}, "b.apr")
        >>> report = diff_models("a.apr", "b.apr")
        >>> [(t.name, t.status, t.max_abs_delta) for t in report.tensors]
        [('b', 'MATCH', 0.0), ('w', 'DRIFT', 0.5)]
    """

    name: str
    other_name: str
    status: str
    shape_a: list
    shape_b: list
    dtype_a: str
    dtype_b: str
    count: int = 0
    identical: int = 0
    max_abs_delta: float | None = None
    l2_distance: float | None = None
    cosine: float | None = None
    nonfinite_mismatch: int = 0
    detail: str = ""


@dataclass
class DiffReport:
    """Everything :func:`diff_models` found; ``identical`` is true when every tensor
    matches bit for bit on both sides and the metadata is the same.  Made by
    :func:`diff_models`.

    Examples:
        >>> import numpy as np, aprfast
        >>> from aprfast.tools.diff import diff_models
        >>> aprfast.save_file({"w": np.float32([1, 2, 3]), "b": np.float32([0, 0])}, "a.apr")
        >>> aprfast.save_file({"w": np.float32([1, 2, 3.5]), "b": np.float32([0, 0])}, "b.apr")
        >>> report = diff_models("a.apr", "b.apr")
        >>> report.tensors_match, report.max_abs_delta, round(report.similarity, 4)
        (False, 0.5, 0.9984)
    """

    a: str
    b: str
    tolerance: float
    tensors: list = field(default_factory=list)
    only_in_a: list = field(default_factory=list)
    only_in_b: list = field(default_factory=list)
    metadata_added: dict = field(default_factory=dict)
    metadata_removed: dict = field(default_factory=dict)
    metadata_changed: dict = field(default_factory=dict)
    vocab_added: int = 0
    vocab_removed: int = 0

    @property
    def drifted(self) -> list:
        """The :class:`TensorDiff` of every pair that is DRIFT or SHAPE."""
        return [t for t in self.tensors if t.status in ("DRIFT", "SHAPE")]

    @property
    def metadata_differs(self) -> bool:
        """Whether a metadata key was added, removed or changed."""
        return bool(self.metadata_added or self.metadata_removed or self.metadata_changed)

    @property
    def tensors_match(self) -> bool:
        """Every tensor on both sides and within the tolerance."""
        return not (self.drifted or self.only_in_a or self.only_in_b)

    @property
    def similarity(self) -> float:
        """Element-weighted mean cosine similarity over every tensor of either side, a
        tensor present on one side only or of another shape counting 0: 1.0 exactly when
        every tensor is on both sides with a cosine of 1."""
        total = weighted = 0.0
        for t in self.tensors:
            n = max(t.count, 1)
            total += n
            weighted += n * (t.cosine if t.cosine is not None and t.status != "SHAPE" else 0.0)
        for _, n in self.only_in_a + self.only_in_b:
            total += max(n, 1)
        return weighted / total if total else 1.0

    @property
    def max_abs_delta(self) -> float:
        """The largest finite ``|a - b|`` over every compared tensor (0.0 when none)."""
        values = [t.max_abs_delta for t in self.tensors if t.max_abs_delta is not None]
        return max(values, default=0.0)

    @property
    def l2_distance(self) -> float:
        """L2 norm of the difference over every compared tensor taken together."""
        return math.sqrt(sum(t.l2_distance ** 2 for t in self.tensors if t.l2_distance is not None))

    def as_dict(self) -> dict:
        """JSON-ready: the summary numbers, every pair, the names on one side only, the
        metadata and vocabulary changes (what ``apr diff --json`` prints).

        Examples:
            >>> import numpy as np, aprfast
            >>> from aprfast.tools.diff import diff_models
            >>> aprfast.save_file({"w": np.float32([1, 2, 3]), "b": np.float32([0, 0])}, "a.apr")
            >>> aprfast.save_file({"w": np.float32([1, 2, 3.5]), "b": np.float32([0, 0])}, "b.apr")
            >>> report = diff_models("a.apr", "b.apr")
            >>> report.as_dict()["tensors_match"], [t["status"] for t in report.as_dict()["tensors"]]
            (False, ['MATCH', 'DRIFT'])
        """
        return {"a": self.a, "b": self.b, "tolerance": self.tolerance, "similarity": self.similarity,
                "max_abs_delta": self.max_abs_delta, "l2_distance": self.l2_distance,
                "tensors_match": self.tensors_match, "metadata_differs": self.metadata_differs,
                "tensors": [asdict(t) for t in self.tensors],
                "only_in_a": [name for name, _ in self.only_in_a], "only_in_b": [name for name, _ in self.only_in_b],
                "metadata": {"added": self.metadata_added, "removed": self.metadata_removed,
                             "changed": self.metadata_changed},
                "vocab": {"added": self.vocab_added, "removed": self.vocab_removed}}


# --- opening either side -------------------------------------------------------------
class _Side:
    """One model as names, shapes, dtypes, metadata and ``read(name)``: an ``.apr``
    through ``aprfast.open`` (keys for encrypted v1 files), anything else through the
    converters' source for its format."""

    def __init__(self, path, keys, verify=True):
        from ..convert import detect, open_source
        from ..convert.compressed_tensors import records_of

        self.path = os.fspath(path)
        self._file = self._source = self._reader = None
        if detect(self.path) == "apr":
            from ..api import open as open_apr
            from ..files.integrity import CheckedReader

            self._file = open_apr(self.path, unknown_dtypes="raw", **(keys or {}))
            # verify: a damaged file is an error, not a difference; the CRC runs over the
            # bytes the compare reads (no pass of its own) and finish() compares it
            self._reader = CheckedReader(self._file, verify=verify)
            self.names = list(self._file.keys())
            infos = {n: self._file.info(n) for n in self.names}
            self.shapes = {n: list(i.shape) for n, i in infos.items()}
            self.dtypes = {n: i.dtype_name for n, i in infos.items()}
            self.metadata = dict(self._file.metadata or {})
            self.records = dict(self._file.compressed_weights)
        else:
            if keys:
                raise LayoutError(f"keys were given for {self.path}, which is not an .apr file")
            self._source = open_source(self.path, tokenizer=False)
            self._specs = {s.name: s for s in self._source.specs}
            self.names = list(self._specs)
            self.shapes = {n: list(s.shape) for n, s in self._specs.items()}
            self.dtypes = {n: s.dtype.name for n, s in self._specs.items()}
            self.metadata = dict(self._source.metadata or {})
            self.records = records_of(self._source)
        self._compressed_shapes()

    def _compressed_shapes(self) -> None:
        """A compressed-tensors weight (one with a record) is its values: their shape,
        their dtype (compressed-tensors' output dtype), read decoded."""
        if not self.records:
            return
        from ..convert.compressed_tensors import logical_shapes

        def info(name):
            return (self.dtypes[name], tuple(self.shapes[name])) if name in self.shapes else None

        def read(name):
            return self._reader.get_tensor(name) if self._file is not None else self._source.read(self._specs[name])

        shapes = logical_shapes(self.records, info, read)
        self.records = {name: self.records[name] for name in shapes}
        for name, shape in shapes.items():
            self.shapes[name] = list(shape)
            self.dtypes[name] = f"{self.dtypes[name]} ({self.records[name]['format']})"

    def read(self, name):
        if name in self.records:  # compressed-tensors' own values, not the packed bytes
            if self._file is not None:
                return self._reader.get_tensor(name, dequantize=True)
            from ..convert.compressed_tensors import source_values

            return source_values(self._source, name, self.records[name])
        if self._file is not None:
            return self._reader.get_tensor(name)
        return self._source.read(self._specs[name])

    def finish(self) -> None:
        """The integrity check of an ``.apr`` side, completed after the last read (what
        the compare did not read is read here); nothing for other formats.

        Raises:
            ChecksumError: The file's bytes do not give its stored CRC32.
        """
        if self._reader is not None:
            self._reader.finish()

    def close(self) -> None:
        for handle in (self._file, self._source):
            if handle is not None:
                handle.close()


# --- values ---------------------------------------------------------------------------
def _raw_bytes(value):
    """The stored bytes of a tensor value (for the bit-for-bit fast path), or None."""
    if isinstance(value, RawTensor):
        return np.asarray(value.data).reshape(-1).view(np.uint8)
    array = np.asarray(value)
    if not array.flags.c_contiguous:
        return None
    return array.reshape(-1).view(np.uint8)


def _bitwise_equal(va, vb, dtype_a, dtype_b) -> bool:
    if dtype_a != dtype_b:
        return False
    ra, rb = _raw_bytes(va), _raw_bytes(vb)
    return ra is not None and rb is not None and ra.shape == rb.shape and np.array_equal(ra, rb)


def _diff_pair(name, other, side_a, side_b, tolerance, threads) -> TensorDiff:
    t = TensorDiff(name, other, "MATCH", side_a.shapes[name], side_b.shapes[other], side_a.dtypes[name],
                   side_b.dtypes[other], count=element_count(side_a.shapes[name]))
    if t.shape_a != t.shape_b:
        t.status, t.detail = "SHAPE", f"shape {t.shape_a} vs {t.shape_b}"
        return t
    va, vb = side_a.read(name), side_b.read(other)
    if _bitwise_equal(va, vb, t.dtype_a, t.dtype_b):
        t.identical, t.max_abs_delta, t.l2_distance, t.cosine = t.count, 0.0, 0.0, 1.0
        return t
    try:
        fa, fb = numeric_values(va), numeric_values(vb)
    except TypeError as exc:  # no numbers to compare, and the stored bytes differ
        t.status, t.detail = "DRIFT", f"stored bytes differ ({exc})"
        return t
    del va, vb  # the decoded copies are all that is needed from here on
    r = compare_values(fa, fb, threads)
    t.identical, t.nonfinite_mismatch, t.max_abs_delta = r["identical"], r["nonfinite"], r["max_abs"]
    t.cosine, t.l2_distance = r["cosine"], r["l2"]
    if t.nonfinite_mismatch or t.max_abs_delta > tolerance:
        reasons = [f"{t.nonfinite_mismatch} NaN/Inf on one side only"] if t.nonfinite_mismatch else []
        if t.max_abs_delta > tolerance:
            reasons.append(f"max delta {t.max_abs_delta:.4g} > {tolerance:g}")
        t.status, t.detail = "DRIFT", "; ".join(reasons)
    return t


# --- metadata ----------------------------------------------------------------------
def _metadata_changes(report: DiffReport, ma: dict, mb: dict) -> None:
    for key in ma.keys() - mb.keys():
        report.metadata_removed[key] = ma[key]
    for key in mb.keys() - ma.keys():
        report.metadata_added[key] = mb[key]
    for key in ma.keys() & mb.keys():
        if not _same_value(ma[key], mb[key]):
            report.metadata_changed[key] = {"a": ma[key], "b": mb[key]}
    va, vb = ma.get(VOCAB_KEY), mb.get(VOCAB_KEY)
    if isinstance(va, list) or isinstance(vb, list):
        tokens_a = set(map(str, va)) if isinstance(va, list) else set()
        tokens_b = set(map(str, vb)) if isinstance(vb, list) else set()
        report.vocab_added, report.vocab_removed = len(tokens_b - tokens_a), len(tokens_a - tokens_b)


def _same_value(x, y) -> bool:
    if isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
        return np.array_equal(np.asarray(x), np.asarray(y))
    try:
        return bool(x == y)
    except (TypeError, ValueError):
        return False


# --- the whole comparison --------------------------------------------------------------
def load_mapping(path) -> dict:
    """A ``--tensor-mapping`` file: a JSON object ``{"name in A": "name in B"}``.

    Args:
        path: The JSON file (at most 64 MiB).

    Returns:
        The mapping, a dict of str to str.

    Raises:
        FormatError: Not JSON, not an object of strings, too large, or two names of A
            sent to one name of B.
        AprIOError: The file cannot be read (AprFileNotFoundError when missing).

    Examples:
        >>> import json
        >>> from aprfast.tools.diff import load_mapping
        >>> with open("mapping.json", "w") as fh:
        ...     json.dump({"b": "bias"}, fh)
        >>> load_mapping("mapping.json")
        {'b': 'bias'}
    """
    try:
        with open(path, "rb") as fh:
            data = fh.read(_MAX_MAPPING_BYTES + 1)
    except OSError as exc:
        from ..errors import os_error

        raise os_error(exc, "cannot read the tensor mapping", path=path) from exc
    if len(data) > _MAX_MAPPING_BYTES:
        raise FormatError(f"a tensor mapping is at most {_MAX_MAPPING_BYTES} bytes", path=path)
    try:
        mapping = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise FormatError(f"tensor mapping is not JSON: {exc}", path=path) from None
    if not isinstance(mapping, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                for k, v in mapping.items()):
        raise FormatError('a tensor mapping is a JSON object of strings: {"name in A": "name in B"}', path=path)
    targets = list(mapping.values())
    if len(set(targets)) != len(targets):
        raise FormatError("the tensor mapping sends two names of A to the same name of B", path=path)
    return mapping


def _pairs(names_a, names_b, mapping):
    """(name in A, name in B) pairs in A's order, then the names left on each side."""
    in_b = set(names_b)
    pairs, used = [], set()
    for name in names_a:
        other = mapping.get(name, name)
        if other in in_b and other not in used:
            pairs.append((name, other))
            used.add(other)
    paired_a = {a for a, _ in pairs}
    return pairs, [n for n in names_a if n not in paired_a], [n for n in names_b if n not in used]


def _with_weight_names(mapping: dict, side_a, side_b) -> dict:
    """``mapping`` plus the pairs a repack gives: a compressed-tensors weight
    ``M.weight_packed`` on one side and ``M.weight`` (GGML blocks, or float) on the other,
    where neither name is on both sides and ``mapping`` says nothing of them."""
    out = dict(mapping)
    taken = set(out.values())
    in_a, in_b = set(side_a.names), set(side_b.names)
    for packed in side_a.records:
        plain = packed[:-len("_packed")] if packed.endswith(".weight_packed") else None
        if plain and packed not in out and packed not in in_b and plain in in_b and plain not in in_a \
                and plain not in taken:
            out[packed] = plain
            taken.add(plain)
    for packed in side_b.records:
        plain = packed[:-len("_packed")] if packed.endswith(".weight_packed") else None
        if plain and plain not in out and plain in in_a and plain not in in_b and packed not in in_a \
                and packed not in taken:
            out[plain] = packed
            taken.add(packed)
    return out


def diff_models(a, b, *, tolerance: float = DEFAULT_TOLERANCE, mapping=None, keys_a=None, keys_b=None,
                threads: int = 0, progress=None, verify: bool = True) -> DiffReport:
    """Compare model ``a`` with model ``b`` (paths) one tensor pair at a time.

    ``mapping``: ``{name in A: name in B}`` for tensors named differently on the two
    sides (others pair by equal names).  ``keys_a``/``keys_b``: ``aprfast.open`` key
    arguments (``password``, ``private_key``, ``trusted_keys``) for encrypted or signed
    ``.apr`` files.  ``progress(done, total)`` is called after each pair; by default a
    terminal's stderr shows a plain progress line once the call has run a second.

    Args:
        a: The first model: a path to an ``.apr``, ``.safetensors`` or ``.gguf`` file
            (any format :func:`aprfast.convert` reads).
        b: The second model, the same way.
        tolerance: A pair MATCHes when no element differs by more than this.
        mapping: ``{name in A: name in B}`` (see :func:`load_mapping`).
        keys_a: ``aprfast.open`` keyword arguments for ``a``.
        keys_b: ``aprfast.open`` keyword arguments for ``b``.
        threads: Threads for the statistics engine (0: every core).
        progress: None (the default: a plain line on stderr when it is a terminal and the
            call has run a second, else nothing), False (nothing), or a callable
            ``progress(done, total)`` called after each pair; see :mod:`aprfast.io.progress`.
        verify: Check each ``.apr`` side's CRC32 (and signature) over the bytes the
            compare reads, before the report is returned (no pass of its own; an
            encrypted or signed side is checked whole at open).

    Returns:
        A :class:`DiffReport`.

    Raises:
        ValueError: A negative or non-finite ``tolerance``.
        FormatError: A file of a format no converter reads.
        AprIOError: A file cannot be opened (AprFileNotFoundError when missing).
        DecryptError: An encrypted ``.apr`` without the right key in ``keys_a``/``keys_b``.
        ChecksumError: With ``verify``, an ``.apr`` side's bytes do not match its CRC32.

    Examples:
        >>> import numpy as np, aprfast
        >>> from aprfast.tools.diff import diff_models
        >>> aprfast.save_file({"w": np.float32([1, 2, 3]), "b": np.float32([0, 0])}, "a.apr",
        ...                   metadata={"v": 1})
        >>> aprfast.save_file({"w": np.float32([1, 2, 3.5]), "bias": np.float32([0, 0])}, "b.apr",
        ...                   metadata={"v": 2})
        >>> report = diff_models("a.apr", "b.apr", mapping={"b": "bias"})
        >>> [(t.name, t.other_name, t.status) for t in report.tensors]
        [('b', 'bias', 'MATCH'), ('w', 'w', 'DRIFT')]
        >>> report.metadata_changed, report.tensors_match
        ({'v': {'a': 1, 'b': 2}}, False)
        >>> diff_models("a.apr", "b.apr", mapping={"b": "bias"}, tolerance=1.0).tensors_match
        True
    """
    if not (isinstance(tolerance, (int, float)) and tolerance >= 0 and math.isfinite(tolerance)):
        raise ValueError(f"tolerance={tolerance!r}: a finite number >= 0")
    side_a = _Side(a, keys_a, verify)
    try:
        side_b = _Side(b, keys_b, verify)
    except BaseException:
        side_a.close()
        raise
    try:
        report = DiffReport(side_a.path, side_b.path, float(tolerance))
        pairs, left_a, left_b = _pairs(side_a.names, side_b.names, _with_weight_names(mapping or {}, side_a, side_b))
        report.only_in_a = [(n, element_count(side_a.shapes[n])) for n in left_a]
        report.only_in_b = [(n, element_count(side_b.shapes[n])) for n in left_b]
        with progress_to(progress, f"aprfast diff {os.path.basename(str(side_a.path))}") as update:
            for i, (name, other) in enumerate(pairs):
                report.tensors.append(_diff_pair(name, other, side_a, side_b, tolerance, threads))
                if update is not None:
                    update(i + 1, len(pairs))
        side_a.finish()  # a damaged side is an error, never a report
        side_b.finish()
        _metadata_changes(report, side_a.metadata, side_b.metadata)
    finally:
        side_a.close()
        side_b.close()
    return report
