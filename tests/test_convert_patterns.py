"""The linear-time matcher for checkpoint patterns (aprfast/convert/patterns.py): it
answers as re.match does, and a pattern that makes Python's backtracking engine take
exponential time costs it one pass over the name."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import aprfast
from aprfast.convert.patterns import MAX_STATES, compile_pattern

REAL = [r".*q_proj$", r"model\.layers\.\d+\.mlp.*", r".*(q|k|v)_proj", r"re:x", r"lm_head", r".*layers\.[0-3]\.",
        r"^model\.(embed_tokens|norm)$", r".*\.experts\.\d{1,3}\.", r"[^.]+\.layers", r"(?i)MODEL", r"a*?b",
        r"(ab|a)(bc|c)?d", r"x{2,4}y", r"x{0}y", r"", r"()*a", r"(a|)+b", r"\w+\.\s*\S", r"[a-c\d_]+$"]
NAMES = ["model.layers.0.self_attn.q_proj", "model.layers.12.mlp.down_proj", "lm_head", "model.embed_tokens",
         "model.norm", "model.layers.3.block_sparse_moe.experts.127.w1", "abcd", "abd", "xxxy", "xy", "y", "",
         "re:x", "ab", "a", "b", "aab", "Model.x", "foo_1.bar baz", "abc_9"]


@pytest.mark.parametrize("pattern", REAL)
def test_real_patterns_answer_as_re_match(pattern):
    compiled = compile_pattern(pattern)
    for name in NAMES:
        assert compiled.match(name) == (re.match(pattern, name) is not None), (pattern, name)


ATOMS = st.sampled_from(["a", "b", ".", "[ab]", "[^a]", r"\d", "1", "(a|b)", "(ab|a)", "(a|)", "()"])
QUANT = st.sampled_from(["", "", "*", "+", "?", "{2}", "{1,3}", "*?", "+?", "{0,2}"])


@st.composite
def patterns(draw):
    parts = []
    for _ in range(draw(st.integers(0, 5))):
        atom = draw(ATOMS)
        quant = draw(QUANT)
        parts.append(atom + quant if not (atom == "()" and quant) else atom)
        if draw(st.booleans()) and len(parts) > 1:
            parts = ["(" + "".join(parts) + ")" + draw(QUANT)]
    text = "".join(parts)
    if draw(st.booleans()):
        text = "^" + text
    if draw(st.booleans()):
        text += "$"
    return text


@settings(max_examples=400, deadline=None)
@given(patterns(), st.text(alphabet="ab1.", max_size=8))
def test_random_patterns_answer_as_re_match(pattern, name):
    try:
        want = re.match(pattern, name) is not None
    except re.error:
        return
    assert compile_pattern(pattern).match(name) == want, (pattern, name)


@pytest.mark.parametrize("pattern", [r"(a+)+$", r"(a|a)*$", r"(a*)*b", r".*a.*a.*a.*a.*a.*b", r"(x+x+)+y"])
def test_catastrophic_patterns_cost_one_pass(pattern):
    """Each of these takes Python's re seconds to years on such a name; the automaton
    visits each character once with a bounded state set (checked by counting steps, not
    by timing)."""
    name = "a" * 20000 + "!" if "x" not in pattern else "x" * 20000
    compiled = compile_pattern(pattern)
    assert len(compiled._states) < 64
    assert compiled.match(name) is False


@pytest.mark.parametrize("pattern, what", [
    (r"(a)\1", "GROUPREF"), (r"(?=a)", "ASSERT"), (r"(?<!a)b", "ASSERT_NOT"), (r"(?i:a)b", "inline flags"),
    (r"(?>a+)b", "ATOMIC_GROUP"), (r"a++", "possessive"), (r"\bx", "the anchor"),
])
def test_what_an_automaton_cannot_do_is_refused_by_name(pattern, what):
    try:
        re.compile(pattern)
    except re.error:
        pytest.skip(f"this Python's re has no {pattern!r}")
    with pytest.raises(aprfast.CorruptError, match=re.escape(what)):
        compile_pattern(pattern)


@pytest.mark.parametrize("pattern", ["(", "[a-", "a{2,1}", 7])
def test_not_a_pattern_is_a_corrupt_error(pattern):
    with pytest.raises(aprfast.CorruptError, match="pattern"):
        compile_pattern(pattern)


def test_huge_repeats_are_refused_before_they_are_built():
    with pytest.raises(aprfast.CorruptError, match=f"more than {MAX_STATES}"):
        compile_pattern("(ab){4000}")
    with pytest.raises(aprfast.CorruptError, match=f"more than {MAX_STATES}"):
        compile_pattern("a{1,100000}")
