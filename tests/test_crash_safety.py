"""A save killed at any moment (kill -9) or refused by the OS (file too large) leaves
the target whole, old or new, and nothing that lives forever beside it.

On Linux saves write to an unnamed O_TMPFILE inode; elsewhere (and on filesystems
without O_TMPFILE, forced here with ``atomic_files._proc_links_work = False``) to a
recognisable, flock-ed temporary name that the next save into the directory removes
once its writer is gone.  No assertion here depends on timing: kill points are drawn
at random over the length of an uninterrupted save, and every outcome is allowed
except a torn target or a leftover that the next save does not remove.
"""

import hashlib
import os
import random
import signal
import stat
import subprocess
import sys
import tempfile

import numpy as np
import pytest

import aprfast
from aprfast import v1
from aprfast.crypto import core as crypto
from aprfast.io import atomic as atomic_files

pytestmark = pytest.mark.skipif(os.name != "posix", reason="kill -9, flock and rlimits are POSIX")

TARGET = "model.apr"
V1_META = {"created_at": "1700000000", "aprender_version": "0.0.0-test"}
CHILD_PRELUDE = r"""
import os, sys
import numpy as np
import aprfast
from aprfast import v1
from aprfast.io import atomic as atomic_files
from aprfast.files import writer

def new_tensors(mb):
    n = (mb << 20) // 4 // 4
    return {f"layers.{i}": np.arange(n, dtype=np.float32) + i for i in range(4)}

def save(kind, tensors, path, durable):
    if kind == "save_file":
        aprfast.save_file(tensors, path, {"generation": "new"}, durable=durable)
    elif kind == "writer":
        with aprfast.Writer(path, {"generation": "new"}, durable=durable) as w:
            for name, array in tensors.items():
                w.add(name, array)
    else:
        v1.save_model(tensors, path, model_type=1, metadata=%r, durable=durable)

def force_named_temps(mode):
    if mode == "named":  # as on a filesystem without O_TMPFILE, or off Linux
        atomic_files._proc_links_work = False
""" % (V1_META,)

SAVE_CHILD = CHILD_PRELUDE + r"""
kind, path, mode, durable, mb = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "1", int(sys.argv[5])
force_named_temps(mode)
tensors = new_tensors(mb)
print("ready", flush=True)
save(kind, tensors, path, durable)
print("done", flush=True)
"""

_prelude = {}
exec(compile(CHILD_PRELUDE, "<child prelude>", "exec"), _prelude)  # the children's helpers, here too
new_tensors, save = _prelude["new_tensors"], _prelude["save"]

KINDS = ["save_file", "writer", "v1"]
TRIAL_MB = 128


def child_env():
    package_parent = os.path.dirname(os.path.dirname(os.path.abspath(aprfast.__file__)))
    return dict(os.environ, PYTHONPATH=package_parent)


def spawn(script, *args, stdin=None):
    return subprocess.Popen([sys.executable, "-c", script, *map(str, args)], env=child_env(),
                            cwd=tempfile.gettempdir(), stdin=stdin, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def digest(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(8 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def old_tensors():
    return {"old": np.full(1000, 3.0, np.float32)}


def write_old(kind, path):
    save(kind, old_tensors(), path, True)


def leftovers(directory, *keep):
    return sorted(set(os.listdir(directory)) - set(keep))


def recognisable(name):
    return atomic_files._TEMP_NAME.fullmatch(name) is not None


def assert_whole(kind, path, old_digest, new_digest):
    """The target is byte for byte the old or the new file, and it loads."""
    found = digest(path)
    assert found in (old_digest, new_digest), "the target is torn"
    if kind == "v1":
        payload = v1.load_model(path).payload
    else:
        payload = aprfast.load_file(path)
    if found == new_digest:
        assert payload["layers.3"][:3].tolist() == [3.0, 4.0, 5.0]
    else:
        assert payload["old"][0] == 3.0
    del payload
    return found == new_digest


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    """sha256 of the old and of the new target for each kind, written uninterrupted."""
    directory = tmp_path_factory.mktemp("references")
    refs = {}
    for kind in KINDS:
        old, new = directory / f"{kind}-old.apr", directory / f"{kind}-new.apr"
        write_old(kind, old)
        save(kind, new_tensors(TRIAL_MB), new, False)
        refs[kind] = (digest(old), digest(new), old.read_bytes())
    return refs


def uninterrupted_seconds(kind, directory, mode, durable):
    """How long one child's save takes from 'ready' to exit: the span kills are drawn from."""
    import time

    child = spawn(SAVE_CHILD, kind, directory / TARGET, mode, int(durable), TRIAL_MB)
    assert child.stdout.readline() == "ready\n", child.stderr.read()
    start = time.monotonic()
    out, err = child.communicate(timeout=120)
    assert child.returncode == 0 and "done" in out, err
    return time.monotonic() - start


@pytest.mark.slow("kill -9 harness")
@pytest.mark.parametrize("mode, trials", [("tmpfile", 5), ("named", 3)])
@pytest.mark.parametrize("kind", KINDS)
def test_kill_9_mid_save_leaves_old_or_new_and_nothing_that_lasts(tmp_path, references, kind, mode, trials):
    old_digest, new_digest, old_bytes = references[kind]
    durable = kind != "save_file"  # both fsync and no-fsync paths are killed somewhere
    span = uninterrupted_seconds(kind, tmp_path, mode, durable)
    assert leftovers(tmp_path, TARGET) == []
    rng = random.Random(f"{kind}-{mode}")
    outcomes = []
    for trial in range(trials):
        directory = tmp_path / f"trial{trial}"
        directory.mkdir()
        (directory / TARGET).write_bytes(old_bytes)
        child = spawn(SAVE_CHILD, kind, directory / TARGET, mode, int(durable), TRIAL_MB)
        assert child.stdout.readline() == "ready\n", child.stderr.read()
        try:
            child.wait(timeout=rng.uniform(0, span * 1.1))
        except subprocess.TimeoutExpired:
            child.send_signal(signal.SIGKILL)
        child.communicate(timeout=60)
        outcomes.append(child.returncode)

        assert_whole(kind, directory / TARGET, old_digest, new_digest)
        left = leftovers(directory, TARGET)
        if mode == "tmpfile":
            # Only a kill in the microseconds between linking the finished file to a
            # temporary name and renaming it can leave anything, and that is swept.
            assert len(left) <= 1
        assert all(recognisable(name) for name in left), left
        # The next save into the directory removes whatever the killed one left.
        aprfast.save_file(old_tensors(), directory / "next.apr", durable=False)
        assert leftovers(directory, TARGET, "next.apr") == []
    assert all(code in (0, -signal.SIGKILL) for code in outcomes), outcomes


def test_a_killed_named_temp_file_is_removed_by_the_next_save(tmp_path):
    script = CHILD_PRELUDE + r"""
force_named_temps("named")
atomic = atomic_files.AtomicFile(sys.argv[1])
os.write(atomic.fd, b"half a model")
print(atomic.temp_path, flush=True)
sys.stdin.read()
"""
    child = spawn(script, tmp_path / TARGET, stdin=subprocess.PIPE)
    temp = child.stdout.readline().strip()
    assert os.path.dirname(temp) == str(tmp_path) and recognisable(os.path.basename(temp))
    child.kill()
    child.communicate()
    assert os.path.exists(temp)  # a dead writer's file, as a killed save on NFS leaves it
    aprfast.save_file(old_tensors(), tmp_path / "other.apr")
    assert leftovers(tmp_path) == ["other.apr"]


def test_a_stale_temp_name_of_a_dead_pid_is_removed(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / f".{TARGET}.aprfast-{dead.pid}-0123456789abcdef.tmp"
    stale.write_bytes(b"x" * 1000)
    with aprfast.Writer(tmp_path / TARGET) as w:
        w.add("a", np.arange(3))
    assert leftovers(tmp_path) == [TARGET]


@pytest.mark.parametrize("how", ["named", "tmpfile-linked"])
def test_a_live_writers_temp_file_is_never_removed(tmp_path, how):
    """``named``: the fallback path mid-write.  ``tmpfile-linked``: an O_TMPFILE save
    between linking its temporary name and renaming it over the target."""
    if how == "tmpfile-linked" and not unnamed_temps_work(tmp_path):
        pytest.skip("no O_TMPFILE here")
    script = CHILD_PRELUDE + r"""
how, path = sys.argv[1], sys.argv[2]
force_named_temps("named" if how == "named" else "tmpfile")
atomic = atomic_files.AtomicFile(path)
os.write(atomic.fd, b"the new model")
if how != "named":
    atomic.temp_path = atomic_files._temp_path(atomic.directory, os.path.basename(path))
    assert atomic_files._link_fd(atomic.fd, atomic.temp_path)
print(atomic.temp_path, flush=True)
sys.stdin.readline()
if how == "named":
    atomic.commit()
else:  # the rest of what commit() does after linking
    os.replace(atomic.temp_path, path)
    atomic.temp_path = None
    atomic._close()
print("committed", flush=True)
"""
    (tmp_path / TARGET).write_bytes(b"the old model")
    child = spawn(script, how, tmp_path / TARGET, stdin=subprocess.PIPE)
    temp = child.stdout.readline().strip()
    assert temp and os.path.exists(temp), child.stderr.read()
    # Another process saves into the same directory, twice, and sweeps explicitly.
    aprfast.save_file(old_tensors(), tmp_path / "other.apr")
    with aprfast.Writer(tmp_path / "other2.apr") as w:
        w.add("a", np.arange(3))
    assert atomic_files.sweep_abandoned_temps(str(tmp_path)) == 0
    assert os.path.exists(temp)
    assert (tmp_path / TARGET).read_bytes() == b"the old model"
    out, err = child.communicate("go\n", timeout=60)
    assert child.returncode == 0 and "committed" in out, err
    assert (tmp_path / TARGET).read_bytes() == b"the new model"
    assert leftovers(tmp_path) == sorted([TARGET, "other.apr", "other2.apr"])


def unnamed_temps_work(directory) -> bool:
    fd = atomic_files._open_unnamed(str(directory), 0o600)
    if fd < 0:
        return False
    os.close(fd)
    return True


def test_saves_on_linux_have_no_name_until_committed(tmp_path):
    if not unnamed_temps_work(tmp_path):
        pytest.skip("no O_TMPFILE here")
    (tmp_path / TARGET).write_bytes(b"old")
    atomic = atomic_files.AtomicFile(tmp_path / TARGET)
    os.write(atomic.fd, b"new")
    assert atomic.temp_path is None and leftovers(tmp_path) == [TARGET]
    atomic.commit()
    assert (tmp_path / TARGET).read_bytes() == b"new" and leftovers(tmp_path) == [TARGET]
    assert stat.S_IMODE(os.stat(tmp_path / TARGET).st_mode) == 0o666 & ~current_umask()
    aborted = atomic_files.AtomicFile(tmp_path / "never.apr")
    os.write(aborted.fd, b"gone")
    aborted.abort()
    assert leftovers(tmp_path) == [TARGET]


def test_the_fallback_path_keeps_mode_and_cleans_up(tmp_path, monkeypatch):
    monkeypatch.setattr(atomic_files, "_proc_links_work", False)
    atomic = atomic_files.AtomicFile(tmp_path / TARGET)
    assert recognisable(os.path.basename(atomic.temp_path))
    assert stat.S_IMODE(os.fstat(atomic.fd).st_mode) == 0o666 & ~current_umask()
    os.write(atomic.fd, b"new")
    atomic.commit()
    assert leftovers(tmp_path) == [TARGET]
    crypto.save_key(tmp_path / "k.key", bytes(range(32)), kind="ed25519-private")
    assert stat.S_IMODE(os.stat(tmp_path / "k.key").st_mode) == 0o600
    with aprfast.Writer(tmp_path / "w.apr") as w:  # the spool: named for an instant, then unlinked
        w.add("a", np.arange(10))
        assert leftovers(tmp_path, TARGET, "k.key") == []
    assert leftovers(tmp_path) == sorted([TARGET, "k.key", "w.apr"])


def test_a_name_a_sweeper_got_to_first_is_given_up(tmp_path, monkeypatch):
    """Between creating a temporary name and locking it a sweep may lock it (and is
    about to unlink it): the writer then gives that name up and takes another."""
    monkeypatch.setattr(atomic_files, "_proc_links_work", False)
    real_lock, calls = atomic_files._lock, []

    def lock_taken_the_first_time(fd):
        calls.append(fd)
        return False if len(calls) == 1 else real_lock(fd)

    monkeypatch.setattr(atomic_files, "_lock", lock_taken_the_first_time)
    atomic = atomic_files.AtomicFile(tmp_path / TARGET)
    assert len(calls) == 2 and leftovers(tmp_path) == [os.path.basename(atomic.temp_path)]
    os.write(atomic.fd, b"new")
    atomic.commit()
    assert leftovers(tmp_path) == [TARGET] and (tmp_path / TARGET).read_bytes() == b"new"


def test_a_refused_proc_link_falls_back_to_a_copy(tmp_path, monkeypatch):
    if not unnamed_temps_work(tmp_path):
        pytest.skip("no O_TMPFILE here")

    def refused(fd, path):
        raise PermissionError(1, "linking through /proc refused")

    monkeypatch.setattr(atomic_files, "_link_fd", refused)
    monkeypatch.setattr(atomic_files, "_proc_links_work", True)
    (tmp_path / TARGET).write_bytes(b"old")
    atomic = atomic_files.AtomicFile(tmp_path / TARGET, mode=0o640)
    assert atomic.temp_path is None
    os.write(atomic.fd, b"new" * 100000)
    atomic.commit()
    assert (tmp_path / TARGET).read_bytes() == b"new" * 100000
    assert stat.S_IMODE(os.stat(tmp_path / TARGET).st_mode) == 0o640 & ~current_umask()
    assert leftovers(tmp_path) == [TARGET]
    assert atomic_files._proc_links_work is False  # later saves name their files from the start


def current_umask():
    umask = os.umask(0)
    os.umask(umask)
    return umask


def test_only_regular_files_and_directories_with_aprfasts_temp_names_are_swept(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    name = f".m.apr.aprfast-{dead.pid}-0123456789abcdef.tmp"
    keep = [
        ".m.apr.x7k2_9ab.tmp",  # the names of earlier versions: their writers take no lock
        f".m.apr.aprfast-{dead.pid}-notrandom.tmp",
        "m.apr.aprfast-1-0123456789abcdef.tmp",  # not hidden
        "notes.txt",
    ]
    for other in keep:
        (tmp_path / other).write_bytes(b"keep")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / name).mkdir()  # a directory with the name: a killed writer's scratch (N11)
    (tmp_path / "sub" / name / "partial.apr").write_bytes(b"partial")
    (tmp_path / "target").write_bytes(b"precious")
    os.symlink(tmp_path / "target", tmp_path / "sub" / name.replace("0123", "4567"))
    (tmp_path / name).write_bytes(b"stale")
    assert atomic_files.sweep_abandoned_temps(str(tmp_path)) == 1
    assert atomic_files.sweep_abandoned_temps(str(tmp_path / "sub")) == 1  # the directory, not the symlink
    assert leftovers(tmp_path) == sorted(keep + ["sub", "target"])
    assert (tmp_path / "target").read_bytes() == b"precious"
    assert os.listdir(tmp_path / "sub") == [name.replace("0123", "4567")]


def test_saves_survive_a_concurrent_sweeper(tmp_path, monkeypatch):
    """A process sweeping the directory non-stop never removes a live save's file."""
    monkeypatch.setattr(atomic_files, "_proc_links_work", False)
    sweeper = spawn(r"""
import os, sys
from aprfast.io import atomic as atomic_files
from aprfast.files import writer
directory, stop = sys.argv[1], sys.argv[2]
rounds = 0
while not os.path.exists(stop) or rounds < 10:
    atomic_files.sweep_abandoned_temps(directory)
    rounds += 1
print(rounds, flush=True)
""", tmp_path, tmp_path / "stop")
    try:
        for i in range(150):
            tensors = {"a": np.full(1000 + i, i, np.int32)}
            if i % 2:
                aprfast.save_file(tensors, tmp_path / TARGET, durable=False)
            else:
                with aprfast.Writer(tmp_path / TARGET, durable=False) as w:
                    w.add("a", tensors["a"])
            assert aprfast.load_file(tmp_path / TARGET)["a"].tolist() == tensors["a"].tolist()
    finally:
        (tmp_path / "stop").touch()
        out, err = sweeper.communicate(timeout=60)
    assert sweeper.returncode == 0 and int(out) >= 10, err
    assert leftovers(tmp_path) == sorted([TARGET, "stop"])


# --- the OS refusing to write: RLIMIT_FSIZE gives EFBIG, as a full disk gives ENOSPC --

FSIZE_CHILD = CHILD_PRELUDE + r"""
import resource, signal
from aprfast.errors import AprIOError
kind, path, mode, durable, limit = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "1", int(sys.argv[5])
force_named_temps(mode)
tensors = {"big": np.arange(1 << 18, dtype=np.float32)}  # 1 MiB
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # write() then fails with EFBIG
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
try:
    save(kind, tensors, path, durable)
except AprIOError as error:
    print("AprIOError", error.code, error.path == path, flush=True)
    sys.exit(0)
print("saved", flush=True)
sys.exit(1)
"""


@pytest.mark.slow("child processes under rlimits")
@pytest.mark.parametrize("limit", [512 << 10, (1 << 20) + 16], ids=["mid-data", "past-the-data"])
@pytest.mark.parametrize("durable", [True, False], ids=["durable", "fast"])
@pytest.mark.parametrize("mode", ["tmpfile", "named"])
@pytest.mark.parametrize("kind", KINDS)
def test_a_refused_write_is_aprioerror_and_leaves_the_old_file(tmp_path, kind, mode, durable, limit):
    """``past-the-data``: the Writer's spool (the tensor bytes alone) fits, the file
    with its header does not, so the Writer fails while assembling on close."""
    write_old(kind, tmp_path / TARGET)
    old = (tmp_path / TARGET).read_bytes()
    child = spawn(FSIZE_CHILD, kind, tmp_path / TARGET, mode, int(durable), limit)
    out, err = child.communicate(timeout=60)
    assert child.returncode == 0 and out.split() == ["AprIOError", "E007", "True"], (out, err)
    assert (tmp_path / TARGET).read_bytes() == old
    assert leftovers(tmp_path, TARGET) == []
