"""Issue 28 item 4: a validation failure (an intact file whose values break a rule) is told
apart from corruption (damaged bytes), by the error class and code (ValidationError, E009,
against CorruptError E002 / ChecksumError E004), by `apr`'s message and exit code, and by
`apr explain`."""

import json

import numpy as np
import pytest

import aprfast
from aprfast.cli import main
from aprfast.convert import TensorValidationError


@pytest.fixture
def good(tmp_path, rng):
    path = tmp_path / "good.apr"
    aprfast.save_file({"encoder.layer_norm.weight": (1 + 0.05 * rng.standard_normal(64)).astype(np.float32),
                       "decoder.token_embedding": rng.normal(0, 0.03, (512, 16)).astype(np.float32)},
                      path, metadata={"n_vocab": 512})
    return path


@pytest.fixture
def failing(tmp_path, rng):
    """Intact bytes, values a rule refuses: NaN in a LayerNorm weight, n_vocab 500 against 512 rows."""
    path = tmp_path / "failing.apr"
    ln = (1 + 0.05 * rng.standard_normal(64)).astype(np.float32)
    ln[3] = np.nan
    aprfast.save_file({"encoder.layer_norm.weight": ln,
                       "decoder.token_embedding": rng.normal(0, 0.03, (512, 16)).astype(np.float32)},
                      path, metadata={"n_vocab": 500})
    return path


def flipped(good, tmp_path):
    """A copy of ``good`` with one data byte flipped: the footer CRC no longer matches."""
    data = bytearray(good.read_bytes())
    # the middle of the file is the embedding's data (most of the file); a 4-aligned offset
    # is a float's lowest mantissa byte, so the value stays finite and only the CRC tells
    data[(len(data) // 2) & ~3] ^= 0x01
    path = tmp_path / "flipped.apr"
    path.write_bytes(bytes(data))
    return path


def truncated(good, tmp_path):
    path = tmp_path / "truncated.apr"
    path.write_bytes(good.read_bytes()[:1000])
    return path


# --- the API ---------------------------------------------------------------------------------
def test_convert_of_a_failing_file_raises_validation_not_corruption(failing, tmp_path):
    with pytest.raises(aprfast.ValidationError) as info:
        aprfast.convert(failing, tmp_path / "out.safetensors")
    err = info.value
    assert isinstance(err, TensorValidationError) and isinstance(err, ValueError)  # the old handlers still catch
    assert not isinstance(err, aprfast.CorruptError)
    assert err.code == "E009" and err.category == "VALIDATION" and str(err).startswith("[E009] ")
    assert not (tmp_path / "out.safetensors").exists()


def test_convert_of_a_damaged_file_raises_corruption_not_validation(good, tmp_path):
    with pytest.raises(aprfast.ChecksumError) as crc:
        aprfast.convert(flipped(good, tmp_path), tmp_path / "a.safetensors")
    with pytest.raises(aprfast.CorruptError) as cut:
        aprfast.convert(truncated(good, tmp_path), tmp_path / "b.safetensors")
    for err in (crc.value, cut.value):
        assert isinstance(err, aprfast.CorruptError) and not isinstance(err, aprfast.ValidationError)
    assert (crc.value.code, cut.value.code) == ("E004", "E002")


def test_a_validation_error_is_exported_and_pickles():
    import pickle

    err = aprfast.ValidationError("tensor 'w' has 1 NaN", path="m.apr")
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is aprfast.ValidationError and str(back) == "[E009] m.apr: tensor 'w' has 1 NaN"
    assert "ValidationError" in aprfast.__all__


# --- apr convert --validate strict ------------------------------------------------------------
def test_apr_convert_exit_codes_and_prefixes(good, failing, tmp_path, capsys):
    out = str(tmp_path / "out.safetensors")
    assert main(["convert", str(failing), out, "--validate", "strict"]) == 5
    err = capsys.readouterr().err
    assert "apr convert: validation failed: [E009]" in err and "[E002]" not in err

    assert main(["convert", str(truncated(good, tmp_path)), out, "--validate", "strict"]) == 4
    err = capsys.readouterr().err
    assert "[E002]" in err and "truncated" in err and "validation failed" not in err

    assert main(["convert", str(flipped(good, tmp_path)), out, "--validate", "strict"]) == 5
    err = capsys.readouterr().err
    assert "[E004]" in err and "damaged" in err and "validation failed" not in err


def test_a_validation_error_from_any_command_exits_5(good, monkeypatch, capsys):
    """The CLI's last resort maps ValidationError to exit 5, not to 4 (format error)."""
    from aprfast.cli import inspect as inspect_command

    def refuse(args):
        raise aprfast.ValidationError("a rule refuses this", path=args.file)

    monkeypatch.setattr(inspect_command, "run", refuse)
    assert main(["inspect", str(good)]) == 5
    assert f"apr inspect: validation failed: [E009] {good}: a rule refuses this" in capsys.readouterr().err


# --- apr validate ------------------------------------------------------------------------------
def test_apr_validate_says_which_kind_of_failure(good, failing, tmp_path, capsys):
    assert main(["validate", str(failing)]) == 5
    out, err = capsys.readouterr()
    assert "[FAIL] nan-check [E009]" in out and "[FAIL] shapes [E009]" in out and "[PASS] checksum" in out
    assert "apr validate: shapes failed: [E009] n_vocab=500" in err
    assert "the file is intact (its CRC32 matches), but its values break a rule (apr explain E009)" in err

    assert main(["validate", "--checksum", str(flipped(good, tmp_path))]) == 5
    out, err = capsys.readouterr()
    assert "[FAIL] checksum [E004]" in out and "E009" not in out + err
    assert "the file's bytes are damaged (apr explain E004)" in err

    assert main(["validate", str(truncated(good, tmp_path))]) == 4  # cannot be read at all: a format error
    err = capsys.readouterr().err
    assert "[E002]" in err and "E009" not in err


def test_apr_validate_json_codes(failing, capsys):
    assert main(["validate", "--json", str(failing)]) == 5
    codes = {c["name"]: (c["status"], c["code"]) for c in json.loads(capsys.readouterr().out)["checks"]}
    assert codes == {"checksum": ("PASS", None), "nan-check": ("FAIL", "E009"), "zero-check": ("PASS", None),
                     "shapes": ("FAIL", "E009")}


# --- apr explain -------------------------------------------------------------------------------
def test_apr_explain_tells_them_apart(capsys):
    assert main(["explain", "E009"]) == 0
    e009 = capsys.readouterr().out
    assert e009.startswith("E009: Validation failed (VALIDATION)")
    assert "intact" in e009 and "E002" in e009 and "exits 5" in e009
    assert main(["explain", "E002"]) == 0
    e002 = capsys.readouterr().out
    assert "Corrupted data" in e002 and "damaged" in e002 and "is E009, not E002" in e002


@pytest.mark.parametrize(("name", "code", "first"), [
    ("ValidationError", "E009", "ValidationError is E009\n"),
    ("TensorValidationError", "E009", "TensorValidationError is E009 (a ValidationError)\n"),
    ("QualityGateError", "E009", "QualityGateError is E009 (a TensorValidationError, a ValidationError)\n"),
    ("CorruptError", "E002", "CorruptError is E002\n"),
    ("ChecksumError", "E004", "ChecksumError is E004 (a CorruptError)\n"),
])
def test_apr_explain_takes_a_class_name(name, code, first, capsys):
    assert main(["explain", name]) == 0
    out = capsys.readouterr().out
    assert out.startswith(first) and f"\n{code}: " in out
    assert main(["explain", "--json", name]) == 0
    e = json.loads(capsys.readouterr().out)
    assert e["class"] == name and e["code"] == code and e["known"]


@pytest.mark.parametrize("name", ["NotAnError", "Exception", "CODES", "os"])
def test_apr_explain_of_other_names_is_unknown(name, capsys):
    assert main(["explain", name]) == 1
    assert "Unknown Error Code" in capsys.readouterr().out
