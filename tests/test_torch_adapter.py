"""aprfast.torch: torch tensors round-trip through both layouts (torch is optional)."""

import numpy as np
import pytest

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
    # safetensors raises ValueError here, so ported code catches that
    with pytest.raises(ValueError, match="'x'"):
        aprfast_torch.save({"x": np.zeros(2)})


def test_sparse_tensors_are_refused_with_the_key_named():
    with pytest.raises(ValueError, match="'s'.*to_dense"):
        aprfast_torch.save({"s": torch.eye(3).to_sparse()})


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
    assert missing == [] and unexpected == []
    assert fresh.head.weight is fresh.embed.weight
    for name, value in model.state_dict().items():
        assert torch.equal(fresh.state_dict()[name], value)


def test_load_model_reports_missing_and_unexpected_keys_like_torch(tmp_path):
    path = tmp_path / "partial.apr"
    state = _Tied().state_dict()
    state.pop("norm.bias")
    state["extra.weight"] = torch.zeros(2)
    aprfast_torch.save_file(state, path)
    with pytest.raises(RuntimeError, match='Missing key.*"norm.bias".*\\n.*Unexpected key.*"extra.weight"'):
        aprfast_torch.load_model(_Tied(), path)
    missing, unexpected = aprfast_torch.load_model(_Tied(), path, strict=False)
    assert missing == ["norm.bias"] and unexpected == ["extra.weight"]


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
