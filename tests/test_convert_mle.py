"""MLE v2 (seed 003): header, section CRCs and signature checked, the weights imported as
the seed defines them (one opaque section), ``apr inspect``/``apr validate`` on MLE files,
and hostile files refused with typed errors.  Files are built here from the seed's
structs with struct and zlib (docs/FORMAT.md §18 lists what the seed leaves open)."""

import hashlib
import json
import struct
import zlib

import numpy as np
import pytest
from refusals import assert_source_refuses

import aprfast
from aprfast.cli import main as apr
from aprfast.convert import detect, mle
from aprfast.errors import AprError, ChecksumError, CorruptError, FormatError, LimitError, SignatureError, VersionError

FIELDS = "<4sIII10Q4I2I"


def build(metadata=b'{"name":"tiny"}', graph=b"GRPH", weights=np.float32([1, 2]).tobytes(), *, flags=0,
          header_size=128, signature=b"", compression=b"", version=2, min_reader=2, writer=2, reserved=None):
    """An MLE v2 file: header, then metadata, graph, weights, compression, signature."""
    body, offsets, at = b"", {}, header_size
    for name, data in (("metadata", metadata), ("graph", graph), ("weights", weights),
                       ("compression", compression), ("signature", signature)):
        offsets[name] = (at if data else 0, len(data))
        body += data
        at += len(data)
    sections = [v for n in ("metadata", "graph", "weights", "signature", "compression") for v in offsets[n]]
    crcs = [zlib.crc32(metadata), zlib.crc32(graph), zlib.crc32(weights)]
    fixed = struct.pack(FIELDS, b"MLE\0", version, flags, header_size, *sections, *crcs, 0, min_reader, writer)
    header = fixed + (reserved if reserved is not None else bytes(max(0, header_size - len(fixed))))
    header = header[:108] + struct.pack("<I", zlib.crc32(header)) + header[112:]
    return header + body


def signed(seed=bytes(range(32)), **kw):
    """A signed file: Ed25519 over SHA-256(metadata || graph || weights)."""
    meta, graph, weights = kw.get("metadata", b'{"name":"tiny"}'), kw.get("graph", b"GRPH"), \
        kw.get("weights", np.float32([1, 2]).tobytes())
    digest = hashlib.sha256(meta + graph + weights).digest()
    from nacl.signing import SigningKey

    key = SigningKey(seed)
    sig = key.sign(digest).signature
    block = struct.pack("<BBHQ32s64s32s", 1, 1, 0, 1_700_000_000, bytes(key.verify_key), sig, digest)
    return build(flags=0x04, signature=block, **kw), bytes(key.verify_key)


# magic "MLE\0", version 2, flags 0, header_size 128; metadata at 128 (15 bytes), graph at 143
# (4), weights at 147 (8), no signature or compression; CRC-32s of the three sections; the
# header CRC (taken with its own field zeroed); min reader 2, writer 2; 8 reserved zero bytes.
GOLDEN = bytes.fromhex(
    "4d4c450002000000000000008000000080000000000000000f000000000000008f000000000000000400000000000000930000000000"
    "000008000000000000000000000000000000000000000000000000000000000000000000000000000000c22e7b25b0d1038a76a53f2e"
    "b42d4362020000000200000000000000000000007b226e616d65223a2274696e79227d475250480000803f00000040")


def test_golden_bytes_are_the_seeds_struct():
    assert build() == GOLDEN
    magic, version, flags, header_size = struct.unpack_from("<IIII", GOLDEN)
    assert (magic, version, flags, header_size) == (0x00454C4D, 2, 0, 128)


def test_golden_inspects_validates_and_imports(tmp_path):
    path = tmp_path / "m.mle"
    path.write_bytes(GOLDEN)
    assert detect(path) == "mle"
    report = mle.inspect_mle(path)
    assert report["version"] == 2 and report["metadata"] == {"name": "tiny"} and report["features"] == []
    assert report["sections"]["weights"] == {"offset": 147, "size": 8}
    checks = mle.validate_mle(path)
    assert checks["ok"] and [c["status"] for c in checks["checks"]] == ["PASS"] * 5 + ["SKIP"]
    info = aprfast.convert(path, tmp_path / "m.apr", validate="off")
    assert info["source_format"] == "mle"
    with aprfast.open(tmp_path / "m.apr") as f:
        assert f.get_tensor("mle.weights").tobytes() == np.float32([1, 2]).tobytes()
        assert f.get_tensor("mle.graph").tobytes() == b"GRPH"
        assert f.metadata["mle.metadata"] == {"name": "tiny"} and f.metadata["mle.version"] == 2


def test_a_longer_header_and_absent_sections(tmp_path):
    """header_size 144 (the struct as the seed draws it), no graph, empty metadata."""
    path = tmp_path / "m.mle"
    path.write_bytes(build(header_size=144, graph=b"", metadata=b""))
    aprfast.convert(path, tmp_path / "m.apr", validate="off")
    with aprfast.open(tmp_path / "m.apr") as f:
        assert list(f.keys()) == ["mle.weights"] and "mle.metadata" not in f.metadata


def test_signature_is_checked(tmp_path):
    data, public = signed()
    path = tmp_path / "s.mle"
    path.write_bytes(data)
    report = mle.validate_mle(path, trusted_key=public)
    assert report["ok"] and report["checks"][-1]["status"] == "PASS"
    aprfast.convert(path, tmp_path / "s.apr", validate="off")
    with aprfast.open(tmp_path / "s.apr") as f:
        assert f.metadata["mle.signature"]["public_key"] == public.hex()
    assert not mle.validate_mle(path, trusted_key=bytes(32))["ok"]
    # one signature byte changed
    forged = bytearray(data)
    sig_at = struct.unpack_from("<Q", data, 64)[0]
    forged[sig_at + 16 + 32] ^= 1  # one signature byte
    path.write_bytes(bytes(forged))
    report = mle.validate_mle(path)
    assert not report["ok"] and report["checks"][-1]["code"] == "E006"
    with pytest.raises(SignatureError):
        aprfast.convert(path, tmp_path / "f.apr", validate="off")
    assert not (tmp_path / "f.apr").exists()


def test_cli_inspect_and_validate(tmp_path, capsys):
    path = tmp_path / "m.mle"
    path.write_bytes(GOLDEN)
    assert apr(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    assert "MLE v2" in out and "weights" in out
    assert apr(["inspect", "--json", str(path)]) == 0
    assert json.loads(capsys.readouterr().out)["format"] == "mle"
    assert apr(["validate", str(path)]) == 0
    assert "PASS" in capsys.readouterr().out
    damaged = bytearray(GOLDEN)
    damaged[-1] ^= 1
    path.write_bytes(bytes(damaged))
    assert apr(["validate", str(path)]) == 5
    assert "weights_crc" in capsys.readouterr().out


# --- hostile files ---------------------------------------------------------------------------
def refused(tmp_path, data, error=AprError, match=None):
    assert_source_refuses(mle.MLESource, tmp_path / "h.mle", data, error, match)


def test_every_truncation_is_refused(tmp_path):
    for cut in range(len(GOLDEN)):
        refused(tmp_path, GOLDEN[:cut])


def test_every_header_byte_flip_is_refused(tmp_path):
    for i in range(128):
        data = bytearray(GOLDEN)
        data[i] ^= 0x01
        refused(tmp_path, bytes(data))


def test_every_section_byte_flip_is_refused(tmp_path):
    for i in range(128, len(GOLDEN)):
        data = bytearray(GOLDEN)
        data[i] ^= 0x40
        refused(tmp_path, bytes(data), ChecksumError)


@pytest.mark.parametrize("data, error, match", [
    (build(version=1), VersionError, "version 1"),
    (build(version=3), VersionError, "version 3"),
    (build(min_reader=3), VersionError, "reader of version 3"),
    (b"MLF\0" + GOLDEN[4:], FormatError, "not an MLE"),
    (build(header_size=1 << 20), CorruptError, "header_size"),
    (build(flags=0x01), VersionError, "COMPRESSION"),
    (build(flags=0x02), VersionError, "ENCRYPTION"),
    (build(flags=0x04), SignatureError, "no signature"),
    (build(metadata=b'{"a":1,"a":2}'), CorruptError, "twice"),
    (build(metadata=b'{"a":NaN}'), CorruptError, "JSON"),
    (build(metadata=b'\xff'), CorruptError, "UTF-8"),
    (build(flags=0x04, signature=bytes(100)), CorruptError, "shorter"),
    (build(flags=0x04, signature=struct.pack("<BBHQ32s64s32s", 2, 1, 0, 0, bytes(32), bytes(64), bytes(32))),
     SignatureError, "algorithm 2"),
])
def test_hostile_files_are_refused(tmp_path, data, error, match):
    refused(tmp_path, data, error, match)


def fields_changed(**changes):
    """GOLDEN with header fields rewritten (and its CRC fixed), to lie about sections."""
    names = ["magic", "version", "flags", "header_size", "metadata_offset", "metadata_size", "graph_offset",
             "graph_size", "weights_offset", "weights_size", "signature_offset", "signature_size",
             "compression_offset", "compression_size", "c_meta", "c_graph", "c_weights", "c_header",
             "min_reader", "writer"]
    values = dict(zip(names, struct.unpack_from(FIELDS, GOLDEN)))
    values.update(changes)
    header = bytearray(struct.pack(FIELDS, *values.values()) + GOLDEN[120:128])
    header[108:112] = bytes(4)
    header[108:112] = struct.pack("<I", zlib.crc32(bytes(header)))
    return bytes(header) + GOLDEN[128:]


@pytest.mark.parametrize("changes, match", [
    ({"weights_size": 2**63}, "past the end"),
    ({"weights_offset": 2**64 - 4}, "past the end"),
    ({"weights_offset": 100}, "inside"),
    ({"graph_offset": 140}, "overlaps"),
    ({"metadata_size": 2**40}, "past the end"),
    ({"header_size": 100}, "header_size"),
    ({"header_size": 4000}, "header_size"),
])
def test_lying_sections_are_refused_before_reading(tmp_path, changes, match):
    refused(tmp_path, fields_changed(**changes), CorruptError, match)


def test_metadata_larger_than_the_limit(tmp_path, monkeypatch):
    monkeypatch.setattr(mle, "MAX_METADATA_SIZE", 4)
    refused(tmp_path, GOLDEN, LimitError, "more than 4")
