"""AES-256-GCM with detached tags, which aprfast.crypto does not offer.

APR2 chunks keep their plaintext's length in the file (the index's sizes and offsets are
those of the unencrypted layout) and their tags live in the security block, so each
chunk needs a detached-tag seal and open.  PyNaCl's bindings lack libsodium's
``*_detached`` functions, but its bundled libsodium exports them: they are called
through ctypes (which releases the GIL, so chunks decrypt in parallel on every core)
with the key schedule expanded once per file (``beforenm``).  When aprfast.crypto runs
on cryptography (OpenSSL, its first choice: VAES on CPUs that have it), chunks go
through OpenSSL's incremental GCM with a detached tag, in place, also without the GIL.
"""

from __future__ import annotations

import ctypes

import numpy as np

from . import core as crypto

__all__ = ["TAG_SIZE", "NONCE_SIZE", "ChunkCipher"]

TAG_SIZE = 16
NONCE_SIZE = 12
_STATE_SIZE = 512  # crypto_aead_aes256gcm_statebytes(), 16-byte aligned
_ull = ctypes.c_ulonglong
_p = ctypes.c_void_p


def _load_sodium():
    try:
        import nacl._sodium as sodium

        lib = ctypes.CDLL(sodium.__file__)
        if lib.crypto_aead_aes256gcm_is_available() != 1 or lib.crypto_aead_aes256gcm_statebytes() > _STATE_SIZE:
            return None
        lib.crypto_aead_aes256gcm_beforenm.argtypes = [_p, _p]
        lib.crypto_aead_aes256gcm_encrypt_detached_afternm.argtypes = [_p, _p, _p, _p, _ull, _p, _ull, _p, _p, _p]
        lib.crypto_aead_aes256gcm_decrypt_detached_afternm.argtypes = [_p, _p, _p, _ull, _p, _p, _ull, _p, _p]
        return lib
    except (ImportError, OSError, AttributeError):  # pragma: no cover - depends on the platform
        return None


_SODIUM = _load_sodium()


def _array(buffer) -> np.ndarray:
    """A uint8 array over any contiguous buffer, read-only ones included: its
    ``ctypes.data`` is the address ctypes passes, and it keeps the buffer alive."""
    return np.frombuffer(buffer, np.uint8)


class ChunkCipher:
    """One file's content key, ready to seal and open chunks with detached tags.
    Thread-safe: the expanded key is only read."""

    def __init__(self, key: bytes, backend: str | None = None):
        if len(key) != 32:
            raise ValueError("the content key is 32 bytes")
        if backend is None:  # the one aprfast.crypto chose (OpenSSL first), libsodium if that is unusable
            backend = crypto.AEAD_BACKEND
            if backend != "cryptography" and _SODIUM is not None:
                backend = "libsodium"
            elif backend != "cryptography":
                backend = "cryptography"
        self.backend = backend
        if backend == "libsodium":
            self._raw = ctypes.create_string_buffer(_STATE_SIZE + 16)
            at = ctypes.addressof(self._raw)
            self._state = at + (-at % 16)
            _SODIUM.crypto_aead_aes256gcm_beforenm(self._state, key)
        else:
            self._key = bytes(key)

    def seal(self, plaintext, out, nonce: bytes, aad: bytes) -> bytes:
        """Encrypt ``plaintext`` into ``out`` (same length; may be the same buffer); the tag."""
        if len(out) != len(plaintext):
            raise ValueError("ciphertext and plaintext differ in length")
        if self.backend != "libsodium":
            return self._seal_openssl(plaintext, out, nonce, aad)
        tag = ctypes.create_string_buffer(TAG_SIZE)
        src, dst = _array(plaintext), _array(out)
        _SODIUM.crypto_aead_aes256gcm_encrypt_detached_afternm(
            dst.ctypes.data, tag, None, src.ctypes.data, len(src), aad, len(aad), None, nonce, self._state)
        return tag.raw

    def open(self, ciphertext, out, tag: bytes, nonce: bytes, aad: bytes) -> bool:
        """Decrypt ``ciphertext`` into ``out`` (may be the same buffer) if ``tag``
        authenticates it under ``aad``; False (``out`` not to be used) if not."""
        if len(tag) != TAG_SIZE or len(out) != len(ciphertext):
            return False
        if self.backend != "libsodium":
            return self._open_openssl(ciphertext, out, tag, nonce, aad)
        src, dst = _array(ciphertext), _array(out)
        rc = _SODIUM.crypto_aead_aes256gcm_decrypt_detached_afternm(
            dst.ctypes.data, None, src.ctypes.data, len(src), bytes(tag), aad, len(aad), nonce, self._state)
        return rc == 0

    # --- cryptography (OpenSSL; VAES where the CPU has it) ------------------------------
    def _seal_openssl(self, plaintext, out, nonce, aad):
        enc = self._openssl_context(nonce, None)
        enc.authenticate_additional_data(aad)
        _update_into(enc, plaintext, out)
        enc.finalize()
        return enc.tag

    def _open_openssl(self, ciphertext, out, tag, nonce, aad):
        from cryptography.exceptions import InvalidTag

        dec = self._openssl_context(nonce, bytes(tag))
        dec.authenticate_additional_data(aad)
        _update_into(dec, ciphertext, out)
        try:
            dec.finalize()
        except InvalidTag:
            return False
        return True

    def _openssl_context(self, nonce, tag):
        from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

        cipher = Cipher(algorithms.AES(self._key), modes.GCM(nonce, tag))
        return cipher.encryptor() if tag is None else cipher.decryptor()


def _update_into(context, src, dst) -> None:
    """GCM over ``src`` into ``dst`` (the same bytes, or as many), without copying the
    body.  ``update_into`` asks for 15 bytes of room beyond the input although GCM
    writes exactly as many bytes as it reads, so the body is all but the last 16
    bytes (the room is the chunk's own tail, not yet touched) and the tail goes
    through a small buffer.  OpenSSL runs without the GIL and allows in-place."""
    src, dst = memoryview(src).cast("B"), memoryview(dst).cast("B")
    n = len(src)
    body = max(0, n - 16)
    if body:
        context.update_into(src[:body], dst[:n])
    if n > body:
        tail = bytearray(n - body + 15)
        done = context.update_into(src[body:], tail)
        dst[body:n] = tail[:done]
