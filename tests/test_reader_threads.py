"""One open AprFile read from 8 threads at once gives every thread the right tensors."""

import io
import threading

import numpy as np
import pytest
from ml_dtypes import bfloat16

import aprfast

N_THREADS = 8
READS_PER_THREAD = 150


def model():
    rng = np.random.default_rng(99)
    tensors = {}
    for i in range(24):
        dtype = [np.float32, np.float16, np.int64, np.uint8, bfloat16, np.float64][i % 6]
        shape = (int(rng.integers(1, 40)), int(rng.integers(1, 40)))
        tensors[f"layer.{i}.w"] = rng.standard_normal(shape).astype(dtype)
    tensors["big"] = rng.standard_normal((512, 1024)).astype(np.float32)  # 2 MiB
    tensors["scalar"] = np.array(7, np.int32)
    return tensors


def run_threads(work):
    barrier = threading.Barrier(N_THREADS)
    errors = []

    def target(seed):
        try:
            barrier.wait()
            work(np.random.default_rng(seed))
        except BaseException as exc:  # noqa: BLE001 - reported below with its thread
            errors.append((seed, exc))

    threads = [threading.Thread(target=target, args=(seed,)) for seed in range(N_THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads)
    assert not errors, errors


def random_reads(f, tensors, checked):
    names = sorted(tensors)

    def work(rng):
        for _ in range(READS_PER_THREAD):
            name = names[int(rng.integers(len(names)))]
            want = tensors[name]
            kind = int(rng.integers(3))
            if kind == 2 and want.ndim:
                lo = int(rng.integers(want.shape[0]))
                hi = int(rng.integers(lo, want.shape[0] + 1))
                step = int(rng.choice([1, 2, -1]))
                key = (slice(lo, hi, step),) if step > 0 else (slice(hi, lo, step),)
                got, expect = f.get_slice(name)[key], want[key]
            else:
                got, expect = f.get_tensor(name, copy=bool(kind)), want
            assert got.dtype == expect.dtype and got.shape == expect.shape, name
            assert got.tobytes() == np.ascontiguousarray(expect).tobytes(), name
            checked.append(1)

    return work


@pytest.mark.parametrize("mode", ["mmap", "pread"])
@pytest.mark.parametrize("layout", ["aprender", "apr2"])
def test_eight_threads_read_random_tensors_correctly(tmp_path, mode, layout):
    tensors = model()
    path = tmp_path / "m.apr"
    aprfast.save_file(tensors, path, layout=layout)
    checked = []
    f = aprfast.open(path, mode=mode)
    run_threads(random_reads(f, tensors, checked))
    assert len(checked) == N_THREADS * READS_PER_THREAD
    f.close()
    assert f.closed


def test_eight_threads_read_from_an_in_memory_stream():
    tensors = model()
    checked = []
    with aprfast.open(io.BytesIO(aprfast.save(tensors))) as f:
        run_threads(random_reads(f, tensors, checked))
    assert len(checked) == N_THREADS * READS_PER_THREAD


@pytest.mark.parametrize("mode", ["mmap", "pread"])
def test_threads_verify_and_load_all_concurrently(tmp_path, mode):
    tensors = model()
    path = tmp_path / "m.apr"
    aprfast.save_file(tensors, path)
    f = aprfast.open(path, mode=mode)

    def work(rng):
        for _ in range(3):
            f.verify()
            loaded = f.load_all(threads=int(rng.integers(0, 3)))
            for name in ("big", "layer.3.w", "scalar"):
                assert loaded[name].tobytes() == tensors[name].tobytes()
            assert f.metadata == f.metadata
            assert f.info("big").nbytes == tensors["big"].nbytes

    run_threads(work)
    f.close()


def test_views_handed_to_threads_stay_valid_after_close(tmp_path):
    tensors = model()
    path = tmp_path / "m.apr"
    aprfast.save_file(tensors, path)
    f = aprfast.open(path, mode="mmap")
    views = {}

    def work(rng):
        for name in tensors:
            views.setdefault(name, f.get_tensor(name))

    run_threads(work)
    f.close()
    for name, want in tensors.items():
        assert views[name].tobytes() == want.tobytes(), name
    with pytest.raises(aprfast.AprIOError):
        f.get_tensor("big")
