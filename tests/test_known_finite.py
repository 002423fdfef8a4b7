"""aprfast.stats.known_finite (csrc/stats.c apr_stats_quant_finite and its pure twin) and
the inline validation that uses it (issue 27: a mixed K/IQ import as fast as a Q4_K_M one).

known_finite says True only when decoding could not give a NaN or an Inf; the validator
then skips the statistics of a tensor no rule names.  Proven here on both backends, for
every block type, with random blocks and with the float16 scales set to NaN, +-Inf,
subnormals, zeros and the largest halves: whenever it says True the decoded values are
all finite, each scale field it reads is one the values depend on, and the validator's
report, warnings and errors are the ones it gave when it computed every statistic.
"""

import importlib
import itertools
import warnings

import numpy as np
import pytest

import aprfast
from aprfast import _quant
from aprfast._pure import _stats as pure_stats
from aprfast.convert import TensorValidationError, ValidationWarning
from aprfast.dtypes import by_name
from aprfast.numerics import stats as stats_module
from aprfast.numerics.expectations import expectation_for
from aprfast.numerics.stats import known_finite, tensor_stats
from aprfast.tensors import QuantizedTensor

TYPES = list(_quant.TYPES)
#: aprfast.convert is also a function: the module by its full name
validation = importlib.import_module("aprfast.convert.validation")
PROVEN = sorted(pure_stats._FINITE_F16)
#: float16 bit patterns: NaN, quiet NaN with payload, +Inf, -Inf, smallest subnormal,
#: largest subnormal, +0, -0, largest finite, its negative, 1.0
SPECIAL = [0x7E00, 0x7C01, 0x7C00, 0xFC00, 0x0001, 0x03FF, 0x0000, 0x8000, 0x7BFF, 0xFBFF, 0x3C00]
NONFINITE = {0x7E00, 0x7C01, 0x7C00, 0xFC00}


def _native_stats():
    from aprfast import _stats
    return _stats


BACKENDS = {"compiled": _native_stats, "pure": lambda: pure_stats}


@pytest.fixture(params=sorted(BACKENDS))
def backend(request, monkeypatch):
    """known_finite and tensor_stats run on this backend's statistics module."""
    module = BACKENDS[request.param]()
    monkeypatch.setattr(stats_module, "_stats", module)
    return module


def _blocks(name, count, rng):
    dt = by_name(name)
    return rng.integers(0, 256, (count, dt.block_bytes), dtype=np.uint8), dt.block_elems


def _set_f16(blocks, offset, bits):
    blocks[:, offset:offset + 2] = np.array([bits], "<u2").view(np.uint8)


def _tensor(name, blocks, elems):
    return QuantizedTensor(name, (blocks.shape[0] * elems,), blocks.reshape(-1).copy())


@pytest.mark.parametrize("name", TYPES)
def test_only_the_proven_types_are_ever_known_finite(name, backend, rng):
    blocks, elems = _blocks(name, 4, rng)
    for offsets in pure_stats._FINITE_F16.get(name, ()):
        _set_f16(blocks, offsets, 0x3C00)
    if _quant.header_bytes(name, 4 * elems):
        return  # per-tensor types: a header, never proven (below)
    qt = _tensor(name, blocks, elems)
    assert known_finite(qt) is (name in PROVEN)


@pytest.mark.parametrize("name", PROVEN)
def test_known_finite_blocks_decode_to_finite_values_random_bytes(name, backend, rng):
    """Block by block: where the twin proves a one-block tensor finite, its values are."""
    blocks, elems = _blocks(name, 4096, rng)
    values = aprfast.dequantize(_tensor(name, blocks, elems)).reshape(-1, elems)
    proven = np.array([known_finite(_tensor(name, blocks[b:b + 1], elems)) for b in range(blocks.shape[0])])
    assert proven.any() and not proven.all()  # random halves: some scales are NaN or Inf
    assert np.isfinite(values[proven]).all()
    # A whole tensor is proven only when each of its blocks is.
    assert known_finite(_tensor(name, blocks, elems)) is bool(proven.all())
    assert known_finite(_tensor(name, blocks[proven], elems))


@pytest.mark.parametrize("name", PROVEN)
def test_special_scales_and_every_field_read_is_one_the_values_depend_on(name, backend, rng):
    offsets = pure_stats._FINITE_F16[name]
    for bits in itertools.product(SPECIAL, repeat=len(offsets)):
        blocks, elems = _blocks(name, 3, rng)
        for offset, b in zip(offsets, bits):
            _set_f16(blocks, offset, b)
        qt = _tensor(name, blocks, elems)
        finite = not NONFINITE.intersection(bits)
        assert known_finite(qt) is finite, bits
        s = tensor_stats(qt)
        if finite:
            assert s.nan_count == s.inf_count == 0 and s.finite_count == s.count, bits
        else:  # the field is a scale of the values: a NaN or Inf there shows in them
            assert s.nan_count + s.inf_count > 0, (bits, s)


def test_hostile_layouts_are_never_known_finite(backend):
    qtype = _quant.TYPES["Q4_K"]
    assert not backend.quant_finite(qtype, np.zeros(143, np.uint8), 1, 256)  # a byte short
    assert not backend.quant_finite(qtype, np.zeros(145, np.uint8), 1, 256)  # a byte over
    assert not backend.quant_finite(qtype, np.zeros(144, np.uint8), 2**40, 2**40)  # overflowing count
    assert not backend.quant_finite(99, np.zeros(144, np.uint8), 1, 256)  # no such type
    assert backend.quant_finite(qtype, np.zeros(0, np.uint8), 0, 0)  # nothing to decode
    assert backend.quant_finite(qtype, np.zeros(144 * 6, np.uint8), 3, 300)  # padded rows
    assert not known_finite(np.float32([1.0])) and not known_finite([1, 2])


# --- the validator: the same verdicts, reports, warnings and errors as with every statistic --
NAMES = ["blk.0.weight", "blk.3.ffn_down.weight", "token_embd.weight", "blk.0.attn_norm.weight",
         "model.layers.0.self_attn.q_proj.weight"]


def _validate(mode, force, items, fast):
    """The validator's report (or its error) and warnings over ``items``, with the
    known_finite shortcut (``fast``) or without it (every tensor through tensor_stats)."""
    original = validation.known_finite
    validation.known_finite = original if fast else (lambda value: False)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            v = validation.InlineValidator(mode, force=force)
            try:
                for name, value in items:
                    assert v.check(name, value) is value
                result = ("report", v.report())
            except TensorValidationError as exc:
                result = ("error", str(exc), exc.tensor, exc.role, exc.reasons, exc.stats)
        return result, [(w.category, str(w.message)) for w in caught]
    finally:
        validation.known_finite = original


@pytest.mark.parametrize("name", TYPES)
def test_the_validator_gives_what_the_statistics_gave(name, backend, rng):
    elems = by_name(name).block_elems
    items = []
    for k in range(24):
        blocks, _ = _blocks(name, 2, rng)
        for offset in pure_stats._FINITE_F16.get(name, ()):
            _set_f16(blocks, offset, SPECIAL[(k + offset) % len(SPECIAL)] if k % 3 else 0x2E66)  # 0.1
        n = 2 * elems
        if _quant.header_bytes(name, n):
            raw = np.asarray(aprfast.quantize(rng.standard_normal(n).astype(np.float32), name).data) \
                if _quant.can_quantize(name) else None
            if raw is None:
                continue
            qt = QuantizedTensor(name, (n,), raw)
        else:
            qt = _tensor(name, blocks, elems)
        items.append((NAMES[k % len(NAMES)], qt))
    for mode, force in (("strict", False), ("strict", True), ("relaxed", False)):
        for subset in (items, [it for it in items if it[0] == "blk.0.weight"]):
            assert _validate(mode, force, subset, True) == _validate(mode, force, subset, False)


def test_a_mixed_gguf_import_reports_what_it_did_with_every_statistic(tmp_path, rng, monkeypatch):
    """End to end: a GGUF of K and IQ blocks (one with a NaN scale) imported with each mode."""
    gguf = pytest.importorskip("gguf")
    def write(path, nan_in=None):
        w = gguf.GGUFWriter(str(path), "llama")
        # (gguf-py's Q8_1 is the old 40-byte block, ggml's and aprfast's 36)
        for i, name in enumerate(n for n in PROVEN if n != "Q8_1"):
            blocks, elems = _blocks(name, 8, rng)
            for offset in pure_stats._FINITE_F16[name]:
                _set_f16(blocks, offset, 0x2E66 if name != nan_in else 0x7E00)
            tensor = "token_embd.weight" if i == 1 else ["blk.%d.weight" % i, "blk.%d.ffn_down.weight" % i,
                                                          "blk.%d.attn_norm.weight" % i][i % 3]
            w.add_tensor(tensor, blocks.reshape(2, -1), raw_dtype=getattr(gguf.GGMLQuantizationType, name))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()

    def run(src, **kw):
        try:
            (tmp_path / "out.apr").unlink(missing_ok=True)
            r = aprfast.convert(src, tmp_path / "out.apr", durable=False, **kw)
            return r["validation"]
        except TensorValidationError as exc:
            return str(exc), exc.stats

    calls = []
    real = validation.check_value
    monkeypatch.setattr(validation, "check_value",
                        lambda name, value, **kw: calls.append(name) or real(name, value, **kw))
    write(tmp_path / "ok.gguf")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ValidationWarning)  # random LayerNorm weights fail their mean
        report = run(tmp_path / "ok.gguf", validate="relaxed")
    # Only the tensors a rule names had their statistics computed; every one was checked.
    assert report["checked"] == len(PROVEN) - 1 and calls and len(calls) < report["checked"]
    assert all(expectation_for(n) is not None for n in calls)
    monkeypatch.undo()
    write(tmp_path / "nan.gguf", nan_in="IQ2_XS")
    for src in ("ok.gguf", "nan.gguf"):
        for kw in ({}, {"validate": "relaxed"}):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ValidationWarning)
                fast = run(tmp_path / src, **kw)
                monkeypatch.setattr(validation, "known_finite", lambda value: False)
                slow = run(tmp_path / src, **kw)
                monkeypatch.undo()
            assert fast == slow, (src, kw)
