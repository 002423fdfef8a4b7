"""Cryptography of the v1 container (``APRN``), byte-compatible with aprender.

aprender (crate ``aprender-core``, features ``format-encryption``/``format-signing``)
defines the first two encryption modes and the signature; aprfast reproduces their
bytes exactly.  The third mode is aprfast's own design.  docs/FORMAT.md ("v1
encryption and signing") gives the reasoning; this docstring gives the bytes.

Password mode (aprender ``save_encrypted``), the payload region of an ENCRYPTED file::

    salt(16) | nonce(12) | AES-256-GCM ciphertext || tag(16)
    key = Argon2id v0x13, m = 19456 KiB, t = 2, p = 1, no secret, no AD (password UTF-8, salt)

Recipient mode (aprender ``save_for_recipient``)::

    ephemeral X25519 public(32) | hint(8) | nonce(12) | AES-256-GCM ciphertext || tag(16)
    hint = the first 8 raw bytes of the recipient's X25519 public key (not a hash)
    key  = HKDF-SHA256(salt = none, i.e. 32 zero bytes, IKM = X25519(ephemeral, recipient),
                       info = "apr-v1-encrypt", L = 32)

Both aprender modes use an empty AAD.

Multi-recipient mode (aprfast; the spec's mode 0x02, which aprender never implemented)::

    offset        size  field
    0             4     magic "APRM"
    4             1     version, 1
    5             1     flags, 0 (reserved: readers reject other values)
    6             2     N, the number of wraps, u16 LE, 1..65535
    8             12    payload nonce
    20 + 100*i    100   wrap i: ephemeral X25519 public(32) | hint(8) | nonce(12)
                                | AES-256-GCM(content key)(32) || tag(16)
    20 + 100*N    ...   AES-256-GCM(payload) || tag(16) under the content key and the payload
                        nonce, with AAD = every byte before it, [0, 20 + 100*N)

    content key = 32 random bytes, one per blob
    wrap key    = HKDF-SHA256(salt = ephemeral public || recipient public,
                              IKM = X25519(ephemeral, recipient), info = "apr-v1-multi-wrap", L = 32)
    wrap AAD    = bytes [0, 20) || the wrap's ephemeral public || its hint

Signatures: pure Ed25519 (RFC 8032, not Ed25519ph) over the concatenation of the parts
given, 64 bytes R || S.  :func:`verify` accepts exactly what libsodium's
``crypto_sign_verify_detached`` accepts, but hashes the parts one by one.

Inputs may be any contiguous bytes-like object (bytes, bytearray, memoryview, mmap).
Encryption and decryption return a ``bytearray``: it is allocated once and filled by
libsodium in place (a ``bytes`` result would cost one more payload-sized copy), and the
caller can wipe a decrypted payload when done with it.  Every failure to decrypt raises
DecryptError (E005) and returns nothing decrypted; every failure to verify raises
SignatureError (E006).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
from typing import Iterable, Optional, Tuple, Union

from .. import limits
from ..errors import DecryptError, FormatError, LimitError, SignatureError
from .keyfiles import read_key_file, write_key_file

try:
    import nacl.bindings as _nb
    import nacl.exceptions as _nacl_exc
    from argon2.low_level import Type as _Argon2Type
    from argon2.low_level import hash_secret_raw as _argon2_hash_raw

    # PyNaCl's own cffi module: the one way to let libsodium read our buffers and write
    # into buffers we own (nacl.bindings takes and returns only immutable bytes copies).
    from nacl._sodium import ffi as _ffi
    from nacl._sodium import lib as _lib
except ImportError as _error:  # pragma: no cover - depends on the environment
    from .._optional import MissingDependencyError

    raise MissingDependencyError(
        "encryption and signing need PyNaCl >= 1.6 and argon2-cffi: pip install 'aprfast[crypto]'"
    ) from _error

__all__ = [
    "ARGON2_MEMORY_KIB", "ARGON2_TIME", "ARGON2_PARALLELISM", "KEY_SIZE", "HKDF_INFO",
    "MULTI_WRAP_INFO", "MULTI_MAGIC", "INFERENCE_PROTOCOL", "KEY_KINDS", "AEAD_BACKEND",
    "derive_password_key", "encrypt_with_password", "decrypt_with_password",
    "Sealing", "password_sealing", "recipient_sealing", "recipients_sealing",
    "encrypt_for_recipient", "is_recipient", "decrypt_as_recipient",
    "encrypt_for_recipients", "decrypt_multi_recipient", "is_multi_recipient",
    "generate_signing_key", "public_key_of", "sign", "verify",
    "generate_x25519_key", "x25519_public_key", "save_key", "load_key", "key_fingerprint",
    "encrypt_request", "decrypt_request", "encrypt_response", "decrypt_response",
    "inference_metadata", "inference_public_key",
]

BytesLike = Union[bytes, bytearray, memoryview]

# --- constants (aprender's values; docs/FORMAT.md cites where each comes from) -------

ARGON2_MEMORY_KIB, ARGON2_TIME, ARGON2_PARALLELISM, KEY_SIZE = 19456, 2, 1, 32
ARGON2_VERSION = 0x13
HKDF_INFO = b"apr-v1-encrypt"
SALT_SIZE = 16
NONCE_SIZE = 12
TAG_SIZE = 16
X25519_KEY_SIZE = 32
HINT_SIZE = 8
PASSWORD_PREFIX_SIZE = SALT_SIZE + NONCE_SIZE                          # 28
RECIPIENT_PREFIX_SIZE = X25519_KEY_SIZE + HINT_SIZE + NONCE_SIZE        # 52

# A different info string so that a wrap key can never equal a recipient-mode key.
MULTI_WRAP_INFO = b"apr-v1-multi-wrap"
MULTI_MAGIC = b"APRM"
MULTI_VERSION = 1
MULTI_HEADER_SIZE = 4 + 1 + 1 + 2 + NONCE_SIZE                          # 20
MULTI_WRAP_SIZE = RECIPIENT_PREFIX_SIZE + KEY_SIZE + TAG_SIZE            # 100
MULTI_MAX_RECIPIENTS = 0xFFFF

SIGNATURE_SIZE = 64
ED25519_KEY_SIZE = 32
INFERENCE_PROTOCOL = "x25519-aes256gcm-v1"
KEY_KINDS = ("ed25519-private", "ed25519-public", "x25519-private", "x25519-public")
KEY_FORMATS = ("raw", "pem", "openssh")
_KEYFILE_EXTRA = "aprfast[keyfiles]"

# The incremental AES-GCM path works in 4 MiB pieces (large enough that per-call costs
# vanish, small enough to stay in cache); update_into wants a block's slack of room.
_STREAM_CHUNK = 4 << 20
_BLOCK_SLACK = 15

_FIELD_PRIME = 2**255 - 19
_GROUP_ORDER = 2**252 + 27742317777372353535851937790883648493        # L

# --- input normalisation ----------------------------------------------------------


def _byte_view(data, what: str) -> memoryview:
    """A flat unsigned-byte view of any contiguous buffer, without copying it."""
    if isinstance(data, str):
        raise TypeError(f"{what} must be bytes-like, not str")
    try:
        view = memoryview(data)
    except TypeError:
        raise TypeError(f"{what} must be bytes-like, not {type(data).__name__}") from None
    if not view.c_contiguous:
        raise ValueError(f"{what} must be a contiguous buffer")
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    return view


def _fixed_bytes(data, size: int, what: str, error=ValueError) -> bytes:
    """A small fixed-size value (key, salt, nonce) as bytes, which PyNaCl requires."""
    value = bytes(_byte_view(data, what))
    if len(value) != size:
        raise error(f"{what} must be {size} bytes, got {len(value)}")
    return value


def _password_bytes(password) -> bytes:
    # aprender hashes ``password.as_bytes()``: the UTF-8 of a Rust &str.
    if isinstance(password, str):
        return password.encode("utf-8")
    return bytes(_byte_view(password, "password"))


def _wipe(buffer: bytearray) -> None:
    """Overwrite a secret we own (same-length slice assignment writes in place).

    Only bytearrays can be wiped: bytes are immutable, and argon2-cffi, hmac, os.urandom
    and nacl.bindings all hand back bytes.  So derived keys live in bytes (dropped as soon
    as used), while the X25519 shared secret, the multi-recipient content key and every
    decrypted payload live in bytearrays that libsodium writes directly."""
    buffer[:] = bytes(len(buffer))


def _zero(view: memoryview) -> None:
    """Zero a writable buffer of any size, a chunk at a time (no buffer its size)."""
    zeros = bytes(min(len(view), _STREAM_CHUNK))
    for start in range(0, len(view), len(zeros) or 1):
        end = min(start + len(zeros), len(view))
        view[start:end] = zeros[:end - start]


# --- AES-256-GCM: libsodium (AES-NI / ARMv8 crypto) or cryptography's AESGCM ---------


class _SodiumAesGcm:
    """libsodium's AES-256-GCM, reading the caller's buffers in place and writing into
    buffers we own, so a 256 MiB payload is never copied on the way in or out."""

    name = "libsodium"

    def seal_into(self, out: bytearray, offset: int, plaintext: memoryview, key, nonce: bytes,
                  aad: Optional[memoryview]) -> None:
        if len(plaintext) > _nb.crypto_aead_aes256gcm_MESSAGEBYTES_MAX:
            raise ValueError("AES-256-GCM cannot encrypt more than 64 GiB in one message")
        with _ffi.from_buffer("unsigned char[]", out, require_writable=True) as c, \
                _ffi.from_buffer("unsigned char[]", plaintext) as m, \
                _ffi.from_buffer("unsigned char[]", key) as k, _aad_pointer(aad) as ad:
            rc = _lib.crypto_aead_aes256gcm_encrypt(
                c + offset, _ffi.NULL, m, len(plaintext), ad, _length(aad), _ffi.NULL, nonce, k)
        if rc != 0:  # pragma: no cover - libsodium fails only on misuse
            raise RuntimeError("libsodium refused to encrypt")

    def seal_to(self, write, prefix: bytes, plaintext: memoryview, key, nonce: bytes, aad) -> None:
        # libsodium's AES-GCM is one-shot: the blob is built whole, then written
        write(_seal_blob_with(self, prefix, plaintext, key, nonce, aad))

    def open(self, sealed: memoryview, key, nonce: bytes, aad: Optional[memoryview]):
        """The plaintext as a bytearray, or None (nothing decrypted) if the tag fails."""
        plaintext = bytearray(len(sealed) - TAG_SIZE)
        with _ffi.from_buffer("unsigned char[]", plaintext, require_writable=True) as m, \
                _ffi.from_buffer("unsigned char[]", sealed) as c, \
                _ffi.from_buffer("unsigned char[]", key) as k, _aad_pointer(aad) as ad:
            rc = _lib.crypto_aead_aes256gcm_decrypt(
                m, _ffi.NULL, _ffi.NULL, c, len(sealed), ad, _length(aad), nonce, k)
        if rc != 0:
            _wipe(plaintext)  # libsodium already overwrote it; keep that a guarantee of ours
            return None
        return plaintext

    def open_in_place(self, sealed: memoryview, key, nonce: bytes, aad: Optional[memoryview]) -> bool:
        """Decrypt ``sealed`` (ciphertext || tag, writable) over its own first bytes, as
        libsodium allows; False (those bytes zeroed, nothing released) if the tag fails."""
        with _ffi.from_buffer("unsigned char[]", sealed, require_writable=True) as c, \
                _ffi.from_buffer("unsigned char[]", key) as k, _aad_pointer(aad) as ad:
            rc = _lib.crypto_aead_aes256gcm_decrypt(
                c, _ffi.NULL, _ffi.NULL, c, len(sealed), ad, _length(aad), nonce, k)
        if rc != 0:
            _zero(sealed[:len(sealed) - TAG_SIZE])  # libsodium leaves 0xd0 filler; zeros on every backend
        return rc == 0


class _NullPointer:
    """A stand-in for ``ffi.from_buffer`` when there is no AAD."""

    def __enter__(self):
        return _ffi.NULL

    def __exit__(self, *exc_info):
        return False


def _aad_pointer(aad):
    if aad is None or len(aad) == 0:
        return _NullPointer()
    return _ffi.from_buffer("unsigned char[]", aad)


def _length(aad) -> int:
    return 0 if aad is None else len(aad)


class _CryptographyAesGcm:
    """OpenSSL's AES-256-GCM through ``cryptography``.  Preferred when installed: OpenSSL
    3 uses VAES/VPCLMULQDQ where the CPU has them and measured 2-4x libsodium's AES-GCM
    on the development VM (docs/FORMAT.md, "AES-GCM backends"), and its incremental
    interface lets a payload be sealed straight to a file and opened in place chunk by
    chunk; the bytes are AES-GCM's either way."""

    name = "cryptography"

    def __init__(self, aesgcm_class, invalid_tag, cipher=None):
        self._aesgcm = aesgcm_class
        self._invalid_tag = invalid_tag
        self._cipher = cipher  # (Cipher, algorithms.AES, modes.GCM), for incremental use

    def seal_to(self, write, prefix: bytes, plaintext: memoryview, key, nonce: bytes, aad) -> None:
        """write(prefix), the ciphertext in chunks from one reused buffer, then the tag:
        the bytes of ``_seal_blob`` without a buffer the size of the message."""
        cipher, aes, gcm = self._cipher
        encryptor = cipher(aes(bytes(key)), gcm(nonce)).encryptor()
        if aad is not None and len(aad):
            encryptor.authenticate_additional_data(bytes(aad))
        write(prefix)
        out = bytearray(_STREAM_CHUNK + _BLOCK_SLACK)
        view = memoryview(out)
        for start in range(0, len(plaintext), _STREAM_CHUNK):
            n = encryptor.update_into(plaintext[start:start + _STREAM_CHUNK], out)
            write(view[:n])
        encryptor.finalize()
        write(encryptor.tag)

    def seal_into(self, out, offset, plaintext, key, nonce, aad) -> None:
        cipher = self._aesgcm(bytes(key))
        target = memoryview(out)[offset:offset + len(plaintext) + TAG_SIZE]
        if hasattr(cipher, "encrypt_into"):  # cryptography >= 45 writes in place
            cipher.encrypt_into(nonce, plaintext, _aad_or_none(aad), target)
        else:
            target[:] = cipher.encrypt(nonce, plaintext, _aad_or_none(aad))

    def open_in_place(self, sealed, key, nonce, aad) -> bool:
        """Decrypt over the ciphertext chunk by chunk (OpenSSL allows output == input);
        False, with every byte of it zeroed, if the tag fails at the end."""
        body = len(sealed) - TAG_SIZE
        cipher, aes, gcm = self._cipher
        decryptor = cipher(aes(bytes(key)), gcm(nonce, bytes(sealed[body:]))).decryptor()
        if aad is not None and len(aad):
            decryptor.authenticate_additional_data(bytes(aad))
        for start in range(0, body, _STREAM_CHUNK):
            n = min(_STREAM_CHUNK, body - start)
            # update_into wants room for a block's slack; the tag follows the last chunk
            decryptor.update_into(sealed[start:start + n], sealed[start:start + n + _BLOCK_SLACK])
        try:
            decryptor.finalize()
        except self._invalid_tag:
            _zero(sealed[:body])
            return False
        return True

    def open(self, sealed, key, nonce, aad):
        cipher = self._aesgcm(bytes(key))
        try:
            if hasattr(cipher, "decrypt_into"):
                plaintext = bytearray(len(sealed) - TAG_SIZE)
                try:
                    cipher.decrypt_into(nonce, sealed, _aad_or_none(aad), plaintext)
                except self._invalid_tag:
                    _wipe(plaintext)
                    raise
                return plaintext
            return bytearray(cipher.decrypt(nonce, sealed, _aad_or_none(aad)))
        except self._invalid_tag:
            return None


def _aad_or_none(aad):
    return None if aad is None or len(aad) == 0 else aad


class _MissingAesGcm:
    name = "unavailable"

    def _refuse(self, *args):
        raise RuntimeError(
            "AES-256-GCM is unavailable: libsodium implements it only on CPUs with AES-NI and "
            "PCLMUL (x86-64) or the ARMv8 crypto extensions, and this CPU has neither. Install "
            "'cryptography' to use OpenSSL's AES-GCM instead: pip install cryptography (or "
            f"'{_KEYFILE_EXTRA}', which brings it).")

    seal_into = seal_to = open = open_in_place = _refuse


def _pick_aead_backend(name: Optional[str] = None):
    """cryptography (OpenSSL) when installed, else libsodium when the CPU supports its
    AES-GCM, else a stub that explains; ``name`` forces one (tests and benchmarks)."""
    if name in (None, "cryptography"):
        backend = _cryptography_backend()
        if backend is not None:
            return backend
        if name == "cryptography":
            raise ImportError("the 'cryptography' package is not installed: pip install cryptography")
    if name in (None, "libsodium") and _lib.crypto_aead_aes256gcm_is_available() == 1:
        return _SodiumAesGcm()
    if name == "libsodium":
        raise RuntimeError("libsodium's AES-256-GCM is not available on this CPU")
    return _MissingAesGcm()


def _cryptography_backend():
    try:
        from cryptography.exceptions import InvalidTag
        from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    except ImportError:
        return None
    return _CryptographyAesGcm(AESGCM, InvalidTag, (Cipher, algorithms.AES, modes.GCM))


_aead = _pick_aead_backend()
#: Which AES-256-GCM implementation runs: "libsodium", "cryptography" or "unavailable".
AEAD_BACKEND = _aead.name


def _use_aead_backend(name: Optional[str]) -> str:
    """Switch the AES-GCM implementation (None = automatic); returns the previous name."""
    global _aead, AEAD_BACKEND
    previous = AEAD_BACKEND
    _aead = _pick_aead_backend(name) if name != "unavailable" else _MissingAesGcm()
    AEAD_BACKEND = _aead.name
    return previous


def _seal_blob(prefix: bytes, plaintext: memoryview, key, nonce: bytes, aad=None) -> bytearray:
    """prefix || ciphertext || tag, allocated once and filled in place."""
    return _seal_blob_with(_aead, prefix, plaintext, key, nonce, aad)


def _seal_blob_with(backend, prefix: bytes, plaintext: memoryview, key, nonce: bytes, aad=None) -> bytearray:
    blob = bytearray(len(prefix) + len(plaintext) + TAG_SIZE)
    blob[:len(prefix)] = prefix
    backend.seal_into(blob, len(prefix), plaintext, key, nonce, aad)
    return blob


class Sealing:
    """One encryption, decided before the message is seen: the prefix a mode writes
    (salt and nonce, or ephemeral key, hint and nonce, or the recipients' wraps), the
    key and the nonce.  ``seal(message)`` gives the whole blob; ``seal_to(write,
    message)`` gives the same bytes to ``write`` in pieces, so a large payload goes to a
    file without a second buffer its size (with the cryptography backend; libsodium's
    AES-GCM is one-shot and builds the blob first).  Use once: a nonce must never seal
    two messages.  ``wipe()`` (or the context manager) clears the key.  Made by
    :func:`password_sealing`, :func:`recipient_sealing` and :func:`recipients_sealing`.

    Args:
        prefix: The bytes written before the ciphertext.
        key: The 32-byte AES-256-GCM key (copied; :meth:`wipe` clears the copy).
        nonce: The 12-byte nonce.
        aad: Associated data authenticated with the message (``None``: none).

    Examples:
        >>> from aprfast import crypto
        >>> secret, public = crypto.generate_x25519_key()
        >>> with crypto.recipient_sealing(public) as sealing:
        ...     size, blob = sealing.size(5), sealing.seal(b"hello")
        >>> size == len(blob), crypto.decrypt_as_recipient(blob, secret)
        (True, bytearray(b'hello'))
    """

    def __init__(self, prefix: bytes, key, nonce: bytes, aad=None):
        self.prefix, self._key, self._nonce, self._aad = prefix, bytearray(key), nonce, aad
        self._used = False

    def size(self, message_size: int) -> int:
        """The blob's size for a message of ``message_size`` bytes.

        Args:
            message_size: The plaintext's length.

        Returns:
            ``len(prefix) + message_size + 16`` (the tag).

        Examples:
            >>> from aprfast import crypto
            >>> crypto.recipient_sealing(crypto.generate_x25519_key()[1]).size(100)
            168
        """
        return len(self.prefix) + message_size + TAG_SIZE

    def seal(self, plaintext: BytesLike) -> bytearray:
        """The whole blob: prefix || ciphertext || tag.

        Args:
            plaintext: A bytes-like message.

        Returns:
            A bytearray of :meth:`size` bytes.

        Raises:
            ValueError: This Sealing has already sealed a message.

        Examples:
            >>> from aprfast import crypto
            >>> sealing = crypto.recipient_sealing(crypto.generate_x25519_key()[1])
            >>> len(sealing.seal(b"abc"))
            71
            >>> sealing.seal(b"abc")
            Traceback (most recent call last):
            ...
            ValueError: this Sealing has already sealed a message (its nonce cannot be reused)
        """
        message = self._take(plaintext)
        return _seal_blob(self.prefix, message, self._key, self._nonce, self._aad)

    def seal_to(self, write, plaintext: BytesLike) -> None:
        """The bytes :meth:`seal` returns, handed to ``write`` in pieces.

        Args:
            write: A callable taking bytes-like pieces (``file.write``).
            plaintext: A bytes-like message.

        Raises:
            ValueError: This Sealing has already sealed a message.

        Examples:
            >>> import io
            >>> from aprfast import crypto
            >>> secret, public = crypto.generate_x25519_key()
            >>> out = io.BytesIO()
            >>> crypto.recipient_sealing(public).seal_to(out.write, b"streamed")
            >>> crypto.decrypt_as_recipient(out.getvalue(), secret)
            bytearray(b'streamed')
        """
        message = self._take(plaintext)
        _aead.seal_to(write, self.prefix, message, self._key, self._nonce, self._aad)

    def _take(self, plaintext) -> memoryview:
        if self._used:
            raise ValueError("this Sealing has already sealed a message (its nonce cannot be reused)")
        self._used = True
        return _byte_view(plaintext, "plaintext")

    def wipe(self) -> None:
        """Overwrite the key with zeros (the context manager does it on exit).

        Examples:
            >>> from aprfast import crypto
            >>> sealing = crypto.recipient_sealing(crypto.generate_x25519_key()[1])
            >>> sealing.wipe()
        """
        _wipe(self._key)

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.wipe()
        return False


# --- key derivation --------------------------------------------------------------


def derive_password_key(password: Union[str, BytesLike], salt: BytesLike) -> bytes:
    """The 32-byte AES key aprender derives: Argon2id v0x13, m=19456 KiB, t=2, p=1.

    These are the defaults of the RustCrypto ``argon2`` 0.5 crate (``Argon2::default()``),
    which aprender relies on without naming them; no secret and no associated data.
    About 19 MiB and tens of milliseconds per call.  docs/FORMAT.md §10 ("Password mode").

    Args:
        password: A str (UTF-8) or bytes.
        salt: At least 8 bytes (v1 files store 16).

    Returns:
        32 bytes.

    Raises:
        ValueError: A salt shorter than 8 bytes.
        TypeError: A password that is neither str nor bytes-like.

    Examples:
        >>> from aprfast import crypto
        >>> crypto.derive_password_key("correct horse", bytes(16)).hex()[:16]
        'fdb0581d0e6c28a5'
        >>> len(crypto.derive_password_key(b"pw", b"salt1234"))
        32
    """
    salt_bytes = bytes(_byte_view(salt, "salt"))
    if len(salt_bytes) < 8:
        raise ValueError(f"Argon2 needs a salt of at least 8 bytes, got {len(salt_bytes)}")
    return _argon2_hash_raw(
        secret=_password_bytes(password), salt=salt_bytes, time_cost=ARGON2_TIME,
        memory_cost=ARGON2_MEMORY_KIB, parallelism=ARGON2_PARALLELISM, hash_len=KEY_SIZE,
        type=_Argon2Type.ID, version=ARGON2_VERSION)


def _hkdf_sha256(ikm, info: bytes, *, salt: Optional[bytes] = None, length: int = KEY_SIZE) -> bytes:
    """RFC 5869 HKDF with SHA-256; no salt means HashLen zero bytes, as the hkdf crate does."""
    if length > 255 * 32:
        raise ValueError("HKDF-SHA256 yields at most 8160 bytes")
    prk = hmac.new(salt if salt else bytes(32), ikm, hashlib.sha256).digest()
    output, block = b"", b""
    counter = 1
    while len(output) < length:
        block = hmac.new(prk, block + info + bytes([counter]), hashlib.sha256).digest()
        output += block
        counter += 1
    return output[:length]


# --- X25519 ----------------------------------------------------------------------


def generate_x25519_key() -> Tuple[bytes, bytes]:
    """A fresh X25519 key pair as (secret32, public32).

    Also exported as :func:`aprfast.v1.generate_x25519_key`.  The public key is what
    others encrypt to (``recipients=``); the secret opens (``private_key=``).

    Returns:
        ``(secret, public)``, 32 bytes each.

    Examples:
        >>> from aprfast import crypto
        >>> secret, public = crypto.generate_x25519_key()
        >>> crypto.x25519_public_key(secret) == public
        True
    """
    public, secret = _nb.crypto_box_keypair()
    return secret, public


def x25519_public_key(secret32: BytesLike) -> bytes:
    """The X25519 public key of a 32-byte secret (clamped as RFC 7748 says).

    Args:
        secret32: The X25519 secret key, 32 bytes.

    Returns:
        32 bytes.

    Raises:
        ValueError: A secret that is not 32 bytes.

    Examples:
        >>> from aprfast import crypto
        >>> crypto.x25519_public_key(bytes(32)).hex()[:16]
        '2fe57da347cd6243'
    """
    return _nb.crypto_scalarmult_base(_fixed_bytes(secret32, X25519_KEY_SIZE, "X25519 secret key"))


def _x25519_shared(secret: bytes, public: bytes) -> Optional[bytearray]:
    """X25519(secret, public) in a buffer we wipe after use, or None when the public key
    has small order (an all-zero result), which libsodium refuses to return."""
    shared = bytearray(X25519_KEY_SIZE)
    with _ffi.from_buffer("unsigned char[]", shared, require_writable=True) as out:
        rc = _lib.crypto_scalarmult(out, secret, public)
    if rc != 0:
        _wipe(shared)
        return None
    return shared


def _is_canonical_x25519_public(public) -> bool:
    # X25519 ignores bit 255 and reduces u mod p, so every key has two to four encodings.
    # Honest writers (libsodium, x25519-dalek) emit only u < p; accepting just that one
    # gives every blob exactly one accepted encoding, so any flipped bit is detected.
    return int.from_bytes(bytes(public), "little") < _FIELD_PRIME


def _random_secret(size: int) -> bytearray:
    """Random bytes written by libsodium straight into a buffer we can wipe later."""
    secret = bytearray(size)
    with _ffi.from_buffer("unsigned char[]", secret, require_writable=True) as out:
        _lib.randombytes(out, size)
    return secret


def _shared_to_key(shared: bytearray, info: bytes, salt: Optional[bytes] = None) -> bytes:
    """HKDF the shared secret into an AES key, then wipe the shared secret."""
    try:
        return _hkdf_sha256(shared, info, salt=salt)
    finally:
        _wipe(shared)


def _fresh_or_given(value, size: int, what: str) -> bytes:
    return os.urandom(size) if value is None else _fixed_bytes(value, size, what)


def _require_length(view: memoryview, minimum: int, what: str) -> None:
    if len(view) < minimum:
        raise DecryptError(f"{what} is {len(view)} bytes, shorter than its {minimum}-byte minimum")


# --- password mode (aprender save_encrypted / load_encrypted) ---------------------


def encrypt_with_password(plaintext: BytesLike, password: Union[str, BytesLike], *,
                          salt: Optional[BytesLike] = None,
                          nonce: Optional[BytesLike] = None) -> bytearray:
    """aprender's password block: salt(16) || nonce(12) || ciphertext || tag(16).

    Salt and nonce are random unless given (give them only to reproduce test vectors:
    a repeated nonce under one key breaks AES-GCM).  Returns a bytearray, allocated once
    and filled in place, so a large payload is not copied again.  docs/FORMAT.md §10
    ("Password mode").

    Args:
        plaintext: A bytes-like message.
        password: A str (UTF-8) or bytes.
        salt: 16 bytes (default: random).
        nonce: 12 bytes (default: random).

    Returns:
        A bytearray: 28-byte prefix, ciphertext, 16-byte tag.

    Raises:
        ValueError: A salt or nonce of the wrong size.

    Examples:
        >>> from aprfast import crypto
        >>> blob = crypto.encrypt_with_password(b"weights", "pw")
        >>> len(blob), crypto.decrypt_with_password(blob, "pw")
        (51, bytearray(b'weights'))
    """
    message = _byte_view(plaintext, "plaintext")
    with password_sealing(password, salt=salt, nonce=nonce) as sealing:
        return sealing.seal(message)


def password_sealing(password: Union[str, BytesLike], *, salt: Optional[BytesLike] = None,
                     nonce: Optional[BytesLike] = None) -> Sealing:
    """The :class:`Sealing` of :func:`encrypt_with_password` (Argon2id runs now).

    Args:
        password: A str (UTF-8) or bytes.
        salt: 16 bytes (default: random).
        nonce: 12 bytes (default: random).

    Returns:
        A :class:`Sealing` with the 28-byte prefix salt || nonce.

    Raises:
        ValueError: A salt or nonce of the wrong size.

    Examples:
        >>> from aprfast import crypto
        >>> with crypto.password_sealing("pw") as sealing:
        ...     blob = sealing.seal(b"abc")
        >>> crypto.decrypt_with_password(blob, "pw")
        bytearray(b'abc')
    """
    salt_bytes = _fresh_or_given(salt, SALT_SIZE, "salt")
    nonce_bytes = _fresh_or_given(nonce, NONCE_SIZE, "nonce")
    key = derive_password_key(password, salt_bytes)
    return Sealing(salt_bytes + nonce_bytes, key, nonce_bytes)


def decrypt_with_password(blob: BytesLike, password: Union[str, BytesLike]) -> bytearray:
    """The plaintext of a password block; DecryptError (nothing decrypted) on a wrong
    password or any altered byte.

    Args:
        blob: The block :func:`encrypt_with_password` made.
        password: A str (UTF-8) or bytes.

    Returns:
        A bytearray (the caller may wipe it).

    Raises:
        DecryptError: A wrong password, an altered byte, or a blob too short.

    Examples:
        >>> from aprfast import crypto
        >>> crypto.decrypt_with_password(crypto.encrypt_with_password(b"m", "pw"), "wrong")
        Traceback (most recent call last):
        ...
        aprfast.errors.DecryptError: [E005] wrong password, or the encrypted payload was altered ...
    """
    view = _byte_view(blob, "encrypted blob")
    _require_length(view, PASSWORD_PREFIX_SIZE + TAG_SIZE, "a password-encrypted blob")
    key = derive_password_key(password, view[:SALT_SIZE])
    nonce = bytes(view[SALT_SIZE:PASSWORD_PREFIX_SIZE])
    plaintext = _aead.open(view[PASSWORD_PREFIX_SIZE:], key, nonce, None)
    if plaintext is None:
        raise DecryptError("wrong password, or the encrypted payload was altered "
                           "(AES-256-GCM authentication failed)")
    return plaintext


def decrypt_with_password_in_place(blob, password: Union[str, BytesLike]) -> memoryview:
    """Like :func:`decrypt_with_password`, but the plaintext replaces the ciphertext in
    ``blob`` (a writable buffer, e.g. a private copy-on-write map of the file) and is
    returned as a view of it: no second buffer the size of the payload."""
    view = memoryview(blob)
    if view.readonly:
        raise ValueError("decrypt_with_password_in_place needs a writable buffer")
    view = view.cast("B") if view.format != "B" or view.ndim != 1 else view
    _require_length(view, PASSWORD_PREFIX_SIZE + TAG_SIZE, "a password-encrypted blob")
    return open_password_blob_in_place(view[:PASSWORD_PREFIX_SIZE], view[PASSWORD_PREFIX_SIZE:], password)


def open_password_blob_in_place(prefix: BytesLike, sealed, password: Union[str, BytesLike], *,
                                key: Optional[bytes] = None) -> memoryview:
    """:func:`decrypt_with_password_in_place` of a password block held in two pieces:
    its ``prefix`` (salt and nonce, 28 bytes) and ``sealed`` (ciphertext || tag, a
    writable buffer), so a reader can put the ciphertext where the plaintext is to stay
    (aprfast.v1 reads it into the bytearray it returns).  The plaintext replaces the
    first bytes of ``sealed`` and is returned as a view of them; DecryptError (those
    bytes zeroed) on a wrong password or any altered byte.  ``key``: the
    :func:`derive_password_key` of ``password`` and this salt, when the caller has
    already derived it (before allocating the buffer, so Argon2's 19 MiB and the
    payload are never resident together)."""
    head = _byte_view(prefix, "salt and nonce")
    if len(head) != PASSWORD_PREFIX_SIZE:
        raise ValueError(f"the salt and nonce are {PASSWORD_PREFIX_SIZE} bytes, got {len(head)}")
    view = memoryview(sealed)
    if view.readonly:
        raise ValueError("open_password_blob_in_place needs a writable buffer")
    view = view.cast("B") if view.format != "B" or view.ndim != 1 else view
    _require_length(view, TAG_SIZE, "the ciphertext and tag")
    if key is None:
        key = derive_password_key(password, head[:SALT_SIZE])
    nonce = bytes(head[SALT_SIZE:])
    if not _aead.open_in_place(view, key, nonce, None):
        raise DecryptError("wrong password, or the encrypted payload was altered "
                           "(AES-256-GCM authentication failed)")
    return view[:len(view) - TAG_SIZE]


# --- recipient mode (aprender save_for_recipient / load_as_recipient) -------------


def encrypt_for_recipient(plaintext: BytesLike, recipient_public: BytesLike, *,
                          ephemeral_secret: Optional[BytesLike] = None,
                          nonce: Optional[BytesLike] = None) -> bytearray:
    """aprender's recipient block: ephemeral public(32) || hint(8) || nonce(12) ||
    ciphertext || tag(16), readable only with the recipient's X25519 secret key.

    ``ephemeral_secret`` and ``nonce`` are random unless given (test vectors only).
    docs/FORMAT.md §10 ("Recipient mode").

    Args:
        plaintext: A bytes-like message.
        recipient_public: The recipient's X25519 public key (32 bytes).
        ephemeral_secret: 32 bytes (default: random).
        nonce: 12 bytes (default: random).

    Returns:
        A bytearray: 52-byte prefix, ciphertext, 16-byte tag.

    Raises:
        ValueError: A key or nonce of the wrong size, or a small-order public key.

    Examples:
        >>> from aprfast import crypto
        >>> secret, public = crypto.generate_x25519_key()
        >>> blob = crypto.encrypt_for_recipient(b"weights", public)
        >>> len(blob), crypto.decrypt_as_recipient(blob, secret)
        (75, bytearray(b'weights'))
    """
    message = _byte_view(plaintext, "plaintext")
    with recipient_sealing(recipient_public, ephemeral_secret=ephemeral_secret, nonce=nonce) as sealing:
        return sealing.seal(message)


def recipient_sealing(recipient_public: BytesLike, *, ephemeral_secret: Optional[BytesLike] = None,
                      nonce: Optional[BytesLike] = None) -> Sealing:
    """The :class:`Sealing` of :func:`encrypt_for_recipient`.

    Args:
        recipient_public: The recipient's X25519 public key (32 bytes).
        ephemeral_secret: 32 bytes (default: random).
        nonce: 12 bytes (default: random).

    Returns:
        A :class:`Sealing` with the 52-byte prefix.

    Raises:
        ValueError: A key or nonce of the wrong size, or a small-order public key.

    Examples:
        >>> from aprfast import crypto
        >>> secret, public = crypto.generate_x25519_key()
        >>> with crypto.recipient_sealing(public) as sealing:
        ...     blob = sealing.seal(b"abc")
        >>> crypto.decrypt_as_recipient(blob, secret)
        bytearray(b'abc')
    """
    recipient = _fixed_bytes(recipient_public, X25519_KEY_SIZE, "recipient public key")
    ephemeral = _fresh_or_given(ephemeral_secret, X25519_KEY_SIZE, "ephemeral secret")
    nonce_bytes = _fresh_or_given(nonce, NONCE_SIZE, "nonce")
    shared = _x25519_shared(ephemeral, recipient)
    if shared is None:
        raise ValueError("the recipient public key is a small-order point: no secret could "
                         "be agreed with it")
    key = _shared_to_key(shared, HKDF_INFO)
    prefix = _nb.crypto_scalarmult_base(ephemeral) + recipient[:HINT_SIZE] + nonce_bytes
    return Sealing(prefix, key, nonce_bytes)


def is_recipient(blob: BytesLike, private_key: BytesLike) -> bool:
    """Whether a recipient block names this key (compares the 8-byte hint only).

    Args:
        blob: A recipient block.
        private_key: An X25519 private key (32 bytes).

    Returns:
        True when the block's hint is this key's.

    Raises:
        DecryptError: A private key that is not 32 bytes.

    Examples:
        >>> from aprfast import crypto
        >>> secret, public = crypto.generate_x25519_key()
        >>> blob = crypto.encrypt_for_recipient(b"m", public)
        >>> crypto.is_recipient(blob, secret), crypto.is_recipient(blob, crypto.generate_x25519_key()[0])
        (True, False)
    """
    view = _byte_view(blob, "encrypted blob")
    public = _public_of_private(private_key)
    return len(view) >= X25519_KEY_SIZE + HINT_SIZE and \
        view[X25519_KEY_SIZE:X25519_KEY_SIZE + HINT_SIZE] == public[:HINT_SIZE]


def decrypt_as_recipient(blob: BytesLike, private_key: BytesLike) -> bytearray:
    """The plaintext of a recipient block.  A key the block is not addressed to gets
    DecryptError("not the recipient ...") before anything is decrypted.

    Args:
        blob: The block :func:`encrypt_for_recipient` made.
        private_key: The recipient's X25519 private key (32 bytes).

    Returns:
        A bytearray (the caller may wipe it).

    Raises:
        DecryptError: Another recipient's block, an altered byte, a blob too short, or
            a key that is not 32 bytes.

    Examples:
        >>> from aprfast import crypto
        >>> blob = crypto.encrypt_for_recipient(b"m", crypto.generate_x25519_key()[1])
        >>> crypto.decrypt_as_recipient(blob, crypto.generate_x25519_key()[0])
        Traceback (most recent call last):
        ...
        aprfast.errors.DecryptError: [E005] not the recipient: ...
    """
    view = _byte_view(blob, "encrypted blob")
    secret = _fixed_bytes(private_key, X25519_KEY_SIZE, "X25519 private key", DecryptError)
    _require_length(view, RECIPIENT_PREFIX_SIZE + TAG_SIZE, "a recipient-encrypted blob")
    public = _nb.crypto_scalarmult_base(secret)
    hint = bytes(view[X25519_KEY_SIZE:X25519_KEY_SIZE + HINT_SIZE])
    if hint != public[:HINT_SIZE]:
        raise DecryptError(_not_the_recipient(view, hint, public))
    ephemeral = bytes(view[:X25519_KEY_SIZE])
    shared = _x25519_shared(secret, ephemeral) if _is_canonical_x25519_public(ephemeral) else None
    if shared is None:
        raise DecryptError("the blob's ephemeral key is not a valid X25519 public key "
                           "(non-canonical or small order): the blob was altered")
    key = _shared_to_key(shared, HKDF_INFO)
    nonce = bytes(view[X25519_KEY_SIZE + HINT_SIZE:RECIPIENT_PREFIX_SIZE])
    plaintext = _aead.open(view[RECIPIENT_PREFIX_SIZE:], key, nonce, None)
    if plaintext is None:
        raise DecryptError("the blob names this key but does not decrypt with it: the "
                           "payload was altered (AES-256-GCM authentication failed)")
    return plaintext


def _not_the_recipient(view: memoryview, hint: bytes, public: bytes) -> str:
    message = (f"not the recipient: the blob is encrypted for the X25519 key starting "
               f"{hint.hex()}, and this private key's public key starts "
               f"{public[:HINT_SIZE].hex()}")
    if is_multi_recipient(view):
        message += " (the blob is a multi-recipient blob: use decrypt_multi_recipient)"
    return message


def _public_of_private(private_key) -> bytes:
    secret = _fixed_bytes(private_key, X25519_KEY_SIZE, "X25519 private key", DecryptError)
    return _nb.crypto_scalarmult_base(secret)


# --- multi-recipient mode (aprfast; see the module docstring for the layout) -------


def encrypt_for_recipients(plaintext: BytesLike, recipients: Iterable[BytesLike]) -> bytearray:
    """One payload readable by each of several X25519 keys: the payload is encrypted once
    under a random content key, and the content key once per recipient.
    docs/FORMAT.md §10 ("Multi-recipient mode").

    Args:
        plaintext: A bytes-like message.
        recipients: X25519 public keys (32 bytes each), distinct.

    Returns:
        A bytearray: 20-byte header, 100 bytes per recipient, ciphertext, 16-byte tag.

    Raises:
        ValueError: No recipient, a key listed twice or of the wrong size, a small-order
            key, or more recipients than :data:`aprfast.limits.MAX_RECIPIENTS`.
        TypeError: ``recipients`` is one bytes object instead of a list.

    Examples:
        >>> from aprfast import crypto
        >>> (alice, alice_pub), (bob, bob_pub) = crypto.generate_x25519_key(), crypto.generate_x25519_key()
        >>> blob = crypto.encrypt_for_recipients(b"weights", [alice_pub, bob_pub])
        >>> len(blob), crypto.decrypt_multi_recipient(blob, bob)
        (243, bytearray(b'weights'))
    """
    message = _byte_view(plaintext, "plaintext")
    with recipients_sealing(recipients) as sealing:
        return sealing.seal(message)


def recipients_sealing(recipients: Iterable[BytesLike]) -> Sealing:
    """The :class:`Sealing` of :func:`encrypt_for_recipients` (the wraps are made now).

    Args:
        recipients: X25519 public keys (32 bytes each), distinct.

    Returns:
        A :class:`Sealing` whose prefix is the header and the wraps.

    Raises:
        ValueError: As :func:`encrypt_for_recipients`.
        TypeError: ``recipients`` is one bytes object instead of a list.

    Examples:
        >>> from aprfast import crypto
        >>> secret, public = crypto.generate_x25519_key()
        >>> with crypto.recipients_sealing([public]) as sealing:
        ...     blob = sealing.seal(b"abc")
        >>> crypto.decrypt_multi_recipient(blob, secret)
        bytearray(b'abc')
    """
    publics = _distinct_recipients(recipients)
    payload_nonce = os.urandom(NONCE_SIZE)
    header = (MULTI_MAGIC + bytes([MULTI_VERSION, 0]) + len(publics).to_bytes(2, "little")
              + payload_nonce)
    content_key = _random_secret(KEY_SIZE)
    try:
        prefix = header + b"".join(_wrap(content_key, header, public) for public in publics)
        # The whole prefix is the payload's AAD: no wrap can be dropped, reordered or
        # swapped for another without the payload failing to authenticate.
        return Sealing(prefix, content_key, payload_nonce, aad=memoryview(prefix))
    finally:
        _wipe(content_key)  # the Sealing holds its own copy, wiped by its wipe()


def _distinct_recipients(recipients) -> list:
    if isinstance(recipients, (bytes, bytearray, memoryview, str)):
        raise TypeError("recipients must be a list of 32-byte X25519 public keys")
    publics = [_fixed_bytes(key, X25519_KEY_SIZE, f"recipient public key #{index}")
               for index, key in enumerate(recipients)]
    if not publics:
        raise ValueError("encrypt_for_recipients needs at least one recipient")
    if len(publics) > MULTI_MAX_RECIPIENTS:
        raise ValueError(f"at most {MULTI_MAX_RECIPIENTS} recipients fit in one blob, "
                         f"got {len(publics)}")
    if len(publics) > limits.MAX_RECIPIENTS:
        raise ValueError(f"{len(publics)} recipients: readers refuse more than {limits.MAX_RECIPIENTS} by "
                         "default (aprfast.limits.MAX_RECIPIENTS; raise it for writer and readers alike)")
    if len(set(publics)) != len(publics):
        raise ValueError("a recipient public key is listed twice")
    return publics


def _wrap(content_key: bytearray, header: bytes, recipient: bytes) -> bytes:
    """ephemeral public || hint || nonce || AES-GCM(content key) under a fresh X25519 key."""
    ephemeral = os.urandom(X25519_KEY_SIZE)
    ephemeral_public = _nb.crypto_scalarmult_base(ephemeral)
    shared = _x25519_shared(ephemeral, recipient)
    if shared is None:
        raise ValueError(f"recipient public key {recipient.hex()} is a small-order point: "
                         "no secret could be agreed with it")
    key = _shared_to_key(shared, MULTI_WRAP_INFO, salt=ephemeral_public + recipient)
    nonce = os.urandom(NONCE_SIZE)
    hint = recipient[:HINT_SIZE]
    aad = memoryview(header + ephemeral_public + hint)
    return bytes(_seal_blob(ephemeral_public + hint + nonce, memoryview(content_key), key, nonce, aad))


def is_multi_recipient(blob: BytesLike) -> bool:
    """Whether the bytes start like a multi-recipient blob (magic "APRM", room for one wrap).

    Args:
        blob: Any bytes-like object.

    Returns:
        True for a multi-recipient blob.

    Examples:
        >>> from aprfast import crypto
        >>> public = crypto.generate_x25519_key()[1]
        >>> crypto.is_multi_recipient(crypto.encrypt_for_recipients(b"m", [public]))
        True
        >>> crypto.is_multi_recipient(crypto.encrypt_for_recipient(b"m", public))
        False
    """
    view = _byte_view(blob, "encrypted blob")
    return (len(view) >= MULTI_HEADER_SIZE + MULTI_WRAP_SIZE + TAG_SIZE
            and view[:4] == MULTI_MAGIC)


def decrypt_multi_recipient(blob: BytesLike, private_key: BytesLike, *, max_recipients: Optional[int] = None,
                            max_wraps_per_key: Optional[int] = None) -> bytearray:
    """The plaintext of a multi-recipient blob.  A key with no wrap in the blob gets
    DecryptError("not a recipient ...") before anything is decrypted.

    The work is bounded before any key agreement: a blob declaring more than
    ``max_recipients`` wraps (default :data:`aprfast.limits.MAX_RECIPIENTS`), or with
    more than ``max_wraps_per_key`` wraps carrying this key's hint (default
    :data:`aprfast.limits.MAX_WRAPS_PER_KEY`), is refused with LimitError.

    Args:
        blob: The blob :func:`encrypt_for_recipients` made.
        private_key: A recipient's X25519 private key (32 bytes).
        max_recipients: Most wraps a blob may declare.
        max_wraps_per_key: Most wraps that may carry this key's hint.

    Returns:
        A bytearray (the caller may wipe it).

    Raises:
        DecryptError: No wrap for this key, an altered byte, a malformed blob, or a key
            that is not 32 bytes.
        LimitError: More wraps than the limits allow.

    Examples:
        >>> from aprfast import crypto
        >>> blob = crypto.encrypt_for_recipients(b"m", [crypto.generate_x25519_key()[1]])
        >>> crypto.decrypt_multi_recipient(blob, crypto.generate_x25519_key()[0])
        Traceback (most recent call last):
        ...
        aprfast.errors.DecryptError: [E005] not a recipient: none of the blob's 1 wraps is addressed ...
    """
    view = _byte_view(blob, "encrypted blob")
    secret = _fixed_bytes(private_key, X25519_KEY_SIZE, "X25519 private key", DecryptError)
    count = _multi_recipient_count(view)
    _check_recipient_count(count, max_recipients)
    public = _nb.crypto_scalarmult_base(secret)
    mine = [index for index in range(count) if _wrap_hint(view, index) == public[:HINT_SIZE]]
    if not mine:
        raise DecryptError(f"not a recipient: none of the blob's {count} wraps is addressed "
                           f"to the X25519 key starting {public[:HINT_SIZE].hex()}")
    _check_wraps_per_key(len(mine), max_wraps_per_key)
    content_key = _first_unwrapped(view, mine, secret, public)
    payload_start = MULTI_HEADER_SIZE + count * MULTI_WRAP_SIZE
    try:
        plaintext = _aead.open(view[payload_start:], content_key, bytes(view[8:MULTI_HEADER_SIZE]),
                               view[:payload_start])
    finally:
        _wipe(content_key)
    if plaintext is None:
        raise DecryptError("the content key opened but the payload does not authenticate: "
                           "the payload, the header or the list of wraps was altered")
    return plaintext


def _check_recipient_count(count: int, limit: Optional[int]) -> None:
    limit = limits.MAX_RECIPIENTS if limit is None else limit
    if count > limit:
        raise LimitError(f"the multi-recipient payload declares {count} wraps, above the limit of {limit} "
                         "(aprfast.limits.MAX_RECIPIENTS)")


def _check_wraps_per_key(matching: int, limit: Optional[int]) -> None:
    limit = limits.MAX_WRAPS_PER_KEY if limit is None else limit
    if matching > limit:
        raise LimitError(f"{matching} wraps carry this key's 8-byte hint; at most {limit} are tried "
                         "(aprfast.limits.MAX_WRAPS_PER_KEY): honest files have one")


def _multi_recipient_count(view: memoryview) -> int:
    """Check the fixed header and the length; the number of wraps."""
    if len(view) < MULTI_HEADER_SIZE or view[:4] != MULTI_MAGIC:
        raise DecryptError("not a multi-recipient blob: it does not start with the magic "
                           f"{MULTI_MAGIC!r}")
    if view[4] != MULTI_VERSION:
        raise DecryptError(f"multi-recipient blob version {view[4]} is not supported "
                           f"(this build reads version {MULTI_VERSION})")
    if view[5] != 0:
        raise DecryptError(f"multi-recipient blob has reserved flags {view[5]:#04x}; they must be 0")
    count = int.from_bytes(view[6:8], "little")
    if count == 0:
        raise DecryptError("multi-recipient blob lists no recipients")
    _require_length(view, MULTI_HEADER_SIZE + count * MULTI_WRAP_SIZE + TAG_SIZE,
                    f"a multi-recipient blob with {count} wraps")
    return count


def _wrap_hint(view: memoryview, index: int) -> bytes:
    start = MULTI_HEADER_SIZE + index * MULTI_WRAP_SIZE + X25519_KEY_SIZE
    return bytes(view[start:start + HINT_SIZE])


def _first_unwrapped(view: memoryview, indices, secret: bytes, public: bytes) -> bytearray:
    """The content key from the first of our wraps that opens (two keys may share a hint)."""
    header = view[:MULTI_HEADER_SIZE]
    for index in indices:
        content_key = _unwrap(view[MULTI_HEADER_SIZE + index * MULTI_WRAP_SIZE:], header,
                              secret, public)
        if content_key is not None:
            return content_key
    raise DecryptError("the blob has a wrap addressed to this key but it does not open: "
                       "the blob was altered, or another key shares this key's 8-byte hint")


def _unwrap(wrap: memoryview, header: memoryview, secret: bytes, public: bytes):
    ephemeral = bytes(wrap[:X25519_KEY_SIZE])
    if not _is_canonical_x25519_public(ephemeral):
        return None
    shared = _x25519_shared(secret, ephemeral)
    if shared is None:
        return None
    key = _shared_to_key(shared, MULTI_WRAP_INFO, salt=ephemeral + public)
    nonce = bytes(wrap[X25519_KEY_SIZE + HINT_SIZE:RECIPIENT_PREFIX_SIZE])
    aad = memoryview(bytes(header) + bytes(wrap[:X25519_KEY_SIZE + HINT_SIZE]))
    return _aead.open(wrap[RECIPIENT_PREFIX_SIZE:MULTI_WRAP_SIZE], key, nonce, aad)


# --- Ed25519 (RFC 8032), streaming over the parts of the message -------------------
#
# libsodium hashes one contiguous message.  aprfast signs and verifies
# header || metadata || payload given as separate (often memory-mapped) pieces, so it
# computes both SHA-512 hashes itself, piece by piece, and leaves the curve arithmetic to
# libsodium's group operations (crypto_core_ed25519_*, crypto_scalarmult_ed25519_*).

_IDENTITY = b"\x01" + bytes(31)
_ZERO_SCALAR = bytes(32)
_INVERSE_OF_8 = pow(8, -1, _GROUP_ORDER).to_bytes(32, "little")
# Every encoding of a point of order 1, 2, 4 or 8 (sign bit cleared), as libsodium's
# ge25519_has_small_order lists them: y = 0, 1, the two order-8 y values, p-1, p, p+1.
_SMALL_ORDER_ENCODINGS = frozenset(bytes.fromhex(value) for value in (
    "0000000000000000000000000000000000000000000000000000000000000000",
    "0100000000000000000000000000000000000000000000000000000000000000",
    "26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc05",
    "c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac037a",
    "ecffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f",
    "edffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f",
    "eeffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f",
))


def generate_signing_key() -> Tuple[bytes, bytes]:
    """A fresh Ed25519 key as (seed32, public32); the seed is the RFC 8032 private key.

    Also exported as :func:`aprfast.v1.generate_signing_key`.  Save it with :func:`save_key`.

    Returns:
        ``(seed, public)``, 32 bytes each.

    Examples:
        >>> from aprfast import crypto
        >>> seed, public = crypto.generate_signing_key()
        >>> len(seed), crypto.public_key_of(seed) == public
        (32, True)
    """
    seed = os.urandom(ED25519_KEY_SIZE)
    return seed, public_key_of(seed)


def public_key_of(seed32: BytesLike) -> bytes:
    """The Ed25519 public key of a 32-byte seed.

    Args:
        seed32: The Ed25519 seed (private key), 32 bytes.

    Returns:
        32 bytes.

    Raises:
        ValueError: A seed that is not 32 bytes.

    Examples:
        >>> from aprfast import crypto
        >>> crypto.public_key_of(bytes(32)).hex()[:16]
        '3b6a27bcceb6a42d'
    """
    seed = _fixed_bytes(seed32, ED25519_KEY_SIZE, "Ed25519 seed")
    # crypto_scalarmult_ed25519_base clamps its scalar exactly as RFC 8032 §5.1.5 does.
    return _nb.crypto_scalarmult_ed25519_base(hashlib.sha512(seed).digest()[:32])


def sign(parts: Iterable[BytesLike], seed32: BytesLike) -> bytes:
    """The 64-byte Ed25519 signature of the concatenation of ``parts`` (a single bytes-like
    object counts as one part), equal to libsodium's; the parts are never joined.
    docs/FORMAT.md §10 ("Signatures").

    Args:
        parts: A bytes-like object or an iterable of them.
        seed32: The Ed25519 seed, 32 bytes.

    Returns:
        64 bytes, R || S.

    Raises:
        ValueError: A seed that is not 32 bytes.

    Examples:
        >>> from aprfast import crypto
        >>> seed, public = crypto.generate_signing_key()
        >>> signature = crypto.sign([b"header", b"payload"], seed)
        >>> crypto.verify(b"headerpayload", signature, public)
    """
    seed = _fixed_bytes(seed32, ED25519_KEY_SIZE, "Ed25519 seed")
    pieces = _message_pieces(parts)  # views, not copies: Ed25519 reads the message twice
    expanded = hashlib.sha512(seed).digest()
    public = _nb.crypto_scalarmult_ed25519_base(expanded[:32])
    secret_scalar = _reduce(_clamped(expanded[:32]))
    nonce = _reduce(_sha512(expanded[32:], pieces))       # r = H(prefix || M) mod L
    del expanded
    commitment = _base_times(nonce)                        # R = [r]B
    challenge = _challenge(commitment, public, pieces)     # k = H(R || A || M) mod L
    response = _nb.crypto_core_ed25519_scalar_add(         # S = r + k·a mod L
        nonce, _nb.crypto_core_ed25519_scalar_mul(challenge, secret_scalar))
    return commitment + response


def verify(parts: Iterable[BytesLike], signature: BytesLike, public_key: BytesLike) -> None:
    """Check an Ed25519 signature of the concatenation of ``parts``; SignatureError if it
    does not verify.  Accepts exactly what libsodium's crypto_sign_verify_detached accepts:
    S must be below the group order, neither R nor the key may have small order, the key
    must be a canonical curve point, and R must equal the encoding of [S]B - [k]A.

    Args:
        parts: A bytes-like object or an iterable of them.
        signature: 64 bytes.
        public_key: The signer's Ed25519 public key, 32 bytes.

    Returns:
        None: the signature verifies.

    Raises:
        SignatureError: It does not verify, or the signature or key is malformed.

    Examples:
        >>> from aprfast import crypto
        >>> seed, public = crypto.generate_signing_key()
        >>> crypto.verify(b"other", crypto.sign(b"message", seed), public)
        Traceback (most recent call last):
        ...
        aprfast.errors.SignatureError: [E006] Ed25519 signature mismatch: ...
    """
    sig = _fixed_bytes(signature, SIGNATURE_SIZE, "Ed25519 signature", SignatureError)
    public = _fixed_bytes(public_key, ED25519_KEY_SIZE, "Ed25519 public key", SignatureError)
    commitment, response = sig[:32], sig[32:]
    problem = _malformed_signature(commitment, response, public)
    if problem:
        raise SignatureError(f"malformed Ed25519 signature or key: {problem}")
    challenge = _challenge(commitment, public, _message_pieces(parts))
    expected = _nb.crypto_core_ed25519_sub(_base_times(response), _times(challenge, public))
    if not hmac.compare_digest(expected, commitment):
        raise SignatureError("Ed25519 signature mismatch: the signed bytes or the signature "
                             f"changed, or it was made by another key than {public.hex()}")


def _message_pieces(parts) -> list:
    if isinstance(parts, (bytes, bytearray, memoryview)):
        return [_byte_view(parts, "message")]
    if isinstance(parts, str):
        raise TypeError("the message parts must be bytes-like, not str")
    return [_byte_view(part, f"message part #{index}") for index, part in enumerate(parts)]


def _sha512(first: bytes, pieces) -> bytes:
    digest = hashlib.sha512(first)
    for piece in pieces:
        digest.update(piece)  # hashlib reads the buffer in place and drops the GIL
    return digest.digest()


def _challenge(commitment: bytes, public: bytes, pieces) -> bytes:
    return _reduce(_sha512(commitment + public, pieces))


def _reduce(value: bytes) -> bytes:
    """value mod L as 32 bytes, for 32- or 64-byte little-endian values."""
    return _nb.crypto_core_ed25519_scalar_reduce(value.ljust(64, b"\0"))


def _clamped(scalar: bytes) -> bytes:
    clamped = bytearray(scalar)
    clamped[0] &= 248
    clamped[31] = (clamped[31] & 127) | 64
    try:
        return bytes(clamped)
    finally:
        _wipe(clamped)


def _malformed_signature(commitment: bytes, response: bytes, public: bytes) -> Optional[str]:
    """libsodium's checks before the equation, in words; None when all pass."""
    if int.from_bytes(response, "little") >= _GROUP_ORDER:
        return "its S half is not reduced modulo the group order"
    if _has_small_order(commitment):
        return "its R half is a point of small order"
    if int.from_bytes(public, "little") & ((1 << 255) - 1) >= _FIELD_PRIME:
        return "the public key is not a canonical encoding"
    if _has_small_order(public):
        return "the public key is a point of small order"
    if not _is_curve_point(public):
        return "the public key is not a point of the curve"
    return None


def _has_small_order(point: bytes) -> bool:
    return point[:31] + bytes([point[31] & 0x7F]) in _SMALL_ORDER_ENCODINGS


def _is_curve_point(point: bytes) -> bool:
    # crypto_core_ed25519_add decodes both operands and fails when one has no square
    # root, the same test crypto_sign_verify_detached applies to the key.
    try:
        _nb.crypto_core_ed25519_add(point, _IDENTITY)
    except _nacl_exc.RuntimeError:
        return False
    return True


def _base_times(scalar: bytes) -> bytes:
    """[scalar]B; libsodium refuses a zero scalar because the result is the identity."""
    if scalar == _ZERO_SCALAR:
        return _IDENTITY
    return _nb.crypto_scalarmult_ed25519_base_noclamp(scalar)


def _times(scalar: bytes, point: bytes) -> bytes:
    """[scalar]point for any point that passed _malformed_signature.

    libsodium multiplies only points of the prime-order subgroup, but (like ed25519-dalek)
    its verifier accepts keys with a torsion component.  Such a key A = P + T is split:
    [k]A = [k]P + [k mod 8]T, since T's order divides 8."""
    if _nb.crypto_core_ed25519_is_valid_point(point):
        return _prime_order_times(scalar, point)
    prime_part, torsion = _split_off_torsion(point)
    return _nb.crypto_core_ed25519_add(_prime_order_times(scalar, prime_part),
                                       _small_multiple(scalar[0] & 7, torsion))


def _prime_order_times(scalar: bytes, point: bytes) -> bytes:
    if scalar == _ZERO_SCALAR:
        return _IDENTITY
    return _nb.crypto_scalarmult_ed25519_noclamp(scalar, point)


def _split_off_torsion(point: bytes) -> Tuple[bytes, bytes]:
    """(P, T) with point = P + T, P of prime order L and T of order dividing 8."""
    eight_times = point
    for _ in range(3):  # [8]point = [8]P: the torsion part vanishes
        eight_times = _nb.crypto_core_ed25519_add(eight_times, eight_times)
    prime_part = _nb.crypto_scalarmult_ed25519_noclamp(_INVERSE_OF_8, eight_times)
    return prime_part, _nb.crypto_core_ed25519_sub(point, prime_part)


def _small_multiple(count: int, point: bytes) -> bytes:
    result = _IDENTITY
    for _ in range(count):
        result = _nb.crypto_core_ed25519_add(result, point)
    return result


# --- key files -------------------------------------------------------------------



#: RFC 8410's DER of each kind, less the 32 key bytes that end it: a PKCS#8 v1
#: PrivateKeyInfo (``BEGIN PRIVATE KEY``) or a SubjectPublicKeyInfo (``BEGIN PUBLIC KEY``),
#: algorithm id-Ed25519 (1.3.101.112) or id-X25519 (1.3.101.110).  These are the bytes
#: OpenSSL and ``cryptography`` write, so PEM needs no package to write or read.
_DER_PREFIXES = {
    "ed25519-private": bytes.fromhex("302e020100300506032b657004220420"),
    "ed25519-public": bytes.fromhex("302a300506032b6570032100"),
    "x25519-private": bytes.fromhex("302e020100300506032b656e04220420"),
    "x25519-public": bytes.fromhex("302a300506032b656e032100"),
}


def key_fingerprint(public: BytesLike, kind: str = "ed25519-public") -> str:
    """A public key's fingerprint, ``SHA256:`` and unpadded base64, as ``ssh-keygen -l``
    prints it: for Ed25519 the SHA-256 of the OpenSSH public key blob (so an OpenSSH
    export of the key shows the same fingerprint), for X25519 (which OpenSSH has not)
    the SHA-256 of the 32 key bytes.

    Args:
        public: The 32 public key bytes.
        kind: "ed25519-public" or "x25519-public".

    Returns:
        The fingerprint, e.g. ``SHA256:Yk8n...``.

    Raises:
        ValueError: A key that is not 32 bytes, or another kind.

    Examples:
        >>> from aprfast import crypto
        >>> crypto.key_fingerprint(crypto.public_key_of(bytes(32)))
        'SHA256:tAXFyTXI8xtDaujAEcwJslAYc9/6FKcUkd2Lw0xDhPo'
    """
    raw = bytes(_fixed_bytes(public, 32, f"{kind} key"))
    if kind == "ed25519-public":
        name = b"ssh-ed25519"
        blob = len(name).to_bytes(4, "big") + name + len(raw).to_bytes(4, "big") + raw
    elif kind == "x25519-public":
        blob = raw
    else:
        raise ValueError(f"kind must be 'ed25519-public' or 'x25519-public'; got {kind!r}")
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode("ascii").rstrip("=")


def save_key(path, key: BytesLike, *, kind: str, format: str = "raw") -> None:
    """Write a key file atomically (temporary file, fsync, rename); private keys get
    mode 0600.  ``format``: "raw" (the 32 key bytes, which do not say what they are),
    "pem" (PKCS#8 / SubjectPublicKeyInfo: says its kind, needs no package) or
    "openssh" (Ed25519 only; needs the ``cryptography`` package).
    docs/FORMAT.md §10 ("Key files").

    Args:
        path: Where to write.
        key: The 32 raw key bytes.
        kind: One of :data:`KEY_KINDS` ("ed25519-private", "ed25519-public",
            "x25519-private", "x25519-public").
        format: "raw", "pem" or "openssh".

    Raises:
        ValueError: An unknown kind or format, a format the kind has not ("openssh"
            for X25519), or a key that is not 32 bytes.
        MissingDependencyError: "openssh" without the ``cryptography`` package.
        AprIOError: The file cannot be written.

    Examples:
        >>> from aprfast import crypto
        >>> seed, public = crypto.generate_signing_key()
        >>> crypto.save_key("signing.pem", seed, kind="ed25519-private", format="pem")
        >>> crypto.load_key("signing.pem") == ("ed25519-private", seed)
        True
    """
    if kind not in KEY_KINDS:
        raise ValueError(f"kind must be one of {', '.join(KEY_KINDS)}; got {kind!r}")
    if format not in KEY_FORMATS:
        raise ValueError(f"format must be one of {', '.join(KEY_FORMATS)}; got {format!r}")
    raw = _fixed_bytes(key, 32, f"{kind} key")
    data = raw if format == "raw" else _encode_text_key(raw, kind, format)
    write_key_file(path, data, private=kind.endswith("-private"))


def load_key(path, *, kind: Optional[str] = None) -> Tuple[str, bytes]:
    """Read a key file, detecting its format; returns (kind, the 32 raw key bytes).

    PEM and OpenSSH files say what they hold.  A raw file is just 32 bytes, so its kind
    must be given; when ``kind`` is given for a PEM/OpenSSH file, the file must match.

    Args:
        path: The key file.
        kind: The kind expected (required for a raw file).

    Returns:
        ``(kind, key)``: the kind and the 32 raw key bytes.

    Raises:
        FormatError: Not a key file, a raw file without ``kind``, or another kind.
        ValueError: An unknown ``kind``.
        AprIOError: The file cannot be read.

    Examples:
        >>> from aprfast import crypto
        >>> secret, public = crypto.generate_x25519_key()
        >>> crypto.save_key("model.pub", public, kind="x25519-public")
        >>> crypto.load_key("model.pub", kind="x25519-public")[1] == public
        True
        >>> crypto.load_key("model.pub")
        Traceback (most recent call last):
        ...
        aprfast.errors.FormatError: [E001] model.pub: a raw key file is 32 bytes that do not say ...
    """
    if kind is not None and kind not in KEY_KINDS:
        raise ValueError(f"kind must be one of {', '.join(KEY_KINDS)}; got {kind!r}")
    data = read_key_file(path)
    if len(data) == 32:
        if kind is None:
            raise FormatError("a raw key file is 32 bytes that do not say which kind of key "
                              f"they are; pass kind= (one of {', '.join(KEY_KINDS)})", path=path)
        return kind, data
    if not (data.startswith(b"-----BEGIN ") or data.startswith(b"ssh-")):
        raise FormatError(f"not a key file aprfast reads: {len(data)} bytes, neither a 32-byte "
                          "raw key nor a PEM or OpenSSH key", path=path)
    found, raw = _decode_text_key(data, path)
    if kind is not None and found != kind:
        raise FormatError(f"the file holds an {found} key, not an {kind} key", path=path)
    return found, raw


def _cryptography_key_classes():
    try:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ed25519, x25519
    except ImportError as error:
        raise ImportError(
            "PEM and OpenSSH key files need the 'cryptography' package: pip install "
            f"'{_KEYFILE_EXTRA}' (raw 32-byte key files need nothing extra)") from error
    classes = {
        "ed25519-private": ed25519.Ed25519PrivateKey, "ed25519-public": ed25519.Ed25519PublicKey,
        "x25519-private": x25519.X25519PrivateKey, "x25519-public": x25519.X25519PublicKey,
    }
    return serialization, classes


def _encode_text_key(raw: bytes, kind: str, format: str) -> bytes:
    if format == "pem":  # RFC 8410's fixed DER: no package needed
        label = b"PRIVATE KEY" if kind.endswith("-private") else b"PUBLIC KEY"
        body = base64.b64encode(_DER_PREFIXES[kind] + bytes(raw))
        return b"-----BEGIN " + label + b"-----\n" + body + b"\n-----END " + label + b"-----\n"
    serialization, classes = _cryptography_key_classes()
    encoding, private_format = serialization.Encoding, serialization.PrivateFormat
    if format == "openssh" and kind.startswith("x25519"):
        raise ValueError("OpenSSH has no X25519 key type; save X25519 keys as 'pem' or 'raw'")
    if kind.endswith("-private"):
        key = classes[kind].from_private_bytes(raw)
        layout = private_format.OpenSSH if format == "openssh" else private_format.PKCS8
        return key.private_bytes(encoding.PEM, layout, serialization.NoEncryption())
    key = classes[kind].from_public_bytes(raw)
    if format == "openssh":
        return key.public_bytes(encoding.OpenSSH, serialization.PublicFormat.OpenSSH) + b"\n"
    return key.public_bytes(encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


def _plain_pem_key(data: bytes):
    """(kind, key) of a PEM file holding exactly one of RFC 8410's four plain DER
    structures, else None (anything else goes to ``cryptography``)."""
    lines = data.strip().splitlines()
    if len(lines) < 3:
        return None
    for label in (b"PRIVATE KEY", b"PUBLIC KEY"):
        begin, end = b"-----BEGIN " + label + b"-----", b"-----END " + label + b"-----"
        if lines[0].strip() == begin and lines[-1].strip() == end:
            try:
                der = base64.b64decode(b"".join(line.strip() for line in lines[1:-1]), validate=True)
            except ValueError:
                return None
            for kind, prefix in _DER_PREFIXES.items():
                if kind.endswith("-private") == (label == b"PRIVATE KEY") and len(der) == len(prefix) + 32 \
                        and der.startswith(prefix):
                    return kind, der[len(prefix):]
    return None


def _decode_text_key(data: bytes, path) -> Tuple[str, bytes]:
    plain = _plain_pem_key(data)
    if plain is not None:
        return plain
    serialization, classes = _cryptography_key_classes()
    try:
        if data.startswith(b"ssh-"):
            key = serialization.load_ssh_public_key(data)
        elif data.startswith(b"-----BEGIN OPENSSH PRIVATE KEY-----"):
            key = serialization.load_ssh_private_key(data, password=None)
        elif data.startswith(b"-----BEGIN PUBLIC KEY-----"):
            key = serialization.load_pem_public_key(data)
        else:
            key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as error:  # TypeError: a passphrase-protected key
        raise FormatError(f"unreadable key file: {error}", path=path) from error
    except Exception as error:  # cryptography's UnsupportedAlgorithm (e.g. sk-ssh keys)
        raise FormatError(f"unsupported key file: {error}", path=path) from error
    for kind, cls in classes.items():
        if isinstance(key, cls):
            return kind, _raw_key_bytes(key, kind, serialization)
    raise FormatError(f"the file holds a {type(key).__name__.lstrip('_')}, not an Ed25519 or "
                      "X25519 key", path=path)


def _raw_key_bytes(key, kind: str, serialization) -> bytes:
    raw = serialization.Encoding.Raw
    if kind.endswith("-private"):
        return key.private_bytes(raw, serialization.PrivateFormat.Raw, serialization.NoEncryption())
    return key.public_bytes(raw, serialization.PublicFormat.Raw)


# --- private inference (seed 000 §4.1.4) ------------------------------------------
#
# The model publishes an X25519 public key in its metadata; requests are encrypted to
# it and responses to the user's key, both with the recipient-mode block above.


def encrypt_request(data: BytesLike, model_public: BytesLike) -> bytearray:
    """An inference request only the model's owner can read (recipient mode).

    Args:
        data: The request's bytes.
        model_public: The model's X25519 public key (:func:`inference_public_key`).

    Returns:
        A bytearray.

    Raises:
        ValueError: A key that is not 32 bytes or has small order.

    Examples:
        >>> from aprfast import crypto
        >>> model_secret, model_public = crypto.generate_x25519_key()
        >>> user_secret, user_public = crypto.generate_x25519_key()
        >>> request = crypto.encrypt_request(b"prompt", model_public)
        >>> crypto.decrypt_request(request, model_secret)
        bytearray(b'prompt')
    """
    return encrypt_for_recipient(data, model_public)


def decrypt_request(blob: BytesLike, model_secret: BytesLike) -> bytearray:
    """The plaintext of a request :func:`encrypt_request` made, with the model's secret.

    Args:
        blob: The encrypted request.
        model_secret: The model's X25519 private key.

    Returns:
        A bytearray.

    Raises:
        DecryptError: Another key's request, or an altered byte.

    Examples:
        >>> from aprfast import crypto
        >>> model_secret, model_public = crypto.generate_x25519_key()
        >>> user_secret, user_public = crypto.generate_x25519_key()
        >>> crypto.decrypt_request(crypto.encrypt_request(b"prompt", model_public), user_secret)
        Traceback (most recent call last):
        ...
        aprfast.errors.DecryptError: [E005] not the recipient: ...
    """
    return decrypt_as_recipient(blob, model_secret)


def encrypt_response(data: BytesLike, user_public: BytesLike) -> bytearray:
    """An inference response only the requesting user can read (recipient mode).

    Args:
        data: The response's bytes.
        user_public: The user's X25519 public key.

    Returns:
        A bytearray.

    Raises:
        ValueError: A key that is not 32 bytes or has small order.

    Examples:
        >>> from aprfast import crypto
        >>> model_secret, model_public = crypto.generate_x25519_key()
        >>> user_secret, user_public = crypto.generate_x25519_key()
        >>> response = crypto.encrypt_response(b"answer", user_public)
        >>> crypto.decrypt_response(response, user_secret)
        bytearray(b'answer')
    """
    return encrypt_for_recipient(data, user_public)


def decrypt_response(blob: BytesLike, user_secret: BytesLike) -> bytearray:
    """The plaintext of a response :func:`encrypt_response` made, with the user's secret.

    Args:
        blob: The encrypted response.
        user_secret: The user's X25519 private key.

    Returns:
        A bytearray.

    Raises:
        DecryptError: Another key's response, or an altered byte.

    Examples:
        >>> from aprfast import crypto
        >>> model_secret, model_public = crypto.generate_x25519_key()
        >>> user_secret, user_public = crypto.generate_x25519_key()
        >>> crypto.decrypt_response(crypto.encrypt_response(b"answer", user_public), user_secret)
        bytearray(b'answer')
    """
    return decrypt_as_recipient(blob, user_secret)


def inference_metadata(model_public: BytesLike) -> dict:
    """The metadata entries that publish a model's inference key (seed 000 §4.1.4).

    Args:
        model_public: The model's X25519 public key (32 bytes).

    Returns:
        ``{"inference_pub_key": base64, "inference_protocol": INFERENCE_PROTOCOL}``.

    Raises:
        ValueError: A key that is not 32 bytes.

    Examples:
        >>> from aprfast import crypto
        >>> crypto.inference_metadata(bytes(32))
        {'inference_pub_key': 'AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=',
         'inference_protocol': 'x25519-aes256gcm-v1'}
    """
    public = _fixed_bytes(model_public, X25519_KEY_SIZE, "model X25519 public key")
    return {"inference_pub_key": base64.b64encode(public).decode("ascii"),
            "inference_protocol": INFERENCE_PROTOCOL}


def inference_public_key(metadata: dict) -> bytes:
    """The model's X25519 public key from metadata written by :func:`inference_metadata`.

    Args:
        metadata: A file's metadata dict.

    Returns:
        32 bytes.

    Raises:
        FormatError: Another or no ``inference_protocol``, or a key that is not 32
            bytes of base64.

    Examples:
        >>> from aprfast import crypto
        >>> secret, public = crypto.generate_x25519_key()
        >>> crypto.inference_public_key(crypto.inference_metadata(public)) == public
        True
        >>> crypto.inference_public_key({})
        Traceback (most recent call last):
        ...
        aprfast.errors.FormatError: [E001] inference_protocol is None; aprfast speaks 'x25519-aes256gcm-v1'
    """
    protocol = metadata.get("inference_protocol")
    if protocol != INFERENCE_PROTOCOL:
        raise FormatError(f"inference_protocol is {protocol!r}; aprfast speaks "
                          f"{INFERENCE_PROTOCOL!r}")
    encoded = metadata.get("inference_pub_key")
    try:
        public = base64.b64decode(encoded, validate=True)
    except (TypeError, ValueError) as error:
        raise FormatError(f"inference_pub_key is not base64: {error}") from error
    if len(public) != X25519_KEY_SIZE:
        raise FormatError(f"inference_pub_key decodes to {len(public)} bytes, not 32")
    return public
