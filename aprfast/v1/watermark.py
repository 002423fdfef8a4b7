"""Buyer fingerprints in model weights (seed 000 §8.3): spread-spectrum, keyed, informed.

A seller who sells one model to many buyers embeds in each copy a pattern that only the
seller's secret ``key`` and that buyer's identity produce.  When a copy leaks, the seller
compares it with the original it still holds and asks, for each buyer, "is this buyer's
pattern in the difference?".

**Embedding.**  For each watermarked tensor ``w`` (by default every floating-point tensor
with two or more dimensions) and each weight ``i`` (row-major order), a keyed stream
gives a sign ``s_i = ±1``; the weight moves by ``t_i = s_i * m_i``:

* float32/float64 ("dense"): ``m_i = strength * |w_i|`` for every weight, so zeros stay
  zero, each weight changes by the same small fraction, and only its low mantissa bits
  move (at the default 5e-5 = 2^-14.3, the lowest 14 of float32's 23);
* float16/bfloat16 ("sparse"): one ulp is already more than ``strength`` (2^-10, 2^-7),
  so a keyed subset of density ``p = (strength / eps)^2`` moves by exactly one ulp
  (``|w| ± spacing(|w|)`` is always representable) and the rest do not move.  The
  root-mean-square relative change is at most ``strength`` in both cases.

**Streams.**  SHAKE-256 over length-prefixed fields, one stream per chunk of
:data:`CHUNK_ELEMENTS` weights (so any chunk can be computed alone, in any order)::

    signs:   SHAKE256("aprfast-watermark-v1:sign\\0"   || lp(key) || SHA256(buyer) || lp(name) || u64le(chunk))
    subset:  SHAKE256("aprfast-watermark-v1:subset\\0" || lp(key) || lp(name) || u64le(chunk))
    lp(x) = u32le(len(x)) || x;   name as UTF-8

bit ``k`` (least significant first within each byte) of the sign stream is weight ``k``
of the chunk, 1 meaning ``+1``; in sparse mode weight ``k`` is in the subset when the
``k``-th little-endian u32 of the subset stream is below ``round(p * 2^32)``.  The buyer's
SHA-256 is :func:`aprfast.v1.licensing.licensee_hash`, so a license's ``licensee_hash``
names the same buyer.  The subset does not depend on the buyer, only the signs do.

**Detection.**  With ``d = suspect - original`` (float64) and ``c_i = m_i * d_i``, the
score of a buyer is ::

    T = sum_i s_i c_i / sqrt(sum_i c_i^2)

For a buyer whose copy this is not (or for a wrong key), the signs are independent of
``c``, so ``T`` is a normalised sum of independent ±1 terms: mean 0, variance 1, and by
Hoeffding's inequality ``P(T >= tau) <= exp(-tau^2 / 2)`` *whatever* was done to the
weights.  The threshold for a family-wise false-positive rate ``alpha`` over ``M``
candidates is therefore ``tau = sqrt(2 ln(M / alpha))`` (6.44 for one buyer at 1e-9).
For the right buyer ``T`` grows like ``strength * sqrt(N) * rms(w) / rms(noise)`` when
independent noise has been added to its ``N`` watermarked weights (``sqrt(N / 3)`` with
none), so larger models carry the mark further.

**What it resists and what it does not.**  Added noise, rounding to float16/bfloat16,
int8 quantisation, light fine-tuning and averaging two copies (both buyers stay
detectable) only add to ``d`` terms the signs do not predict.  Permuting hidden units,
re-scaling layers, distillation into new weights, or averaging many copies spread the
mark until it is not detected; an attacker who holds the key can remove it.  Detection
needs the original weights (blind detection at a strength that leaves outputs unchanged
would need tens of billions of weights), and the buyer list: there is no payload to decode.

docs/FORMAT.md §11.5 records the decisions; :func:`embed_watermark`,
:func:`verify_watermark`, :func:`extract_watermark` and :func:`buyer_fingerprint` are also
exported from :mod:`aprfast.v1`.
"""

from __future__ import annotations

import hashlib
import math
import struct
from typing import Mapping, NamedTuple

import numpy as np

from ..dtypes import bfloat16
from ..errors import TensorNotFoundError
from .licensing import licensee_hash

__all__ = [
    "DEFAULT_STRENGTH",
    "DEFAULT_FALSE_POSITIVE_RATE",
    "CHUNK_ELEMENTS",
    "MIN_KEY_BYTES",
    "WatermarkMatch",
    "buyer_fingerprint",
    "watermark_layers",
    "embed_watermark",
    "watermark_scores",
    "detection_threshold",
    "verify_watermark",
    "extract_watermark",
]

#: Root-mean-square relative change of each watermarked weight (upper bound).  At 5e-5 the
#: logits of a two-layer network move by about 7e-5 of their norm; the seed's "0.0001 -
#: 0.001 typical" would move them by 1.4e-4 to 1.4e-3.
DEFAULT_STRENGTH = 5e-5
#: Chance that :func:`verify_watermark` names a buyer whose copy it is not (a bound).
DEFAULT_FALSE_POSITIVE_RATE = 1e-9
#: Weights per keyed stream: memory stays bounded and chunks are independent.
CHUNK_ELEMENTS = 1 << 20
#: A shorter key could be guessed, and whoever has the key can find and remove the mark.
MIN_KEY_BYTES = 16

_SIGN_DOMAIN = b"aprfast-watermark-v1:sign\x00"
_SUBSET_DOMAIN = b"aprfast-watermark-v1:subset\x00"
# Dense only when a cast's rounding (at most eps/2 relative) is under 1% of the step.
_DENSE_MIN_STEPS_PER_EPS = 64
_MAX_STRENGTH = 1e-2


class WatermarkMatch(NamedTuple):
    """A candidate whose pattern :func:`extract_watermark` found, with its score.

    Examples:
        >>> from aprfast.v1.watermark import WatermarkMatch
        >>> WatermarkMatch("alice", 47.5).buyer
        'alice'
    """

    buyer: object
    score: float


def buyer_fingerprint(buyer) -> bytes:
    """The 32-byte identity a buyer's pattern derives from: SHA-256 of a ``str`` (UTF-8)
    or ``bytes``, or the ``licensee_hash`` of a :class:`~aprfast.v1.licensing.License`.

    Args:
        buyer: A str, bytes, or anything with a ``licensee_hash`` (a License).

    Returns:
        32 bytes.

    Raises:
        TypeError: ``buyer`` is none of those.

    Examples:
        >>> from aprfast import v1
        >>> from aprfast.v1.licensing import License
        >>> len(v1.buyer_fingerprint("alice"))
        32
        >>> v1.buyer_fingerprint(License.issue("alice")) == v1.buyer_fingerprint("alice")
        True
    """
    held = getattr(buyer, "licensee_hash", None)
    if held is not None:
        return bytes(held)
    return licensee_hash(buyer)


def _supported_dtypes() -> tuple:
    kinds = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))
    return kinds + ((np.dtype(bfloat16),) if bfloat16 is not None else ())


def _is_watermarkable(array) -> bool:
    return np.dtype(array.dtype) in _supported_dtypes()


def watermark_layers(tensors: Mapping[str, np.ndarray], layers=None) -> list:
    """The names that get a pattern, sorted: ``layers`` if given (each must be a
    float16/bfloat16/float32/float64 tensor), else every such tensor with two or more
    dimensions (weight matrices and embeddings; biases and norms hold few weights and
    the most sensitive ones).

    Args:
        tensors: A mapping of name -> array.
        layers: The names to mark, or ``None`` for the default choice.

    Returns:
        A sorted list of names.

    Raises:
        TensorNotFoundError: A name of ``layers`` is not in ``tensors``.
        ValueError: A tensor of ``layers`` is not a floating-point tensor.

    Examples:
        >>> import numpy as np
        >>> from aprfast.v1.watermark import watermark_layers
        >>> watermark_layers({"w": np.zeros((2, 2), np.float32), "b": np.zeros(2, np.float32),
        ...                   "ids": np.zeros((2, 2), np.int32)})
        ['w']
    """
    if layers is None:
        return sorted(name for name, array in tensors.items()
                      if _is_watermarkable(np.asarray(array)) and np.ndim(array) >= 2)
    chosen = sorted(set(layers))
    for name in chosen:
        if name not in tensors:
            raise TensorNotFoundError(f"no tensor {name!r} to watermark")
        if not _is_watermarkable(np.asarray(tensors[name])):
            raise ValueError(f"tensor {name!r} is {np.asarray(tensors[name]).dtype}; only float16, "
                             f"bfloat16, float32 and float64 weights carry a watermark")
    return chosen


def _check_key(key) -> bytes:
    if not isinstance(key, (bytes, bytearray, memoryview)):
        raise TypeError(f"key is bytes, not {type(key).__name__}")
    key = bytes(key)
    if len(key) < MIN_KEY_BYTES:
        raise ValueError(f"key has {len(key)} bytes, at least {MIN_KEY_BYTES} are needed")
    return key


def _check_strength(strength) -> float:
    strength = float(strength)
    if not 0.0 < strength <= _MAX_STRENGTH:
        raise ValueError(f"strength {strength} is outside (0, {_MAX_STRENGTH}]")
    return strength


def _lp(data: bytes) -> bytes:
    return struct.pack("<I", len(data)) + data


# ------------------------------------------------------------------ keyed pseudo-random streams


def _sign_bytes(key: bytes, buyer_hash: bytes, name: str, chunk: int, count: int) -> np.ndarray:
    """The sign stream of one chunk, 8 weights per byte, least significant bit first."""
    xof = hashlib.shake_256(_SIGN_DOMAIN + _lp(key) + buyer_hash + _lp(name.encode("utf-8"))
                            + struct.pack("<Q", chunk))
    return np.frombuffer(xof.digest((count + 7) // 8), dtype=np.uint8)


def _sign_bits(key: bytes, buyer_hash: bytes, name: str, chunk: int, count: int) -> np.ndarray:
    """0/1 per weight of one chunk (1 = +1)."""
    packed = _sign_bytes(key, buyer_hash, name, chunk, count)
    return np.unpackbits(packed, count=count, bitorder="little")


# Row b holds the eight signs that byte b of a sign stream stands for: detection expands
# a stream with one table lookup instead of unpacking bits and mapping them to ±1.
_SIGNS_OF_BYTE = (np.unpackbits(np.arange(256, dtype=np.uint8)[:, None], axis=1, bitorder="little")
                  .astype(np.float32) * 2.0 - 1.0)


def _subset_mask(key: bytes, name: str, chunk: int, count: int, density: float) -> np.ndarray:
    if density >= 1.0:
        return np.ones(count, dtype=bool)
    xof = hashlib.shake_256(_SUBSET_DOMAIN + _lp(key) + _lp(name.encode("utf-8"))
                            + struct.pack("<Q", chunk))
    draws = np.frombuffer(xof.digest(4 * count), dtype="<u4")
    return draws < min(round(density * 2.0 ** 32), 2 ** 32 - 1)


# ------------------------------------------------------------------ per-weight magnitudes


def _finfo(dtype):
    if bfloat16 is not None and dtype == np.dtype(bfloat16):
        import ml_dtypes

        return ml_dtypes.finfo(bfloat16)
    return np.finfo(dtype)


class _TensorPlan:
    """How one tensor of one dtype is marked at one strength: dense or sparse, and the
    subset density.  Buyer-independent, so detection computes it once."""

    def __init__(self, name: str, dtype, strength: float, key: bytes):
        self.name = name
        self.dtype = np.dtype(dtype)
        self.key = key
        info = _finfo(self.dtype)
        self.eps = float(info.eps)
        self.max = float(info.max)
        self.tiny = float(info.tiny)
        self.strength = strength
        self.dense = strength >= _DENSE_MIN_STEPS_PER_EPS * self.eps
        self.density = 1.0 if self.dense else min(1.0, (strength / self.eps) ** 2)

    def magnitudes(self, chunk: int, original: np.ndarray, values: np.ndarray) -> np.ndarray:
        """``m_i`` for one chunk of the original weights (``original`` in its dtype,
        ``values`` the same as float64); 0 where a weight is not marked."""
        # inf and NaN weights, and the spacing above the largest finite value, are
        # expected here and dropped below.
        with np.errstate(invalid="ignore", over="ignore"):
            size = np.abs(values)
            if self.dense:
                step = size * self.strength
            else:
                step = np.zeros_like(size)
                chosen = _subset_mask(self.key, self.name, chunk, len(values), self.density)
                chosen &= size >= self.tiny  # zeros and subnormals stay as they are
                # One ulp above |w|; |w| minus it is representable too (a finer grid below 2^e).
                step[chosen] = np.spacing(np.abs(original[chosen])).astype(np.float64)
            # Non-finite weights and weights one step from overflow are left alone whatever
            # the sign, so that the magnitudes never depend on the buyer.
            step[~(size + step <= self.max)] = 0.0
        return step


def _chunks(total: int):
    for index, start in enumerate(range(0, total, CHUNK_ELEMENTS)):
        yield index, start, min(total, start + CHUNK_ELEMENTS)


# ------------------------------------------------------------------ embedding


def embed_watermark(tensors: Mapping[str, np.ndarray], buyer, *, key: bytes,
                    strength: float = DEFAULT_STRENGTH, layers=None) -> dict:
    """A copy of ``tensors`` in which the chosen layers carry ``buyer``'s pattern.

    ``buyer`` is a str, bytes or :class:`~aprfast.v1.licensing.License` (its licensee);
    ``key`` is the seller's secret (at least :data:`MIN_KEY_BYTES` bytes), needed again
    to detect.  Marked tensors are new arrays of the same dtype and shape; the others are
    the same objects as in ``tensors``.  The seller must keep the original weights:
    detection compares against them.  docs/FORMAT.md §11.5 has the streams and the
    detection statistic.

    Args:
        tensors: The original weights, name -> array.
        buyer: The buyer (str, bytes or a License).
        key: The seller's secret, at least 16 bytes.
        strength: Root-mean-square relative change of a marked weight, in (0, 0.01].
        layers: The names to mark (default: :func:`watermark_layers`).

    Returns:
        A new dict name -> array.

    Raises:
        TensorNotFoundError: A name of ``layers`` is not in ``tensors``.
        ValueError: A short key, a strength out of range, or a non-float layer.
        TypeError: ``key`` is not bytes.

    Examples:
        >>> import numpy as np
        >>> from aprfast import v1
        >>> original = {"w": np.linspace(-1, 1, 4096, dtype=np.float32).reshape(64, 64)}
        >>> key = b"seller secret 16"
        >>> alice = v1.embed_watermark(original, "alice", key=key)
        >>> alice["w"].dtype, alice["w"].shape, bool(np.array_equal(alice["w"], original["w"]))
        (dtype('float32'), (64, 64), False)
        >>> float(np.max(np.abs(alice["w"] - original["w"]))) < 1e-4
        True
    """
    key = _check_key(key)
    strength = _check_strength(strength)
    buyer_hash = buyer_fingerprint(buyer)
    marked = dict(tensors)
    for name in watermark_layers(tensors, layers):
        marked[name] = _embed_tensor(np.asarray(tensors[name]), name, buyer_hash, key, strength)
    return marked


def _embed_tensor(original: np.ndarray, name: str, buyer_hash: bytes, key: bytes,
                  strength: float) -> np.ndarray:
    plan = _TensorPlan(name, original.dtype, strength, key)
    flat_in = np.ascontiguousarray(original).reshape(-1)
    out = np.empty(flat_in.shape, dtype=original.dtype)
    for chunk, start, stop in _chunks(flat_in.size):
        piece = flat_in[start:stop]
        values = piece.astype(np.float64)
        step = plan.magnitudes(chunk, piece, values)
        bits = _sign_bits(key, buyer_hash, name, chunk, stop - start)
        moved = values + np.where(bits, step, -step)
        # Unmarked weights keep their exact bits (NaN payloads, the sign of zero).
        out[start:stop] = np.where(step > 0.0, moved.astype(original.dtype), piece)
    return out.reshape(original.shape)


# ------------------------------------------------------------------ detection


def detection_threshold(false_positive_rate: float = DEFAULT_FALSE_POSITIVE_RATE,
                        candidates: int = 1) -> float:
    """The score above which a buyer is named, so that the chance of naming any of
    ``candidates`` innocent buyers is at most ``false_positive_rate`` (Hoeffding bound
    with a union bound: ``sqrt(2 ln(candidates / rate))``).

    Args:
        false_positive_rate: The chance allowed, in (0, 1).
        candidates: How many buyers are tested.

    Returns:
        The threshold score.

    Raises:
        ValueError: A rate outside (0, 1).

    Examples:
        >>> from aprfast.v1.watermark import detection_threshold
        >>> round(detection_threshold(), 2), round(detection_threshold(candidates=1000), 2)
        (6.44, 7.43)
    """
    if not 0.0 < false_positive_rate < 1.0:
        raise ValueError(f"false_positive_rate {false_positive_rate} is outside (0, 1)")
    return math.sqrt(2.0 * math.log(max(1, candidates) / false_positive_rate))


def watermark_scores(tensors: Mapping[str, np.ndarray], *, original: Mapping[str, np.ndarray],
                     key: bytes, candidates, strength: float = DEFAULT_STRENGTH,
                     layers=None) -> np.ndarray:
    """The score ``T`` of every candidate buyer (float64 array, candidates' order).

    Under "not this buyer" a score is a normalised sum of independent random signs (mean
    0, variance 1, tail at most ``exp(-T^2/2)``).  Tensors of ``original`` missing from
    ``tensors`` or of another shape are skipped (a partial leak is still evidence); at
    least one must remain.

    Args:
        tensors: The suspect weights, name -> array.
        original: The seller's unmarked weights.
        key: The seller's secret used to embed.
        candidates: The buyers to score (str, bytes or License each).
        strength: The strength used to embed.
        layers: The marked names (default: :func:`watermark_layers` of ``original``).

    Returns:
        A float64 array, one score per candidate.

    Raises:
        ValueError: No marked tensor of ``original`` is in ``tensors`` with its shape, a
            short key or a strength out of range.
        TypeError: ``key`` is not bytes.

    Examples:
        >>> import numpy as np
        >>> from aprfast import v1
        >>> original = {"w": np.linspace(-1, 1, 4096, dtype=np.float32).reshape(64, 64)}
        >>> key = b"seller secret 16"
        >>> alice = v1.embed_watermark(original, "alice", key=key)
        >>> from aprfast.v1.watermark import watermark_scores
        >>> scores = watermark_scores(alice, original=original, key=key, candidates=["alice", "bob"])
        >>> bool(scores[0] > 30), bool(abs(scores[1]) < 6)
        (True, True)
    """
    key = _check_key(key)
    strength = _check_strength(strength)
    hashes = [buyer_fingerprint(candidate) for candidate in candidates]
    names = [name for name in watermark_layers(original, layers)
             if name in tensors and np.shape(tensors[name]) == np.shape(original[name])]
    if not names:
        raise ValueError("no watermarked tensor of the original is in the suspect with the same shape")
    correlations = np.zeros(len(hashes))
    energy = 0.0
    for name in names:
        energy += _correlate_tensor(np.asarray(tensors[name]), np.asarray(original[name]), name,
                                    hashes, key, strength, correlations)
    if energy == 0.0:  # the suspect equals the original where marks would be: no evidence
        return np.zeros(len(hashes))
    return correlations / math.sqrt(energy)


def _correlate_tensor(suspect, original, name, hashes, key, strength, correlations) -> float:
    """Add ``sum s_i c_i`` per candidate into ``correlations``; return ``sum c_i^2``."""
    plan = _TensorPlan(name, original.dtype, strength, key)
    flat_orig = np.ascontiguousarray(original).reshape(-1)
    flat_susp = np.ascontiguousarray(suspect).reshape(-1)
    energy = 0.0
    for chunk, start, stop in _chunks(flat_orig.size):
        reference = flat_orig[start:stop]
        values = reference.astype(np.float64)
        weighted = flat_susp[start:stop].astype(np.float64)
        with np.errstate(invalid="ignore", over="ignore"):
            weighted -= values
            weighted *= plan.magnitudes(chunk, reference, values)
        weighted[~np.isfinite(weighted)] = 0.0  # a NaN or an infinity cannot testify
        energy += float(weighted @ weighted)
        scale = float(np.max(np.abs(weighted), initial=0.0))
        if scale == 0.0:
            continue
        # The per-candidate sums run in float32 on values scaled into [-1, 1]: they
        # dominate detection time, and their rounding moves a score by well under 1e-3.
        padded = np.zeros(-(-(stop - start) // 8) * 8, dtype=np.float32)
        padded[:stop - start] = weighted / scale
        signs = np.empty((len(padded) // 8, 8), dtype=np.float32)
        for row, buyer_hash in enumerate(hashes):
            np.take(_SIGNS_OF_BYTE, _sign_bytes(key, buyer_hash, name, chunk, stop - start),
                    axis=0, out=signs)
            correlations[row] += scale * float(np.dot(signs.reshape(-1), padded))
    return energy


def verify_watermark(tensors: Mapping[str, np.ndarray], buyer, *, key: bytes,
                     original: Mapping[str, np.ndarray], strength: float = DEFAULT_STRENGTH,
                     layers=None, false_positive_rate: float = DEFAULT_FALSE_POSITIVE_RATE):
    """``(detected, score)``: whether ``tensors`` carry ``buyer``'s pattern, at most a
    ``false_positive_rate`` chance of saying so when they do not.

    Args:
        tensors: The suspect weights, name -> array.
        buyer: The buyer to test (str, bytes or a License).
        key: The seller's secret used to embed.
        original: The seller's unmarked weights.
        strength: The strength used to embed.
        layers: The marked names (default: :func:`watermark_layers` of ``original``).
        false_positive_rate: The chance allowed of naming a buyer wrongly.

    Returns:
        ``(detected, score)``: a bool and the float score.

    Raises:
        ValueError: No marked tensor of ``original`` is in ``tensors`` with its shape, a
            short key, a strength or a rate out of range.
        TypeError: ``key`` is not bytes.

    Examples:
        >>> import numpy as np
        >>> from aprfast import v1
        >>> original = {"w": np.linspace(-1, 1, 4096, dtype=np.float32).reshape(64, 64)}
        >>> key = b"seller secret 16"
        >>> alice = v1.embed_watermark(original, "alice", key=key)
        >>> v1.verify_watermark(alice, "alice", key=key, original=original)[0]
        True
        >>> v1.verify_watermark(alice, "bob", key=key, original=original)[0]
        False
    """
    score = float(watermark_scores(tensors, original=original, key=key, candidates=[buyer],
                                   strength=strength, layers=layers)[0])
    return score >= detection_threshold(false_positive_rate), score


def extract_watermark(tensors: Mapping[str, np.ndarray], *, key: bytes,
                      original: Mapping[str, np.ndarray], candidates,
                      strength: float = DEFAULT_STRENGTH, layers=None,
                      false_positive_rate: float = DEFAULT_FALSE_POSITIVE_RATE) -> list:
    """The candidates whose pattern is in ``tensors``, best score first, as
    :class:`WatermarkMatch`.  The threshold accounts for the number of candidates, so
    the chance of naming any innocent buyer stays below ``false_positive_rate``.  Usually
    one buyer or none; more than one means copies were combined.

    Args:
        tensors: The suspect weights, name -> array.
        key: The seller's secret used to embed.
        original: The seller's unmarked weights.
        candidates: Every buyer the seller sold to (str, bytes or License each).
        strength: The strength used to embed.
        layers: The marked names (default: :func:`watermark_layers` of ``original``).
        false_positive_rate: The chance allowed of naming any innocent buyer.

    Returns:
        A list of :class:`WatermarkMatch`, best score first.

    Raises:
        ValueError: No marked tensor of ``original`` is in ``tensors`` with its shape, a
            short key, a strength or a rate out of range.
        TypeError: ``key`` is not bytes.

    Examples:
        >>> import numpy as np
        >>> from aprfast import v1
        >>> original = {"w": np.linspace(-1, 1, 4096, dtype=np.float32).reshape(64, 64)}
        >>> key = b"seller secret 16"
        >>> alice = v1.embed_watermark(original, "alice", key=key)
        >>> [m.buyer for m in v1.extract_watermark(alice, key=key, original=original,
        ...                                         candidates=["bob", "alice", "carol"])]
        ['alice']
    """
    candidates = list(candidates)
    scores = watermark_scores(tensors, original=original, key=key, candidates=candidates,
                              strength=strength, layers=layers)
    threshold = detection_threshold(false_positive_rate, len(candidates))
    found = [WatermarkMatch(candidate, float(score)) for candidate, score in zip(candidates, scores)
             if score >= threshold]
    return sorted(found, key=lambda match: -match.score)
