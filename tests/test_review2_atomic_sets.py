"""Issue 25 N1: a sharded write (safetensors through ``convert(..., max_shard_size=)``, and
aprfast's own ``save_file(..., max_shard_size=)``) replaces the model as a set, and readers
refuse a set that mixes the shards of two saves.

Before the fix the shards were renamed over the old ones one by one under the same names
and the index carried no checksum, so a process killed between two renames left the old
index over old and new shards of the same sizes, which read and re-converted without error
(reproducer: /work/shared/reviews/2026-11/crash_sharded_safetensors_mixed.py).

The kills here are ``os._exit`` in a child just before its k-th rename, link or unlink,
for every k (every step of the publication), plus SIGKILLs at random moments.
"""

import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np
import pytest

import aprfast
from aprfast.convert import TensorValidationError
from aprfast.convert import open_source as open_converter_source
from aprfast.convert import safetensors as cst
from aprfast.errors import ChecksumError, CorruptError
from aprfast.io.atomic import TEMP_NAME

OLD = {f"t{i}": np.full((64, 256), i, np.float32) for i in range(6)}  # 64 KiB each
NEW = {k: v + 100 for k, v in OLD.items()}
SHARD = 140_000  # two tensors a shard: three shards

# Run in a child: kill itself (os._exit, as abrupt as SIGKILL for the files) just before the
# KILL_AT-th call of the file operations that change what a directory names; print the count.
PRELUDE = r"""
import os, sys
_count = [0]
_kill_at = int(sys.argv[1])
def _wrap(name):
    real = getattr(os, name)
    def wrapped(*args, **kwargs):
        _count[0] += 1
        if _count[0] == _kill_at:
            os._exit(137)
        return real(*args, **kwargs)
    setattr(os, name, wrapped)
for _name in ("replace", "rename", "link", "unlink"):
    _wrap(_name)
"""


def _child(body: str, kill_at: int, *args, timeout=60):
    import aprfast as package

    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(package.__file__))))
    script = PRELUDE + body + "\nprint('EVENTS', _count[0])\n"
    return subprocess.run([sys.executable, "-c", script, str(kill_at), *map(str, args)], env=env,
                          cwd=tempfile.gettempdir(), capture_output=True, text=True, timeout=timeout)


def _events(result) -> int:
    assert result.returncode == 0, result.stderr
    return int(result.stdout.split("EVENTS")[-1])


def read_checkpoint(directory) -> dict:
    src = open_converter_source(directory)
    try:
        return {s.name: np.array(src.read(s)) for s in src.specs}
    finally:
        src.close()


def which(found: dict) -> str:
    for name, model in (("old", OLD), ("new", NEW)):
        if found.keys() == model.keys() and all(np.array_equal(found[k], model[k]) for k in model):
            return name
    return "mixed: " + ", ".join(f"{k}={float(v.ravel()[0])}" for k, v in sorted(found.items()))


def _only_the_checkpoint(directory) -> None:
    """The index and exactly the shards it names: no temporary, no superseded shard."""
    index = json.loads((directory / cst.INDEX_NAME).read_text())
    assert sorted(os.listdir(directory)) == sorted({cst.INDEX_NAME, *index["weight_map"].values()})


# --- safetensors: convert(..., max_shard_size=, force=True) over a checkpoint ----------------------
CONVERT = r"""
import aprfast
aprfast.convert(sys.argv[2], sys.argv[3], max_shard_size=int(sys.argv[4]), force=True)
"""


@pytest.fixture
def checkpoint(tmp_path):
    aprfast.save_file(OLD, tmp_path / "old.apr")
    aprfast.save_file(NEW, tmp_path / "new.apr")
    out = tmp_path / "ckpt"
    aprfast.convert(tmp_path / "old.apr", out, max_shard_size=SHARD)
    assert len(os.listdir(out)) == 4
    return tmp_path, out


@pytest.mark.slow("kill -9 harness")
def test_a_convert_killed_at_any_step_leaves_the_old_checkpoint_or_the_new(checkpoint):
    tmp_path, out = checkpoint
    total = _events(_child(CONVERT, 0, tmp_path / "old.apr", out, SHARD))  # old over old: counts the steps
    assert total >= 7  # at least: three shards and the index published, three old shards removed
    for k in range(1, total + 1):
        aprfast.convert(tmp_path / "old.apr", out, max_shard_size=SHARD, force=True)  # the old model, whole
        result = _child(CONVERT, k, tmp_path / "new.apr", out, SHARD)
        assert result.returncode in (0, 137), result.stderr
        state = which(read_checkpoint(out))
        assert state in ("old", "new"), f"killed before step {k} of {total}: {state}"
        # the next write sweeps the dead writer's temporaries and removes every superseded shard
        aprfast.convert(tmp_path / "new.apr", out, max_shard_size=SHARD, force=True)
        assert which(read_checkpoint(out)) == "new"
        _only_the_checkpoint(out)


@pytest.mark.slow("kill -9 harness")
def test_a_convert_sigkilled_at_random_moments_leaves_the_old_checkpoint_or_the_new(checkpoint):
    tmp_path, out = checkpoint
    big_old, big_new = tmp_path / "big-old.apr", tmp_path / "big-new.apr"
    aprfast.save_file({k: np.repeat(v, 16, axis=0) for k, v in OLD.items()}, big_old)  # 1 MiB tensors
    aprfast.save_file({k: np.repeat(v, 16, axis=0) for k, v in NEW.items()}, big_new)
    script = "import sys, aprfast\naprfast.convert(sys.argv[1], sys.argv[2], max_shard_size=2_200_000, force=True)\n"
    import aprfast as package

    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(package.__file__))))
    start = time.monotonic()
    subprocess.run([sys.executable, "-c", script, big_new, out], env=env, check=True, cwd=tempfile.gettempdir())
    whole = time.monotonic() - start
    rnd = random.Random(25)
    seen = set()
    for _ in range(6):
        aprfast.convert(big_old, out, max_shard_size=2_200_000, force=True)
        child = subprocess.Popen([sys.executable, "-c", script, big_new, out], env=env, cwd=tempfile.gettempdir())
        time.sleep(rnd.uniform(0.5, 1.1) * whole)
        child.send_signal(signal.SIGKILL)
        child.wait()
        found = read_checkpoint(out)
        state = which({k: v[:64] for k, v in found.items()})
        assert state in ("old", "new"), state
        assert all(np.array_equal(v[:64], v[-64:]) for v in found.values())
        seen.add(state)
        aprfast.convert(big_new, out, max_shard_size=2_200_000, force=True)
        _only_the_checkpoint(out)


def test_a_failed_convert_leaves_the_live_checkpoint_whole(checkpoint):
    tmp_path, out = checkpoint
    def progress(done, total):
        if done > total * 0.8:  # two shards written: the conversion fails in the third
            raise TensorValidationError("stop", path=str(out))

    with pytest.raises(TensorValidationError):
        aprfast.convert(tmp_path / "new.apr", out, max_shard_size=SHARD, force=True, progress=progress)
    assert which(read_checkpoint(out)) == "old"
    _only_the_checkpoint(out)


def test_successive_overwrites_alternate_between_two_name_forms(checkpoint):
    tmp_path, out = checkpoint
    canonical = sorted(os.listdir(out))
    aprfast.convert(tmp_path / "new.apr", out, max_shard_size=SHARD, force=True)
    tagged = sorted(os.listdir(out))
    assert not set(tagged) & set(canonical) - {cst.INDEX_NAME}
    assert all(n == cst.INDEX_NAME or n.endswith(".safetensors") and n.count(".") == 2 for n in tagged)
    aprfast.convert(tmp_path / "old.apr", out, max_shard_size=SHARD, force=True)
    assert sorted(os.listdir(out)) == canonical
    assert which(read_checkpoint(out)) == "old"


def test_the_index_records_each_shards_size_and_crc32_and_stays_a_transformers_index(checkpoint):
    _tmp_path, out = checkpoint
    index = json.loads((out / cst.INDEX_NAME).read_text())
    assert set(index) == {"metadata", "weight_map"}
    assert index["metadata"]["total_size"] == sum(v.nbytes for v in OLD.values())
    checks = index["metadata"][cst.SHARD_CHECKS]
    import zlib

    for shard in set(index["weight_map"].values()):
        data = (out / shard).read_bytes()
        assert checks[shard] == {"size": len(data), "crc32": f"{zlib.crc32(data):08x}"}
    import safetensors.numpy as sn

    loaded = {}
    for shard in set(index["weight_map"].values()):
        loaded.update(sn.load_file(out / shard))
    assert which(loaded) == "old"


def _mixed(tmp_path, out):
    """The old checkpoint with its second shard replaced by the new one's (same size)."""
    other = tmp_path / "other"
    aprfast.convert(tmp_path / "new.apr", other, max_shard_size=SHARD)
    second = "model-00002-of-00003.safetensors"
    (out / second).write_bytes((other / second).read_bytes())
    return second


def test_a_mixed_safetensors_checkpoint_is_refused_naming_the_shard(checkpoint):
    tmp_path, out = checkpoint
    second = _mixed(tmp_path, out)
    with pytest.raises(ChecksumError, match=second) as error:
        read_checkpoint(out)
    assert error.value.code == "E004"
    with pytest.raises(ChecksumError, match=second):
        aprfast.convert(out, tmp_path / "again.apr")
    assert not (tmp_path / "again.apr").exists()


def test_a_shard_of_another_size_is_refused_at_open(checkpoint):
    _tmp_path, out = checkpoint
    first = out / "model-00001-of-00003.safetensors"
    data = first.read_bytes()
    header = int.from_bytes(data[:8], "little")
    first.write_bytes(data[:8 + header])  # the header, no data: refused by size before it is parsed
    with pytest.raises(ChecksumError, match="model-00001-of-00003.safetensors"):
        open_converter_source(out)


@pytest.mark.parametrize("checks", [[], {"model-00001-of-00003.safetensors": {"size": 1}},
                                    "x", {"*": {"size": -1, "crc32": "00000000"}}])
def test_malformed_shard_checks_are_refused(checkpoint, checks):
    _tmp_path, out = checkpoint
    index = json.loads((out / cst.INDEX_NAME).read_text())
    if isinstance(checks, dict) and "*" in checks:
        checks = {name: checks["*"] for name in set(index["weight_map"].values())}
    index["metadata"][cst.SHARD_CHECKS] = checks
    (out / cst.INDEX_NAME).write_text(json.dumps(index))
    with pytest.raises(CorruptError, match=cst.SHARD_CHECKS):
        open_converter_source(out)


def test_an_index_without_shard_checks_reads_as_before(checkpoint):
    _tmp_path, out = checkpoint
    index = json.loads((out / cst.INDEX_NAME).read_text())
    del index["metadata"][cst.SHARD_CHECKS]
    (out / cst.INDEX_NAME).write_text(json.dumps(index))
    assert which(read_checkpoint(out)) == "old"


# --- aprfast's own sharded .apr ---------------------------------------------------------------
SAVE = r"""
import aprfast
aprfast.save_file(aprfast.load_file(sys.argv[2]), sys.argv[3], max_shard_size=int(sys.argv[4]))
"""


def read_apr(path) -> dict:
    return aprfast.load_file(path, verify=True)


def _only_the_model(directory) -> None:
    manifest = json.loads((directory / "m.apr.index.json").read_text())
    assert sorted(os.listdir(directory)) == sorted({"m.apr.index.json", *(s["file"] for s in manifest["shards"])})


@pytest.mark.slow("kill -9 harness")
def test_a_sharded_save_killed_at_any_step_leaves_the_old_model_or_the_new(tmp_path):
    aprfast.save_file(OLD, tmp_path / "old.apr")
    aprfast.save_file(NEW, tmp_path / "new.apr")
    out = tmp_path / "model"
    out.mkdir()
    target = out / "m.apr"
    aprfast.save_file(OLD, target, max_shard_size=SHARD)
    total = _events(_child(SAVE, 0, tmp_path / "old.apr", target, SHARD))
    assert total >= 7
    for k in range(1, total + 1):
        aprfast.save_file(OLD, target, max_shard_size=SHARD)
        result = _child(SAVE, k, tmp_path / "new.apr", target, SHARD)
        assert result.returncode in (0, 137), result.stderr
        assert which(read_apr(out)) in ("old", "new"), f"killed before step {k} of {total}"
        aprfast.save_file(NEW, target, max_shard_size=SHARD)
        assert which(read_apr(out)) == "new"
        _only_the_model(out)


def test_a_mixed_apr_set_is_refused_at_open_naming_the_shard(tmp_path):
    for name, model in (("a", OLD), ("b", NEW)):
        (tmp_path / name).mkdir()
        aprfast.save_file(model, tmp_path / name / "m.apr", max_shard_size=SHARD)
    second = "m-00002-of-00003.apr"
    (tmp_path / "a" / second).write_bytes((tmp_path / "b" / second).read_bytes())  # same size, same names
    with aprfast.open(tmp_path / "a") as f:
        np.testing.assert_array_equal(f.get_tensor("t0"), OLD["t0"])
        with pytest.raises(ChecksumError, match=second) as error:
            f.get_tensor("t2")  # no data read to find out: the footer's CRC against the manifest's
    assert error.value.code == "E004"


def test_staged_shards_carry_the_one_temporary_name(tmp_path):
    """What a sharded save keeps on disk before its switch is named and locked like any
    temporary (the old ``.{shard}.{token}.part`` files were neither: N10)."""
    out = tmp_path / "model"
    out.mkdir()
    body = r"""
import aprfast
from aprfast.io import atomic
real = atomic.publish_set
def stop(members, index, **kw):
    print("STAGED", *sorted(os.path.basename(m.temp_path) for m in members + [index]), flush=True)
    os._exit(137)
atomic.publish_set = stop
import aprfast.files.shards as shards
shards.publish_set = stop
aprfast.save_file(aprfast.load_file(sys.argv[2]), sys.argv[3], max_shard_size=int(sys.argv[4]))
"""
    aprfast.save_file(NEW, tmp_path / "new.apr")
    result = _child(body, 0, tmp_path / "new.apr", out / "m.apr", SHARD)
    assert result.returncode == 137, result.stderr
    staged = result.stdout.split("STAGED")[1].split()
    assert len(staged) == 4 and all(TEMP_NAME.fullmatch(n) for n in staged)
    assert sorted(os.listdir(out)) == sorted(staged)
    aprfast.save_file({"x": np.ones(4, np.float32)}, out / "other.apr")  # any later save there sweeps them
    assert os.listdir(out) == ["other.apr"]


def test_one_shard_over_a_sharded_checkpoint_replaces_it(checkpoint):
    """A conversion that fits one shard writes ``model.safetensors``; over a sharded
    checkpoint it needs force=True, and then the old index (which readers of the directory
    would still take) and its shards go once the new file is in place."""
    tmp_path, out = checkpoint
    from aprfast.convert import DestinationExistsError

    with pytest.raises(DestinationExistsError, match=cst.INDEX_NAME):
        aprfast.convert(tmp_path / "new.apr", out, max_shard_size="1GB")
    assert which(read_checkpoint(out)) == "old"
    aprfast.convert(tmp_path / "new.apr", out, max_shard_size="1GB", force=True)
    assert os.listdir(out) == ["model.safetensors"]
    assert which(read_checkpoint(out)) == "new"
