"""Every cryptographic operation of aprfast, in one package: key derivation and key files,
password and recipient envelopes, signatures (:mod:`~aprfast.crypto.core`), the AEAD
backends (:mod:`~aprfast.crypto.aead`) and digests (:mod:`~aprfast.crypto.digests`).

The APR2 security block that uses them is :mod:`aprfast.security`.  ``aprfast.crypto``
was one module before the package was split; its names are still served from here.
They load on first use: importing :mod:`~aprfast.crypto.core` loads libsodium and
OpenSSL (about 8 MiB resident), which reading a plain file must never pay for, while the
digests a plain signed file needs come from :mod:`~aprfast.crypto.digests` alone.
"""

import importlib

__all__ = [
    "ARGON2_MEMORY_KIB", "ARGON2_TIME", "ARGON2_PARALLELISM", "KEY_SIZE", "HKDF_INFO", "MULTI_WRAP_INFO",
    "MULTI_MAGIC", "INFERENCE_PROTOCOL", "KEY_KINDS", "AEAD_BACKEND", "derive_password_key",
    "encrypt_with_password", "decrypt_with_password", "Sealing", "password_sealing", "recipient_sealing",
    "recipients_sealing", "encrypt_for_recipient", "is_recipient", "decrypt_as_recipient", "encrypt_for_recipients",
    "decrypt_multi_recipient", "is_multi_recipient", "generate_signing_key", "public_key_of", "sign", "verify",
    "generate_x25519_key", "x25519_public_key", "save_key", "load_key", "key_fingerprint", "encrypt_request",
    "decrypt_request", "encrypt_response", "decrypt_response", "inference_metadata", "inference_public_key",
]


def __getattr__(name):
    core = importlib.import_module(".core", __name__)
    try:
        return getattr(core, name)
    except AttributeError:
        raise AttributeError(f"module 'aprfast.crypto' has no attribute {name!r}") from None


def __dir__():
    return sorted(set(globals()) | set(__all__))
