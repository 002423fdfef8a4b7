"""Issue 25 N19: one ``--force`` rule for every ``apr`` command that writes a file
(``aprfast.cli._common.refuse_existing``): anything at the output's name, a dangling symlink
included, is refused without ``--force`` (exit 1, "exists; pass --force to replace it") and
left as it is; with ``--force`` it is replaced by a regular file (a symlink is replaced, never
written through).

Before the fix ``apr quantize IN -o OUT`` (and ``apr trace --chrome OUT``) tested
``os.path.exists``, which is false for a dangling symlink, and replaced it (reproducer:
/work/shared/reviews/2026-11/cli_quantize_replaces_dangling_symlink_without_force.py).
"""

import os

import numpy as np
import pytest

import aprfast
from aprfast.cli import main

PASSWORD = "correct horse"


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("APR_TEST_PASSWORD", PASSWORD)
    tensors = {"w": np.linspace(-1, 1, 4 * 32, dtype=np.float32).reshape(4, 32)}
    aprfast.save_file(tensors, "m.apr")
    aprfast.save_file({"w": tensors["w"] * 2}, "m2.apr")
    aprfast.convert("m.apr", "m.safetensors")
    assert main(["keygen", "key"]) == 0
    assert main(["encrypt", "m.apr", "-o", "enc.apr", "--password-env", "APR_TEST_PASSWORD"]) == 0
    return tmp_path


# (argv with OUT where the output goes, the outputs it writes)
COMMANDS = {
    "quantize": (["quantize", "m.apr", "-o", "OUT", "--type", "q8_0"], ["OUT"]),
    "convert": (["convert", "m.apr", "OUT.apr"], ["OUT.apr"]),
    "convert -o": (["convert", "m.apr", "-o", "OUT.safetensors"], ["OUT.safetensors"]),
    "import": (["import", "m.safetensors", "OUT.apr"], ["OUT.apr"]),
    "export": (["export", "m.apr", "OUT.safetensors"], ["OUT.safetensors"]),
    "encrypt": (["encrypt", "m.apr", "-o", "OUT", "--password-env", "APR_TEST_PASSWORD"], ["OUT"]),
    "decrypt": (["decrypt", "enc.apr", "-o", "OUT", "--password-env", "APR_TEST_PASSWORD"], ["OUT"]),
    "sign": (["sign", "m.apr", "--signing-key", "key", "-o", "OUT"], ["OUT"]),
    "merge": (["merge", "m.apr", "m2.apr", "-o", "OUT"], ["OUT"]),
    "trace": (["trace", "m.apr", "--chrome", "OUT.json"], ["OUT.json"]),
    "keygen": (["keygen", "OUT"], ["OUT", "OUT.pub"]),
    "keygen .pub": (["keygen", "OUT"], ["OUT.pub"]),
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_dangling_symlink_is_refused_without_force_and_replaced_with_it(workdir, capsys, command):
    argv, outputs = COMMANDS[command]
    elsewhere = workdir / "elsewhere"
    for name in outputs:
        os.symlink(elsewhere / name, name)  # dangling: its target does not exist
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "exists; pass --force to replace it" in err, err
    for name in outputs:
        assert os.path.islink(name), f"{name} was replaced without --force"
    assert not elsewhere.exists()
    capsys.readouterr()
    assert main([*argv, "--force"]) == 0
    for name in outputs:
        assert os.path.isfile(name) and not os.path.islink(name), name
    assert not elsewhere.exists()  # replaced, never written through


@pytest.mark.parametrize("command", ["quantize", "trace", "encrypt", "merge"])
def test_an_existing_file_or_directory_is_refused_without_force(workdir, capsys, command):
    argv, outputs = COMMANDS[command]
    (workdir / outputs[0]).write_bytes(b"keep")
    assert main(argv) == 1
    assert (workdir / outputs[0]).read_bytes() == b"keep"
    os.unlink(outputs[0])
    os.mkdir(outputs[0])
    assert main(argv) == 1
    assert "exists; pass --force" in capsys.readouterr().err


def test_the_rule_is_one_helper():
    """Every command module that takes --force for an output goes through refuse_existing."""
    import pathlib

    import aprfast.cli as cli

    folder = pathlib.Path(cli.__file__).parent
    for module in ("quantize", "convert", "encrypt", "decrypt", "sign", "merge", "trace", "keygen"):
        text = (folder / f"{module}.py").read_text()
        assert "refuse_existing(" in text, module
        assert "os.path.exists(" not in text, module
