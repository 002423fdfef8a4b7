"""Free-threaded CPython (3.13t and later): the compiled modules declare that they run
without the GIL, so importing aprfast leaves it off, and the state they share between
threads (the freed-buffer cache in csrc/buffers.c, a name iterator) stays consistent
when threads really run at once.  The sharing tests run on every build; without the GIL
they are the ones that would catch a race."""

import os
import subprocess
import sys
import sysconfig
import threading

import numpy as np
import pytest

import aprfast
from aprfast import _backend, _memory

FREE_THREADED = bool(sysconfig.get_config_var("Py_GIL_DISABLED"))
N_THREADS = 8


def run_threads(work):
    barrier = threading.Barrier(N_THREADS)
    errors = []

    def target(seed):
        try:
            barrier.wait()
            work(seed)
        except BaseException as exc:  # noqa: BLE001 - reported below with its thread
            errors.append((seed, exc))

    threads = [threading.Thread(target=target, args=(seed,)) for seed in range(N_THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads)
    assert not errors, errors


@pytest.mark.skipif(not FREE_THREADED, reason="a free-threaded CPython build (3.13t, 3.14t) decides this")
def test_importing_every_compiled_module_leaves_the_gil_off():
    package_parent = os.path.dirname(os.path.dirname(os.path.abspath(aprfast.__file__)))
    modules = ", ".join(f"aprfast.{name}" for name in _backend.MODULES + ("_cyutility",))
    script = (f"import sys, aprfast, {modules}\n"
              "print(aprfast.backend, sys._is_gil_enabled())\n")
    # -W error: a module that does not declare itself safe re-enables the GIL with a RuntimeWarning.
    done = subprocess.run([sys.executable, "-W", "error", "-c", script], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=package_parent, PYTHON_GIL="", APRFAST_BACKEND="c"),
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["c", "False"]
    if aprfast.backend == "c":  # and in this process, which has imported them all by now
        assert not sys._is_gil_enabled()


def test_threads_allocating_and_freeing_buffers_get_their_own_bytes():
    """The freed-block cache hands each block to one thread only."""
    sizes = [300 << 10, 512 << 10, 1 << 20, 300 << 10]

    def work(seed):
        for i in range(200):
            buf = _memory.AlignedBuffer(sizes[(seed + i) % len(sizes)], 64)
            view = np.frombuffer(buf, np.uint8)
            view[:] = seed
            assert buf.address % 64 == 0
            assert int(view.min()) == seed == int(view.max())
            del view, buf

    run_threads(work)


def test_one_name_iterator_shared_by_threads_yields_each_name_once(tmp_path):
    names = [f"t{i:05d}" for i in range(3000)]
    aprfast.save_file({name: np.zeros(1, np.uint8) for name in names}, tmp_path / "m.apr")
    with aprfast.open(tmp_path / "m.apr") as f:
        shared = iter(f._file.names)
        seen = [[] for _ in range(N_THREADS)]

        def work(seed):
            for name in shared:
                seen[seed].append(name)

        run_threads(work)
    assert sorted(name for part in seen for name in part) == names
