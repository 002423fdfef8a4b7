"""Tensor-parallel loading: each rank reads only its part of each tensor.

```python
parts = aprfast.distributed.load_shard("model.apr", rank=0, world_size=2,
                                       rules={"*.q_proj.weight": 0, "*.o_proj.weight": 1})
```

:func:`load_shard` returns, for each tensor, the part this rank owns along the dimension
its rule names, and the whole tensor where no rule applies.  It reads through
``get_slice``, so only the bytes of that part are read, from any file ``aprfast.open``
reads (both v2 layouts, APR1, v1 containers, local sharded models, ``http(s)://`` and
fsspec URLs), and from an open handle.  What "only those bytes" means per file:

* plain tensors (mapped or read with ``pread``, locally or through a ranged source):
  exactly the part's bytes, one contiguous range for a split along dim 0 (or any dim
  after leading dims of size 1), one range per row of the leading dims otherwise;
* APR2 compressed tensors: the blocks holding the part's rows along dim 0 (a split along
  a later dim touches every row, so it decodes the whole tensor);
* encrypted or signed APR2 files: the 1 MiB chunks the part covers;
* v1 STREAMING files: the chunks covering the part's rows along dim 0; v1 files that are
  compressed or encrypted whole are decoded whole when opened (the format allows no less);
* packed (quantized) tensors: split along dim 0 only, as whole rows of blocks;
* URLs: a split along dim 0 is one ranged request per tensor; the remote reader merges
  ranges closer than 256 KiB, so a split along a later dim fetches whole rows.

``mode="pread"`` reads exactly those bytes (one system call per range); the default
mapping copies the part out of the map, and the kernel reads the pages it touches.

With ``rank``/``world_size`` not given, they come from ``torch.distributed`` when a
process group is initialised (``group=`` picks one), so under ``torchrun``:

```python
torch.distributed.init_process_group("gloo")
state = aprfast.distributed.load_shard(path, rules=rules, framework="pt")
```

See docs/guide/distributed.md.
"""

from __future__ import annotations

import fnmatch
import re
import sys

import numpy as np

from .errors import LayoutError
from .files.frameworks import framework_name, to_framework
from .files.reader import TensorSlice
from .io.pickling import PicklingRefusedError, allow_pickled_keys
from .numerics import quantization
from .tensors import QuantizedTensor

__all__ = ["load_shard", "shard_plan", "part_bounds", "UNEVEN", "allow_pickled_keys", "PicklingRefusedError"]

#: What ``uneven=`` accepts when a split dimension does not divide by the world size.
#: "error": refuse (LayoutError naming the tensor, its size and the world size);
#: "chunk": ``torch.chunk``'s parts: ceil(size / world_size) each, the last ones shorter
#: and, when size < world_size or the sizes run out early, empty (size 0 along the dim);
#: "tensor_split": ``torch.tensor_split`` / ``numpy.array_split``'s parts: sizes differ
#: by at most one, the first ``size % world_size`` ranks hold one more.
UNEVEN = ("error", "chunk", "tensor_split")


def part_bounds(size: int, rank: int, world_size: int, uneven: str = "error", *, what: str = "dimension"):
    """``(start, stop)`` of ``rank``'s part of a dimension of ``size`` (see :data:`UNEVEN`).

    Args:
        size: The dimension's length.
        rank: This process's rank, in ``0..world_size - 1``.
        world_size: How many parts.
        uneven: "error", "chunk" or "tensor_split" (:data:`UNEVEN`).
        what: What the dimension is, for the error message.

    Returns:
        ``(start, stop)``, a half-open range (empty when the rank gets nothing).

    Raises:
        LayoutError: ``size`` does not divide by ``world_size`` and ``uneven="error"``.
        ValueError: A rank outside the world, ``world_size < 1``, or an unknown
            ``uneven``.
        TypeError: ``rank`` or ``world_size`` is not an int.

    Examples:
        >>> from aprfast.distributed import part_bounds
        >>> part_bounds(8, 1, 2)
        (4, 8)
        >>> part_bounds(10, 1, 3, "chunk"), part_bounds(10, 1, 3, "tensor_split")
        ((4, 8), (4, 7))
    """
    _check_rank(rank, world_size)
    if uneven not in UNEVEN:
        raise ValueError(f"uneven={uneven!r}: one of {', '.join(UNEVEN)}")
    if uneven == "chunk":
        step = -(-size // world_size)
        start = min(rank * step, size)
        return start, min(start + step, size)
    if uneven == "tensor_split":
        q, r = divmod(size, world_size)
        start = rank * q + min(rank, r)
        return start, start + q + (rank < r)
    if size % world_size:
        raise LayoutError(f"{what} of size {size} does not divide into {world_size} equal parts; pass "
                          "uneven='chunk' (torch.chunk's parts) or uneven='tensor_split' (sizes differ by one), "
                          "or a rule with dim None to keep it whole")
    step = size // world_size
    return rank * step, (rank + 1) * step


def shard_plan(target, *, rank=None, world_size=None, rules=None, uneven: str = "error", names=None, group=None,
               **open_options) -> dict:
    """What :func:`load_shard` would read, without reading any tensor: name ->
    ``(dim, start, stop)`` for split tensors, None for whole ones.

    Arguments as for :func:`load_shard` (the handle is opened for its index only).

    Args:
        target: A path, URL, bytes or open handle, as for :func:`load_shard`.
        rank: This process's rank (default: torch.distributed's).
        world_size: How many ranks (default: torch.distributed's).
        rules: Which tensors split along which dimension.
        uneven: "error", "chunk" or "tensor_split".
        names: Restrict the plan to these tensors.
        group: The torch.distributed group to read rank and world size from.
        **open_options: Keyword arguments of :func:`aprfast.open`.

    Returns:
        A dict of name to ``(dim, start, stop)`` or None.

    Raises:
        LayoutError: A dimension that does not divide (``uneven="error"``), a dim out
            of range, or a packed tensor split along a dim other than 0.
        ValueError: No rank/world size given and torch.distributed not initialised.
        TensorNotFoundError: A name in ``names`` that the file lacks.

    Examples:
        >>> import numpy as np, aprfast
        >>> from aprfast.distributed import shard_plan
        >>> aprfast.save_file({"l.weight": np.zeros((4, 2), np.float32), "l.bias": np.zeros(2)}, "m.apr")
        >>> shard_plan("m.apr", rank=1, world_size=2, rules={"*.weight": 0})
        {'l.bias': None, 'l.weight': (0, 2, 4)}
    """
    rank, world_size = _rank_and_world(rank, world_size, group)
    select = _rules(rules)
    with _Opened(target, open_options) as f:
        return {name: _part(name, f.info(name), select, rank, world_size, uneven) for name in _names(f, names)}


def load_shard(target, *, rank=None, world_size=None, rules=None, uneven: str = "error", framework: str = "np",
               device="cpu", names=None, dequantize: bool = False, copy: bool = False, group=None,
               **open_options) -> dict:
    """This rank's part of every tensor of ``target``: name -> array (or framework tensor).

    ``target``: a path, URL or anything else :func:`aprfast.open` takes (then opened with
    ``open_options``: ``password``, ``mode``, ``storage_options``, ...), or an open handle
    (left open).  ``rank`` and ``world_size``: this process's place, by default those of
    ``torch.distributed`` (``group``, else the default group) when it is initialised.

    ``rules`` say which tensors are split and along which dimension: a mapping (or list of
    pairs) pattern -> dim, tried in order, the first match deciding; a pattern is a glob
    (``fnmatch``, case-sensitive, on the whole name) or a compiled ``re`` pattern (matched
    with ``fullmatch``); dim is an int (negative counts from the end) or None (keep the
    tensor whole, e.g. ``{"*.bias": None, "*.weight": 0}``).  A callable ``(name, shape) ->
    dim or None`` works too.  Tensors no rule matches are read whole.  A dim that does not
    divide by ``world_size``: see ``uneven`` (:data:`UNEVEN`; "error" by default).  A dim
    out of range for a tensor, or a packed (quantized) tensor split along a dim other
    than 0, is a :class:`LayoutError` naming the tensor and the rule.

    ``framework``: "np" (NumPy arrays) or "pt" (torch tensors on ``device``).  Parts are
    owned arrays; whole tensors are views of the mapped file for "np" unless ``copy``
    (always owned for "pt").  ``dequantize=True`` turns packed tensors (and parts) into
    float32; otherwise they stay :class:`QuantizedTensor` (which torch has no type for).
    ``names`` restricts the load to those tensors.

    Args:
        target: A path, URL, bytes or open handle.
        rank: This process's rank (default: torch.distributed's).
        world_size: How many ranks (default: torch.distributed's).
        rules: Which tensors split along which dimension, as above.
        uneven: "error", "chunk" or "tensor_split" (:data:`UNEVEN`).
        framework: "np" or "pt".
        device: Where torch tensors go.
        names: Load only these tensors.
        dequantize: Turn packed tensors into float32.
        copy: Owned arrays for whole tensors too ("np").
        group: The torch.distributed group to read rank and world size from.
        **open_options: Keyword arguments of :func:`aprfast.open`.

    Returns:
        A dict of name to array (or torch tensor), in the file's order.

    Raises:
        LayoutError: A dimension that does not divide (``uneven="error"``), a dim out
            of range, or a packed tensor split along a dim other than 0.
        ValueError: No rank/world size given and torch.distributed not initialised, or
            a rank outside the world.
        TensorNotFoundError: A name in ``names`` that the file lacks.
        AprFileNotFoundError: ``target`` does not exist.

    Examples:
        >>> import numpy as np, aprfast
        >>> from aprfast.distributed import load_shard
        >>> aprfast.save_file({"l.weight": np.arange(8, dtype=np.float32).reshape(4, 2)}, "m.apr")
        >>> load_shard("m.apr", rank=1, world_size=2, rules={"*.weight": 0})["l.weight"]
        array([[4., 5.],
               [6., 7.]], dtype=float32)
    """
    kind = framework_name(framework)
    if kind == "jax":
        raise ValueError("framework='jax' is not supported by load_shard; use 'np' or 'pt'")
    rank, world_size = _rank_and_world(rank, world_size, group)
    select = _rules(rules)
    out = {}
    with _Opened(target, open_options) as f:
        for name in _names(f, names):
            info = f.info(name)
            part = _part(name, info, select, rank, world_size, uneven)
            if part is None:
                value = f.get_tensor(name, copy=copy or kind != "numpy")
            else:
                value = _read_part(f, name, info, *part)
            if dequantize and isinstance(value, QuantizedTensor):
                value = quantization.dequantize(value)
            out[name] = value if kind == "numpy" else to_framework(name, value, info.dtype, kind, device)
    return out


# --- rank and world size ------------------------------------------------------------------
def _rank_and_world(rank, world_size, group):
    if rank is None or world_size is None:
        dist = sys.modules.get("torch.distributed")  # initialised only if torch was imported: never import it here
        if dist is None or not dist.is_available() or not dist.is_initialized():
            raise ValueError("give rank= and world_size=, or initialise torch.distributed "
                             "(torch.distributed.init_process_group) so they can be read from it")
        if rank is None:
            rank = dist.get_rank(group)
        if world_size is None:
            world_size = dist.get_world_size(group)
    _check_rank(rank, world_size)
    return rank, world_size


def _check_rank(rank, world_size):
    for label, value in (("rank", rank), ("world_size", world_size)):
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
            raise TypeError(f"{label} must be an int, not {type(value).__name__}")
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, not {world_size}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in 0..{world_size - 1} (world_size {world_size})")


# --- rules --------------------------------------------------------------------------------
def _rules(rules):
    """A function (name, shape) -> (dim or None, the rule's description or None)."""
    if rules is None:
        return lambda name, shape: (None, None)
    if callable(rules) and not hasattr(rules, "items"):
        def from_callable(name, shape):
            dim = rules(name, tuple(shape))
            _check_dim_type(dim, "the rules callable")
            return dim, "the rules callable"
        return from_callable
    pairs = list(rules.items()) if hasattr(rules, "items") else list(rules)
    compiled = []
    for pair in pairs:
        if not (isinstance(pair, tuple) and len(pair) == 2):
            raise TypeError(f"rules must map patterns to dims, not {pair!r}")
        pattern, dim = pair
        if isinstance(pattern, re.Pattern):
            matches, shown = pattern.fullmatch, f"re {pattern.pattern!r}"
        elif isinstance(pattern, str):
            matches, shown = re.compile(fnmatch.translate(pattern)).match, repr(pattern)
        else:
            raise TypeError(f"a rule's pattern is a glob (str) or a compiled re pattern, not {pattern!r}")
        _check_dim_type(dim, f"rule {shown}")
        compiled.append((matches, dim, f"rule {shown}: {dim}"))

    def from_rules(name, shape):
        for matches, dim, shown in compiled:
            if matches(name):
                return dim, shown
        return None, None
    return from_rules


def _check_dim_type(dim, where):
    if dim is not None and (not isinstance(dim, (int, np.integer)) or isinstance(dim, bool)):
        raise TypeError(f"{where} gives dim {dim!r}; a dim is an int or None")


def _part(name, info, select, rank, world_size, uneven):
    """(dim, start, stop) of ``rank``'s part of tensor ``name``, or None to read it whole."""
    shape = tuple(info.shape)
    dim, rule = select(name, shape)
    if dim is None:
        return None
    if not -len(shape) <= dim < len(shape):
        raise LayoutError(f"tensor {name!r} of shape {list(shape)} has no dim {dim} ({rule}); give it a rule "
                          "of its own, or dim None to keep it whole", path=None)
    dim %= len(shape)
    dtype = info.dtype
    if dtype is not None and dtype.packed and dim != 0:
        raise LayoutError(f"tensor {name!r} is {dtype.name}: packed tensors split along dim 0 only (whole rows "
                          f"of blocks), not dim {dim} ({rule})")
    start, stop = part_bounds(shape[dim], rank, world_size, uneven, what=f"tensor {name!r} dim {dim} ({rule})")
    return dim, start, stop


def _names(f, names):
    if names is None:
        return f.keys()
    names = [names] if isinstance(names, str) else list(names)
    for name in names:
        f.info(name)  # TensorNotFoundError names it before anything is read
    return names


# --- reading ------------------------------------------------------------------------------
def _read_part(f, name, info, dim, start, stop):
    """The part [start, stop) along ``dim`` of one tensor, read through get_slice."""
    shape = tuple(info.shape)
    sliced = f.get_slice(name)
    if dim == 0 or all(n == 1 for n in shape[:dim]):
        return sliced[(slice(None),) * dim + (slice(start, stop),)]
    # One range per row of the leading dims: keep each get_slice call under the slice's
    # run limit, above which it would read the bounding rows (the whole tensor) instead.
    per_row = int(np.prod(shape[1:dim], dtype=np.int64))
    step = max(1, TensorSlice.MAX_RUNS // max(per_row, 1))
    tail = (slice(None),) * (dim - 1) + (slice(start, stop),)
    if shape[0] <= step:
        return sliced[(slice(None),) + tail]
    out = None
    for row in range(0, shape[0], step):
        block = sliced[(slice(row, row + step),) + tail]
        if out is None:
            out = np.empty(shape[:dim] + (stop - start,) + shape[dim + 1:], block.dtype)
        out[row:row + step] = block
    return out


class _Opened:
    """``target`` opened by aprfast.open (and closed after), or an open handle used as is."""

    def __init__(self, target, options):
        self._target, self._options, self._owned = target, options, None

    def __enter__(self):
        if hasattr(self._target, "get_slice") and hasattr(self._target, "info"):
            if self._options:
                raise TypeError(f"open options {sorted(self._options)} given with a handle that is already open")
            return self._target
        from .api import open as open_apr

        self._owned = open_apr(self._target, **self._options)
        return self._owned

    def __exit__(self, *exc):
        if self._owned is not None:
            self._owned.close()
        return False
