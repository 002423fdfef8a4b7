"""aprfast.torch: torch tensors round-trip through both layouts (torch is optional)."""

import numpy as np
import pytest

if __import__("os").environ.get("APRFAST_SANITIZED"):
    # Under tests/sanitize.sh libasan is preloaded, and every C++ exception torch throws (an
    # index out of range in a slicing check) aborts in its __cxa_throw interceptor: these
    # tests run in the normal suite; the kernels they reach are sanitized in other modules.
    pytest.skip("torch's C++ exceptions abort under the preloaded ASan runtime", allow_module_level=True)

torch = pytest.importorskip("torch")
aprfast_torch = pytest.importorskip("aprfast.torch")

import aprfast  # noqa: E402


def sample():
    g = torch.Generator().manual_seed(7)
    return {
        "f32": torch.randn(3, 4, generator=g),
        "bf16": torch.randn(5, generator=g).to(torch.bfloat16),
        "f16": torch.randn(2, 2, generator=g).half(),
        "i64": torch.arange(6, dtype=torch.int64).reshape(2, 3),
        "transposed": torch.randn(4, 3, generator=g).t(),
        "scalar": torch.tensor(3.5),
        "empty": torch.zeros(0, 3),
    }


@pytest.mark.parametrize("layout", ["aprender", "apr2"])
def test_torch_tensors_round_trip_with_dtype_and_values(tmp_path, layout):
    tensors = sample()
    path = tmp_path / "t.apr"
    aprfast_torch.save_file(tensors, path, layout=layout)
    back = aprfast_torch.load_file(path)
    assert set(back) == set(tensors)
    for name, tensor in tensors.items():
        assert back[name].dtype == tensor.dtype, name
        assert back[name].shape == tensor.shape, name
        assert torch.equal(back[name], tensor), name


def test_bf16_is_stored_as_bf16_bits(tmp_path):
    bits = torch.tensor([1.0, -2.5, 0.15625], dtype=torch.bfloat16)
    data = aprfast_torch.save({"x": bits})
    with aprfast.open(data) as f:
        assert f.info("x").dtype.name == "BF16"
        raw = f.get_tensor("x").view(np.uint16)
    np.testing.assert_array_equal(raw, bits.view(torch.int16).numpy().view(np.uint16))


def test_bytes_round_trip_and_bool_goes_to_the_spec_layout():
    tensors = {"mask": torch.tensor([True, False, True])}
    data = aprfast_torch.save(tensors)
    assert aprfast.open(data).layout == "apr2"
    assert torch.equal(aprfast_torch.load(data)["mask"], tensors["mask"])


def test_non_tensors_are_refused_with_the_key_named():
    # safetensors raises ValueError here, in these words, so ported code catches that
    message = "^Key `x` is invalid, expected torch.Tensor but received <class 'numpy.ndarray'>$"
    with pytest.raises(ValueError, match=message):
        aprfast_torch.save({"x": np.zeros(2)})
    with pytest.raises(ValueError, match=r"^Expected a dict of \[str, torch.Tensor\] but received <class 'list'>$"):
        aprfast_torch.save([torch.zeros(2)])


def test_sparse_tensors_are_refused_with_the_key_named():
    with pytest.raises(ValueError, match=r"sparse tensors: `\['s'\]`.*to_dense"):
        aprfast_torch.save({"a": torch.zeros(2), "s": torch.eye(3).to_sparse()})


# --- loading onto a device through staging buffers (issue 11 part 7) --------------------
def _model(tmp_path):
    tensors = {f"t{i:02d}": torch.randn(3 + i, 17) for i in range(12)}
    tensors["bf"] = torch.randn(5, 7).to(torch.bfloat16)
    tensors["empty"] = torch.zeros(0, 4)
    tensors["scalar"] = torch.tensor(2.5)
    path = tmp_path / "m.apr"
    aprfast_torch.save_file(tensors, path)
    return tensors, path


@pytest.mark.parametrize("staging", [1, 64, 1000, 1 << 20])
def test_staged_load_gives_every_byte_whatever_the_staging_size(tmp_path, staging):
    # CPU as the "device": the same chunking and piece bookkeeping the CUDA path runs,
    # with staging sizes that split tensors across chunks and chunks across tensors
    tensors, path = _model(tmp_path)
    with aprfast.open(path, mode="pread") as f:
        loaded = aprfast_torch.load_to_device(f, "cpu", staging_bytes=staging)
    assert sorted(loaded) == sorted(tensors)
    for name, value in tensors.items():
        assert loaded[name].dtype == value.dtype and torch.equal(loaded[name], value)


def test_staged_load_checks_the_crc(tmp_path):
    tensors, path = _model(tmp_path)
    data = bytearray(path.read_bytes())
    data[-100] ^= 1  # inside the last tensor's padding or data, covered by the CRC
    path.write_bytes(bytes(data))
    with aprfast.open(path, mode="pread") as f, pytest.raises(aprfast.ChecksumError):
        aprfast_torch.load_to_device(f, "cpu", staging_bytes=4096)
    with aprfast.open(path, mode="pread") as f:
        aprfast_torch.load_to_device(f, "cpu", verify=False)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
def test_load_file_onto_cuda(tmp_path):
    tensors, path = _model(tmp_path)
    loaded = aprfast_torch.load_file(path, device="cuda:0")
    for name, value in tensors.items():
        assert loaded[name].device.type == "cuda" and torch.equal(loaded[name].cpu(), value)


# --- tied and shared tensors (issue 11 part 5) -------------------------------------------
class _Tied(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(10, 4)
        self.head = torch.nn.Linear(4, 10, bias=False)
        self.head.weight = self.embed.weight  # tied, as language models tie them
        self.norm = torch.nn.LayerNorm(4)


def test_save_model_stores_a_tied_weight_once_and_load_model_keeps_it_tied(tmp_path):
    model = _Tied()
    path = tmp_path / "tied.apr"
    aprfast_torch.save_model(model, path)
    untied_copy = {k: v.clone() for k, v in model.state_dict().items()}
    with aprfast.open(path) as f:
        assert f.info("embed.weight").offset == f.info("head.weight").offset  # one storage, two names
        assert sorted(f.keys()) == sorted(model.state_dict())
    assert path.stat().st_size < len(aprfast_torch.save(untied_copy))
    fresh = _Tied()
    missing, unexpected = aprfast_torch.load_model(fresh, path)
    assert missing == set() and unexpected == []  # safetensors' types: a set and a list
    assert fresh.head.weight is fresh.embed.weight
    for name, value in model.state_dict().items():
        assert torch.equal(fresh.state_dict()[name], value)


def test_load_model_reports_missing_and_unexpected_keys_like_torch(tmp_path):
    path = tmp_path / "partial.apr"
    state = _Tied().state_dict()
    state.pop("norm.bias")
    state["extra.weight"] = torch.zeros(2)
    aprfast_torch.save_file(state, path)
    with pytest.raises(RuntimeError) as info:
        aprfast_torch.load_model(_Tied(), path)
    assert str(info.value) == ("Error(s) in loading state_dict for _Tied:\n"
                               '    Missing key(s) in state_dict: "norm.bias"\n'
                               '    Unexpected key(s) in state_dict: "extra.weight"')
    missing, unexpected = aprfast_torch.load_model(_Tied(), path, strict=False)
    assert missing == {"norm.bias"} and unexpected == ["extra.weight"]


def test_save_file_of_two_names_for_one_storage_stores_it_once(tmp_path):
    weight = torch.randn(6, 5)
    path = tmp_path / "shared.apr"
    aprfast_torch.save_file({"a": weight, "b": weight, "c": weight.clone()}, path)
    with aprfast.open(path) as f:
        assert f.layout == "apr2"
        assert f.info("a").offset == f.info("b").offset != f.info("c").offset
    loaded = aprfast_torch.load_file(path)
    assert loaded["a"].data_ptr() == loaded["b"].data_ptr()  # shared again
    assert all(torch.equal(loaded[k], weight) for k in "abc")


def test_load_model_takes_equal_copies_of_a_tie_as_one(tmp_path):
    # aprender's layout keeps a copy per name: equal values are no conflict
    model = _Tied()
    path = tmp_path / "copies.apr"
    aprfast_torch.save_model(model, path, layout="aprender")
    with aprfast.open(path) as f:
        assert f.info("embed.weight").offset != f.info("head.weight").offset
    fresh = _Tied()
    assert aprfast_torch.load_model(fresh, path) == (set(), [])
    assert torch.equal(fresh.head.weight, model.head.weight) and fresh.head.weight is fresh.embed.weight


def test_load_model_reports_a_tie_the_file_breaks(tmp_path):
    state = {k: v.clone() for k, v in _Tied().state_dict().items()}
    state["head.weight"] += 1  # two different values for what the model holds once
    path = tmp_path / "broken.apr"
    aprfast_torch.save_file(state, path)
    missing, unexpected = aprfast_torch.load_model(_Tied(), path, strict=False)
    assert missing == set() and unexpected == ["head.weight"]
    with pytest.raises(RuntimeError, match='Unexpected key\\(s\\) in state_dict: "head.weight"'):
        aprfast_torch.load_model(_Tied(), path)


def test_save_model_records_ties_in_the_metadata_as_safetensors_does(tmp_path):
    path = tmp_path / "tied.apr"
    aprfast_torch.save_model(_Tied(), path, metadata={"format": "pt"})
    with aprfast.safe_open(path, "pt") as f:
        assert f.metadata() == {"format": "pt", "head.weight": "embed.weight"}


def test_save_file_refuses_overlapping_views_naming_them():
    whole = torch.zeros(4, 4)
    with pytest.raises(RuntimeError, match="\\['a', 'b'\\].*save_model"):
        aprfast_torch.save({"a": whole, "b": whole[1:3], "c": torch.ones(2)})
    data = aprfast_torch.save({"top": whole[:2], "bottom": whole[2:]})  # disjoint parts are fine
    assert sorted(aprfast_torch.load(data)) == ["bottom", "top"]


def test_metadata_and_names_follow_safetensors_types():
    with pytest.raises(TypeError, match="'n'.*int"):
        aprfast_torch.save({"a": torch.zeros(1)}, metadata={"n": 1})
    with pytest.raises(TypeError, match="names must be str"):
        aprfast_torch.save({0: torch.zeros(1)})
    assert aprfast.open(aprfast_torch.save({"a": torch.zeros(1)}, {"n": "1"})).metadata == {"n": "1"}


@pytest.mark.parametrize("backend", ["mmap", "pread"])
def test_safe_open_backends_give_the_same_tensors(tmp_path, backend):
    tensors, path = _model(tmp_path)
    with aprfast.safe_open(path, "pt", backend=backend) as f:
        got = f.get_tensors()
        assert list(got) == f.offset_keys()
        for name, value in tensors.items():
            assert torch.equal(got[name], value) and torch.equal(f.get_slice(name)[...], value)
        got["t00"].add_(1)  # writable either way
    assert torch.equal(aprfast_torch.load_file(path)["t00"], tensors["t00"])


def test_safe_open_devices(tmp_path):
    tensors, path = _model(tmp_path)
    for device in ("cpu", torch.device("cpu"), None):
        with aprfast.safe_open(path, "pt", device=device) as f:
            assert f.get_tensor("t01").device.type == "cpu"
    with aprfast.safe_open(path, "pt", device="meta") as f:
        meta = f.get_tensor("bf")
        assert meta.device.type == "meta" and meta.dtype == torch.bfloat16 and meta.shape == (5, 7)
        assert f.get_slice("t03")[::2, 3].shape == (3,)
        with pytest.raises(aprfast.files.frameworks.SliceIndexError):
            f.get_slice("t03")[9]
    with pytest.raises(aprfast.files.frameworks.UsageError, match="not a torch device"):
        aprfast.safe_open(path, "pt", device="nowhere:3")


@pytest.mark.parametrize("staging", [1, 100, 1 << 20])
def test_one_tensor_to_a_device_through_staging(tmp_path, staging):
    # the path safe_open(..., device="cuda:0").get_tensor takes, run with the CPU as device
    tensors, path = _model(tmp_path)
    for mode in ("private", "pread"):
        with aprfast.open(path, mode=mode) as f:
            for name, value in tensors.items():
                got = aprfast_torch.tensor_to_device(f, name, "cpu", staging_bytes=staging)
                assert got.dtype == value.dtype and torch.equal(got, value), name


def test_one_compressed_tensor_to_a_device(tmp_path):
    values = {"w": torch.arange(4096, dtype=torch.float32).reshape(64, 64) % 7}
    path = tmp_path / "c.apr"
    aprfast_torch.save_file(values, path, compression="lz4")
    with aprfast.open(path) as f:
        assert f._file.codec("w")  # really stored compressed
        assert torch.equal(aprfast_torch.tensor_to_device(f, "w", "cpu", staging_bytes=64), values["w"])


def test_safe_open_on_a_device_reads_through_staging(tmp_path, monkeypatch):
    # no GPU needed: the handle is told it is on cuda:0 and the staging call is recorded
    tensors, path = _model(tmp_path)
    calls = []
    from aprfast.files import staging

    monkeypatch.setattr(staging, "tensor_to_device",
                        lambda file, name, device: calls.append((name, device)) or tensors[name])
    with aprfast.safe_open(path, "pt") as f:
        f.device = torch.device("cuda:0")
        assert torch.equal(f.get_tensor("t02"), tensors["t02"])
    assert calls == [("t02", torch.device("cuda:0"))]


def test_load_file_refuses_an_unknown_backend_before_reading(tmp_path):
    _, path = _model(tmp_path)
    for device in ("cpu", "meta"):
        with pytest.raises(ValueError, match="backend"):
            aprfast_torch.load_file(path, device=device, backend="uring")


def test_load_file_checks_the_crc_where_it_reads_and_the_map_is_lazy_as_safetensors(tmp_path):
    """As aprfast.load_file: the default checks the whole-file CRC where the bytes are
    read anyway (pread, direct) and not over the map, which is safetensors' load_file
    (issue 29 item 0: checking there read every byte and made the drop-in 6.7x slower);
    ``verify=True`` checks the map too, ``verify=False`` nothing: writable tensors over a
    private map, writes never reaching the file."""
    tensors = {"a": torch.arange(4096, dtype=torch.float32), "b": torch.ones(1024, dtype=torch.float32)}
    path = tmp_path / "m.apr"
    aprfast_torch.save_file(tensors, path)
    data = bytearray(path.read_bytes())
    with aprfast.open(path) as f:
        info = f.info("a")
    data[info.offset + 4] ^= 0x01  # a flipped bit in "a"'s second float
    path.write_bytes(bytes(data))
    with pytest.raises(aprfast.ChecksumError):
        aprfast_torch.load_file(path, backend="pread")
    for backend in ("mmap", "pread"):
        with pytest.raises(aprfast.ChecksumError):
            aprfast_torch.load_file(path, backend=backend, verify=True)
    assert aprfast_torch.load_file(path)["a"][1].item() != 1.0  # the map: lazy, unchecked, as safetensors
    loaded = aprfast_torch.load_file(path, verify=False)
    assert torch.equal(loaded["b"], tensors["b"])
    assert loaded["a"][1].item() != 1.0 and torch.equal(loaded["a"][2:], tensors["a"][2:])
    loaded["b"] += 1  # private: the process's copy changes, the file does not
    assert path.read_bytes() == bytes(data)
