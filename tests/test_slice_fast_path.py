"""get_slice's NumPy fast path (int/slice keys on a mapped file) gives what the checked
pread path and NumPy give, for any key of those kinds."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import aprfast

ARRAY = np.arange(7 * 5 * 3, dtype=np.float32).reshape(7, 5, 3)


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    p = tmp_path_factory.mktemp("slices") / "m.apr"
    aprfast.save_file({"t": ARRAY}, p)
    return p


def _component(dim):
    index = st.integers(-dim, dim - 1)
    bound = st.none() | st.integers(-dim - 2, dim + 2)
    step = st.none() | st.integers(-3, 3).filter(lambda s: s != 0)
    return index | st.builds(slice, bound, bound, step)


keys = st.tuples(*(_component(d) for d in ARRAY.shape)).flatmap(
    lambda full: st.integers(0, len(full)).map(lambda n: full[:n]))


@settings(max_examples=300, deadline=None)
@given(key=keys, single=st.booleans())
def test_fast_path_matches_numpy_and_pread(path, key, single):
    if single and key:
        key = key[0]
    with aprfast.open(path) as mapped, aprfast.open(path, mode="pread") as pread:
        got = mapped.get_slice("t")[key]
        assert got.flags.writeable and got.flags.owndata
        np.testing.assert_array_equal(got, ARRAY[key])
        np.testing.assert_array_equal(pread.get_slice("t")[key], ARRAY[key])


def test_out_of_range_and_too_many_indices_raise_index_error(path):
    with aprfast.open(path) as f:
        sl = f.get_slice("t")
        with pytest.raises(IndexError):
            sl[7]
        with pytest.raises(IndexError):
            sl[0, 0, 0, 0]


def test_a_slice_object_of_a_closed_file_raises(path):
    f = aprfast.open(path)
    sl = f.get_slice("t")
    sl[0:2]
    f.close()
    with pytest.raises(aprfast.errors.AprIOError, match="closed"):
        sl[0:2]


def test_repeated_slices_and_copies_share_their_plan_and_stop_at_close(path):
    # get_slice handles and copy plans are remembered per name (issue 9's per-call
    # overhead); each result is still a fresh owned array, and a closed file refuses
    f = aprfast.open(path)
    first = f.get_slice("t")
    assert f.get_slice("t") is first
    a, b = first[1:3], f.get_slice("t")[1:3]
    assert a is not b and not np.shares_memory(a, b)
    np.testing.assert_array_equal(a, ARRAY[1:3])
    c1, c2 = f.get_tensor("t", copy=True), f.get_tensor("t", copy=True)
    assert not np.shares_memory(c1, c2) and c1.flags.writeable and c1.ctypes.data % 64 == 0
    c1[:] = -1  # an owned copy: writing it changes neither the file nor the next copy
    np.testing.assert_array_equal(f.get_tensor("t", copy=True), ARRAY)
    f.close()
    with pytest.raises(Exception):
        first[0]
    with pytest.raises(Exception):
        f.get_tensor("t", copy=True)
    with pytest.raises(Exception):
        f.get_slice("t")[0]
    np.testing.assert_array_equal(a, ARRAY[1:3])  # results outlive the handle
