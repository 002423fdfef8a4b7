"""One storage under several names (tied weights) is stored once in the spec layout,
every name pointing at the same bytes; aprender's layout keeps a copy per name, the bytes
aprender itself would write (issue 11 part 5)."""

import numpy as np
import pytest

import aprfast
from aprfast.errors import CorruptError


@pytest.fixture
def tied():
    weight = np.arange(60, dtype=np.float32).reshape(6, 10)
    return {"embed.weight": weight, "lm_head.weight": weight, "norm": np.ones(10, np.float32)}


def test_auto_stores_one_storage_once(tied):
    data = aprfast.save(tied)
    copies = aprfast.save({k: np.array(v) for k, v in tied.items()})
    assert len(data) < len(copies)
    with aprfast.open(data) as f:
        assert f.layout == "apr2"
        a, b = f.info("embed.weight"), f.info("lm_head.weight")
        assert (a.offset, a.nbytes) == (b.offset, b.nbytes)
        f.verify()


@pytest.mark.parametrize("read", ["open", "load", "load_file-mmap", "load_file-pread", "stream"])
def test_every_reader_gives_every_name(tmp_path, tied, read):
    path = tmp_path / "tied.apr"
    aprfast.save_file(tied, path)
    if read == "open":
        with aprfast.open(path) as f:
            got = {k: f.get_tensor(k, copy=True) for k in f.keys()}
    elif read == "load":
        got = aprfast.load(path.read_bytes())
    elif read == "stream":
        got = dict(aprfast.stream(path))
    else:
        got = aprfast.load_file(path, mmap=read.endswith("mmap"))
    assert sorted(got) == sorted(tied)
    for name, value in tied.items():
        np.testing.assert_array_equal(got[name], value)


def test_owned_loads_share_memory_again(tied):
    loaded = aprfast.load(aprfast.save(tied))
    assert np.shares_memory(loaded["embed.weight"], loaded["lm_head.weight"])


def test_aprender_layout_keeps_a_copy_per_name(tied):
    copies = {k: np.array(v) for k, v in tied.items()}
    assert aprfast.save(tied, layout="aprender") == aprfast.save(copies, layout="aprender")


@pytest.mark.parametrize("other", [lambda w: w[1:], lambda w: w.view(np.int32), lambda w: w.reshape(10, 6),
                                   lambda w: w.copy()])
def test_only_the_same_bytes_dtype_and_shape_are_one_storage(other):
    weight = np.arange(60, dtype=np.float32).reshape(6, 10)
    tensors = {"a": weight, "b": np.ascontiguousarray(other(weight))}
    with aprfast.open(aprfast.save(tensors, layout="apr2")) as f:
        assert f.info("a").offset != f.info("b").offset
        for name, value in tensors.items():
            np.testing.assert_array_equal(f.get_tensor(name), value)


def test_compressed_files_store_copies(tied):
    with aprfast.open(aprfast.save(tied, compression="zstd")) as f:
        assert f.info("embed.weight").offset != f.info("lm_head.weight").offset
        np.testing.assert_array_equal(f.get_tensor("lm_head.weight"), tied["lm_head.weight"])


def test_partial_overlap_is_still_refused(tied):
    data = bytearray(aprfast.save(tied))
    with aprfast.open(bytes(data)) as f:
        entry = f.info("lm_head.weight")
    # move lm_head 4 bytes into embed's extent: a lie, not a shared storage
    import struct

    raw = bytes(data)
    name = b"lm_head.weight"
    at = raw.index(name) + len(name)
    ndim = raw[at + 1]
    offset_field = at + 2 + 8 * ndim
    data_start = entry.offset - struct.unpack_from("<Q", raw, offset_field)[0]
    struct.pack_into("<Q", data, offset_field, entry.offset - data_start + 64)
    with pytest.raises(CorruptError, match="overlap|outside|lies"):
        aprfast.open(bytes(data))


def test_stream_yields_aliases_sharing_one_buffer(tied):
    got = dict(aprfast.stream(aprfast.save(tied)))
    assert np.shares_memory(got["embed.weight"], got["lm_head.weight"])
    np.testing.assert_array_equal(got["lm_head.weight"], tied["lm_head.weight"])
