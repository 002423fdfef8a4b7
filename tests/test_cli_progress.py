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


def test_without_rich_a_plain_line_and_a_hint_once(models, tmp_path, monkeypatch):
    """Issue 28 item 5: without rich a long command printed nothing at all."""
    import importlib.util

    from aprfast.cli import _common

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "rich" else real(name, *a))
    monkeypatch.setattr(_common.PlainProgress, "DELAY", 0.0)  # the models are small: show it at once
    monkeypatch.setattr(_common.PlainProgress, "hinted", False)
    shown = []
    for argv in commands(tmp_path, *models):
        terminal = FakeTerminal()
        monkeypatch.setattr(sys, "stderr", terminal)
        assert main(argv) == 0
        shown.append(terminal.getvalue())
    assert all("100%" in s and "\r" in s and s.endswith("\r\x1b[K") for s in shown), shown
    assert [s.count("aprfast[cli]") for s in shown] == [1, 0, 0]  # the hint, once


def test_a_quick_command_prints_no_plain_progress(models, tmp_path, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "rich" else real(name, *a))
    terminal = FakeTerminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    a, b = models
    assert main(["diff", a, a]) == 0
    assert terminal.getvalue() == ""  # under a second: nothing
