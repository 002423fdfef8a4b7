"""Progress bars of the long commands (convert, merge, diff): drawn with rich on stderr
only when stderr is a terminal, never with --quiet or --json, and never on stdout."""

import io
import sys

import numpy as np
import pytest

import aprfast
from aprfast.cli import main

pytest.importorskip("rich")


class FakeTerminal(io.StringIO):
    def isatty(self):
        return True


@pytest.fixture
def models(tmp_path):
    a, b = tmp_path / "a.apr", tmp_path / "b.apr"
    aprfast.save_file({"w": np.array([1.0], np.float32), "v": np.zeros(3, np.float32)}, a)
    aprfast.save_file({"w": np.array([3.0], np.float32), "v": np.zeros(3, np.float32)}, b)
    return str(a), str(b)


def commands(tmp_path, a, b):
    return [["merge", a, b, "-o", str(tmp_path / "m.apr"), "--force"],
            ["convert", a, str(tmp_path / "c.safetensors"), "--force"],
            ["diff", a, a]]


def test_a_bar_is_drawn_on_a_terminal(models, tmp_path, monkeypatch, capsys):
    for argv in commands(tmp_path, *models):
        terminal = FakeTerminal()
        monkeypatch.setattr(sys, "stderr", terminal)
        assert main(argv) == 0
        drawn = terminal.getvalue()
        assert argv[0] in drawn and "100%" in drawn, argv
        assert "100%" not in capsys.readouterr().out


@pytest.mark.parametrize("flag", ["--quiet", "--json"])
def test_no_bar_with_quiet_or_json(models, tmp_path, monkeypatch, flag):
    for argv in commands(tmp_path, *models):
        terminal = FakeTerminal()
        monkeypatch.setattr(sys, "stderr", terminal)
        assert main([*argv, flag]) == 0
        assert terminal.getvalue() == ""


def test_no_bar_when_stderr_is_not_a_terminal(models, tmp_path, capsys):
    for argv in commands(tmp_path, *models):
        assert main(argv) == 0
        assert capsys.readouterr().err == ""
