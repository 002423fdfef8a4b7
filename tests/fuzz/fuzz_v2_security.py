#!/usr/bin/env python3
"""atheris target: opening encrypted and/or signed APR2 files (docs/FORMAT.md §3.2).

    python tests/fuzz/fuzz_v2_security.py --make-corpus DIR     # seed corpus into DIR
    python tests/fuzz/fuzz_v2_security.py [libFuzzer flags] [CORPUS_DIR ...]

Inputs are harness.py's: control byte, param byte, then the file.  Control bits:

* 0x01 FIX: carry a mutated header, metadata, index or security block past the checks
  made at open - the context tag (and, with sealed names, the metadata and index tags)
  recomputed under the content key the fuzz credentials open, the signature remade with
  the fuzz key, the block CRC and the footer CRC recomputed.  Chunk digests and tags are
  left as they are: a mutated chunk must be refused when it is read.
* 0x06 credentials: 0 none, 1 the fuzz password, 2 alice's X25519 key, 3 bob's.
* 0x08 trusted_keys=[the fuzz Ed25519 key];  0x10 require_signature=True.
* 0x20 also aprfast.stream() the bytes and compare with what open() gave.
* 0x40 allow_unencrypted=True.
* 0x80 (with 0x20) stream() reads a non-seekable pipe of short reads (1 + param * 61
  bytes a call; param odd: read() only), as harness.target_stream does.

``param`` picks slice bounds.  The oracle is harness.run_one's: an AprError is a correct
refusal, anything else (or a crash, a hang, a huge allocation) is a finding; reading the
same file through open() and stream() must give the same tensors.

The fix-up is written from FORMAT §3.2's byte tables with zlib, hashlib, PyNaCl and
``cryptography``'s AES, not with aprfast.security, so it is an independent witness (the
key block is opened with aprfast.crypto, as harness.py's v1 fix-ups seal with it).
"""

from __future__ import annotations

import io
import os
import struct
import sys
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

atheris = None
if __name__ == "__main__" and not {"--make-corpus", "--seeds"} & set(sys.argv[1:2]):
    try:
        import atheris
    except ImportError:  # seeds and replays need no atheris
        atheris = None

if atheris is not None:  # instrumented only when run as the fuzzer (not from harness.external)
    with atheris.instrument_imports(include=["aprfast"]):
        import aprfast
        import aprfast.codecs.blocks  # noqa: F401
        import aprfast.files.reader  # noqa: F401
        import aprfast.security  # noqa: F401
        import aprfast.stream  # noqa: F401
else:
    import aprfast

import hashlib  # noqa: E402

import harness  # noqa: E402  (imported after aprfast is instrumented)
import numpy as np  # noqa: E402

from aprfast.errors import AprError  # noqa: E402

FIX, CREDENTIALS, TRUSTED, REQUIRE, STREAM, ALLOW, PIPE = 0x01, 0x06, 0x08, 0x10, 0x20, 0x40, 0x80
KEYS = harness.KEYS

# --- FORMAT §3 / §3.2 byte tables ------------------------------------------------------
HEADER_SIZE, FOOTER_SIZE = 32, 16
BLOCK_MAGIC = b"APRS"
SEALED, DIGESTS, NAMES_SEALED, SIGNED = 0x01, 0x02, 0x04, 0x08
SPECIAL = 0xFFFFFFFF
CONTEXT_PREFIX = b"aprfast apr2 context\0"
NAMES_PREFIX = b"aprfast apr2 names\0"
SIGNATURE_PREFIX = b"aprfast apr2 signature\0"


def _nonce(i: int, k: int) -> bytes:
    return struct.pack("<IQ", i, k)


def _sections(data: bytes):
    """(metadata, index, block offset, block size, block flags, key block size) or None."""
    if len(data) < HEADER_SIZE + FOOTER_SIZE or data[:4] != b"APR2":
        return None
    meta_off, meta_size, index_off, index_size, _data_off = struct.unpack_from("<5I", data, 12)
    at = index_off + index_size
    if at + 32 > len(data) or data[at:at + 4] != BLOCK_MAGIC or meta_off + meta_size > len(data):
        return None
    flags, key_size, total = data[at + 5], *struct.unpack_from("<I", data, at + 8), \
        struct.unpack_from("<Q", data, at + 16)[0]
    if total < 36 or at + total > len(data) - FOOTER_SIZE:
        return None
    return (data[meta_off:meta_off + meta_size], data[index_off:index_off + index_size], at, total, flags,
            key_size)


def _content_key(key_block: bytes):
    """The 32-byte content key the fuzz credentials open, or None."""
    c = aprfast.crypto
    openers = [lambda: c.decrypt_with_password(key_block, harness.PASSWORD)]
    for who in ("alice", "bob"):
        if c.is_multi_recipient(key_block):
            openers.append(lambda who=who: c.decrypt_multi_recipient(key_block, KEYS[who]))
        else:
            openers.append(lambda who=who: c.decrypt_as_recipient(key_block, KEYS[who]))
    for opener in openers:
        try:
            key = bytes(opener())
        except AprError:
            continue
        return key if len(key) == 32 else None
    return None


def _retag(key: bytes, ciphertext: bytes, nonce: bytes, aad: bytes) -> bytes:
    """The AES-256-GCM tag of ``ciphertext`` as it stands: decrypted with the CTR stream
    GCM uses (counter block nonce || 2), then sealed again, which gives the same
    ciphertext and its tag."""
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    ctr = Cipher(algorithms.AES(key), modes.CTR(nonce + b"\0\0\0\x02")).decryptor()
    plain = ctr.update(ciphertext) + ctr.finalize()
    return AESGCM(key).encrypt(nonce, plain, aad)[-16:]


def fix_secured(data: bytes) -> bytes:
    """Carry mutated prefix bytes of a secured APR2 file past the checks made at open
    (see the module docstring); bytes that are not such a file come back unchanged."""
    found = _sections(data)
    if found is None:
        return data
    out = bytearray(data)
    metadata, index, at, total, flags, key_size = found
    header = bytes(out[:HEADER_SIZE])
    head_end = at + 32 + key_size
    pos = head_end
    if flags & SEALED and head_end + 16 <= at + total:
        key = _content_key(bytes(out[at + 32:head_end]))
        if key is not None:
            head = bytes(out[at:head_end])
            context = hashlib.sha256(CONTEXT_PREFIX + header + metadata + index + head).digest()
            out[pos:pos + 16] = _retag(key, b"", _nonce(SPECIAL, 0), context)
            if flags & NAMES_SEALED and pos + 48 <= at + total:
                aad = NAMES_PREFIX + header + head
                out[pos + 16:pos + 32] = _retag(key, metadata, _nonce(SPECIAL, 1), aad)
                out[pos + 32:pos + 48] = _retag(key, index, _nonce(SPECIAL, 2), aad)
    if flags & SIGNED and total >= 36 + 96:
        signature_at = at + total - 4 - 96
        message = SIGNATURE_PREFIX + header + metadata + index + bytes(out[at:signature_at])
        out[signature_at:signature_at + 64] = KEYS["signer"].sign(message).signature
        out[signature_at + 64:signature_at + 96] = KEYS["ed25519_public"]
    crc = zlib.crc32(bytes(out[at:at + total - 4]), zlib.crc32(index, zlib.crc32(metadata, zlib.crc32(header))))
    struct.pack_into("<I", out, at + total - 4, crc)
    struct.pack_into("<I", out, len(out) - FOOTER_SIZE, zlib.crc32(out[:-FOOTER_SIZE]))
    return bytes(out)


# --- the target ----------------------------------------------------------------------------
def _keys(control: int) -> dict:
    keys = {}
    who = (control & CREDENTIALS) >> 1
    if who == 1:
        keys["password"] = harness.PASSWORD
    elif who:
        keys["private_key"] = KEYS["alice" if who == 2 else "bob"]
    if control & TRUSTED:
        keys["trusted_keys"] = [KEYS["ed25519_public"]]
    if control & REQUIRE:
        keys["require_signature"] = True
    if control & ALLOW:
        keys["allow_unencrypted"] = True
    return keys


def target_v2_security(data: bytes) -> None:
    control, param, body = harness.split(data)
    if control & FIX:
        body = fix_secured(body)
    keys = _keys(control)
    got = {}
    with aprfast.open(body, **keys) as f:
        _ = (getattr(f, "security", None), getattr(f, "header", None), f.metadata, f.keys(), repr(f))
        for name in f.keys():
            info = f.info(name)
            value = f.get_tensor(name)
            harness.touch(value)
            got[name] = harness.raw_bytes(value)
            if isinstance(value, np.ndarray) and value.ndim and value.shape[0]:
                lo = param % value.shape[0]
                harness.same("get_slice", name, value[lo:lo + 1].tobytes(),
                             harness.raw_bytes(f.get_slice(name)[lo:lo + 1]))
            _ = info.as_dict()
        f.verify()
    if control & STREAM:
        source = io.BytesIO(body)
        if control & PIPE:  # a non-seekable stream of short reads (harness.target_stream's)
            source = harness._Pipe(body, 1 + param * 61 if param else 1 << 20, bool(param & 1))
        with aprfast.stream(source, **keys) as s:
            streamed = {name: harness.raw_bytes(t) for name, t in s}
            if not s.verified:
                raise AssertionError("stream() ended without error but is not verified")
        assert sorted(streamed) == sorted(got), f"stream() names {sorted(streamed)} != open() {sorted(got)}"
        for name, want in got.items():
            harness.same("stream()", name, want, streamed[name])


# --- seeds ---------------------------------------------------------------------------------
def _seed_tensors():
    rng = np.random.default_rng(5)
    return {"w": rng.standard_normal((24, 16)).astype(np.float32), "b": np.arange(16, dtype=np.float16),
            "z": np.zeros(600, np.int32), "e": np.zeros((0, 2), np.float32)}


def seeds() -> dict:
    """name -> (control, file bytes); written under harness.fuzz_environment()."""
    t = _seed_tensors()
    pw, seed = {"password": harness.PASSWORD}, KEYS["ed25519_seed"]
    files = {
        "password": (0x03, pw),
        "alice": (0x05, {"recipients": [KEYS["alice_public"]]}),
        "two": (0x07, {"recipients": [KEYS["alice_public"], KEYS["bob_public"]]}),
        "signed": (0x09 | STREAM, {"signing_key": seed}),
        "digests": (0x01 | STREAM, {"digest": "sha256"}),
        "pw-signed": (0x0B | STREAM, {**pw, "signing_key": seed}),
        "names": (0x03 | STREAM, {**pw, "encrypt_names": True}),
        "names-signed": (0x1B, {**pw, "encrypt_names": True, "signing_key": seed}),
        "zstd-pw": (0x03 | STREAM, {**pw, "compression": "zstd"}),
        "lz4-alice-signed": (0x0D, {"recipients": [KEYS["alice_public"]], "signing_key": seed,
                                    "compression": "lz4"}),
        # compressed and secured, streamed from a pipe of short reads (the C block decoders
        # behind stream(): LZ4 and zstd blocks, sealed, signed, names sealed)
        "lz4-pw-pipe": (0x03 | STREAM | PIPE, {**pw, "compression": "lz4"}),
        "zstd-signed-pipe": (0x09 | STREAM | PIPE, {"signing_key": seed, "compression": "zstd"}),
        "lz4-digests-pipe": (0x01 | STREAM | PIPE, {"digest": "sha256", "compression": "lz4"}),
        "zstd-names-alice-signed-pipe": (0x0D | STREAM | PIPE, {"recipients": [KEYS["alice_public"]],
                                                                "encrypt_names": True, "signing_key": seed,
                                                                "compression": "zstd"}),
    }
    out = {}
    for name, (control, options) in files.items():
        out[name] = (control, aprfast.save(t, {"model_name": name}, **options))
    return out


def make_corpus(directory: str) -> int:
    os.makedirs(directory, exist_ok=True)
    with harness.fuzz_environment():
        written = seeds()
        for name, (control, data) in written.items():
            target_v2_security(bytes([control, 3]) + data)  # every seed opens and reads as written
            for c in {control, control & ~FIX, control ^ STREAM}:
                with open(os.path.join(directory, f"{name}-{c:02x}03"), "wb") as f:
                    f.write(bytes([c, 3]) + data)
    return len(written)


def write_seeds(out_dir: str) -> int:
    """make_corpus under the name every fuzz_<target>.py gives it (make_corpus.py calls it)."""
    make_corpus(out_dir)
    return len(os.listdir(out_dir))


def main(argv: list) -> None:
    import warnings

    import fuzz

    warnings.simplefilter("error")
    ignore_known = os.environ.get("APRFAST_FUZZ_IGNORE_KNOWN", "0") == "1"

    def one_input(data: bytes) -> None:
        harness.run_one(target_v2_security, data, ignore_known=ignore_known)

    atheris.Setup(argv, one_input)
    fuzz._cap_address_space()
    with harness.fuzz_environment():
        atheris.Fuzz()


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] in ("--make-corpus", "--seeds"):
        print(f"{make_corpus(sys.argv[2])} seeds written to {sys.argv[2]}")
    elif atheris is None:
        sys.exit("atheris is not installed: pip install -r tests/fuzz/requirements.txt")
    else:
        main(sys.argv)
