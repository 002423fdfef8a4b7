"""Buyer watermarks (seed §8.3): what embedding costs a model, what the mark survives, and
that nobody else is ever named.

The model is a two-layer tanh MLP, 2048 -> 4096 -> 10, float32, with fixed random
weights (8.4 million in the two matrices).  Its size is not arbitrary: against noise of
1% of each tensor's standard deviation (200 times the mark's amplitude) the score of the
right buyer is about ``strength * sqrt(N) / 0.01``, i.e. 14.5 here, against a threshold
of 6.4; a model of a few hundred thousand weights could not carry a mark that both
leaves its outputs unchanged and survives that noise.  The tests print the numbers they
assert on (``pytest -s`` shows them).
"""

import hashlib
import struct

import numpy as np
import pytest

from aprfast.errors import TensorNotFoundError
from aprfast.v1.licensing import License
from aprfast.v1.watermark import (
    CHUNK_ELEMENTS,
    DEFAULT_STRENGTH,
    WatermarkMatch,
    detection_threshold,
    embed_watermark,
    extract_watermark,
    verify_watermark,
    watermark_layers,
    watermark_scores,
)

try:
    from ml_dtypes import bfloat16
except ImportError:  # bf16 needs ml_dtypes
    bfloat16 = None

KEY = b"seller-secret-key-0123456789abcdef"
BUYER = "buyer-A@example.com"
INPUTS, HIDDEN, CLASSES = 2048, 4096, 10
THRESHOLD = detection_threshold()  # one buyer, false-positive rate 1e-9


def report(label, **numbers):
    print(f"\n[watermark] {label}: " + ", ".join(f"{k}={v:.4g}" for k, v in numbers.items()))


# --------------------------------------------------------------------------- the model


@pytest.fixture(scope="module")
def mlp():
    rng = np.random.default_rng(20240607)
    return {
        "fc1.weight": rng.standard_normal((INPUTS, HIDDEN), dtype=np.float32) * np.float32(INPUTS ** -0.5),
        "fc1.bias": np.zeros(HIDDEN, np.float32),
        "fc2.weight": rng.standard_normal((HIDDEN, CLASSES), dtype=np.float32) * np.float32(HIDDEN ** -0.5),
        "fc2.bias": np.zeros(CLASSES, np.float32),
    }


def hidden_and_logits(model, x):
    hidden = np.tanh(x @ model["fc1.weight"] + model["fc1.bias"])
    return hidden, hidden @ model["fc2.weight"] + model["fc2.bias"]


def logits(model, x):
    return hidden_and_logits(model, x)[1].astype(np.float64)


@pytest.fixture(scope="module")
def test_set(mlp):
    """1000 inputs labelled by the original model, so its accuracy is 100% and a marked
    copy's accuracy is its agreement with the original."""
    x = np.random.default_rng(1).standard_normal((1000, INPUTS), dtype=np.float32)
    return x, logits(mlp, x).argmax(axis=1)


@pytest.fixture(scope="module")
def marked(mlp):
    return embed_watermark(mlp, BUYER, key=KEY)


def with_noise(model, relative_std, seed):
    """Each tensor plus Gaussian noise of ``relative_std`` times its own std."""
    rng = np.random.default_rng(seed)
    return {name: (w + rng.standard_normal(w.shape, dtype=np.float32) * np.float32(relative_std * w.std()))
            for name, w in model.items()}


def softmax(z):
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


def fine_tuned(model, teacher, *, steps=5, lr=0.02, batch=64, seed=3):
    """Plain SGD on cross-entropy, on inputs from a shifted distribution labelled by the
    original model: a buyer adapting the model to their own data."""
    rng = np.random.default_rng(seed)
    tuned = {name: w.copy() for name, w in model.items()}
    for _ in range(steps):
        x = rng.standard_normal((batch, INPUTS), dtype=np.float32) + np.float32(0.1)
        labels = logits(teacher, x).argmax(axis=1)
        hidden, out = hidden_and_logits(tuned, x)
        grad_out = softmax(out)
        grad_out[np.arange(batch), labels] -= 1.0
        grad_out /= batch
        grad_hidden = (grad_out @ tuned["fc2.weight"].T) * (1.0 - hidden * hidden)
        grads = {"fc1.weight": x.T @ grad_hidden, "fc1.bias": grad_hidden.sum(axis=0),
                 "fc2.weight": hidden.T @ grad_out, "fc2.bias": grad_out.sum(axis=0)}
        for name, grad in grads.items():
            tuned[name] -= (lr * grad).astype(np.float32)
    return tuned


def q8_blocks(model):
    """Symmetric int8 quantisation in blocks of 32 (like Q8_0), then back to float32."""
    out = {}
    for name, w in model.items():
        blocks = w.reshape(-1, 32).astype(np.float64) if w.size % 32 == 0 else None
        if blocks is None:
            out[name] = w
            continue
        scale = np.abs(blocks).max(axis=1, keepdims=True) / 127.0
        scale[scale == 0] = 1.0
        out[name] = (np.round(blocks / scale) * scale).astype(np.float32).reshape(w.shape)
    return out


def relative_change(a, b):
    return float(np.linalg.norm(b.astype(np.float64) - a) / np.linalg.norm(a.astype(np.float64)))


@pytest.fixture(scope="module")
def tuned(marked, mlp):
    return fine_tuned(marked, mlp)


@pytest.fixture(scope="module")
def worst_case(tuned):
    """Fine-tuned, then 1% noise, then stored as float16."""
    return {name: w.astype(np.float16) for name, w in with_noise(tuned, 0.01, seed=5).items()}


# --------------------------------------------------------------------------- (1) accuracy


def test_marking_changes_outputs_by_less_than_a_hundredth_of_a_percent(mlp, marked, test_set):
    x, labels = test_set
    before, after = logits(mlp, x), logits(marked, x)
    change = relative_change(before, after)  # ||dZ|| / ||Z|| over the whole test set
    per_sample = np.linalg.norm(after - before, axis=1) / np.linalg.norm(before, axis=1)
    accuracy_before = float(np.mean(before.argmax(axis=1) == labels))
    accuracy_after = float(np.mean(after.argmax(axis=1) == labels))
    report("accuracy impact", logit_change=change, worst_sample=per_sample.max(),
           accuracy_before=accuracy_before, accuracy_after=accuracy_after)
    assert change < 1e-4
    # 100% agreement, i.e. an accuracy change below 0.01 percentage points on 1000
    # samples.  A perturbation of relative size 7e-5 flips a sample only when its top
    # two logits are closer than that; expect about one such sample in 10,000.
    assert accuracy_before == accuracy_after == 1.0


def test_each_weight_moves_by_the_strength_in_its_low_bits(mlp, marked):
    for name in ("fc1.weight", "fc2.weight"):
        original, copy = mlp[name].astype(np.float64), marked[name].astype(np.float64)
        nonzero = original != 0
        assert np.all(copy[~nonzero] == 0)  # zeros stay zero
        rms = np.sqrt(np.mean(((copy - original)[nonzero] / original[nonzero]) ** 2))
        assert marked[name].dtype == np.float32 and marked[name].shape == mlp[name].shape
        assert rms == pytest.approx(DEFAULT_STRENGTH, rel=1e-3)
    # Biases (one dimension) are not marked and are handed back untouched.
    assert marked["fc1.bias"] is mlp["fc1.bias"] and marked["fc2.bias"] is mlp["fc2.bias"]
    assert watermark_layers(mlp) == ["fc1.weight", "fc2.weight"]


# --------------------------------------------------------------------------- (2) robustness

ATTACKS = {
    "none": lambda marked, tuned, mlp: marked,
    "gaussian noise, 1% of each tensor's std": lambda marked, tuned, mlp: with_noise(marked, 0.01, seed=4),
    "rounded to float16": lambda marked, tuned, mlp: {n: w.astype(np.float16) for n, w in marked.items()},
    "int8 blocks of 32 (Q8_0-like)": lambda marked, tuned, mlp: q8_blocks(marked),
    "5 SGD steps of fine-tuning": lambda marked, tuned, mlp: tuned,
}
if bfloat16 is not None:
    ATTACKS["rounded to bfloat16"] = lambda marked, tuned, mlp: {n: w.astype(bfloat16) for n, w in marked.items()}


@pytest.mark.parametrize("attack", list(ATTACKS))
def test_the_buyer_is_still_named_after(attack, mlp, marked, tuned):
    suspect = ATTACKS[attack](marked, tuned, mlp)
    detected, score = verify_watermark(suspect, BUYER, key=KEY, original=mlp)
    report(attack, score=score, threshold=THRESHOLD,
           fc1_change=relative_change(marked["fc1.weight"], suspect["fc1.weight"]))
    assert detected and score >= THRESHOLD


def test_fine_tuning_was_real_but_light(mlp, tuned, test_set):
    x, labels = test_set
    agreement = float(np.mean(logits(tuned, x).argmax(axis=1) == labels))
    fc1, fc2 = (relative_change(mlp[n], tuned[n]) for n in ("fc1.weight", "fc2.weight"))
    report("fine-tuning", fc1_change=fc1, fc2_change=fc2, agreement_with_original=agreement)
    assert fc1 > 1e-3 and fc2 > 1e-2  # 20 to 1000 times what the mark moved
    assert agreement > 0.8  # still recognisably the seller's model


def test_after_everything_at_once_only_the_buyer_is_named(mlp, worst_case):
    innocents = [f"buyer-{i}@example.com" for i in range(100)]
    candidates = [BUYER] + innocents
    scores = watermark_scores(worst_case, original=mlp, key=KEY, candidates=candidates)
    found = extract_watermark(worst_case, key=KEY, original=mlp, candidates=candidates)
    null = scores[1:]
    report("fine-tuned + noise + float16", buyer_score=scores[0],
           threshold_for_101=detection_threshold(candidates=101), innocents_mean=null.mean(),
           innocents_std=null.std(), innocents_max=null.max())
    assert [match.buyer for match in found] == [BUYER]
    assert found[0] == WatermarkMatch(BUYER, pytest.approx(scores[0]))
    # Innocent scores follow the null distribution: mean 0, variance 1.
    assert abs(null.mean()) < 0.35 and 0.7 < null.std() < 1.3 and null.max() < 4.5


def test_averaging_two_copies_names_both_buyers_and_nobody_else(mlp, marked):
    other = embed_watermark(mlp, "buyer-B", key=KEY)
    averaged = {n: ((marked[n].astype(np.float64) + other[n]) / 2).astype(np.float32) for n in mlp}
    found = extract_watermark(averaged, key=KEY, original=mlp, candidates=[BUYER, "buyer-B", "buyer-C"])
    assert sorted(match.buyer for match in found) == sorted([BUYER, "buyer-B"])


def test_a_partial_leak_still_names_the_buyer(mlp, marked):
    only_first_layer = {"fc1.weight": with_noise(marked, 0.01, seed=6)["fc1.weight"]}
    detected, score = verify_watermark(only_first_layer, BUYER, key=KEY, original=mlp)
    assert detected
    with pytest.raises(ValueError, match="no watermarked tensor"):
        verify_watermark({"fc1.weight": marked["fc1.weight"][:10]}, BUYER, key=KEY, original=mlp)


# --------------------------------------------------------------------------- (3) no key, no mark


def test_without_the_key_nothing_is_detected(mlp, marked):
    rng = np.random.default_rng(99)
    wrong_keys = [rng.bytes(32) for _ in range(8)]
    # On the clean copy, where the right key scores in the thousands.
    scores = watermark_scores(marked, original=mlp, key=KEY, candidates=[BUYER])
    wrong = [verify_watermark(marked, BUYER, key=k, original=mlp) for k in wrong_keys]
    report("wrong keys", right_key_score=scores[0], max_wrong_key_score=max(s for _, s in wrong))
    assert scores[0] > 1000
    assert not any(detected for detected, _ in wrong)
    assert all(abs(score) < 4.5 for _, score in wrong)


def test_an_unmarked_model_names_nobody_even_when_modified(mlp):
    candidates = [BUYER] + [f"buyer-{i}" for i in range(20)]
    assert not watermark_scores(mlp, original=mlp, key=KEY, candidates=candidates).any()
    modified = with_noise(mlp, 0.01, seed=7)
    assert extract_watermark(modified, key=KEY, original=mlp, candidates=candidates) == []


def test_threshold_is_the_hoeffding_bound():
    assert THRESHOLD == pytest.approx(np.sqrt(2 * np.log(1e9)))
    assert np.exp(-THRESHOLD ** 2 / 2) == pytest.approx(1e-9)
    assert detection_threshold(1e-6, candidates=1000) == pytest.approx(detection_threshold(1e-9))


# --------------------------------------------------------------------------- the streams, exactly


def reference_signs(key, buyer, name, chunk, count):
    """The sign stream as docs/FORMAT.md and the module docstring define it."""
    lp = lambda data: struct.pack("<I", len(data)) + data  # noqa: E731
    message = (b"aprfast-watermark-v1:sign\x00" + lp(key) + hashlib.sha256(buyer.encode()).digest()
               + lp(name.encode()) + struct.pack("<Q", chunk))
    packed = np.frombuffer(hashlib.shake_256(message).digest((count + 7) // 8), np.uint8)
    return np.unpackbits(packed, count=count, bitorder="little").astype(np.float64) * 2 - 1


def test_float32_marks_follow_the_documented_streams_across_chunks():
    weights = np.random.default_rng(2).standard_normal(CHUNK_ELEMENTS + 1000).astype(np.float32)
    weights[5] = 0.0
    copy = embed_watermark({"w": weights[None, :]}, "buyer", key=KEY, strength=1e-4)["w"][0]
    for chunk, piece in enumerate((slice(0, CHUNK_ELEMENTS), slice(CHUNK_ELEMENTS, None))):
        original = weights[piece].astype(np.float64)
        signs = reference_signs(KEY, "buyer", "w", chunk, original.size)
        expected = (original + signs * 1e-4 * np.abs(original)).astype(np.float32)
        assert np.array_equal(copy[piece], expected)
    assert copy[5] == 0.0  # zeros stay zero


def test_the_sign_stream_is_pinned():
    # Known answer: the first 16 signs of chunk 0 for this key, buyer and tensor.
    signs = reference_signs(KEY, BUYER, "fc1.weight", 0, 16)
    weights = np.ones((1, 16), np.float32)
    copy = embed_watermark({"fc1.weight": weights}, BUYER, key=KEY, strength=1e-3)["fc1.weight"][0]
    assert np.array_equal(np.sign(copy.astype(np.float64) - 1.0), signs)
    assert "".join("+" if s > 0 else "-" for s in signs) == "----++-+-+------"


def test_marking_is_deterministic_and_differs_per_buyer_and_key(mlp):
    small = {"w": mlp["fc2.weight"]}
    first = embed_watermark(small, BUYER, key=KEY)["w"]
    assert np.array_equal(first, embed_watermark(small, BUYER, key=KEY)["w"])
    assert not np.array_equal(first, embed_watermark(small, "buyer-B", key=KEY)["w"])
    assert not np.array_equal(first, embed_watermark(small, BUYER, key=KEY[::-1])["w"])


def test_a_license_names_the_same_buyer_as_its_licensee(mlp):
    small = {"w": mlp["fc1.weight"][:512]}
    lic = License(license_id=b"\x01" * 16, licensee=BUYER)
    copy = embed_watermark(small, lic, key=KEY)
    assert np.array_equal(copy["w"], embed_watermark(small, BUYER, key=KEY)["w"])
    assert verify_watermark(copy, BUYER, key=KEY, original=small)[0]


# --------------------------------------------------------------------------- other dtypes

LOW_PRECISION = [np.float16] + ([bfloat16] if bfloat16 is not None else [])


@pytest.mark.parametrize("dtype", LOW_PRECISION, ids=lambda d: np.dtype(d).name)
def test_low_precision_weights_move_by_one_ulp_on_a_keyed_subset(dtype):
    # bfloat16 moves only 1 weight in 24,000 at the default strength: it needs the
    # larger tensor to score well above the threshold.
    rows = 1024 if dtype is np.float16 else 2048
    weights = (np.random.default_rng(3).standard_normal((rows, 4096)) * 0.05).astype(dtype)
    copy = embed_watermark({"w": weights}, BUYER, key=KEY)["w"]
    original, moved = weights.astype(np.float64), copy.astype(np.float64)
    changed = moved != original
    ulps = np.abs(moved - original)[changed] / np.spacing(np.abs(weights[changed])).astype(np.float64)
    eps = float(np.finfo(np.float16).eps) if dtype is np.float16 else 2.0 ** -7
    nonzero = original != 0
    rms = np.sqrt(np.mean(((moved - original)[nonzero] / original[nonzero]) ** 2))
    detected, score = verify_watermark({"w": copy}, BUYER, key=KEY, original={"w": weights})
    report(f"{np.dtype(dtype).name} sparse marks", changed_fraction=changed.mean(),
           expected_fraction=(DEFAULT_STRENGTH / eps) ** 2, rms_relative_change=rms, score=score)
    assert copy.dtype == weights.dtype
    assert np.all(ulps == 1.0)
    assert changed.mean() == pytest.approx((DEFAULT_STRENGTH / eps) ** 2, rel=0.15)
    assert rms <= DEFAULT_STRENGTH
    assert detected
    assert not verify_watermark({"w": copy}, "buyer-B", key=KEY, original={"w": weights})[0]


def test_float64_is_marked_densely():
    weights = np.random.default_rng(4).standard_normal((256, 256))
    copy = embed_watermark({"w": weights}, BUYER, key=KEY)["w"]
    assert copy.dtype == np.float64
    assert np.allclose(np.abs(copy - weights), DEFAULT_STRENGTH * np.abs(weights), rtol=1e-9, atol=0)


def test_non_finite_and_extreme_weights_are_left_alone():
    weights = np.random.default_rng(5).standard_normal((64, 64)).astype(np.float32)
    weights[0, :4] = [np.nan, np.inf, -np.inf, np.finfo(np.float32).max]
    copy = embed_watermark({"w": weights}, BUYER, key=KEY, strength=1e-2)["w"]
    assert np.isnan(copy[0, 0]) and copy[0, 1] == np.inf and copy[0, 2] == -np.inf
    assert copy[0, 3] == np.finfo(np.float32).max
    suspect = copy.copy()
    suspect[1, :3] = [np.nan, np.inf, -np.inf]  # vandalised weights testify to nothing
    assert verify_watermark({"w": suspect}, BUYER, key=KEY, original={"w": weights}, strength=1e-2)[0]


@pytest.mark.parametrize("dtype", LOW_PRECISION, ids=lambda d: np.dtype(d).name)
def test_low_precision_extremes_are_left_alone(dtype):
    largest = float(np.finfo(np.float16).max) if dtype is np.float16 else 3.3895313892515355e38
    weights = np.full((64, 1024), 0.5, dtype=dtype)
    weights[0, :5] = [largest, -largest, np.nan, np.inf, 0.0]
    weights[1, 0] = 6e-8 if dtype is np.float16 else 1e-40  # subnormal
    copy = embed_watermark({"w": weights}, BUYER, key=KEY, strength=1e-2)["w"]
    assert copy[0, 0] == largest and copy[0, 1] == -largest and np.isnan(copy[0, 2])
    assert copy[0, 3] == np.inf and copy[0, 4] == 0.0 and copy[1, 0] == weights[1, 0]
    assert np.count_nonzero(copy.astype(np.float64) != 0.5) > 1000  # the rest is marked


# --------------------------------------------------------------------------- arguments


def test_bad_arguments_are_refused(mlp):
    small = {"w": mlp["fc2.weight"], "ids": np.arange(6).reshape(2, 3)}
    with pytest.raises(ValueError, match="at least 16"):
        embed_watermark(small, BUYER, key=b"short")
    with pytest.raises(TypeError):
        embed_watermark(small, BUYER, key="a string key is not bytes")
    for strength in (0.0, -1e-5, 0.1):
        with pytest.raises(ValueError, match="strength"):
            embed_watermark(small, BUYER, key=KEY, strength=strength)
    with pytest.raises(TensorNotFoundError):
        embed_watermark(small, BUYER, key=KEY, layers=["missing"])
    with pytest.raises(ValueError, match="int64"):
        embed_watermark(small, BUYER, key=KEY, layers=["ids"])
    with pytest.raises(ValueError, match="false_positive_rate"):
        detection_threshold(0.0)
    # An integer tensor is never chosen by default, and explicit layers are honoured.
    assert watermark_layers(small) == ["w"]
    assert embed_watermark(small, BUYER, key=KEY, layers=[])["w"] is small["w"]
