"""Byte-exact Python mirror of Rust's ``serde_json::to_vec`` compact output.

The APR metadata blob is written by Rust with ``serde_json::to_vec`` (either a
``serde_json::Value`` or a ``#[derive(Serialize)]`` struct).  To produce files
that are byte-identical to the Rust writer this module reimplements, in pure
Python, the three parts of serde_json's output that decide its bytes:

* float formatting.  serde_json 1.0.147 and later format floats with the
  ``zmij`` crate (earlier releases used ``ryu``).  Both print the shortest
  digits that round-trip, and both put them in plain notation only inside a
  fixed window of decimal exponents, scientific notation outside it:

  ======  ===============================  =============================
  type    plain notation when              examples
  ======  ===============================  =============================
  f64     1e-5  <= |x| < 1e16              0.00001, 1e-6, 1e+16
  f32     1e-6  <= |x| < 1e13              0.000001, 1e-7, 1e+13
  ======  ===============================  =============================

  (the window is on the exponent of the *shortest* digits, d.ddd x 10**e,
  i.e. e in -5..=15 for f64 and e in -6..=12 for f32).  Plain numbers always
  carry a fractional part ("1.0", "100.0"); scientific numbers drop a lone
  ".0" ("1e-7") and, unlike ryu, write an explicit "+" on positive exponents
  ("1e+16", "1.5e+300").  Exponents are never zero padded.  Zero is "0.0" or
  "-0.0".  serde_json writes ``null`` for NaN and infinities.

* string escaping: only '"', '\\' and control characters below U+0020 are
  escaped (\\b \\f \\n \\r \\t short forms, the rest as \\u00XX with lowercase
  hex); DEL (0x7f), U+2028/U+2029 and all non-ASCII text are written raw as
  UTF-8.  This is exactly what ``json.encoder.encode_basestring`` (CPython's
  C escaper, used by ``json.dumps(..., ensure_ascii=False)``) produces, so it
  is reused for speed.

* map key order: serde_json writes struct fields in declaration order and a
  ``Value`` map in its own order; here the caller supplies dicts whose
  insertion order already is the wanted order, and it is kept as given.

Checked byte for byte against serde_json 1.0.154 with zmij 1.0.23 (the
newest on crates.io when this was written), serde_json 1.0.150 with zmij
1.0.21 and serde_json 1.0.147 with zmij 0.1.7, which all agree: millions of
random f64 and f32 bit patterns, all powers of ten and their neighbours,
integral floats up to 2**70, subnormals, signed zeros, random strings full of
control characters, quotes, backslashes, DEL, U+2028/U+2029 and non-BMP
characters, random nested values, and a derived struct with f32 fields.
ryu 1.0.23 (what serde_json <= 1.0.146 used) picks the same digits and
layout and differs only in writing "1e16" where zmij writes "1e+16".
"""

from __future__ import annotations

import math
from collections.abc import Set as AbstractSet
from json.encoder import encode_basestring as _encode_json_string
from typing import Any

import numpy as np

__all__ = ["dumps", "format_f32", "format_f64"]

# Decimal-exponent windows (inclusive) inside which serde_json writes plain
# notation; outside them it writes d.ddde+XX.  These are ryu's windows, which
# the Rust zmij crate kept (upstream C++ zmij uses narrower ones).
_F64_PLAIN_EXPONENTS = (-5, 15)
_F32_PLAIN_EXPONENTS = (-6, 12)

# serde_json::Value keeps integers as i64 or u64 (no arbitrary_precision).
_MIN_JSON_INT = -(2**63)
_MAX_JSON_INT = 2**64 - 1

# Integers up to this magnitude convert to float64 exactly, so converting
# them to float32 through float64 involves only one rounding.
_EXACT_F64_INT = 2**53


# --------------------------------------------------------------------------
# Float formatting
# --------------------------------------------------------------------------


def _split_scientific(text: str) -> tuple[bool, str, int]:
    """Split "-1.2345e+05"-style text into (negative, "12345", 5).

    The digit string has no decimal point and no trailing zeros; the
    exponent is that of the first digit (value = d.ddd x 10**exp).
    """
    mantissa, _, exponent = text.partition("e")
    negative = mantissa.startswith("-")
    digits = mantissa.lstrip("-").replace(".", "").rstrip("0") or "0"
    return negative, digits, int(exponent)


def _layout_shortest(negative: bool, digits: str, exp: int, plain_window: tuple[int, int]) -> str:
    """Lay out shortest digits the way zmij (serde_json's float writer) does."""
    sign = "-" if negative else ""
    lowest_plain, highest_plain = plain_window
    if lowest_plain <= exp <= highest_plain:
        if len(digits) <= exp + 1:
            # All digits before the point: ("1234", 10) -> 12340000000.0
            return sign + digits + "0" * (exp + 1 - len(digits)) + ".0"
        if exp >= 0:
            # Point inside the digits: ("1234", 1) -> 12.34
            return sign + digits[: exp + 1] + "." + digits[exp + 1 :]
        # Below one: ("1234", -3) -> 0.001234
        return sign + "0." + "0" * (-exp - 1) + digits
    # Scientific: one digit before the point, no ".0" for a single digit,
    # explicit sign on the exponent, no zero padding.
    mantissa = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
    return sign + mantissa + ("e+" if exp >= 0 else "e-") + str(abs(exp))


def format_f64(x: float) -> str:
    """Return exactly what serde_json writes for the Rust f64 value ``x``.

    Non-finite values give "null", as serde_json writes them.
    """
    if not math.isfinite(x):
        return "null"
    # repr() yields the shortest round-trip digits.  Its own plain-notation
    # window (exponent -4..15) sits inside zmij's (-5..15) and uses the same
    # plain layout ("100.0", "0.0001", "-0.0"), so plain reprs are already
    # right; only scientific reprs ("1e-05", "1e+16") need re-laying out.
    text = float.__repr__(float(x))
    if "e" not in text:
        return text
    negative, digits, exp = _split_scientific(text)
    return _layout_shortest(negative, digits, exp, _F64_PLAIN_EXPONENTS)


def _intto_f32(n: int) -> np.float32:
    """Round a Python int to the nearest float32 (ties to even), like Rust `as`.

    Going through float64 first can round twice for |n| > 2**53, so large
    ints are cut to 24 significant bits here with one correct rounding.
    """
    if -_EXACT_F64_INT <= n <= _EXACT_F64_INT:
        return np.float32(float(n))
    magnitude = abs(n)
    drop = magnitude.bit_length() - 24
    kept, rest = magnitude >> drop, magnitude & ((1 << drop) - 1)
    half = 1 << (drop - 1)
    if rest > half or (rest == half and kept & 1):
        kept += 1
    # kept * 2**drop is exact in float64 unless it exceeds the float64 range,
    # in which case it is far beyond float32 range anyway.
    try:
        rounded = math.ldexp(float(kept), drop)
    except OverflowError:
        rounded = math.inf
    with np.errstate(over="ignore"):
        return np.float32(-rounded if n < 0 else rounded)


def to_f32(x: Any) -> np.float32:
    """Convert a number to float32 the way Rust's `as f32` would."""
    if isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_)):
        return _intto_f32(int(x))
    # Overflow to infinity is the intended result (Rust does the same).
    with np.errstate(over="ignore"):
        return np.float32(x)


def format_f32(x: float) -> str:
    """Return exactly what serde_json writes for the Rust f32 value ``x``.

    ``x`` is first rounded to float32; the digits are the shortest that
    round-trip *as float32*, laid out with zmij's f32 window.  Non-finite
    values (including finite floats that overflow float32) give "null".
    """
    value = to_f32(x)
    if not np.isfinite(value):
        return "null"
    if value == 0:
        return "-0.0" if np.signbit(value) else "0.0"
    # numpy's Dragon4 in unique mode gives the shortest float32 round-trip
    # digits, e.g. "1.2345679e+05", "1e-01".
    text = np.format_float_scientific(value, unique=True, trim="-")
    negative, digits, exp = _split_scientific(text)
    return _layout_shortest(negative, digits, exp, _F32_PLAIN_EXPONENTS)


# --------------------------------------------------------------------------
# Value serialisation
# --------------------------------------------------------------------------


def _format_json_int(n: int) -> str:
    """Format an int that serde_json could hold (i64 or u64), else raise."""
    if not _MIN_JSON_INT <= n <= _MAX_JSON_INT:
        raise ValueError(f"integer {n} is outside the i64/u64 range serde_json can hold")
    # int.__repr__ avoids custom __str__ of int subclasses such as IntEnum.
    return int.__repr__(n)


def _format_json_float(x: float, as_f32: bool) -> str:
    """Format a finite float as f64 or f32; reject NaN and infinities.

    serde_json would quietly write null, but a null where a number was meant
    usually hides a bug, so the caller must decide explicitly.
    """
    text = format_f32(x) if as_f32 else format_f64(x)
    if text == "null":
        kind = "f32" if as_f32 else "f64"
        raise ValueError(f"non-finite {kind} value {x!r} cannot be written as a JSON number")
    return text


def _append_string(chunks: list[str], s: str) -> None:
    # CPython's C escaper matches serde_json's escape table exactly; see the
    # module docstring.  Lone surrogates pass through here and are caught
    # when the joined text is encoded to UTF-8.
    chunks.append(_encode_json_string(s))


def _append_value(chunks: list[str], value: Any, as_f32: bool) -> None:
    """Append the JSON text of ``value`` to ``chunks``.

    ``as_f32`` marks values under an f32-typed Rust field: their numbers are
    written as f32 (ints too, since Rust would hold them as f32 and print
    "10000.0", not "10000").
    """
    kind = type(value)
    # Exact-type checks first: they are the common case and the cheapest.
    if kind is str:
        _append_string(chunks, value)
    elif kind is dict:
        _append_object(chunks, value, as_f32)
    elif kind is list or kind is tuple:
        _append_array(chunks, value, as_f32)
    elif kind is float:
        chunks.append(_format_json_float(value, as_f32))
    elif value is None:
        chunks.append("null")
    # bool before int: bool is an int subclass.
    elif value is True or value is False:
        chunks.append("true" if value else "false")
    elif kind is int:
        chunks.append(_format_json_float(value, True) if as_f32 else _format_json_int(value))
    else:
        _append_other(chunks, value, as_f32)


def _append_other(chunks: list[str], value: Any, as_f32: bool) -> None:
    """Handle subclasses and numpy scalars, the less common types."""
    if isinstance(value, (bool, np.bool_)):
        chunks.append("true" if value else "false")
    elif isinstance(value, (int, np.integer)):
        if as_f32:
            chunks.append(_format_json_float(value, True))
        else:
            chunks.append(_format_json_int(int(value)))
    elif isinstance(value, (float, np.floating)):
        chunks.append(_format_json_float(float(value), as_f32))
    elif isinstance(value, str):
        _append_string(chunks, value)
    elif isinstance(value, dict):
        _append_object(chunks, value, as_f32)
    elif isinstance(value, (list, tuple)):
        _append_array(chunks, value, as_f32)
    else:
        raise TypeError(f"cannot serialise {type(value).__name__} to JSON")


def _append_array(chunks: list[str], items: Any, as_f32: bool) -> None:
    chunks.append("[")
    first = True
    for item in items:
        if not first:
            chunks.append(",")
        first = False
        _append_value(chunks, item, as_f32)
    chunks.append("]")


def _append_object(
    chunks: list[str], mapping: dict, as_f32: bool, f32_keys: AbstractSet[str] = frozenset()
) -> None:
    """Append a JSON object, keeping the dict's insertion order."""
    chunks.append("{")
    first = True
    for key, item in mapping.items():
        if not isinstance(key, str):
            # serde_json would stringify some key types; the caller should
            # decide how, so refuse rather than guess.
            raise ValueError(f"JSON object keys must be str, got {type(key).__name__}: {key!r}")
        if not first:
            chunks.append(",")
        first = False
        _append_string(chunks, key)
        chunks.append(":")
        _append_value(chunks, item, as_f32 or key in f32_keys)
    chunks.append("}")


def dumps(value: Any, *, f32_paths: AbstractSet[str] = frozenset()) -> bytes:
    """Serialise ``value`` to the bytes ``serde_json::to_vec`` would produce.

    ``f32_paths`` names top-level keys whose Rust field is typed f32
    (``f32``, ``Option<f32>``, ``Vec<f32>``): every number under those keys,
    ints included, is written with :func:`format_f32`, as Rust would print
    the f32 it holds (10000 -> "10000.0").  Elsewhere numpy float32 scalars
    are widened to f64, like ``serde_json::Value::from(f32)`` does
    (np.float32(0.1) -> "0.10000000149011612").

    Raises ValueError for non-str dict keys, ints outside [-2**63, 2**64),
    NaN/infinite floats and strings holding lone surrogates; TypeError for
    values that have no JSON form.
    """
    chunks: list[str] = []
    if isinstance(value, dict):
        _append_object(chunks, value, False, f32_paths)
    else:
        _append_value(chunks, value, False)
    text = "".join(chunks)
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as error:
        # Rust strings are always valid UTF-8, so a lone surrogate has no
        # serde_json equivalent.
        raise ValueError("a string contains a lone surrogate, which is not valid UTF-8") from error
