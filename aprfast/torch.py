"""torch tensors in and out: ``aprfast.torch.save_file/save/load_file/load``.

A thin adapter over the NumPy API (torch is an optional extra), with the signatures
of ``safetensors.torch``.  Tensors are moved to the CPU and made contiguous before
saving; bf16 and float8 travel as their raw bits, so ml_dtypes is not needed for
them.  ``load_file`` gives writable tensors over a private copy-on-write map by
default, or owned memory with ``backend="pread"``, on ``device``.

Shared memory, as safetensors sees it: names that are the same tensor (tied weights)
are stored once, every name pointing at the same bytes; names whose bytes overlap
without being the same tensor (``A`` and ``A[:1]``) are refused with RuntimeError, as
safetensors refuses them, since one of them would be a silent copy.  ``save_model``
keeps the whole tensor of such a group and records each dropped view in the metadata
(``{dropped: kept}``, safetensors' record), and ``load_model`` fills the model's tied
names from the names the file has.  See docs/guide/safetensors.md.
"""

from __future__ import annotations

from collections import defaultdict

from . import api
from ._optional import require
from .files.frameworks import UsageError, check_metadata, check_names, from_torch, to_framework, torch_meta
from .files.reader import AprFile
from .files.staging import STAGING_BYTES, load_to_device, tensor_to_device  # noqa: F401  (public here too)

torch = require("torch")  # MissingDependencyError naming aprfast[torch], as every optional import

__all__ = ["save_file", "save", "load_file", "load", "save_model", "load_model", "load_to_device",
           "tensor_to_device"]


def save_file(tensors, filename, metadata=None, **options) -> None:
    """Write ``tensors`` (name -> torch.Tensor) to ``filename`` atomically.  ``metadata``
    is str to str, as in safetensors; ``options`` are :func:`aprfast.save_file`'s.

    Args:
        tensors: A dict of name (str) to dense torch.Tensor (any device).
        filename: The path to write.
        metadata: A dict of str to str, or None.
        **options: Keyword arguments of :func:`aprfast.save_file`.

    Raises:
        ValueError: ``tensors`` is not a dict of tensors, or holds a sparse tensor.
        RuntimeError: Names share memory without being one tensor.
        TypeError: A name that is not a str, or metadata that is not str to str.
        LayoutError: As for :func:`aprfast.save_file`.
        AprIOError: The operating system refused the write.

    Examples:
        >>> import torch
        >>> from aprfast.torch import save_file, load_file
        >>> save_file({"w": torch.arange(3, dtype=torch.float32)}, "model.apr")
        >>> load_file("model.apr")
        {'w': tensor([0., 1., 2.])}
    """
    check_metadata(metadata)
    api.save_file(_to_numpy(tensors), filename, metadata, **options)


def save(tensors, metadata=None, **options) -> bytes:
    """The bytes :func:`save_file` would write.

    Args:
        tensors: A dict of name (str) to dense torch.Tensor.
        metadata: A dict of str to str, or None.
        **options: Keyword arguments of :func:`aprfast.save`.

    Returns:
        The complete file.

    Raises:
        ValueError: ``tensors`` is not a dict of tensors, or holds a sparse tensor.
        RuntimeError: Names share memory without being one tensor.
        TypeError: A name that is not a str, or metadata that is not str to str.

    Examples:
        >>> import torch
        >>> from aprfast.torch import save, load
        >>> load(save({"b": torch.ones(2, dtype=torch.bfloat16)}))
        {'b': tensor([1., 1.], dtype=torch.bfloat16)}
    """
    check_metadata(metadata)
    return api.save(_to_numpy(tensors), metadata, **options)


def load_file(filename, device="cpu", *, backend: str = "mmap", verify: bool | None = None) -> dict:
    """Every tensor of ``filename`` on ``device``, writable.

    ``backend="mmap"`` (the default, as in safetensors) gives CPU tensors over a private
    copy-on-write map: no copy, writes never reach the file.  ``backend="pread"`` reads
    the data section into one owned buffer with parallel ``pread``; ``backend="direct"``
    reads it around the page cache (``O_DIRECT``, :mod:`aprfast.io.direct`).  As
    :func:`aprfast.load_file` does, the default checks the whole-file CRC where the bytes are
    read anyway (``"pread"``, ``"direct"``, another device: computed on the way) and not over
    the map, whose tensors are lazy as safetensors' are: checking would read every byte of
    the file at open (about 15-20 ms for 500 MiB in the page cache on one core, where
    ``safetensors.torch.load_file`` reads no tensor data at all).  The index, every offset
    and size are checked in all cases; ``verify=True`` adds the CRC over the map too, and
    ``verify=False`` skips it everywhere.  ``device="meta"`` reads only the index: tensors
    with shapes and dtypes and no data.  Any other device (``"cuda:0"``, ``0``) gets
    tensors allocated there and filled through pinned staging buffers, reads overlapping
    copies (:func:`load_to_device`); the model is never built in CPU memory first.

    Args:
        filename: The path to read.
        device: "cpu", "meta", a CUDA device ("cuda:0", an int) or a ``torch.device``.
        backend: "mmap", "pread" or "direct".
        verify: Check the whole-file CRC: None (default) where the bytes are read
            anyway (not with ``backend="mmap"`` on CPU), True always, False never.

    Returns:
        A dict of name to torch.Tensor on ``device``.

    Raises:
        UsageError: An unknown ``backend`` (an AprError and a ValueError).
        AprFileNotFoundError: ``filename`` does not exist.
        FormatError: Not an ``.apr`` file.
        ChecksumError: The CRC does not match (``verify``).

    Examples:
        >>> import torch
        >>> from aprfast.torch import save_file, load_file
        >>> save_file({"w": torch.zeros(2, 3)}, "model.apr")
        >>> load_file("model.apr", device="meta")["w"].shape
        torch.Size([2, 3])
    """
    if backend not in ("mmap", "pread", "direct"):
        raise UsageError(f"backend must be 'mmap', 'pread' or 'direct', not {backend!r}")
    if str(device) == "meta":
        return _meta_tensors(filename)
    target = torch.device(device)
    if target.type != "cpu":
        with AprFile(filename, mode="pread") as f:
            return load_to_device(f, target, verify=verify is not False)
    if backend == "mmap":
        with AprFile(filename, mode="private", verify=bool(verify)) as f:
            return _to_torch(f, f.tensors(), device)
    with AprFile(filename, mode=backend) as f:
        return _to_torch(f, f.load_all(verify=verify is not False), device)


def _meta_tensors(path) -> dict:
    with AprFile(path) as f:
        return {name: torch_meta(name, f.info(name)) for name in f.keys()}


def save_model(model, filename, metadata=None, force_contiguous: bool = True, **options) -> None:
    """Save ``model.state_dict()`` to ``filename``.  Parameters that are one tensor under
    several names (tied embeddings) are stored once, every name pointing at the same
    bytes (the spec layout; see docs/FORMAT.md), and each tie is also recorded in the
    metadata as ``{other name: first name}``, as safetensors records the names it drops
    (``metadata()`` reads the same on both).  A name that is only a view into part
    of another's storage is left out and recorded in the metadata as ``{view: whole}``,
    as safetensors does; :func:`load_model` fills it through the model's own sharing.
    ``force_contiguous`` is safetensors' argument: aprfast stores non-contiguous
    tensors as contiguous copies whatever it says.

    Args:
        model: A ``torch.nn.Module``.
        filename: The path to write.
        metadata: A dict of str to str, or None (its keys win over the tie records).
        force_contiguous: Accepted for safetensors' signature.
        **options: Keyword arguments of :func:`aprfast.save_file`.

    Raises:
        TypeError: Metadata that is not str to str.
        LayoutError: As for :func:`aprfast.save_file`.
        AprIOError: The operating system refused the write.

    Examples:
        >>> import torch
        >>> from aprfast.torch import save_model, load_model
        >>> save_model(torch.nn.Linear(2, 1), "linear.apr")
        >>> load_model(torch.nn.Linear(2, 1), "linear.apr")
        (set(), [])
    """
    check_metadata(metadata)
    state = model.state_dict()
    records = {}  # other name -> the name it shares memory with, safetensors' record
    for kept, dropped in _views_to_drop(state).items():
        for name in dropped:
            records[name] = kept
            del state[name]
    for group in _overlapping_groups(state):  # ties left: every name stays, pointing at one storage
        records.update({name: group[0] for name in group[1:]})
    if records:
        metadata = {**records, **(metadata or {})}  # the caller's own keys win
    save_file(state, filename, metadata, **options)


def load_model(model, filename, strict: bool = True, device="cpu", *, backend: str = "mmap") -> tuple:
    """Load ``filename`` into ``model``; return ``(missing, unexpected)`` as safetensors
    does (a set of the model's names nothing in the file filled, a list of the file's
    names the model did not take).  With ``strict`` either being non-empty raises
    RuntimeError naming them.

    The model's tied names are filled from whichever of them the file holds.  When the
    file holds two tied names with different values, loading both would silently keep
    the last; the extra one is reported as unexpected instead (safetensors does the same
    for any second name of a tie).

    Args:
        model: A ``torch.nn.Module``.
        filename: The path to read.
        strict: Raise when a name is missing or unexpected.
        device: Where the tensors are loaded, as for :func:`load_file`.
        backend: "mmap", "pread" or "direct".

    Returns:
        ``(missing, unexpected)``: a set and a list of names.

    Raises:
        RuntimeError: ``strict`` and a name is missing or unexpected.
        AprFileNotFoundError: ``filename`` does not exist.
        FormatError: Not an ``.apr`` file.

    Examples:
        >>> import torch
        >>> from aprfast.torch import save_file, load_model
        >>> save_file({"weight": torch.ones(1, 2)}, "partial.apr")
        >>> load_model(torch.nn.Linear(2, 1), "partial.apr", strict=False)
        ({'bias'}, [])
    """
    state = load_file(filename, device=device, backend=backend)
    model_state = model.state_dict()
    groups = _overlapping_groups(model_state)
    _drop_ties_the_model_lacks(state, api.inspect(filename).get("metadata") or {}, model_state, groups)
    result = model.load_state_dict(state, strict=False)
    missing, unexpected = set(result.missing_keys), list(result.unexpected_keys)
    for group in groups:
        present = [name for name in group if name in state]
        missing -= _filled_through_sharing(model_state, group, present)
        unexpected += _conflicting_ties(model_state, state, present)
    if strict and (missing or unexpected):
        error = f"Error(s) in loading state_dict for {type(model).__name__}:"
        if missing:
            error += "\n    Missing key(s) in state_dict: " + ", ".join(f'"{k}"' for k in sorted(missing))
        if unexpected:
            error += "\n    Unexpected key(s) in state_dict: " + ", ".join(f'"{k}"' for k in sorted(unexpected))
        raise RuntimeError(error)
    return missing, unexpected


def _drop_ties_the_model_lacks(state: dict, metadata: dict, model_state: dict, groups: list) -> None:
    """A name the file records as a tie (``{dropped: kept}``, :func:`save_model`'s and
    safetensors' record) stands for ``kept``'s bytes only in a model that ties the two
    too.  safetensors' file does not hold such a name at all, so a model without the tie
    finds it missing (and ``strict`` raises); the same is done here instead of filling an
    untied parameter with another one's values."""
    tied = {name: i for i, group in enumerate(groups) for name in group}
    for dropped, kept in metadata.items():
        if not (isinstance(kept, str) and dropped != kept and dropped in state and kept in state):
            continue
        if dropped in model_state and kept in model_state and tied.get(dropped, -1) != tied.get(kept, -2):
            del state[dropped]


# --- shared memory -------------------------------------------------------------------
def _extent(tensor):
    """``(first, end)`` byte addresses a strided tensor touches, or None for no bytes."""
    if tensor.device.type == "meta" or tensor.numel() == 0:
        return None
    reach = sum((size - 1) * step for size, step in zip(tensor.shape, tensor.stride()))
    first = tensor.data_ptr()
    return first, first + (reach + 1) * tensor.element_size()


def _overlapping_groups(tensors: dict) -> list:
    """Sorted name lists whose bytes overlap within one storage (one list per group of
    two or more); tensors in different storages or disjoint parts of one are apart."""
    by_storage = defaultdict(list)
    for name, tensor in tensors.items():
        extent = _extent(tensor)
        if extent is not None:
            by_storage[(tensor.device, tensor.untyped_storage().data_ptr())].append((*extent, name))
    groups = []
    for extents in by_storage.values():
        extents.sort()
        group, end = [], None
        for first, stop, name in extents:
            if group and first < end:
                group.append(name)
                end = max(end, stop)
                continue
            if len(group) > 1:
                groups.append(sorted(group))
            group, end = [name], stop
        if len(group) > 1:
            groups.append(sorted(group))
    return groups


def _same_tensor(a, b) -> bool:
    """One tensor under two names: the same bytes read the same way."""
    return (a.data_ptr() == b.data_ptr() and a.dtype == b.dtype and a.shape == b.shape
            and a.stride() == b.stride())


def _covers(whole, part) -> bool:
    outer, inner = _extent(whole), _extent(part)
    return outer is not None and inner is not None and outer[0] <= inner[0] and inner[1] <= outer[1]


def _is_whole_storage(tensor) -> bool:
    storage = tensor.untyped_storage()
    return (tensor.data_ptr() == storage.data_ptr() and tensor.is_contiguous()
            and tensor.numel() * tensor.element_size() == storage.nbytes())


def _views_to_drop(state: dict) -> dict:
    """For save_model: in each group of overlapping names that are not all one tensor,
    the name kept (the first whole-storage tensor) -> the other names, views of it."""
    drop = {}
    for group in _overlapping_groups(state):
        if all(_same_tensor(state[group[0]], state[name]) for name in group[1:]):
            continue  # tied: stored once under every name
        whole = [name for name in group if _is_whole_storage(state[name])]
        if not whole:
            raise RuntimeError(f"tensors {group} share memory and none of them is the whole storage; "
                               "save .clone()s of the ones to keep")
        kept = whole[0]
        drop[kept] = [name for name in group if not _same_tensor(state[name], state[kept])]
    return drop


def _filled_through_sharing(model_state: dict, group: list, present: list) -> set:
    """The names of one group of the model's shared memory that need no tensor of their
    own: those inside the bytes of a name the file filled, or, when the file has none of
    them, inside the first whole tensor's, which alone is then reported missing (as
    safetensors reports one name per tie)."""
    holders = present or [next((name for name in group if _is_whole_storage(model_state[name])), group[0])]
    return {name for name in group if name not in holders
            and any(_covers(model_state[holder], model_state[name]) for holder in holders)}


def _conflicting_ties(model_state: dict, state: dict, present: list) -> list:
    """Names the model ties (one tensor) that the file holds with other values than the
    first of them: loading both would leave whichever came last."""
    if len(present) < 2:
        return []
    first = present[0]
    return [name for name in present[1:]
            if _same_tensor(model_state[first], model_state[name])
            and not (state[first].data_ptr() == state[name].data_ptr() or _equal_bits(state[first], state[name]))]


def _equal_bits(a, b) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)) if a.numel() else True


def load(data, device="cpu", *, verify: bool = True) -> dict:
    """Every tensor of the file held in ``data`` (bytes-like), as torch tensors.

    Args:
        data: The file's bytes.
        device: Where the tensors go.
        verify: Check the whole-file CRC.

    Returns:
        A dict of name to torch.Tensor.

    Raises:
        FormatError: Not an ``.apr`` file.
        ChecksumError: The CRC does not match (``verify``).

    Examples:
        >>> import torch
        >>> from aprfast.torch import save, load
        >>> load(save({"w": torch.tensor([1.5])}))
        {'w': tensor([1.5000])}
    """
    with AprFile(data) as f:
        return _to_torch(f, f.load_all(verify=verify), device)


def _to_numpy(tensors) -> dict:
    """The tensors as the writer's inputs, after safetensors' checks (a dict; every value a
    dense torch.Tensor; no names overlapping in memory without being one tensor).  One
    tensor under several names becomes one array, which the writer stores once."""
    _check_tensors(tensors)
    converted, out = {}, {}
    for name, tensor in tensors.items():
        key = (tensor.device, tensor.data_ptr(), tensor.dtype, tuple(tensor.shape), tensor.stride())
        if tensor.numel() == 0 or key not in converted:
            converted[key] = from_torch(name, tensor)
        out[name] = converted[key]
    return out


def _check_tensors(tensors) -> None:
    if not isinstance(tensors, dict):
        raise ValueError(f"Expected a dict of [str, torch.Tensor] but received {type(tensors)}")
    check_names(tensors)
    for name, tensor in tensors.items():
        if not isinstance(tensor, torch.Tensor):
            raise ValueError(f"Key `{name}` is invalid, expected torch.Tensor but received {type(tensor)}")
    sparse = [name for name, tensor in tensors.items() if tensor.layout != torch.strided]
    if sparse:
        raise ValueError(f"You are trying to save a sparse tensors: `{sparse}` which this library does not "
                         "support. You can make it a dense tensor before saving with `.to_dense()` but be "
                         "aware this might make a much larger file than needed.")
    for group in _overlapping_groups(tensors):
        if not all(_same_tensor(tensors[group[0]], tensors[name]) for name in group[1:]):
            raise RuntimeError(f"Some tensors share memory without being one tensor: {group}. Storing them "
                               "would copy the shared bytes once per name and lose the sharing on load; "
                               "save .clone()s, or use aprfast.torch.save_model, which keeps the whole tensor "
                               "and records the views in the metadata.")


def _to_torch(file, arrays, device) -> dict:
    return {name: _array_to_torch(name, a, file.info(name).dtype, device) for name, a in arrays.items()}


def _array_to_torch(name, array, dtype, device):
    return to_framework(name, array, dtype, "torch", device)
