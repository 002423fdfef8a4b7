"""APR2 encryption that keeps random access (docs/FORMAT.md §3.2): round trips for every
key kind and codec, every tampering case caught at the tensor tampered with, reads
that touch only the bytes they need, and the key rules."""

import io
import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_v2_helpers import (
    OTHER_PUBLIC,
    OTHER_SECRET,
    PASSWORD,
    RECIPIENT_PUBLIC,
    RECIPIENT_SECRET,
    MiB,
    extent,
    fix_crcs,
    flip,
    layout_of,
    model,
)

import aprfast
from aprfast import layouts
from aprfast.crypto.aead import ChunkCipher
from aprfast.errors import ChecksumError, CorruptError, DecryptError, LayoutError, LimitError, VersionError
from aprfast.files.writer import save_to
from aprfast.security import SecurityOptions
from aprfast.tensors import as_inputs

KEY_KINDS = {
    "password": (dict(password=PASSWORD), dict(password=PASSWORD)),
    "recipient": (dict(recipients=[RECIPIENT_PUBLIC]), dict(private_key=RECIPIENT_SECRET)),
    "recipients": (dict(recipients=[OTHER_PUBLIC, RECIPIENT_PUBLIC]), dict(private_key=RECIPIENT_SECRET)),
}


@pytest.fixture(scope="module")
def tensors():
    return model()


@pytest.fixture(scope="module")
def sealed(tensors):
    """One password-encrypted file, written once (Argon2id is deliberately slow)."""
    return aprfast.save(tensors, password=PASSWORD)


def assert_same(got: dict, want: dict):
    assert sorted(got) == sorted(want)
    for name, value in want.items():
        assert got[name].dtype == value.dtype and got[name].shape == value.shape, name
        assert np.array_equal(got[name], value), name


@pytest.mark.parametrize("kind", sorted(KEY_KINDS))
@pytest.mark.parametrize("compression", [None, "lz4", "zstd"])
@pytest.mark.parametrize("encrypt_names", [False, True])
def test_round_trip_every_key_kind_codec_and_names(tmp_path, tensors, kind, compression, encrypt_names):
    write, read = KEY_KINDS[kind]
    path = tmp_path / "m.apr"
    aprfast.save_file(tensors, path, compression=compression, encrypt_names=encrypt_names, **write)
    data = path.read_bytes()
    assert data[:4] == b"APR2" and layout_of(data).flags & 0x10
    for plain in tensors.values():  # no tensor's bytes appear in the clear
        if plain.nbytes >= 64:
            assert plain.tobytes()[:64] not in data
    with aprfast.open(path, **read) as f:
        assert f.security["encrypted"] and f.security["names_encrypted"] == encrypt_names
        assert f.security["encryption"] == {"password": "password", "recipient": "recipient",
                                            "recipients": "multi-recipient"}[kind]
        assert_same({n: f.get_tensor(n) for n in f.keys()}, tensors)
        got = f.get_tensor("big.weight")
        assert got.flags.owndata or got.base is not None
        assert got.flags.writeable  # owned, never a view of the file
        assert np.array_equal(f.get_slice("big.weight")[300:305, 7:9], tensors["big.weight"][300:305, 7:9])
        assert np.array_equal(f.get_slice("mid.weight")[123_456:123_470], tensors["mid.weight"][123_456:123_470])
        f.verify()
    assert_same(aprfast.load_file(path, **read), tensors)
    assert_same(aprfast.load_file(path, mmap=False, **read), tensors)
    assert_same(aprfast.load_file(path, mmap=False, verify=False, **read), tensors)  # no CRC: each byte read once
    assert_same(aprfast.load(data, **read), tensors)
    assert_same(dict(aprfast.stream(io.BytesIO(data), **read)), tensors)


def test_metadata_and_shared_storage(tensors):
    """Metadata round-trips; tied weights are stored once per name when sealed."""
    tied = dict(tensors, **{"tied.weight": tensors["big.weight"]})
    data = aprfast.save(tied, {"arch": "llama"}, password=PASSWORD, encrypt_names=True)
    with aprfast.open(data, password=PASSWORD) as f:
        assert f.metadata == {"arch": "llama"}
        assert f.info("tied.weight").offset != f.info("big.weight").offset
        assert np.array_equal(f.get_tensor("tied.weight"), tensors["big.weight"])


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(shift=st.integers(16, 18), compression=st.sampled_from([None, "lz4", "zstd"]),
       rows=st.integers(0, 300), cols=st.integers(1, 700), start=st.integers(0, 300), width=st.integers(0, 300))
def test_any_chunk_size_and_slice(shift, compression, rows, cols, start, width):
    """Random shapes over 64-256 KiB chunks: every slice equals NumPy's."""
    value = np.arange(rows * cols, dtype=np.float32).reshape(rows, cols)
    tensors = {"t": value, "u": np.arange(5, dtype=np.int64)}
    options = SecurityOptions(recipients=[RECIPIENT_PUBLIC], chunk_shift=shift)
    plan = layouts.plan(as_inputs(tensors), None, layout="apr2", compression=compression, security=options)
    out = io.BytesIO()
    save_to(out, plan)
    with aprfast.open(out.getvalue(), private_key=RECIPIENT_SECRET) as f:
        assert f.security["chunk_size"] == 1 << shift
        assert np.array_equal(f.get_slice("t")[start:start + width], value[start:start + width])
        assert np.array_equal(f.get_tensor("t"), value)
        assert np.array_equal(f.get_tensor("u"), tensors["u"])


def test_packed_and_half_dtypes_round_trip():
    pytest.importorskip("ml_dtypes")
    import ml_dtypes

    q = aprfast.numerics.quantization.quantize(np.linspace(-1, 1, 64 * 32, dtype=np.float32).reshape(64, 32), "Q8_0")
    tensors = {"q": q, "h": np.arange(100, dtype=ml_dtypes.bfloat16)}
    data = aprfast.save(tensors, password=PASSWORD, compression="zstd")
    with aprfast.open(data, password=PASSWORD) as f:
        got = f.get_tensor("q")
        assert bytes(got.data) == bytes(q.data) and got.shape == q.shape
        assert np.array_equal(f.get_tensor("h").astype(np.float32), tensors["h"].astype(np.float32))
        rows = f.get_slice("q")[3:9]
        assert rows.shape == (6, 32)


# --- keys ---------------------------------------------------------------------------------
def test_wrong_or_missing_key_is_typed(sealed):
    with pytest.raises(DecryptError, match="wrong password"):
        aprfast.open(sealed, password="not it")
    with pytest.raises(DecryptError, match="pass password= or private_key="):
        aprfast.open(sealed)
    with pytest.raises(DecryptError):
        aprfast.open(sealed, private_key=RECIPIENT_SECRET)
    data = aprfast.save({"a": np.ones(4)}, recipients=[RECIPIENT_PUBLIC])
    with pytest.raises(DecryptError, match="not the recipient|not a recipient"):
        aprfast.open(data, private_key=OTHER_SECRET)
    with pytest.raises(DecryptError):
        list(aprfast.stream(io.BytesIO(sealed), password="not it"))


def test_a_key_for_an_unencrypted_file_is_refused_unless_allowed():
    tensors = {"w": np.arange(40, dtype=np.float32).reshape(5, 8), "b": np.ones(3, np.float32)}
    for kwargs in (dict(layout="apr2"), dict(layout="aprender"), dict(signing_key=bytes(32))):
        plain = aprfast.save(tensors, **kwargs)
        with pytest.raises(DecryptError, match="not encrypted") as caught:
            aprfast.open(plain, password=PASSWORD)
        assert caught.value.code == "E005"
        with pytest.raises(DecryptError):
            aprfast.load(plain, private_key=RECIPIENT_SECRET)
        with pytest.raises(DecryptError):
            aprfast.stream(io.BytesIO(plain), password=PASSWORD)
        assert_same(aprfast.load(plain, password=PASSWORD, allow_unencrypted=True), tensors)


def test_listing_without_the_key(sealed, tensors):
    """The index is readable without the key unless the names are encrypted."""
    info = aprfast.inspect(sealed)
    assert sorted(info["tensors"]) == sorted(tensors)
    assert info["header"]["security"]["encrypted"]
    hidden = aprfast.save(tensors, password=PASSWORD, encrypt_names=True)
    for name in tensors:
        assert name.encode() not in hidden
    with pytest.raises(DecryptError, match="encrypted"):
        aprfast.inspect(hidden)


def test_bad_write_options_are_refused(tensors):
    with pytest.raises(ValueError):
        aprfast.save(tensors, password=PASSWORD, recipients=[RECIPIENT_PUBLIC])
    with pytest.raises(ValueError):
        aprfast.save(tensors, recipients=[])
    with pytest.raises(ValueError):
        aprfast.save(tensors, encrypt_names=True)
    with pytest.raises(LayoutError):
        aprfast.save(tensors, password=PASSWORD, layout="aprender")


# --- tampering, each caught at the tensor tampered with ------------------------------------
def _other_tensors_still_read(data, tampered, tensors, **keys):
    with aprfast.open(bytes(data), **keys) as f:
        for name in tensors:
            if name != tampered:
                assert np.array_equal(f.get_tensor(name), tensors[name])


def test_a_flipped_data_byte_fails_that_chunk_only(sealed, tensors):
    offset, size, _ = extent(sealed, "big.weight", password=PASSWORD)
    buf = fix_crcs(flip(bytearray(sealed), offset + 2 * MiB + 5))  # chunk 2 of 3
    with aprfast.open(bytes(buf), password=PASSWORD) as f:
        with pytest.raises(DecryptError, match=r"'big.weight': chunk 2 of 3"):
            f.get_tensor("big.weight")
        assert np.array_equal(f.get_slice("big.weight")[:10], tensors["big.weight"][:10])  # chunk 0 is intact
        with pytest.raises(DecryptError, match="chunk 2 of 3"):
            f.get_slice("big.weight")[600:]
        with pytest.raises(DecryptError):
            f.verify()
    _other_tensors_still_read(buf, "big.weight", tensors, password=PASSWORD)
    with pytest.raises(DecryptError):
        aprfast.load(bytes(buf), password=PASSWORD)


def test_a_flipped_tag_fails_that_chunk(sealed, tensors):
    _, _, first = extent(sealed, "small.bias", password=PASSWORD)
    buf = fix_crcs(flip(bytearray(sealed), layout_of(sealed).record(first) + 3))
    with aprfast.open(bytes(buf), password=PASSWORD) as f:
        with pytest.raises(DecryptError, match="'small.bias': chunk 0 of 1"):
            f.get_tensor("small.bias")
    _other_tensors_still_read(buf, "small.bias", tensors, password=PASSWORD)


def test_damage_without_fixing_crcs_is_a_checksum_error(sealed):
    buf = flip(bytearray(sealed), layout_of(sealed).record(0))
    with pytest.raises(ChecksumError, match="security block CRC32"):
        aprfast.open(bytes(buf), password=PASSWORD)


def test_an_altered_index_or_metadata_fails_at_open(tensors):
    data = aprfast.save(tensors, {"k": "v"}, password=PASSWORD)
    lay = layout_of(data)
    at = data.index(b"small.bias") + len("small.bias") - 1  # "small.bias" -> "small.bias" with its last byte changed
    buf = bytearray(data)
    buf[at] = ord("t")
    with pytest.raises(DecryptError, match="do not authenticate"):
        aprfast.open(bytes(fix_crcs(buf)), password=PASSWORD)
    buf = bytearray(data)
    meta = bytes(buf[lay.meta_off:lay.meta_off + lay.meta_size]).replace(b'"v"', b'"w"')
    buf[lay.meta_off:lay.meta_off + lay.meta_size] = meta
    with pytest.raises(DecryptError, match="do not authenticate"):
        aprfast.open(bytes(fix_crcs(buf)), password=PASSWORD)


def test_sealed_names_altered_fail(tensors):
    data = aprfast.save(tensors, password=PASSWORD, encrypt_names=True)
    lay = layout_of(data)
    buf = fix_crcs(flip(bytearray(data), lay.index_off + 20))
    with pytest.raises(DecryptError):
        aprfast.open(bytes(buf), password=PASSWORD)


def test_swapped_chunks_fail(sealed, tensors):
    offset, _, first = extent(sealed, "big.weight", password=PASSWORD)
    lay = layout_of(sealed)
    buf = bytearray(sealed)
    a, b = offset, offset + MiB
    buf[a:a + MiB], buf[b:b + MiB] = sealed[b:b + MiB], sealed[a:a + MiB]
    r0, r1 = lay.record(first), lay.record(first + 1)  # swap their tags too
    buf[r0:r0 + 16], buf[r1:r1 + 16] = sealed[r1:r1 + 16], sealed[r0:r0 + 16]
    with aprfast.open(bytes(fix_crcs(buf)), password=PASSWORD) as f:
        with pytest.raises(DecryptError, match="'big.weight': chunk 0 of 3"):
            f.get_tensor("big.weight")


def test_tensors_swapped_between_names_fail(tensors):
    """Two same-size tensors whose bytes (and tags) trade places: each opens only in its own place."""
    pair = {"a": np.arange(1000, dtype=np.float32), "b": np.arange(1000, 2000, dtype=np.float32)}
    data = aprfast.save(pair, password=PASSWORD)
    oa, sa, ra = extent(data, "a", password=PASSWORD)
    ob, sb, rb = extent(data, "b", password=PASSWORD)
    lay = layout_of(data)
    buf = bytearray(data)
    buf[oa:oa + sa], buf[ob:ob + sb] = data[ob:ob + sb], data[oa:oa + sa]
    ta, tb = lay.record(ra), lay.record(rb)
    buf[ta:ta + 16], buf[tb:tb + 16] = data[tb:tb + 16], data[ta:ta + 16]
    with aprfast.open(bytes(fix_crcs(buf)), password=PASSWORD) as f:
        for name in pair:
            with pytest.raises(DecryptError, match=f"'{name}'"):
                f.get_tensor(name)


def test_a_chunk_replayed_from_another_file_with_the_same_password_fails(sealed, tensors):
    """Same password, same tensors: the other file's content key differs, so its chunk
    (with its own tag) does not open here."""
    other = aprfast.save({**tensors, "small.bias": tensors["small.bias"] + 1}, password=PASSWORD)
    o1, s1, r1 = extent(sealed, "small.bias", password=PASSWORD)
    o2, s2, r2 = extent(other, "small.bias", password=PASSWORD)
    buf = bytearray(sealed)
    buf[o1:o1 + s1] = other[o2:o2 + s2]
    t1, t2 = layout_of(sealed).record(r1), layout_of(other).record(r2)
    buf[t1:t1 + 16] = other[t2:t2 + 16]
    with aprfast.open(bytes(fix_crcs(buf)), password=PASSWORD) as f:
        with pytest.raises(DecryptError, match="'small.bias'"):
            f.get_tensor("small.bias")
        assert np.array_equal(f.get_tensor("big.weight"), tensors["big.weight"])


def test_truncation_is_detected(sealed):
    for cut in (1, 16, MiB):
        with pytest.raises(CorruptError):
            aprfast.open(sealed[:-cut], password=PASSWORD)
    assert not ChunkCipher(bytes(32)).open(b"abc", bytearray(3), bytes(15), bytes(12), b"")  # a short tag fails


def test_clearing_the_encrypted_flag_is_detected(sealed, tensors):
    buf = bytearray(sealed)
    buf[8] &= ~0x10
    buf = fix_crcs(buf)
    with pytest.raises(CorruptError, match="flags are clear"):
        aprfast.open(bytes(buf))
    with pytest.raises(CorruptError, match="flags are clear"):
        aprfast.stream(io.BytesIO(bytes(buf)))
    # an attacker who also wipes the block's magic gets a plain file: a caller with a key refuses it
    lay = layout_of(sealed)
    buf[lay.block_at:lay.block_at + 4] = bytes(4)
    with pytest.raises(DecryptError, match="not encrypted"):
        aprfast.open(bytes(buf), password=PASSWORD)
    # and flags that disagree with the block are refused
    signed = aprfast.save(tensors, password=PASSWORD, signing_key=bytes(32))
    buf = bytearray(signed)
    buf[8] &= ~0x10
    with pytest.raises(CorruptError, match="disagree"):
        aprfast.open(bytes(fix_crcs(buf)), password=PASSWORD)


# --- hostile security blocks ------------------------------------------------------------
def _with_block_field(data, fmt, offset, value):
    buf = bytearray(data)
    struct.pack_into(fmt, buf, layout_of(data).block_at + offset, value)
    return bytes(buf)


@pytest.mark.parametrize("fmt, offset, value, error, words", [
    ("<B", 4, 2, VersionError, "version 2"),                 # version
    ("<B", 5, 0x41, VersionError, "flags 0x41"),             # unknown block flag
    ("<B", 7, 40, CorruptError, "chunk_shift 40"),           # chunk size
    ("<I", 8, 0, CorruptError, "key_block_size 0"),          # SEALED without a key block
    ("<I", 12, 1, VersionError, "reserved 1"),
    ("<Q", 16, 1 << 40, LimitError, "exceeds the limit"),    # block size
    ("<Q", 24, 1 << 30, CorruptError, "does not match"),     # chunk count
    ("<Q", 24, 4, CorruptError, "does not match"),
])
def test_hostile_block_fields_are_refused_cheaply(sealed, fmt, offset, value, error, words):
    with pytest.raises(error, match=words) as caught:
        aprfast.open(_with_block_field(sealed, fmt, offset, value), password=PASSWORD)
    assert isinstance(caught.value, aprfast.AprError)


def test_a_chunk_count_that_disagrees_with_the_index_is_refused(tensors):
    """A block consistent in itself (size, CRC) whose count does not match the index."""
    data = aprfast.save({"a": np.ones(10, np.float32)}, digest="sha256")  # no tag binds the count first
    lay = layout_of(data)
    # drop the one record: shrink the block by 16 and move the CRC (room before the data stays)
    buf = bytearray(data)
    rec = lay.record(0)
    block_end = lay.block_at + lay.block_size
    buf[rec:block_end - 32] = data[rec + 32:block_end]
    struct.pack_into("<QQ", buf, lay.block_at + 16, lay.block_size - 32, 0)
    with pytest.raises(CorruptError, match="make 1 chunks"):
        aprfast.open(bytes(fix_crcs(buf)))


def test_a_security_block_outside_its_room_is_refused():
    data = aprfast.save({"a": np.ones(10, np.float32)}, password=PASSWORD)
    lay = layout_of(data)
    buf = bytearray(data)
    struct.pack_into("<I", buf, 28, lay.block_at + 8)  # data offset inside the block
    with pytest.raises(CorruptError):
        aprfast.open(bytes(buf), password=PASSWORD)


# --- random access reads only what it needs ------------------------------------------------
class CountingFile(io.RawIOBase):
    """A seekable file object that counts the bytes read through it."""

    def __init__(self, data):
        self._data = memoryview(data)
        self.pos = 0
        self.count = 0

    def readable(self):
        return True

    def seekable(self):
        return True

    def seek(self, pos, whence=0):
        self.pos = pos if whence == 0 else (self.pos + pos if whence == 1 else len(self._data) + pos)
        return self.pos

    def tell(self):
        return self.pos

    def readinto(self, b):
        n = min(len(b), len(self._data) - self.pos)
        b[:n] = self._data[self.pos:self.pos + n]
        self.pos += n
        self.count += n
        return n


def test_reading_one_tensor_reads_only_its_chunks():
    rng = np.random.default_rng(1)
    tensors = {f"layer{i}.weight": rng.standard_normal(MiB // 2, dtype=np.float32) for i in range(8)}  # 2 MiB each
    data = aprfast.save(tensors, password=PASSWORD, signing_key=bytes(range(32)))
    counter = CountingFile(data)
    with aprfast.open(counter, password=PASSWORD) as f:
        at_open = counter.count
        assert at_open < 64 << 10  # header, metadata, index, security block, footer
        assert np.array_equal(f.get_tensor("layer5.weight"), tensors["layer5.weight"])
        assert counter.count - at_open == 2 * MiB  # its two chunks, nothing else
        before = counter.count
        assert np.array_equal(f.get_slice("layer2.weight")[10:20], tensors["layer2.weight"][10:20])
        assert counter.count - before == MiB  # one chunk
        before = counter.count
        f.get_slice("layer2.weight")[30:40]  # the same chunk again: kept decrypted
        assert counter.count == before


def test_random_access_on_a_compressed_encrypted_tensor():
    value = np.random.default_rng(3).integers(0, 1 << 20, 4 * MiB, dtype=np.int32)  # ~3/4 of it stored
    data = aprfast.save({"t": value}, password=PASSWORD, compression="lz4")
    counter = CountingFile(data)
    with aprfast.open(counter, password=PASSWORD) as f:
        at_open = counter.count
        assert np.array_equal(f.get_slice("t")[2_000_000:2_000_010], value[2_000_000:2_000_010])
        stored = f.info("t").nbytes
        assert counter.count - at_open <= 3 * MiB < stored  # the table's chunk and the block's, not the tensor


# --- AEAD backends and threads ----------------------------------------------------------
@pytest.mark.parametrize("write, read", [("libsodium", "cryptography"), ("cryptography", "libsodium")])
def test_files_are_the_same_whichever_aes_gcm_backend(monkeypatch, tensors, write, read):
    """libsodium (ctypes, detached) and OpenSSL (cryptography, in place) seal the same bytes."""
    from aprfast.crypto import aead
    from aprfast.crypto import core as crypto

    if aead._SODIUM is None:
        pytest.skip("libsodium's AES-GCM is not available on this CPU")
    pytest.importorskip("cryptography")
    monkeypatch.setattr(crypto, "AEAD_BACKEND", write)
    data = aprfast.save(tensors, recipients=[RECIPIENT_PUBLIC], compression="lz4", encrypt_names=True)
    monkeypatch.setattr(crypto, "AEAD_BACKEND", read)
    with aprfast.open(data, private_key=RECIPIENT_SECRET) as f:
        assert f._file.security.cipher.backend == read
        assert_same(f.tensors(), tensors)
    for n in (0, 1, 15, 16, 17, 4097):
        plain = bytes(range(256)) * 17
        plain = plain[:n]
        out = bytearray(n)
        tag = ChunkCipher(bytes(32), write).seal(plain, out, bytes(12), b"aad")
        back = bytearray(out)
        assert ChunkCipher(bytes(32), read).open(back, back, tag, bytes(12), b"aad") and bytes(back) == plain


def test_reads_from_many_threads_agree(tensors):
    from concurrent.futures import ThreadPoolExecutor

    data = aprfast.save(tensors, password=PASSWORD, signing_key=bytes(range(32)), compression="zstd")
    want = tensors["big.weight"]
    with aprfast.open(data, password=PASSWORD) as f:
        def read(k):
            start = (k * 37) % 600
            return np.array_equal(f.get_slice("big.weight")[start:start + 20], want[start:start + 20]) and \
                np.array_equal(f.get_tensor("mid.weight"), tensors["mid.weight"])

        with ThreadPoolExecutor(4) as pool:
            assert all(pool.map(read, range(64)))
