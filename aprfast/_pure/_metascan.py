"""Guards in front of the metadata decoders, the pure twin of ``aprfast._metascan``:
csrc/metascan.c written in Python, with the same checks, error offsets, messages and
memory estimate (every constant of the cost model is explained there).

A walk builds nothing: it checks the syntax, bounds the nesting with an explicit stack
(never recursion), and adds up an upper bound of what ``msgpack.unpackb`` or
``json.loads`` would allocate at their peak.  The caller refuses a block whose estimate
is over :func:`budget` before any object is built.  Strings are checked and measured by
Python's strict UTF-8 decoder (the rule csrc/utf8.h implements), and runs of values
that cost the same (a hostile block's millions of ``[]``) are counted in bulk; both
give the same result the byte-at-a-time walk of the C gives.
"""

from __future__ import annotations

import codecs
import re

import numpy as np

from .. import limits
from ..errors import CorruptError, LimitError

MiB = 1 << 20
#: Containers open at once (msgpack's own limit is 1024).
MAX_DEPTH = 1024

_MSGPACK_KINDS = ("nothing", "map", "array", "str", "bin", "int", "float", "bool", "nil", "ext", "unknown byte")
_JSON_KINDS = ("nothing", "object", "array", "string", "bin", "number", "number", "boolean", "null", "ext",
               "unknown token")
NONE, MAP, ARRAY, STR, BIN, INT, FLOAT, BOOL, NIL, EXT, UNKNOWN = range(11)
OK, NOT_MAP, INVALID, TOO_DEEP = range(4)

# --- the cost model (csrc/metascan.c) ----------------------------------------------------
STR_ASCII_HEAD = 48
STR_WIDE_HEAD = 72
LIST_HEAD = 56
DICT_HEAD = 64
KEYS_HEAD = 40
KEYS_ENTRY = 24
INT_HEAD = 24
FLOAT_SIZE = 24
BYTES_HEAD = 33
EXT_EXTRA = 256
INTERNED_BEFORE = 16384
_U64 = (1 << 64) - 1


def alloc_cost(n: int) -> int:
    """Bytes an allocation of n takes: pymalloc's 16-byte classes, a malloc chunk, or whole pages."""
    if n <= 512:
        return (n + 15) & ~15
    if n < (128 << 10):
        return (n + 8 + 15) & ~15
    return (n + 16 + 4095) & ~4095


def with_overhead(n: int) -> int:
    return n + n // 64


def str_cost(chars: int, kind: int) -> int:
    """kind: 0 ASCII, else bytes per character (1, 2, 4)."""
    if kind == 0:
        return alloc_cost(STR_ASCII_HEAD + chars + 1)
    return alloc_cost(STR_WIDE_HEAD + (chars + 1) * kind)


def int_cost(digits30: int) -> int:
    return alloc_cost(INT_HEAD + 4 * (digits30 or 1))


def small_int(negative: bool, magnitude: int) -> bool:
    """CPython keeps one object for each int in [-5, 256]."""
    return magnitude <= 5 if negative else magnitude <= 256


def list_cost(n: int, appended: bool) -> int:
    cost = alloc_cost(LIST_HEAD)
    if n:
        cost += alloc_cost(8 * (n + (n >> 3) + 6 if appended else n))
    return cost


def dict_log2(n: int) -> int:
    """log2 of the key table of a dict of n entries: grown by doubling, or presized."""
    grown = presized = 3
    want = (3 * n + 1) // 2
    while (1 << (grown + 1)) // 3 < n:
        grown += 1
    while (1 << presized) < want:
        presized += 1
    return max(grown, presized)


def keys_cost(log2: int) -> int:
    size = 1 << log2
    usable = (size << 1) // 3
    index_bytes = 1 if log2 < 8 else 2 if log2 < 16 else 4 if log2 < 32 else 8
    return alloc_cost(KEYS_HEAD + index_bytes * size + KEYS_ENTRY * usable)


def dict_cost(n: int) -> int:
    return alloc_cost(DICT_HEAD) + (keys_cost(dict_log2(n)) if n else 0)


def dict_transient(n: int) -> int:
    """While a dict grows past its last table, the old table is still alive."""
    s = dict_log2(n)
    return keys_cost(s - 1) if s > 3 else 0


def key_cache_cost(keys: int, interned: bool) -> int:
    """The decoder's key cache after ``keys`` distinct map keys."""
    if not keys:
        return 0
    if interned:
        keys += INTERNED_BEFORE
    s = dict_log2(keys)
    return alloc_cost(DICT_HEAD) + keys_cost(s) + (keys_cost(s - 1) if s > 3 else 0)


def writer_extra(units: int, chars: int, kind: int) -> int:
    """The peak of a _PyUnicodeWriter building the str, less the final str."""
    k = kind or 1
    narrower = k // 2 if k >= 2 else 1
    peak = alloc_cost(STR_WIDE_HEAD + (units + 1) * k) + alloc_cost(STR_WIDE_HEAD + (units + 1) * narrower)
    final = str_cost(chars, kind)
    return peak - final if peak > final else 0


def cp_kind(c: int) -> int:
    return 0 if c < 0x80 else 1 if c < 0x100 else 2 if c < 0x10000 else 4


# Each byte of valid UTF-8 by what it says of its character: a lead byte of a
# Latin-1 character (C2, C3), of a BMP one (C4-EF) or of an astral one (F0-F4).
_CLASS = bytes(1 if b in (0xC2, 0xC3) else 2 if 0xC4 <= b <= 0xEF else 4 if 0xF0 <= b <= 0xF4 else 0
               for b in range(256))
_STEP = 1 << 16  # bytes decoded at once: bounds what a walk allocates for one string


def _decode(raw: memoryview) -> str:
    """Strict UTF-8 straight from the buffer (``str(view, "utf-8")`` would copy it first)."""
    return codecs.utf_8_decode(raw, "strict", True)[0]


def _utf8_counts(raw: memoryview):
    """(characters, Latin-1, BMP, astral) of valid UTF-8 ``raw``, or the offset of its first
    invalid sequence.  Python's strict decoder is csrc/utf8.h's rule; a long string is
    decoded a step at a time, so nothing near its size is built."""
    if len(raw) <= _STEP:
        try:
            text = _decode(raw)
        except UnicodeDecodeError as exc:
            return exc.start
        if text.isascii():
            return len(text), 0, 0, 0
        classes = bytes(raw).translate(_CLASS)
        return len(text), classes.count(1), classes.count(2), classes.count(4)
    decoder = codecs.getincrementaldecoder("utf-8")()
    chars = latin1 = bmp = astral = 0
    for start in range(0, len(raw), _STEP):
        piece = raw[start:start + _STEP]
        pending = len(decoder.getstate()[0])  # the start of a sequence the last step cut
        try:
            chars += len(decoder.decode(piece, final=start + _STEP >= len(raw)))
        except UnicodeDecodeError as exc:
            return start - pending + exc.start
        classes = bytes(piece).translate(_CLASS)
        latin1, bmp, astral = latin1 + classes.count(1), bmp + classes.count(2), astral + classes.count(4)
    return chars, latin1, bmp, astral


class _Refused(Exception):
    """Ends a walk: INVALID (with a reason) or TOO_DEEP at a byte offset."""

    def __init__(self, status: int, at: int, why=None):
        super().__init__(why)
        self.status, self.at, self.why = status, at, why


def _invalid(at, why):
    return _Refused(INVALID, at, why)


KEY_CACHE_SLOTS = 4096
KEY_CACHE_MAX_LEN = 256
_FNV_OFFSET, _FNV_PRIME = 1469598103934665603, 1099511628211


class _Walker:
    """What one walk has counted so far (csrc/metascan.c's walker)."""

    def __init__(self, buf: memoryview, max_depth: int):
        self.buf, self.len, self.pos, self.max_depth = buf, len(buf), 0, max_depth
        self.data = np.frombuffer(buf, np.uint8)  # the same bytes, for comparisons in bulk
        self.key_cache = {}  # slot -> (offset, length) of the key last seen there
        self.objects = self.transient = self.keys = 0
        self.text_latin1 = self.text_bmp = self.text_astral = self.text_nonascii_bytes = 0
        self.tr_escaped = self.tr_kind2 = self.tr_kind4 = 0
        self.values = self.max_depth_seen = 0

    def key_seen(self, off: int, n: int) -> bool:
        """True if a key of these bytes was seen before (a direct-mapped cache of recent
        keys, FNV-1a hashed, as the C: a miss only makes the estimate larger)."""
        if n > KEY_CACHE_MAX_LEN:
            return False
        h = _FNV_OFFSET
        for b in self.buf[off:off + n]:
            h = ((h ^ b) * _FNV_PRIME) & _U64
        slot = (h ^ (h >> 29)) & (KEY_CACHE_SLOTS - 1)
        seen = self.key_cache.get(slot)
        if seen is not None and seen[1] == n and self.buf[seen[0]:seen[0] + n] == self.buf[off:off + n]:
            return True
        self.key_cache[slot] = (off, n)
        return False

    def note_transient(self, t: int) -> None:
        if t > self.transient:
            self.transient = t

    def opened(self, depth: int) -> None:
        self.max_depth_seen = max(self.max_depth_seen, depth)


# --- MessagePack -------------------------------------------------------------------------
def _mp_kind(b: int) -> int:
    if b <= 0x7F or b >= 0xE0:
        return INT
    if b <= 0x8F:
        return MAP
    if b <= 0x9F:
        return ARRAY
    if b <= 0xBF:
        return STR
    return {0xC0: NIL, 0xC2: BOOL, 0xC3: BOOL, 0xC4: BIN, 0xC5: BIN, 0xC6: BIN, 0xCA: FLOAT, 0xCB: FLOAT,
            0xD9: STR, 0xDA: STR, 0xDB: STR, 0xDC: ARRAY, 0xDD: ARRAY, 0xDE: MAP, 0xDF: MAP,
            0xC1: UNKNOWN}.get(b, EXT if b in (0xC7, 0xC8, 0xC9, 0xD4, 0xD5, 0xD6, 0xD7, 0xD8) else INT)


def _mp_length(w: _Walker, n: int) -> int:
    if w.len - w.pos < n:
        raise _invalid(w.pos, "truncated: a length runs past the end")
    v = int.from_bytes(w.buf[w.pos:w.pos + n], "big")
    w.pos += n
    return v


def _mp_str(w: _Walker, n: int, key: bool) -> None:
    if n > w.len - w.pos:
        raise _invalid(w.pos, "truncated: a str runs past the end")
    if key and w.key_seen(w.pos, n):
        w.pos += n  # the same bytes as a key already checked and charged
        return
    w.keys += key
    counts = _utf8_counts(w.buf[w.pos:w.pos + n])
    if isinstance(counts, int):
        raise _invalid(w.pos + counts, "invalid UTF-8 in a str")
    chars, latin1, bmp, astral = counts
    kind = 4 if astral else 2 if bmp else 1 if latin1 else 0
    w.objects += str_cost(chars, kind)
    if kind:  # PyUnicode_DecodeUTF8 starts ASCII, then widens
        w.note_transient(writer_extra(n, chars, kind))
    w.pos += n


# Values of one byte that all cost what _MP_SIMPLE_COST says: fixints, nil, booleans,
# empty fixarrays and fixmaps.  A run of them inside a container is counted at once.
_MP_SIMPLE = re.compile(rb"[\x00-\x7f\x80\x90\xc0\xc2\xc3\xe0-\xff]+")
_MP_SIMPLE_BYTE = bytes(1 if b <= 0x80 or b == 0x90 or b in (0xC0, 0xC2, 0xC3) or b >= 0xE0 else 0
                        for b in range(256))
_MP_SIMPLE_COST = bytes(0 if b <= 0x7F or b in (0xC0, 0xC2, 0xC3) or 0xFB <= b
                        else 64 if b in (0x80, 0x90) else 1 if b >= 0xE0 else 0 for b in range(256))
_SMALL_NEG_FIXINT_COST = int_cost(1)


def _mp_simple_run(w: _Walker, stack: list) -> bool:
    """Take the run of one-byte values at w.pos that the open container still holds;
    False if there is none.  (An empty container opens no level: nothing follows it.)"""
    found = _MP_SIMPLE.match(w.buf, w.pos, w.pos + stack[-1][0])
    if found is None:
        return False
    start, end = found.span()
    if end - start <= _STEP:
        costs = bytes(w.buf[start:end]).translate(_MP_SIMPLE_COST)
        empties, big_negatives = costs.count(64), costs.count(1)
    else:  # counted a slice at a time: no copy of a hostile block's millions of values
        empties = big_negatives = 0
        for at in range(start, end, _STEP):
            part = w.data[at:min(at + _STEP, end)]
            empties += int(np.count_nonzero((part == 0x80) | (part == 0x90)))
            big_negatives += int(np.count_nonzero((part >= 0xE0) & (part <= 0xFA)))
    w.objects += 64 * empties + _SMALL_NEG_FIXINT_COST * big_negatives
    run = range(start, end)
    w.values += len(run)
    w.pos += len(run)
    stack[-1][0] -= len(run)
    return True


def _mp_walk(w: _Walker) -> None:
    buf, n_bytes = w.buf, w.len
    stack = []  # [items left, is a map] per open container
    while True:
        if (stack and stack[-1][0] > 1 and w.pos + 1 < n_bytes and _MP_SIMPLE_BYTE[buf[w.pos]]
                and _MP_SIMPLE_BYTE[buf[w.pos + 1]] and _mp_simple_run(w, stack)):
            if stack[-1][0] == 0:
                _close_completed(stack)
                if not stack:
                    return
            continue
        at = w.pos
        is_key = bool(stack) and stack[-1][1] and stack[-1][0] % 2 == 0
        if w.pos >= n_bytes:
            raise _invalid(w.pos, "truncated: a value is missing")
        b = buf[w.pos]
        w.pos += 1
        w.values += 1
        n, container = 0, 0
        if b <= 0x7F or b >= 0xE0:
            if not small_int(b >= 0xE0, 256 - b if b >= 0xE0 else b):
                w.objects += int_cost(1)
        elif b <= 0x8F:
            container, n = 2, b & 0x0F
        elif b <= 0x9F:
            container, n = 1, b & 0x0F
        elif b <= 0xBF:
            _mp_str(w, b & 0x1F, is_key)
        elif b in (0xC0, 0xC2, 0xC3):
            pass
        elif b == 0xC1:
            raise _invalid(at, "byte 0xc1 is never used")
        elif b in (0xC4, 0xC5, 0xC6):
            n = _mp_length(w, {0xC4: 1, 0xC5: 2, 0xC6: 4}[b])
            if n > n_bytes - w.pos:
                raise _invalid(at, "truncated: a bin runs past the end")
            w.objects += alloc_cost(BYTES_HEAD + n)
            w.pos += n
        elif b in (0xC7, 0xC8, 0xC9, 0xD4, 0xD5, 0xD6, 0xD7, 0xD8):
            n = 1 << (b - 0xD4) if b >= 0xD4 else _mp_length(w, {0xC7: 1, 0xC8: 2, 0xC9: 4}[b])
            if n + 1 > n_bytes - w.pos:
                raise _invalid(at, "truncated: an ext runs past the end")
            w.objects += EXT_EXTRA + alloc_cost(BYTES_HEAD + n)
            w.pos += n + 1
        elif b in (0xCA, 0xCB):
            size = 4 if b == 0xCA else 8
            if size > n_bytes - w.pos:
                raise _invalid(at, "truncated: a float runs past the end")
            w.objects += alloc_cost(FLOAT_SIZE)
            w.pos += size
        elif 0xCC <= b <= 0xD3:
            size = 1 << ((b - 0xCC) & 3)
            if size > n_bytes - w.pos:
                raise _invalid(at, "truncated: an int runs past the end")
            v = int.from_bytes(buf[w.pos:w.pos + size], "big")
            negative = b >= 0xD0 and v >> (8 * size - 1)
            if negative:
                v = (1 << (8 * size)) - v
            if not small_int(negative, v):
                w.objects += int_cost(3 if size == 8 else 2)
            w.pos += size
        elif b in (0xD9, 0xDA, 0xDB):
            _mp_str(w, _mp_length(w, {0xD9: 1, 0xDA: 2, 0xDB: 4}[b]), is_key)
        elif b in (0xDC, 0xDD):
            container, n = 1, _mp_length(w, 2 if b == 0xDC else 4)
        else:  # 0xDE, 0xDF
            container, n = 2, _mp_length(w, 2 if b == 0xDE else 4)
        if container:
            items = 2 * n if container == 2 else n
            # Every item takes at least a byte: a count the rest cannot hold is a lie.
            if items > n_bytes - w.pos:
                raise _invalid(at, "truncated: a map declares more entries than bytes follow" if container == 2
                               else "truncated: an array declares more items than bytes follow")
            if container == 2:
                w.objects += dict_cost(n)
                w.note_transient(dict_transient(n))
            else:
                w.objects += list_cost(n, False)
            if items:
                if len(stack) >= w.max_depth:
                    raise _Refused(TOO_DEEP, at)
                stack.append([items, container == 2])
                w.opened(len(stack))
                continue
        # a value is complete: close every container it completes
        if stack:
            stack[-1][0] -= 1
            if stack[-1][0] == 0:
                _close_completed(stack)
        if not stack:
            return


def _close_completed(stack: list) -> None:
    """Pop the finished container and every enclosing one its completion finishes."""
    stack.pop()
    while stack:
        stack[-1][0] -= 1
        if stack[-1][0]:
            return
        stack.pop()


def _scan_msgpack(buf: memoryview, max_depth: int) -> dict:
    res = _result()
    if not buf:
        return _failed(res, INVALID, 0, "empty: no value")
    res["top"] = _mp_kind(buf[0])
    if res["top"] == UNKNOWN:
        return _failed(res, INVALID, 0, "byte 0xc1 is never used")
    if res["top"] != MAP:
        res["status"] = NOT_MAP
        return res
    w = _Walker(buf, max_depth)
    try:
        _mp_walk(w)
        if w.pos != w.len:
            raise _invalid(w.pos, "extra bytes after the map")
    except _Refused as exc:
        _counted(res, w)
        return _failed(res, exc.status, exc.at, exc.why)
    _counted(res, w)
    res["estimate"] = with_overhead(w.objects + key_cache_cost(w.keys, True) + w.transient)
    return res


# --- JSON --------------------------------------------------------------------------------
_WS = re.compile(rb"[ \t\n\r]*")
_PLAIN_RUN = re.compile(rb"[\x20\x21\x23-\x5b\x5d-\x7f]*")  # printable ASCII but '"' and '\\'
_NONASCII_RUN = re.compile(rb"[\x80-\xff]+")
_DIGITS = re.compile(rb"[0-9]*")
_HEX4 = re.compile(rb"[0-9a-fA-F]{4}")
# One ",[]" / ",{}" / literal after a value in an array: the hostile block's item.
_JSON_SIMPLE_ITEM = re.compile(rb"[ \t\n\r]*,[ \t\n\r]*(?:\[[ \t\n\r]*\]|\{[ \t\n\r]*\}|true|false|null)")
_PERIOD_STEP = 1 << 18  # bytes compared at once: bounds the temporaries


def _skip_ws(buf: memoryview, pos: int) -> int:
    return _WS.match(buf, pos).end()


def _json_kind(c: int) -> int:
    if c == 0x7B:
        return MAP
    if c == 0x5B:
        return ARRAY
    if c == 0x22:
        return STR
    if c in b"tf":
        return BOOL
    if c == 0x6E:
        return NIL
    if c == 0x2D or 0x30 <= c <= 0x39:
        return INT
    return UNKNOWN


def _hex4(buf: memoryview, at: int):
    return int(bytes(buf[at:at + 4]), 16) if _HEX4.fullmatch(buf, at, at + 4) else None


def _json_string(w: _Walker, key: bool) -> None:
    """The string whose opening quote is at w.pos, as json's scanstring reads it."""
    buf, n_bytes = w.buf, w.len
    start = w.pos
    pos = start + 1
    chars = kind = 0
    escaped = False
    while True:
        run = _PLAIN_RUN.match(buf, pos).end()
        chars += run - pos
        pos = run
        if pos >= n_bytes:
            raise _invalid(start, "unterminated string")
        c = buf[pos]
        if c == 0x22:
            pos += 1
            break
        if c == 0x5C:
            if pos + 1 >= n_bytes:
                raise _invalid(start, "unterminated string")
            escaped = True
            e = buf[pos + 1]
            if e in b'"\\/bfnrt':
                pos += 2
                chars += 1
                continue
            if e != 0x75:  # 'u'
                raise _invalid(pos, "invalid escape")
            cp = _hex4(buf, pos + 2) if n_bytes - pos >= 6 else None
            if cp is None:
                raise _invalid(pos, "invalid \\uXXXX escape")
            pos += 6
            if 0xD800 <= cp <= 0xDBFF and n_bytes - pos >= 6 and buf[pos] == 0x5C and buf[pos + 1] == 0x75:
                lo = _hex4(buf, pos + 2)
                if lo is None:
                    raise _invalid(pos, "invalid \\uXXXX escape")
                if 0xDC00 <= lo <= 0xDFFF:
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00)
                    pos += 6
            chars += 1
            kind = max(kind, cp_kind(cp))
            continue
        if c < 0x20:
            raise _invalid(pos, "control character in a string")
        # non-ASCII: a whole run of UTF-8 sequences at once
        end = _NONASCII_RUN.match(buf, pos).end()
        counts = _utf8_counts(buf[pos:end])
        if isinstance(counts, int):
            raise _invalid(pos + counts, "invalid UTF-8")
        n_chars, latin1, bmp, astral = counts
        kind = max(kind, 4 if astral else 2 if bmp else 1)
        w.text_latin1 += latin1
        w.text_bmp += bmp
        w.text_astral += astral
        w.text_nonascii_bytes += end - pos
        chars += n_chars
        pos = end
    w.pos = pos
    if key:
        if w.key_seen(start + 1, pos - start - 2):
            return
        w.keys += 1
    w.objects += str_cost(chars, kind)
    # Without escapes json takes a substring (exact size); with them a writer
    # over-allocating by a quarter builds it.
    extra = writer_extra(chars + chars // 4, chars, kind)
    if escaped:
        w.tr_escaped = max(w.tr_escaped, extra)
    elif kind == 2:
        w.tr_kind2 = max(w.tr_kind2, extra)
    elif kind == 4:
        w.tr_kind4 = max(w.tr_kind4, extra)


def _json_literal(w: _Walker, word: bytes) -> None:
    if w.buf[w.pos:w.pos + len(word)] != word:
        raise _invalid(w.pos, "expected a value")
    w.pos += len(word)


def _json_number(w: _Walker) -> None:
    buf, n_bytes = w.buf, w.len
    start = pos = w.pos
    if buf[pos] == 0x2D:
        pos += 1
    digits_at = pos
    if pos < n_bytes and buf[pos] == 0x30:
        pos += 1
    elif pos < n_bytes and 0x31 <= buf[pos] <= 0x39:
        pos = _DIGITS.match(buf, pos).end()
    else:
        raise _invalid(start, "expected a value")
    is_float = False
    if pos + 1 < n_bytes and buf[pos] == 0x2E and 0x30 <= buf[pos + 1] <= 0x39:
        pos = _DIGITS.match(buf, pos + 2).end()
        is_float = True
    if pos < n_bytes and buf[pos] in b"eE":
        q = pos + 1
        if q < n_bytes and buf[q] in b"+-":
            q += 1
        if q < n_bytes and 0x30 <= buf[q] <= 0x39:
            pos = _DIGITS.match(buf, q).end()
            is_float = True
    if is_float:
        w.objects += alloc_cost(FLOAT_SIZE)
    else:
        d = pos - digits_at  # a 30-bit digit holds at least 9 decimal digits
        if d > 3 or not small_int(buf[start] == 0x2D, int(bytes(buf[digits_at:pos]))):
            w.objects += int_cost((d + 8) // 9)
    # json copies the number's text into a bytes object to convert it
    w.note_transient(alloc_cost(BYTES_HEAD + (pos - start)) + int_cost((pos - start) // 9 + 1))
    w.pos = pos


def _repeats(data: np.ndarray, start: int, period: int) -> int:
    """How many times the ``period`` bytes at ``start`` occur back to back there (at least 1)."""
    end = start + period
    while end < data.shape[0]:
        stop = min(end + _PERIOD_STEP, data.shape[0])
        differ = data[end:stop] != data[end - period:stop - period]
        if differ.any():
            end += int(differ.argmax())
            break
        end = stop
    return (end - start) // period


def _json_simple_run(w: _Walker, stack: list) -> None:
    """After a value in an array: take the following ``,[]``, ``,{}`` and literals at
    once (what the walk would count one by one), an item and its exact repeats at a time."""
    if len(stack) >= w.max_depth:
        return
    while True:
        found = _JSON_SIMPLE_ITEM.match(w.buf, w.pos)
        if found is None:
            return
        item = bytes(w.buf[found.start():found.end()])
        times = _repeats(w.data, w.pos, len(item))
        empty = b"[" in item or b"{" in item
        w.values += times
        stack[-1][0] += times
        if empty:  # an empty list or dict: its 56- or 64-byte object, a level opened a moment
            w.objects += 64 * times
            w.opened(len(stack) + 1)
        w.pos += times * len(item)


def _json_walk(w: _Walker) -> None:
    buf, n_bytes = w.buf, w.len
    stack = []  # [elements or entries so far, is an object] per open container
    state = "value"
    while True:
        if state == "value":  # a value starts at w.pos (whitespace skipped)
            if w.pos >= n_bytes:
                raise _invalid(w.pos, "truncated: expected a value")
            w.values += 1
            if stack and not stack[-1][1]:
                stack[-1][0] += 1
            c = buf[w.pos]
            if c in b"{[":
                if len(stack) >= w.max_depth:
                    raise _Refused(TOO_DEEP, w.pos)
                stack.append([0, c == 0x7B])
                w.opened(len(stack))
                w.pos = _skip_ws(buf, w.pos + 1)
                if w.pos < n_bytes and buf[w.pos] == (0x7D if stack[-1][1] else 0x5D):
                    state = "close"
                else:
                    state = "key" if stack[-1][1] else "value"
                continue
            if c == 0x22:
                _json_string(w, False)
            elif c == 0x74:
                _json_literal(w, b"true")
            elif c == 0x66:
                _json_literal(w, b"false")
            elif c == 0x6E:
                _json_literal(w, b"null")
            else:
                _json_number(w)
            state = "after"
        elif state == "key":  # an object's key starts at w.pos
            if w.pos >= n_bytes or buf[w.pos] != 0x22:
                raise _invalid(w.pos, "truncated: expected a key" if w.pos >= n_bytes else "expected a string key")
            _json_string(w, True)
            stack[-1][0] += 1
            w.pos = _skip_ws(buf, w.pos)
            if w.pos >= n_bytes or buf[w.pos] != 0x3A:
                raise _invalid(w.pos, "expected ':' after a key")
            w.pos = _skip_ws(buf, w.pos + 1)
            state = "value"
        else:
            if state == "close":  # the container on top closes at w.pos
                count, is_map = stack.pop()
                if is_map:
                    w.objects += dict_cost(count)
                    w.note_transient(dict_transient(count))
                else:
                    w.objects += list_cost(count, True)
                    if count:  # the item array it outgrew, alive while copied
                        w.note_transient(alloc_cost(8 * count))
                w.pos += 1
            # after: a value ended just before w.pos
            if stack and not stack[-1][1]:
                _json_simple_run(w, stack)
            w.pos = _skip_ws(buf, w.pos)
            if not stack:
                if w.pos != n_bytes:
                    raise _invalid(w.pos, "extra data after the top-level value")
                return
            is_map = stack[-1][1]
            if w.pos >= n_bytes:
                raise _invalid(w.pos, "truncated: an object is not closed" if is_map
                               else "truncated: an array is not closed")
            c = buf[w.pos]
            if c == 0x2C:
                w.pos = _skip_ws(buf, w.pos + 1)
                state = "key" if is_map else "value"
            elif c == (0x7D if is_map else 0x5D):
                state = "close"
            else:
                raise _invalid(w.pos, "expected ',' or '}'" if is_map else "expected ',' or ']'")


def _text_len(w: _Walker, kind: int) -> int:
    ascii_bytes = w.len - w.text_nonascii_bytes
    if kind == 1:
        return ascii_bytes + w.text_latin1 + 6 * w.text_bmp + 12 * w.text_astral
    if kind == 2:
        return ascii_bytes + w.text_latin1 + w.text_bmp + 12 * w.text_astral
    return ascii_bytes + w.text_latin1 + w.text_bmp + w.text_astral


def _json_plan(w: _Walker, res: dict) -> int:
    """Choose the text's kind: the cheapest of the str plus the writer transients of the
    strings whose characters it escapes; return that cost."""
    best, best_cost = 1, 0
    for k in (1, 2, 4):
        if (k == 2 and not w.text_bmp) or (k == 4 and not w.text_astral):
            continue  # the str must be as narrow as its widest character allows
        cost = str_cost(_text_len(w, k), (1 if w.text_latin1 else 0) if k == 1 else k)
        strs = w.tr_escaped
        if k == 1:
            strs = max(strs, w.tr_kind2, w.tr_kind4)
        elif k == 2:
            strs = max(strs, w.tr_kind4)
        cost += max(strs, w.transient)
        if k == 1 or cost < best_cost:
            best, best_cost = k, cost
    res["text_kind"] = best
    res["text_length"] = _text_len(w, best)
    res["text_maxchar"] = 0x10FFFF if best == 4 else 0xFFFF if best == 2 else 0xFF if w.text_latin1 else 0x7F
    return best_cost


def _scan_json(buf: memoryview, max_depth: int) -> dict:
    res = _result()
    pos = _skip_ws(buf, 0)
    if pos == len(buf):
        return _failed(res, INVALID, pos, "no value (empty or only whitespace)")
    res["top"] = _json_kind(buf[pos])
    if res["top"] == UNKNOWN:
        return _failed(res, INVALID, pos, "expected a value")
    if res["top"] != MAP:
        res["status"] = NOT_MAP
        return res
    w = _Walker(buf, max_depth)
    w.pos = pos
    try:
        _json_walk(w)
    except _Refused as exc:
        _counted(res, w)
        return _failed(res, exc.status, exc.at, exc.why)
    _counted(res, w)
    extra = _json_plan(w, res)
    res["estimate"] = with_overhead(w.objects + key_cache_cost(w.keys, False) + extra)
    return res


def _result() -> dict:
    return {"status": OK, "top": NONE, "estimate": 0, "error_at": 0, "error": None, "values": 0,
            "max_depth_seen": 0, "text_length": 0, "text_maxchar": 0, "text_kind": 0}


def _counted(res: dict, w: _Walker) -> None:
    res["values"], res["max_depth_seen"] = w.values, w.max_depth_seen


def _failed(res: dict, status: int, at: int, why) -> dict:
    res.update(status=status, error_at=at, error=why)
    return res


# --- the compiled module's interface -----------------------------------------------------
def budget(size: int) -> int:
    """Bytes a decode of a ``size``-byte block may need, the block itself excluded."""
    return max(limits.METADATA_MEMORY_FACTOR * size, limits.METADATA_MEMORY_FLOOR) - size


def _block_view(data) -> memoryview:
    """The block's bytes in place (no copy: a hostile block may be large)."""
    view = memoryview(data)
    if view.nbytes == 0:
        return memoryview(b"")
    if view.format in ("B", "b", "c") and view.ndim == 1 and view.c_contiguous:
        return view if view.format == "B" else view.cast("B")
    return view.cast("B")  # TypeError for a buffer that is not C-contiguous, as the compiled glue


def _check(res: dict, size: int, json: bool, path) -> None:
    """Raise the typed error a scan calls for (nothing if the block may be decoded)."""
    names = _JSON_KINDS if json else _MSGPACK_KINDS
    fmt = "JSON" if json else "MessagePack"
    if res["status"] == NOT_MAP:
        if json:
            raise CorruptError(f"metadata ({size} bytes) must be a JSON object, not a JSON {names[res['top']]}",
                               path=path)
        raise CorruptError(f"metadata ({size} bytes) is a MessagePack {names[res['top']]}, not a map", path=path)
    what = "UTF-8 JSON" if json else "MessagePack"
    if res["status"] == INVALID:
        raise CorruptError(f"metadata ({size} bytes) is not valid {what}: {res['error']} at byte "
                           f"{res['error_at']}", path=path)
    if res["status"] == TOO_DEEP:
        raise CorruptError(f"metadata ({size} bytes) nests more than {MAX_DEPTH} containers (at byte "
                           f"{res['error_at']})", path=path)
    allowed = budget(size)
    if res["estimate"] > allowed:
        raise LimitError(f"metadata ({size} bytes of {fmt}, {res['values']} values) would take about "
                         f"{res['estimate']} bytes of memory to decode, above the {allowed} allowed "
                         f"(max({limits.METADATA_MEMORY_FACTOR} x its size, {limits.METADATA_MEMORY_FLOOR}) less "
                         "the block; aprfast.limits.METADATA_MEMORY_FACTOR / METADATA_MEMORY_FLOOR)", path=path)


def check_msgpack(data, path=None) -> None:
    """Refuse, typed, a MessagePack metadata block that ``msgpack.unpackb`` should not be
    given: not a map (E002), malformed (E002), nested too deep (E002), or costing more
    memory to decode than :func:`budget` allows (E008)."""
    buf = _block_view(data)
    _check(_scan_msgpack(buf, MAX_DEPTH), len(buf), False, path)


# Characters wider than a text's kind: written as escapes.
_WIDER_THAN = {1: re.compile("[^\x00-\xff]"), 2: re.compile("[\U00010000-\U0010ffff]")}


def _escape(found) -> str:
    """A character as the \\uXXXX escape(s) json.loads decodes back to it."""
    cp = ord(found.group())
    if cp < 0x10000:
        return f"\\u{cp:04x}"
    cp -= 0x10000
    return f"\\u{0xD800 + (cp >> 10):04x}\\u{0xDC00 + (cp & 0x3FF):04x}"


def _steps(buf: memoryview):
    """(start, end) of pieces of about _STEP bytes, each ending where a character starts."""
    start = 0
    while start < len(buf):
        end = min(start + _STEP, len(buf))
        while end < len(buf) and 0x80 <= buf[end] <= 0xBF:  # inside a sequence: end before it
            end -= 1
        yield start, end
        start = end


def _text(buf: memoryview, res: dict) -> str:
    """The block decoded, characters wider than the text's kind escaped.  No str wider or
    longer than the text is built on the way: a step at a time, then one join."""
    if _NONASCII_RUN.search(buf) is None:
        return _decode(buf)  # ASCII: decoded at its exact size
    pattern = _WIDER_THAN.get(res["text_kind"])
    pieces = []
    for start, end in _steps(buf):
        piece = _decode(buf[start:end])
        pieces.append(piece if pattern is None else pattern.sub(_escape, piece))
    return "".join(pieces)


def json_text(data, path=None) -> str:
    """The text ``json.loads`` should parse for a JSON metadata block, after refusing the
    block as :func:`check_msgpack` does (and invalid UTF-8, E002): characters wider than
    the scan's chosen width (only strings hold them) written as \\uXXXX escapes, so one
    emoji in a large block does not make the whole text four bytes a character."""
    buf = _block_view(data)
    res = _scan_json(buf, MAX_DEPTH)
    _check(res, len(buf), True, path)
    try:
        text = _text(buf, res)
    except UnicodeDecodeError:
        text = None
    if text is None or len(text) != res["text_length"]:
        raise CorruptError(f"metadata ({len(buf)} bytes) changed while it was being read", path=path)
    return text


def scan(data, *, json: bool) -> dict:
    """What the scanner finds in a block, for tests and diagnostics (see the compiled module)."""
    buf = _block_view(data)
    res = _scan_json(buf, MAX_DEPTH) if json else _scan_msgpack(buf, MAX_DEPTH)
    names = _JSON_KINDS if json else _MSGPACK_KINDS
    status = ("ok", "not a map", "invalid", "too deep")[res["status"]]
    found = {"status": status, "top": names[res["top"]], "estimate": res["estimate"], "values": res["values"],
             "depth": res["max_depth_seen"], "error": res["error"],
             "error_at": res["error_at"] if status in ("invalid", "too deep") else None}
    if json:
        found["text_kind"] = res["text_kind"]
        found["text_length"] = res["text_length"]
    return found
