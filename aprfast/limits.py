"""Limits that bound what a reader will believe before it allocates or slices.

Every size, count and offset in a file is checked against the bytes really present;
these limits bound the rest (how much metadata JSON to parse, how many index entries
to build objects for).  They are plain module constants so a caller can raise them
for one process (``aprfast.limits.MAX_TENSOR_COUNT = 10_000_000``) or pass a
:class:`Limits` to one call (``aprfast.open(path, limits=Limits(max_dims=16))``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = [
    "MAX_METADATA_SIZE",
    "MAX_INDEX_SIZE",
    "MAX_TENSOR_COUNT",
    "MAX_DIMS",
    "MAX_NAME_BYTES",
    "MAX_ALIGNMENT",
    "METADATA_MEMORY_FACTOR",
    "METADATA_MEMORY_FLOOR",
    "MAX_RECIPIENTS",
    "MAX_WRAPS_PER_KEY",
    "Limits",
]

#: Bytes of JSON metadata parsed (aprender declares 16 MiB as its own maximum).
MAX_METADATA_SIZE = 64 * 1024 * 1024
#: Bytes of binary tensor index parsed.
MAX_INDEX_SIZE = 256 * 1024 * 1024
#: Tensors in one file.
MAX_TENSOR_COUNT = 4_000_000
#: Dimensions of one tensor (both v2 layouts define at most 8).
MAX_DIMS = 8
#: Bytes of one tensor name (aprender writes at most 256; both layouts store a u16).
MAX_NAME_BYTES = 65535
#: Largest alignment a caller may ask of a buffer or a layout.
MAX_ALIGNMENT = 4096
#: Memory a metadata decode may take, as a multiple of the block's size...
METADATA_MEMORY_FACTOR = 4
#: ... or this much, whichever is larger: a tokenizer vocabulary of a few hundred
#: thousand short strings costs 10-20x its encoded size in Python objects and must load.
METADATA_MEMORY_FLOOR = 64 * 1024 * 1024
#: Wraps (recipients) a multi-recipient v1 payload may declare.  The format allows
#: 65,535; each wrap a reader tries costs an X25519, an HKDF and an AES-GCM open, so an
#: unbounded count is a CPU cost the file's author chooses for the reader.
MAX_RECIPIENTS = 1024
#: Wraps carrying one key's 8-byte hint that a reader tries before giving up.  Two
#: honest recipients share a hint with probability 2**-64 per pair; more than a few
#: is an attack.
MAX_WRAPS_PER_KEY = 4


def _current(name):
    # Read the module global at construction time so later assignments count.
    return field(default_factory=lambda: globals()[name])


@dataclass(frozen=True)
class Limits:
    """One set of limits; defaults are the module constants at creation time.

    Pass it as ``limits=`` to :func:`aprfast.open`, :func:`aprfast.load_file`,
    :func:`aprfast.inspect` or :func:`aprfast.stream`.  See docs/robustness.md.

    Attributes:
        max_metadata_size: Bytes of JSON metadata parsed.
        max_index_size: Bytes of binary tensor index parsed.
        max_tensor_count: Tensors in one file.
        max_dims: Dimensions of one tensor.
        max_name_bytes: Bytes of one tensor name.

    Examples:
        >>> import numpy as np, aprfast
        >>> blob = aprfast.save({"a": np.zeros(1), "b": np.zeros(1)})
        >>> aprfast.Limits().max_dims
        8
        >>> aprfast.open(blob, limits=aprfast.Limits(max_tensor_count=1))
        Traceback (most recent call last):
        ...
        aprfast.errors.LimitError: [E008] ...
    """

    max_metadata_size: int = _current("MAX_METADATA_SIZE")
    max_index_size: int = _current("MAX_INDEX_SIZE")
    max_tensor_count: int = _current("MAX_TENSOR_COUNT")
    max_dims: int = _current("MAX_DIMS")
    max_name_bytes: int = _current("MAX_NAME_BYTES")
