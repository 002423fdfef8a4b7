"""aprfast against aprender-core 0.72.3: ENCRYPTED and SIGNED v1 (``APRN``) files.

The Rust side is ``apr-crypto-interop`` (tests/interop/harness-crypto), which calls
``aprender::format::{save_encrypted, load_encrypted, save_for_recipient,
load_as_recipient, save_signed, load_verified}`` on the ``GoldenModel`` struct of
aprender's v1 golden fixture.  Every direction is checked:

1. aprender's password files open in aprfast (wrong password: DecryptError);
2. aprfast's password files open in aprender (wrong password rejected);
3. recipient mode both ways, with keys made in Python whose public halves the Rust
   key code derives identically; a key that is not the recipient is turned away by
   the 8-byte hint before anything is decrypted;
4. signatures both ways (same bytes for the same seed), trusted and embedded keys,
   and tampered files (CRC fixed up) rejected by both;
5. aprfast's multi-recipient files (its own mode): every aprender loader fails
   cleanly, none returns a model;
6. aprfast's encrypt+sign files, which no aprender writer produces: what each
   aprender loader does with them.

Where the two disagree, the tests pin what each side does today and say why in the
docstring: files aprender accepts and aprfast refuses (an ephemeral X25519 key with
bit 255 set or of small order, a swapped embedded Ed25519 key under a trusted key, a
"signature" under the identity key), and hostile payload sizes on which aprender
panics.

Argon2id (m = 19 MiB) costs ~50 ms per password operation on either side, so the
password tests are kept few.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import struct
import subprocess
import zlib
from pathlib import Path

import pytest

from aprfast import v1
from aprfast.crypto import core as crypto
from aprfast.errors import DecryptError, SignatureError
from aprfast.layouts.v1 import Flag

RUN_TIMEOUT_S = 60
PINNED = {"created_at": "1700000000", "aprender_version": "0.0.0-interop"}
MODEL = {"name": "golden_v1", "weights": [1.0, 2.0, 0.5, -0.5, 4.0, -2.0, 0.25, 8.0], "bias": 0.125}
# Values that are not exact in decimal: the payload then tests the f32 bit patterns too.
ODD_MODEL = {"name": "ünïcödé-✓", "weights": [0.1 * i - 3.3 for i in range(300)], "bias": -1e-7}
PASSWORD = "pässwörd ✓ correct horse"
MODEL_TYPE = 1  # LinearRegression
ALL_COMPRESSIONS = [0, 1, 2, 3]  # None, zstd-3, zstd-19, LZ4 (lz4_flex block with its size)


# --- helpers ---------------------------------------------------------------------------
def f32(x: float) -> float:
    """``x`` rounded to f32 and widened back, as the harness prints f32 values."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


def golden_bincode(model: dict) -> bytes:
    """bincode 1.3 of GoldenModel {name: String, weights: Vec<f32>, bias: f32}: u64 LE
    name length, the UTF-8 name, u64 LE count, the f32 LE weights, the f32 LE bias."""
    name = model["name"].encode("utf-8")
    weights = model["weights"]
    return (struct.pack("<Q", len(name)) + name + struct.pack("<Q", len(weights))
            + struct.pack(f"<{len(weights)}f", *weights) + struct.pack("<f", model["bias"]))


def as_rust_prints(model: dict) -> dict:
    return {"name": model["name"], "weights": [f32(w) for w in model["weights"]], "bias": f32(model["bias"])}


def spec(model: dict = MODEL, compression: int = 0) -> dict:
    return {"model": model, "model_type": MODEL_TYPE, "compression": compression, "quality_score": 85,
            "metadata": PINNED}


def fix_crc(data: bytearray) -> bytearray:
    data[-4:] = struct.pack("<I", zlib.crc32(data[:-4]))
    return data


def region_offsets(data) -> tuple[int, int]:
    """(metadata end, payload end) from a v1 header."""
    metadata_size, payload_size = struct.unpack_from("<II", data, 8)
    return 32 + metadata_size, 32 + metadata_size + payload_size


class CryptoHarness:
    """Runs ``apr-crypto-interop``; specs and files go to the test's directory."""

    def __init__(self, binary: Path, workdir: Path):
        self.binary = binary
        self.workdir = workdir
        self._count = 0

    def path(self, stem: str, suffix: str = ".apr") -> Path:
        self._count += 1
        return self.workdir / f"{stem}-{self._count}{suffix}"

    def run(self, *args) -> dict:
        cmd = [str(self.binary), *(str(a) for a in args)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
        if proc.returncode != 0:
            raise AssertionError(f"{' '.join(cmd)} exited with {proc.returncode} (harness misuse):\n"
                                 f"{proc.stderr.strip()}")
        return json.loads(proc.stdout)

    def store(self, data, stem: str = "py") -> Path:
        path = self.path(stem)
        path.write_bytes(bytes(data))
        return path

    def _save(self, command: str, spec_: dict, key) -> Path:
        spec_path = self.path("spec", ".json")
        spec_path.write_text(json.dumps(spec_, ensure_ascii=False, allow_nan=False), encoding="utf-8")
        out = self.path("rust")
        result = self.run(command, spec_path, out, key)
        assert result["ok"], f"aprender refused to {command}: {result}"
        assert result["size"] == out.stat().st_size
        return out

    def save_encrypted(self, spec_: dict, password: str) -> Path:
        return self._save("save-encrypted", spec_, password)

    def save_for_recipient(self, spec_: dict, public: bytes) -> Path:
        return self._save("save-for-recipient", spec_, public.hex())

    def save_signed(self, spec_: dict, seed: bytes) -> Path:
        return self._save("save-signed", spec_, seed.hex())

    def _load(self, command: str, target, *keys) -> dict:
        path = target if isinstance(target, Path) else self.store(target)
        return self.run(command, path, *keys)

    def load_encrypted(self, target, password: str) -> dict:
        return self._load("load-encrypted", target, password)

    def load_as_recipient(self, target, secret: bytes) -> dict:
        return self._load("load-as-recipient", target, secret.hex())

    def load_verified(self, target, trusted: bytes | None = None) -> dict:
        return self._load("load-verified", target, *([trusted.hex()] if trusted is not None else []))

    def public(self, kind: str, secret: bytes) -> bytes:
        result = self.run(f"{kind}-public", secret.hex())
        assert result["ok"], result
        return bytes.fromhex(result["public"])


@pytest.fixture
def rust(crypto_harness_bin, tmp_path) -> CryptoHarness:
    return CryptoHarness(crypto_harness_bin, tmp_path)


def assert_loaded(result: dict, model: dict = MODEL) -> None:
    assert result["ok"], f"aprender refused the file: {result}"
    assert result["model"] == as_rust_prints(model)


def assert_clean_refusal(result: dict, kind: str | None = None, says: str | None = None) -> None:
    """aprender refused with an error (never a model, never a panic)."""
    assert not result["ok"], f"aprender returned a model: {result}"
    assert "model" not in result
    assert not result["error"].startswith("panic"), f"aprender panicked: {result}"
    if kind is not None:
        assert result["kind"] == kind, result
    if says is not None:
        assert says in result["error"], result


class _NoDecryption:
    """Stands in for aprfast's AES-GCM backend: any decryption attempt fails the test."""

    name = "forbidden"

    def open(self, *args):
        raise AssertionError("aprfast tried to decrypt")

    seal_into = open


# =======================================================================================
# Keys: the Rust key code and aprfast derive the same public keys
# =======================================================================================
RFC7748_ALICE = ("77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a",
                 "8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a")
RFC8032_TEST1 = ("9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60",
                 "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a")
# Unclamped extremes: both sides must clamp the same way.
EDGE_SECRETS = [bytes(32), b"\xff" * 32, bytes(range(32)), b"\x80" + bytes(30) + b"\x7f"]


def test_x25519_public_keys_agree(rust):
    secret, public = bytes.fromhex(RFC7748_ALICE[0]), bytes.fromhex(RFC7748_ALICE[1])
    assert rust.public("x25519", secret) == public == crypto.x25519_public_key(secret)
    for secret in EDGE_SECRETS + [crypto.generate_x25519_key()[0] for _ in range(4)]:
        assert rust.public("x25519", secret) == crypto.x25519_public_key(secret), secret.hex()
    secret, public = crypto.generate_x25519_key()
    assert rust.public("x25519", secret) == public


def test_ed25519_public_keys_agree(rust):
    seed, public = bytes.fromhex(RFC8032_TEST1[0]), bytes.fromhex(RFC8032_TEST1[1])
    assert rust.public("ed25519", seed) == public == crypto.public_key_of(seed)
    for seed in EDGE_SECRETS + [crypto.generate_signing_key()[0] for _ in range(4)]:
        assert rust.public("ed25519", seed) == crypto.public_key_of(seed), seed.hex()
    seed, public = crypto.generate_signing_key()
    assert rust.public("ed25519", seed) == public


# =======================================================================================
# 1. aprender save_encrypted -> aprfast
# =======================================================================================
@pytest.mark.parametrize("compression", ALL_COMPRESSIONS)
def test_aprender_password_file_opens_in_aprfast(rust, compression):
    path = rust.save_encrypted(spec(ODD_MODEL, compression), PASSWORD)
    data = path.read_bytes()
    plain = golden_bincode(ODD_MODEL)

    model = v1.load_model(path, password=PASSWORD, expected_type=MODEL_TYPE)
    assert model.payload == plain
    assert model.encryption == "password"
    assert model.metadata == PINNED
    h = model.header
    assert h.flags == Flag.ENCRYPTED
    assert (int(h.compression), h.uncompressed_size) == (compression, len(plain))
    assert h.quality_score == 0  # aprender's encrypted writer ignores SaveOptions.quality_score
    # The layout: salt(16) | nonce(12) | ciphertext || tag(16), the plaintext being the
    # (compressed) payload; for compression 0, exactly the bincode bytes.
    meta_end, payload_end = region_offsets(data)
    assert payload_end == len(data) - 4
    stored = crypto.decrypt_with_password(data[meta_end:payload_end], PASSWORD)
    assert h.payload_size == 16 + 12 + len(stored) + 16
    if compression == 0:
        assert stored == plain

    with pytest.raises(DecryptError):
        v1.load_model(path, password=PASSWORD + "!")
    with pytest.raises(DecryptError):
        v1.load_model(path)  # encrypted, and no key given


# =======================================================================================
# 2. aprfast password mode -> aprender load_encrypted
# =======================================================================================
@pytest.mark.parametrize("compression", ALL_COMPRESSIONS)
def test_aprfast_password_file_opens_in_aprender(rust, compression):
    path = rust.path("py")
    v1.save_model(golden_bincode(ODD_MODEL), path, model_type=MODEL_TYPE, metadata=PINNED,
                  compression=compression, password=PASSWORD)
    assert_loaded(rust.load_encrypted(path, PASSWORD), ODD_MODEL)
    assert_clean_refusal(rust.load_encrypted(path, "pässwörd"), "DecryptionFailed", "wrong password")
    # aprender has one password loader; its recipient loader is turned away by the hint.
    assert_clean_refusal(rust.load_as_recipient(path, crypto.generate_x25519_key()[0]),
                         "DecryptionFailed", "different recipient")


def test_empty_password_both_ways(rust):
    ours = v1.save_model(golden_bincode(MODEL), model_type=MODEL_TYPE, metadata=PINNED, password="")
    assert_loaded(rust.load_encrypted(ours, ""))
    theirs = rust.save_encrypted(spec(MODEL, 0), "")
    assert v1.load_model(theirs, password="").payload == golden_bincode(MODEL)


# =======================================================================================
# 3. recipient mode (X25519 + HKDF-SHA256 + AES-256-GCM), both ways
# =======================================================================================
@pytest.mark.parametrize("compression", [0, 1])
def test_aprender_recipient_file_opens_in_aprfast(rust, compression):
    secret, public = crypto.generate_x25519_key()
    assert rust.public("x25519", secret) == public
    path = rust.save_for_recipient(spec(ODD_MODEL, compression), public)
    data = path.read_bytes()

    model = v1.load_model(path, private_key=secret, expected_type=MODEL_TYPE)
    assert model.payload == golden_bincode(ODD_MODEL)
    assert model.encryption == "recipient"
    assert model.header.flags == Flag.ENCRYPTED
    # ephemeral public(32) | hint = the recipient key's first 8 raw bytes | nonce(12) | ct||tag
    meta_end, _ = region_offsets(data)
    assert data[meta_end + 32:meta_end + 40] == public[:8]
    assert crypto.is_recipient(data[meta_end:-4], secret)


def test_aprfast_refuses_a_non_recipient_before_decrypting(rust, monkeypatch):
    secret, public = crypto.generate_x25519_key()
    other_secret, other_public = crypto.generate_x25519_key()
    path = rust.save_for_recipient(spec(MODEL, 0), public)
    monkeypatch.setattr(crypto, "_aead", _NoDecryption())  # fails the test if AES-GCM runs
    with pytest.raises(DecryptError, match="not the recipient") as info:
        v1.load_model(path, private_key=other_secret)
    assert public[:8].hex() in info.value.message and other_public[:8].hex() in info.value.message


@pytest.mark.parametrize("compression", [0, 1])
def test_aprfast_recipient_file_opens_in_aprender(rust, compression):
    secret, public = crypto.generate_x25519_key()
    path = rust.path("py")
    v1.save_model(golden_bincode(ODD_MODEL), path, model_type=MODEL_TYPE, metadata=PINNED,
                  compression=compression, recipient=public)
    assert_loaded(rust.load_as_recipient(path, secret), ODD_MODEL)
    assert_clean_refusal(rust.load_as_recipient(path, crypto.generate_x25519_key()[0]),
                         "DecryptionFailed", "different recipient")


def test_recipient_file_with_altered_ciphertext_is_refused_by_both(rust):
    secret, public = crypto.generate_x25519_key()
    data = bytearray(v1.save_model(golden_bincode(MODEL), model_type=MODEL_TYPE, metadata=PINNED,
                                   recipient=public))
    _, payload_end = region_offsets(data)
    data[payload_end - 20] ^= 0x01  # inside the ciphertext
    fix_crc(data)
    with pytest.raises(DecryptError):
        v1.load_model(bytes(data), private_key=secret)
    assert_clean_refusal(rust.load_as_recipient(bytes(data), secret), "DecryptionFailed")


# =======================================================================================
# 3b. recipient files whose ephemeral key aprender accepts and aprfast refuses (by design)
# =======================================================================================
def _hkdf_sha256_no_salt(ikm: bytes, info: bytes) -> bytes:
    prk = hmac.new(bytes(32), ikm, hashlib.sha256).digest()
    return hmac.new(prk, info + b"\x01", hashlib.sha256).digest()


def aes256gcm(key: bytes, nonce: bytes, plaintext: bytes) -> bytes:
    """AES-256-GCM with an empty AAD: libsodium when this CPU has its AES-GCM, else OpenSSL."""
    from nacl import bindings
    from nacl._sodium import lib

    if lib.crypto_aead_aes256gcm_is_available() == 1:
        return bindings.crypto_aead_aes256gcm_encrypt(plaintext, None, nonce, key)
    aead = pytest.importorskip("cryptography.hazmat.primitives.ciphers.aead")
    return aead.AESGCM(key).encrypt(nonce, plaintext, None)


def test_ephemeral_key_with_bit_255_set(rust):
    """X25519 ignores bit 255 of a u-coordinate (RFC 7748 §5: receivers MUST mask it), so
    x25519-dalek decrypts a recipient file whose ephemeral key has that bit flipped.
    aprfast accepts only the canonical encoding (u < p, so bit 255 clear), which makes
    every flipped bit of the blob detectable, and refuses the file.  aprender never
    writes such a key (dalek's public keys are canonical)."""
    secret, public = crypto.generate_x25519_key()
    data = bytearray(rust.save_for_recipient(spec(MODEL, 0), public).read_bytes())
    meta_end, _ = region_offsets(data)
    assert data[meta_end + 31] & 0x80 == 0
    data[meta_end + 31] |= 0x80
    flipped = bytes(fix_crc(data))
    assert_loaded(rust.load_as_recipient(flipped, secret))                   # aprender: accepted
    with pytest.raises(DecryptError, match="non-canonical or small order"):
        v1.load_model(flipped, private_key=secret)                           # aprfast: refused


def test_small_order_ephemeral_key(rust):
    """An ephemeral key of small order (here u = 0) makes the X25519 result all zeros, so
    the AES key is HKDF(zeros), which anyone can compute.  x25519-dalek's
    ``diffie_hellman`` does not check for it, and aprender decrypts such a file;
    aprfast (libsodium refuses the all-zero result) refuses it."""
    secret, public = crypto.generate_x25519_key()
    plain = golden_bincode(MODEL)
    key = _hkdf_sha256_no_salt(bytes(32), b"apr-v1-encrypt")
    nonce = bytes(range(12))
    blob = bytes(32) + public[:8] + nonce + aes256gcm(key, nonce, plain)
    data = bytearray(v1.save_model(plain, model_type=MODEL_TYPE, metadata=PINNED, recipient=public))
    meta_end, payload_end = region_offsets(data)
    assert payload_end - meta_end == len(blob)
    data[meta_end:payload_end] = blob
    forged = bytes(fix_crc(data))
    assert_loaded(rust.load_as_recipient(forged, secret))                    # aprender: accepted
    with pytest.raises(DecryptError, match="non-canonical or small order"):
        v1.load_model(forged, private_key=secret)                            # aprfast: refused


# =======================================================================================
# 4. signatures (Ed25519 over header || metadata || payload), both ways
# =======================================================================================
@pytest.mark.parametrize("compression", [0, 1])
def test_aprender_signed_file_verifies_in_aprfast(rust, compression):
    seed, public = crypto.generate_signing_key()
    other_public = crypto.generate_signing_key()[1]
    path = rust.save_signed(spec(ODD_MODEL, compression), seed)

    trusted = v1.load_model(path, trusted_keys=[public], expected_type=MODEL_TYPE)
    assert trusted.payload == golden_bincode(ODD_MODEL)
    assert (trusted.signature, trusted.signer) == (v1.TRUSTED, public)
    assert trusted.header.flags == Flag.SIGNED
    assert trusted.header.quality_score == 0  # aprender's signed writer ignores it too

    embedded = v1.load_model(path)
    assert (embedded.signature, embedded.signer) == (v1.SELF_SIGNED, public)
    assert not embedded.trusted
    assert embedded.payload == golden_bincode(ODD_MODEL)

    with pytest.raises(SignatureError):
        v1.load_model(path, trusted_keys=[other_public])


@pytest.mark.parametrize("compression", [0, 1])
def test_aprfast_signed_file_verifies_in_aprender(rust, compression):
    seed, public = crypto.generate_signing_key()
    other_public = crypto.generate_signing_key()[1]
    path = rust.path("py")
    v1.save_model(golden_bincode(ODD_MODEL), path, model_type=MODEL_TYPE, metadata=PINNED,
                  compression=compression, signing_key=seed)
    assert_loaded(rust.load_verified(path, public), ODD_MODEL)
    assert_loaded(rust.load_verified(path), ODD_MODEL)
    assert_clean_refusal(rust.load_verified(path, other_public), "SignatureInvalid")


def test_signed_files_are_byte_identical(rust):
    """Ed25519 is deterministic and compression 0 is raw bincode: same seed, same spec,
    same bytes (aprender writes quality_score 0 here, so aprfast is given None)."""
    seed = bytes.fromhex(RFC8032_TEST1[0])
    theirs = rust.save_signed(spec(ODD_MODEL, 0), seed).read_bytes()
    ours = v1.save_model(golden_bincode(ODD_MODEL), model_type=MODEL_TYPE, metadata=PINNED,
                         compression=0, quality_score=None, signing_key=seed)
    assert ours == theirs


def _tamper(data: bytes, where: str) -> bytes:
    tampered = bytearray(data)
    meta_end, payload_end = region_offsets(tampered)
    offset = {"header": 25,                    # a reserved header byte
              "metadata": meta_end - 3,        # inside aprender_version
              "payload": meta_end + 10,        # the first byte of the name
              "signature": payload_end + 5,    # inside R
              }[where]
    tampered[offset] ^= 0x01
    return bytes(fix_crc(tampered))


@pytest.mark.parametrize("writer", ["aprender", "aprfast"])
@pytest.mark.parametrize("where", ["header", "metadata", "payload", "signature"])
def test_tampered_signed_file_is_refused_by_both(rust, writer, where):
    seed, public = crypto.generate_signing_key()
    if writer == "aprender":
        data = rust.save_signed(spec(MODEL, 0), seed).read_bytes()
    else:
        data = v1.save_model(golden_bincode(MODEL), model_type=MODEL_TYPE, metadata=PINNED, signing_key=seed)
    assert_loaded(rust.load_verified(data, public))  # the untampered file is fine
    bad = _tamper(data, where)

    with pytest.raises(SignatureError):
        v1.load_model(bad, trusted_keys=[public])
    with pytest.raises(SignatureError):
        v1.load_model(bad)
    assert_clean_refusal(rust.load_verified(bad, public), "SignatureInvalid")
    assert_clean_refusal(rust.load_verified(bad), "SignatureInvalid")


def test_replaced_embedded_key_aprender_trusts_the_signature_aprfast_the_key(rust):
    """A signed file whose embedded key was swapped for another valid key (CRC fixed).

    aprender's ``load_verified(Some(trusted))`` never looks at the embedded key: the
    signature still verifies under the trusted key, so the model loads.  aprfast
    requires the embedded key to be one of ``trusted_keys`` and refuses.  Without a
    trusted key both verify against the (wrong) embedded key and refuse."""
    seed, public = crypto.generate_signing_key()
    other_public = crypto.generate_signing_key()[1]
    data = bytearray(rust.save_signed(spec(MODEL, 0), seed).read_bytes())
    _, payload_end = region_offsets(data)
    data[payload_end + 64:payload_end + 96] = other_public
    bad = bytes(fix_crc(data))

    assert_loaded(rust.load_verified(bad, public))                       # aprender: accepted
    with pytest.raises(SignatureError, match="not among"):
        v1.load_model(bad, trusted_keys=[public])                        # aprfast: refused
    assert_clean_refusal(rust.load_verified(bad), "SignatureInvalid")
    with pytest.raises(SignatureError):
        v1.load_model(bad)


# Ed25519 encodings: the identity point (order 1) and the base point B.
IDENTITY = bytes([1]) + bytes(31)
BASE_POINT = bytes.fromhex("5866666666666666666666666666666666666666666666666666666666666666")


def test_signature_under_the_identity_key(rust):
    """With the identity point as public key A, [k]A vanishes and (R = B, S = 1)
    satisfies R = [S]B - [k]A for *any* content.  ed25519-dalek's ``verify`` (the
    non-strict one aprender calls) does not reject small-order keys, so aprender loads
    such a file, whose content was never signed, when verifying against the embedded
    key, and also when told to trust that key.  aprfast (libsodium's rules: no
    small-order key or R) refuses it either way."""
    data = bytearray(v1.save_model(golden_bincode(MODEL), model_type=MODEL_TYPE, metadata=PINNED,
                                   signing_key=crypto.generate_signing_key()[0]))
    _, payload_end = region_offsets(data)
    data[payload_end:payload_end + 96] = BASE_POINT + (1).to_bytes(32, "little") + IDENTITY
    forged = bytes(fix_crc(data))

    assert_loaded(rust.load_verified(forged))                   # aprender: accepted
    assert_loaded(rust.load_verified(forged, IDENTITY))         # aprender: accepted
    with pytest.raises(SignatureError, match="small order"):
        v1.load_model(forged)                                   # aprfast: refused
    with pytest.raises(SignatureError, match="small order"):
        v1.load_model(forged, trusted_keys=[IDENTITY])


# =======================================================================================
# 5. aprfast multi-recipient files: aprender has no such mode and must refuse them
# =======================================================================================
@pytest.mark.parametrize("compression", [0, 1])
def test_multi_recipient_file_is_refused_by_every_aprender_loader(rust, compression):
    keys = [crypto.generate_x25519_key() for _ in range(3)]
    path = rust.path("py")
    v1.save_model(golden_bincode(MODEL), path, model_type=MODEL_TYPE, metadata=PINNED, compression=compression,
                  recipients=[public for _, public in keys])
    for secret, _ in keys:  # aprfast itself opens it with each key
        model = v1.load_model(path, private_key=secret)
        assert (model.payload, model.encryption) == (golden_bincode(MODEL), "multi-recipient")

    # aprender reads bytes [32, 40) of the "APRM" blob as the hint: no key matches it.
    for secret, _ in keys:
        assert_clean_refusal(rust.load_as_recipient(path, secret), "DecryptionFailed", "different recipient")
    # As a password file: Argon2 over the blob's first 16 bytes, then AES-GCM fails.
    assert_clean_refusal(rust.load_encrypted(path, PASSWORD), "DecryptionFailed")
    assert_clean_refusal(rust.load_verified(path), "FormatError", "not signed")


# =======================================================================================
# 6. aprfast encrypt + sign (no aprender writer does both)
# =======================================================================================
def test_encrypted_and_signed_file_in_aprender(rust):
    """aprfast signs header || metadata || the *encrypted* payload, and appends the
    signature block after it, before the CRC.  aprender:

    * ``load_encrypted`` ignores the bytes between the payload and the CRC, so it
      decrypts and returns the model without checking (or noticing) the signature;
    * ``load_verified`` verifies the signature (it covers exactly the bytes aprender
      expects), then hands the ciphertext to bincode, which fails cleanly.
    """
    seed, signer = crypto.generate_signing_key()
    data = v1.save_model(golden_bincode(MODEL), model_type=MODEL_TYPE, metadata=PINNED,
                         password=PASSWORD, signing_key=seed)
    assert data[21] == Flag.ENCRYPTED | Flag.SIGNED
    model = v1.load_model(data, password=PASSWORD, trusted_keys=[signer])
    assert (model.payload, model.signature, model.encryption) == (golden_bincode(MODEL), v1.TRUSTED, "password")

    assert_loaded(rust.load_encrypted(data, PASSWORD))                              # signature unchecked
    assert_clean_refusal(rust.load_verified(data, signer), "Serialization", "deserialize")
    assert_clean_refusal(rust.load_verified(data), "Serialization", "deserialize")

    # A tampered signature does not stop aprender's decrypting loader; aprfast refuses.
    tampered = _tamper(data, "signature")
    assert_loaded(rust.load_encrypted(tampered, PASSWORD))
    with pytest.raises(SignatureError):
        v1.load_model(tampered, password=PASSWORD)


def test_recipient_encrypted_and_signed_file_in_aprender(rust):
    secret, public = crypto.generate_x25519_key()
    seed, signer = crypto.generate_signing_key()
    data = v1.save_model(golden_bincode(MODEL), model_type=MODEL_TYPE, metadata=PINNED, compression=1,
                         recipient=public, signing_key=seed)
    model = v1.load_model(data, private_key=secret, trusted_keys=[signer])
    assert (model.payload, model.signature) == (golden_bincode(MODEL), v1.TRUSTED)
    assert_loaded(rust.load_as_recipient(data, secret))
    # The ciphertext is not a zstd frame.
    assert_clean_refusal(rust.load_verified(data, signer), "Serialization", "decompression")


# =======================================================================================
# Hostile files: a payload_size too small for the crypto prefix
# =======================================================================================
PREFIX = {"password": 16 + 12, "recipient": 32 + 8 + 12}


@pytest.mark.parametrize("mode", ["password", "recipient"])
@pytest.mark.parametrize("shortfall", [1, 8, "all"])
def test_payload_shorter_than_the_crypto_prefix(rust, mode, shortfall):
    """A file cut so that its encrypted payload is shorter than the salt+nonce (password)
    or key+hint+nonce (recipient) prefix, header and CRC consistent with the cut.

    aprfast refuses it with DecryptError.  aprender 0.72.3 panics (the harness catches
    it): after checking only ``payload_end <= len - 4`` it slices the fixed-size prefix
    fields out of the content, so it either slices ``content[nonce_end..payload_end]``
    with nonce_end > payload_end or reads a field past the end of the file."""
    secret, public = crypto.generate_x25519_key()
    keys = {"password": PASSWORD} if mode == "password" else {"recipient": public}
    data = bytearray(v1.save_model(golden_bincode(MODEL), model_type=MODEL_TYPE, metadata=PINNED, **keys))
    meta_end, _ = region_offsets(data)
    size = 0 if shortfall == "all" else PREFIX[mode] - shortfall
    data = data[:meta_end + size] + bytes(4)
    struct.pack_into("<I", data, 12, size)
    short = bytes(fix_crc(data))
    with pytest.raises(DecryptError):
        if mode == "password":
            v1.load_model(short, password=PASSWORD)
        else:
            v1.load_model(short, private_key=secret)
    result = (rust.load_encrypted(short, PASSWORD) if mode == "password"
              else rust.load_as_recipient(short, secret))
    assert not result["ok"] and "model" not in result, result
    assert result["error"].startswith("panic: "), result  # recorded: an aprender bug
