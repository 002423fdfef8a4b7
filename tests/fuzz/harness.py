"""The fuzz targets of aprfast's parsers, and the fix-ups that carry mutated bytes past
checksums, signatures and encryption.

Plain Python, no atheris: ``tests/test_fuzz_regressions.py`` replays committed inputs
through :data:`TARGETS` in the ordinary test suite, and ``fuzz_*.py`` hand the same
functions to atheris.

Every input starts with two control bytes, then the file:

* byte 0 (``control``) picks what the harness does before parsing (bit 0: re-seal the
  checksums and re-sign; the other bits are per target, see each ``target_*``);
* byte 1 (``param``) feeds whatever a target needs to choose (slice bounds, limits,
  the expected model type).

The oracle (:func:`run_one`): an :class:`aprfast.errors.AprError` is a correct refusal;
any other exception (MemoryError and RecursionError included) is a bug, and so is a
crash or a hang, which the fuzzer itself reports.

The checksum and signature fix-ups are written from the byte tables (docs/FORMAT.md,
APRENDER-COMPAT.md) with zlib and PyNaCl, not with aprfast's layout code, so they are an
independent witness; compressing and encrypting a v1 payload use aprfast's own codecs
and crypto writers (tested against aprender elsewhere).
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import io
import os
import struct
import sys
import tempfile
import zlib

import numpy as np

import aprfast
import aprfast.codecs
import aprfast.crypto
import aprfast.v1
from aprfast.errors import AprError

__all__ = ["TARGETS", "run_one", "fuzz_environment", "KEYS", "fix_v2", "fix_v1", "fix_v1_streaming", "CONTROL",
           "external", "drain_source", "convert_agrees", "write_scratch"]

# --- fixed test keys (public knowledge: they only let mutations past the checks) -------------
PASSWORD = "aprfast-fuzz"
_ED25519_SEED = hashlib.sha256(b"aprfast fuzz ed25519 seed").digest()
_ALICE = hashlib.sha256(b"aprfast fuzz x25519 alice").digest()
_BOB = hashlib.sha256(b"aprfast fuzz x25519 bob").digest()


def _keys():
    import nacl.bindings as nb
    import nacl.signing

    signer = nacl.signing.SigningKey(_ED25519_SEED)
    return {
        "password": PASSWORD,
        "ed25519_seed": _ED25519_SEED,
        "ed25519_public": bytes(signer.verify_key),
        "signer": signer,
        "alice": _ALICE, "alice_public": nb.crypto_scalarmult_base(_ALICE),
        "bob": _BOB, "bob_public": nb.crypto_scalarmult_base(_BOB),
    }


KEYS = _keys()


class CONTROL:
    """Bits of control byte 0."""

    FIX = 0x01       # every target: recompute CRCs (v2 header + footer, v1 trailer) and re-sign
    # v1 targets (fix_v1), applied in this order before FIX:
    PACK = 0x02      # compress the payload region with the header's codec (it holds plaintext)
    SEAL = 0x04      # encrypt the payload region (ENCRYPTED flag set) with the mode in bits 3-4
    MODE = 0x18      # 0: no credentials, 1: password, 2: recipient (alice), 3: multi-recipient
    TRUSTED = 0x20   # load_model(trusted_keys=[the fuzz key])
    EXPECT = 0x40    # load_model(expected_type=ModelType #param)
    LIMIT = 0x80     # load_model(max_uncompressed=param * 64)
    # open target:
    SOURCE = 0x06    # 0: bytes, 1: path (mmap), 2: path (pread), 3: io.BytesIO
    VERIFY = 0x08    # open(verify=True)
    RAW = 0x10       # unknown_dtypes="raw"
    COPY = 0x20      # tensors(copy=True), load_all(threads=2)
    # v1_open target: bits 0-5 as for v1_load (fix_v1 / fix_v1_streaming, MODE, TRUSTED), then
    #   0x40 open(verify=True), 0x80 through a path (param bit 0: pread, else mmap).
    # stream target: 0x01 FIX (fix_v2), 0x02 verify=False, 0x04 unknown_dtypes="raw", 0x08 the
    #   stream has read() only, 0x10 finish() instead of iterating, 0x20 the bytes themselves.


# --- fix-ups -----------------------------------------------------------------------------
APRENDER_MAGIC, APR2_MAGIC, V1_MAGIC = b"APR\x00", b"APR2", b"APRN"


def fix_v2(data: bytes) -> bytes:
    """Re-seal a v2 file of either layout; other bytes come back unchanged.

    ``APR\\0``: header CRC32 at [40, 44) over [0, 40) + [44, 64), and the 4-byte footer
    CRC32 of everything before it.  ``APR2``: the 16-byte footer ``crc32 | "2RPA" |
    u64 file size``, all three made right."""
    magic = data[:4]
    if magic == APRENDER_MAGIC and len(data) >= 68:
        out = bytearray(data)
        out[40:44] = struct.pack("<I", zlib.crc32(bytes(out[44:64]), zlib.crc32(bytes(out[:40]))))
        out[-4:] = struct.pack("<I", zlib.crc32(bytes(out[:-4])))
        return bytes(out)
    if magic == APR2_MAGIC and len(data) >= 48:
        body = data[:-16]
        return body + struct.pack("<I4sQ", zlib.crc32(body), b"2RPA", len(data))
    return data


_V1_HEADER = struct.Struct("<4sBBHIIIBBB9s")  # magic, major, minor, type, M, P, U, compression, flags, score
_V1_ENCRYPTED, _V1_SIGNED, _V1_STREAMING = 0x01, 0x02, 0x04


def fix_v1(data: bytes, control: int = CONTROL.FIX) -> bytes:
    """Carry a mutated v1 (``APRN``) file past its checks, as ``control`` asks:

    the plaintext tensor payload's own v2 checksums (FIX), then compression of the
    payload region with the header's codec (PACK, setting payload and uncompressed
    sizes), then encryption (SEAL, when the ENCRYPTED flag is set, in the mode of bits
    3-4, setting the payload size), then the Ed25519 signature (FIX, SIGNED flag set,
    the fuzz key replacing the embedded one, when the block lies where the header says)
    and the trailing CRC32 (FIX).  Sizes the header states are believed only as far as
    the bytes go, so lying sizes stay lies."""
    if data[:4] != V1_MAGIC or len(data) < _V1_HEADER.size + 4:
        return data
    fields = list(_V1_HEADER.unpack_from(data))
    meta_size, payload_size, compression, flags = fields[4], fields[5], fields[7], fields[8]
    if flags & _V1_STREAMING:
        return fix_v1_streaming(data, control)
    meta_end = min(32 + meta_size, len(data) - 4)
    payload_end = min(meta_end + payload_size, len(data) - 4)
    payload, rest = data[meta_end:payload_end], data[payload_end:]
    plaintext = not (control & (CONTROL.PACK | CONTROL.SEAL)) and compression == 0 and not flags & _V1_ENCRYPTED
    if control & CONTROL.FIX and (plaintext or control & (CONTROL.PACK | CONTROL.SEAL)):
        payload = fix_v2(payload)  # a tensor payload is a v2 container with its own CRCs
    if control & CONTROL.PACK and compression in (1, 2, 3):
        fields[6] = len(payload)
        # Both zstd ids get id 1's level 3: they decode alike, and level 19 costs ~0.3 s a call.
        payload = aprfast.codecs.compress(payload, 3 if compression == 3 else 1)
    if control & CONTROL.SEAL and flags & _V1_ENCRYPTED:
        payload = _encrypt(payload, (control & CONTROL.MODE) >> 3)
    if control & (CONTROL.PACK | CONTROL.SEAL):
        fields[5] = len(payload)
        if payload_size > len(data):  # keep a lie about the size a lie
            fields[5] = payload_size
    header = _V1_HEADER.pack(*fields)
    out = bytearray(header + data[32:meta_end] + payload + rest)
    if control & CONTROL.FIX:
        signed_end = 32 + meta_size + fields[5]
        if flags & _V1_SIGNED and signed_end + 96 + 4 <= len(out):
            signature = KEYS["signer"].sign(bytes(out[:signed_end])).signature
            out[signed_end:signed_end + 96] = signature + KEYS["ed25519_public"]
        out[-4:] = struct.pack("<I", zlib.crc32(bytes(out[:-4])))
    return bytes(out)


def _encrypt(payload: bytes, mode: int) -> bytes:
    """Fixed salts, nonces and ephemeral keys, so the same input gives the same bytes (a
    fuzzer wants that); multi-recipient wraps draw theirs at random (no API to fix them),
    which changes the ciphertext but not what decrypts."""
    c = aprfast.crypto
    if mode == 2:
        return bytes(c.encrypt_for_recipient(payload, KEYS["alice_public"], ephemeral_secret=bytes(range(32)),
                                             nonce=bytes(12)))
    if mode == 3:
        return bytes(c.encrypt_for_recipients(payload, [KEYS["bob_public"], KEYS["alice_public"]]))
    return bytes(c.encrypt_with_password(payload, PASSWORD, salt=bytes(range(16)), nonce=bytes(12)))


# --- the v1 STREAMING chunk index (docs/FORMAT.md "v1 streaming chunk index") ------------
_INDEX_HEADER = struct.Struct("<4sBBHIIIIII")  # magic, version, flags, reserved, I, T, C, chunk_limit, K, S
_CHUNK_RECORD = struct.Struct("<QIIII")        # offset, stored_size, raw_size, crc32, reserved
_SEALED, _DIGESTS = 0x01, 0x02
_INDEX_SIGNATURE_CONTEXT = b"aprfast v1 chunk index\x00"
_TAG = 16


class StreamingParts:
    """A STREAMING file cut along its index as far as the bytes go (``ok`` False when the
    index header is not there): the fix-ups and make_corpus's unsealed seeds use it."""

    def __init__(self, data: bytes):
        self.ok = False
        if data[:4] != V1_MAGIC or len(data) < _V1_HEADER.size + 4:
            return
        self.fields = list(_V1_HEADER.unpack_from(data))
        self.start = 32 + self.fields[4]
        body_end = len(data) - 4
        if self.start + _INDEX_HEADER.size > body_end:
            return
        (magic, _version, self.iflags, _res, self.isize, self.tcount, self.ccount, _limit, self.ksize,
         self.tsize) = _INDEX_HEADER.unpack_from(data, self.start)
        if magic != b"APRC" or self.isize < _INDEX_HEADER.size + 4 or self.start + self.isize > body_end:
            return
        self.end = self.start + self.isize
        self.rec = _CHUNK_RECORD.size + (32 if self.iflags & _DIGESTS else 0)
        self.sig_size = 64 if self.iflags & _DIGESTS else 0
        self.table = self.start + _INDEX_HEADER.size + self.tsize
        # chunk records that lie inside the index (before key block, signature and CRC)
        room = self.end - 4 - self.sig_size - self.ksize - self.table
        self.nchunks = max(0, min(self.ccount, room // self.rec)) if room > 0 else 0
        self.key_block = data[self.table + self.rec * self.ccount:][:self.ksize] if room >= 0 else b""
        self.records = _tensor_records(data[self.start + _INDEX_HEADER.size:self.table], self.tcount)
        self.ok = True

    def chunk(self, data, i):
        """(offset, stored, raw) of chunk record i."""
        return _CHUNK_RECORD.unpack_from(data, self.table + i * self.rec)[:3]

    def owner_record(self, i) -> bytes:
        """The record bytes of the tensor that owns chunk i (b"" if the table says none)."""
        at = 0
        for record, count in self.records:
            if i < at + count:
                return record
            at += count
        return b""


def _tensor_records(table: bytes, count: int) -> list:
    """[(record bytes, chunk_count)] of the tensor table, as far as it parses."""
    out, pos = [], 0
    for _ in range(min(count, 1 << 16)):
        if pos + 2 > len(table):
            break
        n = int.from_bytes(table[pos:pos + 2], "little")
        at = pos + 2 + n + 1
        if at + 1 > len(table):
            break
        ndim = table[at]
        at += 1 + 8 * ndim
        if at + 4 > len(table):
            break
        out.append((table[pos:at + 4], int.from_bytes(table[at:at + 4], "little")))
        pos = at + 4
    return out


def _file_key(key_block: bytes, mode: int):
    """The chunk key sealed in the key block, opened with the fuzz credentials of ``mode``."""
    c = aprfast.crypto
    try:
        if mode == 1:
            key = c.decrypt_with_password(key_block, PASSWORD)
        elif mode == 3 or (mode == 2 and c.is_multi_recipient(key_block)):
            key = c.decrypt_multi_recipient(key_block, KEYS["alice"])
        elif mode == 2:
            key = c.decrypt_as_recipient(key_block, KEYS["alice"])
        else:
            return None
    except AprError:
        return None
    return bytes(key) if len(key) == 32 else None


def chunk_aad(v1_header: bytes, metadata: bytes, index_header: bytes, record: bytes, offset: int, stored: int,
              raw: int, ordinal: int) -> bytes:
    return (v1_header + hashlib.sha256(metadata).digest() + index_header + record
            + struct.pack("<QIII", offset, stored, raw, ordinal))


def _aesgcm(key):
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    return AESGCM(key)


def fix_v1_streaming(data: bytes, control: int = CONTROL.FIX) -> bytes:
    """fix_v1 for a STREAMING file, from the chunk index's byte table (zlib, hashlib,
    PyNaCl and cryptography's AES-GCM; aprfast's codecs only to compress).

    PACK: each chunk's stored bytes are raw: compress each with the header's codec
    (raw_size := its length).  SEAL (ENCRYPTED set, the key block opens with the
    credentials of bits 3-4): each chunk's bytes are plaintext: seal each with
    AES-256-GCM under the file key, nonce = ordinal, AAD as the format says.  Both
    re-lay the chunks back to back (offsets, stored sizes, header payload and
    uncompressed sizes; a lying payload size stays a lie).  FIX then recomputes every
    chunk's CRC32 (and SHA-256 with DIGESTS), the index signature, the index CRC32
    (header + metadata + index), the whole-file signature and the trailing CRC32.
    Anything the bytes do not hold is left as it is."""
    parts = StreamingParts(data)
    if not parts.ok:
        return _fix_trailer(data, control)
    out = bytearray(data)
    fields = parts.fields
    payload_start = parts.end
    body_end = len(data) - 4
    compression, flags = fields[7], fields[8]
    pack = control & CONTROL.PACK and compression in (1, 2, 3)
    key = _file_key(parts.key_block, (control & CONTROL.MODE) >> 3) if (
        control & CONTROL.SEAL and flags & _V1_ENCRYPTED and parts.iflags & _SEALED) else None
    if (pack or key is not None) and parts.nchunks == parts.ccount:
        old_payload_end = min(payload_start + fields[5], body_end)
        pieces, raws = [], []
        for i in range(parts.nchunks):
            offset, stored, raw = parts.chunk(out, i)
            piece = bytes(out[payload_start + offset:min(payload_start + offset + stored, body_end)])
            if pack:
                raw = len(piece)
                piece = aprfast.codecs.compress(piece, 3 if compression == 3 else 1)
            pieces.append(piece)
            raws.append(raw)
        sizes = [len(p) + (_TAG if key is not None else 0) for p in pieces]
        offsets = [sum(sizes[:i]) for i in range(len(sizes))]
        if fields[5] <= len(data):  # keep a lie about the size a lie
            fields[5] = sum(sizes)
        if pack:
            fields[6] = sum(raws)
        out[:32] = _V1_HEADER.pack(*fields)  # in every chunk's AAD: set before sealing
        for i in range(parts.nchunks):
            struct.pack_into("<QII", out, parts.table + i * parts.rec, offsets[i], sizes[i], raws[i])
        if key is not None:
            header, metadata = bytes(out[:32]), bytes(out[32:parts.start])
            index_header = bytes(out[parts.start:parts.start + _INDEX_HEADER.size])
            aead = _aesgcm(key)
            pieces = [aead.encrypt(i.to_bytes(12, "little"), p,
                                   chunk_aad(header, metadata, index_header, parts.owner_record(i), offsets[i],
                                             sizes[i], raws[i], i))
                      for i, p in enumerate(pieces)]
        out[payload_start:old_payload_end] = b"".join(pieces)
    if control & CONTROL.FIX:
        body_end = len(out) - 4
        for i in range(parts.nchunks):
            offset, stored, _raw = parts.chunk(out, i)
            if payload_start + offset + stored > body_end:
                continue
            stored_bytes = bytes(out[payload_start + offset:payload_start + offset + stored])
            r = parts.table + i * parts.rec
            struct.pack_into("<I", out, r + 16, zlib.crc32(stored_bytes))
            if parts.iflags & _DIGESTS:
                out[r + 24:r + 56] = hashlib.sha256(stored_bytes).digest()
        end = parts.end
        if parts.iflags & _DIGESTS and parts.isize >= _INDEX_HEADER.size + 64 + 4:
            message = _INDEX_SIGNATURE_CONTEXT + bytes(out[:end - 68])
            out[end - 68:end - 4] = KEYS["signer"].sign(message).signature
        out[end - 4:end] = struct.pack("<I", zlib.crc32(bytes(out[:end - 4])))
    return _fix_trailer(bytes(out), control, signed_end=parts.end + struct.unpack_from("<I", out, 12)[0])


def _fix_trailer(data: bytes, control: int, signed_end: int | None = None) -> bytes:
    """The whole-file Ed25519 signature (SIGNED set, block where the header says) and the
    trailing CRC32, when FIX is asked."""
    if not control & CONTROL.FIX or len(data) < _V1_HEADER.size + 4:
        return data
    out = bytearray(data)
    if signed_end is not None and out[21] & _V1_SIGNED and signed_end + 96 + 4 <= len(out):
        signature = KEYS["signer"].sign(bytes(out[:signed_end])).signature
        out[signed_end:signed_end + 96] = signature + KEYS["ed25519_public"]
    out[-4:] = struct.pack("<I", zlib.crc32(bytes(out[:-4])))
    return bytes(out)


def _cheap_kdf(password, salt):
    salt = bytes(salt)
    if len(salt) < 8:
        raise ValueError(f"Argon2 needs a salt of at least 8 bytes, got {len(salt)}")
    pw = password.encode("utf-8") if isinstance(password, str) else bytes(password)
    return hashlib.sha256(b"aprfast-fuzz-kdf" + len(pw).to_bytes(8, "little") + pw + salt).digest()


@contextlib.contextmanager
def fuzz_environment():
    """Swap Argon2id (19 MiB, t=2: ~50 ms a call, paid on every input once a fuzzer
    mutates the salt) for SHA-256 of (password, salt), in aprfast.crypto itself so the
    fix-ups' encryption and the library's decryption agree; restored on exit.  Seeds
    are written under the same swap.  What the fuzzer exercises around it - the blob
    layout, lengths, the AEAD, decompression and parsing of what decrypts - is
    unchanged; Argon2 itself is argon2-cffi's, tested in tests/test_crypto.py."""
    c = aprfast.crypto
    saved = c.derive_password_key
    c.derive_password_key = _cheap_kdf
    try:
        yield
    finally:
        c.derive_password_key = saved


def split(data: bytes):
    """(control, param, file bytes) of one input."""
    if len(data) < 2:
        return 0, 0, b""
    return data[0], data[1], data[2:]


# --- touching what a parser returns -------------------------------------------------------
def touch(value) -> None:
    """Read every byte a returned value claims to hold (a bad view faults here)."""
    if isinstance(value, np.ndarray):
        value.tobytes()
    elif isinstance(value, aprfast.RawTensor):
        bytes(value.data)
        value.shape  # noqa: B018
    elif isinstance(value, dict):
        for item in value.values():
            touch(item)
    elif isinstance(value, (bytes, bytearray, memoryview)):
        bytes(value)


# --- targets ---------------------------------------------------------------------------
def target_load(data: bytes) -> None:
    """``aprfast.load(bytes)``: control bit 0 re-seals, bit 1 passes verify=False,
    bit 2 unknown_dtypes="raw"."""
    control, _param, body = split(data)
    if control & CONTROL.FIX:
        body = fix_v2(body)
    touch(aprfast.load(body, verify=not control & 0x02, unknown_dtypes="raw" if control & 0x04 else "error"))


_TMP = None


def _tmp_path() -> str:
    global _TMP
    if _TMP is None:
        # One file per process, rewritten for each input (run.py points this at its work
        # directory; libFuzzer's exit skips atexit).
        base = os.environ.get("APRFAST_FUZZ_TMPDIR") or (
            "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None)
        fd, _TMP = tempfile.mkstemp(prefix="aprfast-fuzz-", suffix=".apr", dir=base)
        os.close(fd)
        atexit.register(_remove, _TMP)
    return _TMP


def _remove(path):
    try:
        os.unlink(path)
    except OSError:
        pass


def _source_for(body: bytes, kind: int):
    """(target for aprfast.open, mode) for source kind 0-3."""
    if kind == 0:
        return body, None
    if kind == 3:
        return io.BytesIO(body), None
    path = _tmp_path()
    with open(path, "wb") as f:
        f.write(body)
    return path, ("mmap" if kind == 1 else "pread")


def target_open(data: bytes) -> None:
    """``aprfast.open`` and every accessor.  Control bit 0 re-seals, bits 1-2 pick the
    source (bytes, mmap'd path, pread path, BytesIO), bit 3 verify=True at open, bit 4
    unknown_dtypes="raw", bit 5 copies (tensors(copy=True), load_all(threads=2));
    ``param`` picks slice bounds."""
    control, param, body = split(data)
    if body[:4] == V1_MAGIC:  # aprfast.open gives a V1File: the v1_open target's
        return
    if control & CONTROL.FIX:
        body = fix_v2(body)
    target, mode = _source_for(body, (control & CONTROL.SOURCE) >> 1)
    raw = "raw" if control & CONTROL.RAW else "error"
    with aprfast.open(target, mode=mode, verify=bool(control & CONTROL.VERIFY), unknown_dtypes=raw) as f:
        names = f.keys()
        _ = (len(f), list(f), f.layout, f.header, f.metadata, f.path, repr(f))
        _ = "\x00missing" in f
        try:
            f.info("\x00missing")
        except AprError:
            pass
        else:
            raise AssertionError("info() of a missing name did not raise")
        for name in names:
            assert name in f
            info = f.info(name)
            info.as_dict()
            _ = (info.dtype_name, info.end)
            view = f.get_tensor(name)
            touch(view)
            full = raw_bytes(view)
            same("get_tensor(copy=True)", name, full, raw_bytes(f.get_tensor(name, copy=True)))
            touch(f.get_tensor(name, dequantize=True))
            _slices(f, name, info, param, view)
        everything = f.tensors(copy=bool(control & CONTROL.COPY))
        touch(everything)
        try:
            f.verify()
        except AprError:
            pass
        for verify in (False, True):
            try:
                loaded = f.load_all(verify=verify, threads=2 if control & CONTROL.COPY else 0)
            except AprError:
                continue
            touch(loaded)
            assert list(loaded) == names, f"load_all names {list(loaded)} != keys() {names}"
            for name in names:
                same("load_all", name, raw_bytes(everything[name]), raw_bytes(loaded[name]))
    if mode is not None:  # the eager path loaders, on the same file
        for mmap in (True, False):
            try:
                touch(aprfast.load_file(target, mmap=mmap, unknown_dtypes=raw))
            except AprError:
                pass


def raw_bytes(value) -> bytes:
    """The bytes of a tensor as returned (array or Raw/QuantizedTensor)."""
    if isinstance(value, np.generic):  # whole[int] of a 1-D array is a numpy scalar
        value = np.asarray(value)
    if isinstance(value, np.ndarray):
        value = np.ascontiguousarray(value)
        if value.dtype == np.bool_:  # a stored 0xff is True; numpy scalars make it 0x01
            return (value.view(np.uint8) != 0).tobytes()
        return value.tobytes()
    return bytes(value.data)


def same(what, name, want: bytes, got: bytes) -> None:
    """Differential oracle: two ways of reading the same bytes must agree."""
    if want != got:
        raise AssertionError(f"{what} of tensor {name!r} gives {len(got)} bytes that differ from the "
                             f"{len(want)} bytes get_tensor() gives")


def _slices(f, name, info, param, full) -> None:
    """Basic-index slices and intervals whose keys are valid for the shape, so that
    anything but an AprError (a refusal of the stored bytes) is a bug; each result is
    compared with the same index applied to the whole tensor ``full``."""
    try:
        sl = f.get_slice(name)
    except AprError:
        return
    sl.get_shape()
    if hasattr(sl, "get_dtype"):  # V1File's trueno _ViewSlice has none
        sl.get_dtype()
    shape = tuple(info.shape)
    if isinstance(sl, aprfast.QuantizedSlice):
        if not shape:
            return
        d = info.dtype
        n = shape[0]
        data = raw_bytes(full)
        if len(shape) == 1:  # bounds on block boundaries
            blocks = -(-n // d.block_elems)
            a = min((param % (blocks + 1)) * d.block_elems, n)
            keys = [slice(None), slice(a, n), slice(0, a)]

            def at(i):
                return len(data) if i == n else i // d.block_elems * d.block_bytes

            spans = [(at(k.start or 0), at(k.stop)) if (k.start or 0) != k.stop else (0, 0)
                     for k in (slice(0, n), *keys[1:])]
        else:
            a = param % (n + 1)
            row = len(data) // n if n else 0
            keys = [slice(None), slice(a, n), slice(0, a), slice(a, a), (slice(a, n), Ellipsis)]
            spans = [(0, n * row), (a * row, n * row), (0, a * row), (a * row, a * row), (a * row, n * row)]
        for key, (lo, hi) in zip(keys, spans):
            part = sl[key]
            touch(part)
            same(f"get_slice()[{key!r}]", name, data[lo:hi], raw_bytes(part))
        if isinstance(f, aprfast.AprFile):  # V1File.get_slice has no dequantize=
            touch(f.get_slice(name, dequantize=True)[keys[1]])
        return
    if not isinstance(full, np.ndarray):
        return
    same("get_slice()[...]", name, raw_bytes(full), raw_bytes(sl[...]))
    if not shape:
        touch(sl[()])
        return
    n = shape[0]
    a = param % (n + 1)
    b = (param * 7 + 3) % (n + 1)
    lo, hi = min(a, b), max(a, b)
    keys = [slice(lo, hi), slice(a, None), slice(None, None, -1), slice(None, None, 1 + param % 3), None]
    if n:
        keys += [param % n, -1, (param % n, Ellipsis)]
    if len(shape) >= 2 and shape[1]:
        keys += [(slice(None), param % shape[1]), (Ellipsis, slice(0, 1)), (slice(lo, hi), slice(None, None, 2))]
    for key in keys:
        part = sl[key]
        want = full[key]
        if part.shape != want.shape:
            raise AssertionError(f"get_slice({name!r})[{key!r}] has shape {part.shape}, numpy says {want.shape}")
        same(f"get_slice()[{key!r}]", name, raw_bytes(want), raw_bytes(part))
    if not hasattr(sl, "intervals"):  # V1File's ChunkSlice and _ViewSlice
        return
    pairs = [(lo, hi), (0, a)]
    same("intervals()", name, raw_bytes(np.concatenate([full[x:y] for x, y in pairs])),
         raw_bytes(sl.intervals(pairs)))
    touch(sl.intervals([]))
    if len(shape) >= 2:
        m = shape[-1]
        cut = param % (m + 1)
        same("intervals(axis=-1)", name, raw_bytes(full), raw_bytes(sl.intervals([(0, cut), (cut, m)], axis=-1)))


def target_inspect(data: bytes) -> None:
    """``aprfast.inspect(bytes)`` (v1 and v2): control bit 0 re-seals."""
    control, _param, body = split(data)
    if control & CONTROL.FIX:
        body = fix_v1(body, control) if body[:4] == V1_MAGIC else fix_v2(body)
    report = aprfast.inspect(body)
    repr(report)


def target_v1_load(data: bytes) -> None:
    """``aprfast.v1.load_model(bytes)`` with the credentials and checks control asks
    for (see :class:`CONTROL`), then everything the model offers."""
    control, param, body = split(data)
    if control & (CONTROL.FIX | CONTROL.PACK | CONTROL.SEAL):
        body = fix_v1(body, control)
    mode = (control & CONTROL.MODE) >> 3
    kwargs = {}
    if mode == 1:
        kwargs["password"] = PASSWORD
    elif mode in (2, 3):
        kwargs["private_key"] = KEYS["alice"]
    if control & CONTROL.TRUSTED:
        kwargs["trusted_keys"] = [KEYS["ed25519_public"]]
    if control & CONTROL.EXPECT:
        types = list(aprfast.v1.ModelType)
        kwargs["expected_type"] = types[param % len(types)]
    if control & CONTROL.LIMIT:
        kwargs["max_uncompressed"] = param * 64
    model = aprfast.v1.load_model(body, **kwargs)
    _ = (model.model_type, model.is_tensors, model.trusted, model.header.as_dict(), model.flags, repr(model.metadata))
    touch(model.payload)
    if model.license is not None:
        for kw in ({"now": 0}, {"now": 2**40, "seats_in_use": 1, "inferences_used": 1}):
            try:
                model.check_license(**kw)
            except AprError:
                pass


def target_v1_inspect(data: bytes) -> None:
    """``aprfast.v1.inspect_model(bytes)``: control bit 0 re-seals (fix_v1)."""
    control, _param, body = split(data)
    if control & CONTROL.FIX:
        body = fix_v1(body, control)
    repr(aprfast.v1.inspect_model(body))


def _v1_credentials(control: int) -> dict:
    """load_model / open keyword arguments for control bits 3-5 (MODE, TRUSTED)."""
    mode = (control & CONTROL.MODE) >> 3
    kwargs = {}
    if mode == 1:
        kwargs["password"] = PASSWORD
    elif mode in (2, 3):
        kwargs["private_key"] = KEYS["alice"]
    if control & CONTROL.TRUSTED:
        kwargs["trusted_keys"] = [KEYS["ed25519_public"]]
    return kwargs


def target_v1_open(data: bytes) -> None:
    """``aprfast.open`` of a v1 file (V1File: plain, whole-payload, STREAMING and
    TRUENO_NATIVE tensor files) with the credentials control bits 3-5 ask for, then
    every accessor; then ``aprfast.load`` and ``v1.load_model`` of the same bytes, which
    must give the same tensors when they accept them.  Control: bits 0-2 as for
    v1_load (FIX, PACK, SEAL: fix_v1 / fix_v1_streaming), bits 3-4 MODE, bit 5
    TRUSTED, bit 6 open(verify=True), bit 7 the bytes go through a path (``param``
    bit 0: pread, else mmap); ``param`` also picks slice bounds."""
    control, param, body = split(data)
    if body[:4] != V1_MAGIC:  # v2 files: the open target's
        return
    if control & (CONTROL.FIX | CONTROL.PACK | CONTROL.SEAL):
        body = fix_v1(body, control)
    kwargs = _v1_credentials(control)
    target, mode = (_source_for(body, 2 if param & 1 else 1) if control & 0x80 else (body, None))
    got = {}
    with aprfast.open(target, mode=mode, verify=bool(control & 0x40), **kwargs) as f:
        names = f.keys()
        _ = (len(f), list(f), f.layout, f.header, f.metadata, f.path, repr(f), f.flags, f.backend_hints)
        _ = "\x00missing" in f
        try:
            f.info("\x00missing")
        except AprError:
            pass
        else:
            raise AssertionError("info() of a missing name did not raise")
        for name in names:
            assert name in f
            info = f.info(name)
            info.as_dict()
            _ = (f.strides(name), f.backend_hint(name))
            try:
                f.chunks(name)
            except AprError:
                pass
            view = f.get_tensor(name)
            touch(view)
            got[name] = raw_bytes(view)
            same("get_tensor(copy=True)", name, got[name], raw_bytes(f.get_tensor(name, copy=True)))
            _slices(f, name, info, param, view)
        f.prefetch(names)
        everything = f.tensors(copy=True)
        for name in names:
            same("tensors(copy=True)", name, got[name], raw_bytes(everything[name]))
        try:
            f.verify()
        except AprError:
            pass
    # The eager readers, on the same bytes: where they accept, they agree.
    for what, read in (("load", lambda: aprfast.load(body, **kwargs)),
                       ("v1.load_model", lambda: aprfast.v1.load_model(body, **kwargs).payload)):
        try:
            loaded = read()
        except AprError:
            continue
        touch(loaded)
        if not isinstance(loaded, dict):
            raise AssertionError(f"{what} gives {type(loaded).__name__} for a file open() reads as tensors")
        assert sorted(loaded) == sorted(got), f"{what} names {sorted(loaded)} != open() names {sorted(got)}"
        for name in got:
            same(what, name, got[name], raw_bytes(loaded[name]))


class _Pipe:
    """A non-seekable stream over ``data`` that returns at most ``step`` bytes a call,
    through ``readinto`` or, with ``read_only``, only ``read``."""

    def __init__(self, data: bytes, step: int, read_only: bool):
        self._data, self._pos, self._step = memoryview(data), 0, step
        if read_only:
            self.read = self._read
        else:
            self.readinto = self._readinto

    def _read(self, n=-1):
        n = self._step if n is None or n < 0 else min(n, self._step)
        out = bytes(self._data[self._pos:self._pos + n])
        self._pos += len(out)
        return out

    def _readinto(self, view):
        out = self._read(len(view))
        view[:len(out)] = out
        return len(out)

    def seekable(self):
        return False


def target_stream(data: bytes) -> None:
    """``aprfast.stream`` over a non-seekable stream of short reads (``param`` sets the
    read size: 1 + param * 61 bytes, param 0 whole), every tensor touched.  A stream
    that ends without error with verify=True must be a file the random-access readers
    accept: after iterating, ``aprfast.load`` gives the same tensors; after
    ``finish()`` (which does not decode APR2 blocks, as ``verify()`` does not),
    ``aprfast.open(...).verify()`` passes.  Control: bit 0 re-seals (fix_v2, or fix_v1
    with FIX only), bit 1 verify=False, bit 2 unknown_dtypes="raw", bit 3 the stream
    has read() only, bit 4 finish() instead of iterating, bit 5 the bytes object itself
    (length known), bits 6-7 credentials (0 none, 1 password, 2 the recipient's key,
    3 password and the fuzz key trusted)."""
    control, param, body = split(data)
    if control & CONTROL.FIX:
        body = fix_v1(body, CONTROL.FIX) if body[:4] == V1_MAGIC else fix_v2(body)
    verify = not control & 0x02
    raw = "raw" if control & 0x04 else "error"
    kwargs = _v1_credentials({0: 0, 1: 1 << 3, 2: 2 << 3, 3: (1 << 3) | CONTROL.TRUSTED}[control >> 6])
    source = body if control & 0x20 else _Pipe(body, 1 + param * 61 if param else 1 << 20, bool(control & 0x08))
    got = {}
    with aprfast.stream(source, verify=verify, unknown_dtypes=raw, **kwargs) as s:
        names = s.names()
        _ = (s.layout, s.header, s.metadata, len(s), s.describe(), s.buffered)
        for name in names:
            s.info(name)
        if control & 0x10:
            s.finish()
        else:
            for name, tensor in s:
                touch(tensor)
                got[name] = raw_bytes(tensor)
            if sorted(got) != sorted(names):
                raise AssertionError(f"stream() yielded {sorted(got)} but names() says {sorted(names)}")
        if verify and not s.verified:
            raise AssertionError("stream() ended without error but is not verified")
    if not verify:
        return
    try:
        if control & 0x10:
            with aprfast.open(body, unknown_dtypes=raw, **kwargs) as f:
                f.verify()
            return
        loaded = aprfast.load(body, unknown_dtypes=raw, **kwargs)
    except AprError as exc:
        reader = "aprfast.open().verify()" if control & 0x10 else "aprfast.load"
        raise AssertionError(f"stream() accepted a file {reader} refuses: {exc!r}") from exc
    assert sorted(loaded) == sorted(got), f"load names {sorted(loaded)} != stream names {sorted(got)}"
    for name in got:
        same("aprfast.load", name, raw_bytes(loaded[name]), got[name])


def target_pytorch(data: bytes) -> None:
    """The PyTorch importer's pickle interpreter and zip reader (fuzz_pytorch.py)."""
    _fuzz_pytorch().target_pytorch(data)


def _fuzz_pytorch():
    return external("pytorch")


def external(name: str):
    """The module fuzz_<name>.py beside this file (loaded once, as
    ``aprfast_fuzz_<name>``, whatever name this harness was loaded under): the targets
    that keep their target, fix-ups and seeds in a file of their own."""
    import importlib.util

    key = f"aprfast_fuzz_{name}"
    module = sys.modules.get(key)
    if module is None:
        here = os.path.dirname(os.path.abspath(__file__))
        if here not in sys.path:  # the target files import this harness by name
            sys.path.insert(0, here)
        spec = importlib.util.spec_from_file_location(key, os.path.join(here, f"fuzz_{name}.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[key] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[key]
            raise
    return module


def _external_target(name: str):
    def target(data: bytes) -> None:
        getattr(external(name), f"target_{name}")(data)

    target.__name__ = target.__qualname__ = f"target_{name}"
    target.__doc__ = f"fuzz_{name}.py's target_{name}."
    return target


#: The targets that live in fuzz_<name>.py (each has target_<name> and write_seeds(dir)).
EXTERNAL = ("v2_security", "gguf", "safetensors", "onnx", "burnpack", "mle", "v1_index", "remote_index")


# --- converter sources: shared by the converter targets -------------------------------------
_SCRATCH_DIR = None


def scratch_dir() -> str:
    """A private directory for this process, emptied by the converter targets before each
    input (a source reads only what the input wrote there: an ONNX external-data path or
    a sharded index's shard names can reach nothing else)."""
    global _SCRATCH_DIR
    if _SCRATCH_DIR is None:
        base = os.environ.get("APRFAST_FUZZ_TMPDIR") or (
            "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None)
        _SCRATCH_DIR = tempfile.mkdtemp(prefix="aprfast-fuzz-src-", dir=base)
        atexit.register(_remove_tree, _SCRATCH_DIR)
    return _SCRATCH_DIR


def _remove_tree(path):
    import shutil

    shutil.rmtree(path, ignore_errors=True)


def write_scratch(files: dict) -> str:
    """Empty :func:`scratch_dir`, write ``files`` (plain name -> bytes) into it; its path."""
    d = scratch_dir()
    for name in os.listdir(d):
        target = os.path.join(d, name)
        if os.path.isdir(target) and not os.path.islink(target):
            _remove_tree(target)
        else:
            os.unlink(target)
    for name, blob in files.items():
        with open(os.path.join(d, name), "wb") as f:
            f.write(blob)
    return d


def drain_source(src) -> dict:
    """Read every tensor a converter source declares (``read`` with and without a
    scratch buffer, ``raw_range``, ``tensors()``), each value touched, its byte count
    checked against its spec and its statistics taken (:func:`take_stats`).  Returns
    name -> bytes."""
    from aprfast.convert._common import Scratch

    got, scratch = {}, Scratch()
    repr(src.metadata)
    try:
        for spec in src.specs:
            value = src.read(spec)
            touch(value)
            got[spec.name] = raw_bytes(value)
            if len(got[spec.name]) != spec.nbytes:
                raise AssertionError(f"read({spec.name!r}) gives {len(got[spec.name])} bytes; its spec "
                                     f"({spec.dtype.name} {list(spec.shape)}) says {spec.nbytes}")
            same("read(scratch)", spec.name, got[spec.name], raw_bytes(src.read(spec, scratch)))
            take_stats(value)
            if hasattr(src, "raw_range"):
                src.raw_range(spec)
        names = [name for name, value in src.tensors()]
        if names != [spec.name for spec in src.specs]:
            raise AssertionError(f"tensors() yields {names}, specs say {[s.name for s in src.specs]}")
    finally:
        scratch.release()
    return got


def take_stats(value) -> None:
    """The C statistics engine (csrc/stats.c: every dtype, packed types dequantized a
    block at a time) over a value read from fuzzed bytes, as ``apr tensors --stats`` and
    convert's validation run it; its histogram too (a second pass)."""
    from aprfast.numerics.stats import tensor_stats

    # what tensor_stats documents as TypeError: unknown dtypes (strict_dtypes=False, or a
    # dtype known only by name, carried as raw bytes: DType.opaque) and complex
    dtype = getattr(value, "dtype", 0)
    if dtype is None or getattr(dtype, "opaque", False) or (isinstance(value, np.ndarray) and dtype.kind == "c"):
        return
    try:
        result = tensor_stats(value, bins=5)
    except AprError:
        return
    repr(result)


def convert_agrees(path: str, got: dict, out: str) -> None:
    """``aprfast.convert(path, out)`` (validate="off": a NaN in fuzzed bytes is no parser
    bug) and the .apr must hold ``got``'s bytes."""
    # names="keep": a GGUF naming a known architecture would otherwise get the canonical
    # names of seed §10.8 in .apr (issue 26); the parser's bytes are what is compared here
    aprfast.convert(path, out, validate="off", force=True, names="keep")
    loaded = aprfast.load_file(out, unknown_dtypes="raw")
    if sorted(loaded) != sorted(got):
        raise AssertionError(f"convert() wrote {sorted(loaded)}, the source declares {sorted(got)}")
    for name, want in got.items():
        same("convert()", name, want, raw_bytes(loaded[name]))


TARGETS = {
    "load": target_load,
    "open": target_open,
    "inspect": target_inspect,
    "v1_load": target_v1_load,
    "v1_inspect": target_v1_inspect,
    "v1_open": target_v1_open,
    "stream": target_stream,
    "pytorch": target_pytorch,
    **{name: _external_target(name) for name in EXTERNAL},
}


#: Open bugs, reported and being fixed: (exception type name, message regex, a function
#: name the traceback must pass through or "", what).  Only APRFAST_FUZZ_IGNORE_KNOWN=1
#: (CI's smoke run) skips them, so a long run still shows them; delete an entry when its
#: fix lands.  Example of an entry (fixed in 1c71a46, kept as a pattern):
#:   ("TypeError", r"comparing strings with non-ASCII", "matches", "license.hash not ASCII")
KNOWN_OPEN: list = []


def is_known_open(exc: BaseException) -> bool:
    import re
    import traceback

    frames = {frame.name for frame in traceback.extract_tb(exc.__traceback__)}
    return any(type(exc).__name__ == kind and re.search(pattern, str(exc)) and (not where or where in frames)
               for kind, pattern, where, _ in KNOWN_OPEN)


def run_one(target, data: bytes, *, ignore_known: bool = False) -> None:
    """The oracle: AprError is a correct refusal; anything else propagates (a bug),
    except the KNOWN_OPEN bugs when ``ignore_known``."""
    try:
        target(data)
    except AprError:
        pass
    except Exception as exc:
        if not (ignore_known and is_known_open(exc)):
            raise
