"""Issue 28 item 5 for the library: the long API calls (convert, quantize_tensors,
diff_models, merge_models, quality_report) take ``progress=``: a callable gets
``(done, total)``; by default a plain line appears on stderr only when it is a terminal
and the call has run past ``PlainProgress.DELAY``; False silences it.  No test here is
timed: the delay is set to 0 (or to a day) instead."""

import io
import sys

import numpy as np
import pytest

import aprfast
from aprfast.cli import main
from aprfast.io.progress import PlainProgress, progress_to
from aprfast.tools.diff import diff_models
from aprfast.tools.merge import merge_models
from aprfast.tools.quality import quality_report


class FakeTerminal(io.StringIO):
    def isatty(self):
        return True


@pytest.fixture
def models(tmp_path, rng):
    tensors = {f"layers.{i}.fc1.weight": rng.normal(0, 0.05, (8, 64)).astype(np.float32) for i in range(4)}
    a, b = tmp_path / "a.apr", tmp_path / "b.apr"
    aprfast.save_file(tensors, a)
    aprfast.save_file({k: v + 0.01 for k, v in tensors.items()}, b)
    return a, b, tensors


def calls(tmp_path, a, b, tensors):
    """(name, call(progress=...)) for every long API call."""
    return [
        ("aprfast.convert", lambda progress: aprfast.convert(a, tmp_path / "c.safetensors", force=True,
                                                             progress=progress)),
        ("aprfast.quantize_tensors", lambda progress: aprfast.quantize_tensors(tensors, "q8_0", progress=progress)),
        ("aprfast diff", lambda progress: diff_models(a, b, progress=progress)),
        ("aprfast merge", lambda progress: merge_models([a, b], tmp_path / "m.apr", force=True, progress=progress)),
        ("aprfast quality", lambda progress: quality_report(a, progress=progress)),
    ]


@pytest.fixture
def terminal(monkeypatch):
    """Call it in the test (pytest's capture puts its own sys.stderr back between a
    fixture's setup and the test): a terminal stands in for stderr, the delay is 0 and
    the hint not yet shown."""
    monkeypatch.setattr(PlainProgress, "DELAY", 0.0)
    monkeypatch.setattr(PlainProgress, "hinted", False)

    def install(stream=None):
        stream = FakeTerminal() if stream is None else stream
        monkeypatch.setattr(sys, "stderr", stream)
        return stream
    return install


def test_a_callable_gets_monotonic_updates_ending_at_the_total(models, tmp_path, terminal):
    stderr = terminal()
    for name, call in calls(tmp_path, *models):
        seen = []
        call(lambda done, total, seen=seen: seen.append((done, total)))
        assert seen, name
        dones, totals = [d for d, _ in seen], {t for _, t in seen}
        assert len(totals) == 1 and dones == sorted(dones) and dones[-1] == totals.pop() > 0, (name, seen)
        assert stderr.getvalue() == "", name  # a callable replaces the line


def test_convert_reports_source_bytes(models, tmp_path):
    a, _, tensors = models
    seen = []
    aprfast.convert(a, tmp_path / "c.safetensors", progress=lambda d, t: seen.append((d, t)))
    assert seen[-1] == (sum(v.nbytes for v in tensors.values()),) * 2 and len(seen) == len(tensors)


def test_by_default_a_plain_line_on_a_terminal(models, tmp_path, terminal):
    stderr = terminal()
    for name, call in calls(tmp_path, *models):
        stderr.seek(0)
        stderr.truncate()
        call(None)
        drawn = stderr.getvalue()
        assert drawn.startswith(f"\r{name}") and "100%" in drawn and drawn.endswith("\r\x1b[K"), (name, drawn)
        assert "aprfast[cli]" not in drawn  # the CLI's hint is the CLI's
        assert "\n" not in drawn  # one line, rewritten in place


def test_true_is_the_default(models, tmp_path, terminal):
    stderr = terminal()
    a, *_ = models
    aprfast.convert(a, tmp_path / "c.safetensors", progress=True)
    assert "aprfast.convert a.apr: 100%" in stderr.getvalue()


def test_nothing_before_the_delay(models, tmp_path, terminal, monkeypatch):
    stderr = terminal()
    monkeypatch.setattr(PlainProgress, "DELAY", 86400.0)  # a call shorter than a day prints nothing
    for name, call in calls(tmp_path, *models):
        call(None)
        assert stderr.getvalue() == "", name


def test_nothing_when_stderr_is_not_a_terminal(models, tmp_path, monkeypatch):
    pipe = io.StringIO()
    monkeypatch.setattr(sys, "stderr", pipe)
    monkeypatch.setattr(PlainProgress, "DELAY", 0.0)
    for name, call in calls(tmp_path, *models):
        call(None)
        assert pipe.getvalue() == "", name


def test_nothing_without_stderr(models, tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "stderr", None)  # pythonw, some services
    monkeypatch.setattr(PlainProgress, "DELAY", 0.0)
    a, *_ = models
    aprfast.convert(a, tmp_path / "c.safetensors", progress=None)


def test_false_silences_it(models, tmp_path, terminal):
    stderr = terminal()
    for name, call in calls(tmp_path, *models):
        call(False)
        assert stderr.getvalue() == "", name


@pytest.mark.parametrize("bad", ["yes", 1, 0.5])
def test_a_bad_progress_is_a_type_error_before_any_work(models, tmp_path, bad):
    a, *_ = models
    with pytest.raises(TypeError, match="progress="):
        aprfast.convert(a, tmp_path / "c.safetensors", progress=bad)
    assert not (tmp_path / "c.safetensors").exists()
    with pytest.raises(TypeError, match="progress="):
        progress_to(bad, "x")


def test_the_line_is_cleared_when_the_call_fails(tmp_path, terminal):
    stderr = terminal()
    ln = np.ones(64, np.float32)
    ln[0] = np.nan
    aprfast.save_file({"layers.0.fc1.weight": np.zeros((8, 64), np.float32) + 0.01,
                       "encoder.layer_norm.weight": ln}, tmp_path / "bad.apr")
    with pytest.raises(aprfast.ValidationError):
        aprfast.convert(tmp_path / "bad.apr", tmp_path / "bad.safetensors")
    drawn = stderr.getvalue()
    assert drawn == "" or drawn.endswith("\r\x1b[K")


# --- apr: its own bar or line, never the library's on top ------------------------------------
@pytest.fixture
def no_rich(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "rich" else real(name, *a))


@pytest.mark.parametrize("flag", ["--json", "--quiet"])
def test_apr_quiet_or_json_leaves_the_library_silent_too(models, tmp_path, terminal, no_rich, flag, capsys):
    stderr = terminal()
    a, b, _ = models
    for argv in (["convert", str(a), str(tmp_path / "c.safetensors"), "--force"],
                 ["quantize", str(a), "-o", str(tmp_path / "q.apr"), "--type", "q8_0", "--force"],
                 ["diff", str(a), str(b)],
                 ["merge", str(a), str(b), "-o", str(tmp_path / "m.apr"), "--force"]):
        main([*argv, flag])
        assert "%" not in stderr.getvalue() and "\r" not in stderr.getvalue(), argv  # apr diff says "differ" there


def test_apr_quantize_counts_reading_and_quantizing(models, tmp_path, terminal, no_rich, monkeypatch):
    stderr = terminal()
    lines = []
    real_update = PlainProgress.update

    def record(self, done, total):
        lines.append((done, total))
        real_update(self, done, total)

    monkeypatch.setattr(PlainProgress, "update", record)
    monkeypatch.setattr(PlainProgress, "INTERVAL", 0.0)  # draw every step
    a, *_ = models
    assert main(["quantize", str(a), "-o", str(tmp_path / "q.apr"), "--type", "q8_0", "--force"]) == 0
    assert lines == [(i, 8) for i in range(1, 9)]  # 4 tensors read, then 4 quantized
    drawn = stderr.getvalue()
    assert "quantizing: 50%" in drawn and "quantizing: 100%" in drawn and drawn.count("aprfast[cli]") == 1
