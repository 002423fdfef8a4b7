"""MLE v2 (seed 003, MLE Runtime's format): inspect, validate and import the weights.

A file is a fixed header (magic ``MLE\\0``, version 2, feature flags, header size; offset
and size of five sections: JSON metadata, graph IR, weights, signature, compression
metadata; a CRC-32 of the metadata, graph and weights sections and of the header;
minimum reader and writer versions; reserved bytes), then the sections where the header
says.  The seed leaves much undefined (docs/FORMAT.md §18 lists every gap and what
aprfast decided); in short: little-endian, packed structs, CRC-32 = zlib's, the header
CRC taken with its own field zeroed, the signature an Ed25519 signature of the SHA-256
of the metadata, graph and weights sections as stored.

The seed gives the weights section no inner layout, so an import keeps it as it is: one
U8 tensor ``mle.weights`` (and the graph IR as ``mle.graph``), every header fact and the
JSON metadata in the ``.apr`` metadata.  Compressed or encrypted weights are refused (no
algorithm ids, no key format in the seed).
"""

from __future__ import annotations

import hashlib
import json
import os
import struct

from .. import dtypes as _dtypes
from .._crc import crc32
from ..errors import ChecksumError, CorruptError, FormatError, LimitError, SignatureError, VersionError, os_error
from ..limits import MAX_METADATA_SIZE
from ._common import Spec, read_array, read_exact, value_of
from .safetensors import _no_duplicates

__all__ = ["MLEFile", "MLESource", "MAGIC", "inspect_mle", "validate_mle", "is_mle", "FLAGS"]

#: MLE_MAGIC 0x00454C4D, little-endian.
MAGIC = b"MLE\0"
VERSION = 2
#: The named header fields: 4 u32, 10 u64, 6 u32 (120 bytes; reserved bytes follow up to header_size).
FIELDS = struct.Struct("<4sIII10Q4I2I")
#: The seed's header_size; a header may be longer (the struct as drawn is 144 bytes).
HEADER_SIZE = 128
MAX_HEADER_SIZE = 4096
_CRC_AT = 108  # header_checksum
SIGNATURE = struct.Struct("<BBHQ32s64s32s")  # 140 bytes, packed
COMPRESSION = struct.Struct("<BBHQIB3s")  # 20 bytes, packed
FLAGS = {0x01: "COMPRESSION", 0x02: "ENCRYPTION", 0x04: "SIGNING", 0x08: "STREAMING", 0x10: "QUANTIZATION",
         0x20: "EXTENDED_METADATA", 0x40: "CHUNKED_WEIGHTS", 0x80: "MEMORY_MAPPING"}
SECTIONS = ("metadata", "graph", "weights", "signature", "compression")
CHECKSUMMED = ("metadata", "graph", "weights")
_CHUNK = 8 << 20


def is_mle(path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == MAGIC
    except OSError:
        return False


def flag_names(flags: int) -> list:
    names = [name for bit, name in FLAGS.items() if flags & bit]
    unknown = flags & ~sum(FLAGS)
    return names + ([f"0x{unknown:08x}"] if unknown else [])


def _header_crc(header: bytes) -> int:
    return crc32(header[:_CRC_AT] + b"\0\0\0\0" + header[_CRC_AT + 4:])


class MLEFile:
    """An open MLE v2 file: header parsed and its ranges checked against the file (any
    failure raises: FormatError, VersionError, CorruptError, LimitError); CRCs, metadata
    and signature checked on request."""

    def __init__(self, path):
        self.path = os.fspath(path)
        try:
            self._fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except OSError as exc:
            raise os_error(exc, "cannot open MLE file", path=self.path) from exc
        try:
            self._parse()
        except BaseException:
            self.close()
            raise

    def _parse(self) -> None:
        self.size = size = os.fstat(self._fd).st_size
        head = os.pread(self._fd, FIELDS.size, 0)
        if head[:4] != MAGIC:
            raise FormatError(f"not an MLE file (magic {head[:4]!r}, expected {MAGIC!r})", path=self.path)
        if len(head) >= 8 and struct.unpack_from("<I", head, 4)[0] == 1:
            raise VersionError("MLE version 1 (the 64-byte legacy header) is not read: seed 003 does not give "
                               "its layout", path=self.path)
        if len(head) < FIELDS.size:
            raise CorruptError(f"file is {size} bytes, shorter than the {FIELDS.size} bytes of the MLE v2 header "
                               "fields", path=self.path)
        values = FIELDS.unpack(head)
        _, self.version, self.flags, self.header_size = values[:4]
        offsets = values[4:14]
        (self.checksums, self.header_checksum) = (dict(zip(CHECKSUMMED, values[14:17])), values[17])
        self.min_reader_version, self.writer_version = values[18:20]
        if self.version != VERSION:
            raise VersionError(f"MLE version {self.version} is not read (version {VERSION} is)", path=self.path)
        if self.min_reader_version > VERSION:
            raise VersionError(f"the file needs an MLE reader of version {self.min_reader_version} or later; "
                               f"this one is version {VERSION}", path=self.path)
        if not FIELDS.size <= self.header_size <= MAX_HEADER_SIZE:
            raise CorruptError(f"header_size {self.header_size} is outside [{FIELDS.size}, {MAX_HEADER_SIZE}]",
                               path=self.path)
        if self.header_size > size:
            raise CorruptError(f"header_size {self.header_size} runs past the end of the {size}-byte file",
                               path=self.path)
        self.header = read_exact(self._fd, 0, self.header_size, "the MLE header", self.path)
        self.reserved = self.header[FIELDS.size:]
        self.sections = {name: (offsets[2 * i], offsets[2 * i + 1]) for i, name in enumerate(SECTIONS)}
        self._check_ranges()

    def _check_ranges(self) -> None:
        """Each present section (size > 0) after the header and inside the file, no two
        sharing a byte."""
        used = []
        for name, (offset, size) in self.sections.items():
            if size == 0:
                continue
            if offset < self.header_size:
                raise CorruptError(f"{name} section at offset {offset} starts inside the {self.header_size}-byte "
                                   "header", path=self.path)
            if offset + size > self.size:
                raise CorruptError(f"{name} section [{offset}, {offset + size}) runs past the end of the "
                                   f"{self.size}-byte file (truncated?)", path=self.path)
            for other, start, end in used:
                if offset < end and start < offset + size:
                    raise CorruptError(f"{name} section [{offset}, {offset + size}) overlaps the {other} section",
                                       path=self.path)
            used.append((name, offset, offset + size))

    # --- checks ------------------------------------------------------------------------
    def header_crc(self) -> int:
        return _header_crc(self.header)

    def section_crc(self, name: str) -> int:
        offset, size = self.sections[name]
        value, done = 0, 0
        while done < size:
            n = min(_CHUNK, size - done)
            value = crc32(read_exact(self._fd, offset + done, n, f"the {name} section", self.path), value)
            done += n
        return value

    def check_header(self) -> None:
        got = self.header_crc()
        if got != self.header_checksum:
            raise ChecksumError(f"header CRC32 is {got:08x}, the header says {self.header_checksum:08x}",
                                path=self.path)

    def check_section(self, name: str, crc=None) -> None:
        got = self.section_crc(name) if crc is None else crc
        if got != self.checksums[name]:
            raise ChecksumError(f"{name} section CRC32 is {got:08x}, the header says {self.checksums[name]:08x}",
                                path=self.path)

    def section_bytes(self, name: str, limit: int) -> bytes:
        offset, size = self.sections[name]
        if size > limit:
            raise LimitError(f"{name} section is {size} bytes, more than {limit}", path=self.path)
        return read_exact(self._fd, offset, size, f"the {name} section", self.path)

    def json_metadata(self):
        """The metadata section as JSON (None when absent), its CRC checked first."""
        if self.sections["metadata"][1] == 0:
            return None
        data = self.section_bytes("metadata", MAX_METADATA_SIZE)
        self.check_section("metadata", crc32(data))
        return _load_json(data, self.path)

    def signature(self):
        """The signature header's fields (None when the file has no signature section)."""
        if self.sections["signature"][1] == 0:
            return None
        offset, size = self.sections["signature"]
        if size < SIGNATURE.size:
            raise CorruptError(f"signature section is {size} bytes, shorter than the {SIGNATURE.size}-byte "
                               "signature header", path=self.path)
        algorithm, hash_algorithm, reserved, timestamp, public_key, signature, model_hash = SIGNATURE.unpack(
            read_exact(self._fd, offset, SIGNATURE.size, "the signature header", self.path))
        return {"algorithm": algorithm, "hash_algorithm": hash_algorithm, "reserved": reserved,
                "timestamp": timestamp, "public_key": public_key.hex(), "signature": signature.hex(),
                "model_hash": model_hash.hex()}

    def model_hash(self) -> bytes:
        digest = hashlib.sha256()
        for name in CHECKSUMMED:
            offset, size = self.sections[name]
            done = 0
            while done < size:
                n = min(_CHUNK, size - done)
                digest.update(read_exact(self._fd, offset + done, n, f"the {name} section", self.path))
                done += n
        return digest.digest()

    def check_signature(self, trusted_key=None) -> dict:
        """Check the signature section: Ed25519 (1) over SHA-256 (1) of the metadata,
        graph and weights sections; SignatureError when it does not verify, when the
        algorithms are others, or when ``trusted_key`` (32 bytes) is given and the file
        was signed by another key."""
        sig = self.signature()
        if sig is None:
            raise SignatureError("the file has no signature section", path=self.path)
        if sig["algorithm"] != 1 or sig["hash_algorithm"] != 1:
            raise SignatureError(f"signature algorithm {sig['algorithm']} / hash {sig['hash_algorithm']}: only "
                                 "1 (Ed25519) / 1 (SHA-256) are defined", path=self.path)
        digest = self.model_hash()
        if digest.hex() != sig["model_hash"]:
            raise SignatureError(f"model_hash {sig['model_hash']} is not the SHA-256 of the metadata, graph and "
                                 f"weights sections ({digest.hex()})", path=self.path)
        if trusted_key is not None and bytes(trusted_key).hex() != sig["public_key"]:
            raise SignatureError(f"signed by {sig['public_key']}, not the trusted key", path=self.path)
        from ..crypto.core import verify

        try:
            verify([digest], bytes.fromhex(sig["signature"]), bytes.fromhex(sig["public_key"]))
        except SignatureError as exc:
            raise SignatureError(exc.message, path=self.path) from None
        return sig

    def compression(self):
        """The compression header's fields (None when absent)."""
        offset, size = self.sections["compression"]
        if size == 0:
            return None
        if size < COMPRESSION.size:
            raise CorruptError(f"compression section is {size} bytes, shorter than the {COMPRESSION.size}-byte "
                               "compression header", path=self.path)
        kind, level, _, uncompressed, checksum, bits, _ = COMPRESSION.unpack(
            read_exact(self._fd, offset, COMPRESSION.size, "the compression header", self.path))
        return {"type": kind, "level": level, "uncompressed_size": uncompressed, "checksum": checksum,
                "quantization_bits": bits}

    def facts(self) -> dict:
        """Everything the header says, as JSON values."""
        return {"format": "mle", "version": self.version, "feature_flags": self.flags,
                "features": flag_names(self.flags), "header_size": self.header_size,
                "sections": {name: {"offset": o, "size": s} for name, (o, s) in self.sections.items()},
                "checksums": {name: f"{v:08x}" for name, v in self.checksums.items()},
                "header_checksum": f"{self.header_checksum:08x}", "min_reader_version": self.min_reader_version,
                "writer_version": self.writer_version, "reserved_zero": not any(self.reserved),
                "file_size": self.size}

    def close(self) -> None:
        fd, self._fd = getattr(self, "_fd", -1), -1
        if fd >= 0:
            os.close(fd)

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()


def _refuse_constant(token):
    raise ValueError(f"{token} is not JSON")


def _load_json(data: bytes, path):
    """The metadata section: UTF-8 JSON, duplicate keys and NaN/Infinity refused."""
    try:
        return json.loads(data.decode("utf-8"), object_pairs_hook=_no_duplicates, parse_constant=_refuse_constant)
    except CorruptError as exc:
        raise CorruptError(f"metadata section: {exc.message}", path=path) from None
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise CorruptError(f"metadata section is not valid UTF-8 JSON ({type(exc).__name__}: {str(exc)[:200]})",
                           path=path) from None


# --- apr inspect / apr validate ----------------------------------------------------------
def inspect_mle(path) -> dict:
    """Header facts, the JSON metadata and the signature header, nothing verified."""
    with MLEFile(path) as f:
        report = f.facts()
        try:
            report["metadata"] = f.json_metadata()
        except (CorruptError, LimitError) as exc:
            report["metadata_error"] = f"[{exc.code}] {exc.message}"
        report["signature"] = f.signature()
        report["compression"] = f.compression()
    return report


def validate_mle(path, trusted_key=None) -> dict:
    """{"file", "format", "checks": [{"name", "status": PASS/FAIL/SKIP, "detail", "code"}]}:
    the header CRC, each section CRC, the metadata JSON, and the signature."""
    checks = []

    def run(name, action, ok_detail):
        try:
            detail = action()
            checks.append({"name": name, "status": "PASS", "detail": detail or ok_detail, "code": None})
        except (CorruptError, SignatureError, LimitError) as exc:
            checks.append({"name": name, "status": "FAIL", "detail": exc.message, "code": exc.code})

    with MLEFile(path) as f:
        run("header_crc", f.check_header, f"CRC32 {f.header_checksum:08x}")
        for name in CHECKSUMMED:
            if f.sections[name][1] == 0 and f.checksums[name] == 0:
                checks.append({"name": f"{name}_crc", "status": "SKIP", "detail": "section absent", "code": None})
            else:
                run(f"{name}_crc", lambda n=name: f.check_section(n), f"CRC32 {f.checksums[name]:08x}")
        if f.sections["metadata"][1]:
            run("metadata_json", lambda: f.json_metadata() and None, "valid JSON")
        signed = bool(f.flags & 0x04)
        if signed or f.sections["signature"][1]:
            def signature():
                if not signed:
                    raise SignatureError("a signature section without the SIGNING flag")
                sig = f.check_signature(trusted_key)
                return f"Ed25519 signature by {sig['public_key']} verifies"
            run("signature", signature, "")
        else:
            checks.append({"name": "signature", "status": "SKIP", "detail": "not signed", "code": None})
    return {"file": os.fspath(path), "format": "mle", "ok": all(c["status"] != "FAIL" for c in checks),
            "checks": checks}


# --- import ------------------------------------------------------------------------------
class MLESource(MLEFile):
    """An MLE v2 file as a tensor stream: ``mle.graph`` (the graph IR, when present) and
    ``mle.weights``, both U8 and as stored.  The header CRC, the metadata CRC and JSON,
    and the signature (when SIGNING) are checked at open; each section's CRC as it is
    read, so a conversion of a damaged file fails before its destination appears."""

    def _parse(self) -> None:
        super()._parse()
        for bit in (0x01, 0x02):
            if self.flags & bit:
                raise VersionError(f"MLE weights flagged {FLAGS[bit]} are not imported: seed 003 defines no "
                                   f"{'compression type ids' if bit == 1 else 'encryption key format'}",
                                   path=self.path)
        self.check_header()
        meta = self.json_metadata()
        signature = self.check_signature() if self.flags & 0x04 else None
        u8 = _dtypes.by_name("U8")
        self.specs = [Spec(f"mle.{name}", u8, (self.sections[name][1],)) for name in ("graph", "weights")
                      if name == "weights" or self.sections[name][1]]
        facts = self.facts()
        self.metadata = {f"mle.{key}": facts[key] for key in
                         ("version", "feature_flags", "features", "min_reader_version", "writer_version")}
        if meta is not None:
            self.metadata["mle.metadata"] = meta
        if signature is not None:
            self.metadata["mle.signature"] = {k: signature[k] for k in ("public_key", "timestamp", "model_hash")}

    def read(self, spec: Spec, scratch=None):
        name = spec.name[len("mle."):]
        offset, size = self.sections[name]
        raw = read_array(self._fd, offset, size, f"the {name} section", self.path,
                         None if scratch is None else scratch.get(size))
        if name in CHECKSUMMED:
            self.check_section(name, crc32(raw))
        return value_of(spec.dtype, spec.shape, raw)

    def tensors(self, wanted=None):
        for spec in self.specs:
            if wanted is None or spec.name in wanted:
                yield spec.name, self.read(spec)


def format_inspect(path, report) -> str:
    """``apr inspect`` text for an MLE file."""
    lines = [f"{path}: MLE v{report['version']} (MLE Runtime, seed 003), {report['file_size']} bytes, "
             f"header {report['header_size']} bytes",
             f"  features: {' | '.join(report['features']) or 'none'} (0x{report['feature_flags']:08x})",
             f"  versions: min reader {report['min_reader_version']}, writer {report['writer_version']}"]
    for name, where in report["sections"].items():
        if where["size"]:
            crc = report["checksums"].get(name)
            lines.append(f"  {name:<12} offset {where['offset']:>10}  size {where['size']:>10}"
                         + (f"  crc32 {crc}" if crc else ""))
    if report.get("metadata") is not None:
        lines.append("  metadata: " + json.dumps(report["metadata"], ensure_ascii=False)[:200])
    if report.get("metadata_error"):
        lines.append("  metadata: " + report["metadata_error"])
    if report.get("signature"):
        sig = report["signature"]
        lines.append(f"  signature: algorithm {sig['algorithm']}, hash {sig['hash_algorithm']}, "
                     f"key {sig['public_key']}, timestamp {sig['timestamp']} (apr validate checks it)")
    if report.get("compression"):
        lines.append(f"  compression: {report['compression']}")
    return "\n".join(lines)


def format_validate(report) -> str:
    """``apr validate`` text for an MLE file."""
    lines = [f"{report['file']}: MLE v2"]
    for check in report["checks"]:
        code = f" [{check['code']}]" if check.get("code") else ""
        lines.append(f"  {check['status']:<4} {check['name']:<14}{code} {check['detail']}")
    lines.append("  " + ("all checks passed" if report["ok"] else "FAILED"))
    return "\n".join(lines)
