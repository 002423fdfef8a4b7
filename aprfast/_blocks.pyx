# cython: language_level=3, boundscheck=False, wraparound=False, freethreading_compatible=True
"""Decode many compressed-tensor blocks at once in C, GIL released, over threads
(csrc/blockdec.c): raw copies, LZ4 blocks, and zstd frames through the system's
libzstd when it can be loaded (:func:`zstd_native`)."""

from libc.stdint cimport uint8_t, uint64_t
from libc.stdlib cimport free, malloc

cdef extern from "blockdec.h" nogil:
    ctypedef struct apr_block_job:
        const uint8_t *src
        size_t srclen
        uint8_t *dst
        size_t dstlen
        int codec
        int rc
        size_t where
    int apr_zstd_available()
    const char *apr_zstd_error_name(size_t code)
    Py_ssize_t apr_decode_blocks(apr_block_job *jobs, size_t n, int nthreads)

COPY = 0
LZ4 = 1
ZSTD = 2

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
    """True when zstd blocks are decoded in C by the system's libzstd (loaded with
    dlopen; the build needs no zstd headers)."""
    return bool(apr_zstd_available())


def decode_blocks(src, const uint64_t[::1] src_off, const uint64_t[::1] src_len, dst,
                  const uint64_t[::1] dst_off, const uint64_t[::1] dst_len, const uint8_t[::1] codec,
                  int threads=0):
    """Decode block ``k`` from ``src[src_off[k]:+src_len[k]]`` into exactly
    ``dst[dst_off[k]:+dst_len[k]]`` with ``codec[k]`` (COPY, LZ4 or ZSTD), for every k.

    Returns None, or ``(k, message)`` for the first block that failed (later blocks may
    have been written).  Every range is checked against its buffer first."""
    cdef const uint8_t[::1] s = src
    cdef uint8_t[::1] d = dst
    cdef size_t n = src_off.shape[0], k, slen = s.shape[0], dlen = d.shape[0]
    if (<size_t>src_len.shape[0] != n or <size_t>dst_off.shape[0] != n or <size_t>dst_len.shape[0] != n
            or <size_t>codec.shape[0] != n):
        raise ValueError("decode_blocks: the job arrays differ in length")
    for k in range(n):
        if src_off[k] > slen or src_len[k] > slen - src_off[k]:
            raise ValueError(f"decode_blocks: block {k} lies outside the {slen} source bytes")
        if dst_off[k] > dlen or dst_len[k] > dlen - dst_off[k]:
            raise ValueError(f"decode_blocks: block {k} lies outside the {dlen} output bytes")
    if n == 0:
        return None
    cdef apr_block_job *jobs = <apr_block_job *>malloc(n * sizeof(apr_block_job))
    if jobs == NULL:
        raise MemoryError(f"cannot allocate {n} block jobs")
    cdef const uint8_t *sp = &s[0] if slen else NULL
    cdef uint8_t *dp = &d[0] if dlen else NULL
    cdef Py_ssize_t bad
    try:
        for k in range(n):
            jobs[k].src = sp + src_off[k]
            jobs[k].srclen = src_len[k]
            jobs[k].dst = dp + dst_off[k]
            jobs[k].dstlen = dst_len[k]
            jobs[k].codec = codec[k]
        with nogil:
            bad = apr_decode_blocks(jobs, n, threads)
        if bad < 0:
            return None
        return bad, _message(jobs[bad].rc, jobs[bad].where, jobs[bad].srclen, jobs[bad].dstlen)
    finally:
        free(jobs)


cdef object _message(int rc, size_t where, size_t srclen, size_t dstlen):
    if rc == -10:
        return f"zstd refused the frame: {apr_zstd_error_name(where).decode('utf-8', 'replace')}"
    if rc == -11:
        return f"the zstd frame decodes to {where} bytes, not the block's {dstlen}"
    if rc == -14:
        return f"the block is not exactly one zstd frame (the first frame takes {where} of its {srclen} bytes)"
    text = _MESSAGES.get(rc, f"error {rc}")
    if rc in (-1, -2, -3, -4):
        text += f" (at input byte {where} of {srclen})"
    return text
