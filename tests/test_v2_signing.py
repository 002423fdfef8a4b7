"""APR2 digest manifest and Ed25519 signature (docs/FORMAT.md §3.2): one signature check
at open, each chunk hashed when read, tampering caught where it is, the flag rules,
BLAKE3 as an optional hash, and stream() from a real pipe vouching before yielding."""

import io
import os
import sys
import threading

import numpy as np
import pytest
from test_v2_helpers import PASSWORD, SIGNING_PUBLIC, SIGNING_SEED, MiB, extent, fix_crcs, flip, layout_of, model

import aprfast
from aprfast.crypto import core as crypto
from aprfast.errors import ChecksumError, CorruptError, DecryptError, SignatureError, VersionError


@pytest.fixture(scope="module")
def tensors():
    return model()


@pytest.fixture(scope="module")
def signed(tensors):
    return aprfast.save(tensors, {"who": "me"}, signing_key=SIGNING_SEED)


def assert_same(got: dict, want: dict):
    assert sorted(got) == sorted(want)
    for name, value in want.items():
        assert got[name].dtype == value.dtype and np.array_equal(got[name], value), name


@pytest.mark.parametrize("compression", [None, "lz4", "zstd"])
@pytest.mark.parametrize("password", [None, PASSWORD])
def test_signed_round_trip(tmp_path, tensors, compression, password):
    path = tmp_path / "s.apr"
    aprfast.save_file(tensors, path, compression=compression, signing_key=SIGNING_SEED, password=password)
    keys = {"password": password} if password else {}
    with aprfast.open(path, trusted_keys=[SIGNING_PUBLIC], **keys) as f:
        assert f.header["flag_names"].count("SIGNED") == 1
        sec = f.security
        assert sec["signed"] and sec["signature"] == "trusted" and sec["signer"] == SIGNING_PUBLIC.hex()
        assert sec["digest"] == "sha256"
        assert_same(f.tensors(), tensors)
        assert np.array_equal(f.get_slice("big.weight")[1:3], tensors["big.weight"][1:3])
        f.verify()
    with aprfast.open(path, **keys) as f:
        assert f.security["signature"] == "self-signed"
    assert_same(aprfast.load_file(path, mmap=False, trusted_keys=[SIGNING_PUBLIC], **keys), tensors)
    assert_same(aprfast.load(path.read_bytes(), trusted_keys=[SIGNING_PUBLIC], **keys), tensors)


def test_signature_rules(signed, tensors):
    _, other = crypto.generate_signing_key()
    with pytest.raises(SignatureError, match="not among"):
        aprfast.open(signed, trusted_keys=[other])
    plain = aprfast.save(tensors, layout="apr2")
    with pytest.raises(SignatureError, match="not signed"):
        aprfast.open(plain, trusted_keys=[SIGNING_PUBLIC])
    with pytest.raises(SignatureError, match="not signed"):
        aprfast.open(plain, require_signature=True)
    with pytest.raises(SignatureError):
        aprfast.stream(io.BytesIO(plain), require_signature=True)
    encrypted = aprfast.save(tensors, password=PASSWORD)
    with pytest.raises(SignatureError, match="not signed"):
        aprfast.open(encrypted, password=PASSWORD, require_signature=True)
    with aprfast.open(signed, trusted_keys=[SIGNING_PUBLIC], require_signature=False) as f:
        assert f.security["signature"] == "trusted"


# --- tampering -----------------------------------------------------------------------------
def test_a_flipped_data_byte_fails_that_tensor_only(signed, tensors):
    offset, _, _ = extent(signed, "mid.weight")
    buf = flip(bytearray(signed), offset + 1000)  # the footer CRC is not read by a lazy open
    with aprfast.open(bytes(buf), trusted_keys=[SIGNING_PUBLIC]) as f:
        with pytest.raises(SignatureError, match="'mid.weight': chunk 0 of 1 does not match its sha256 digest"):
            f.get_tensor("mid.weight")
        assert np.array_equal(f.get_tensor("big.weight"), tensors["big.weight"])
        with pytest.raises(ChecksumError):  # the footer CRC comes first
            f.verify()
    with aprfast.open(bytes(fix_crcs(buf)), trusted_keys=[SIGNING_PUBLIC]) as f:
        with pytest.raises(SignatureError, match="mid.weight"):
            f.verify()  # every chunk, read or not


@pytest.mark.parametrize("where", ["digest", "signature", "signer", "index", "metadata", "header"])
def test_signed_bytes_altered_fail_at_open(signed, where):
    lay = layout_of(signed)
    at = {"digest": lay.record(2) + 5, "signature": lay.signature_at + 10, "signer": lay.signature_at + 70,
          "index": lay.index_off + lay.index_size - 3, "metadata": lay.meta_off + lay.meta_size - 3,
          "header": 6}[where]
    buf = fix_crcs(flip(bytearray(signed), at))
    with pytest.raises(SignatureError):
        aprfast.open(bytes(buf))
    with pytest.raises(SignatureError):
        aprfast.stream(io.BytesIO(bytes(buf)))


def test_the_signed_flag_and_the_signature_must_agree(tensors, signed):
    # SIGNED in the header without a signature: a digest-only block under a SIGNED header
    digests = aprfast.save(tensors, digest="sha256")
    buf = bytearray(digests)
    buf[8] |= 0x20
    with pytest.raises(CorruptError, match="disagree"):
        aprfast.open(bytes(fix_crcs(buf)))
    # a signature without the flag: cleared SIGNED
    buf = bytearray(signed)
    buf[8] &= ~0x20
    with pytest.raises(CorruptError, match="cleared"):
        aprfast.open(bytes(fix_crcs(buf)))
    # a block whose SIGNED is set without its DIGESTS
    buf = bytearray(signed)
    buf[layout_of(signed).block_at + 5] &= ~0x02
    with pytest.raises(CorruptError, match="SIGNED needs DIGESTS"):
        aprfast.open(bytes(buf))


def test_unsigned_digest_manifest(tensors):
    data = aprfast.save(tensors, digest="sha256")
    lay = layout_of(data)
    assert lay.flags & 0x30 == 0 and lay.block_flags == 0x02
    with aprfast.open(data) as f:
        assert f.security == {**f.security, "signed": False, "encrypted": False, "digest": "sha256"}
        assert_same(f.tensors(), tensors)
    with pytest.raises(DecryptError, match="not encrypted"):
        aprfast.open(data, password=PASSWORD)
    offset, _, _ = extent(data, "big.weight")
    buf = flip(bytearray(data), offset + MiB + 1)
    with aprfast.open(bytes(buf)) as f:
        with pytest.raises(ChecksumError, match="'big.weight': chunk 1 of 3"):
            f.get_tensor("big.weight")
    buf = flip(bytearray(data), lay.record(0))  # the manifest is covered by the block CRC
    with pytest.raises(ChecksumError, match="security block CRC32"):
        aprfast.open(bytes(buf))


def test_blake3_digests(tensors, monkeypatch):
    pytest.importorskip("blake3")
    data = aprfast.save(tensors, signing_key=SIGNING_SEED, digest="blake3")
    with aprfast.open(data, trusted_keys=[SIGNING_PUBLIC]) as f:
        assert f.security["digest"] == "blake3"
        assert_same(f.tensors(), tensors)
    offset, _, _ = extent(data, "small.bias")
    with aprfast.open(bytes(flip(bytearray(data), offset)), trusted_keys=[SIGNING_PUBLIC]) as f:
        with pytest.raises(SignatureError, match="blake3 digest"):
            f.get_tensor("small.bias")
    monkeypatch.setitem(sys.modules, "blake3", None)  # as if the package were missing
    with pytest.raises(VersionError, match=r"aprfast\[blake3\]"):
        aprfast.open(data)
    with pytest.raises(ValueError):
        aprfast.save(tensors, signing_key=SIGNING_SEED, digest="md5")


def test_reading_one_tensor_hashes_only_its_chunks(monkeypatch):
    """One signature check at open; then only the chunks read are hashed."""
    from aprfast.crypto import digests

    rng = np.random.default_rng(2)
    tensors = {f"t{i}": rng.standard_normal(MiB // 2, dtype=np.float32) for i in range(6)}
    data = aprfast.save(tensors, signing_key=SIGNING_SEED)
    hashed = []
    real = digests._sha256
    monkeypatch.setattr(digests, "_sha256", lambda b: hashed.append(len(b)) or real(b))
    verified = []
    real_verify = crypto.verify
    monkeypatch.setattr(crypto, "verify", lambda *a: verified.append(1) or real_verify(*a))
    with aprfast.open(data, trusted_keys=[SIGNING_PUBLIC]) as f:
        assert verified == [1] and hashed == []
        f.get_tensor("t4")
        assert hashed == [MiB, MiB]


# --- stream() from a real pipe -------------------------------------------------------------
def _pipe(data: bytes):
    """A real os.pipe fed by a thread; the read end as a file object."""
    r, w = os.pipe()

    def feed():
        with os.fdopen(w, "wb") as out:
            try:
                out.write(data)
            except BrokenPipeError:
                pass

    thread = threading.Thread(target=feed, daemon=True)
    thread.start()
    return os.fdopen(r, "rb"), thread


VARIANTS = {
    "signed": dict(signing_key=SIGNING_SEED),
    "signed-zstd": dict(signing_key=SIGNING_SEED, compression="zstd"),
    "encrypted": dict(password=PASSWORD),
    "encrypted-lz4-names": dict(password=PASSWORD, compression="lz4", encrypt_names=True),
    "signed-encrypted": dict(password=PASSWORD, signing_key=SIGNING_SEED),
    "digests": dict(digest="sha256"),
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_stream_gives_what_open_gives_from_a_pipe(tensors, variant):
    options = VARIANTS[variant]
    data = aprfast.save(tensors, {"m": 1}, **options)
    keys = {"password": PASSWORD} if "password" in options else {}
    if "signing_key" in options:
        keys["trusted_keys"] = [SIGNING_PUBLIC]
    with aprfast.open(data, **keys) as f:
        want = {n: f.get_tensor(n) for n in f.keys()}
        metadata = f.metadata
    reader, thread = _pipe(data)
    with reader:
        s = aprfast.stream(reader, **keys)
        assert s.metadata == metadata
        got = dict(s)
        assert s.verified
    thread.join()
    assert_same(got, want)


def test_a_signed_stream_checks_the_signature_before_the_first_tensor(signed):
    buf = fix_crcs(flip(bytearray(signed), layout_of(signed).record(5) + 1))
    reader, thread = _pipe(bytes(buf))
    with reader, pytest.raises(SignatureError):
        aprfast.stream(reader, trusted_keys=[SIGNING_PUBLIC])
    thread.join()


@pytest.mark.parametrize("options, error", [(dict(signing_key=SIGNING_SEED), SignatureError),
                                            (dict(password=PASSWORD), DecryptError)])
def test_a_stream_raises_at_the_bad_tensor_before_yielding_it(tensors, options, error):
    data = aprfast.save(tensors, **options)
    keys = {"password": PASSWORD} if "password" in options else {"trusted_keys": [SIGNING_PUBLIC]}
    offset, _, _ = extent(data, "mid.weight", **({"password": PASSWORD} if "password" in options else {}))
    buf = fix_crcs(flip(bytearray(data), offset + 7))
    reader, thread = _pipe(bytes(buf))
    yielded = []
    with reader:
        s = aprfast.stream(reader, **keys)
        with pytest.raises(error, match="mid.weight"):
            for name, _value in s:
                yielded.append(name)
    thread.join()
    assert yielded == ["big.weight"]  # index order; the bad one never came out


# --- any single damaged byte: a typed error or the right tensors, never wrong data ----------
_SMALL = {"a": np.arange(3000, dtype=np.float32), "b": np.arange(17, dtype=np.int16), "c": np.ones((4, 5))}


def _small_file(kind: str) -> bytes:
    from test_v2_helpers import RECIPIENT_PUBLIC

    options = {"signed": dict(signing_key=SIGNING_SEED), "sealed": dict(recipients=[RECIPIENT_PUBLIC]),
               "sealed-names-zstd": dict(recipients=[RECIPIENT_PUBLIC], encrypt_names=True, compression="zstd",
                                         signing_key=SIGNING_SEED)}[kind]
    return aprfast.save(_SMALL, {"m": [1, 2]}, **options)


_FILES = {}


@pytest.mark.parametrize("kind", ["signed", "sealed", "sealed-names-zstd"])
def test_any_damaged_byte_never_gives_wrong_tensors(kind):
    from hypothesis import given, settings
    from hypothesis import strategies as st
    from test_v2_helpers import RECIPIENT_SECRET

    data = _FILES.setdefault(kind, _small_file(kind))
    keys = {"trusted_keys": [SIGNING_PUBLIC]} if kind == "signed" else {"private_key": RECIPIENT_SECRET}

    @settings(max_examples=60, deadline=None)
    @given(at=st.integers(0, len(data) - 1), mask=st.integers(1, 255), recrc=st.booleans())
    def check(at, mask, recrc):
        buf = bytearray(data)
        buf[at] ^= mask
        if recrc:
            try:
                fix_crcs(buf)
            except Exception:  # noqa: BLE001 - the damage broke the layout the helper reads; test as is
                buf = bytearray(data)
                buf[at] ^= mask
        try:
            with aprfast.open(bytes(buf), **keys) as f:
                for name in f.keys():
                    try:
                        got = f.get_tensor(name)
                    except aprfast.AprError:
                        continue
                    assert name in _SMALL and np.array_equal(got, _SMALL[name]), (at, name)
        except aprfast.AprError:
            pass

    check()
