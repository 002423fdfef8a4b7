"""get_slice(name)[key] equals arr[key] for NumPy basic indexing, mapped or with pread."""

import io
import os
import tempfile

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import basic_indices
from ml_dtypes import bfloat16

import aprfast
from aprfast.errors import LayoutError

DTYPES = [np.float32, np.float16, np.int64, np.uint8, np.int16, np.bool_, bfloat16]
MODES = ["mmap", "pread"]

shapes_1_to_4 = st.lists(st.integers(0, 7), min_size=1, max_size=4).map(tuple)


def make_array(shape, dtype, seed=0):
    count = int(np.prod(shape))
    values = np.arange(count, dtype=np.int64) * 7 + seed
    if np.dtype(dtype) == np.bool_:
        return (values % 3 == 0).reshape(shape)
    return values.astype(np.float32).astype(dtype).reshape(shape)


@pytest.fixture(scope="module")
def workdir():
    with tempfile.TemporaryDirectory() as d:
        yield d


_counter = iter(range(10**9))


def saved(workdir, tensors, layout="auto"):
    path = os.path.join(workdir, f"s{next(_counter)}.apr")
    aprfast.save_file(tensors, path, layout=layout, durable=False)
    return path


@st.composite
def array_and_key(draw):
    shape = draw(shapes_1_to_4)
    dtype = draw(st.sampled_from(DTYPES))
    key = draw(basic_indices(shape, min_dims=0, allow_newaxis=True, allow_ellipsis=True))
    return make_array(shape, dtype, draw(st.integers(0, 100))), key


@given(case=array_and_key(), max_runs=st.sampled_from([None, 1, 3]))
def test_get_slice_equals_numpy_basic_indexing(workdir, case, max_runs):
    array, key = case
    want = array[key]
    path = saved(workdir, {"t": array})
    for mode in MODES:
        with aprfast.open(path, mode=mode) as f:
            sl = f.get_slice("t")
            if max_runs is not None:
                sl.MAX_RUNS = max_runs  # exercise the bounding-read path of pread slicing too
            got = sl[key]
            assert isinstance(got, np.ndarray)
            assert got.dtype == want.dtype and got.shape == want.shape, (mode, key)
            assert got.tobytes() == np.ascontiguousarray(want).tobytes(), (mode, key)
            assert got.flags.writeable  # an owned copy, never a view of the file
    os.unlink(path)


@st.composite
def array_axis_and_ranges(draw):
    shape = draw(shapes_1_to_4)
    axis = draw(st.integers(-len(shape), len(shape) - 1))
    length = shape[axis]
    bounds = st.tuples(st.integers(0, length), st.integers(0, length)).map(lambda p: (min(p), max(p)))
    ranges = draw(st.lists(bounds, max_size=4))
    dtype = draw(st.sampled_from(DTYPES))
    return make_array(shape, dtype), axis, ranges


@settings(max_examples=60)
@given(case=array_axis_and_ranges())
def test_intervals_equal_the_concatenated_slices(workdir, case):
    array, axis, ranges = case
    index = lambda a, b: (slice(None),) * (axis % array.ndim) + (slice(a, b),)  # noqa: E731
    if ranges:
        want = np.concatenate([array[index(a, b)] for a, b in ranges], axis=axis)
    else:
        shape = list(array.shape)
        shape[axis] = 0
        want = np.empty(shape, array.dtype)
    path = saved(workdir, {"t": array})
    for mode in MODES:
        with aprfast.open(path, mode=mode) as f:
            got = f.get_slice("t").intervals(ranges, axis=axis)
            assert got.dtype == want.dtype and got.shape == want.shape, mode
            assert got.tobytes() == want.tobytes(), mode
    os.unlink(path)


@pytest.mark.parametrize("mode", MODES)
def test_tensor_parallel_shards_with_intervals(workdir, mode):
    weight = np.arange(8 * 12, dtype=np.float32).reshape(8, 12)
    path = saved(workdir, {"w": weight})
    with aprfast.open(path, mode=mode) as f:
        sl = f.get_slice("w")
        assert np.array_equal(sl.intervals([(0, 2), (6, 8)]), np.concatenate([weight[0:2], weight[6:8]]))
        assert np.array_equal(sl.intervals([(3, 6)], axis=1), weight[:, 3:6])
        assert np.array_equal(sl.intervals([(10, 12), (0, 1)], axis=-1),
                              np.concatenate([weight[:, 10:12], weight[:, 0:1]], axis=1))


@pytest.mark.parametrize("mode", MODES)
def test_intervals_outside_the_axis_raise_index_error(workdir, mode):
    path = saved(workdir, {"w": np.zeros((4, 5), np.float32)})
    with aprfast.open(path, mode=mode) as f:
        sl = f.get_slice("w")
        for bad in ([(0, 5)], [(-1, 2)], [(3, 2)]):
            with pytest.raises(IndexError):
                sl.intervals(bad, axis=0)
        with pytest.raises(IndexError):
            sl.intervals([(0, 1)], axis=2)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("key", [4, -5, (0, 5), (slice(None), -6), (Ellipsis, 5), (1, 2, 3), (None, 4)])
def test_out_of_range_integers_raise_index_error(workdir, mode, key):
    array = np.zeros((4, 5), np.float32)
    with pytest.raises(IndexError):
        array[key]  # numpy agrees these are errors
    path = saved(workdir, {"w": array})
    with aprfast.open(path, mode=mode) as f:
        with pytest.raises(IndexError):
            f.get_slice("w")[key]


@pytest.mark.parametrize("mode", MODES)
def test_two_ellipses_raise_index_error(workdir, mode):
    path = saved(workdir, {"w": np.zeros((2, 2), np.float32)})
    with aprfast.open(path, mode=mode) as f, pytest.raises(IndexError):
        f.get_slice("w")[..., ...]


@pytest.mark.parametrize("mode", MODES)
def test_get_shape_and_get_dtype(workdir, mode):
    tensors = {"f": np.zeros((3, 4, 5), np.float32), "h": np.zeros(2, np.float16), "b": np.zeros((1, 2), bfloat16),
               "i": np.zeros((), np.int64), "u": np.zeros(0, np.uint8)}
    path = saved(workdir, tensors, layout="aprender")
    with aprfast.open(path, mode=mode) as f:
        assert f.get_slice("f").get_shape() == [3, 4, 5]
        assert f.get_slice("f").get_dtype() == "F32"
        assert f.get_slice("h").get_dtype() == "F16"
        assert f.get_slice("b").get_dtype() == "BF16"
        assert f.get_slice("b")[1:].dtype == np.dtype(bfloat16)
        assert f.get_slice("i").get_shape() == []
        assert f.get_slice("i").get_dtype() == "I64"
        assert f.get_slice("u").get_shape() == [0]
        assert len(f.get_slice("f")) == 3
        with pytest.raises(TypeError):
            len(f.get_slice("i"))


@pytest.mark.parametrize("mode", MODES)
def test_zero_dimensional_tensor_slices_like_numpy(workdir, mode):
    scalar = np.array(2.5, np.float64)
    path = saved(workdir, {"s": scalar})
    with aprfast.open(path, mode=mode) as f:
        sl = f.get_slice("s")
        for key in ((), Ellipsis, None, (None, Ellipsis)):
            assert sl[key].shape == scalar[key].shape
            assert np.array_equal(sl[key], scalar[key])
        with pytest.raises(IndexError):
            sl[0]
        with pytest.raises(IndexError):
            sl.intervals([(0, 0)])


def test_slicing_a_tensor_whose_blocks_cross_rows_raises_layout_error(workdir):
    # APR_Q4 blocks run across rows, so no row range is a whole number of blocks.
    q = aprfast.QuantizedTensor("APR_Q4", (2, 16), np.zeros(18, np.uint8))
    with aprfast.open(aprfast.save({"q": q})) as f:
        with pytest.raises(LayoutError):
            f.get_slice("q")


def test_slicing_a_bytes_source_and_a_stream_source():
    array = np.arange(60, dtype=np.int32).reshape(3, 4, 5)
    data = aprfast.save({"t": array})
    for target in (data, io.BytesIO(data)):
        with aprfast.open(target) as f:
            assert np.array_equal(f.get_slice("t")[1, ::-2, 1:4], array[1, ::-2, 1:4])
