"""LZ4 block decoder, the twin of csrc/lz4block.c (same checks, same codes, same
``where``).  A block is a run of sequences::

    token (high nibble: literal length, low nibble: match length - 4)
    [literal length extension bytes] literals
    offset (u16 LE) [match length extension bytes]

where a nibble of 15 continues in the following bytes, each added, until one is below
255; the last sequence has literals only and ends exactly at the block's end.
"""

from __future__ import annotations

OK = 0
TRUNCATED = -1
OUTPUT_OVERFLOW = -2
BAD_OFFSET = -3
SHORT_OUTPUT = -4


def _extension(src, ip: int, end: int, length: int):
    """Add extension bytes to ``length`` while they are 255: (new ip, length) or None if the input ends."""
    while True:
        if ip >= end:
            return None
        b = src[ip]
        ip += 1
        length += b
        if b != 255:
            return ip, length


def _copy_match(dst, op: int, offset: int, length: int) -> None:
    """Copy ``length`` bytes from ``offset`` back; an overlap repeats the pattern."""
    start = op - offset
    if offset >= length:
        dst[op:op + length] = dst[start:start + length]
        return
    done = 0
    while done < length:  # the pattern available doubles each round
        n = min(length - done, offset + done)
        dst[op + done:op + done + n] = dst[start:start + n]
        done += n


def decode(src, dst) -> tuple:
    """Decode the block ``src`` into all of ``dst`` (byte memoryviews); return (code, input bytes consumed)."""
    ip, iend = 0, len(src)
    op, oend = 0, len(dst)
    while True:
        if ip >= iend:
            return TRUNCATED, ip
        token = src[ip]
        ip += 1
        lit = token >> 4
        if lit == 15:
            got = _extension(src, ip, iend, lit)
            if got is None:
                return TRUNCATED, ip  # the C leaves ip before the extension
            ip, lit = got
        if lit > iend - ip:
            return TRUNCATED, ip
        if lit > oend - op:
            return OUTPUT_OVERFLOW, ip
        dst[op:op + lit] = src[ip:ip + lit]
        ip += lit
        op += lit
        if ip == iend:  # the last sequence: literals only
            return (OK if op == oend else SHORT_OUTPUT), ip
        if iend - ip < 2:
            return TRUNCATED, ip
        offset = src[ip] | (src[ip + 1] << 8)
        ip += 2
        if offset == 0 or offset > op:
            return BAD_OFFSET, ip
        mlen = token & 15
        if mlen == 15:
            got = _extension(src, ip, iend, mlen)
            if got is None:
                return TRUNCATED, ip
            ip, mlen = got
        mlen += 4
        if mlen > oend - op:
            return OUTPUT_OVERFLOW, ip
        _copy_match(dst, op, offset, mlen)
        op += mlen
