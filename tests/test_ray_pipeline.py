"""examples/dask_pipeline.py --engine ray (issue 15 part 5): the same example, the same one
task per model, scheduled on a local Ray cluster (2 CPUs, every Ray process listening on
127.0.0.1 only) and written to the local moto S3 server; each object equals the quantized
input.  And aprfast handles (local, sharded, S3) through Ray's serialization: they pickle
as their path and options, are reopened by the worker, and are refused there when the file
changed.  Every Ray process started here is gone afterwards.

Ray is optional (``pip install "aprfast[ray]"``): without it this module skips.  Whether it
is installed is asked without importing it, because Ray reads its settings when imported
and ``ray_cluster()`` sets them first (see the example's LOCAL_RAY_ENVIRONMENT)."""

import contextlib
import gc
import importlib.util
import ipaddress
import os
import subprocess
import sys
import time
import uuid

import numpy as np
import pytest
from pipeline_cases import EXAMPLE, check_written, load_example, models, write_models
from servers import s3_server  # noqa: F401 - the fixture

import aprfast
from aprfast.distributed import PicklingRefusedError
from aprfast.errors import AprIOError


def _ray_installed() -> bool:
    try:
        return importlib.util.find_spec("ray") is not None
    except ImportError:  # an import system that refuses it (tests/test_optional_dependencies.py's way)
        return False


if not _ray_installed():
    pytest.skip("Ray is not installed (pip install 'aprfast[ray]'): the pipeline on Ray is not tested",
                allow_module_level=True)
pytest.importorskip("s3fs")
pytest.importorskip("safetensors")
if os.environ.get("APRFAST_SANITIZED"):
    # Ray's own C++ processes (gcs_server, raylet) would inherit tests/sanitize.sh's
    # LD_PRELOAD of libasan; aprfast's code in the tasks is the same as on Dask, tested there.
    pytest.skip("Ray's processes are not run under the sanitizers", allow_module_level=True)

# Ray's own leftovers, not aprfast's: Ray (2.20 to 2.40 at least) leaves the log files of its
# session open after ray.init, and 2.40's ray.shutdown() drops the Popen of a process it
# signalled.  pytest reports them when they are collected; the fixture collects them at its
# teardown, under these filters.  That every process a cluster started is gone is checked
# through /proc instead.
pytestmark = [
    pytest.mark.slow("a Ray cluster"),
    pytest.mark.filterwarnings(r"ignore:Exception ignored in. <_io.FileIO name='\S*[/\\]session_\S*[/\\]logs[/\\]"
                               r":pytest.PytestUnraisableExceptionWarning"),
    pytest.mark.filterwarnings(r"ignore:Exception ignored in. <function Popen.__del__"
                               r":pytest.PytestUnraisableExceptionWarning"),
    # JAX, imported by earlier modules of a whole-suite run, warns from its at-fork hook
    # when Ray's processes fork; the warning is about JAX's threads, which these tests
    # never use in a child.
    pytest.mark.filterwarnings(r"ignore:os.fork\(\) was called:RuntimeWarning"),
    pytest.mark.filterwarnings(r"ignore:Exception ignored in. <function _at_fork"
                               r":pytest.PytestUnraisableExceptionWarning"),
]

BIG = {"w": np.arange(256 * 1024, dtype=np.float32).reshape(1024, 256), "b": np.arange(7, dtype=np.int16)}
#: How long Ray's processes may take to exit after ray.shutdown() (it signals them and returns).
EXIT_GRACE = 60.0


# --- the processes a cluster started: marked by an environment variable they inherit ---------
def _marked_processes(mark: str) -> list:
    """Pids of the processes whose environment holds ``APRFAST_TEST_RAY=mark`` (Linux)."""
    wanted = f"APRFAST_TEST_RAY={mark}".encode()
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if wanted in f.read().split(b"\0"):
                    pids.append(int(entry))
        except OSError:  # gone meanwhile, or not ours to read
            continue
    return pids


def _left_behind(mark: str) -> list:
    """The marked processes still alive once they had EXIT_GRACE seconds to exit."""
    deadline = time.monotonic() + EXIT_GRACE
    while True:
        pids = _marked_processes(mark)
        if not pids or time.monotonic() > deadline:
            return pids
        time.sleep(0.2)


def _socket_inodes(pid: int) -> set:
    inodes = set()
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
    return inodes


def _address(hex_address: str):
    """/proc/net/tcp's hex address (each 32-bit word in host byte order, little-endian here)."""
    raw = bytes.fromhex(hex_address)
    return ipaddress.ip_address(b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4)))


def _listening_addresses(pids) -> set:
    """The local addresses of the TCP sockets the processes ``pids`` listen on."""
    inodes = set().union(*(_socket_inodes(pid) for pid in pids))
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                    found.add(_address(fields[1].split(":")[0]))
    return found


def _is_loopback(address) -> bool:
    mapped = getattr(address, "ipv4_mapped", None)
    return address.is_loopback or (mapped is not None and mapped.is_loopback)


linux_only = pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="reads /proc (Linux)")


# --- the command line first: it starts and stops a cluster of its own -----------------------
@linux_only
def test_command_line_starts_a_local_cluster_and_stops_it(tmp_path, s3_server):  # noqa: F811
    src = tmp_path / "models"
    src.mkdir()
    tensors = {"w": np.arange(64 * 32, dtype=np.float32).reshape(64, 32) / 3}
    aprfast.save_file(tensors, src / "one.apr")
    bucket = s3_server.make_bucket()
    mark = uuid.uuid4().hex
    package_parent = os.path.dirname(os.path.dirname(os.path.abspath(aprfast.__file__)))
    # credentials from the environment (the S3 fixture's dummy ones), the endpoint from the command line
    env = dict(os.environ, PYTHONPATH=package_parent, APRFAST_TEST_RAY=mark)
    out = subprocess.run([sys.executable, EXAMPLE, str(src), f"s3://{bucket}/cli", "--engine", "ray",
                          "--workers", "2", "--quantize", "Q4_0", "--endpoint-url", s3_server.endpoint_url],
                         env=env, cwd=str(tmp_path), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert f"-> s3://{bucket}/cli/one.apr: 1 tensors" in out.stdout
    got = aprfast.load(s3_server.fs().cat_file(f"{bucket}/cli/one.apr"))
    assert got["w"] == aprfast.quantize(tensors["w"], "Q4_0")
    assert _left_behind(mark) == []  # ray.shutdown() at the end stopped every Ray process


# --- one local cluster in this process for the rest ------------------------------------------
@pytest.fixture(scope="module")
def ray_local(s3_server):  # noqa: F811 - after the S3 fixture, so Ray's workers inherit its dummy credentials
    module = load_example()
    mark = uuid.uuid4().hex
    os.environ["APRFAST_TEST_RAY"] = mark  # inherited by every process of the cluster
    try:
        with module.ray_cluster(workers=2) as scheduler:
            assert scheduler == "ray"
            yield module, mark
    finally:
        del os.environ["APRFAST_TEST_RAY"]
        gc.collect()  # Ray's leftovers (above) reported here, not in another module's test
    if os.path.isdir("/proc/self/fd"):
        assert _left_behind(mark) == [], "Ray processes left running after ray.shutdown()"


@linux_only
def test_every_ray_process_listens_on_loopback_only(ray_local):
    _, mark = ray_local
    pids = _marked_processes(mark)
    assert len(pids) >= 2  # at least gcs_server and raylet
    addresses = _listening_addresses(pids + [os.getpid()])
    assert addresses, "found no listening socket of the cluster"
    assert all(_is_loopback(a) for a in addresses), sorted(map(str, addresses))


def test_directory_converted_and_quantized_to_s3(tmp_path, s3_server, ray_local):  # noqa: F811
    module, _ = ray_local
    tensors = models(np.random.default_rng(15))
    src = tmp_path / "models"
    write_models(src, tensors)
    bucket = s3_server.make_bucket()
    results = module.convert_directory(str(src), f"s3://{bucket}/converted", "ray", quantize="Q8_0",
                                       storage_options=s3_server.storage_options)
    check_written(module, src, tensors, results, s3_server.fs(), f"{bucket}/converted", tmp_path)


def _sums_task():
    """A Ray task (of a function made here: cloudpickle ships it by value, since the workers
    cannot import this test module) that returns who ran it, what arrived, and every
    tensor's sum read through it."""
    import ray

    def sums(handle):
        with handle:
            return (os.getpid(), type(handle).__name__, handle.path,
                    {n: float(handle.get_tensor(n).astype(np.float64).sum()) for n in handle.keys()})

    return ray.remote(sums)


def test_handles_travel_through_rays_serialization(tmp_path, s3_server, ray_local):  # noqa: F811
    import ray

    one, sharded = tmp_path / "one.apr", tmp_path / "sharded.apr"
    aprfast.save_file(BIG, one)
    aprfast.save_file(BIG, sharded, max_shard_size=100 << 10)
    bucket = s3_server.make_bucket()
    s3_server.fs().pipe_file(f"{bucket}/m.apr", aprfast.save(BIG))
    expected = {name: float(v.astype(np.float64).sum()) for name, v in BIG.items()}
    task = _sums_task()
    with aprfast.open(one) as f, aprfast.open(sharded) as g, \
            aprfast.open(f"s3://{bucket}/m.apr", storage_options=s3_server.storage_options) as h:
        f.get_tensor("w")  # mapped and touched here: still none of its bytes in the pickle
        for handle in (f, g, h):
            # the pickle Ray makes (cloudpickle) is the path and options: under 1 KiB for a 1 MiB model
            assert len(ray.cloudpickle.dumps(handle)) < 1024 < os.path.getsize(one) // 1000
        results = ray.get([task.remote(handle) for handle in (f, g, h)])
    assert [kind for _, kind, _, _ in results] == ["AprFile", "ShardedFile", "AprFile"]  # the last over S3
    assert [path for _, _, path, _ in results] == [str(one), g.path, f"s3://{bucket}/m.apr"]
    assert all(sums == expected for _, _, _, sums in results)
    assert os.getpid() not in {pid for pid, _, _, _ in results}


def test_a_changed_file_is_refused_on_the_worker(tmp_path, ray_local):
    import ray

    path = tmp_path / "m.apr"
    aprfast.save_file(BIG, path)
    with aprfast.open(path) as f:
        ref = ray.put(f)  # pickled now, as it was
    aprfast.save_file({"w": BIG["w"] + 1, "b": BIG["b"]}, path)  # replaced: another inode, same size
    with pytest.raises(ray.exceptions.RayTaskError, match="changed since this handle was pickled"):
        ray.get(_sums_task().remote(ref))


def test_unpicklable_handles_are_refused_with_the_typed_error(tmp_path, ray_local):
    with aprfast.open(aprfast.save(BIG)) as g:  # from bytes: nothing to reopen it by
        with pytest.raises(PicklingRefusedError, match="nothing to reopen it by"):
            _sums_task().remote(g)
    path = tmp_path / "m.apr"
    aprfast.save_file(BIG, path)
    with aprfast.open(path) as g:
        pass
    with pytest.raises(AprIOError, match="closed"):
        _sums_task().remote(g)  # closed: as every other use of a closed handle
