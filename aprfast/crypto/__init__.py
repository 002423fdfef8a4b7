"""Every cryptographic operation of aprfast, in one package: key derivation and key files,
password and recipient envelopes, signatures (:mod:`~aprfast.crypto.core`), the AEAD
backends (:mod:`~aprfast.crypto.aead`) and digests (:mod:`~aprfast.crypto.digests`).

The APR2 security block that uses them is :mod:`aprfast.security`.
"""

from . import core as _core
from .core import *  # noqa: F403  (the public names, listed in core.__all__)
from .core import __all__  # noqa: F401


def __getattr__(name):
    # every other name of the old flat module aprfast.crypto
    try:
        return getattr(_core, name)
    except AttributeError:
        raise AttributeError(f"module 'aprfast.crypto' has no attribute {name!r}") from None
