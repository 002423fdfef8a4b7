"""Decode many compressed-tensor blocks, the pure twin of ``aprfast._blocks``: raw
copies and LZ4 blocks (aprfast._pure._lz4block).  zstd frames are the compiled
module's only when it finds the system's libzstd; this twin behaves as that module
does without one (:func:`zstd_native` is False and a zstd block reports so), and
aprfast.codecs.blocks decodes them with the ``zstandard`` package instead.
"""

from __future__ import annotations

import numpy as np

from . import _lz4block
from ._views import typed_view

COPY = 0
LZ4 = 1
ZSTD = 2

_COPY_SIZE = -16
_BAD_CODEC = -15
_ZSTD_MISSING = -12

_MESSAGES = {
    -1: "the LZ4 block ends inside a sequence",
    -2: "the LZ4 block describes more bytes than the block holds",
    -3: "an LZ4 match refers to before the start of the block",
    -4: "the LZ4 block ends before the block's size is reached",
    -12: "no libzstd could be loaded",
    -13: "no zstd decoder context could be allocated",
    -15: "unknown codec",
    -16: "a raw block's stored and raw sizes differ",
}


def zstd_native() -> bool:
    """False: no zstd frame is decoded here (the compiled module's libzstd path)."""
    return False


def decode_blocks(src, src_off, src_len, dst, dst_off, dst_len, codec, threads=0):
    """Decode block ``k`` from ``src[src_off[k]:+src_len[k]]`` into exactly
    ``dst[dst_off[k]:+dst_len[k]]`` with ``codec[k]`` (COPY, LZ4 or ZSTD), for every k.

    Returns None, or ``(k, message)`` for the first block that failed.  Every range is
    checked against its buffer first."""
    s = typed_view(src, np.uint8)
    d = typed_view(dst, np.uint8, writable=True)
    jobs = [typed_view(a, np.uint64) for a in (src_off, src_len, dst_off, dst_len)]
    codes = typed_view(codec, np.uint8)
    n = jobs[0].shape[0]
    if any(a.shape[0] != n for a in jobs[1:]) or codes.shape[0] != n:
        raise ValueError("decode_blocks: the job arrays differ in length")
    so, sl, do, dl = (a.tolist() for a in jobs)
    slen, dlen = s.shape[0], d.shape[0]
    for k in range(n):
        if so[k] > slen or sl[k] > slen - so[k]:
            raise ValueError(f"decode_blocks: block {k} lies outside the {slen} source bytes")
        if do[k] > dlen or dl[k] > dlen - do[k]:
            raise ValueError(f"decode_blocks: block {k} lies outside the {dlen} output bytes")
    sv, dv = memoryview(s), memoryview(d)
    for k, code in enumerate(codes.tolist()):
        block, out = sv[so[k]:so[k] + sl[k]], dv[do[k]:do[k] + dl[k]]
        rc, where = _decode_one(code, block, out)
        if rc:
            return k, _message(rc, where, sl[k])
    return None


def _decode_one(code: int, block: memoryview, out: memoryview) -> tuple:
    """(0, 0) once ``out`` holds the block's bytes, else (error code, input byte)."""
    if code == COPY:
        if len(block) != len(out):
            return _COPY_SIZE, 0
        out[:] = block
        return 0, 0
    if code == LZ4:
        return _lz4block.decode(block, out)
    if code == ZSTD:
        return _ZSTD_MISSING, 0
    return _BAD_CODEC, 0


def _message(rc: int, where: int, srclen: int) -> str:
    text = _MESSAGES.get(rc, f"error {rc}")
    if rc in (-1, -2, -3, -4):
        text += f" (at input byte {where} of {srclen})"
    return text
