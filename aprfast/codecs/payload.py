"""Payload compression for the v1 (``APRN``) container: ids 0-3 as aprender writes them.

| id | aprender name | bytes                                                          |
|----|---------------|----------------------------------------------------------------|
| 0  | None          | the payload as is                                              |
| 1  | ZstdDefault   | zstd frame(s), level 3, no content size, no checksum           |
| 2  | ZstdMax       | zstd frame(s), level 19, no content size, no checksum          |
| 3  | Lz4           | u32 LE uncompressed length, then one LZ4 *block* (not a frame) |

aprender's zstd frames come from the Rust ``zstd::encode_all``, a streaming encoder that
never learns the input size, so its frames carry no content size and no checksum.
aprfast compresses the same way (a streaming ``compressobj`` with those two flags off).
The bytes can still differ between zstd and LZ4 library versions, so only the
*decompressed* bytes are comparable across implementations.

Decompression never trusts a declared size.  Nothing larger than ``expected_size``
(the header's ``uncompressed_size``) or ``limit`` is ever allocated: zstd is
stream-decompressed into a buffer of exactly ``expected_size`` bytes and then probed
for one byte more; an LZ4 block's 4-byte length prefix is checked against both numbers
before the block is touched.
"""

from __future__ import annotations

from enum import IntEnum

from .._optional import require
from ..errors import CorruptError, LimitError, VersionError

__all__ = ["Compression", "MAX_UNCOMPRESSED_SIZE", "ZSTD_LEVELS", "compress", "decompress"]

#: aprender's ``MAX_UNCOMPRESSED_SIZE`` (1 GiB): its reader refuses larger payloads.
MAX_UNCOMPRESSED_SIZE = 1 << 30
#: The most a zstd payload can inflate: a raw-or-RLE block header of 3 bytes plus one
#: byte describes at most one 128 KiB block.
ZSTD_MAX_RATIO = (128 << 10) // 4
ZSTD_SLACK = 1 << 10
# The zstd output starts this large (or at 4x the input) and doubles as it fills.
_ZSTD_FIRST_OUTPUT = 16 << 20


class Compression(IntEnum):
    """aprender's ``Compression`` ids (``#[repr(u8)]``); ``aprender_name`` is its Rust name.

    docs/FORMAT.md §9 ("Compression (byte 20)") has the bytes of each.

    Examples:
        >>> from aprfast.v1 import Compression
        >>> int(Compression.LZ4), Compression.ZSTD_MAX.aprender_name
        (3, 'ZstdMax')
    """

    NONE = 0
    ZSTD_DEFAULT = 1
    ZSTD_MAX = 2
    LZ4 = 3

    @property
    def aprender_name(self) -> str:
        """aprender's Rust name of the variant ("None", "ZstdDefault", "ZstdMax", "Lz4")."""
        return _APRENDER_NAMES[self]

    @classmethod
    def from_value(cls, value) -> "Compression":
        """A Compression from an id, a member, aprender's name, or "none"/"zstd"/"zstd-max"/"lz4".

        Args:
            value: A member, an id 0-3 or a name (case, ``_`` and ``-`` ignored).

        Returns:
            The member.

        Raises:
            ValueError: An unknown name.
            VersionError: An id other than 0-3.
            TypeError: Neither a member, an int nor a str.

        Examples:
            >>> from aprfast.v1 import Compression
            >>> Compression.from_value("zstd").name, Compression.from_value("ZstdMax").name
            ('ZSTD_DEFAULT', 'ZSTD_MAX')
            >>> Compression.from_value(9)
            Traceback (most recent call last):
            ...
            aprfast.errors.VersionError: [E003] compression id 9 is not one aprender defines (0-3)
        """
        if isinstance(value, cls):
            return value
        if isinstance(value, str):
            key = value.strip().lower().replace("_", "-")
            member = _BY_NAME.get(key)
            if member is None:
                raise ValueError(f"unknown compression {value!r}; use one of "
                                 f"{', '.join(sorted(set(_BY_NAME)))} or an id 0-3")
            return member
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"compression must be a name or an id 0-3, not {type(value).__name__}")
        try:
            return cls(value)
        except ValueError:
            raise VersionError(f"compression id {value} is not one aprender defines (0-3)") from None


_APRENDER_NAMES = {Compression.NONE: "None", Compression.ZSTD_DEFAULT: "ZstdDefault",
                   Compression.ZSTD_MAX: "ZstdMax", Compression.LZ4: "Lz4"}
_BY_NAME = {
    "none": Compression.NONE, "zstd": Compression.ZSTD_DEFAULT, "zstd-default": Compression.ZSTD_DEFAULT,
    "zstddefault": Compression.ZSTD_DEFAULT, "zstd-max": Compression.ZSTD_MAX,
    "zstdmax": Compression.ZSTD_MAX, "lz4": Compression.LZ4,
}
#: zstd levels aprender uses for each id.
ZSTD_LEVELS = {Compression.ZSTD_DEFAULT: 3, Compression.ZSTD_MAX: 19}
_LZ4_PREFIX = 4


# --- compression -----------------------------------------------------------------------
def compress(data, compression) -> bytes:
    """``data`` compressed as aprender's writer compresses a payload with ``compression``."""
    compression = Compression.from_value(compression)
    if compression is Compression.NONE:
        return bytes(data)
    if compression is Compression.LZ4:
        lz4_block = require("lz4.block")

        return lz4_block.compress(data, mode="default", store_size=True)
    return _zstd_stream_compress(data, ZSTD_LEVELS[compression])


def _zstd_stream_compress(data, level: int) -> bytes:
    """One zstd frame as Rust ``zstd::encode_all`` makes it: streamed with the size
    unknown to the encoder, so the frame holds no content size and no checksum."""
    zstandard = require("zstandard")

    cctx = zstandard.ZstdCompressor(level=level, write_content_size=False, write_checksum=False)
    stream = cctx.compressobj()
    return stream.compress(data) + stream.flush()


# --- decompression -------------------------------------------------------------------
def decompress(data, compression, *, expected_size: int, limit: int = MAX_UNCOMPRESSED_SIZE,
               path=None) -> bytes:
    """The payload ``data`` decompressed; it must inflate to exactly ``expected_size``
    bytes (the header's ``uncompressed_size``), which must not exceed ``limit``.

    A stream that would inflate further is refused without the extra bytes ever being
    allocated: CorruptError when it exceeds ``expected_size``, LimitError when the
    declared size exceeds ``limit``.
    """
    compression = Compression.from_value(compression)
    if expected_size > limit:
        raise LimitError(f"the payload declares {expected_size} uncompressed bytes, above the limit of "
                         f"{limit} (pass a larger max_uncompressed to accept it)", path=path)
    if compression is Compression.NONE:
        if len(data) != expected_size:
            raise CorruptError(f"uncompressed payload is {len(data)} bytes but the header says "
                               f"{expected_size}", path=path)
        return data
    if compression is Compression.LZ4:
        return _lz4_decompress(data, expected_size, limit, path)
    return _zstd_decompress(data, expected_size, path)


def _lz4_decompress(data, expected_size, limit, path):
    """Decode into one new bytearray of the declared size, each byte written once.

    The declared size is believed only if the block could produce it: an LZ4 block
    inflates at most 255-fold (see csrc/lz4block.h), so an 82-byte file declaring
    1 GiB is refused before anything is allocated."""
    from .. import _memory

    view = memoryview(data)
    if len(view) < _LZ4_PREFIX:
        raise CorruptError(f"LZ4 payload is {len(view)} bytes, too short for its 4-byte size prefix", path=path)
    declared = int.from_bytes(view[:_LZ4_PREFIX], "little")
    if declared > limit:
        raise LimitError(f"LZ4 block declares {declared} uncompressed bytes, above the limit of {limit}", path=path)
    if declared != expected_size:
        raise CorruptError(f"LZ4 block declares {declared} uncompressed bytes but the header says "
                           f"{expected_size}", path=path)
    block = view[_LZ4_PREFIX:]
    most = len(block) * _memory.LZ4_MAX_RATIO + _memory.LZ4_SLACK
    if declared > most:
        raise CorruptError(f"LZ4 block of {len(block)} bytes declares {declared} uncompressed bytes; it can "
                           f"describe at most {most} (LZ4 inflates at most {_memory.LZ4_MAX_RATIO}-fold)",
                           path=path)
    out = _memory.uninitialised_bytearray(declared)  # the decoder writes every byte or fails
    problem = _memory.lz4_block_decode_into(block, out)
    if problem is not None:
        raise CorruptError(f"LZ4 block does not decompress to the {declared} bytes it declares: {problem}",
                           path=path)
    return out


def _zstd_decompress(data, expected_size, path):
    """Stream-decompress in place into one bytearray of ``expected_size`` bytes, then
    probe for one more.

    Frames declare a content size or not; either way it is ignored (a frame can lie),
    and every frame in the payload is decoded in turn, as Rust ``zstd::decode_all`` does.
    The declared size is believed only if the bytes present could produce it (a zstd
    block of at most 128 KiB costs at least a 3-byte header and one byte: at most
    32,768-fold).  Even then the output grows with what really decompresses, so a
    lying header costs at most twice the true output, and no byte is ever copied.
    """
    zstandard = require("zstandard")

    from .. import _memory

    most = len(data) * ZSTD_MAX_RATIO + ZSTD_SLACK
    if expected_size > most:
        raise CorruptError(f"zstd payload of {len(data)} bytes cannot inflate to the {expected_size} bytes the "
                           f"header declares (at most {most}: zstd inflates at most {ZSTD_MAX_RATIO}-fold)",
                           path=path)
    reader = zstandard.ZstdDecompressor().stream_reader(data, read_across_frames=True)
    out = _memory.uninitialised_bytearray(min(expected_size, max(4 * len(data), _ZSTD_FIRST_OUTPUT)))
    have = 0
    try:
        with reader:
            while have < expected_size:
                if have == len(out):
                    _memory.resize_bytearray(out, min(expected_size, 2 * len(out)))
                with memoryview(out) as window:
                    got = reader.readinto(window[have:])
                if not got:
                    break
                have += got
            overflow = reader.read(1)
    except zstandard.ZstdError as exc:
        raise CorruptError(f"zstd payload does not decompress: {exc}", path=path) from None
    if overflow:
        raise CorruptError(f"zstd payload inflates beyond the {expected_size} bytes the header declares "
                           "(stopped there: a compression bomb or a corrupt header)", path=path)
    if have != expected_size:
        raise CorruptError(f"zstd payload inflates to {have} bytes but the header says {expected_size}",
                           path=path)
    return out
