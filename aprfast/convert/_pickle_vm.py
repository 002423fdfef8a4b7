"""A bounded pickle interpreter that calls nothing but what its caller allows.

PyTorch checkpoints are pickles, and ``pickle.load`` of one runs whatever the file
names (``os.system`` through GLOBAL + REDUCE is the classic).  This module reads the
opcode stream itself and never imports a module or calls a function the file names:
GLOBAL and STACK_GLOBAL look ``(module, name)`` up in a table the caller provides (its
values are :class:`Allowed` callables or plain marker objects written in aprfast), and
any other name is refused at once, before anything is built.  REDUCE, NEWOBJ and BUILD
apply only to what came out of that table (BUILD also to the dicts this interpreter
made), persistent ids go to the caller's ``persistent_load``.

Bounds.  Every length is checked against the bytes left before it is sliced.  The
stream's size (MAX_PICKLE_BYTES) does not bound what it builds: one byte (EMPTY_LIST,
EMPTY_SET, MEMOIZE, TUPLE1) makes a 50-250 byte object, so every opcode charges an
estimate of the memory it adds (CPython's sizes: ``sys.getsizeof`` of what it made, the
stack, memo and container slots it fills) to a budget of max(METADATA_MEMORY_FACTOR x
the stream's size, METADATA_MEMORY_FLOOR) bytes (:mod:`aprfast.limits`, as for .apr
metadata; :func:`build_budget`), and the run stops with LimitError when it is spent.
Work that is not one step per byte (hashing a tuple or a long int as a dict key, the
arguments an allowed call walks, both reachable many times through the memo) is
charged to a second budget of ``WORK_FACTOR`` steps per byte, so every opcode is O(1)
amortised and the run's time is linear in the stream.  The memo is a list while its
indices come in order (as every pickler writes them) and a dict beyond (a huge index
costs one entry, not a list that long).  Dict keys and set items must be scalars or
flat tuples of scalars: hashing a deeply nested tuple recurses in C, which a hostile
file could use to overflow the stack.
The opcodes are those of protocols 0-5 that build data; EXT1/2/4 (the copyreg
extension registry), INST/OBJ (protocol 0/1 class instantiation), PERSID (text
persistent ids) and NEXT_BUFFER/READONLY_BUFFER (out-of-band buffers) are refused.
"""

from __future__ import annotations

import inspect
import struct
import sys

from ..errors import CorruptError, FormatError, LimitError

__all__ = ["Allowed", "Buildable", "PickleRefusedError", "PickledDict", "unpickle", "build_budget"]

#: The largest pickle stream read at all (a 10,000-tensor state dict pickles to ~1 MB).
MAX_PICKLE_BYTES = 64 << 20
#: MARK nesting (tuples in tuples in ...): torch writes a handful.
MAX_MARK_DEPTH = 1000
#: Steps of work beyond one per opcode (elements hashed or walked) per byte of stream,
#: plus WORK_FLOOR: a state dict needs a few per byte.
WORK_FACTOR = 8
WORK_FLOOR = 1 << 20


def build_budget(size: int) -> int:
    """Bytes of objects (estimated) a ``size``-byte pickle may build:
    ``max(METADATA_MEMORY_FACTOR * size, METADATA_MEMORY_FLOOR)`` (:mod:`aprfast.limits`)."""
    from .. import limits

    return max(limits.METADATA_MEMORY_FACTOR * size, limits.METADATA_MEMORY_FLOOR)


class PickleRefusedError(FormatError):
    """E001: the pickle names a global outside the allowlist, or asks for an operation
    (an extension code, a call on something not allowed) that is never run."""


class Allowed:
    """A callable the pickle may REDUCE: ``func(*args)``, written in aprfast, named
    ``module.name`` in errors."""

    __slots__ = ("module", "name", "func", "signature")

    def __init__(self, module: str, name: str, func):
        self.module, self.name, self.func = module, name, func
        self.signature = inspect.signature(func)

    def __repr__(self) -> str:
        return f"{self.module}.{self.name}"


class Buildable:
    """Base of the caller's objects that take a BUILD state (``build(state)`` checks it)."""

    def build(self, state) -> None:  # pragma: no cover - abstract
        raise NotImplementedError


class PickledDict(dict):
    """A dict the pickle built (``{}``, ``dict``, ``OrderedDict``); ``state`` keeps what
    BUILD gave it (torch's ``_metadata`` of module versions)."""

    state = None


class _Mark:
    __slots__ = ()


_MARK = _Mark()
_SCALARS = (str, int, float, bool, type(None), bytes)


def _hashable(m, value, what: str):
    """``value`` if it is a scalar or a flat tuple of scalars, else CorruptError.  Hashing
    a tuple or a long int is not cached by CPython, so it is charged (``m.step``) each
    time: a tuple of a million items used as a key again and again through the memo
    would otherwise cost a million steps per opcode."""
    kind = type(value)
    if kind is tuple:
        m.step(len(value))
        if all(isinstance(v, _SCALARS) for v in value):
            for v in value:
                if type(v) is int:
                    m.step(v.bit_length() >> 6)
            return value
    elif isinstance(value, _SCALARS):
        if kind is int:
            m.step(value.bit_length() >> 6)
        return value
    raise CorruptError(f"{what} is a {type(value).__name__}; only scalars and flat tuples of scalars are accepted")


# Estimated bytes each opcode adds, beyond what its handler charges for the object it
# makes: a stack (or memo, container) slot, and the fixed-size objects made (CPython,
# 64-bit: an int outside the small-int cache 32, a float 24, a tuple 40 + 8 per item, an
# empty list 56, a dict subclass instance 64, an empty set 216).
_SLOT = 8
_DICT_ITEM = 64  # a dict entry and its share of the table
_SET_ITEM = 48
_MEMO_DICT_ITEM = 104  # a dict entry of the memo's sparse part and its int key


class _Machine:
    """One run over ``data``; see :func:`unpickle`."""

    def __init__(self, data, allowed: dict, persistent_load, what: str, max_memory: int):
        self.raw = bytes(data)  # bytes.find for protocol-0 lines: no copy per line
        self.data = memoryview(self.raw)
        self.pos = 0
        self.allowed = allowed
        self.persistent_load = persistent_load
        self.what = what
        self.stack = []
        self.marks = []
        self.memo = []  # indices 0, 1, 2, ... in order: a list
        self.sparse = {}  # any other index
        self.memory_left = self.max_memory = max_memory
        self.steps_left = WORK_FACTOR * len(self.raw) + WORK_FLOOR

    # --- budgets -------------------------------------------------------------------
    def charge(self, nbytes: int) -> None:
        """Count ``nbytes`` of objects (estimated) against the memory budget."""
        self.memory_left -= nbytes
        if self.memory_left < 0:
            raise LimitError(f"{self.what}: builds more than {self.max_memory} bytes of objects (estimated) from "
                             f"{len(self.raw)} bytes of pickle (at byte {self.pos}; max(aprfast.limits."
                             "METADATA_MEMORY_FACTOR x its size, METADATA_MEMORY_FLOOR))")

    def charge_object(self, value) -> None:
        """A new object on the stack: its size and its slot."""
        self.charge(sys.getsizeof(value) + _SLOT)

    def step(self, n: int) -> None:
        """Count ``n`` steps of work against the work budget."""
        self.steps_left -= n
        if self.steps_left < 0:
            raise LimitError(f"{self.what}: takes more than {WORK_FACTOR} steps per byte of pickle (at byte "
                             f"{self.pos}: keys hashed or arguments walked again and again through the memo)")

    # --- reading -------------------------------------------------------------------
    def _error(self, message: str) -> CorruptError:
        return CorruptError(f"{self.what}: {message} (at byte {self.pos})")

    def take(self, n: int) -> memoryview:
        if n < 0 or n > len(self.data) - self.pos:
            raise self._error(f"needs {n} more bytes, only {len(self.data) - self.pos} left")
        out = self.data[self.pos:self.pos + n]
        self.pos += n
        return out

    def unpack(self, fmt: str):
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def line(self) -> bytes:
        """Protocol-0 argument up to a newline (never past the end, at most 64 KiB)."""
        end = self.raw.find(b"\n", self.pos, self.pos + (1 << 16))
        if end < 0:
            raise self._error("a text argument has no newline within 64 KiB")
        text = self.raw[self.pos:end]
        self.pos = end + 1
        return text

    # --- the stack -----------------------------------------------------------------
    def pop(self):
        if not self.stack or (self.marks and len(self.stack) == self.marks[-1]):
            raise self._error("pops an empty stack")
        return self.stack.pop()

    def top(self):
        if not self.stack or (self.marks and len(self.stack) == self.marks[-1]):
            raise self._error("reads an empty stack")
        return self.stack[-1]

    def pop_mark(self) -> list:
        if not self.marks:
            raise self._error("closes a MARK that was never opened")
        start = self.marks.pop()
        items = self.stack[start:]
        del self.stack[start:]
        return items

    def push_mark(self) -> None:
        if len(self.marks) >= MAX_MARK_DEPTH:
            raise LimitError(f"{self.what}: MARKs nest deeper than {MAX_MARK_DEPTH}")
        self.marks.append(len(self.stack))

    # --- memo ----------------------------------------------------------------------
    def put(self, index: int) -> None:
        value = self.top()
        memo = self.memo
        if index == len(memo):
            self.charge(_SLOT + 1)
            memo.append(value)
            if self.sparse:  # every sparse index stays above the list
                self.sparse.pop(index, None)
        elif index < len(memo):
            memo[index] = value
        else:  # out of order: one dict entry (a list that long would be the index's size)
            self.charge(_MEMO_DICT_ITEM)
            self.sparse[index] = value

    def get(self, index: int) -> None:
        # an index below the list's length was (re)stored there last: the list grew past
        # it only by later puts
        if index < len(self.memo):
            self.stack.append(self.memo[index])
            return
        try:
            self.stack.append(self.sparse[index])
        except KeyError:
            raise self._error(f"reads memo entry {index}, which was never stored") from None

    # --- globals and calls ---------------------------------------------------------
    def find_global(self, module: str, name: str):
        try:
            return self.allowed[(module, name)]
        except KeyError:
            raise PickleRefusedError(f"{self.what}: refers to {module}.{name}, which is not on the allowlist "
                                     "(nothing was run)") from None

    def call(self, func, args, opcode: str):
        if not isinstance(func, Allowed):
            raise PickleRefusedError(f"{self.what}: {opcode} on a {type(func).__name__}, not an allowed "
                                     "callable (nothing was run)")
        if type(args) is not tuple:
            raise self._error(f"{opcode} arguments for {func!r} are a {type(args).__name__}, not a tuple")
        self._charge_walk(args)
        try:
            func.signature.bind(*args)
        except TypeError:
            raise self._error(f"{opcode} gives {func!r} {len(args)} arguments, which it does not take") from None
        result = func.func(*args)
        self.charge_object(result)
        return result

    def _charge_walk(self, args: tuple) -> None:
        """Steps for what an allowed callable may walk: its arguments, the items of those
        that are containers or text, and the items' items (an OrderedDict's pairs), so a
        huge list given again and again through the memo costs each time."""
        self.step(len(args))
        for arg in args:
            if isinstance(arg, (str, bytes, bytearray)):
                self.step(len(arg))
            elif isinstance(arg, (tuple, list, dict, set, frozenset)):
                self.step(len(arg))
                if isinstance(arg, (tuple, list)):
                    for item in arg:
                        if isinstance(item, (tuple, list, str, bytes)):
                            self.step(len(item))

    def build(self, state) -> None:
        target = self.top()
        if type(target) is PickledDict:
            if target.state is None:
                self.charge(_MEMO_DICT_ITEM)  # the instance dict that holds it
            target.state = state
            return
        if isinstance(target, Buildable):
            target.build(state)
            return
        raise PickleRefusedError(f"{self.what}: BUILD on a {type(target).__name__} (only dicts take a state; "
                                 "nothing was run)")

    # --- the loop ------------------------------------------------------------------
    def run(self):
        table, costs = _OPCODES, _COSTS
        while True:
            if self.pos >= len(self.data):
                raise self._error("stream ends without STOP")
            code = self.data[self.pos]
            self.pos += 1
            handler = table.get(code)
            if handler is None:
                raise self._refused_opcode(code)
            if handler is _stop:
                return self.pop()
            self.memory_left -= costs[code]
            if self.memory_left < 0:
                self.charge(0)  # raises, naming the budget
            handler(self)

    def _refused_opcode(self, code: int):
        name = _REFUSED.get(code)
        if name is not None:
            return PickleRefusedError(f"{self.what}: opcode {name} is not accepted (nothing was run)")
        return self._error(f"unknown pickle opcode 0x{code:02x}")


def _text(raw, what: str, encoding: str = "utf-8") -> str:
    try:
        return bytes(raw).decode(encoding)
    except UnicodeDecodeError:
        raise CorruptError(f"{what} is not valid {encoding}") from None


# --- opcode handlers -------------------------------------------------------------------
def _stop(m):  # pragma: no cover - recognised by identity in run()
    pass


def _proto(m):
    version = m.take(1)[0]
    if version > 5:
        raise FormatError(f"{m.what}: pickle protocol {version} is newer than 5")


def _frame(m):
    size = m.unpack("<Q")
    if size > len(m.data) - m.pos:
        raise m._error(f"FRAME of {size} bytes runs past the end")


def _int_text(m):
    text = m.line()
    if text in (b"00", b"01"):  # protocol 0 booleans
        m.stack.append(text == b"01")
        return
    value = _parse_int(m, text.rstrip(b"L"))
    m.charge_object(value)
    m.stack.append(value)


def _parse_int(m, text: bytes) -> int:
    try:
        return int(text, 10)
    except ValueError:  # includes Python's 4300-digit cap on decimal text
        raise m._error(f"integer text {bytes(text[:40])!r} is not a bounded decimal integer") from None


def _float_text(m):
    try:
        m.stack.append(float(m.line()))
    except ValueError:
        raise m._error("FLOAT text is not a number") from None


def _long_n(fmt: str):
    def handler(m):
        n = m.unpack(fmt)
        value = int.from_bytes(m.take(n), "little", signed=True)
        m.charge_object(value)
        m.stack.append(value)
    return handler


def _long_text(m):
    value = _parse_int(m, m.line().rstrip(b"L"))
    m.charge_object(value)
    m.stack.append(value)


def _string(fmt: str, kind: str):
    """BIN*UNICODE (utf-8 text), BIN*BYTES (bytes), BIN*STRING (a Python 2 str: ASCII)."""
    def handler(m):
        n = m.unpack(fmt)
        raw = m.take(n)
        if kind == "bytes":
            value = bytes(raw)
        elif kind == "bytearray":
            value = bytearray(raw)
        else:
            value = _text(raw, f"{m.what}: a string", "utf-8" if kind == "unicode" else "ascii")
        m.charge_object(value)
        m.stack.append(value)
    return handler


def _unicode_text(m):
    value = _text(m.line(), f"{m.what}: a UNICODE string", "raw_unicode_escape")
    m.charge_object(value)
    m.stack.append(value)


def _string_text(m):
    text = m.line()
    if len(text) < 2 or text[:1] != text[-1:] or text[:1] not in (b"'", b'"'):
        raise m._error("STRING argument is not quoted")
    try:
        value = _text(bytes(text[1:-1]).decode("unicode_escape").encode("latin-1"), "a STRING", "ascii")
        m.charge_object(value)
        m.stack.append(value)
    except UnicodeError:
        raise m._error("STRING argument has a bad escape") from None


def _tuple_n(n: int):
    def handler(m):
        items = [m.pop() for _ in range(n)]
        m.stack.append(tuple(reversed(items)))
    return handler


def _tuple(m):
    value = tuple(m.pop_mark())
    m.charge_object(value)
    m.stack.append(value)


def _list(m):
    value = m.pop_mark()
    m.charge_object(value)
    m.stack.append(value)


def _dict(m):
    items = m.pop_mark()
    if len(items) % 2:
        raise m._error("DICT has an odd number of items")
    m.charge(sys.getsizeof(PickledDict()) + _SLOT + _DICT_ITEM * (len(items) // 2))
    out = PickledDict()
    for i in range(0, len(items), 2):
        out[_hashable(m, items[i], "a dict key")] = items[i + 1]
    m.stack.append(out)


def _append(m):
    value = m.pop()
    _require(m, m.top(), list, "APPEND").append(value)


def _appends(m):
    items = m.pop_mark()
    m.charge(_SLOT * len(items))
    _require(m, m.top(), list, "APPENDS").extend(items)


def _setitem(m):
    value = m.pop()
    key = m.pop()
    _require(m, m.top(), dict, "SETITEM")[_hashable(m, key, "a dict key")] = value


def _setitems(m):
    items = m.pop_mark()
    target = _require(m, m.top(), dict, "SETITEMS")
    if len(items) % 2:
        raise m._error("SETITEMS has an odd number of items")
    m.charge(_DICT_ITEM * (len(items) // 2))
    for i in range(0, len(items), 2):
        target[_hashable(m, items[i], "a dict key")] = items[i + 1]


def _additems(m):
    items = m.pop_mark()
    target = _require(m, m.top(), set, "ADDITEMS")
    m.charge(_SET_ITEM * len(items))
    for item in items:
        target.add(_hashable(m, item, "a set item"))


def _frozenset(m):
    items = m.pop_mark()
    m.charge(sys.getsizeof(frozenset()) + _SLOT + _SET_ITEM * len(items))
    m.stack.append(frozenset(_hashable(m, item, "a set item") for item in items))


def _require(m, target, kind, opcode: str):
    if not isinstance(target, kind):
        raise m._error(f"{opcode} on a {type(target).__name__}, not a {kind.__name__}")
    return target


def _pop(m):
    if m.marks and len(m.stack) == m.marks[-1]:  # POP of a MARK, as pickle allows
        m.marks.pop()
        return
    m.pop()


def _global_text(m):
    module = _text(m.line(), f"{m.what}: a GLOBAL module name")
    name = _text(m.line(), f"{m.what}: a GLOBAL name")
    m.stack.append(m.find_global(module, name))


def _stack_global(m):
    name = m.pop()
    module = m.pop()
    if type(module) is not str or type(name) is not str:
        raise m._error("STACK_GLOBAL needs two strings")
    m.stack.append(m.find_global(module, name))


def _reduce(m):
    args = m.pop()
    func = m.pop()
    m.stack.append(m.call(func, args, "REDUCE"))


def _newobj(m):
    args = m.pop()
    cls = m.pop()
    m.stack.append(m.call(cls, args, "NEWOBJ"))


def _newobj_ex(m):
    kwargs = m.pop()
    args = m.pop()
    cls = m.pop()
    if kwargs:
        raise PickleRefusedError(f"{m.what}: NEWOBJ_EX with keyword arguments for {cls!r} (nothing was run)")
    m.stack.append(m.call(cls, args, "NEWOBJ_EX"))


def _build(m):
    m.build(m.pop())


def _binpersid(m):
    pid = m.pop()
    if m.persistent_load is None:
        raise PickleRefusedError(f"{m.what}: a persistent id where none is expected")
    value = m.persistent_load(pid)
    m.charge_object(value)
    m.stack.append(value)


def _memoize(m):
    m.put(len(m.memo) + len(m.sparse))  # pickle's own rule: the memo's size


def _index(fmt: str, action):
    def handler(m):
        action(m, m.unpack(fmt))
    return handler


def _text_index(action):
    def handler(m):
        action(m, _parse_int(m, m.line()))
    return handler


def _push(value):
    def handler(m):
        m.stack.append(value)
    return handler


def _empty(factory):
    def handler(m):
        m.stack.append(factory())
    return handler


def _dup(m):
    m.stack.append(m.top())


def _mark(m):
    m.push_mark()


def _pop_mark(m):
    m.pop_mark()


def _binfloat(m):
    m.stack.append(m.unpack(">d"))


_OPCODES = {
    ord("."): _stop, 0x80: _proto, 0x95: _frame,
    ord("("): _mark, ord("0"): _pop, ord("1"): _pop_mark, ord("2"): _dup,
    ord("N"): _push(None), 0x88: _push(True), 0x89: _push(False),
    ord("I"): _int_text, ord("J"): lambda m: m.stack.append(m.unpack("<i")),
    ord("K"): lambda m: m.stack.append(m.unpack("<B")), ord("M"): lambda m: m.stack.append(m.unpack("<H")),
    ord("L"): _long_text,
    0x8A: _long_n("<B"), 0x8B: _long_n("<i"),
    ord("F"): _float_text, ord("G"): _binfloat,
    ord("S"): _string_text, ord("T"): _string("<i", "ascii"), ord("U"): _string("<B", "ascii"),
    ord("V"): _unicode_text, ord("X"): _string("<I", "unicode"), 0x8C: _string("<B", "unicode"),
    0x8D: _string("<Q", "unicode"),
    ord("B"): _string("<I", "bytes"), ord("C"): _string("<B", "bytes"), 0x8E: _string("<Q", "bytes"),
    0x96: _string("<Q", "bytearray"),
    ord(")"): _empty(tuple), ord("t"): _tuple, 0x85: _tuple_n(1), 0x86: _tuple_n(2), 0x87: _tuple_n(3),
    ord("]"): _empty(list), ord("l"): _list, ord("a"): _append, ord("e"): _appends,
    ord("}"): _empty(PickledDict), ord("d"): _dict, ord("s"): _setitem, ord("u"): _setitems,
    0x8F: _empty(set), 0x90: _additems, 0x91: _frozenset,
    ord("g"): _text_index(_Machine.get), ord("h"): _index("<B", _Machine.get),
    ord("j"): _index("<I", _Machine.get),
    ord("p"): _text_index(_Machine.put), ord("q"): _index("<B", _Machine.put),
    ord("r"): _index("<I", _Machine.put), 0x94: _memoize,
    ord("c"): _global_text, 0x93: _stack_global,
    ord("R"): _reduce, 0x81: _newobj, 0x92: _newobj_ex, ord("b"): _build,
    ord("Q"): _binpersid,
}

#: Estimated bytes each opcode adds before its handler charges what varies (see _SLOT):
#: every push a stack slot; fixed-size objects (an int outside the small-int cache, a
#: float, TUPLE1-3, an empty list, dict or set) their size.
_COSTS = [0] * 256
for _code in b"(2N\x88\x89K)hjg\x93cR\x81\x92QaSTUVXBC\x8c\x8d\x8e\x96\x8a\x8bIL":
    _COSTS[_code] = _SLOT
for _code, _size in ((ord("J"), 32), (ord("M"), 32), (ord("F"), 24), (ord("G"), 24), (0x85, 48), (0x86, 56),
                     (0x87, 64), (ord("]"), 56), (ord("}"), sys.getsizeof(PickledDict())), (0x8F, 216), (ord("a"), 0),
                     (ord("s"), _DICT_ITEM)):
    _COSTS[_code] = _SLOT + _size
del _code, _size

#: Opcodes refused by name (they exist, but build objects through machinery never run here).
_REFUSED = {0x82: "EXT1", 0x83: "EXT2", 0x84: "EXT4", ord("i"): "INST", ord("o"): "OBJ",
            ord("P"): "PERSID", 0x97: "NEXT_BUFFER", 0x98: "READONLY_BUFFER"}


def unpickle(data, allowed: dict, *, persistent_load=None, what: str = "pickle", max_memory=None):
    """The object a pickle stream builds, using only ``allowed`` ((module, name) ->
    :class:`Allowed` or a marker value) for its globals and ``persistent_load(pid)``
    for persistent ids.  ``what`` names the stream in errors.  What the run builds is
    bounded (see the module docstring): at most ``max_memory`` bytes of objects,
    estimated (default :func:`build_budget` of the stream's size), and ``WORK_FACTOR``
    steps of work per byte; beyond either, LimitError.  A stream above MAX_PICKLE_BYTES
    is LimitError before it is read.  Refusals are :class:`PickleRefusedError`;
    malformed streams :class:`CorruptError`."""
    if len(data) > MAX_PICKLE_BYTES:
        raise LimitError(f"{what} is {len(data)} bytes, more than {MAX_PICKLE_BYTES}")
    budget = build_budget(len(data)) if max_memory is None else max_memory
    return _Machine(data, allowed, persistent_load, what, budget).run()
