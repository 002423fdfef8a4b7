"""Issue 25 N10, N11: every temporary of every writer, file or directory, follows one naming
rule (``aprfast.io.atomic.TEMP_NAME``) and one sweep rule (removed by the next save in its
directory once its writer's lock is gone, never while it is held).

Before the fix a killed sharded ``save_file`` left ``.{shard}.{token}.part`` files (N10) and a
killed ``convert`` from a URL left ``.aprfast-source-XXXX/`` directories (N11); the sweep
matched neither (reproducers: /work/shared/reviews/2026-11/crash_sharded_save_orphan_part_files.py,
crash_remote_convert_orphan_source_dir.py).
"""

import os
import subprocess
import sys
import tempfile

import numpy as np
import pytest
from servers import http_server  # noqa: F401 - the fixture

import aprfast
from aprfast.io import atomic

pytestmark = pytest.mark.skipif(atomic.fcntl is None, reason="sweeping needs flock")

TENSORS = {f"t{i}": np.full((64, 256), i, np.float32) for i in range(6)}
SHARD = 140_000


def _env():
    return dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(aprfast.__file__))))


def _run(script, *args):
    return subprocess.run([sys.executable, "-c", script, *map(str, args)], env=_env(), cwd=tempfile.gettempdir(),
                          capture_output=True, text=True, timeout=60)


def _hidden(directory):
    return sorted(n for n in os.listdir(directory) if n.startswith("."))


# Kills itself (os._exit: nothing cleaned up, as SIGKILL) just before the KILL_AT-th rename,
# link or unlink, or in the middle of writing when KILL_AT is negative (the -KILL_AT-th write).
KILLED_SAVE = r"""
import os, sys
import numpy as np
count, at = [0], int(sys.argv[1])
def wrap(name):
    real = getattr(os, name)
    def wrapped(*a, **k):
        count[0] += 1
        if count[0] == abs(at):
            os._exit(137)
        return real(*a, **k)
    setattr(os, name, wrapped)
for name in (("write",) if at < 0 else ("replace", "rename", "link", "unlink")):
    wrap(name)
import aprfast
aprfast.save_file({f"t{i}": np.full((64, 256), i, np.float32) for i in range(6)}, sys.argv[2],
                  max_shard_size=140_000)
"""


@pytest.mark.parametrize("kill_at", [-1, -2, -3, -4, 1, 2, 3])
def test_a_killed_sharded_save_leaves_only_temporaries_the_next_save_sweeps(tmp_path, kill_at):
    """N10: whatever a killed sharded save leaves under a hidden name is a temporary by the
    one rule, removed by the next save of any file there."""
    result = _run(KILLED_SAVE, kill_at, tmp_path / "m.apr")
    assert result.returncode == 137, result.stderr
    left = _hidden(tmp_path)
    assert all(atomic.TEMP_NAME.fullmatch(n) for n in left), left
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".part")]
    aprfast.save_file({"x": np.ones(4, np.float32)}, tmp_path / "other.apr")
    assert _hidden(tmp_path) == []
    aprfast.save_file(TENSORS, tmp_path / "m.apr", max_shard_size=SHARD)  # and the model saves whole
    assert sorted(os.listdir(tmp_path)) == ["m-00001-of-00003.apr", "m-00002-of-00003.apr", "m-00003-of-00003.apr",
                                            "m.apr.index.json", "other.apr"]


KILLED_CONVERT = r"""
import os, sys
import aprfast
from aprfast.convert import _remote
real = _remote._fetch
def fetch_then_die(url, path, storage_options):
    real(url, path, storage_options)
    print("FETCHED", os.path.dirname(path), flush=True)
    os._exit(137)  # the partial download stays, as after kill -9
_remote._fetch = fetch_then_die
aprfast.convert(sys.argv[1], sys.argv[2])
"""


def test_a_killed_convert_from_a_url_leaves_a_scratch_directory_the_next_save_sweeps(http_server, tmp_path):
    """N11: the scratch directory of a conversion from a URL is named and locked like every
    temporary; once its writer is dead the next save in that directory removes it."""
    url = http_server.put("n11/m.apr", aprfast.save(TENSORS))
    result = _run(KILLED_CONVERT, url, tmp_path / "out.apr")
    assert result.returncode == 137, result.stderr
    scratch = result.stdout.split("FETCHED")[1].strip()
    assert os.path.dirname(scratch) == str(tmp_path)
    assert atomic.TEMP_NAME.fullmatch(os.path.basename(scratch))
    assert os.listdir(scratch) == ["m.apr"]
    aprfast.save_file({"x": np.ones(4, np.float32)}, tmp_path / "a.apr")
    assert sorted(os.listdir(tmp_path)) == ["a.apr"]
    aprfast.convert(url, tmp_path / "out.apr")
    assert sorted(os.listdir(tmp_path)) == ["a.apr", "out.apr"]


HOLD = r"""
import os, sys
from aprfast.io import atomic
kind, directory = sys.argv[1], sys.argv[2]
if kind == "dir":
    held = atomic.TempDirectory(directory, "aprfast-source")
    open(os.path.join(held.path, "partial"), "wb").write(b"x" * 100)
    print(held.path, flush=True)
else:
    held = atomic.AtomicFile(os.path.join(directory, "m-00001-of-00002.apr"))
    os.write(held.fd, b"shard")
    held.stage()
    print(held.temp_path, flush=True)
sys.stdin.read()  # alive until the parent closes our stdin or kills us
"""


@pytest.mark.parametrize("kind", ["dir", "staged"])
def test_a_live_writers_temporary_is_never_swept_and_a_dead_ones_is(tmp_path, kind):
    child = subprocess.Popen([sys.executable, "-c", HOLD, kind, tmp_path], env=_env(), cwd=tempfile.gettempdir(),
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        path = child.stdout.readline().strip()
        assert atomic.TEMP_NAME.fullmatch(os.path.basename(path)), path
        assert atomic.sweep_abandoned_temps(str(tmp_path)) == 0
        aprfast.save_file({"x": np.ones(4, np.float32)}, tmp_path / "a.apr")  # a save's sweep leaves it too
        assert os.path.lexists(path)
    finally:
        child.kill()
        child.wait()
        child.stdin.close()
        child.stdout.close()
    assert atomic.sweep_abandoned_temps(str(tmp_path)) == 1
    assert sorted(os.listdir(tmp_path)) == ["a.apr"]


def test_a_dead_temporary_directory_is_removed_without_following_links(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.apr").write_bytes(b"precious")
    scratch = tmp_path / "work" / f".aprfast-source.aprfast-{dead.pid}-0123456789abcdef.tmp"
    (scratch / "nested").mkdir(parents=True)
    (scratch / "nested" / "partial.apr").write_bytes(b"partial")
    os.symlink(outside, scratch / "link")
    os.symlink(outside / "keep.apr", scratch / "nested" / "file-link")
    assert atomic.sweep_abandoned_temps(str(tmp_path / "work")) == 1
    assert os.listdir(tmp_path / "work") == []
    assert (outside / "keep.apr").read_bytes() == b"precious"


def test_a_temporary_directory_is_named_locked_and_removed_on_close(tmp_path):
    with atomic.TempDirectory(tmp_path, "aprfast-source") as scratch:
        assert atomic.TEMP_NAME.fullmatch(os.path.basename(scratch.path))
        (tmp_path / "x").mkdir()
        open(os.path.join(scratch.path, "f"), "wb").close()
        assert atomic.sweep_abandoned_temps(str(tmp_path)) == 0  # our own: never swept
    assert sorted(os.listdir(tmp_path)) == ["x"]


def test_the_v1_spool_follows_the_rule(tmp_path, monkeypatch):
    """The v1 writer's spool is nameless (O_TMPFILE) or a temporary by the one rule; never a
    ``tempfile`` name the sweep does not know."""
    from aprfast.v1 import load_model, save_model

    monkeypatch.setattr(atomic, "_proc_links_work", False)  # the named fallback
    made = []
    real = atomic._create_named_temp

    def spy(directory, base, mode, extra_flags=0):
        fd, path = real(directory, base, mode, extra_flags)
        made.append(path)
        return fd, path

    monkeypatch.setattr(atomic, "_create_named_temp", spy)
    save_model({"w": np.arange(300_000, dtype=np.float32)}, tmp_path / "v1.apr", streaming=True)
    assert made and all(atomic.TEMP_NAME.fullmatch(os.path.basename(p)) for p in made)
    assert np.array_equal(load_model(tmp_path / "v1.apr").payload["w"], np.arange(300_000, dtype=np.float32))
