"""The fuzz harness reaches the parsers added after the first corpus: the seeds of the
v1 STREAMING chunk index, TRUENO_NATIVE, APR2 per-tensor codecs and aprfast.stream
exist and pass their targets, and the STREAMING fix-ups (tests/fuzz/harness.py,
fix_v1_streaming) carry a mutated chunk past the chunk CRC, the chunk digest, the
index signature and CRC, the whole-file signature and CRC and (SEAL) AES-GCM, so
that what the fuzzer changes is seen by the decoder, not refused by a check in front.
Without atheris; fast."""

from __future__ import annotations

import importlib.util
import os
import sys

import numpy as np
import pytest

import aprfast
from aprfast.errors import AprError, ChecksumError, DecryptError, SignatureError

FUZZ_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fuzz")


def _load(name, module):
    sys.path.insert(0, FUZZ_DIR)  # make_corpus imports harness by name
    try:
        spec = importlib.util.spec_from_file_location(module, os.path.join(FUZZ_DIR, f"{name}.py"))
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod
    finally:
        sys.path.remove(FUZZ_DIR)


make_corpus = _load("make_corpus", "aprfast_fuzz_make_corpus")
harness = make_corpus.harness  # the module make_corpus writes the seeds with


@pytest.fixture(scope="module")
def seeds(tmp_path_factory):
    out = tmp_path_factory.mktemp("seeds")
    with harness.fuzz_environment():
        counts = make_corpus.write(str(out))  # raises if any seed does not pass its target
    return out, counts


def test_new_targets_have_seeds(seeds):
    out, counts = seeds
    assert counts["v1_open"] >= 40 and counts["stream"] >= 40
    names = set(os.listdir(out / "v1_open")) | set(os.listdir(out / "load"))
    for prefix in ("v1s-none", "v1s-zstd", "v1s-lz4", "v1s-password", "v1s-signed", "v1s-unsealed-password",
                   "v1t", "apr2-lz4", "apr2-zstd"):
        assert any(n.startswith(prefix) for n in names), prefix


def _seed(out, target, prefix):
    name = next(n for n in sorted(os.listdir(out / target)) if n.startswith(prefix + "-"))
    return (out / target / name).read_bytes()


def _flip_last_chunk(body: bytes) -> bytes:
    parts = harness.StreamingParts(body)
    assert parts.ok and parts.nchunks == parts.ccount
    offset, _stored, _raw = parts.chunk(body, parts.nchunks - 1)
    out = bytearray(body)
    out[parts.end + offset] ^= 0x5A
    return bytes(out)


@pytest.mark.parametrize("prefix", ["v1s-zstd", "v1s-lz4", "v1s-signed"])
def test_fix_carries_a_changed_chunk_to_the_decoder(seeds, prefix):
    out, _ = seeds
    data = _seed(out, "v1_open", prefix)
    control, param, body = data[0], data[1], data[2:]
    mutated = data[:2] + _flip_last_chunk(body)
    with harness.fuzz_environment():
        try:
            harness.target_v1_open(mutated)
        except (ChecksumError, SignatureError) as exc:  # a check in front of the decoder
            pytest.fail(f"the fix-up left a check failing: {exc!r}")
        except AprError:  # the decoder refused the changed bytes: reached
            pass
        with pytest.raises((ChecksumError, SignatureError)):  # without FIX the checks do refuse it
            harness.target_v1_open(bytes([control & ~harness.CONTROL.FIX, param]) + mutated[2:])


@pytest.mark.parametrize("prefix", ["v1s-unsealed-password", "v1s-unsealed-zstd-recipient",
                                    "v1s-unsealed-lz4-password-signed", "v1s-unsealed-multi"])
def test_seal_reseals_changed_plaintext_chunks(seeds, prefix):
    out, _ = seeds
    data = _seed(out, "v1_open", prefix)
    mutated = data[:2] + _flip_last_chunk(data[2:])
    with harness.fuzz_environment():
        body = harness.fix_v1(mutated[2:], mutated[0])
        kwargs = harness._v1_credentials(mutated[0])
        try:
            aprfast.v1.load_model(body, **kwargs)
        except (ChecksumError, SignatureError, DecryptError) as exc:
            pytest.fail(f"the re-sealed file is refused in front of the decoder: {exc!r}")
        except AprError:  # decompression refused the changed bytes
            pass


def test_stream_target_reads_through_short_reads(seeds):
    out, _ = seeds
    data = _seed(out, "stream", "apr2-elementwise")
    want = aprfast.load(data[2:])
    pipe = harness._Pipe(data[2:], 7, read_only=False)
    got = dict(aprfast.stream(pipe))
    assert sorted(got) == sorted(want)
    for name in want:
        np.testing.assert_array_equal(np.asarray(got[name]), np.asarray(want[name]))
