"""`apr inspect`: a readable report, --json, --verify, and seed 001 Appendix A's exit codes: 0, 2 usage,
3 file not found, 4 format error (with the E-code), 5 verification failed."""

import json
import os
import shutil

import numpy as np
import pytest

import aprfast
from aprfast import cli

TINY = os.path.join(os.path.dirname(__file__), "..", "examples", "tiny.apr")
TINY_TENSORS = {
    "encoder.bias": ("F32", [16]),
    "encoder.weight": ("F32", [16, 8]),
    "head.bias": ("F16", [4]),
    "head.weight": ("F16", [4, 16]),
    "step": ("I64", []),
}


def test_inspect_prints_the_tensors_and_returns_0(capsys):
    assert cli.main(["inspect", TINY]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    assert "aprender layout" in out
    assert "tensors (5, " in out
    for name, (dtype, shape) in TINY_TENSORS.items():
        line = next(line for line in out.splitlines() if line.strip().startswith(name + " "))
        assert dtype in line
        assert ("x".join(map(str, shape)) or "scalar") in line
    assert '"tiny"' in out  # metadata name
    assert "LAYOUT_ROW_MAJOR" in out


def test_inspect_json_parses_and_lists_5_tensors(capsys):
    assert cli.main(["inspect", "--json", TINY]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    report = json.loads(out)
    assert report["layout"] == "aprender"
    assert len(report["tensors"]) == 5
    assert {n: (t["dtype"], t["shape"]) for n, t in report["tensors"].items()} == {
        n: (d, s) for n, (d, s) in TINY_TENSORS.items()}
    assert report["metadata"]["name"] == "tiny"
    assert report["header"]["tensor_count"] == 5
    assert report["header"]["file_size"] == os.path.getsize(TINY)
    assert report == json.loads(json.dumps(aprfast.inspect(TINY)))


def test_inspect_json_agrees_with_the_reader(capsys):
    cli.main(["inspect", "--json", TINY])
    report = json.loads(capsys.readouterr().out)
    with aprfast.open(TINY) as f:
        for name, t in report["tensors"].items():
            info = f.info(name)
            assert (t["offset"], t["nbytes"]) == (info.offset, info.nbytes)


def test_inspect_an_apr2_file(tmp_path, capsys):
    path = tmp_path / "m.apr"
    aprfast.save_file({"a": np.zeros((2, 3), np.int16), "b": np.ones(4, np.bool_)}, path, {"k": [1, 2]},
                      layout="apr2")
    assert cli.main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    assert "apr2 layout" in out and "I16" in out and "BOOL" in out and "2x3" in out
    assert cli.main(["inspect", "--json", str(path)]) == 0
    assert json.loads(capsys.readouterr().out)["metadata"] == {"apr_version": "2.0.0", "k": [1, 2]}


def corrupt_copies(tmp_path):
    """(file, expected E-code) pairs, each made from tiny.apr."""
    with open(TINY, "rb") as fh:
        data = fh.read()
    cases = []

    header = bytearray(data)
    header[10] ^= 0xFF  # inside the header: its CRC no longer matches
    cases.append(("header_crc.apr", bytes(header), "E004"))
    cases.append(("bad_magic.apr", b"ZZZZ" + data[4:], "E001"))
    cases.append(("truncated.apr", data[:200], "E002"))
    cases.append(("tiny_stub.apr", b"AP", "E001"))

    metadata = bytearray(data)
    metadata[64] = ord("[")  # the metadata JSON is no longer an object
    # keep the header valid: the metadata is not covered by the header CRC
    cases.append(("metadata.apr", bytes(metadata), "E002"))

    out = []
    for name, blob, code in cases:
        path = tmp_path / name
        path.write_bytes(blob)
        out.append((str(path), code))
    return out


def test_corrupt_files_exit_4_with_the_error_code_on_stderr(tmp_path, capsys):
    for path, code in corrupt_copies(tmp_path):
        assert cli.main(["inspect", path]) == 4, path
        out, err = capsys.readouterr()
        assert out == "", path
        assert f"[{code}]" in err, (path, err)
        assert err.startswith("apr: ")
        assert path in err


def test_corrupt_file_with_json_flag_also_exits_4(tmp_path, capsys):
    path = tmp_path / "bad.apr"
    shutil.copy(TINY, path)
    with open(path, "r+b") as fh:
        fh.seek(12)
        fh.write(b"\xff\xff")
    assert cli.main(["inspect", "--json", str(path)]) == 4
    out, err = capsys.readouterr()
    assert out == "" and "[E004]" in err


def test_missing_file_exits_3_with_e007(tmp_path, capsys):
    missing = str(tmp_path / "nope.apr")
    assert cli.main(["inspect", missing]) == 3
    err = capsys.readouterr().err
    assert "[E007]" in err and missing in err


def test_no_arguments_returns_2_with_usage_on_stderr(capsys):
    assert cli.main([]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert "usage" in err.lower() and "inspect" in err


def test_bad_usage_exits_2(capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["inspect"])
    assert info.value.code == 2
    with pytest.raises(SystemExit) as info:
        cli.main(["frobnicate", TINY])
    assert info.value.code == 2


def test_version_flag(capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["--version"])
    assert info.value.code == 0
    assert aprfast.__version__ in capsys.readouterr().out


def test_inspect_shows_tensors_of_unknown_dtype_instead_of_failing(tmp_path, capsys):
    data = bytearray(aprfast.save({"w": np.zeros(4, np.uint8)}, layout="apr2"))
    index_offset = aprfast.inspect(bytes(data))["header"]["index_offset"]
    dtype_at = index_offset + 8 + 2 + len("w")  # index header, name length, name
    assert data[dtype_at] == 7  # U8 in the apr2 table
    data[dtype_at] = 99
    path = tmp_path / "unknown.apr"
    path.write_bytes(bytes(data))
    assert cli.main(["inspect", str(path)]) == 0
    assert "unknown(99)" in capsys.readouterr().out
    assert cli.main(["inspect", "--json", str(path)]) == 0
    assert json.loads(capsys.readouterr().out)["tensors"]["w"]["dtype"] == "unknown(99)"
