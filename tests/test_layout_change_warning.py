"""Issue 28 item 8: signing, encrypting or compressing a file in aprender's layout
writes the APR2 layout, which aprender does not read; that happened without a word.
The API warns (LayoutChangeWarning, a UserWarning) and `apr` prints a line."""

import warnings

import numpy as np
import pytest

import aprfast
from aprfast.cli import main
from aprfast.tools.protection import encrypt_file, sign_file


@pytest.fixture
def aprender_file(tmp_path):
    path = tmp_path / "m.apr"
    aprfast.save_file({"w": np.linspace(-0.1, 0.1, 64, dtype=np.float32)}, path)
    with aprfast.open(path) as f:
        assert f.layout == "aprender"
    return path


@pytest.fixture
def apr2_file(tmp_path):
    path = tmp_path / "s.apr"
    aprfast.save_file({"w": np.linspace(-0.1, 0.1, 64, dtype=np.float32)}, path, layout="apr2")
    return path


def test_the_warning_is_a_user_warning_exported_at_the_top():
    assert issubclass(aprfast.LayoutChangeWarning, UserWarning)


def test_sign_and_encrypt_of_an_aprender_file_warn(aprender_file, tmp_path):
    with pytest.warns(aprfast.LayoutChangeWarning, match="aprender does not read"):
        sign_file(aprender_file, bytes(32), output=tmp_path / "signed.apr")
    with pytest.warns(aprfast.LayoutChangeWarning, match="encryption needs the APR2 layout"):
        encrypt_file(aprender_file, tmp_path / "sealed.apr", password="pw")
    with aprfast.open(tmp_path / "signed.apr") as f:
        assert f.layout == "apr2"


def test_an_apr2_input_changes_nothing_and_does_not_warn(apr2_file, tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sign_file(apr2_file, bytes(32), output=tmp_path / "signed.apr")
        encrypt_file(apr2_file, tmp_path / "sealed.apr", password="pw")
        aprfast.convert(apr2_file, tmp_path / "z.apr", compression="zstd")


def test_convert_with_compression_warns_and_without_does_not(aprender_file, tmp_path):
    with pytest.warns(aprfast.LayoutChangeWarning, match="compression='zstd'"):
        aprfast.convert(aprender_file, tmp_path / "z.apr", compression="zstd")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        aprfast.convert(aprender_file, tmp_path / "plain.apr")


def test_apr_prints_a_line(aprender_file, tmp_path, capsys, monkeypatch):
    assert main(["keygen", str(tmp_path / "k")]) == 0
    capsys.readouterr()
    assert main(["sign", str(aprender_file), "--signing-key", str(tmp_path / "k"), "-o", str(tmp_path / "o.apr")]) == 0
    err = capsys.readouterr().err
    assert err.startswith("apr sign: note: ") and "aprender does not read" in err
    monkeypatch.setenv("APR_TEST_PW", "pw")
    assert main(["encrypt", str(aprender_file), "-o", str(tmp_path / "e.apr"), "--password-env", "APR_TEST_PW"]) == 0
    assert "apr encrypt: note: " in capsys.readouterr().err
    assert main(["convert", str(aprender_file), str(tmp_path / "c.apr"), "--compress", "zstd"]) == 0
    assert "aprender does not read" in capsys.readouterr().err
