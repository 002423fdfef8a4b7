"""Commercial licenses: the v1 license block (seed §8.1-8.2) and aprender's ``license`` entry.

Two representations of one license live in a v1 file:

* the **license block**, a little-endian binary record of the spec (seed 000 §8.1)::

      license_id        16  UUID bytes (RFC 4122 order, as uuid.UUID.bytes)
      licensee_hash     32  SHA-256 of the licensee's UTF-8 name
      issued_at          8  u64 unix seconds
      expires_at         8  u64 unix seconds, 0 = never
      flags              1  u8 LicenseFlags, bits 6-7 zero
      seat_limit         2  u16
      inference_limit    4  u32
      custom_terms_len   4  u32
      custom_terms       custom_terms_len bytes

  :func:`encode_license_block` / :func:`decode_license_block` (or
  :func:`read_license_block` inside a larger buffer) convert it.  Where the block sits in
  the file is the container's business.

* aprender's **MessagePack entry** ``metadata["license"]`` (apr-format 0.72.3
  ``LicenseInfo``), the only license data aprender itself reads or writes.
  :func:`to_aprender_entry` builds it with aprender's field names, order and types, so
  ``msgpack.packb`` gives the bytes ``rmp_serde::to_vec_named`` gives;
  :func:`from_aprender_entry` reads one back.  Its ``hash`` is the SHA-256 of the
  license block, which ties the two together: a signature over the metadata then
  also vouches for the block.

:func:`check_license` enforces what the flags ask for and raises :class:`LicenseError`.
:func:`compliance_metadata` builds the seed's optional ``compliance`` object (§8.7).
Nothing here is a secret or is authenticated by itself: whoever holds the file can edit
a block, so a block means something only when a trusted signature covers it (directly
or through the entry's ``hash``), and a check that runs on the licensee's own machine is
a contract term made visible, not copy protection.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import hmac
import struct
import threading
import time
import uuid as _uuid
from dataclasses import InitVar, dataclass
from enum import IntFlag

from ..errors import CorruptError, LayoutError, LicenseError, LimitError

__all__ = [
    "LicenseError",
    "LicenseFlags",
    "License",
    "LICENSE_BLOCK_FIXED_SIZE",
    "MAX_CUSTOM_TERMS_SIZE",
    "LICENSE_TIERS",
    "licensee_hash",
    "encode_license_block",
    "decode_license_block",
    "read_license_block",
    "license_digest",
    "to_aprender_entry",
    "from_aprender_entry",
    "AprenderLicenseEntry",
    "check_license",
    "InferenceCounter",
    "compliance_metadata",
]




class LicenseFlags(IntFlag):
    """Flags byte of the license block (seed §8.2).  Bits 6-7 are reserved and zero.

    docs/FORMAT.md §11.2 says what each flag enforces.

    Examples:
        >>> from aprfast.v1.licensing import LicenseFlags
        >>> int(LicenseFlags.SEATS_ENFORCED | LicenseFlags.WATERMARKED)
        9
    """

    SEATS_ENFORCED = 0x01  # refuse more concurrent seats than seat_limit
    EXPIRATION_ENFORCED = 0x02  # refuse from expires_at on
    INFERENCE_LIMITED = 0x04  # refuse after inference_limit inferences
    WATERMARKED = 0x08  # the weights carry a buyer fingerprint (aprfast.v1.watermark)
    REVOCABLE = 0x10  # the seller may revoke it online; aprfast does not go online
    TRANSFERABLE = 0x20  # the licensee may resell it; no effect on checks


_DEFINED_FLAGS = 0x3F

_FIXED = struct.Struct("<16s32sQQBHII")
#: Bytes of a block with no custom terms.  The seed says "72+": its fields add up to 71
#: bytes plus a length prefix whose width it leaves open; aprfast uses a u32 (75 bytes),
#: because a u8 prefix would cap the terms at 255 bytes.
LICENSE_BLOCK_FIXED_SIZE = _FIXED.size

#: Most bytes of custom terms a reader accepts (E008 beyond it).  A module constant so a
#: caller may raise it for one process; ``decode_license_block(..., max_custom_terms=)``
#: raises it for one call.
MAX_CUSTOM_TERMS_SIZE = 1 << 20

_U16, _U32, _U64 = (1 << 16) - 1, (1 << 32) - 1, (1 << 64) - 1

#: aprender's ``LicenseTier`` variants, serialised by name.
LICENSE_TIERS = ("Personal", "Team", "Enterprise", "Academic")

# ISO 8601 cannot spell years past 9999, so the aprender entry cannot hold later expiries.
_LAST_ISO_SECOND = 253402300799  # 9999-12-31T23:59:59Z


def licensee_hash(licensee) -> bytes:
    """SHA-256 of a licensee: a ``str`` is hashed as UTF-8 exactly as given (no case or
    Unicode normalisation; canonicalise names before issuing), ``bytes`` as they are.
    The same hash identifies the buyer in :mod:`aprfast.v1.watermark`.  It names the
    licensee without spelling it out, but a guessable name can be found by hashing
    guesses: it is an identifier, not a secret.

    Args:
        licensee: A name (str) or bytes.

    Returns:
        32 bytes.

    Raises:
        TypeError: Neither str nor bytes.

    Examples:
        >>> from aprfast.v1.licensing import licensee_hash
        >>> licensee_hash("alice").hex()[:16]
        '2bd806c97f0e00af'
    """
    if isinstance(licensee, str):
        licensee = licensee.encode("utf-8")
    if not isinstance(licensee, (bytes, bytearray, memoryview)):
        raise TypeError(f"a licensee is str or bytes, not {type(licensee).__name__}")
    return hashlib.sha256(bytes(licensee)).digest()


@dataclass(frozen=True)
class License:
    """One license, as the block stores it.

    ``license_id`` accepts a :class:`uuid.UUID`, its 16 bytes or its string form and is
    kept as 16 bytes.  Give either ``licensee`` (hashed here, never stored) or the
    32-byte ``licensee_hash``; if both, they must agree.  ``flags`` takes a
    :class:`LicenseFlags` or an int.  Every field is checked on construction: a value
    the block cannot hold raises :class:`~aprfast.errors.LayoutError`.
    docs/FORMAT.md §11.1 has the block's bytes.

    Args:
        license_id: A UUID, its 16 bytes or its string.
        licensee_hash: The licensee's SHA-256 (when ``licensee`` is not given).
        issued_at: Unix seconds.
        expires_at: Unix seconds, 0 for never.
        flags: :class:`LicenseFlags` (what :func:`check_license` enforces).
        seat_limit: Concurrent seats allowed (u16).
        inference_limit: Inferences allowed (u32).
        custom_terms: Free-form bytes.
        licensee: The licensee's name, hashed into ``licensee_hash``.

    Raises:
        LayoutError: A value the block cannot hold (a field too large, reserved flag
            bits, an id that is not 16 bytes or a UUID, a hash that is not 32 bytes
            or disagrees with ``licensee``).
        TypeError: A field of the wrong type.

    Examples:
        >>> from aprfast.v1.licensing import License, LicenseFlags
        >>> lic = License(license_id="12345678-1234-5678-1234-567812345678", licensee="alice",
        ...               expires_at=86400, seat_limit=5,
        ...               flags=LicenseFlags.EXPIRATION_ENFORCED | LicenseFlags.SEATS_ENFORCED)
        >>> str(lic.uuid), lic.is_for("alice"), lic.seat_limit
        ('12345678-1234-5678-1234-567812345678', True, 5)
        >>> License(license_id=b"short", licensee="alice")
        Traceback (most recent call last):
        ...
        aprfast.errors.LayoutError: [E001] license_id must be 16 bytes, got 5
    """

    license_id: bytes
    licensee_hash: bytes = b""
    issued_at: int = 0
    expires_at: int = 0
    flags: LicenseFlags = LicenseFlags(0)
    seat_limit: int = 0
    inference_limit: int = 0
    custom_terms: bytes = b""
    licensee: InitVar[str | bytes | None] = None

    def __post_init__(self, licensee):
        def normalise(name, value):  # the dataclass is frozen: fields are set once, here
            object.__setattr__(self, name, value)

        normalise("license_id", _uuid_bytes(self.license_id))
        normalise("licensee_hash", _licensee_hash_field(self.licensee_hash, licensee))
        normalise("custom_terms", _bytes_field("custom_terms", self.custom_terms))
        for name in ("issued_at", "expires_at", "flags", "seat_limit", "inference_limit"):
            normalise(name, _int_field(name, getattr(self, name)))
        _raise_first_problem(LayoutError, self.issued_at, self.expires_at, self.flags,
                             self.seat_limit, self.inference_limit, len(self.custom_terms))
        normalise("flags", LicenseFlags(self.flags))

    @classmethod
    def issue(cls, licensee, *, expires_at: int = 0, flags=LicenseFlags(0), seat_limit: int = 0,
              inference_limit: int = 0, custom_terms: bytes = b"", now=None) -> "License":
        """A new license with a random (version 4) id, issued now.

        Args:
            licensee: The licensee's name (str or bytes).
            expires_at: Unix seconds, 0 for never.
            flags: :class:`LicenseFlags`.
            seat_limit: Concurrent seats allowed.
            inference_limit: Inferences allowed.
            custom_terms: Free-form bytes.
            now: ``issued_at`` (default: the clock).

        Returns:
            A :class:`License`.

        Raises:
            LayoutError: A value the block cannot hold.

        Examples:
            >>> from aprfast.v1.licensing import License
            >>> lic = License.issue("alice", now=1700000000)
            >>> lic.issued_at, lic.uuid.version
            (1700000000, 4)
        """
        issued = int(time.time()) if now is None else now
        return cls(license_id=_uuid.uuid4(), licensee=licensee, issued_at=issued,
                   expires_at=expires_at, flags=flags, seat_limit=seat_limit,
                   inference_limit=inference_limit, custom_terms=custom_terms)

    @property
    def uuid(self) -> _uuid.UUID:
        """``license_id`` as a :class:`uuid.UUID`."""
        return _uuid.UUID(bytes=self.license_id)

    def is_for(self, licensee) -> bool:
        """Whether ``licensee`` hashes to this license's ``licensee_hash``.

        Args:
            licensee: A name (str) or bytes.

        Returns:
            True when it is this license's licensee (compared in constant time).

        Examples:
            >>> from aprfast.v1.licensing import License
            >>> License.issue("alice").is_for("bob")
            False
        """
        return hmac.compare_digest(licensee_hash(licensee), self.licensee_hash)


def _uuid_bytes(value) -> bytes:
    if isinstance(value, _uuid.UUID):
        return value.bytes
    if isinstance(value, str):
        try:
            return _uuid.UUID(value).bytes
        except ValueError:
            raise LayoutError(f"license_id {value!r} is not a UUID") from None
    if isinstance(value, (bytes, bytearray, memoryview)):
        value = bytes(value)
        if len(value) != 16:
            raise LayoutError(f"license_id must be 16 bytes, got {len(value)}")
        return value
    raise TypeError(f"license_id is a uuid.UUID, 16 bytes or a UUID string, not {type(value).__name__}")


def _licensee_hash_field(stored, licensee) -> bytes:
    stored = _bytes_field("licensee_hash", stored)
    if licensee is None:
        if len(stored) != 32:
            raise LayoutError(f"a license needs a licensee or a 32-byte licensee_hash, got {len(stored)} bytes")
        return stored
    computed = licensee_hash(licensee)
    if stored and not hmac.compare_digest(stored, computed):
        raise LayoutError("licensee_hash is not the SHA-256 of the licensee given with it")
    return computed


def _bytes_field(name, value) -> bytes:
    if not isinstance(value, (bytes, bytearray, memoryview)):
        raise TypeError(f"{name} is bytes, not {type(value).__name__}")
    return bytes(value)


def _int_field(name, value) -> int:
    # bool is an int to Python but never a count or a time here.
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} is an int, not {type(value).__name__}")
    return int(value)


def _field_problem(issued_at, expires_at, flags, seat_limit, inference_limit, terms_len):
    """What makes these numbers unrepresentable in a block, or None."""
    for name, value, top, width in (("issued_at", issued_at, _U64, "u64"),
                                    ("expires_at", expires_at, _U64, "u64"),
                                    ("seat_limit", seat_limit, _U16, "u16"),
                                    ("inference_limit", inference_limit, _U32, "u32"),
                                    ("custom_terms length", terms_len, _U32, "u32")):
        if not 0 <= value <= top:
            return f"{name} {value} does not fit a {width}"
    if not 0 <= flags <= 0xFF:
        return f"flags {flags} does not fit a u8"
    if flags & ~_DEFINED_FLAGS:
        return f"flags 0x{flags:02x} set reserved bits 0x{flags & ~_DEFINED_FLAGS:02x} (bits 6-7 must be zero)"
    return None


def _raise_first_problem(error_cls, *fields, path=None):
    problem = _field_problem(*fields)
    if problem is not None:
        raise error_cls(f"license block: {problem}", path=path)


def _check_custom_terms_limit(size, limit, path=None):
    if size > limit:
        raise LimitError(f"license block: custom terms of {size} bytes exceed the limit of {limit} "
                         f"(aprfast.v1.licensing.MAX_CUSTOM_TERMS_SIZE)", path=path)


# ---------------------------------------------------------------------------- the block


def encode_license_block(lic: License) -> bytes:
    """The binary license block of ``lic`` (layout in the module docstring).  Custom
    terms beyond :data:`MAX_CUSTOM_TERMS_SIZE` are refused (E008), as a reader would.

    Args:
        lic: The license.

    Returns:
        :data:`LICENSE_BLOCK_FIXED_SIZE` (75) bytes plus the custom terms.

    Raises:
        LimitError: Custom terms beyond :data:`MAX_CUSTOM_TERMS_SIZE`.

    Examples:
        >>> from aprfast.v1.licensing import License, LicenseFlags
        >>> lic = License(license_id="12345678-1234-5678-1234-567812345678", licensee="alice",
        ...               expires_at=86400, seat_limit=5,
        ...               flags=LicenseFlags.EXPIRATION_ENFORCED | LicenseFlags.SEATS_ENFORCED)
        >>> from aprfast.v1.licensing import encode_license_block
        >>> len(encode_license_block(lic))
        75
    """
    _check_custom_terms_limit(len(lic.custom_terms), MAX_CUSTOM_TERMS_SIZE)
    fixed = _FIXED.pack(lic.license_id, lic.licensee_hash, lic.issued_at, lic.expires_at,
                        int(lic.flags), lic.seat_limit, lic.inference_limit, len(lic.custom_terms))
    return fixed + lic.custom_terms


def read_license_block(data, offset: int = 0, *, max_custom_terms: int | None = None, path=None):
    """Parse the block that starts at ``offset`` of ``data``; return ``(License, end)``.

    Every length is checked against the bytes present before anything is sliced:
    truncation and reserved flag bits are
    :class:`~aprfast.errors.CorruptError` (E002), custom terms longer than
    ``max_custom_terms`` (default :data:`MAX_CUSTOM_TERMS_SIZE`) are
    :class:`~aprfast.errors.LimitError` (E008), as for every other limit of aprfast.

    Args:
        data: A bytes-like object holding the block.
        offset: Where the block starts in ``data``.
        max_custom_terms: Most bytes of custom terms accepted.
        path: The file's path, named in errors.

    Returns:
        ``(License, end)``: the license and the offset just past the block.

    Raises:
        CorruptError: A truncated block, an offset outside ``data``, or reserved bits.
        LimitError: Custom terms beyond ``max_custom_terms``.

    Examples:
        >>> from aprfast.v1.licensing import License, LicenseFlags
        >>> lic = License(license_id="12345678-1234-5678-1234-567812345678", licensee="alice",
        ...               expires_at=86400, seat_limit=5,
        ...               flags=LicenseFlags.EXPIRATION_ENFORCED | LicenseFlags.SEATS_ENFORCED)
        >>> from aprfast.v1.licensing import encode_license_block, read_license_block
        >>> found, end = read_license_block(b"xx" + encode_license_block(lic), 2)
        >>> found == lic, end
        (True, 77)
    """
    view = memoryview(data).cast("B")
    limit = MAX_CUSTOM_TERMS_SIZE if max_custom_terms is None else max_custom_terms
    if not 0 <= offset <= len(view):
        raise CorruptError(f"license block offset {offset} is outside the {len(view)} bytes given", path=path)
    available = len(view) - offset
    if available < LICENSE_BLOCK_FIXED_SIZE:
        raise CorruptError(f"license block truncated: its fixed fields need {LICENSE_BLOCK_FIXED_SIZE} "
                           f"bytes at offset {offset}, only {available} present", path=path)
    (license_id, holder_hash, issued_at, expires_at, flags, seat_limit, inference_limit,
     terms_len) = _FIXED.unpack_from(view, offset)
    _raise_first_problem(CorruptError, issued_at, expires_at, flags, seat_limit, inference_limit,
                         terms_len, path=path)
    terms_start = offset + LICENSE_BLOCK_FIXED_SIZE
    if terms_len > len(view) - terms_start:
        raise CorruptError(f"license block truncated: custom_terms_len says {terms_len} bytes, only "
                           f"{len(view) - terms_start} follow at offset {terms_start}", path=path)
    _check_custom_terms_limit(terms_len, limit, path=path)
    end = terms_start + terms_len
    lic = License(license_id, holder_hash, issued_at, expires_at, flags, seat_limit,
                  inference_limit, bytes(view[terms_start:end]))
    return lic, end


def decode_license_block(data, *, max_custom_terms: int | None = None, path=None) -> License:
    """The license in ``data``, which must be exactly one block (trailing bytes are E002).

    Args:
        data: A bytes-like object holding exactly one block.
        max_custom_terms: Most bytes of custom terms accepted.
        path: The file's path, named in errors.

    Returns:
        The :class:`License`.

    Raises:
        CorruptError: A truncated block, trailing bytes, or reserved bits.
        LimitError: Custom terms beyond ``max_custom_terms``.

    Examples:
        >>> from aprfast.v1.licensing import License, LicenseFlags
        >>> lic = License(license_id="12345678-1234-5678-1234-567812345678", licensee="alice",
        ...               expires_at=86400, seat_limit=5,
        ...               flags=LicenseFlags.EXPIRATION_ENFORCED | LicenseFlags.SEATS_ENFORCED)
        >>> from aprfast.v1.licensing import decode_license_block, encode_license_block
        >>> decode_license_block(encode_license_block(lic)) == lic
        True
        >>> decode_license_block(encode_license_block(lic) + b"x")
        Traceback (most recent call last):
        ...
        aprfast.errors.CorruptError: [E002] license block is 75 bytes but 76 were given (1 trailing)
    """
    lic, end = read_license_block(data, 0, max_custom_terms=max_custom_terms, path=path)
    size = memoryview(data).nbytes
    if end != size:
        raise CorruptError(f"license block is {end} bytes but {size} were given "
                           f"({size - end} trailing)", path=path)
    return lic


def license_digest(lic: License) -> str:
    """Lowercase hex SHA-256 of the encoded block: the ``hash`` of aprender's entry.

    Args:
        lic: The license.

    Returns:
        64 hex digits.

    Raises:
        LimitError: Custom terms beyond :data:`MAX_CUSTOM_TERMS_SIZE`.

    Examples:
        >>> from aprfast.v1.licensing import License, LicenseFlags
        >>> lic = License(license_id="12345678-1234-5678-1234-567812345678", licensee="alice",
        ...               expires_at=86400, seat_limit=5,
        ...               flags=LicenseFlags.EXPIRATION_ENFORCED | LicenseFlags.SEATS_ENFORCED)
        >>> from aprfast.v1.licensing import license_digest
        >>> license_digest(lic)[:16]
        'ce25e5b678dc21a7'
    """
    return hashlib.sha256(encode_license_block(lic)).hexdigest()


# ------------------------------------------------------------ aprender's MessagePack entry


def to_aprender_entry(lic: License, *, tier: str = "Enterprise", licensee_name=None) -> dict:
    """aprender's ``LicenseInfo`` for ``lic``, as a dict ready for ``msgpack.packb``.

    Keys in aprender's declaration order, optional ones left out when ``None`` (its
    ``skip_serializing_if``), so the packed bytes equal ``rmp_serde::to_vec_named``'s:

    * ``uuid``: hyphenated lowercase UUID string;
    * ``hash``: :func:`license_digest`, hex SHA-256 of the binary block;
    * ``expiry``: ISO 8601 UTC ``YYYY-MM-DDTHH:MM:SSZ`` of ``expires_at``, present only
      when EXPIRATION_ENFORCED is set and ``expires_at`` is not 0 (aprender: "None for
      perpetual");
    * ``seats``: ``seat_limit``, present only when SEATS_ENFORCED is set ("None for
      unlimited");
    * ``licensee``: ``licensee_name`` when given; it must hash to ``licensee_hash``,
      since the block keeps only the hash;
    * ``tier``: one of :data:`LICENSE_TIERS` (the block has no tier).

    docs/FORMAT.md §11.3.

    Args:
        lic: The license.
        tier: One of :data:`LICENSE_TIERS`.
        licensee_name: The licensee's name, stored in clear in the entry.

    Returns:
        A dict in aprender's key order.

    Raises:
        LayoutError: An unknown tier, a name that does not hash to ``licensee_hash``,
            or an expiry after 9999-12-31.
        TypeError: ``licensee_name`` is not a str.

    Examples:
        >>> from aprfast.v1.licensing import License, LicenseFlags
        >>> lic = License(license_id="12345678-1234-5678-1234-567812345678", licensee="alice",
        ...               expires_at=86400, seat_limit=5,
        ...               flags=LicenseFlags.EXPIRATION_ENFORCED | LicenseFlags.SEATS_ENFORCED)
        >>> from aprfast.v1.licensing import to_aprender_entry
        >>> entry = to_aprender_entry(lic, licensee_name="alice")
        >>> list(entry), entry["expiry"]
        (['uuid', 'hash', 'expiry', 'seats', 'licensee', 'tier'], '1970-01-02T00:00:00Z')
    """
    if tier not in LICENSE_TIERS:
        raise LayoutError(f"tier {tier!r} is not one of aprender's {', '.join(LICENSE_TIERS)}")
    entry = {"uuid": str(lic.uuid), "hash": license_digest(lic)}
    if _enforced_expiry(lic) is not None:
        entry["expiry"] = _iso_utc(lic.expires_at)
    if _enforced_seats(lic) is not None:
        entry["seats"] = lic.seat_limit
    if licensee_name is not None:
        if not isinstance(licensee_name, str):
            raise TypeError(f"licensee_name is a str, not {type(licensee_name).__name__}")
        if not lic.is_for(licensee_name):
            raise LayoutError(f"licensee_name {licensee_name!r} does not hash to the license's licensee_hash")
        entry["licensee"] = licensee_name
    entry["tier"] = tier
    return entry


def _enforced_expiry(lic: License) -> int | None:
    return lic.expires_at if LicenseFlags.EXPIRATION_ENFORCED in lic.flags and lic.expires_at else None


def _enforced_seats(lic: License) -> int | None:
    return lic.seat_limit if LicenseFlags.SEATS_ENFORCED in lic.flags else None


def _iso_utc(seconds: int) -> str:
    if seconds > _LAST_ISO_SECOND:
        raise LayoutError(f"expires_at {seconds} is after 9999-12-31, which ISO 8601 cannot spell")
    moment = _dt.datetime(1970, 1, 1, tzinfo=_dt.timezone.utc) + _dt.timedelta(seconds=seconds)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class AprenderLicenseEntry:
    """A checked copy of aprender's ``license`` entry.  ``as_dict()`` gives the entry back
    in aprender's key order without the ``None`` fields.  Made by :func:`from_aprender_entry`.

    Examples:
        >>> from aprfast.v1.licensing import License, LicenseFlags
        >>> lic = License(license_id="12345678-1234-5678-1234-567812345678", licensee="alice",
        ...               expires_at=86400, seat_limit=5,
        ...               flags=LicenseFlags.EXPIRATION_ENFORCED | LicenseFlags.SEATS_ENFORCED)
        >>> from aprfast.v1.licensing import from_aprender_entry, to_aprender_entry
        >>> entry = from_aprender_entry(to_aprender_entry(lic))
        >>> entry.tier, entry.seats, entry.expires_at, entry.matches(lic)
        ('Enterprise', 5, 86400, True)
    """

    uuid: str
    hash: str
    tier: str
    expiry: str | None = None
    seats: int | None = None
    licensee: str | None = None

    def as_dict(self) -> dict:
        """The entry as aprender stores it: its key order, ``None`` fields left out.

        Examples:
            >>> from aprfast.v1.licensing import AprenderLicenseEntry
            >>> AprenderLicenseEntry(uuid="u", hash="h", tier="Team").as_dict()
            {'uuid': 'u', 'hash': 'h', 'tier': 'Team'}
        """
        entry = {"uuid": self.uuid, "hash": self.hash}
        for key in ("expiry", "seats", "licensee"):
            if getattr(self, key) is not None:
                entry[key] = getattr(self, key)
        entry["tier"] = self.tier
        return entry

    @property
    def expires_at(self) -> int | None:
        """``expiry`` as unix seconds (None when perpetual).  A date without a time is
        midnight UTC, a time without an offset is UTC; anything else not ISO 8601 is E002.

        Raises:
            CorruptError: ``expiry`` is not ISO 8601.

        Examples:
            >>> from aprfast.v1.licensing import AprenderLicenseEntry
            >>> AprenderLicenseEntry(uuid="u", hash="h", tier="Team", expiry="1970-01-02").expires_at
            86400
        """
        return None if self.expiry is None else _parse_iso(self.expiry)

    def matches(self, lic: License) -> bool:
        """Whether this entry describes ``lic``: the same id, the hash of its block (which
        covers every field), the expiry and seats it enforces, and its licensee if named.
        The hashes are compared as bytes: compare_digest refuses non-ASCII str.

        Args:
            lic: The license (from the file's block).

        Returns:
            True when they agree; False otherwise (also for a malformed uuid or expiry).

        Examples:
            >>> from aprfast.v1.licensing import License, from_aprender_entry, to_aprender_entry
            >>> entry = from_aprender_entry(to_aprender_entry(License.issue("alice")))
            >>> entry.matches(License.issue("alice"))  # another id
            False
        """
        try:
            same_id = _uuid.UUID(self.uuid).bytes == lic.license_id
            expiry = self.expires_at
        except (ValueError, CorruptError):
            return False
        return (same_id and hmac.compare_digest(self.hash.lower().encode("utf-8"), license_digest(lic).encode("ascii"))
                and self.seats == _enforced_seats(lic) and expiry == _enforced_expiry(lic)
                and (self.licensee is None or lic.is_for(self.licensee)))


def from_aprender_entry(entry, *, path=None) -> AprenderLicenseEntry:
    """Read aprender's ``license`` entry as serde would: ``uuid``, ``hash`` and ``tier``
    required, ``expiry``/``seats``/``licensee`` optional (absent or nil), unknown keys
    ignored; a wrong type or an unknown tier is :class:`~aprfast.errors.CorruptError`.

    Args:
        entry: The decoded MessagePack map.
        path: The file's path, named in errors.

    Returns:
        An :class:`AprenderLicenseEntry`.

    Raises:
        CorruptError: Not a map, a required key missing, a wrong type, seats beyond a
            u32, or an unknown tier.

    Examples:
        >>> from aprfast.v1.licensing import from_aprender_entry
        >>> from_aprender_entry({"uuid": "u", "hash": "h", "tier": "Academic", "x": 1}).tier
        'Academic'
        >>> from_aprender_entry({"uuid": "u", "hash": "h"})
        Traceback (most recent call last):
        ...
        aprfast.errors.CorruptError: [E002] license entry has no 'tier'
    """
    if not isinstance(entry, dict):
        raise CorruptError(f"license entry is a map, not {type(entry).__name__}", path=path)

    def field(key, kinds, required):
        value = entry.get(key)
        if value is None:
            if required:
                raise CorruptError(f"license entry has no {key!r}", path=path)
            return None
        if isinstance(value, bool) or not isinstance(value, kinds):
            raise CorruptError(f"license entry {key!r} is {type(value).__name__}, "
                               f"expected {kinds.__name__}", path=path)
        return value

    seats = field("seats", int, False)
    if seats is not None and not 0 <= seats <= _U32:
        raise CorruptError(f"license entry seats {seats} does not fit aprender's u32", path=path)
    tier = field("tier", str, True)
    if tier not in LICENSE_TIERS:
        raise CorruptError(f"license entry tier {tier!r} is not one of {', '.join(LICENSE_TIERS)}", path=path)
    return AprenderLicenseEntry(uuid=field("uuid", str, True), hash=field("hash", str, True), tier=tier,
                                expiry=field("expiry", str, False), seats=seats,
                                licensee=field("licensee", str, False))


def _parse_iso(text: str) -> int:
    # Python 3.9/3.10 fromisoformat knows neither "Z" nor date-only strings as datetimes.
    normal = text[:-1] + "+00:00" if text.endswith(("Z", "z")) else text
    try:
        if len(normal) == 10:
            moment = _dt.datetime.combine(_dt.date.fromisoformat(normal), _dt.time())
        else:
            moment = _dt.datetime.fromisoformat(normal)
    except ValueError:
        raise CorruptError(f"license entry expiry {text!r} is not an ISO 8601 date or time") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=_dt.timezone.utc)
    return int(moment.timestamp())


# ---------------------------------------------------------------------------- enforcement


def check_license(lic: License, *, now=None, seats_in_use=None, inferences_used=None,
                  licensee=None) -> None:
    """Refuse, with :class:`LicenseError`, a use the license does not allow.

    * EXPIRATION_ENFORCED: refused once ``now >= expires_at`` (``now`` defaults to the
      clock; ``expires_at == 0`` never expires).
    * SEATS_ENFORCED: refused when ``seats_in_use > seat_limit`` (count the seat being
      taken).
    * INFERENCE_LIMITED: refused when ``inferences_used >= inference_limit``, i.e. pass
      the number already run before running one more (:class:`InferenceCounter` does it).
    * ``licensee``: when given, it must hash to ``licensee_hash`` whatever the flags.

    aprfast cannot know how many seats or inferences are in use elsewhere: a count that
    is not passed is not checked.  REVOCABLE needs the seller's service and
    TRANSFERABLE and WATERMARKED restrict nothing, so they are not checked here.  Every
    violated term is named in one message, with the numbers.  docs/FORMAT.md §11.2.

    Args:
        lic: The license.
        now: Unix seconds (default: the clock).
        seats_in_use: Seats in use, counting the one being taken.
        inferences_used: Inferences already run.
        licensee: A name that must be the license's licensee.

    Returns:
        None: the use is allowed.

    Raises:
        LicenseError: A term refuses this use.

    Examples:
        >>> from aprfast.v1.licensing import License, LicenseFlags
        >>> lic = License(license_id="12345678-1234-5678-1234-567812345678", licensee="alice",
        ...               expires_at=86400, seat_limit=5,
        ...               flags=LicenseFlags.EXPIRATION_ENFORCED | LicenseFlags.SEATS_ENFORCED)
        >>> from aprfast.v1.licensing import check_license
        >>> check_license(lic, now=10, seats_in_use=5, licensee="alice")
        >>> check_license(lic, now=86400, seats_in_use=6)
        Traceback (most recent call last):
        ...
        aprfast.errors.LicenseError: [E006] license ... refused: expired at ...; seat limit exceeded: ...
    """
    problems = []
    if licensee is not None and not lic.is_for(licensee):
        problems.append("the licensee does not match the license's licensee_hash")
    if LicenseFlags.EXPIRATION_ENFORCED in lic.flags and lic.expires_at:
        current = int(time.time()) if now is None else now
        if current >= lic.expires_at:
            problems.append(f"expired at {_describe_time(lic.expires_at)} "
                            f"(expires_at={lic.expires_at}, now={current})")
    if (LicenseFlags.SEATS_ENFORCED in lic.flags and seats_in_use is not None
            and seats_in_use > lic.seat_limit):
        problems.append(f"seat limit exceeded: {seats_in_use} seats in use, seat_limit={lic.seat_limit}")
    if (LicenseFlags.INFERENCE_LIMITED in lic.flags and inferences_used is not None
            and inferences_used >= lic.inference_limit):
        problems.append(f"inference limit reached: {inferences_used} inferences used, "
                        f"inference_limit={lic.inference_limit}")
    if problems:
        raise LicenseError(f"license {lic.uuid} refused: " + "; ".join(problems))


def _describe_time(seconds: int) -> str:
    try:
        return _iso_utc(seconds)
    except LayoutError:
        return f"unix {seconds}"


class InferenceCounter:
    """Counts inferences against a license, in this process only, safely across threads.

    ``consume(n)`` before running ``n`` inferences: it refuses (and counts nothing) when
    they would go past ``inference_limit`` or the license has expired.  Persisting
    ``used`` across runs is the caller's job: pass it back as ``used=``.

    Args:
        lic: The license.
        used: Inferences already run (persisted by the caller).

    Examples:
        >>> from aprfast.v1.licensing import InferenceCounter, License, LicenseFlags
        >>> counter = InferenceCounter(License.issue("alice", inference_limit=2,
        ...                                          flags=LicenseFlags.INFERENCE_LIMITED))
        >>> counter.consume()
        >>> counter.used, counter.remaining
        (1, 1)
        >>> counter.consume(2)
        Traceback (most recent call last):
        ...
        aprfast.errors.LicenseError: [E006] license ... refused: inference limit reached: ...
    """

    def __init__(self, lic: License, used: int = 0):
        self.license = lic
        self._used = used
        self._lock = threading.Lock()

    @property
    def used(self) -> int:
        """Inferences counted so far (including ``used=`` given at construction)."""
        return self._used

    @property
    def remaining(self) -> int | None:
        """Inferences still allowed, or None when the license does not limit them."""
        if LicenseFlags.INFERENCE_LIMITED not in self.license.flags:
            return None
        return max(0, self.license.inference_limit - self._used)

    def consume(self, n: int = 1, *, now=None) -> None:
        """Count ``n`` inferences about to run, or refuse them.

        Args:
            n: Inferences about to run.
            now: Unix seconds for the expiry check (default: the clock).

        Raises:
            LicenseError: The license has expired or ``n`` more would pass the limit
                (nothing is counted).
            ValueError: ``n`` is negative.

        Examples:
            >>> from aprfast.v1.licensing import InferenceCounter, License
            >>> counter = InferenceCounter(License.issue("alice"))
            >>> counter.consume(3)
            >>> counter.used, counter.remaining  # no INFERENCE_LIMITED flag: no limit
            (3, None)
        """
        if n < 0:
            raise ValueError(f"cannot consume {n} inferences")
        with self._lock:
            check_license(self.license, now=now)
            remaining = self.remaining
            if remaining is not None and n > remaining:
                raise LicenseError(f"license {self.license.uuid} refused: inference limit reached: "
                                   f"{self._used} inferences used, {n} more requested, "
                                   f"inference_limit={self.license.inference_limit}")
            self._used += n


# ---------------------------------------------------------------------------- compliance

# The seed's keys (§8.7), in its order, with the JSON type each must have.
_COMPLIANCE_FIELDS = (("gdpr_training_consent", bool), ("data_retention_policy", str),
                      ("model_card_url", str), ("bias_audit_date", str), ("export_control", str))


def compliance_metadata(*, gdpr_training_consent=None, data_retention_policy=None,
                        model_card_url=None, bias_audit_date=None, export_control=None,
                        **extra) -> dict:
    """The seed's optional ``compliance`` object (§8.7), checked: known keys first in
    the seed's order, ``None`` ones left out, then any ``extra`` keys sorted (so the
    bytes do not depend on argument order).  ``bias_audit_date`` must be an ISO 8601
    date (``YYYY-MM-DD``); extra values must be JSON-representable already.

    aprender has no field for it: in a v1 file it belongs in ``metadata.custom`` under
    ``"compliance"`` (aprender keeps ``custom``, and drops an unknown top-level key when
    it re-saves); in a v2 file an unknown top-level key lands in aprender's flattened
    ``custom`` and survives.  docs/FORMAT.md §11.4.

    Args:
        gdpr_training_consent: A bool.
        data_retention_policy: A str.
        model_card_url: A str.
        bias_audit_date: ``YYYY-MM-DD``.
        export_control: A str.
        **extra: More keys, JSON values.

    Returns:
        A dict.

    Raises:
        TypeError: A known key of the wrong type.
        ValueError: ``bias_audit_date`` is not ``YYYY-MM-DD``.

    Examples:
        >>> from aprfast.v1.licensing import compliance_metadata
        >>> compliance_metadata(bias_audit_date="2024-05-01", gdpr_training_consent=True, team="ml")
        {'gdpr_training_consent': True, 'bias_audit_date': '2024-05-01', 'team': 'ml'}
    """
    given = {"gdpr_training_consent": gdpr_training_consent, "data_retention_policy": data_retention_policy,
             "model_card_url": model_card_url, "bias_audit_date": bias_audit_date,
             "export_control": export_control}
    result = {}
    for key, kind in _COMPLIANCE_FIELDS:
        value = given[key]
        if value is None:
            continue
        if not isinstance(value, kind):
            raise TypeError(f"compliance {key} is a {kind.__name__}, not {type(value).__name__}")
        result[key] = value
    if bias_audit_date is not None:
        try:
            _dt.date.fromisoformat(bias_audit_date)
        except ValueError:
            raise ValueError(f"compliance bias_audit_date {bias_audit_date!r} is not YYYY-MM-DD") from None
    for key in sorted(extra):
        result[key] = extra[key]
    return result
