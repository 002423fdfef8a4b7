"""The chunk digests of an APR2 manifest: which hash a file names, and hashing with it.

The hash is part of the format (the security block's ``digest_id`` byte), not a
reader's choice: SHA-256 (id 1, hashlib: OpenSSL, SHA-NI where the CPU has it) is what
aprfast writes by default, since every reader has it; BLAKE3 (id 2, the ``blake3``
package, an optional dependency) is ~3x faster here and written on request.
"""

from __future__ import annotations

import hashlib

from ..errors import VersionError

__all__ = ["SHA256", "BLAKE3", "DIGEST_SIZE", "BLAKE3_EXTRA", "digest_id", "digest_name", "hasher"]

SHA256 = 1
BLAKE3 = 2
DIGEST_SIZE = 32
#: The extra that brings the blake3 package.
BLAKE3_EXTRA = "aprfast[blake3]"
_IDS = {"sha256": SHA256, "blake3": BLAKE3}
_NAMES = {v: k for k, v in _IDS.items()}


def digest_id(name: str) -> int:
    """The id a file records for the hash ``name`` ("sha256" or "blake3"); the hash
    must be usable here, so a file is never written that this build cannot check."""
    try:
        found = _IDS[str(name).lower()]
    except KeyError:
        raise ValueError(f"unknown digest {name!r}; use 'sha256' or 'blake3'") from None
    hasher(found)
    return found


def digest_name(ident: int) -> str:
    return _NAMES.get(ident, f"unknown ({ident})")


def hasher(ident: int, path=None):
    """A function bytes-like -> 32-byte digest for a file's ``digest_id``.  Both hash
    without the GIL (hashlib above 2 KiB, blake3 always), so chunks hash in parallel."""
    if ident == SHA256:
        return _sha256
    if ident == BLAKE3:
        try:
            import blake3
        except ImportError:
            raise VersionError(f"the file's chunk digests are BLAKE3, which needs the blake3 package: "
                               f"pip install '{BLAKE3_EXTRA}' (or pip install blake3)", path=path) from None
        return lambda data: blake3.blake3(data).digest()
    raise VersionError(f"the file's chunk digests use hash id {ident}, which this build does not know "
                       "(1 = SHA-256, 2 = BLAKE3)", path=path)


def _sha256(data) -> bytes:
    return hashlib.sha256(data).digest()
