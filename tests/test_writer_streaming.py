"""aprfast.Writer: one tensor at a time, the same bytes as save_file, atomic, low memory."""

import io
import os
import threading
import tracemalloc

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from ml_dtypes import bfloat16

import aprfast
from aprfast.errors import AprError, LayoutError


def sample_tensors():
    rng = np.random.default_rng(3)
    return {
        "layers.0.attn.q": rng.standard_normal((16, 16)).astype(np.float32),
        "layers.0.attn.k": rng.standard_normal((16, 8)).astype(np.float16),
        "layers.1.mlp": rng.integers(-100, 100, (5, 7), dtype=np.int64),
        "bf": np.array([1.5, -2.0, 3.0], bfloat16),
        "scalar": np.array(3.5, np.float64),
        "empty": np.zeros((3, 0), np.int32),
        "émoji 🦀": np.arange(70, dtype=np.uint8),
        "q": aprfast.QuantizedTensor("Q4_K", (2, 256), np.arange(288, dtype=np.uint16).astype(np.uint8)),
    }


def dir_entries(path):
    return sorted(os.listdir(path))


def write_with_writer(target, tensors, order, **kwargs):
    with aprfast.Writer(target, **kwargs) as w:
        for name in order:
            w.add(name, tensors[name])


ORDERS = {
    "sorted": sorted,
    "reversed": lambda names: sorted(names, reverse=True),
    "shuffled": lambda names: [names[i] for i in np.random.default_rng(11).permutation(len(names))],
}


@pytest.mark.parametrize("order", list(ORDERS))
@pytest.mark.parametrize("layout", ["aprender", "apr2", "auto"])
def test_writer_gives_the_bytes_of_save_file_in_any_order(tmp_path, layout, order):
    tensors = sample_tensors()
    metadata = {"name": "streamed", "hidden_size": 16, "extra": {"b": 1, "a": [1.5, None]}}
    aprfast.save_file(tensors, tmp_path / "saved.apr", metadata, layout=layout)
    write_with_writer(tmp_path / "streamed.apr", tensors, ORDERS[order](list(tensors)),
                      metadata=metadata, layout=layout)
    assert (tmp_path / "streamed.apr").read_bytes() == (tmp_path / "saved.apr").read_bytes()
    assert dir_entries(tmp_path) == ["saved.apr", "streamed.apr"]


def test_writer_with_apr2_alignment_32_matches_save(tmp_path):
    tensors = {"a": np.arange(5, dtype=np.int16), "b": np.ones(3, np.uint32)}
    write_with_writer(tmp_path / "w.apr", tensors, ["b", "a"], layout="apr2", alignment=32)
    assert (tmp_path / "w.apr").read_bytes() == aprfast.save(tensors, layout="apr2", alignment=32)


def test_writer_with_no_tensors_matches_save(tmp_path):
    with aprfast.Writer(tmp_path / "w.apr", metadata={"name": "empty"}):
        pass
    assert (tmp_path / "w.apr").read_bytes() == aprfast.save({}, {"name": "empty"})


def test_writer_to_bytesio_matches_save():
    tensors = sample_tensors()
    buf = io.BytesIO()
    write_with_writer(buf, tensors, list(tensors)[::-1], metadata={"k": "v"})
    assert buf.getvalue() == aprfast.save(tensors, {"k": "v"})


@pytest.mark.parametrize("buffering", [0, -1])
def test_writer_to_a_pipe_matches_save(buffering):
    tensors = sample_tensors()
    tensors["big"] = np.arange(1 << 19, dtype=np.float32)  # 2 MiB, several pipe buffers
    read_fd, write_fd = os.pipe()
    received = []

    def drain():
        with os.fdopen(read_fd, "rb") as r:
            received.append(r.read())

    reader = threading.Thread(target=drain)
    reader.start()
    with os.fdopen(write_fd, "wb", buffering=buffering) as pipe:
        write_with_writer(pipe, tensors, list(tensors), layout="apr2")
    reader.join(timeout=30)
    assert received == [aprfast.save(tensors, layout="apr2")]


def test_exception_inside_the_with_block_leaves_no_file_and_no_temp_files(tmp_path):
    target = tmp_path / "model.apr"
    with pytest.raises(RuntimeError):
        with aprfast.Writer(target) as w:
            w.add("a", np.ones(1000))
            raise RuntimeError("interrupted")
    assert dir_entries(tmp_path) == []


def test_exception_inside_the_with_block_leaves_an_existing_target_unchanged(tmp_path):
    target = tmp_path / "model.apr"
    aprfast.save_file({"old": np.zeros(3)}, target)
    before = target.read_bytes()
    with pytest.raises(KeyboardInterrupt):
        with aprfast.Writer(target) as w:
            w.add("new", np.ones(1 << 16))
            raise KeyboardInterrupt
    assert target.read_bytes() == before
    assert dir_entries(tmp_path) == ["model.apr"]


def test_failed_close_leaves_an_existing_target_unchanged(tmp_path):
    target = tmp_path / "model.apr"
    target.write_bytes(b"keep me")
    with pytest.raises(LayoutError):
        with aprfast.Writer(target, layout="aprender") as w:
            w.add("x", np.ones(2, np.int16))  # aprender has no I16: fails when the file is planned
    assert target.read_bytes() == b"keep me"
    assert dir_entries(tmp_path) == ["model.apr"]


def test_adding_a_duplicate_name_raises_and_keeps_the_first(tmp_path):
    target = tmp_path / "model.apr"
    with aprfast.Writer(target) as w:
        w.add("x", np.ones(2))
        with pytest.raises(LayoutError, match="'x'"):
            w.add("x", np.zeros(2))
    assert np.array_equal(aprfast.load_file(target)["x"], np.ones(2))


def test_add_after_close_raises_apr_error(tmp_path):
    w = aprfast.Writer(tmp_path / "m.apr")
    w.add("x", np.ones(1))
    w.close()
    with pytest.raises(AprError):
        w.add("y", np.ones(1))
    w.close()  # closing twice is harmless
    assert list(aprfast.load_file(tmp_path / "m.apr")) == ["x"]


def test_add_after_abort_raises_and_nothing_is_written(tmp_path):
    w = aprfast.Writer(tmp_path / "m.apr")
    w.add("x", np.ones(1))
    w.abort()
    with pytest.raises(AprError):
        w.add("y", np.ones(1))
    assert dir_entries(tmp_path) == []


def test_writer_rejects_an_unwritable_target():
    with pytest.raises(TypeError):
        aprfast.Writer(object())


def test_writer_add_of_an_unsupported_dtype_raises_layout_error(tmp_path):
    with aprfast.Writer(tmp_path / "m.apr") as w:
        with pytest.raises(LayoutError):
            w.add("c", np.zeros(2, "datetime64[s]"))
        w.add("ok", np.zeros(2))
    assert list(aprfast.load_file(tmp_path / "m.apr")) == ["ok"]


def test_writer_does_not_keep_tensors_in_memory(tmp_path):
    n_tensors, elems = 20, 1 << 20  # 20 x 4 MiB
    tensor_bytes = elems * 4
    target = tmp_path / "big.apr"
    tracemalloc.start()
    try:
        with aprfast.Writer(target, layout="aprender") as w:
            for i in range(n_tensors):
                array = np.full(elems, i, np.float32)
                w.add(f"t{i:02d}", array)
                del array
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak >= tensor_bytes  # tracemalloc does see NumPy's buffers
    assert peak < 3 * tensor_bytes, f"peak {peak / 2**20:.1f} MiB"
    with aprfast.open(target) as f:
        assert len(f) == n_tensors
        f.verify()
        for i in (0, 7, 19):
            t = f.get_tensor(f"t{i:02d}")
            assert t.shape == (elems,) and t[0] == i and t[-1] == i


@pytest.mark.parametrize("layout", ["aprender", "apr2"])
def test_tensors_around_the_gather_limit_give_the_same_bytes_everywhere(tmp_path, layout):
    # Pieces under 256 KiB are gathered, larger ones written directly; both must agree.
    sizes = [1, (1 << 18) - 1, 1 << 18, (1 << 18) + 1, (1 << 20) - 3, (1 << 20) + 5, 3, 0, 64]
    rng = np.random.default_rng(8)
    tensors = {f"t{i}": rng.integers(0, 256, n, dtype=np.uint8) for i, n in enumerate(sizes)}
    data = aprfast.save(tensors, layout=layout)
    aprfast.save_file(tensors, tmp_path / "s.apr", layout=layout)
    write_with_writer(tmp_path / "w.apr", tensors, list(tensors)[::-1], layout=layout)
    buf = io.BytesIO()
    write_with_writer(buf, tensors, list(tensors), layout=layout)
    assert (tmp_path / "s.apr").read_bytes() == data
    assert (tmp_path / "w.apr").read_bytes() == data
    assert buf.getvalue() == data
    with aprfast.open(data) as f:
        f.verify()
        for name, want in tensors.items():
            assert np.array_equal(f.get_tensor(name), want), name


def test_writer_in_a_missing_directory_raises_apr_io_error(tmp_path):
    # save_file says E007 for the same target; the Writer should too.
    target = tmp_path / "no-such-dir" / "m.apr"
    with pytest.raises(aprfast.AprIOError) as info:
        aprfast.save_file({"x": np.ones(1)}, target)
    assert info.value.code == "E007"
    with pytest.raises(aprfast.AprIOError):
        aprfast.Writer(target)


SPOOL_FAILS_SCRIPT = """
import os, resource, signal, sys
import numpy as np
import aprfast
target = sys.argv[1]
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit fail with EFBIG
resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, resource.RLIM_INFINITY))
try:
    with aprfast.Writer(target) as w:
        w.add("x", np.zeros(1 << 18, np.float32))
except BaseException as exc:
    print(type(exc).__name__, isinstance(exc, aprfast.AprIOError), isinstance(exc, OSError))
else:
    print("no error")
"""


def test_writer_reports_an_os_write_failure_as_apr_io_error(tmp_path, run_child):
    # A real EFBIG from the kernel while spooling (RLIMIT_FSIZE), in a child process.
    target = tmp_path / "model.apr"
    target.write_bytes(b"previous contents")
    out = run_child(SPOOL_FAILS_SCRIPT, target)
    assert out.returncode == 0, out.stderr
    assert target.read_bytes() == b"previous contents"
    assert dir_entries(tmp_path) == ["model.apr"]
    assert out.stdout.split() == ["AprIOError", "True", "True"], out.stdout


WRITER_DTYPES = [np.float32, np.float16, np.float64, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16,
                 np.uint32, np.uint64, np.bool_, bfloat16]


@st.composite
def writer_inputs(draw):
    names = draw(st.lists(st.text(max_size=40), unique=True, max_size=8))
    tensors = {}
    for name in names:
        dtype = np.dtype(draw(st.sampled_from(WRITER_DTYPES)))
        shape = tuple(draw(st.lists(st.integers(0, 5), max_size=4)))
        count = int(np.prod(shape))
        raw = np.random.default_rng(draw(st.integers(0, 2**32 - 1))).bytes(count * dtype.itemsize)
        # bytearray: each array owns its memory.  CPython shares one-byte bytes objects, so two
        # frombuffer views of equal one-byte draws would be one storage, which save_file
        # stores once (tied weights, tests/test_shared_storage.py) and the Writer does not.
        raw = bytearray(raw)
        array = np.frombuffer(raw, np.uint8).astype(bool) if dtype == np.bool_ else np.frombuffer(raw, dtype)
        tensors[name] = array.reshape(shape)
    order = draw(st.permutations(names))
    return tensors, order


@given(case=writer_inputs(), layout=st.sampled_from(["auto", "aprender", "apr2"]),
       metadata=st.dictionaries(st.text(max_size=8).filter(lambda k: k not in ("apr_version", "name")),
                                st.integers(0, 100) | st.text(max_size=8), max_size=3))
def test_writer_matches_save_for_random_tensors_in_random_order(case, layout, metadata):
    tensors, order = case
    try:
        want = aprfast.save(tensors, metadata, layout=layout)
    except LayoutError:
        with pytest.raises(LayoutError):
            write_with_writer(io.BytesIO(), tensors, order, metadata=metadata, layout=layout)
        return
    buf = io.BytesIO()
    write_with_writer(buf, tensors, order, metadata=metadata, layout=layout)
    assert buf.getvalue() == want
