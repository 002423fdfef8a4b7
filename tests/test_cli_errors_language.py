"""Issue 28 item 3: under `apr`, errors speak the command line.  Library messages that
name keyword arguments ("pass password= or private_key=", "replace_signature=True")
name the flags instead; an option a command does not have prints that command's usage
with a close match (not the top-level usage); `--password SECRET` points to
`--password-env` without repeating the secret; `apr quantize IN OUT` takes a positional
destination as `apr convert` does."""

import numpy as np
import pytest

import aprfast
from aprfast import v1
from aprfast.cli import main
from aprfast.cli._common import CLI_WORDS, cli_text


@pytest.fixture
def model(tmp_path):
    path = tmp_path / "m.apr"
    aprfast.save_file({"w": np.linspace(-0.1, 0.1, 64 * 32, dtype=np.float32).reshape(64, 32)}, path)
    return path


def _usage_error(argv, capsys) -> str:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    return capsys.readouterr().err


def test_a_sealed_file_asks_for_the_flags_not_the_keywords(tmp_path, capsys):
    sealed = tmp_path / "sealed.apr"
    aprfast.save_file({"w": np.ones(4, np.float32)}, sealed, password="pw", encrypt_names=True)
    assert main(["tensors", str(sealed)]) == 4
    err = capsys.readouterr().err
    assert "--password-env VAR or --key-file FILE" in err
    assert "password=" not in err and "private_key=" not in err


def test_resigning_names_the_resign_flag(tmp_path, capsys):
    path = tmp_path / "m.apr"
    v1.save_model({"w": np.ones(3, np.float32)}, path)
    assert main(["keygen", str(tmp_path / "k")]) == 0
    assert main(["sign", str(path), "--signing-key", str(tmp_path / "k")]) == 0
    capsys.readouterr()
    assert main(["sign", str(path), "--signing-key", str(tmp_path / "k")]) != 0
    err = capsys.readouterr().err
    assert "--resign" in err and "replace_signature" not in err


def test_every_translation_leaves_no_keyword_behind():
    for library, _ in CLI_WORDS:
        assert "=" not in cli_text(f"x: {library} y").replace("VAR", "")
    assert cli_text("nothing to change") == "nothing to change"


def test_a_mistyped_option_gets_the_commands_usage_and_a_close_match(model, tmp_path, capsys):
    err = _usage_error(["convert", str(model), str(tmp_path / "o.apr"), "--precison", "f16"], capsys)
    assert "usage: apr convert" in err and "usage: apr [-h]" not in err
    assert "did you mean --precision?" in err
    err = _usage_error(["conver", str(model)], capsys)
    assert "did you mean 'convert'?" in err
    err = _usage_error(["cache", "info", "--bogus"], capsys)
    assert "usage: apr cache info" in err


def test_password_on_the_command_line_points_to_password_env_and_is_not_echoed(model, capsys):
    err = _usage_error(["tensors", str(model), "--password", "hunter2"], capsys)
    assert "--password-env VAR" in err and "hunter2" not in err
    assert "usage: apr tensors" in err


def test_quantize_takes_a_positional_destination(model, tmp_path, capsys):
    out = tmp_path / "q.apr"
    assert main(["quantize", str(model), str(out), "--type", "q8_0"]) == 0
    with aprfast.open(out) as f:
        assert f.info("w").dtype_name == "Q8_0"
    assert main(["quantize", str(model), "-o", str(tmp_path / "q2.apr"), "--type", "q8_0"]) == 0
    assert main(["quantize", str(model), str(out), "-o", str(tmp_path / "q3.apr"), "--type", "q8_0"]) == 2
    assert main(["quantize", str(model), "--type", "q8_0"]) == 2
    assert "give OUT" in capsys.readouterr().err
