"""torch tensors in and out: ``aprfast.torch.save_file/save/load_file/load``.

A thin adapter over the NumPy API (torch is an optional extra), with the signatures
of ``safetensors.torch``.  Tensors are moved to the CPU and made contiguous before
saving; bf16 and float8 travel as their raw bits, so ml_dtypes is not needed for
them.  ``load_file`` gives writable tensors over a private copy-on-write map by
default, or owned memory with ``backend="pread"``, on ``device``.
"""

from __future__ import annotations

import torch

from . import api
from ._crc import crc32
from .errors import ChecksumError
from .frameworks import from_torch, to_framework, torch_meta
from .reader import AprFile

__all__ = ["save_file", "save", "load_file", "load", "save_model", "load_model", "load_to_device"]


def save_file(tensors, filename, metadata=None, **options) -> None:
    api.save_file(_to_numpy(tensors), filename, metadata, **options)


def save(tensors, metadata=None, **options) -> bytes:
    return api.save(_to_numpy(tensors), metadata, **options)


def load_file(filename, device="cpu", *, backend: str = "mmap", verify: bool = True) -> dict:
    """Every tensor of ``filename`` on ``device``, writable.

    ``backend="mmap"`` (the default, as in safetensors) gives CPU tensors over a private
    copy-on-write map: no copy, writes never reach the file.  ``backend="pread"`` reads
    the data section into one owned buffer with parallel ``pread``.  The whole-file CRC
    is checked unless ``verify=False``.  ``device="meta"`` reads only the index: tensors
    with shapes and dtypes and no data.  Any other device (``"cuda:0"``, ``0``) gets
    tensors allocated there and filled through pinned staging buffers, reads overlapping
    copies (:func:`load_to_device`); the model is never built in CPU memory first."""
    if str(device) == "meta":
        return _meta_tensors(filename)
    target = torch.device(device)
    if target.type != "cpu":
        with AprFile(filename, mode="pread") as f:
            return load_to_device(f, target, verify=verify)
    if backend == "mmap":
        with AprFile(filename, mode="private", verify=verify) as f:
            return _to_torch(f, f.tensors(), device)
    if backend != "pread":
        raise ValueError(f"backend must be 'mmap' or 'pread', not {backend!r}")
    with AprFile(filename, mode="pread") as f:
        return _to_torch(f, f.load_all(verify=verify), device)


#: Two staging buffers of this size (pinned for CUDA): the file is read into one while
#: the other's copy to the device runs, so the model never sits in pageable memory.
STAGING_BYTES = 64 << 20


def load_to_device(file, device, *, verify: bool = True, staging_bytes: int = STAGING_BYTES) -> dict:
    """Every tensor of an open AprFile, allocated on ``device`` and filled from the file
    through two staging buffers, the reads overlapping the copies (CUDA: pinned buffers,
    asynchronous copies, one event per buffer).  The data section is read once, in
    order, with the whole-file CRC checked on the way unless ``verify=False``; a
    mismatch raises ChecksumError after the copies, before anything is returned."""
    device = torch.device(device)
    parsed, source = file._file, file._source
    start, length = parsed.data_start, parsed.data_len
    tensors, pieces = {}, []
    for name in file.keys():
        info = file.info(name)
        tensor = torch_meta(name, info)  # shape and dtype, or the reason torch can't hold it
        tensor = torch.empty(tensor.shape, dtype=tensor.dtype, device=device)
        tensors[name] = tensor
        if info.nbytes:
            pieces.append((info.offset - start, info.nbytes, tensor.reshape(-1).view(torch.uint8)))
    pieces.sort(key=lambda piece: piece[0])
    crc = crc32(source.read(0, start, "header")) if verify else None
    crc = _stream_into(source, start, length, pieces, device, crc, max(1, min(staging_bytes, length)))
    if verify and crc != parsed.stored_crc:
        raise ChecksumError(f"footer CRC32 is {parsed.stored_crc:#010x} but the file's bytes give {crc:#010x}",
                            path=file.path)
    return tensors


def _stream_into(source, start, length, pieces, device, crc, step):
    """Read ``[start, start + length)`` in ``step``-byte chunks through two staging
    buffers and copy each chunk's bytes into the tensors (``pieces``: sorted, disjoint
    ``(offset in the data section, size, byte view)``) that it overlaps."""
    cuda = device.type == "cuda"
    staging = [torch.empty(step, dtype=torch.uint8, pin_memory=cuda) for _ in range(2)]
    done = [None, None]  # the event after each buffer's last copy (CUDA)
    first = 0  # the first piece not yet wholly copied
    for k, at in enumerate(range(0, length, step)):
        n = min(step, length - at)
        slot = k % 2
        if done[slot] is not None:
            done[slot].synchronize()  # that buffer's previous copies have finished
        chunk = staging[slot][:n]
        crc = source.readinto(start + at, chunk.numpy(), crc=crc)
        i = first
        while i < len(pieces) and pieces[i][0] < at + n:
            offset, size, dst = pieces[i]
            lo, hi = max(offset, at), min(offset + size, at + n)
            if lo < hi:
                dst[lo - offset:hi - offset].copy_(chunk[lo - at:hi - at], non_blocking=cuda)
            if offset + size <= at + n:
                first = i + 1 if i == first else first
            i += 1
        if cuda:
            done[slot] = torch.cuda.Event()
            done[slot].record()
    if cuda:
        torch.cuda.synchronize(device)
    return crc


def _meta_tensors(path) -> dict:
    with AprFile(path) as f:
        return {name: torch_meta(name, f.info(name)) for name in f.keys()}


def save_model(model, filename, metadata=None, force_contiguous: bool = False, **options) -> None:
    """Save ``model.state_dict()`` to ``filename``.  Parameters that are one storage
    under several names (tied embeddings) are stored once, every name pointing at the
    same bytes (the spec layout; see docs/FORMAT.md).  ``force_contiguous`` is accepted
    for safetensors' signature: tensors are always made contiguous."""
    save_file(model.state_dict(), filename, metadata, **options)


def load_model(model, filename, strict: bool = True, device="cpu") -> tuple:
    """Load ``filename`` into ``model`` with ``load_state_dict``; return ``(missing,
    unexpected)`` key lists.  With ``strict`` either being non-empty raises RuntimeError
    naming the keys, as torch's ``load_state_dict`` does.  Tied parameters stay tied:
    the model's own sharing is kept, and both names are filled from one storage."""
    state = load_file(filename, device=device)
    result = model.load_state_dict(state, strict=False)
    missing, unexpected = list(result.missing_keys), list(result.unexpected_keys)
    if strict and (missing or unexpected):
        parts = []
        if missing:
            parts.append("Missing key(s) in state_dict: " + ", ".join(f'"{k}"' for k in missing) + ".")
        if unexpected:
            parts.append("Unexpected key(s) in state_dict: " + ", ".join(f'"{k}"' for k in unexpected) + ".")
        raise RuntimeError(f"Error(s) in loading state_dict for {type(model).__name__}:\n\t" + "\n\t".join(parts))
    return missing, unexpected


def load(data, device="cpu", *, verify: bool = True) -> dict:
    with AprFile(data) as f:
        return _to_torch(f, f.load_all(verify=verify), device)


def _to_numpy(tensors) -> dict:
    return {name: from_torch(name, t) for name, t in tensors.items()}


def _to_torch(file, arrays, device) -> dict:
    return {name: _array_to_torch(name, a, file.info(name).dtype, device) for name, a in arrays.items()}


def _array_to_torch(name, array, dtype, device):
    return to_framework(name, array, dtype, "torch", device)
