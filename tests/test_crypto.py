"""aprfast.crypto: aprender's v1 encryption and signing, byte for byte.

The layouts are checked against computations that share no code with aprfast.crypto:
a small pure-Python AES-256-GCM (itself pinned to FIPS-197 and the GCM spec's test
cases), HKDF written out with hmac, libsodium's own Argon2id, and, when installed,
cryptography's AESGCM.  Ed25519 is checked against libsodium (PyNaCl's SigningKey and
VerifyKey) on RFC 8032's vectors, on edge cases and on thousands of random cases.
"""

from __future__ import annotations

import array
import base64
import functools
import hashlib
import hmac
import os
import random
import stat
import sys
import tracemalloc

import pytest

pytest.importorskip("nacl", reason="aprfast.crypto needs PyNaCl (pip install 'aprfast[crypto]')")
pytest.importorskip("argon2", reason="aprfast.crypto needs argon2-cffi (pip install 'aprfast[crypto]')")

import nacl.bindings as nb  # noqa: E402
import nacl.exceptions  # noqa: E402
import nacl.signing  # noqa: E402

from aprfast.crypto import core as crypto  # noqa: E402
from aprfast.errors import AprIOError, DecryptError, FormatError, SignatureError  # noqa: E402

needs_aes_gcm = pytest.mark.skipif(
    crypto.AEAD_BACKEND == "unavailable",
    reason="no AES-256-GCM here: the CPU lacks AES-NI/ARMv8 crypto and cryptography is not installed")

L = 2**252 + 27742317777372353535851937790883648493
P = 2**255 - 19

# --- an independent AES-256-GCM (NIST SP 800-38D), slow but obviously written -------


def _make_sbox():
    sbox, p, q = [0] * 256, 1, 1
    while True:  # walk the multiplicative group with generator 3 and its inverse
        p ^= ((p << 1) & 0xFF) ^ (0x1B if p & 0x80 else 0)
        q ^= q << 1
        q ^= q << 2
        q ^= q << 4
        q &= 0xFF
        if q & 0x80:
            q ^= 0x09
        rot = lambda v, n: ((v << n) | (v >> (8 - n))) & 0xFF  # noqa: E731
        sbox[p] = q ^ rot(q, 1) ^ rot(q, 2) ^ rot(q, 3) ^ rot(q, 4) ^ 0x63
        if p == 1:
            break
    sbox[0] = 0x63
    return sbox


SBOX = _make_sbox()


def _xtime(b):
    return ((b << 1) ^ 0x1B) & 0xFF if b & 0x80 else b << 1


def _aes256_round_keys(key):
    words = [list(key[i:i + 4]) for i in range(0, 32, 4)]
    rcon = 1
    for i in range(8, 60):
        temp = list(words[i - 1])
        if i % 8 == 0:
            temp = [SBOX[b] for b in temp[1:] + temp[:1]]
            temp[0] ^= rcon
            rcon = _xtime(rcon)
        elif i % 8 == 4:
            temp = [SBOX[b] for b in temp]
        words.append([a ^ b for a, b in zip(words[i - 8], temp)])
    return [sum(words[4 * r:4 * r + 4], []) for r in range(15)]


def _aes256_block(round_keys, block):
    state = [b ^ k for b, k in zip(block, round_keys[0])]
    for rnd in range(1, 15):
        state = [SBOX[b] for b in state]
        state = [state[(i + 4 * (i % 4)) % 16] for i in range(16)]  # ShiftRows, column-major
        if rnd != 14:
            mixed = []
            for c in range(4):
                a = state[4 * c:4 * c + 4]
                mixed += [_xtime(a[i]) ^ _xtime(a[(i + 1) % 4]) ^ a[(i + 1) % 4]
                          ^ a[(i + 2) % 4] ^ a[(i + 3) % 4] for i in range(4)]
            state = mixed
        state = [b ^ k for b, k in zip(state, round_keys[rnd])]
    return bytes(state)


def _gf128_mul(x, y):
    z, v = 0, y
    for i in range(127, -1, -1):
        if (x >> i) & 1:
            z ^= v
        v = (v >> 1) ^ (0xE1 << 120) if v & 1 else v >> 1
    return z


def _ghash(h, aad, ciphertext):
    def blocks(data):
        padded = data + bytes(-len(data) % 16)
        return [padded[i:i + 16] for i in range(0, len(padded), 16)]

    lengths = (len(aad) * 8).to_bytes(8, "big") + (len(ciphertext) * 8).to_bytes(8, "big")
    x = 0
    for block in blocks(aad) + blocks(ciphertext) + [lengths]:
        x = _gf128_mul(x ^ int.from_bytes(block, "big"), h)
    return x.to_bytes(16, "big")


def reference_aes256gcm(key, nonce, plaintext, aad=b""):
    """ciphertext || tag, computed without any library."""
    round_keys = _aes256_round_keys(bytes(key))
    h = int.from_bytes(_aes256_block(round_keys, bytes(16)), "big")
    out = bytearray()
    for i in range(0, len(plaintext), 16):
        counter = bytes(nonce) + (2 + i // 16).to_bytes(4, "big")
        stream = _aes256_block(round_keys, counter)
        out += bytes(a ^ b for a, b in zip(plaintext[i:i + 16], stream))
    tag_mask = _aes256_block(round_keys, bytes(nonce) + (1).to_bytes(4, "big"))
    tag = bytes(a ^ b for a, b in zip(_ghash(h, bytes(aad), bytes(out)), tag_mask))
    return bytes(out) + tag


def hkdf_by_hand(ikm, info, salt=b"", length=32):
    prk = hmac.new(salt or bytes(32), ikm, hashlib.sha256).digest()
    okm, block = b"", b""
    for counter in range(1, -(-length // 32) + 1):
        block = hmac.new(prk, block + info + bytes([counter]), hashlib.sha256).digest()
        okm += block
    return okm[:length]


def test_reference_aes_matches_fips197_c3():
    key = bytes(range(32))
    block = bytes.fromhex("00112233445566778899aabbccddeeff")
    assert _aes256_block(_aes256_round_keys(key), block).hex() == "8ea2b7ca516745bfeafc49904b496089"


def test_reference_gcm_matches_spec_test_cases_13_and_14():
    assert reference_aes256gcm(bytes(32), bytes(12), b"").hex() == "530f8afbc74536b9a963b4f1c4cb738b"
    assert reference_aes256gcm(bytes(32), bytes(12), bytes(16)).hex() == (
        "cea7403d4d606b6e074ec5d3baf39d18" "d0d1c8a799996bf0265b98b5d48ab919")


def test_reference_gcm_agrees_with_libsodium_on_random_inputs():
    if not crypto._lib.crypto_aead_aes256gcm_is_available():
        pytest.skip("libsodium AES-GCM unavailable on this CPU")
    rng = random.Random(5)
    for size in (0, 1, 15, 16, 17, 70):
        key, nonce = rng.randbytes(32), rng.randbytes(12)
        message, aad = rng.randbytes(size), rng.randbytes(size % 23)
        assert reference_aes256gcm(key, nonce, message, aad) == \
            nb.crypto_aead_aes256gcm_encrypt(message, aad or None, nonce, key)


# --- key derivation --------------------------------------------------------------


def test_constants_are_aprenders():
    assert (crypto.ARGON2_MEMORY_KIB, crypto.ARGON2_TIME, crypto.ARGON2_PARALLELISM,
            crypto.KEY_SIZE) == (19456, 2, 1, 32)
    assert crypto.HKDF_INFO == b"apr-v1-encrypt"
    assert crypto.MULTI_WRAP_INFO != crypto.HKDF_INFO


def test_argon2id_key_equals_libsodiums_argon2id():
    # libsodium's Argon2id is an independent implementation with p fixed at 1.
    salt = bytes(range(16))
    expected = nb.crypto_pwhash_alg(32, "correct horse".encode(), salt, 2, 19456 * 1024,
                                    nb.crypto_pwhash_ALG_ARGON2ID13)
    assert crypto.derive_password_key("correct horse", salt) == expected
    assert crypto.derive_password_key(b"correct horse", bytearray(salt)) == expected


def test_password_is_hashed_as_utf8():
    salt = os.urandom(16)
    assert crypto.derive_password_key("pässwörd", salt) == \
        crypto.derive_password_key("pässwörd".encode("utf-8"), salt)


def test_hkdf_rfc5869_case3_no_salt_no_info():
    okm = crypto._hkdf_sha256(bytes([0x0B]) * 22, b"", length=42)
    assert okm.hex() == ("8da4e775a563c18f715f802a063c5a31b8a11f5c5ee1879ec3454e5f"
                         "3c738d2d9d201395faa4b61a96c8")


def test_hkdf_rfc5869_case1_with_salt_and_info():
    okm = crypto._hkdf_sha256(bytes([0x0B]) * 22, bytes.fromhex("f0f1f2f3f4f5f6f7f8f9"),
                              salt=bytes(range(13)), length=42)
    assert okm.hex() == ("3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56"
                         "ecc4c5bf34007208d5b887185865")


def test_x25519_rfc7748_section_6_1():
    alice = bytes.fromhex("77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a")
    bob_public = bytes.fromhex("de9edb7d7b7dc1b4d35b61c2ece435373f8343c85b78674dadfc7e146f882b4f")
    assert crypto.x25519_public_key(alice).hex() == \
        "8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a"
    assert bytes(crypto._x25519_shared(alice, bob_public)).hex() == \
        "4a5d9d5ba4ce2de1728e3bf480350f25e07e21c947d19e3376f09b3c1e161742"


# --- password mode ---------------------------------------------------------------

SALT = bytes(range(16))
NONCE = bytes(range(16, 28))
PAYLOAD = b"bincode payload of a LinearRegression \x00\x01\x02"


@needs_aes_gcm
def test_password_blob_is_salt_nonce_ciphertext_tag():
    blob = crypto.encrypt_with_password(PAYLOAD, "secret", salt=SALT, nonce=NONCE)
    key = nb.crypto_pwhash_alg(32, b"secret", SALT, 2, 19456 * 1024, nb.crypto_pwhash_ALG_ARGON2ID13)
    assert bytes(blob) == SALT + NONCE + reference_aes256gcm(key, NONCE, PAYLOAD)
    assert len(blob) == 16 + 12 + len(PAYLOAD) + 16


@needs_aes_gcm
def test_password_blob_matches_cryptography_and_argon2_cffi():
    aead = pytest.importorskip("cryptography.hazmat.primitives.ciphers.aead")
    from argon2.low_level import Type, hash_secret_raw

    key = hash_secret_raw(b"secret", SALT, time_cost=2, memory_cost=19456, parallelism=1,
                          hash_len=32, type=Type.ID, version=19)
    expected = SALT + NONCE + aead.AESGCM(key).encrypt(NONCE, PAYLOAD, None)
    assert bytes(crypto.encrypt_with_password(PAYLOAD, "secret", salt=SALT, nonce=NONCE)) == expected
    assert crypto.decrypt_with_password(expected, "secret") == PAYLOAD


@needs_aes_gcm
def test_password_round_trip_of_every_bytes_like_type():
    for data in (b"", b"x", bytearray(b"abc" * 100), memoryview(b"mapped"),
                 array.array("I", [1, 2, 3])):
        blob = crypto.encrypt_with_password(data, b"pw")
        assert crypto.decrypt_with_password(memoryview(blob), bytearray(b"pw")) == bytes(data)


@needs_aes_gcm
def test_password_blobs_are_fresh_each_time():
    assert crypto.encrypt_with_password(b"same", "pw") != crypto.encrypt_with_password(b"same", "pw")


@needs_aes_gcm
def test_wrong_password_is_decrypt_error():
    blob = crypto.encrypt_with_password(PAYLOAD, "right")
    with pytest.raises(DecryptError, match="wrong password") as info:
        crypto.decrypt_with_password(blob, "wrong")
    assert info.value.code == "E005"


def test_short_password_blob_is_decrypt_error():
    with pytest.raises(DecryptError, match="shorter"):
        crypto.decrypt_with_password(bytes(43), "pw")


@pytest.fixture
def cached_argon2(monkeypatch):
    """Each salt is hashed once: flipping 360 bits must not cost 360 Argon2 runs."""
    slow = crypto.derive_password_key

    @functools.lru_cache(maxsize=None)
    def cached(password, salt):
        return slow(password, salt)

    monkeypatch.setattr(crypto, "derive_password_key", lambda pw, salt: cached(pw, bytes(salt)))


def _every_bit_flipped(blob):
    for position in range(len(blob) * 8):
        altered = bytearray(blob)
        altered[position // 8] ^= 1 << (position % 8)
        yield position, bytes(altered)


@needs_aes_gcm
def test_every_flipped_bit_of_a_password_blob_is_detected(cached_argon2):
    blob = crypto.encrypt_with_password(b"x", "pw")
    for position, altered in _every_bit_flipped(blob):
        with pytest.raises(DecryptError):
            crypto.decrypt_with_password(altered, "pw")
            pytest.fail(f"bit {position} flipped went unnoticed")


# --- recipient mode --------------------------------------------------------------

ALICE = bytes.fromhex("77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a")
BOB = bytes.fromhex("5dab087e624a8a4b79e17f8b83800ee66f3bb1292618b6fd1c2f8b27ff88e0eb")
BOB_PUBLIC = bytes.fromhex("de9edb7d7b7dc1b4d35b61c2ece435373f8343c85b78674dadfc7e146f882b4f")


@needs_aes_gcm
def test_recipient_blob_is_aprenders_layout():
    blob = crypto.encrypt_for_recipient(PAYLOAD, BOB_PUBLIC, ephemeral_secret=ALICE, nonce=NONCE)
    shared = bytes.fromhex("4a5d9d5ba4ce2de1728e3bf480350f25e07e21c947d19e3376f09b3c1e161742")
    key = hkdf_by_hand(shared, b"apr-v1-encrypt")  # salt None -> 32 zero bytes
    ephemeral_public = bytes.fromhex("8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a")
    expected = ephemeral_public + BOB_PUBLIC[:8] + NONCE + reference_aes256gcm(key, NONCE, PAYLOAD)
    assert bytes(blob) == expected
    assert crypto.decrypt_as_recipient(expected, BOB) == PAYLOAD


@needs_aes_gcm
def test_recipient_blob_matches_cryptography():
    aead = pytest.importorskip("cryptography.hazmat.primitives.ciphers.aead")
    x25519 = pytest.importorskip("cryptography.hazmat.primitives.asymmetric.x25519")
    shared = x25519.X25519PrivateKey.from_private_bytes(ALICE).exchange(
        x25519.X25519PublicKey.from_public_bytes(BOB_PUBLIC))
    key = hkdf_by_hand(shared, b"apr-v1-encrypt")
    blob = crypto.encrypt_for_recipient(PAYLOAD, BOB_PUBLIC, ephemeral_secret=ALICE, nonce=NONCE)
    assert bytes(blob[52:]) == aead.AESGCM(key).encrypt(NONCE, PAYLOAD, None)


@needs_aes_gcm
def test_recipient_round_trip_and_hint():
    secret, public = crypto.generate_x25519_key()
    assert crypto.x25519_public_key(secret) == public
    blob = crypto.encrypt_for_recipient(memoryview(PAYLOAD), bytearray(public))
    assert blob[32:40] == public[:8]
    assert crypto.is_recipient(blob, secret)
    assert crypto.decrypt_as_recipient(blob, secret) == PAYLOAD


@needs_aes_gcm
def test_stranger_is_told_before_any_decryption(monkeypatch):
    _, public = crypto.generate_x25519_key()
    stranger, _ = crypto.generate_x25519_key()
    blob = crypto.encrypt_for_recipient(PAYLOAD, public)
    assert not crypto.is_recipient(blob, stranger)
    monkeypatch.setattr(crypto._aead, "open", lambda *a: pytest.fail("decryption was tried"))
    with pytest.raises(DecryptError, match="not the recipient"):
        crypto.decrypt_as_recipient(blob, stranger)


@needs_aes_gcm
def test_wrong_key_with_the_right_hint_is_decrypt_error():
    _, public = crypto.generate_x25519_key()
    stranger, stranger_public = crypto.generate_x25519_key()
    blob = bytearray(crypto.encrypt_for_recipient(PAYLOAD, public))
    blob[32:40] = stranger_public[:8]  # the hint is only a hint
    with pytest.raises(DecryptError, match="altered"):
        crypto.decrypt_as_recipient(blob, stranger)


@needs_aes_gcm
def test_every_flipped_bit_of_a_recipient_blob_is_detected():
    secret, public = crypto.generate_x25519_key()
    blob = crypto.encrypt_for_recipient(b"payload", public)
    for position, altered in _every_bit_flipped(blob):
        with pytest.raises(DecryptError):
            crypto.decrypt_as_recipient(altered, secret)
            pytest.fail(f"bit {position} flipped went unnoticed")


@needs_aes_gcm
def test_small_order_keys_are_refused():
    secret, _ = crypto.generate_x25519_key()
    with pytest.raises(ValueError, match="small-order"):
        crypto.encrypt_for_recipient(b"x", bytes(32))
    blob = bytearray(crypto.encrypt_for_recipient(b"x", crypto.x25519_public_key(secret)))
    blob[:32] = bytes(32)  # an all-zero shared secret: libsodium (and aprfast) refuse it
    with pytest.raises(DecryptError, match="ephemeral"):
        crypto.decrypt_as_recipient(blob, secret)


@needs_aes_gcm
def test_bad_private_key_length_is_decrypt_error():
    blob = crypto.encrypt_for_recipient(b"x", crypto.generate_x25519_key()[1])
    with pytest.raises(DecryptError, match="32 bytes"):
        crypto.decrypt_as_recipient(blob, bytes(31))


# --- multi-recipient mode ----------------------------------------------------------


@pytest.fixture(scope="module")
def team():
    return [crypto.generate_x25519_key() for _ in range(4)]


@pytest.fixture(scope="module")
def team_blob(team):
    return bytes(crypto.encrypt_for_recipients(PAYLOAD, [public for _, public in team]))


@needs_aes_gcm
def test_multi_recipient_layout(team, team_blob):
    assert team_blob[:4] == b"APRM" and team_blob[4:6] == b"\x01\x00"
    assert int.from_bytes(team_blob[6:8], "little") == len(team)
    assert len(team_blob) == 20 + 100 * len(team) + len(PAYLOAD) + 16
    for index, (_, public) in enumerate(team):
        wrap = team_blob[20 + 100 * index:20 + 100 * (index + 1)]
        assert wrap[32:40] == public[:8]
    assert crypto.is_multi_recipient(team_blob)


@needs_aes_gcm
def test_multi_recipient_wrap_and_payload_by_hand(team, team_blob):
    """Recompute one recipient's path with the independent primitives."""
    secret, public = team[2]
    wrap = team_blob[20 + 200:20 + 300]
    ephemeral, hint, nonce, sealed_key = wrap[:32], wrap[32:40], wrap[40:52], wrap[52:]
    shared = bytes(crypto._x25519_shared(secret, ephemeral))
    wrap_key = hkdf_by_hand(shared, b"apr-v1-multi-wrap", salt=ephemeral + public)
    header = team_blob[:20]
    aad = header + ephemeral + hint
    # CTR mode is its own inverse: "encrypting" the ciphertext gives the content key back;
    # sealing that key again must reproduce the wrap, tag included.
    content_key = reference_aes256gcm(wrap_key, nonce, sealed_key[:32], aad)[:32]
    assert reference_aes256gcm(wrap_key, nonce, content_key, aad) == sealed_key
    payload_start = 20 + 100 * len(team)
    assert reference_aes256gcm(content_key, header[8:20], PAYLOAD, team_blob[:payload_start]) == \
        team_blob[payload_start:]


@needs_aes_gcm
def test_each_recipient_decrypts(team, team_blob):
    for secret, _ in team:
        assert crypto.decrypt_multi_recipient(team_blob, secret) == PAYLOAD


@needs_aes_gcm
def test_single_recipient_multi_blob():
    secret, public = crypto.generate_x25519_key()
    blob = crypto.encrypt_for_recipients(b"", [public])
    assert crypto.decrypt_multi_recipient(blob, secret) == b""


@needs_aes_gcm
def test_stranger_is_told_it_is_not_a_recipient(team_blob, monkeypatch):
    stranger, _ = crypto.generate_x25519_key()
    monkeypatch.setattr(crypto._aead, "open", lambda *a: pytest.fail("decryption was tried"))
    with pytest.raises(DecryptError, match="not a recipient"):
        crypto.decrypt_multi_recipient(team_blob, stranger)


def _wraps(blob, count):
    return [blob[20 + 100 * i:20 + 100 * (i + 1)] for i in range(count)]


@needs_aes_gcm
def test_swapped_wraps_are_detected(team, team_blob):
    wraps = _wraps(team_blob, len(team))
    swapped = team_blob[:20] + b"".join([wraps[1], wraps[0]] + wraps[2:]) + team_blob[20 + 400:]
    for secret, _ in team:
        with pytest.raises(DecryptError, match="altered"):
            crypto.decrypt_multi_recipient(swapped, secret)


@needs_aes_gcm
def test_deleted_wrap_is_detected(team, team_blob):
    wraps = _wraps(team_blob, len(team))
    header = team_blob[:6] + (len(team) - 1).to_bytes(2, "little") + team_blob[8:20]
    shorter = header + b"".join(wraps[1:]) + team_blob[20 + 400:]
    with pytest.raises(DecryptError, match="not a recipient"):
        crypto.decrypt_multi_recipient(shorter, team[0][0])
    for secret, _ in team[1:]:
        with pytest.raises(DecryptError, match="altered"):
            crypto.decrypt_multi_recipient(shorter, secret)
    uncounted = team_blob[:20] + b"".join(wraps[1:]) + team_blob[20 + 400:]  # count kept
    for secret, _ in team[1:]:
        with pytest.raises(DecryptError):
            crypto.decrypt_multi_recipient(uncounted, secret)


@needs_aes_gcm
def test_wrap_moved_from_another_blob_is_detected(team, team_blob):
    other = bytes(crypto.encrypt_for_recipients(b"other payload", [pub for _, pub in team]))
    grafted = team_blob[:20] + _wraps(other, 1)[0] + team_blob[120:]
    with pytest.raises(DecryptError):
        crypto.decrypt_multi_recipient(grafted, team[0][0])


@needs_aes_gcm
def test_every_flipped_bit_of_a_multi_recipient_blob_is_detected():
    keys = [crypto.generate_x25519_key() for _ in range(2)]
    blob = crypto.encrypt_for_recipients(b"payload", [public for _, public in keys])
    for position, altered in _every_bit_flipped(blob):
        for secret, _ in keys:
            with pytest.raises(DecryptError):
                crypto.decrypt_multi_recipient(altered, secret)
                pytest.fail(f"bit {position} flipped went unnoticed")


@needs_aes_gcm
def test_aprender_style_readers_fail_cleanly_on_a_multi_blob(team, team_blob):
    # aprender would read the first bytes as a salt or as an ephemeral key + hint.
    with pytest.raises(DecryptError):
        crypto.decrypt_with_password(team_blob, "any password")
    with pytest.raises(DecryptError, match="decrypt_multi_recipient"):
        crypto.decrypt_as_recipient(team_blob, team[0][0])


def test_multi_recipient_argument_errors():
    _, public = crypto.generate_x25519_key()
    with pytest.raises(ValueError, match="at least one"):
        crypto.encrypt_for_recipients(b"x", [])
    with pytest.raises(ValueError, match="twice"):
        crypto.encrypt_for_recipients(b"x", [public, bytearray(public)])
    with pytest.raises(TypeError):
        crypto.encrypt_for_recipients(b"x", public)


@needs_aes_gcm
def test_unknown_version_and_flags_are_refused(team, team_blob):
    for offset, value, message in ((4, 2, "version 2"), (5, 1, "reserved flags")):
        altered = bytearray(team_blob)
        altered[offset] = value
        with pytest.raises(DecryptError, match=message):
            crypto.decrypt_multi_recipient(altered, team[0][0])


@needs_aes_gcm
def test_mode_detection():
    _, public = crypto.generate_x25519_key()
    assert not crypto.is_multi_recipient(crypto.encrypt_for_recipient(b"x" * 200, public))
    assert not crypto.is_multi_recipient(crypto.encrypt_with_password(b"x" * 200, "pw"))
    assert crypto.is_multi_recipient(crypto.encrypt_for_recipients(b"", [public]))


# --- AES-GCM backends --------------------------------------------------------------


@pytest.fixture
def aead_backend():
    previous = crypto.AEAD_BACKEND
    yield crypto._use_aead_backend
    crypto._use_aead_backend(None if previous != "unavailable" else "unavailable")


def test_cryptography_backend_is_interchangeable(aead_backend):
    pytest.importorskip("cryptography")
    secret, public = crypto.generate_x25519_key()
    if crypto._lib.crypto_aead_aes256gcm_is_available():
        aead_backend("libsodium")
        sodium_blob = crypto.encrypt_for_recipient(PAYLOAD, public)
    aead_backend("cryptography")
    assert crypto.AEAD_BACKEND == "cryptography"
    blob = crypto.encrypt_for_recipients(PAYLOAD, [public])
    assert crypto.decrypt_multi_recipient(blob, secret) == PAYLOAD
    if crypto._lib.crypto_aead_aes256gcm_is_available():
        assert crypto.decrypt_as_recipient(sodium_blob, secret) == PAYLOAD
    tampered = bytearray(blob)
    tampered[-1] ^= 1
    with pytest.raises(DecryptError):
        crypto.decrypt_multi_recipient(tampered, secret)


def test_missing_aes_gcm_is_a_clear_error(aead_backend):
    aead_backend("unavailable")
    with pytest.raises(RuntimeError, match="AES-NI.*cryptography"):
        crypto.encrypt_with_password(b"x", "pw", salt=SALT)


# --- Ed25519 -------------------------------------------------------------------------

RFC8032 = [  # (secret seed, public key, message, signature), RFC 8032 §7.1 tests 1-3
    ("9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60",
     "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a", "",
     "e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e065224901555fb8821590a33bacc61e39701cf9b46bd25bf5f0595bbe24655141438e7a100b"),
    ("4ccd089b28ff96da9db6c346ec114e0f5b8a319f35aba624da8cf6ed4fb8a6fb",
     "3d4017c3e843895a92b70aa74d1b7ebc9c982ccf2ec4968cc0cd55f12af4660c", "72",
     "92a009a9f0d4cab8720e820b5f642540a2b27b5416503f8fb3762223ebdb69da085ac1e43e15996e458f3613d0f11d8c387b2eaeb4302aeeb00d291612bb0c00"),
    ("c5aa8df43f9f837bedb7442f31dcb7b166d38535076f094b85ce3a2e0b4458f7",
     "fc51cd8e6218a1a38da47ed00230f0580816ed13ba3303ac5deb911548908025", "af82",
     "6291d657deec24024827e69c3abe01a30ce548a284743a445e3680d7db5ac3ac18ff9b538d16f290ae67f760984dc6594a7c15e9716ed28dc027beceea1ec40a"),
]


@pytest.mark.parametrize("seed, public, message, signature", RFC8032)
def test_rfc8032_vectors(seed, public, message, signature):
    seed, public, message, signature = map(bytes.fromhex, (seed, public, message, signature))
    assert crypto.public_key_of(seed) == public
    assert crypto.sign([message], seed) == signature
    crypto.verify([message], signature, public)
    crypto.verify(message, signature, public)  # a lone bytes object is one part


def test_sign_equals_libsodium_for_any_split_of_the_message():
    rng = random.Random(8032)
    for _ in range(300):
        seed = rng.randbytes(32)
        message = rng.randbytes(rng.choice([0, 1, 63, 64, 65, 200, 5000]))
        cuts = sorted(rng.randrange(len(message) + 1) for _ in range(rng.randrange(4)))
        bounds = [0] + cuts + [len(message)]
        parts = (memoryview(message)[a:b] for a, b in zip(bounds, bounds[1:]))  # a generator
        expected = nacl.signing.SigningKey(seed).sign(message).signature
        assert crypto.sign(parts, bytearray(seed)) == expected


def test_generated_keys_agree_with_libsodium():
    seed, public = crypto.generate_signing_key()
    assert nacl.signing.SigningKey(seed).verify_key.encode() == public
    nacl.signing.VerifyKey(public).verify(b"m", crypto.sign([b"m"], seed))


def _libsodium_accepts(message, signature, public):
    try:
        nacl.signing.VerifyKey(public).verify(message, signature)
        return True
    except (nacl.exceptions.BadSignatureError, nacl.exceptions.ValueError):
        return False


def _aprfast_accepts(message, signature, public):
    try:
        crypto.verify([message], signature, public)
        return True
    except SignatureError:
        return False


def _agree(message, signature, public):
    expected = _libsodium_accepts(message, signature, public)
    assert _aprfast_accepts(message, signature, public) == expected, \
        (message.hex(), signature.hex(), public.hex())
    return expected


# The eight points of order dividing 8, canonically encoded.
TORSION = [bytes.fromhex(h) for h in (
    "0100000000000000000000000000000000000000000000000000000000000000",
    "ecffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f",
    "0000000000000000000000000000000000000000000000000000000000000000",
    "0000000000000000000000000000000000000000000000000000000000000080",
    "26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc05",
    "26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc85",
    "c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac037a",
    "c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac03fa",
)]
# The same points spelled non-canonically (y >= p), plus x = 0 with the sign bit set.
NONCANONICAL_SMALL = [(P + y).to_bytes(32, "little") for y in (0, 1)] + [
    bytes.fromhex("0100000000000000000000000000000000000000000000000000000000000080"),
    bytes.fromhex("ecffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff"),
]

FUZZ_ROUNDS = int(os.environ.get("APRFAST_CRYPTO_FUZZ", "600"))


def _scalar(value):
    return nb.crypto_core_ed25519_scalar_reduce(value.ljust(64, b"\0"))


def test_verify_agrees_with_libsodium_on_random_cases():
    rng = random.Random(25519)
    accepted = rejected = 0
    for _ in range(FUZZ_ROUNDS):
        seed = rng.randbytes(32)
        public = nacl.signing.SigningKey(seed).verify_key.encode()
        message = rng.randbytes(rng.randrange(0, 90))
        signature = nacl.signing.SigningKey(seed).sign(message).signature
        cases = [(message, signature, public), (message, rng.randbytes(64), rng.randbytes(32))]
        for target in ("signature", "message", "key"):
            altered = bytearray({"signature": signature, "message": message, "key": public}[target])
            if altered:
                altered[rng.randrange(len(altered))] ^= 1 << rng.randrange(8)
            changed = {"signature": signature, "message": message, "key": public}
            changed[target] = bytes(altered)
            cases.append((changed["message"], changed["signature"], changed["key"]))
        for message_, signature_, public_ in cases:
            if _agree(message_, signature_, public_):
                accepted += 1
            else:
                rejected += 1
    assert accepted >= FUZZ_ROUNDS and rejected >= 3 * FUZZ_ROUNDS


def test_verify_agrees_with_libsodium_on_keys_with_a_torsion_component():
    """A = [a]B + T: libsodium's verifier accepts such keys when the cofactorless
    equation holds; aprfast splits A to multiply it (libsodium's scalarmult refuses)."""
    rng = random.Random(8)
    outcomes = set()
    for _ in range(FUZZ_ROUNDS):
        seed = rng.randbytes(32)
        expanded = hashlib.sha512(seed).digest()
        secret = _scalar(crypto._clamped(expanded[:32]))
        public = nb.crypto_core_ed25519_add(nacl.signing.SigningKey(seed).verify_key.encode(),
                                            rng.choice(TORSION[1:]))
        message = rng.randbytes(rng.randrange(40))
        nonce = _scalar(rng.randbytes(64))
        commitment = nb.crypto_scalarmult_ed25519_base_noclamp(nonce)
        if rng.random() < 0.5:  # R with a torsion component too
            commitment = nb.crypto_core_ed25519_add(commitment, rng.choice(TORSION))
        challenge = _scalar(hashlib.sha512(commitment + public + message).digest())
        response = nb.crypto_core_ed25519_scalar_add(
            nonce, nb.crypto_core_ed25519_scalar_mul(challenge, secret))
        outcomes.add(_agree(message, commitment + response, public))
    assert outcomes == {True, False}


def test_verify_rejects_what_libsodium_rejects_at_the_edges():
    seed = bytes(range(32))
    public = crypto.public_key_of(seed)
    message = b"edge"
    signature = crypto.sign([message], seed)
    R, S = signature[:32], int.from_bytes(signature[32:], "little")
    edge_cases = {
        "S = S + L": (R + (S + L).to_bytes(32, "little"), public),
        "S = L": (R + L.to_bytes(32, "little"), public),
        "S = 2^256 - 1": (R + b"\xff" * 32, public),
        "S = 0": (R + bytes(32), public),
        "R = identity": (TORSION[0] + signature[32:], public),
    }
    for index, point in enumerate(TORSION + NONCANONICAL_SMALL):
        edge_cases[f"small-order key #{index}"] = (signature, point)
        edge_cases[f"small-order R #{index}"] = (point + signature[32:], public)
    for y in range(2, 19):  # y >= p spellings of y = 2..18
        spelled = (P + y).to_bytes(32, "little")
        edge_cases[f"non-canonical key y=p+{y}"] = (signature, spelled)
        edge_cases[f"non-canonical R y=p+{y}"] = (spelled + signature[32:], public)
    edge_cases["key not on the curve"] = (signature, (2).to_bytes(32, "little"))
    edge_cases["key with flipped sign bit"] = (signature, public[:31] + bytes([public[31] ^ 0x80]))
    for name, (sig, key) in edge_cases.items():
        assert not _libsodium_accepts(message, sig, key), name
        with pytest.raises(SignatureError):
            crypto.verify([message], sig, key)
    assert _agree(message, signature, public)


def test_verify_error_says_why():
    seed, public = crypto.generate_signing_key()
    signature = crypto.sign([b"a"], seed)
    with pytest.raises(SignatureError, match="mismatch") as info:
        crypto.verify([b"b"], signature, public)
    assert info.value.code == "E006"
    with pytest.raises(SignatureError, match="64 bytes"):
        crypto.verify([b"a"], signature[:63], public)
    with pytest.raises(SignatureError, match="small order"):
        crypto.verify([b"a"], signature, bytes(32))


def test_sign_and_verify_stream_without_copying_the_message():
    size = 64 << 20
    message = bytearray(os.urandom(1 << 20)) * 64
    view = memoryview(message)
    parts = [view[:32], view[32:1000], view[1000:size // 2], view[size // 2:]]
    seed, public = crypto.generate_signing_key()
    tracemalloc.start()
    try:
        signature = crypto.sign(parts, seed)
        crypto.verify(iter(parts), signature, public)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, f"{peak} bytes allocated while signing a {size}-byte message"
    assert signature == nacl.signing.SigningKey(seed).sign(bytes(message)).signature


# --- key files -------------------------------------------------------------------------


def test_raw_key_files_round_trip(tmp_path):
    seed, public = crypto.generate_signing_key()
    crypto.save_key(tmp_path / "id", seed, kind="ed25519-private")
    crypto.save_key(tmp_path / "id.pub", public, kind="ed25519-public")
    assert crypto.load_key(tmp_path / "id", kind="ed25519-private") == ("ed25519-private", seed)
    assert (tmp_path / "id.pub").read_bytes() == public
    with pytest.raises(FormatError, match="pass kind="):
        crypto.load_key(tmp_path / "id")


def test_private_key_files_are_0600_and_written_atomically(tmp_path):
    if os.name != "posix":
        pytest.skip("POSIX permissions")
    target = tmp_path / "model.key"
    target.write_bytes(b"old contents")
    secret, public = crypto.generate_x25519_key()
    crypto.save_key(target, secret, kind="x25519-private")
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o600
    assert target.read_bytes() == secret
    crypto.save_key(tmp_path / "model.pub", public, kind="x25519-public")
    assert stat.S_IMODE(os.stat(tmp_path / "model.pub").st_mode) & 0o044  # readable by others
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.key", "model.pub"]


def test_key_file_errors(tmp_path):
    with pytest.raises(AprIOError):
        crypto.load_key(tmp_path / "missing")
    (tmp_path / "junk").write_bytes(b"\x00" * 40)
    with pytest.raises(FormatError, match="not a key file"):
        crypto.load_key(tmp_path / "junk")
    with pytest.raises(ValueError, match="kind"):
        crypto.save_key(tmp_path / "k", bytes(32), kind="rsa")
    with pytest.raises(ValueError, match="32 bytes"):
        crypto.save_key(tmp_path / "k", bytes(31), kind="x25519-public")


@pytest.mark.parametrize("kind", crypto.KEY_KINDS)
def test_pem_key_files_round_trip(tmp_path, kind):
    pytest.importorskip("cryptography")
    key = crypto.generate_signing_key()[0 if kind.endswith("private") else 1] \
        if kind.startswith("ed25519") else crypto.generate_x25519_key()[0 if kind.endswith("private") else 1]
    crypto.save_key(tmp_path / "k.pem", key, kind=kind, format="pem")
    assert (tmp_path / "k.pem").read_bytes().startswith(b"-----BEGIN ")
    assert crypto.load_key(tmp_path / "k.pem") == (kind, key)


def test_openssh_key_files_round_trip(tmp_path):
    pytest.importorskip("cryptography")
    seed, public = crypto.generate_signing_key()
    crypto.save_key(tmp_path / "id_ed25519", seed, kind="ed25519-private", format="openssh")
    crypto.save_key(tmp_path / "id_ed25519.pub", public, kind="ed25519-public", format="openssh")
    assert (tmp_path / "id_ed25519.pub").read_bytes().startswith(b"ssh-ed25519 ")
    assert crypto.load_key(tmp_path / "id_ed25519") == ("ed25519-private", seed)
    assert crypto.load_key(tmp_path / "id_ed25519.pub") == ("ed25519-public", public)
    with pytest.raises(FormatError, match="not an x25519-private"):
        crypto.load_key(tmp_path / "id_ed25519", kind="x25519-private")
    with pytest.raises(ValueError, match="OpenSSH has no X25519"):
        crypto.save_key(tmp_path / "x", bytes(32), kind="x25519-private", format="openssh")


def test_other_algorithms_in_pem_are_format_errors(tmp_path):
    pytest.importorskip("cryptography")
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    pem = ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption())
    (tmp_path / "ec.pem").write_bytes(pem)
    with pytest.raises(FormatError, match="not an Ed25519 or X25519"):
        crypto.load_key(tmp_path / "ec.pem")
    (tmp_path / "bad.pem").write_bytes(b"-----BEGIN PRIVATE KEY-----\nnot base64\n")
    with pytest.raises(FormatError):
        crypto.load_key(tmp_path / "bad.pem")


def test_pem_without_cryptography_names_the_extra(tmp_path, monkeypatch):
    for name in [n for n in sys.modules if n == "cryptography" or n.startswith("cryptography.")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, "cryptography", None)
    # RFC 8410's plain PEM needs no package (issue 28 item 2: apr keygen's default) ...
    crypto.save_key(tmp_path / "k.pem", bytes(32), kind="x25519-public", format="pem")
    assert crypto.load_key(tmp_path / "k.pem") == ("x25519-public", bytes(32))
    # ... OpenSSH and other PEM shapes do
    with pytest.raises(ImportError, match=r"aprfast\[keyfiles\]"):
        crypto.save_key(tmp_path / "k.ssh", bytes(32), kind="ed25519-public", format="openssh")
    (tmp_path / "k.pem").write_bytes(b"-----BEGIN PUBLIC KEY-----\n")
    with pytest.raises(ImportError, match="cryptography"):
        crypto.load_key(tmp_path / "k.pem")


# --- private inference -------------------------------------------------------------


@needs_aes_gcm
def test_private_inference_round_trip():
    model_secret, model_public = crypto.generate_x25519_key()
    user_secret, user_public = crypto.generate_x25519_key()
    metadata = crypto.inference_metadata(model_public)
    assert metadata == {"inference_pub_key": base64.b64encode(model_public).decode(),
                        "inference_protocol": "x25519-aes256gcm-v1"}
    request = crypto.encrypt_request(b"[1.0, 2.0]", crypto.inference_public_key(metadata))
    assert crypto.decrypt_request(request, model_secret) == b"[1.0, 2.0]"
    response = crypto.encrypt_response(b"3.5", user_public)
    assert crypto.decrypt_response(response, user_secret) == b"3.5"
    with pytest.raises(DecryptError, match="not the recipient"):
        crypto.decrypt_response(request, user_secret)


def test_inference_metadata_is_checked():
    with pytest.raises(FormatError, match="protocol"):
        crypto.inference_public_key({"inference_pub_key": "AAAA", "inference_protocol": "rsa"})
    with pytest.raises(FormatError, match="32"):
        crypto.inference_public_key({"inference_pub_key": "AAAA",
                                     "inference_protocol": "x25519-aes256gcm-v1"})
