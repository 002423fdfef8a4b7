"""Every error has its spec code (E001-E008, or aprfast's E009 for validation failures), is
an AprError and the builtin it claims, and survives pickling with code, message and path."""

import pickle

import numpy as np
import pytest

import aprfast
from aprfast import errors
from aprfast.errors import (
    CODES,
    AprError,
    AprFileInUseError,
    AprIOError,
    ChecksumError,
    CorruptError,
    DecryptError,
    FormatError,
    LayoutError,
    LicenseError,
    LimitError,
    ModelTypeMismatchError,
    SignatureError,
    TensorNotFoundError,
    UnknownDTypeError,
    ValidationError,
    VersionError,
)

# class -> (code, builtins it must also be), as documented in aprfast/errors.py.
DOCUMENTED = {
    FormatError: ("E001", (ValueError,)),
    CorruptError: ("E002", (ValueError,)),
    VersionError: ("E003", (ValueError,)),
    ChecksumError: ("E004", (ValueError, CorruptError)),
    DecryptError: ("E005", (ValueError,)),
    SignatureError: ("E006", (ValueError,)),
    AprIOError: ("E007", (OSError,)),
    AprFileInUseError: ("E007", (OSError, PermissionError, AprIOError)),
    LimitError: ("E008", (ValueError,)),
    TensorNotFoundError: ("E001", (KeyError,)),
    UnknownDTypeError: ("E001", (ValueError, FormatError)),
    LayoutError: ("E001", (ValueError,)),
    ModelTypeMismatchError: ("E001", (ValueError, FormatError)),
    LicenseError: ("E006", (PermissionError,)),
    ValidationError: ("E009", (ValueError,)),
}


def test_the_code_table_is_the_specs_then_validation():
    assert CODES == {"E001": "FORMAT", "E002": "CORRUPT", "E003": "VERSION", "E004": "CHECKSUM",
                     "E005": "DECRYPT", "E006": "SIGNATURE", "E007": "IO", "E008": "MEMORY",
                     "E009": "VALIDATION"}


def test_validation_is_not_corruption():
    """Issue 28 item 4: a rule refusing intact values is told apart from damaged bytes."""
    from aprfast.convert import TensorValidationError
    from aprfast.convert.gate import QualityGateError

    assert not issubclass(ValidationError, CorruptError) and not issubclass(CorruptError, ValidationError)
    for cls in (TensorValidationError, QualityGateError):  # the old classes: still caught as before
        assert issubclass(cls, ValidationError) and issubclass(cls, ValueError) and cls.code == "E009"
        assert not issubclass(cls, CorruptError)


def test_every_exported_error_is_documented_here():
    exported = {getattr(errors, name) for name in errors.__all__ if name not in ("CODES", "AprError")}
    assert exported == set(DOCUMENTED)
    for name in errors.__all__:
        if name != "CODES":
            assert getattr(aprfast, name) is getattr(errors, name)


@pytest.mark.parametrize("cls", list(DOCUMENTED), ids=lambda c: c.__name__)
def test_error_class_has_its_code_and_bases(cls):
    code, builtins = DOCUMENTED[cls]
    assert cls.code == code
    assert issubclass(cls, AprError)
    for base in builtins:
        assert issubclass(cls, base), base
    err = cls("something is off", path="/models/m.apr")
    assert err.code == code
    assert err.category == CODES[code]
    assert isinstance(err, AprError) and isinstance(err, Exception)
    for base in builtins:
        assert isinstance(err, base)


def test_every_code_is_used_by_some_class():
    assert {cls.code for cls in DOCUMENTED} == set(CODES)


def test_base_error_defaults_to_e001():
    err = AprError("plain")
    assert err.code == "E001" and str(err) == "[E001] plain" and err.path is None


@pytest.mark.parametrize("cls", list(DOCUMENTED) + [AprError], ids=lambda c: c.__name__)
def test_str_contains_the_code_the_path_and_the_message(cls):
    err = cls("tensor 'w' needs 12 bytes", path="/models/m.apr")
    text = str(err)
    assert f"[{cls.code}]" in text
    assert "/models/m.apr" in text
    assert "tensor 'w' needs 12 bytes" in text
    assert text == f"[{cls.code}] /models/m.apr: tensor 'w' needs 12 bytes"
    assert err.message == "tensor 'w' needs 12 bytes"
    assert err.path == "/models/m.apr"


@pytest.mark.parametrize("cls", list(DOCUMENTED) + [AprError], ids=lambda c: c.__name__)
def test_str_without_a_path_has_the_code_and_message(cls):
    err = cls("bad")
    assert str(err) == f"[{cls.code}] bad"
    assert err.path is None


@pytest.mark.parametrize("cls", list(DOCUMENTED) + [AprError], ids=lambda c: c.__name__)
@pytest.mark.parametrize("path", [None, "/tmp/x.apr"])
def test_errors_pickle_with_code_message_and_path(cls, path):
    err = cls("the index says 40 bytes", path=path)
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        back = pickle.loads(pickle.dumps(err, protocol))
        assert type(back) is cls
        assert back.code == err.code
        assert back.message == err.message
        assert back.path == err.path
        assert str(back) == str(err)


def test_path_objects_are_stored_as_str(tmp_path):
    err = CorruptError("x", path=tmp_path / "m.apr")
    assert err.path == str(tmp_path / "m.apr")
    assert pickle.loads(pickle.dumps(err)).path == str(tmp_path / "m.apr")


def test_key_error_str_is_not_quoted():
    err = TensorNotFoundError("no tensor named 'w'", path="m.apr")
    assert str(err) == "[E001] m.apr: no tensor named 'w'"


def test_real_errors_carry_the_code_and_path(tmp_path):
    path = tmp_path / "m.apr"
    aprfast.save_file({"w": np.ones(4, np.float32)}, path)
    with aprfast.open(path) as f, pytest.raises(TensorNotFoundError) as missing:
        f.get_tensor("nope")
    assert missing.value.path == str(path) and "[E001]" in str(missing.value)

    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(ChecksumError) as bad_crc:
        aprfast.open(path, verify=True)
    assert bad_crc.value.code == "E004" and str(path) in str(bad_crc.value)

    path.write_bytes(b"NOPE" + bytes(100))
    with pytest.raises(FormatError) as bad_magic:
        aprfast.open(path)
    assert bad_magic.value.code == "E001" and str(path) in str(bad_magic.value)

    with pytest.raises(AprIOError) as io_error:
        aprfast.open(tmp_path / "absent.apr")
    assert io_error.value.code == "E007" and isinstance(io_error.value, OSError)


def test_errors_raised_from_a_file_survive_pickling(tmp_path):
    path = tmp_path / "m.apr"
    path.write_bytes(b"APRX" + bytes(100))
    with pytest.raises(FormatError) as info:
        aprfast.open(path)
    back = pickle.loads(pickle.dumps(info.value))
    assert (type(back), back.code, back.message, back.path) == (
        type(info.value), info.value.code, info.value.message, info.value.path)
