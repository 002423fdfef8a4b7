"""`apr debug`: --hex rows, --strings (runs across read chunks too), the default
checks, and --drama's three acts in plain text when stdout is not a terminal (QA #53),
with its verdict following the checks (exit 5 on a corrupt file, 4 on a non-model)."""

import json

import numpy as np
import pytest

import aprfast
from aprfast import v1
from aprfast.cli import debug as debug_module
from aprfast.cli import main


@pytest.fixture
def model(tmp_path):
    path = tmp_path / "m.apr"
    aprfast.save_file({"encoder.conv1.weight": np.ones((4, 4), np.float32), "decoder.bias": np.zeros(3, np.float32)},
                      path, metadata={"license": "MIT"})
    return path


def test_hex_dumps_the_asked_bytes(model, capsys):
    assert main(["debug", str(model), "--hex", "--limit", "20"]) == 0
    rows = capsys.readouterr().out.splitlines()
    data = model.read_bytes()[:20]
    assert len(rows) == 2
    assert rows[0] == "00000000  " + " ".join(f"{b:02x}" for b in data[:16]) + "  |" + \
        "".join(chr(b) if 32 <= b < 127 else "." for b in data[:16]) + "|"
    assert rows[1].startswith("00000010  " + " ".join(f"{b:02x}" for b in data[16:20]))
    assert main(["debug", str(model), "--hex", "--offset", "16", "--limit", "4", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["hex"] == [rows[1]]


def test_strings_finds_metadata_and_tensor_names(model, capsys):
    assert main(["debug", str(model), "--strings", "--limit", "100"]) == 0
    out = capsys.readouterr().out
    assert "encoder.conv1.weight" in out and '"license":"MIT"' in out.replace(" ", "")
    data = model.read_bytes()
    for line in out.splitlines():
        offset, text = line.split(None, 1)
        assert data[int(offset):int(offset) + len(text)] == text.encode()


def test_strings_spanning_read_chunks_and_the_limit(tmp_path, monkeypatch):
    monkeypatch.setattr(debug_module, "_READ_CHUNK", 7)
    path = tmp_path / "f.bin"
    path.write_bytes(b"\x00\x01hello world\x00ab\x00abcd\xffxyzzy-long-run\x00")
    assert debug_module.find_strings(path, 4, 10) == [(2, "hello world"), (17, "abcd"), (22, "xyzzy-long-run")]
    assert debug_module.find_strings(path, 4, 2) == [(2, "hello world"), (17, "abcd")]
    assert debug_module.find_strings(path, 12, 10) == [(22, "xyzzy-long-run")]


def test_drama_is_plain_text_without_a_terminal(model, capsys, monkeypatch):
    monkeypatch.delenv("APR_COLOR", raising=False)
    assert main(["debug", str(model), "--drama"]) == 0
    out = capsys.readouterr().out
    assert "\x1b[" not in out
    for line in ("====[ DRAMA: m.apr ]====", "ACT I: THE HEADER", "Scene 1: Magic bytes... APR", "ACT II: THE METADATA",
                 "Scene 1: Parameters... 19 (an intimate cast)", "Scene 3: License... present",
                 "ACT III: THE VERDICT", "CURTAIN CALL: Model is PRODUCTION READY!"):
        assert line in out
    monkeypatch.setenv("APR_COLOR", "always")
    assert main(["debug", str(model), "--drama"]) == 0
    assert "\x1b[1mACT I: THE HEADER\x1b[0m" in capsys.readouterr().out


def test_a_flipped_byte_is_a_tragedy(model, capsys):
    with aprfast.open(model) as f:
        offset = f.info("encoder.conv1.weight").offset
    data = bytearray(model.read_bytes())
    data[offset + 3] ^= 0x10
    model.write_bytes(bytes(data))
    assert main(["debug", str(model), "--drama"]) == 5
    out = capsys.readouterr().out
    assert "TRAGEDY: checksum failed" in out and "PRODUCTION READY" not in out
    assert main(["debug", str(model), "--json"]) == 5
    doc = json.loads(capsys.readouterr().out)
    assert {c["name"]: c["status"] for c in doc["checks"]}["checksum"] == "FAIL"


def test_not_a_model_and_missing_file(tmp_path, capsys):
    junk = tmp_path / "junk.apr"
    junk.write_bytes(b"GIF89a" + bytes(64))
    assert main(["debug", str(junk), "--drama"]) == 4
    out = capsys.readouterr().out
    assert "gasps" in out and "TRAGEDY" in out
    assert main(["debug", str(junk)]) == 4
    assert main(["debug", str(tmp_path / "nope.apr")]) == 3
    assert main(["debug", str(junk), "--hex", "--limit", "6"]) == 0  # bytes of any file can be dumped
    assert "|GIF89a|" in capsys.readouterr().out


def test_encrypted_v1_file_checks_the_crc_without_the_key(tmp_path, capsys, monkeypatch):
    path = tmp_path / "e.apr"
    v1.save_model({"w": np.ones(5, np.float32)}, path, password="pw")
    assert main(["debug", str(path), "--drama"]) == 0
    out = capsys.readouterr().out
    assert "Checksum... CRC32 matches" in out and "behind the curtain" in out and "PRODUCTION READY" not in out
    monkeypatch.setenv("APR_DEBUG_PW", "pw")
    assert main(["debug", str(path), "--password-env", "APR_DEBUG_PW", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["summary"]["parameters"] == 5
