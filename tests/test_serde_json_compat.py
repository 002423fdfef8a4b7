"""Byte-compatibility tests for aprfast.layouts.serde_json against Rust's serde_json.

The golden tables below were captured from the real serde_json 1.0.154
(float formatting by zmij 1.0.23) with a throwaway Rust program that printed
``serde_json::to_vec`` of each input; no Rust toolchain is needed here.
Float inputs of F32_GOLDEN are rounded to float32 first, as Rust's ``as f32``
does, so e.g. 16777217.0 prints as "16777216.0".
"""

import json
import math
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aprfast.layouts.serde_json import dumps, format_f32, format_f64

# RFC 8259 number grammar: whatever serde_json writes must be valid JSON.
JSON_NUMBER = re.compile(r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?")

F64_GOLDEN = [
    # zero and signs
    (0.0, '0.0'),
    (-0.0, '-0.0'),
    # plain, all digits before the point ("1234e7 -> 12340000000.0")
    (1.0, '1.0'),
    (-1.0, '-1.0'),
    (10.0, '10.0'),
    (100.0, '100.0'),
    (123.0, '123.0'),
    (1000000000000000.0, '1000000000000000.0'),
    (-1000000000000000.0, '-1000000000000000.0'),
    (9007199254740992.0, '9007199254740992.0'),
    (9007199254740994.0, '9007199254740994.0'),
    (9999999999999998.0, '9999999999999998.0'),
    (1234567890123456.0, '1234567890123456.0'),
    (2251799813685248.5, '2251799813685248.5'),
    # plain, point inside the digits
    (1.5, '1.5'),
    (-2.5, '-2.5'),
    (12.34, '12.34'),
    (123456.789, '123456.789'),
    (3.141592653589793, '3.141592653589793'),
    (3.0000000000000004, '3.0000000000000004'),
    (1000000000000000.5, '1000000000000000.5'),
    (1797693134862315.8, '1797693134862315.8'),
    # plain, below one ("0.00ddd"), down to the 1e-5 edge
    (0.1, '0.1'),
    (-0.1, '-0.1'),
    (0.5, '0.5'),
    (0.001234, '0.001234'),
    (0.0001, '0.0001'),
    (1e-05, '0.00001'),
    (-1e-05, '-0.00001'),
    (1.5e-05, '0.000015'),
    (1.234e-05, '0.00001234'),
    (1.0000000000000003e-05, '0.000010000000000000003'),
    (9.99e-05, '0.0000999'),
    (0.30000000000000004, '0.30000000000000004'),
    (0.3333333333333333, '0.3333333333333333'),
    (0.6666666666666666, '0.6666666666666666'),
    # scientific, small
    (9.999999999999999e-06, '9.999999999999999e-6'),
    (9.99e-06, '9.99e-6'),
    (1e-06, '1e-6'),
    (1e-07, '1e-7'),
    (-1e-07, '-1e-7'),
    (1.5e-07, '1.5e-7'),
    (1.2345e-10, '1.2345e-10'),
    (1e-100, '1e-100'),
    (1e-99, '1e-99'),
    (1e-300, '1e-300'),
    # scientific, large: the 1e16 edge and beyond
    (1e+16, '1e+16'),
    (-1e+16, '-1e+16'),
    (1.5e+16, '1.5e+16'),
    (1.0000000000000002e+16, '1.0000000000000002e+16'),
    (1.8014398509481984e+16, '1.8014398509481984e+16'),
    (1.8446744073709552e+19, '1.8446744073709552e+19'),
    (1.1805916207174113e+21, '1.1805916207174113e+21'),
    (1e+21, '1e+21'),
    (1e+22, '1e+22'),
    (1e+23, '1e+23'),
    (1.2345678901234567e+19, '1.2345678901234567e+19'),
    (1e+99, '1e+99'),
    (1e+100, '1e+100'),
    (1.5e+300, '1.5e+300'),
    (1e+308, '1e+308'),
    # extremes and subnormals
    (1.7976931348623157e+308, '1.7976931348623157e+308'),
    (-1.7976931348623157e+308, '-1.7976931348623157e+308'),
    (2.2250738585072014e-308, '2.2250738585072014e-308'),
    (2.225073858507201e-308, '2.225073858507201e-308'),
    (5e-324, '5e-324'),
    (-5e-324, '-5e-324'),
    (1e-323, '1e-323'),
    (2.5e-323, '2.5e-323'),
    (4.94e-322, '4.94e-322'),
    # non-finite: serde_json writes null
    (float('nan'), 'null'),
    (float('inf'), 'null'),
    (float('-inf'), 'null'),
]
F32_GOLDEN = [
    (0.0, '0.0'),
    (-0.0, '-0.0'),
    # plain, all digits before the point
    (1.0, '1.0'),
    (-1.0, '-1.0'),
    (10.0, '10.0'),
    (100.0, '100.0'),
    (10000.0, '10000.0'),
    (500000.0, '500000.0'),
    (1000000.0, '1000000.0'),
    (16777216.0, '16777216.0'),
    (16777217.0, '16777216.0'),
    (123456789.0, '123456790.0'),
    (1000000000000.0, '1000000000000.0'),
    (-1000000000000.0, '-1000000000000.0'),
    (9999999000000.0, '9999999000000.0'),
    (4294967296.0, '4294967300.0'),
    # plain, point inside the digits
    (1.5, '1.5'),
    (3.141592653589793, '3.1415927'),
    (12.34, '12.34'),
    (123456.79, '123456.79'),
    (-2.71828, '-2.71828'),
    (65504.5, '65504.5'),
    (123456780000.0, '123456780000.0'),
    # plain, below one, down to the 1e-6 edge
    (0.1, '0.1'),
    (-0.1, '-0.1'),
    (0.3, '0.3'),
    (0.30000000000000004, '0.3'),
    (0.5, '0.5'),
    (1e-05, '0.00001'),
    (1e-06, '0.000001'),
    (-1e-06, '-0.000001'),
    (1.5e-06, '0.0000015'),
    (9.99e-06, '0.00000999'),
    (1.234e-05, '0.00001234'),
    # scientific, small
    (9.999999e-07, '9.999999e-7'),
    (9.99e-07, '9.99e-7'),
    (9.99999883788405e-07, '9.999999e-7'),
    (1.0000001111620804e-06, '0.0000010000001'),
    (1e-07, '1e-7'),
    (-1e-07, '-1e-7'),
    (1.5e-07, '1.5e-7'),
    (1e-10, '1e-10'),
    (1.1754944e-38, '1.1754944e-38'),
    (1e-38, '1e-38'),
    # scientific, large: the 1e13 edge and beyond
    (10000000000000.0, '1e+13'),
    (-10000000000000.0, '-1e+13'),
    (15000000000000.0, '1.5e+13'),
    (9999998779392.0, '9999999000000.0'),
    (10000000876544.0, '1.0000001e+13'),
    (17592186044416.0, '1.7592186e+13'),
    (1.8446744073709552e+19, '1.8446744e+19'),
    (1.1805916207174113e+21, '1.1805916e+21'),
    (1e+20, '1e+20'),
    (1e+30, '1e+30'),
    (3.4028235e+38, '3.4028235e+38'),
    (-3.4028235e+38, '-3.4028235e+38'),
    # subnormals
    (1e-45, '1e-45'),
    (1.4e-45, '1e-45'),
    (3e-45, '3e-45'),
    (1e-40, '1e-40'),
    (1.1754942e-38, '1.1754942e-38'),
    # non-finite, including finite doubles that overflow float32
    (float('nan'), 'null'),
    (float('inf'), 'null'),
    (float('-inf'), 'null'),
    (1e+39, 'null'),
    (-3.5e+38, 'null'),
]
STRING_GOLDEN = [
    ('', '""'),
    ('plain', '"plain"'),
    ('"', '"\\""'),
    ('\\', '"\\\\"'),
    ('/', '"/"'),
    ('\x08\x0c\n\r\t', '"\\b\\f\\n\\r\\t"'),
    ('\x00', '"\\u0000"'),
    ('\x01\x1f', '"\\u0001\\u001f"'),
    ('\x0b', '"\\u000b"'),
    ('\x7f', '"\x7f"'),
    ('\x80\x85\x9f', '"\x80\x85\x9f"'),
    ('\u2028\u2029', '"\u2028\u2029"'),
    ('\ufeff', '"\ufeff"'),
    ('\uffff', '"\uffff"'),
    ('café 中文', '"café 中文"'),
    ('😀', '"😀"'),
    ('\U0010ffff', '"\U0010ffff"'),
    ('a"b\\c\nd', '"a\\"b\\\\c\\nd"'),
    # every control character below U+0020, in order
    (
        "".join(chr(c) for c in range(0x20)),
        (
            '"\\u0000\\u0001\\u0002\\u0003\\u0004\\u0005\\u0006\\u0007\\b\\t\\n\\u000b\\f\\r\\u000e'
            '\\u000f\\u0010\\u0011\\u0012\\u0013\\u0014\\u0015\\u0016\\u0017\\u0018\\u0019\\u001a'
            '\\u001b\\u001c\\u001d\\u001e\\u001f"'
        ),
    ),
    ('</script>', '"</script>"'),
    ("'single'", '"\'single\'"'),
]

# (value, f32_paths, serde_json output).  Plain values were checked through
# serde_json::Value (with preserve_order, so keys keep their order); the
# f32_paths cases through a #[derive(Serialize)] struct whose rope_theta is
# Option<f32>, rms_norm_eps is f32 and scales is Vec<f32>.
NESTED_GOLDEN = [
    ({}, frozenset(), "{}"),
    ([], frozenset(), "[]"),
    ([[[[[]]]]], frozenset(), "[[[[[]]]]]"),
    ({"a": {"b": {"c": {}}}}, frozenset(), '{"a":{"b":{"c":{}}}}'),
    ({"a": [1, 2.5, {"b": None}], "c": True, "d": False}, frozenset(), '{"a":[1,2.5,{"b":null}],"c":true,"d":false}'),
    # insertion order is kept, not sorted
    ({"z": 1, "a": 2, "m": 3, "_": 4, "A": 5}, frozenset(), '{"z":1,"a":2,"m":3,"_":4,"A":5}'),
    # keys are escaped like values
    (
        {"k\n\"ey\u2028": "v\x00\x7f", "\U0001F600": "\t"},
        frozenset(),
        '{"k\\n\\"ey\u2028":"v\\u0000\x7f","\U0001F600":"\\t"}',
    ),
    (
        [0, -1, 2**64 - 1, -(2**63), 2**63 - 1, 1e16, -0.0, 1e-7, 1e-5, "x", None],
        frozenset(),
        '[0,-1,18446744073709551615,-9223372036854775808,9223372036854775807,1e+16,-0.0,1e-7,0.00001,"x",null]',
    ),
    # tuples are arrays
    ([1, "two", 3.0, (4.5e300, 5e-324)], frozenset(), '[1,"two",3.0,[4.5e+300,5e-324]]'),
    # numpy scalars: np.float32 widens to f64 like serde_json::Value::from(f32)
    (
        {
            "a": np.float32(0.1),
            "b": np.int64(5),
            "c": np.bool_(True),
            "d": np.float64(0.5),
            "e": np.uint64(2**64 - 1),
            "f": np.float16(65504),
        },
        frozenset(),
        '{"a":0.10000000149011612,"b":5,"c":true,"d":0.5,"e":18446744073709551615,"f":65504.0}',
    ),
    # struct with f32 fields; the nested "rope_theta" is not top-level, so f64
    (
        {
            "name": "llama",
            "rope_theta": 500000.0,
            "rms_norm_eps": 1e-5,
            "count": 32,
            "offset": -1,
            "ratio": 0.1,
            "scales": [0.1, 1e13, 3.4e38, 1e-7],
            "extra": {"rope_theta": 0.1},
        },
        frozenset({"rope_theta", "rms_norm_eps", "scales"}),
        (
            '{"name":"llama","rope_theta":500000.0,"rms_norm_eps":0.00001,"count":32,"offset":-1,'
            '"ratio":0.1,"scales":[0.1,1e+13,3.4e+38,1e-7],"extra":{"rope_theta":0.1}}'
        ),
    ),
    (
        {
            "name": "qwen\u4e2d",
            "rope_theta": None,
            "rms_norm_eps": 1e-6,
            "count": 0,
            "offset": 0,
            "ratio": 1e16,
            "scales": [],
            "extra": None,
        },
        frozenset({"rope_theta", "rms_norm_eps", "scales"}),
        (
            '{"name":"qwen\u4e2d","rope_theta":null,"rms_norm_eps":0.000001,"count":0,"offset":0,'
            '"ratio":1e+16,"scales":[],"extra":null}'
        ),
    ),
    # ints in f32 fields become f32 (Rust stores them as f32), rounded once
    (
        {
            "name": "",
            "rope_theta": 10000,
            "rms_norm_eps": 16777217,
            "count": 2**64 - 1,
            "offset": -(2**63),
            "ratio": -0.0,
            "scales": [1, 2**60 + 2**36 + 1],
            "extra": [1e-5],
        },
        frozenset({"rope_theta", "rms_norm_eps", "scales"}),
        (
            '{"name":"","rope_theta":10000.0,"rms_norm_eps":16777216.0,"count":18446744073709551615,'
            '"offset":-9223372036854775808,"ratio":-0.0,"scales":[1.0,1.1529216e+18],'
            '"extra":[0.00001]}'
        ),
    ),
]


# --------------------------------------------------------------------------
# Golden tables
# --------------------------------------------------------------------------


@pytest.mark.parametrize("value, expected", F64_GOLDEN)
def test_format_f64_matches_serde_json(value, expected):
    assert format_f64(value) == expected


@pytest.mark.parametrize("value, expected", F32_GOLDEN)
def test_format_f32_matches_serde_json(value, expected):
    assert format_f32(value) == expected


@pytest.mark.parametrize("value, expected", [case for case in F64_GOLDEN if case[1] != "null"])
def test_dumps_writes_f64_like_serde_json(value, expected):
    assert dumps([value]) == b"[" + expected.encode() + b"]"


@pytest.mark.parametrize("value, expected", [case for case in F32_GOLDEN if case[1] != "null"])
def test_dumps_writes_f32_paths_like_serde_json(value, expected):
    assert dumps({"x": value}, f32_paths={"x"}) == b'{"x":' + expected.encode() + b"}"


@pytest.mark.parametrize("text, expected", STRING_GOLDEN)
def test_dumps_escapes_strings_like_serde_json(text, expected):
    assert dumps(text) == expected.encode("utf-8")


@pytest.mark.parametrize("value, f32_paths, expected", NESTED_GOLDEN)
def test_dumps_nested_values_like_serde_json(value, f32_paths, expected):
    assert dumps(value, f32_paths=f32_paths) == expected.encode("utf-8")


# --------------------------------------------------------------------------
# Errors and edge rules
# --------------------------------------------------------------------------


@pytest.mark.parametrize("value", [math.nan, -math.nan, math.inf, -math.inf, np.float32("nan"), np.float64("inf")])
def test_dumps_rejects_non_finite_floats(value):
    with pytest.raises(ValueError):
        dumps({"x": [value]})


def test_dumps_rejects_floats_that_overflow_an_f32_path():
    assert dumps({"x": 3.4e38}, f32_paths={"x"}) == b'{"x":3.4e+38}'
    with pytest.raises(ValueError):
        dumps({"x": 1e39}, f32_paths={"x"})


@pytest.mark.parametrize("value", [2**64, -(2**63) - 1, 10**30, -(10**30)])
def test_dumps_rejects_ints_serde_json_cannot_hold(value):
    with pytest.raises(ValueError):
        dumps([value])


def test_dumps_writes_huge_integral_floats_as_floats():
    assert dumps([float(2**64), 1e30]) == b"[1.8446744073709552e+19,1e+30]"


def test_dumps_accepts_the_integer_range_edges():
    assert dumps([2**64 - 1, -(2**63), np.int8(-128), np.uint8(255)]) == (
        b"[18446744073709551615,-9223372036854775808,-128,255]"
    )


@pytest.mark.parametrize("key", [1, 1.5, None, True, b"k", ("a",)])
def test_dumps_rejects_non_str_keys(key):
    with pytest.raises(ValueError):
        dumps({"ok": {key: 1}})


@pytest.mark.parametrize("value", ["\ud800", "a\udfffb", {"\udc00": 1}, ["x", "\ud83d"]])
def test_dumps_rejects_lone_surrogates(value):
    with pytest.raises(ValueError):
        dumps(value)


def test_dumps_writes_astral_characters_raw_as_utf8():
    assert dumps("\U0001F600") == '"\U0001F600"'.encode("utf-8") == b'"\xf0\x9f\x98\x80"'


@pytest.mark.parametrize("value", [{1, 2}, object(), b"bytes", np.zeros(2)])
def test_dumps_rejects_values_without_a_json_form(value):
    with pytest.raises(TypeError):
        dumps([value])


def test_bool_is_not_written_as_an_int():
    assert dumps([True, False, np.bool_(False)]) == b"[true,false,false]"
    assert dumps({"x": True}, f32_paths={"x"}) == b'{"x":true}'


def test_f32_paths_only_apply_to_top_level_keys():
    value = {"a": 0.1, "b": {"a": 0.1}, "c": [0.1]}
    assert dumps(value, f32_paths={"a", "c"}) == b'{"a":0.1,"b":{"a":0.1},"c":[0.1]}'
    assert dumps(value) == b'{"a":0.1,"b":{"a":0.1},"c":[0.1]}'
    assert dumps({"a": np.float32(0.1)}, f32_paths={"a"}) == b'{"a":0.1}'
    assert dumps({"a": np.float32(0.1)}) == b'{"a":0.10000000149011612}'


def test_format_f32_rounds_large_ints_once():
    # 2**60 + 2**36 is a float32 tie (rounds to even, down); the extra +1
    # breaks the tie upward.  Going through float64 would lose the +1.
    assert format_f32(2**60 + 2**36) == "1.1529215e+18"
    assert format_f32(2**60 + 2**36 + 1) == "1.1529216e+18"
    assert format_f32(-(2**60 + 2**36 + 1)) == "-1.1529216e+18"
    assert format_f32(2**128) == "null"


# --------------------------------------------------------------------------
# Properties
# --------------------------------------------------------------------------

finite_f64 = st.floats(allow_nan=False, allow_infinity=False)
finite_f32 = st.floats(width=32, allow_nan=False, allow_infinity=False)


@given(finite_f64)
def test_format_f64_round_trips(x):
    text = format_f64(x)
    assert JSON_NUMBER.fullmatch(text)
    assert float(text) == x
    assert math.copysign(1.0, float(text)) == math.copysign(1.0, x)


@given(finite_f64)
def test_format_f64_uses_plain_notation_exactly_inside_its_window(x):
    # serde_json writes plain notation for 1e-5 <= |x| < 1e16 (and zero).
    plain = x == 0 or 1e-5 <= abs(x) < 1e16
    assert ("e" not in format_f64(x)) == plain


@given(finite_f32)
def test_format_f32_round_trips_as_f32(x):
    text = format_f32(x)
    assert JSON_NUMBER.fullmatch(text)
    assert np.float32(text) == np.float32(x)
    assert np.signbit(np.float32(text)) == np.signbit(np.float32(x))
    # float32 never needs more than 9 significant digits
    mantissa = text.lstrip("-").split("e")[0].replace(".", "").strip("0")
    assert len(mantissa) <= 9


@given(finite_f32)
def test_format_f32_uses_plain_notation_exactly_inside_its_window(x):
    # serde_json writes plain f32 notation for 1e-6 <= |x| < 1e13 (and zero).
    value = abs(np.float32(x))
    plain = value == 0 or np.float32(1e-6) <= value < np.float32(1e13)
    assert ("e" not in format_f32(x)) == plain


@given(finite_f64)
def test_format_f32_of_a_double_is_format_of_its_float32(x):
    with np.errstate(over="ignore"):
        rounded = np.float32(x)
    expected = "null" if np.isinf(rounded) else format_f32(float(rounded))
    assert format_f32(x) == expected


json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | finite_f64
    | st.text()
)
json_values = st.recursive(
    json_scalars,
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(), children, max_size=5),
    max_leaves=30,
)


def _ordered(value):
    """Turn dicts into key/value pair lists, so comparisons check key order."""
    if isinstance(value, dict):
        return [[key, _ordered(item)] for key, item in value.items()]
    if isinstance(value, list):
        return [_ordered(item) for item in value]
    return value


@settings(max_examples=300)
@given(json_values)
def test_dumps_round_trips_through_json_loads(value):
    encoded = dumps(value)
    assert json.loads(encoded) == value
    loaded_in_order = json.loads(encoded, object_pairs_hook=lambda pairs: [[k, _ordered(v)] for k, v in pairs])
    assert loaded_in_order == _ordered(value)


json_values_without_floats = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**63), max_value=2**64 - 1) | st.text(),
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(), children, max_size=5),
    max_leaves=30,
)


@settings(max_examples=300)
@given(json_values_without_floats)
def test_dumps_matches_compact_python_json_when_no_floats(value):
    # Without floats the only differences could come from escaping or
    # spacing, and serde_json's escaping equals Python's ensure_ascii=False.
    expected = json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    assert dumps(value) == expected
