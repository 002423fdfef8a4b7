"""Tensors allocated on a torch device and filled from an open file through two staging
buffers (pinned for CUDA), so a model never sits in pageable CPU memory first.

Used by :func:`aprfast.torch.load_file` and ``safe_open(..., device=...)``; torch is
imported by the calls, not by this module, so the file layer stays importable without it.
"""

from __future__ import annotations

from .._crc import crc32
from ..errors import ChecksumError
from .frameworks import to_framework, torch_meta

#: Two staging buffers of this size (pinned for CUDA): the file is read into one while
#: the other's copy to the device runs, so the model never sits in pageable memory.
STAGING_BYTES = 64 << 20


def load_to_device(file, device, *, verify: bool = True, staging_bytes: int = STAGING_BYTES) -> dict:
    """Every tensor of an open AprFile, allocated on ``device`` and filled from the file
    through two staging buffers, the reads overlapping the copies (CUDA: pinned buffers,
    asynchronous copies, one event per buffer).  The data section is read once, in
    order, with the whole-file CRC checked on the way unless ``verify=False``; a
    mismatch raises ChecksumError after the copies, before anything is returned.

    Args:
        file: An open :class:`aprfast.AprFile` (``mode="pread"`` reads without mapping).
        device: A torch device ("cpu", "cuda:0", an int, a ``torch.device``).
        verify: Check the whole-file CRC on the way.
        staging_bytes: Size of each of the two staging buffers.

    Returns:
        A dict of name to torch.Tensor on ``device``.

    Raises:
        ChecksumError: ``verify`` and the CRC does not match.
        TypeError: A tensor of a dtype torch cannot hold (packed types).
        AprIOError: A read failed.

    Examples:
        >>> import torch, aprfast
        >>> from aprfast.torch import save_file, load_to_device
        >>> save_file({"w": torch.ones(2)}, "model.apr")
        >>> with aprfast.open("model.apr", mode="pread") as f:
        ...     load_to_device(f, "cpu")
        {'w': tensor([1., 1.])}
    """
    import torch

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
    crc = stream_into(source, start, length, pieces, device, crc, max(1, min(staging_bytes, length)))
    if verify and crc != parsed.stored_crc:
        raise ChecksumError(f"footer CRC32 is {parsed.stored_crc:#010x} but the file's bytes give {crc:#010x}",
                            path=file.path)
    return tensors


def tensor_to_device(file, name: str, device, *, staging_bytes: int = STAGING_BYTES):
    """One tensor of an open AprFile, allocated on ``device`` and filled from the file
    through the staging buffers :func:`load_to_device` uses (pinned for CUDA), so it never
    sits in pageable memory: ``safe_open(..., device="cuda:0").get_tensor``.  A
    compressed tensor (its stored bytes are not its values) is decoded on the CPU first.

    Args:
        file: An open :class:`aprfast.AprFile`.
        name: The tensor's name.
        device: A torch device.
        staging_bytes: Size of each staging buffer.

    Returns:
        A torch.Tensor on ``device``.

    Raises:
        TensorNotFoundError: The file has no tensor ``name``.
        TypeError: A dtype torch cannot hold (packed types).
        AprIOError: A read failed.

    Examples:
        >>> import torch, aprfast
        >>> from aprfast.torch import save_file, tensor_to_device
        >>> save_file({"w": torch.arange(3)}, "model.apr")
        >>> with aprfast.open("model.apr") as f:
        ...     tensor_to_device(f, "w", "cpu")
        tensor([0, 1, 2])
    """
    import torch

    device = torch.device(device)
    info = file.info(name)
    if file._file.codec(name):
        return to_framework(name, file.get_tensor(name), info.dtype, "torch", device)
    like = torch_meta(name, info)  # shape and dtype, or the reason torch can't hold it
    tensor = torch.empty(like.shape, dtype=like.dtype, device=device)
    if info.nbytes:
        piece = (0, info.nbytes, tensor.reshape(-1).view(torch.uint8))
        stream_into(file._source, info.offset, info.nbytes, [piece], device, None,
                     max(1, min(staging_bytes, info.nbytes)))
    return tensor


def stream_into(source, start, length, pieces, device, crc, step):
    """Read ``[start, start + length)`` in ``step``-byte chunks through two staging
    buffers and copy each chunk's bytes into the tensors (``pieces``: sorted, disjoint
    ``(offset in the data section, size, byte view)``) that it overlaps."""
    import torch

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
