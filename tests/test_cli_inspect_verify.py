"""`apr inspect --verify`: the whole-file CRC (and signature) checked, exit 5 when it
fails; `apr --help` lists every command; `python -m aprfast.cli` works."""

import json
import shutil

import pytest
from test_cli_inspect import TINY

from aprfast.cli import main

APR = "import sys, runpy; sys.argv[0] = 'apr'; runpy.run_module('aprfast.cli', run_name='__main__')"


def test_verify_a_good_file(capsys):
    assert main(["inspect", "--verify", TINY]) == 0
    assert capsys.readouterr().out.rstrip().endswith("checksum: valid")
    assert main(["inspect", "--verify", "--json", TINY]) == 0
    assert json.loads(capsys.readouterr().out)["verified"]["ok"] is True


def test_verify_a_flipped_data_byte_exits_5_with_e004(tmp_path, capsys):
    path = tmp_path / "t.apr"
    shutil.copy(TINY, path)
    with open(path, "r+b") as fh:
        fh.seek(720)  # inside encoder.weight's data: the header and index stay valid
        fh.write(b"\x55")
    assert main(["inspect", str(path)]) == 0  # without --verify only the prefix is read
    capsys.readouterr()
    assert main(["inspect", "--verify", str(path)]) == 5
    out, err = capsys.readouterr()
    assert "checksum: INVALID" in out and "[E004]" in err
    assert main(["inspect", "--verify", "--json", str(path)]) == 5
    verified = json.loads(capsys.readouterr().out)["verified"]
    assert verified["ok"] is False and verified["code"] == "E004"


def test_help_lists_every_command(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    for command in ("inspect", "validate", "tensors", "explain"):
        assert command in out


def test_python_dash_m(run_child):
    done = run_child(APR, "inspect", "--verify", TINY)
    assert done.returncode == 0 and "checksum: valid" in done.stdout
