"""Issue 25: kill -9 over every writer of the package.

Each writer runs in a child that SIGKILLs itself just before its k-th rename / link / unlink /
fsync (the steps that change what a directory names or make data durable) or its k-th
``os.write`` (data half written), for a spread of k over the whole write.  After each kill:

- the target holds the old content or the new, whole (read back and compared);
- the next write of the same target (which sweeps the dead writer's temporaries) leaves the
  directory holding exactly the target's files: no temporary, no superseded shard.

Writers: ``save_file`` (one file, and sharded), ``convert`` (one file, and a sharded safetensors
checkpoint), ``convert`` from a URL (its scratch directory), encryption (``tools.protection``'s
``encrypt_file`` of a v2 file, and the v1 writer with a password), ``remote.cache.download``.
"""

import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import pytest
from servers import http_server  # noqa: F401 - the fixture

import aprfast
from aprfast.io import atomic

pytestmark = [pytest.mark.skipif(atomic.fcntl is None, reason="SIGKILL and flock are POSIX"),
              pytest.mark.slow("kill -9 harness")]

OLD = {f"t{i}": np.full((64, 256), i, np.float32) for i in range(6)}  # 64 KiB each
NEW = {k: v + 100 for k, v in OLD.items()}
SHARD = 140_000
PASSWORD = "kill -9"

PRELUDE = r"""
import os, signal, sys
_count = [0]
_kill_at, _mode = int(sys.argv[1]), sys.argv[2]
def _wrap(name):
    real = getattr(os, name)
    def wrapped(*args, **kwargs):
        _count[0] += 1
        if _count[0] == _kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        return real(*args, **kwargs)
    setattr(os, name, wrapped)
for _name in (("write",) if _mode == "write" else ("replace", "rename", "link", "unlink", "fsync")):
    _wrap(_name)
ARGS = sys.argv[3:]
import aprfast
"""


def _child(body: str, kill_at: int, mode: str, *args):
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(aprfast.__file__))))
    script = PRELUDE + body + "\nprint('EVENTS', _count[0])\n"
    return subprocess.run([sys.executable, "-c", script, str(kill_at), mode, *map(str, args)], env=env,
                          cwd=tempfile.gettempdir(), capture_output=True, text=True, timeout=60)


def _points(total: int, most: int) -> list:
    """Up to ``most`` kill points spread over 1..total, first and last included."""
    if total <= most:
        return list(range(1, total + 1))
    if most == 1:
        return [(total + 1) // 2]
    return sorted({round(1 + i * (total - 1) / (most - 1)) for i in range(most)})


def _state(found: dict, old: dict, new: dict) -> str:
    for name, model in (("old", old), ("new", new)):
        if found.keys() == model.keys() and all(np.array_equal(np.asarray(found[k]), model[k]) for k in model):
            return name
    return f"neither: {sorted(found)}"


def _tree(root) -> list:
    out = []
    for folder, dirs, files in os.walk(root):
        rel = os.path.relpath(folder, root)
        out += [os.path.normpath(os.path.join(rel, n)) for n in files + [d + "/" for d in dirs]]
    return sorted(out)


class Writer:
    """One writer under test: ``setup`` puts the old content in place, ``body`` (run in the
    child, ``ARGS`` = ``args``) writes the new, ``read`` gives the target's content,
    ``again`` is the next write in this process, ``expected`` the directory afterwards."""

    rename_points = 6
    write_points = 2

    def __init__(self, tmp_path):
        self.tmp = tmp_path
        self.dir = tmp_path / "out"
        self.dir.mkdir()
        aprfast.save_file(OLD, tmp_path / "old.apr")
        aprfast.save_file(NEW, tmp_path / "new.apr")


class SaveFile(Writer):
    body = "aprfast.save_file(aprfast.load_file(ARGS[0]), ARGS[1])"

    def setup(self):
        aprfast.save_file(OLD, self.dir / "m.apr")
        return [self.tmp / "new.apr", self.dir / "m.apr"]

    def read(self):
        return aprfast.load_file(self.dir / "m.apr", verify=True)

    def again(self):
        aprfast.save_file(NEW, self.dir / "m.apr")

    expected = ["m.apr"]


class ShardedSave(SaveFile):
    body = "aprfast.save_file(aprfast.load_file(ARGS[0]), ARGS[1], max_shard_size=140_000)"

    def setup(self):
        aprfast.save_file(OLD, self.dir / "m.apr", max_shard_size=SHARD)
        return [self.tmp / "new.apr", self.dir / "m.apr"]

    def read(self):
        return aprfast.load_file(self.dir, verify=True)

    def again(self):
        aprfast.save_file(NEW, self.dir / "m.apr", max_shard_size=SHARD)

    @property
    def expected(self):
        manifest = json.loads((self.dir / "m.apr.index.json").read_text())
        return sorted(["m.apr.index.json"] + [s["file"] for s in manifest["shards"]])


class ConvertFile(Writer):
    body = "aprfast.convert(ARGS[0], ARGS[1], force=True)"

    def setup(self):
        aprfast.convert(self.tmp / "old.apr", self.dir / "m.safetensors")
        return [self.tmp / "new.apr", self.dir / "m.safetensors"]

    def read(self):
        import safetensors.numpy as sn

        return sn.load_file(self.dir / "m.safetensors")

    def again(self):
        aprfast.convert(self.tmp / "new.apr", self.dir / "m.safetensors", force=True)

    expected = ["m.safetensors"]


class ConvertSharded(Writer):
    body = "aprfast.convert(ARGS[0], ARGS[1], max_shard_size=140_000, force=True)"

    def setup(self):
        aprfast.convert(self.tmp / "old.apr", self.dir, max_shard_size=SHARD)
        return [self.tmp / "new.apr", self.dir]

    def read(self):
        from aprfast.convert import open_source

        src = open_source(self.dir)
        try:
            return {s.name: np.array(src.read(s)) for s in src.specs}
        finally:
            src.close()

    def again(self):
        aprfast.convert(self.tmp / "new.apr", self.dir, max_shard_size=SHARD, force=True)

    @property
    def expected(self):
        index = json.loads((self.dir / "model.safetensors.index.json").read_text())
        return sorted({"model.safetensors.index.json", *index["weight_map"].values()})


class EncryptV2(Writer):
    body = ("from aprfast.tools.protection import encrypt_file\n"
            "encrypt_file(ARGS[0], ARGS[1], password=ARGS[2], force=True)")
    rename_points, write_points = 4, 1

    def setup(self):
        from aprfast.tools.protection import encrypt_file

        with pytest.warns(aprfast.LayoutChangeWarning):  # aprender's layout in, APR2 out (issue 28 item 8)
            encrypt_file(self.tmp / "old.apr", self.dir / "m.apr", password=PASSWORD)
        return [self.tmp / "new.apr", self.dir / "m.apr", PASSWORD]

    def read(self):
        return aprfast.load_file(self.dir / "m.apr", password=PASSWORD)

    def again(self):
        from aprfast.tools.protection import encrypt_file

        with pytest.warns(aprfast.LayoutChangeWarning):
            encrypt_file(self.tmp / "new.apr", self.dir / "m.apr", password=PASSWORD, force=True)

    expected = ["m.apr"]


class SaveV1WithPassword(Writer):
    body = ("from aprfast.v1 import save_model\n"
            "save_model(dict(aprfast.load_file(ARGS[0])), ARGS[1], password=ARGS[2])")
    rename_points, write_points = 4, 1

    def setup(self):
        from aprfast.v1 import save_model

        save_model(OLD, self.dir / "m.apr", password=PASSWORD)
        return [self.tmp / "new.apr", self.dir / "m.apr", PASSWORD]

    def read(self):
        from aprfast.v1 import load_model

        return load_model(self.dir / "m.apr", password=PASSWORD).payload

    def again(self):
        from aprfast.v1 import save_model

        save_model(NEW, self.dir / "m.apr", password=PASSWORD)

    expected = ["m.apr"]


class Download(Writer):
    """``download(url, force=True)`` over a cached copy; the object at the URL changed."""

    body = ("from aprfast.remote.cache import download\n"
            "download(ARGS[0], cache_dir=ARGS[1], force=True)")
    write_points = 3

    def setup(self):
        from aprfast.remote.cache import download

        name = f"kill/{self.tmp.name}/m.apr"
        self.server.put(name, aprfast.save(OLD))
        self.url = self.server.url(name)
        self.cached = download(self.url, cache_dir=self.dir)
        self.server.put(name, aprfast.save(NEW))
        self.before = _tree(self.dir)
        return [self.url, self.dir]

    def read(self):
        return aprfast.load_file(self.cached, verify=True)

    def again(self):
        from aprfast.remote.cache import download

        assert download(self.url, cache_dir=self.dir, force=True) == self.cached

    @property
    def expected(self):
        return self.before


class ConvertFromURL(Writer):
    """``convert(url, out, force=True)``: the object is fetched into a scratch directory
    beside the destination first."""

    body = "aprfast.convert(ARGS[0], ARGS[1], force=True)"
    rename_points, write_points = 6, 0

    def setup(self):
        name = f"kill/{self.tmp.name}/new.apr"
        self.url = self.server.put(name, (self.tmp / "new.apr").read_bytes())
        aprfast.save_file(OLD, self.dir / "m.apr")
        return [self.url, self.dir / "m.apr"]

    def read(self):
        return aprfast.load_file(self.dir / "m.apr", verify=True)

    def again(self):
        aprfast.convert(self.url, self.dir / "m.apr", force=True)

    expected = ["m.apr"]


WRITERS = {cls.__name__: cls for cls in (SaveFile, ShardedSave, ConvertFile, ConvertSharded, EncryptV2,
                                          SaveV1WithPassword, Download, ConvertFromURL)}


@pytest.mark.parametrize("name", sorted(WRITERS))
def test_kill_9_leaves_old_or_new_and_the_next_write_leaves_no_temporary(http_server, tmp_path, name):
    writer = WRITERS[name](tmp_path)
    writer.server = http_server
    args = writer.setup()
    counts = {}
    for mode in ("rename", "write"):  # an uninterrupted write of the old content: how many steps
        result = _child(writer.body, 0, mode, *args)
        assert result.returncode == 0, result.stderr
        counts[mode] = int(result.stdout.split("EVENTS")[-1])
    writer.again()
    plan = [("rename", k) for k in _points(counts["rename"], writer.rename_points)]
    plan += [("write", k) for k in _points(counts["write"], writer.write_points)] if writer.write_points else []
    assert plan
    killed = 0
    for mode, k in plan:
        shutil_reset(writer)
        result = _child(writer.body, k, mode, *args)
        assert result.returncode in (0, -9), result.stderr
        killed += result.returncode == -9
        state = _state(writer.read(), OLD, NEW)
        assert state in ("old", "new"), f"{name}: killed before {mode} #{k}: {state}"
        writer.again()
        assert _state(writer.read(), OLD, NEW) == "new"
        assert _tree(writer.dir) == sorted(writer.expected), f"{name}: after a kill before {mode} #{k}"
    print(name, counts, plan, "killed", killed)
    assert killed >= len(plan) - 1  # every point is inside the write (one may vary: a download's chunking)


def shutil_reset(writer) -> None:
    """The old content back in place (the target as ``setup`` left it)."""
    import shutil

    if isinstance(writer, Download):
        writer.server.put(writer.url.split("/", 3)[3], aprfast.save(OLD))
        writer.again()
        writer.server.put(writer.url.split("/", 3)[3], aprfast.save(NEW))
        return
    shutil.rmtree(writer.dir)
    writer.dir.mkdir()
    writer.setup()
