"""Regular expressions from a checkpoint's own files, matched in time linear in the name.

compressed-tensors' ``quantization_config`` names its targets with ``re:`` patterns that
its Python code hands to :func:`re.match`.  Those patterns come from a downloaded file,
and Python's backtracking engine takes exponential time on patterns such as ``(a+)+$``
(and polynomial time of any degree on ``.*a.*a.*a.*b``), so a hostile ``config.json``
could stall an import.  Here a pattern is parsed with the standard library's own parser
(so it means exactly what it means to :mod:`re`) and run as a Thompson automaton: each
character of the name advances a set of at most ``len(states)`` states, so one match
costs O(len(name) x len(pattern)) whatever the pattern.  What an automaton cannot do
(backreferences, lookarounds, conditionals, atomic groups) is refused with a typed
error naming the pattern; real checkpoints use none of it (``re:.*q_proj$``,
``re:model.layers.\\d+.mlp.*``).  Google's RE2 would do the same job as a dependency;
this module keeps the import free of one, for a few dozen patterns per checkpoint.
"""

from __future__ import annotations

import re

try:  # the parser re itself uses (a public module, sre_parse, before 3.11)
    from re import _constants as _c
    from re import _parser as _p
except ImportError:  # pragma: no cover - Python 3.9 / 3.10
    import sre_constants as _c  # type: ignore[no-redef]
    import sre_parse as _p  # type: ignore[no-redef]

from ..errors import CorruptError

__all__ = ["Pattern", "compile_pattern", "MAX_STATES"]

#: Most automaton states one pattern may compile to (a bounded repeat is unrolled).
MAX_STATES = 4096

_CHAR, _SPLIT, _BEGIN, _END, _MATCH = range(5)
_CATEGORIES = {
    _c.CATEGORY_DIGIT: str.isdecimal,
    _c.CATEGORY_NOT_DIGIT: lambda ch: not ch.isdecimal(),
    _c.CATEGORY_SPACE: str.isspace,
    _c.CATEGORY_NOT_SPACE: lambda ch: not ch.isspace(),
    _c.CATEGORY_WORD: lambda ch: ch.isalnum() or ch == "_",
    _c.CATEGORY_NOT_WORD: lambda ch: not (ch.isalnum() or ch == "_"),
}


class Pattern:
    """A compiled pattern; :meth:`match` answers what ``re.match(pattern, name)`` would
    (found or not), in time linear in ``len(name)``.

    Examples:
        >>> from aprfast.convert.patterns import compile_pattern
        >>> compile_pattern(r".*(q|k|v)_proj$").match("model.layers.0.self_attn.k_proj")
        True
        >>> compile_pattern(r"(a+)+$").match("a" * 5000 + "!")
        False
    """

    def __init__(self, text: str, states: list, start: int):
        self.text, self._states, self._start = text, states, start

    def _closure(self, todo, at_begin: bool, at_end: bool, into: set) -> None:
        states = self._states
        while todo:
            i = todo.pop()
            if i in into:
                continue
            into.add(i)
            kind, a, b = states[i]
            if kind == _SPLIT:
                todo.append(a)
                todo.append(b)
            elif (kind == _BEGIN and at_begin) or (kind == _END and at_end):
                todo.append(b)

    def match(self, name: str) -> bool:
        """True if the pattern matches at the start of ``name`` (``re.match``'s rule).

        Args:
            name: The text to match (a module name).

        Returns:
            Whether ``re.match(pattern, name)`` would find a match.

        Example:
            >>> from aprfast.convert.patterns import compile_pattern
            >>> compile_pattern(r"model\\.layers\\.\\d+\\.mlp").match("model.layers.12.mlp.up")
            True
        """
        states, n = self._states, len(name)
        current: set = set()
        self._closure([self._start], True, n == 0, current)
        for pos, ch in enumerate(name):
            if any(states[i][0] == _MATCH for i in current):
                return True
            following: set = set()
            for i in current:
                kind, test, nxt = states[i]
                if kind == _CHAR and test(ch):
                    self._closure([nxt], False, pos + 1 == n, following)
            if not following:
                return False
            current = following
        return any(states[i][0] == _MATCH for i in current)


class _Builder:
    def __init__(self, text: str, flags: int):
        self.text, self.states = text, []
        self.ignore_case = bool(flags & re.IGNORECASE)
        self.dot_all = bool(flags & re.DOTALL)

    def add(self, kind, a=None, b=None) -> int:
        if len(self.states) >= MAX_STATES:
            raise CorruptError(f"pattern {self.text!r:.80} needs more than {MAX_STATES} automaton states")
        self.states.append([kind, a, b])
        return len(self.states) - 1

    def refuse(self, what: str):
        raise CorruptError(f"pattern {self.text!r:.80} uses {what}, which aprfast does not match "
                           "(only what a linear-time automaton can: no backreferences or lookarounds)")

    def char_test(self, op, av):
        fold = str.casefold if self.ignore_case else (lambda ch: ch)
        if op is _c.LITERAL:
            want = fold(chr(av))
            return lambda ch: fold(ch) == want
        if op is _c.NOT_LITERAL:
            want = fold(chr(av))
            return lambda ch: fold(ch) != want
        if op is _c.ANY:
            return (lambda ch: True) if self.dot_all else (lambda ch: ch != "\n")
        if op is _c.IN:
            return self.set_test(av)
        if op is _c.CATEGORY and av in _CATEGORIES:
            return _CATEGORIES[av]
        return None

    def set_test(self, items):
        negate, tests = False, []
        for op, av in items:
            if op is _c.NEGATE:
                negate = True
            elif op is _c.RANGE:
                lo, hi = av
                tests.append(lambda ch, lo=lo, hi=hi: lo <= ord(ch) <= hi)
            else:
                test = self.char_test(op, av)
                if test is None:
                    self.refuse(f"{op} in a character class")
                tests.append(test)
        if self.ignore_case:
            inner = list(tests)
            tests = [lambda ch: any(t(c) for t in inner for c in {ch, ch.lower(), ch.upper()})]
        return (lambda ch: not any(t(ch) for t in tests)) if negate else (lambda ch: any(t(ch) for t in tests))

    # Each fragment is (first state, [dangling states whose "next" is still open]).
    def sequence(self, items):
        first, holes = None, None
        for op, av in items:
            frag = self.item(op, av)
            if frag is None:
                continue
            if first is None:
                first, holes = frag
            else:
                self.patch(holes, frag[0])
                holes = frag[1]
        if first is None:  # the empty pattern: one split that goes straight on
            s = self.add(_SPLIT)
            return s, [(s, 1), (s, 2)]
        return first, holes

    def patch(self, holes, target: int) -> None:
        for state, slot in holes:
            self.states[state][slot] = target

    def item(self, op, av):
        test = self.char_test(op, av)
        if test is not None:
            s = self.add(_CHAR, test)
            return s, [(s, 2)]
        if op is _c.SUBPATTERN:
            _group, add_flags, del_flags, body = av
            if add_flags or del_flags:
                self.refuse("inline flags inside a group")
            return self.sequence(body)
        if op is _c.BRANCH:
            _, alternatives = av
            frags = [self.sequence(alt) for alt in alternatives]
            first, holes = frags[-1]
            for frag in reversed(frags[:-1]):
                first = self.add(_SPLIT, frag[0], first)
                holes = frag[1] + holes
            return first, holes
        if op in (_c.MAX_REPEAT, _c.MIN_REPEAT) or op is getattr(_c, "POSSESSIVE_REPEAT", None):
            if op is not _c.MAX_REPEAT and op is not _c.MIN_REPEAT:
                self.refuse("a possessive repeat")
            lo, hi, body = av
            return self.repeat(lo, hi, body)
        if op is _c.AT:
            if av in (_c.AT_BEGINNING, _c.AT_BEGINNING_STRING):
                s = self.add(_BEGIN)
            elif av in (_c.AT_END, _c.AT_END_STRING):
                s = self.add(_END)
            else:
                self.refuse(f"the anchor {av}")
            return s, [(s, 2)]
        self.refuse(str(op))

    def repeat(self, lo: int, hi, body):
        unbounded = hi is _c.MAXREPEAT or hi == _c.MAXREPEAT
        if lo > MAX_STATES or (not unbounded and hi > MAX_STATES):
            raise CorruptError(f"pattern {self.text!r:.80} repeats {lo}..{hi} times: more than {MAX_STATES}")
        first, holes = None, None

        def chain(frag):
            nonlocal first, holes
            if first is None:
                first, holes = frag
            else:
                self.patch(holes, frag[0])
                holes = frag[1]

        for _ in range(lo):
            chain(self.sequence(body))
        if unbounded:  # body*: a split that loops back
            start, body_holes = self.sequence(body)
            s = self.add(_SPLIT, start, None)
            self.patch(body_holes, s)
            chain((s, [(s, 2)]))
        else:
            optional = []
            for _ in range(hi - lo):
                start, body_holes = self.sequence(body)
                s = self.add(_SPLIT, start, None)
                optional.append((s, 2))
                chain((s, body_holes))
            if optional and holes is not None:
                holes = holes + [h for h in optional if h not in holes]
        if first is None:  # {0} or {0,0}
            s = self.add(_SPLIT)
            return s, [(s, 1), (s, 2)]
        return first, holes


def compile_pattern(text: str) -> Pattern:
    """Parse ``text`` with :mod:`re`'s own parser and build its linear-time automaton.

    Args:
        text: A Python regular expression (from a checkpoint's configuration).

    Returns:
        A :class:`Pattern` whose ``match`` answers as ``re.match`` would.

    Raises:
        CorruptError: Not a regular expression, or one that needs backtracking
            (backreferences, lookarounds) or more than :data:`MAX_STATES` states.

    Example:
        >>> from aprfast.convert.patterns import compile_pattern
        >>> compile_pattern(r"(?=x)")
        Traceback (most recent call last):
        ...
        aprfast.errors.CorruptError: [E002] pattern '(?=x)' uses ASSERT, which aprfast does not match ...
    """
    if not isinstance(text, str):
        raise CorruptError(f"pattern {text!r:.80} is not a string")
    try:
        parsed = _p.parse(text)
    except (re.error, RecursionError, OverflowError) as exc:
        raise CorruptError(f"pattern {text!r:.80} is not a regular expression: {exc}") from None
    flags = parsed.state.flags if hasattr(parsed, "state") else parsed.pattern.flags
    builder = _Builder(text, flags)
    first, holes = builder.sequence(list(parsed))
    end = builder.add(_MATCH)
    builder.patch(holes, end)
    return Pattern(text, [tuple(s) for s in builder.states], first)
