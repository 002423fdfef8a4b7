"""Encryption and signing of APR2 files that keep random access (docs/FORMAT.md §3.2).

* :mod:`.sealing` - writing: :class:`SecurityOptions`, the content key and key block,
  chunks sealed with AES-256-GCM, the digest manifest, the signature.
* :mod:`.opening` - reading: the checks made at open, :class:`Security` (per-chunk
  digest and tag checks) and :class:`SecureSource` (what an AprFile reads through).
* :mod:`.block` - the bytes of the security block; :mod:`.digests` - SHA-256/BLAKE3;
  :mod:`.aead` - AES-256-GCM with detached tags over aprfast.crypto's backends.
"""

from .opening import SecureSource, Security, open_security, refuse_keys
from .sealing import SecurityOptions

__all__ = ["SecurityOptions", "Security", "SecureSource", "open_security", "refuse_keys"]
