"""The fallbacks of every POSIX-only call (docs/PORTABILITY.md), forced on Linux: each
gives exactly the bytes of the normal path.  Windows takes these paths because the calls
do not exist there; here ``aprfast.io.platform.force`` (or ``APRFAST_FALLBACKS``) makes the
C code and the Python code take them anyway."""

import errno
import hashlib
import os
import subprocess
import sys

import numpy as np
import pytest

import aprfast
from aprfast import _memory
from aprfast.errors import AprFileInUseError, AprIOError, AprPermissionError
from aprfast.io import atomic
from aprfast.io import platform as _platform

BIG = (8 << 20) + 4096  # past csrc/pio.c's PARALLEL_MIN: the read is split over threads


@pytest.fixture
def fallbacks():
    """Force fallbacks for one test; the normal paths come back after it."""
    before = _platform.forced()
    yield _platform.force
    _platform.force(before)


def _tensors(rng, big=False):
    out = {f"layer.{i}.weight": rng.standard_normal((17, 33 + i)).astype(np.float32) for i in range(6)}
    out["bias"] = rng.integers(-100, 100, 1000).astype(np.int16)
    out["empty"] = np.zeros((0, 4), np.float32)
    if big:
        out["huge"] = rng.integers(0, 255, BIG, dtype=np.uint8)
    return out


def _digest(path) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _same_arrays(a: dict, b: dict) -> None:
    assert sorted(a) == sorted(b)
    for name in a:
        assert a[name].dtype == b[name].dtype and a[name].shape == b[name].shape
        assert a[name].tobytes() == b[name].tobytes(), name


def test_force_names_every_fallback_and_restores(fallbacks):
    fallbacks("all")
    assert _platform.forced() == frozenset(_platform.NAMES)
    assert _memory.fallbacks() == {"pread", "fallocate", "madvise", "io_uring"}
    assert not any(_platform.uses(name) for name in _platform.NAMES)
    fallbacks([])
    assert _platform.forced() == frozenset() and _memory.fallbacks() == frozenset()
    with pytest.raises(ValueError, match="unknown fallback"):
        fallbacks("pread,sendfile")


# --- reads ---------------------------------------------------------------------------
def test_positional_read_fallback_gives_the_bytes_of_pread_and_keeps_the_position(tmp_path, fallbacks):
    payload = np.random.default_rng(1).integers(0, 255, 3 << 20, dtype=np.uint8).tobytes()
    path = tmp_path / "blob"
    path.write_bytes(payload)
    with open(path, "rb") as f:
        fd = f.fileno()
        f.seek(123)
        fallbacks("pread")
        for offset, n in [(0, 10), (5, 1 << 20), (len(payload) - 7, 100), (len(payload), 5), (2 << 20, 2 << 20)]:
            assert _platform.pread(fd, n, offset) == payload[offset:offset + n]
            out = bytearray(n)
            got = _platform.preadv(fd, out, offset)
            assert bytes(out[:got]) == payload[offset:offset + n]
            one = bytearray(max(n, 1))
            assert bytes(one[:_memory.pread_some(fd, offset, one)]) == payload[offset:offset + len(one)][:1 << 20]
        out = bytearray(len(payload) - 9)
        assert _memory.pread_into(fd, 9, out, 2, crc=0) is not None and bytes(out) == payload[9:]
        with pytest.raises(EOFError):
            _memory.pread_into(fd, 10, bytearray(len(payload)))
        assert f.tell() == 123  # the fallback put the shared position back


@pytest.mark.parametrize("mode", ["pread", "mmap"])
def test_loads_with_every_fallback_forced_equal_the_normal_loads(tmp_path, rng, fallbacks, mode):
    tensors = _tensors(rng, big=True)
    path = tmp_path / "m.apr"
    aprfast.save_file(tensors, path)
    normal = aprfast.load_file(path)
    fallbacks("all")
    _same_arrays(aprfast.load_file(path), normal)
    with aprfast.open(path, mode=mode, verify=True) as f:  # the whole-file CRC through the fallback
        _same_arrays({name: np.asarray(f.get_tensor(name, copy=True)) for name in f.keys()}, normal)
        assert f.get_slice("huge")[100:200].tobytes() == normal["huge"][100:200].tobytes()
    with open(path, "rb") as fileobj:  # a caller's descriptor: its position is not moved
        fileobj.seek(42)
        with aprfast.open(fileobj, mode="pread") as f:
            assert f.get_tensor("bias").tobytes() == normal["bias"].tobytes()
        assert fileobj.tell() == 42


def test_pure_twin_reads_without_pread_as_on_windows(tmp_path, monkeypatch):
    from aprfast._pure import _memory as pure

    payload = os.urandom(300_000)
    path = tmp_path / "blob"
    path.write_bytes(payload)
    monkeypatch.delattr(os, "pread")
    monkeypatch.delattr(os, "preadv")
    with open(path, "rb") as f:
        out = bytearray(len(payload) - 11)
        assert pure.pread_into(f.fileno(), 11, out, crc=0) == aprfast.crc32(payload[11:])
        assert bytes(out) == payload[11:]
        assert _platform.pread(f.fileno(), 50, len(payload) - 20) == payload[-20:]  # short at the end
        assert f.tell() == 0


def test_python_readers_work_without_os_pread(tmp_path, rng, monkeypatch):
    """convert, the v1 reader and the writer's spool copy take aprfast.io.platform's reads."""
    tensors = _tensors(rng)
    st = pytest.importorskip("safetensors.numpy")
    source = tmp_path / "m.safetensors"
    st.save_file(tensors, str(source))
    aprfast.convert(source, tmp_path / "normal.apr")
    monkeypatch.delattr(os, "pread")
    monkeypatch.delattr(os, "preadv")
    aprfast.convert(source, tmp_path / "fallback.apr")
    assert _digest(tmp_path / "fallback.apr") == _digest(tmp_path / "normal.apr")


# --- writes --------------------------------------------------------------------------
def _write_all_ways(tensors, directory):
    """save_file (durable and not: fallocate), a spooled Writer (copy_file_range), a planned Writer."""
    os.makedirs(directory, exist_ok=True)
    aprfast.save_file(tensors, os.path.join(directory, "a.apr"))
    aprfast.save_file(tensors, os.path.join(directory, "b.apr"), durable=False)
    with aprfast.Writer(os.path.join(directory, "c.apr")) as w:
        for name in reversed(sorted(tensors)):
            w.add(name, tensors[name])
    plan = [(name, tensors[name].dtype, tensors[name].shape) for name in sorted(tensors)]
    with aprfast.Writer(os.path.join(directory, "d.apr"), plan=plan, durable=False) as w:
        for name in sorted(tensors):
            w.add(name, tensors[name])
    aprfast.save_file(tensors, os.path.join(directory, "a.apr"))  # over an existing file
    return {name: _digest(os.path.join(directory, name)) for name in sorted(os.listdir(directory))}


def test_writes_with_every_fallback_forced_give_the_same_bytes(tmp_path, rng, fallbacks):
    tensors = _tensors(rng)
    normal = _write_all_ways(tensors, tmp_path / "normal")
    fallbacks("all")
    forced = _write_all_ways(tensors, tmp_path / "forced")
    assert forced == normal  # same names (no temporary file left behind) and bytes
    assert len(set(normal.values())) == 1


def test_windows_commit_order_without_locks_gives_the_same_bytes(tmp_path, rng, fallbacks, monkeypatch):
    """Without fcntl (Windows) the temporary file is closed before it is renamed."""
    tensors = _tensors(rng)
    aprfast.save_file(tensors, tmp_path / "normal.apr")
    fallbacks("o_tmpfile,dir_fsync")
    monkeypatch.setattr(atomic, "fcntl", None)
    aprfast.save_file(tensors, tmp_path / "windows.apr")
    aprfast.save_file(tensors, tmp_path / "windows.apr")
    assert _digest(tmp_path / "windows.apr") == _digest(tmp_path / "normal.apr")
    assert sorted(os.listdir(tmp_path)) == ["normal.apr", "windows.apr"]


def test_sharded_save_with_fallbacks_forced_gives_the_same_files(tmp_path, rng, fallbacks):
    tensors = _tensors(rng)
    for kind in ("normal", "forced"):
        if kind == "forced":
            fallbacks("all")
        os.makedirs(tmp_path / kind)
        aprfast.save_file(tensors, tmp_path / kind / "m.apr", max_shard_size=4096)
    normal = {n: _digest(tmp_path / "normal" / n) for n in sorted(os.listdir(tmp_path / "normal"))}
    forced = {n: _digest(tmp_path / "forced" / n) for n in sorted(os.listdir(tmp_path / "forced"))}
    assert len(normal) > 2 and forced == normal


def test_preallocate_fallback_reports_enosys_and_the_buffers_skip_advice(tmp_path, fallbacks):
    with open(tmp_path / "f", "wb") as f:
        fallbacks("fallocate,madvise")
        assert _memory.preallocate(f.fileno(), 1 << 20) == errno.ENOSYS
        assert os.fstat(f.fileno()).st_size == 0
    for size in (40 << 20, 300 << 10):  # a mapped block and a heap block, each freed to the cache and reused
        for _ in range(2):
            buf = _memory.AlignedBuffer(size)
            view = np.frombuffer(buf, np.uint8)
            view[::4096] = 7
            assert buf.address % 64 == 0 and int(view[::4096].sum()) == 7 * len(view[::4096])
            del view, buf


def _child(script, *args, **env):
    """A child process importing this aprfast, with ``env`` added to its environment."""
    package_parent = os.path.dirname(os.path.dirname(os.path.abspath(aprfast.__file__)))
    return subprocess.run([sys.executable, "-c", script, *map(str, args)], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=package_parent, **env), timeout=120)


def test_environment_variable_forces_the_fallbacks_in_a_new_process(tmp_path, rng):
    tensors = _tensors(rng, big=True)
    path = tmp_path / "m.apr"
    aprfast.save_file(tensors, path)
    script = ("import sys, hashlib, aprfast\nfrom aprfast import _memory, _platform\n"
              "print(sorted(_platform.forced()))\nprint(sorted(_memory.fallbacks()))\n"
              "t = aprfast.load_file(sys.argv[1])\n"
              "aprfast.save_file(t, sys.argv[2])\n"
              "print(hashlib.sha256(b''.join(t[k].tobytes() for k in sorted(t))).hexdigest())\n")
    done = _child(script, path, tmp_path / "copy.apr", APRFAST_FALLBACKS="all")
    assert done.returncode == 0, done.stderr
    forced, c_forced, digest = done.stdout.splitlines()
    assert forced == repr(sorted(_platform.NAMES)) and c_forced == repr(["fallocate", "io_uring", "madvise", "pread"])
    assert digest == hashlib.sha256(b"".join(tensors[k].tobytes() for k in sorted(tensors))).hexdigest()
    assert _digest(tmp_path / "copy.apr") == _digest(path)
    bad = _child("import aprfast", APRFAST_FALLBACKS="pread,bogus")
    assert bad.returncode != 0 and "unknown fallback bogus" in bad.stderr


# --- replacing a file that is in use -------------------------------------------------
def test_a_save_replaces_a_file_another_process_has_mapped_where_the_os_allows(tmp_path, rng):
    """POSIX renames over a mapped file: the other process keeps reading the old bytes."""
    old, new = _tensors(rng), {"x": np.arange(5, dtype=np.float32)}
    path = tmp_path / "m.apr"
    aprfast.save_file(old, path)
    package_parent = os.path.dirname(os.path.dirname(os.path.abspath(aprfast.__file__)))
    child = subprocess.Popen(  # not _child: it talks to the child while it runs
        [sys.executable, "-c",
         "import sys, aprfast\nf = aprfast.open(sys.argv[1])\nv = f.get_tensor('bias')\n"
         "print('mapped', flush=True)\nsys.stdin.readline()\nprint(v.tobytes().hex())\n", str(path)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=package_parent))
    try:
        assert child.stdout.readline().strip() == "mapped"
        if _platform.WINDOWS:  # pragma: no cover - run by the Windows wheel tests
            with pytest.raises(AprFileInUseError):
                aprfast.save_file(new, path)
            return
        aprfast.save_file(new, path)
        out, _ = child.communicate("go\n", timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert out.strip() == old["bias"].tobytes().hex()
    _same_arrays(aprfast.load_file(path), new)


@pytest.mark.parametrize("forced", ["", "o_tmpfile"])
def test_windows_refusal_to_replace_a_file_in_use_is_a_typed_error(tmp_path, rng, fallbacks, monkeypatch, forced):
    old = _tensors(rng)
    path = tmp_path / "m.apr"
    aprfast.save_file(old, path)
    before = _digest(path)
    fallbacks(forced)
    real_replace = os.replace

    def refuse(src, dst):
        if os.path.exists(dst):
            raise PermissionError(errno.EACCES, "Access is denied", str(dst))
        real_replace(src, dst)

    monkeypatch.setattr(_platform, "WINDOWS", True)
    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(AprFileInUseError) as caught:
        aprfast.save_file({"x": np.zeros(3, np.float32)}, path)
    error = caught.value
    assert error.code == "E007" and isinstance(error, (AprIOError, AprPermissionError, PermissionError))
    assert "in use" in str(error) and str(path) in str(error)
    assert _digest(path) == before and os.listdir(tmp_path) == ["m.apr"]  # old file whole, no temp left
    aprfast.save_file({"x": np.zeros(3, np.float32)}, tmp_path / "new.apr")  # no destination: no refusal


def test_a_permission_error_on_posix_stays_a_permission_error(tmp_path, monkeypatch):
    monkeypatch.setattr(_platform, "WINDOWS", False)

    def refuse(src, dst):
        raise PermissionError(errno.EACCES, "Permission denied", str(dst))

    (tmp_path / "d").write_bytes(b"x")
    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(PermissionError) as caught:
        _platform.replace(str(tmp_path / "s"), str(tmp_path / "d"))
    assert not isinstance(caught.value, AprFileInUseError)
