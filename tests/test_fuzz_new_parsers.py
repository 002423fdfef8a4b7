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


# --- the targets added for issue 25: converters, the v1 indexes, remote indexes -------------
def test_run_py_enumerates_every_harness_target():
    run = _load("run", "aprfast_fuzz_run")
    assert sorted(run.TARGETS) == sorted(harness.TARGETS)
    for name in harness.EXTERNAL:
        assert os.path.isfile(os.path.join(FUZZ_DIR, f"fuzz_{name}.py")), name
    assert run._seconds("15 open=20 v2_security=20") == {None: 15, "open": 20, "v2_security": 20}
    assert run._seconds("25") == {None: 25}


def test_every_external_target_has_seeds(seeds):
    out, counts = seeds
    for name in harness.EXTERNAL:
        if name == "onnx" and importlib.util.find_spec("onnx") is None:
            continue
        assert counts[name] >= 5 and len(os.listdir(out / name)) == counts[name], name


def test_secured_compressed_apr2_streams_from_a_pipe(seeds):
    out, _ = seeds
    names = [n for n in os.listdir(out / "v2_security") if "-pipe-" in n]
    assert len(names) >= 4
    with harness.fuzz_environment():
        for name in names:
            data = (out / "v2_security" / name).read_bytes()
            if data[0] & 0x20:  # STREAM: the seed was read through the pipe when it was written
                harness.run_one(harness.TARGETS["v2_security"], data)


def test_mle_fix_carries_a_changed_weight_to_the_reader(seeds):
    from aprfast.convert import mle

    out, _ = seeds
    data = _seed(out, "mle", "signed")
    fuzz_mle = harness.external("mle")
    body = bytearray(data[2:])
    fields = fuzz_mle.FIELDS.unpack_from(body)
    body[fields[8]] ^= 0x01  # first byte of the weights section
    fixed = fuzz_mle.fix_mle(bytes(body))
    path = os.path.join(harness.write_scratch({"m.mle": fixed}), "m.mle")
    src = mle.MLESource(path)  # CRCs, header CRC and signature remade: accepted
    src.close()
    harness.write_scratch({"m.mle": bytes(body)})
    with pytest.raises((ChecksumError, SignatureError)):
        mle.MLESource(path)


@pytest.mark.parametrize("prefix", ["lz4", "zstd", "signed-digests", "sealed-password"])
def test_v1_index_fix_carries_a_changed_chunk_to_the_decoder(seeds, prefix):
    out, _ = seeds
    data = _seed(out, "v1_index", prefix)
    body = bytearray(data[2:])
    index_size = int.from_bytes(body[8:12], "little")
    body[index_size] ^= 0x5A  # first byte of the first chunk
    with harness.fuzz_environment():
        try:
            harness.TARGETS["v1_index"](data[:2] + bytes(body))
        except (ChecksumError, SignatureError) as exc:
            pytest.fail(f"the fix-up left a check failing: {exc!r}")
        except AprError:  # the tag or the decoder refused the changed bytes: reached
            pass
        with pytest.raises(ChecksumError):
            harness.TARGETS["v1_index"](bytes([data[0] & ~0x01, data[1]]) + bytes(body))


def test_converter_targets_refuse_garbage_with_typed_errors():
    with harness.fuzz_environment():
        for name in ("gguf", "safetensors", "onnx", "burnpack", "mle", "v1_index", "remote_index"):
            for control in (0x00, 0x01, 0x04, 0x05, 0x20, 0xFF):
                for body in (b"", b"\x00" * 40, b"GGUF\x03\x00\x00\x00" + b"\xff" * 30,
                             b"NRUB\x01\x00\x05\x00\x00\x00\xbf", b"MLE\x00\x02" + b"\x00" * 130,
                             b'{"weight_map": {"a": "../x"}}', b"APRC\x01"):
                    harness.run_one(harness.TARGETS[name], bytes([control, 7]) + body)
