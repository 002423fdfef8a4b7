"""The v1 container (``APRN``, aprender's ``save``/``load`` format): the public API.

* :func:`save_model` writes a payload (raw bytes, e.g. a bincode-serialised aprender
  model, or a dict of named arrays) with aprender's header, MessagePack metadata,
  optional compression, encryption, signature and license, and the trailing CRC32.
* :func:`load_model` checks everything in the order the Andon protocol asks (magic,
  CRC32, header, model type, signature, decryption, decompression) and returns a
  :class:`V1Model`.
* :func:`inspect_model` reads only the header and metadata, like aprender's ``inspect``.
* ``save_model(tensors, streaming=True)`` writes the STREAMING chunk index
  (:mod:`aprfast.layouts.chunk_index`) and ``trueno_native=True`` the TRUENO_NATIVE
  tensor index (:mod:`aprfast.layouts.trueno`); :class:`aprfast.v1.reader.V1File` reads
  them lazily, :func:`load_model` eagerly.

The bytes live in :mod:`aprfast.layouts.v1`, compression in :mod:`aprfast.codecs`,
encryption and signatures in :mod:`aprfast.crypto`, licenses in :mod:`aprfast.v1.licensing`,
buyer fingerprints in :mod:`aprfast.v1.watermark`.  docs/FORMAT.md (§9-§13) records every
byte and decision; docs/guide/older-files.md shows them in use.
"""

from __future__ import annotations

from ..codecs.payload import MAX_UNCOMPRESSED_SIZE, Compression
from ..io.sources import open_source
from ..layouts import v1 as layout
from ..layouts.v1 import Flag, Header, ModelType
from .checks import (  # noqa: F401
    CHUNKED_PAYLOAD_FORMAT,
    DEFAULT_APRENDER_VERSION,
    FILE_KEY_SIZE,
    PAYLOAD_FORMAT_KEY,
    SELF_SIGNED,
    TENSOR_ALIGNMENT,
    TENSOR_PAYLOAD_FORMAT,
    TRUENO_PAYLOAD_FORMAT,
    TRUSTED,
    UNSIGNED,
    V1Model,
    check_license,
)
from .load import load_model, trueno_view  # noqa: F401
from .writer import save_model  # noqa: F401

__all__ = [
    "save_model", "load_model", "inspect_model", "check_license", "V1Model", "ModelType", "Compression", "Flag",
    "Header", "MAX_UNCOMPRESSED_SIZE", "PAYLOAD_FORMAT_KEY", "TENSOR_PAYLOAD_FORMAT", "UNSIGNED", "TRUSTED",
    "SELF_SIGNED", "generate_signing_key", "generate_x25519_key", "public_key_of",
    "embed_watermark", "verify_watermark", "extract_watermark", "buyer_fingerprint",
]


_KEY_HELPERS = ("generate_signing_key", "generate_x25519_key", "public_key_of")
#: seed 000 §8.3: buyer fingerprints for licensed models (aprfast.v1.watermark)
_WATERMARK = ("embed_watermark", "verify_watermark", "extract_watermark", "buyer_fingerprint")


def __getattr__(name):
    # Key helpers come from aprfast.crypto, imported on first use so that plain files
    # never load the crypto libraries.
    if name in _KEY_HELPERS:
        from ..crypto import core as crypto

        return getattr(crypto, name)
    if name in _WATERMARK:
        from . import watermark

        return getattr(watermark, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# --- inspection and licenses -------------------------------------------------------
def inspect_model(source) -> dict:
    """Header and metadata without checking the CRC or decrypting (aprender's inspect).

    Reads only the 32-byte header and the metadata: no payload, no key needed, nothing
    verified beyond what parsing them needs (use :func:`load_model` to check a file).
    docs/FORMAT.md §9.

    Args:
        source: A path, a readable file object or a bytes-like object.

    Returns:
        A dict: ``layout`` ("v1"), ``header`` (the fields, with ``model_type_name``,
        ``compression_name`` and ``flag_names``), ``metadata`` (aprender's, decoded) and,
        for a licensed file, ``license_block_size``.

    Raises:
        FormatError: Not a v1 file (magic), or an unknown model type id.
        CorruptError: The file is shorter than its header or metadata says.
        VersionError: A newer major version or an unknown compression id.
        AprFileNotFoundError: ``source`` names no file (an :class:`AprIOError`).

    Examples:
        >>> from aprfast import v1
        >>> blob = v1.save_model(b"weights", model_type="KMeans", metadata={"created_at": "0"})
        >>> info = v1.inspect_model(blob)
        >>> info["header"]["model_type_name"], info["metadata"]["created_at"]
        ('KMeans', '0')
    """
    src = open_source(source)
    try:
        return layout.inspect(src)
    finally:
        src.close()
