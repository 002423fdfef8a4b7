"""Compression codecs: v1 payload compression (:mod:`~aprfast.codecs.payload`) and the
APR2 per-tensor block tables (:mod:`~aprfast.codecs.blocks`).

``aprfast.codecs`` was the payload module before the package was split; its names are
still importable from here.
"""

from . import payload as _payload
from .payload import MAX_UNCOMPRESSED_SIZE, ZSTD_LEVELS, Compression, compress, decompress

__all__ = ["Compression", "MAX_UNCOMPRESSED_SIZE", "ZSTD_LEVELS", "compress", "decompress"]


def __getattr__(name):
    # every other name of the old flat module (kept for code written before the split)
    try:
        return getattr(_payload, name)
    except AttributeError:
        raise AttributeError(f"module 'aprfast.codecs' has no attribute {name!r}") from None
