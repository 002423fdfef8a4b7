"""Replacing ``safetensors`` with ``aprfast`` in the import lines is enough (issue 11).

Every test makes the same calls on the installed safetensors package and on aprfast,
over files holding the same tensors, and asserts the same outcome: the same names,
values (bit for bit), dtypes, shapes and writability, and, where safetensors raises,
an aprfast error that the same ``except`` clause catches (safetensors' SafetensorError
standing for aprfast.AprError).  Where aprfast deliberately does more or otherwise, the
test at the end of each section states aprfast's behaviour; docs/guide/safetensors.md lists them.
"""

import errno
import os
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

if os.environ.get("APRFAST_SANITIZED"):
    # Under tests/sanitize.sh libasan is preloaded, and every C++ exception torch throws (an
    # index out of range, CUDA without a GPU) aborts in its __cxa_throw interceptor: this
    # module compares safetensors' and aprfast's errors through torch, so it runs in the
    # normal suite; aprfast's C kernels are under the sanitizer in every other module.
    pytest.skip("torch's C++ exceptions abort under the preloaded ASan runtime", allow_module_level=True)

import aprfast
import aprfast.numpy as apr_numpy

# the behaviour compared is safetensors 0.8's (backend=, get_tensors, _safe_open_handle)
safetensors = pytest.importorskip("safetensors", minversion="0.8")
import safetensors.numpy as st_numpy  # noqa: E402

# the two libraries behind one set of attribute names; the torch and jax fixtures add
# ``torch`` and ``jax`` (their framework modules) when those frameworks are installed
ST = SimpleNamespace(name="safetensors", numpy=st_numpy, safe_open=safetensors.safe_open, suffix=".safetensors")
APR = SimpleNamespace(name="aprfast", numpy=apr_numpy, safe_open=aprfast.safe_open, suffix=".apr")


# --- how outcomes are compared --------------------------------------------------------
def outcome(call):
    """What ``call()`` did: ("ok", value) or ("raised", the exception)."""
    try:
        return "ok", call()
    except Exception as exc:  # noqa: BLE001 - the exception is the outcome under test
        return "raised", exc


def same_outcome(lib_call, describe=lambda value: value):
    """Run ``lib_call(lib)`` on both libraries; assert both returned equal descriptions
    or both raised catchable-alike errors; return aprfast's value."""
    theirs, ours = outcome(lambda: lib_call(ST)), outcome(lambda: lib_call(APR))
    assert theirs[0] == ours[0], f"safetensors {theirs}, aprfast {ours}"
    if theirs[0] == "raised":
        assert_caught_alike(theirs[1], ours[1])
        return ours[1]
    assert describe(ours[1]) == describe(theirs[1])
    return ours[1]


def assert_caught_alike(theirs: Exception, ours: Exception) -> None:
    """Every class an ``except`` clause could name for safetensors' error also catches
    aprfast's (SafetensorError mapped to AprError)."""
    for cls in type(theirs).__mro__:
        if cls in (object, BaseException, Exception):
            continue
        wanted = aprfast.AprError if cls is safetensors.SafetensorError else cls
        assert isinstance(ours, wanted), f"aprfast raised {type(ours).__mro__}, safetensors {type(theirs).__mro__}"


def array_facts(array):
    """Everything a NumPy user can observe of a loaded array."""
    return (type(array).__name__, array.dtype.str, array.dtype.name, array.shape,
            bool(array.flags.writeable), array.tobytes())


def dict_facts(tensors, facts=array_facts):
    return {name: facts(value) for name, value in tensors.items()}


def saved(lib, tmp_path, tensors, metadata=None, stem="m"):
    path = tmp_path / f"{stem}{lib.suffix}"
    lib.numpy.save_file(tensors, str(path), metadata=metadata)
    return str(path)


@pytest.fixture
def model():
    rng = np.random.default_rng(11)
    return {"embed.weight": rng.standard_normal((10, 5)).astype(np.float32),
            "layer.0.bias": np.arange(7, dtype=np.int64),
            "mask": np.array([True, False, True]),
            "scalar": np.array(2.5, dtype=np.float64),
            "empty": np.zeros((0, 3), dtype=np.float16),
            "cube": np.arange(60, dtype=np.int16).reshape(3, 4, 5),
            "z": rng.standard_normal(4).astype(np.float32) + 1j * np.float32(2)}


# --- safetensors.numpy ------------------------------------------------------------------
NUMPY_DTYPES = [np.bool_, np.uint8, np.int8, np.uint16, np.int16, np.uint32, np.int32, np.uint64, np.int64,
                np.float16, np.float32, np.float64, np.complex64]


@pytest.mark.parametrize("dtype", NUMPY_DTYPES, ids=lambda d: np.dtype(d).name)
def test_every_numpy_dtype_round_trips_by_file_and_by_bytes(tmp_path, dtype):
    values = (np.arange(-6, 6) % 3).astype(dtype).reshape(3, 4)
    tensors = {"t": values, "s": values[:1, :1].reshape(())}
    same_outcome(lambda lib: lib.numpy.load_file(saved(lib, tmp_path, tensors)), dict_facts)
    same_outcome(lambda lib: lib.numpy.load(lib.numpy.save(tensors)), dict_facts)
    np.testing.assert_array_equal(apr_numpy.load_file(saved(APR, tmp_path, tensors))["t"], values)


def test_ml_dtypes_types_load_back_in_aprfast(tmp_path):
    # documented difference: safetensors.numpy 0.8 writes ml_dtypes' bfloat16 but cannot
    # load it back (KeyError 'BF16'), and refuses float8; aprfast round-trips them all
    ml_dtypes = pytest.importorskip("ml_dtypes")
    for dtype in (ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2):
        typed = np.array([1.5, -2.0, 0.25], dtype=dtype)
        by_bytes = apr_numpy.load(apr_numpy.save({"h": typed}))
        for loaded in (by_bytes, apr_numpy.load_file(saved(APR, tmp_path, {"h": typed}))):
            assert loaded["h"].dtype == typed.dtype and loaded["h"].tobytes() == typed.tobytes()


def test_load_file_and_load_give_the_same_arrays(tmp_path, model):
    same_outcome(lambda lib: lib.numpy.load_file(saved(lib, tmp_path, model)), dict_facts)
    same_outcome(lambda lib: lib.numpy.load(lib.numpy.save(model)), dict_facts)
    # aprfast.numpy.load also takes a bytearray or memoryview (safetensors: bytes only)
    data = apr_numpy.save(model)
    for buffer in (bytearray, memoryview):
        assert dict_facts(apr_numpy.load(buffer(data))) == dict_facts(apr_numpy.load(data))


def test_paths_may_be_path_objects(tmp_path, model):
    def round_trip(lib):
        path = tmp_path / f"p{lib.suffix}"
        lib.numpy.save_file(model, path)
        return lib.numpy.load_file(path)

    same_outcome(round_trip, dict_facts)


def test_save_ignores_dict_order_and_byte_order(model):
    for lib in (ST, APR):
        backwards = dict(reversed(list(model.items())))
        assert lib.numpy.save(model) == lib.numpy.save(backwards)
    big_endian = {"t": np.arange(6, dtype=">i4").reshape(2, 3)}
    loaded = same_outcome(lambda lib: lib.numpy.load(lib.numpy.save(big_endian)), dict_facts)
    assert loaded["t"].dtype == np.dtype("<i4")


def test_loaded_arrays_are_writable_and_writes_never_reach_the_file(tmp_path, model):
    for lib in (ST, APR):
        path = saved(lib, tmp_path, model)
        before = Path(path).read_bytes()
        loaded = lib.numpy.load_file(path)
        loaded["embed.weight"] *= 2  # the in-place update ported code does
        loaded["layer.0.bias"][0] = 99
        assert Path(path).read_bytes() == before, lib.name
        np.testing.assert_array_equal(lib.numpy.load_file(path)["layer.0.bias"], model["layer.0.bias"])
    same_outcome(lambda lib: lib.numpy.load(lib.numpy.save(model)),
                 lambda loaded: {name: a.flags.writeable for name, a in loaded.items()})


@pytest.mark.parametrize("backend", ["mmap", "pread"])
def test_load_file_backends(tmp_path, model, backend):
    same_outcome(lambda lib: lib.numpy.load_file(saved(lib, tmp_path, model), backend=backend), dict_facts)


@pytest.mark.parametrize("metadata", [None, {"format": "np"}, {"a": "1", "b": "", "ü": "ß"}])
def test_metadata_comes_back_as_written(tmp_path, model, metadata):
    def read(lib):
        with lib.safe_open(saved(lib, tmp_path, model, metadata), framework="np") as f:
            return f.metadata()

    assert same_outcome(read) == metadata


@pytest.mark.parametrize("metadata", [{"epoch": 3}, {"ok": "x", "bad": None}, {1: "x"}, ["format"], "np"])
def test_metadata_that_is_not_str_to_str_is_refused(tmp_path, model, metadata):
    error = same_outcome(lambda lib: saved(lib, tmp_path, model, metadata))
    assert isinstance(error, TypeError)


def test_tensor_names_must_be_str(tmp_path):
    error = same_outcome(lambda lib: lib.numpy.save({7: np.zeros(2)}))
    assert isinstance(error, TypeError)


def test_missing_files(tmp_path):
    absent = str(tmp_path / "absent")
    for call in (lambda lib: lib.numpy.load_file(absent),
                 lambda lib: lib.safe_open(absent, framework="np"),
                 lambda lib: lib.numpy.save_file({"a": np.zeros(2)}, str(tmp_path / "no" / "dir" / "x"))):
        same_outcome(call)
    error = same_outcome(lambda lib: lib.numpy.load_file(absent))
    assert isinstance(error, FileNotFoundError) and error.errno == errno.ENOENT and error.filename == absent


@pytest.mark.parametrize("data", [b"", b"\x00" * 7, b"garbage that is no tensor file"])
def test_bytes_that_are_no_file_are_refused(data):
    same_outcome(lambda lib: lib.numpy.load(data))


# --- safe_open --------------------------------------------------------------------------
def test_safe_open_lists_and_reads_every_tensor(tmp_path, model):
    def read(lib):
        with lib.safe_open(saved(lib, tmp_path, model), framework="np") as f:
            return {"keys": f.keys(), "offset_keys": sorted(f.offset_keys()),
                    "tensors": dict_facts({k: f.get_tensor(k) for k in f.keys()}),
                    "get_tensors": dict_facts(f.get_tensors())}

    facts = same_outcome(read)
    assert facts["keys"] == sorted(model)  # sorted, in both


def test_offset_keys_follow_the_data(tmp_path, model):
    with aprfast.safe_open(saved(APR, tmp_path, model), framework="np") as f:
        offsets = [f._file.info(name).offset for name in f.offset_keys()]
        assert offsets == sorted(offsets) and sorted(f.offset_keys()) == f.keys()
        assert list(f.get_tensors()) == f.offset_keys()


@pytest.mark.parametrize("framework", ["np", "numpy"])
def test_framework_spellings(tmp_path, model, framework):
    def read(lib):
        with lib.safe_open(saved(lib, tmp_path, model), framework=framework) as f:
            return array_facts(f.get_tensor("cube"))

    same_outcome(read)


@pytest.mark.parametrize("framework", ["tf2", "", "mlx-nope"])
def test_unknown_frameworks_are_refused(tmp_path, model, framework):
    same_outcome(lambda lib: lib.safe_open(saved(lib, tmp_path, model), framework=framework))


def test_numpy_on_another_device_is_refused(tmp_path, model):
    same_outcome(lambda lib: lib.safe_open(saved(lib, tmp_path, model), framework="np",
                                           device="cuda:0").get_tensor("cube"))


def test_unknown_backend_is_refused(tmp_path, model):
    same_outcome(lambda lib: lib.safe_open(saved(lib, tmp_path, model), framework="np", backend="nope"))


def test_missing_tensor_names(tmp_path, model):
    for call in ("get_tensor", "get_slice"):
        def read(lib, call=call):
            with lib.safe_open(saved(lib, tmp_path, model), framework="np") as f:
                return getattr(f, call)("absent")

        error = same_outcome(read)
        assert isinstance(error, KeyError)  # aprfast's is a KeyError too, as a dict's


def test_a_closed_handle_refuses_every_read(tmp_path, model):
    for call in (lambda f: f.keys(), lambda f: f.metadata(), lambda f: f.offset_keys(),
                 lambda f: f.get_tensor("cube"), lambda f: f.get_slice("cube")):
        def read(lib, call=call):
            with lib.safe_open(saved(lib, tmp_path, model), framework="np") as f:
                pass
            return call(f)

        same_outcome(read)


def test_safe_open_works_without_a_with_block(tmp_path, model):
    def read(lib):
        f = lib.safe_open(saved(lib, tmp_path, model), framework="np")
        return f.keys(), array_facts(f.get_tensor("embed.weight"))

    same_outcome(read)


def test_safe_open_reads_an_open_file_object(tmp_path, model):
    # safetensors' own handle for file objects is the private _safe_open_handle
    with open(saved(ST, tmp_path, model), "rb") as raw, safetensors._safe_open_handle(raw, "np") as f:
        theirs = dict_facts({k: f.get_tensor(k) for k in f.keys()})
    with open(saved(APR, tmp_path, model), "rb") as raw, aprfast.safe_open(raw, "np") as f:
        assert dict_facts({k: f.get_tensor(k) for k in f.keys()}) == theirs


# --- get_slice --------------------------------------------------------------------------
# keys safetensors' NumPy slicer takes; aprfast takes every one of them the same way
NUMPY_SLICER_KEYS = [slice(None), (), slice(None, 2), (slice(None), slice(None, 2)), (0, slice(None, 2)),
                     (slice(2, None), 0), (slice(2, None), -1), (slice(2, None), -5), [], (Ellipsis, 1),
                     slice(None, None, 2), 0, (0, 0), np.int64(3), (slice(1, 3), slice(4, 5)), -1,
                     (slice(0, 0),), (Ellipsis,)]


@pytest.mark.parametrize("key", NUMPY_SLICER_KEYS, ids=repr)
def test_get_slice_numpy(tmp_path, key):
    values = np.random.default_rng(3).standard_normal((10, 5))

    def read(lib):
        with lib.safe_open(saved(lib, tmp_path, {"a": values}), framework="np") as f:
            part = f.get_slice("a")
            return part.get_shape(), part.get_dtype(), array_facts(part[key])

    shape, dtype, facts = same_outcome(read)
    assert shape == [10, 5] and dtype == "F64" and facts[-1] == np.ascontiguousarray(values[key]).tobytes()


@pytest.mark.parametrize("key", [(slice(2, None), -6), (slice(2, None), 20), (5, 0, 0), 10, -11])
def test_get_slice_numpy_out_of_range(tmp_path, key):
    def read(lib):
        with lib.safe_open(saved(lib, tmp_path, {"a": np.zeros((10, 5))}), framework="np") as f:
            return f.get_slice("a")[key]

    error = same_outcome(read)
    assert isinstance(error, IndexError)  # aprfast's is NumPy's class as well


@pytest.mark.parametrize("dtype", NUMPY_DTYPES, ids=lambda d: np.dtype(d).name)
def test_get_slice_dtype_names(tmp_path, dtype):
    def read(lib):
        with lib.safe_open(saved(lib, tmp_path, {"t": np.zeros((2, 3), dtype)}), framework="np") as f:
            part = f.get_slice("t")
            return part.get_dtype(), part.get_shape(), type(part.get_shape()).__name__

    same_outcome(read)


def test_aprfast_slices_the_way_numpy_does_where_safetensors_refuses(tmp_path):
    # documented difference: safetensors' NumPy slicer refuses steps below 1, None,
    # negative slice bounds, row lists, and stops past the end; aprfast indexes as NumPy
    values = np.arange(50.0).reshape(10, 5)
    with aprfast.safe_open(saved(APR, tmp_path, {"a": values}), framework="np") as f:
        part = f.get_slice("a")
        for key in [(slice(None), slice(None, None, -1)), (None, 1), slice(-3, None), [4, 0, 4],
                    slice(None, 20), (slice(None), slice(None, 20)), (Ellipsis, [0, 2])]:
            np.testing.assert_array_equal(part[key], values[key])
    with ST.safe_open(saved(ST, tmp_path, {"a": values}), framework="np") as f:
        with pytest.raises(safetensors.SafetensorError):
            f.get_slice("a")[:20]


# --- safetensors.torch ------------------------------------------------------------------
@pytest.fixture(scope="module")
def torch():
    return pytest.importorskip("torch")


@pytest.fixture(scope="module")
def pt(torch):
    import safetensors.torch as st_torch

    import aprfast.torch as apr_torch

    ST.torch, APR.torch = st_torch, apr_torch
    return SimpleNamespace(st=st_torch, apr=apr_torch)


def tensor_facts(tensor):
    """What a torch user observes of a loaded tensor: dtype, shape, device and the bits
    (float8 and float4 have no torch.equal).  Not its strides: safetensors' "pt" slices
    are views into the file's storage, aprfast's are compact copies."""
    import torch

    flat = tensor.detach().reshape(-1).contiguous()
    bits = flat.view(torch.uint8).cpu().numpy().tobytes() if flat.numel() else b""
    return str(tensor.dtype), tuple(tensor.shape), tensor.device.type, bits


def torch_saved(lib, tmp_path, tensors, metadata=None, stem="t"):
    path = str(tmp_path / f"{stem}{lib.suffix}")
    lib.torch.save_file(tensors, path, metadata=metadata)
    return path


def torch_sample(torch):
    g = torch.Generator().manual_seed(5)
    tensors = {"f32": torch.randn(3, 4, generator=g), "f64": torch.randn(2, generator=g, dtype=torch.float64),
               "f16": torch.randn(4, generator=g).half(), "bf16": torch.randn(2, 3, generator=g).bfloat16(),
               "i8": torch.tensor([-128, 0, 127], dtype=torch.int8), "u8": torch.arange(5, dtype=torch.uint8),
               "i16": torch.tensor([-2, 3], dtype=torch.int16), "i32": torch.arange(-3, 3, dtype=torch.int32),
               "i64": torch.arange(6).reshape(2, 3), "bool": torch.tensor([[True, False], [False, True]]),
               "c64": torch.complex(torch.randn(3, generator=g), torch.randn(3, generator=g)),
               "scalar": torch.tensor(7.5), "empty": torch.zeros(2, 0), "empty2": torch.zeros(0, 3)}
    for name in ("uint16", "uint32", "uint64"):
        if hasattr(torch, name):
            tensors[name] = torch.tensor([0, 1, 7], dtype=getattr(torch, name))
    for name in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu"):
        if hasattr(torch, name):
            tensors[name] = torch.tensor([0.5, 2.0, 4.0], dtype=getattr(torch, name))
    if hasattr(torch, "float4_e2m1fn_x2"):
        tensors["fp4"] = torch.tensor([[0x21, 0x7F], [0x00, 0xF1]], dtype=torch.uint8).view(torch.float4_e2m1fn_x2)
    return tensors


def test_every_torch_dtype_round_trips(tmp_path, torch, pt):
    tensors = torch_sample(torch)
    facts = lambda loaded: dict_facts(loaded, tensor_facts)  # noqa: E731
    loaded = same_outcome(lambda lib: lib.torch.load_file(torch_saved(lib, tmp_path, tensors)), facts)
    assert sorted(loaded) == sorted(tensors)
    assert dict_facts(loaded, tensor_facts) == dict_facts(tensors, tensor_facts)
    # safetensors' pread backend cannot shape FP4 (RuntimeError), and its load() from bytes
    # has no F8_E8M0 nor F4 (KeyError); aprfast reads them every way
    no_fp4 = {k: v for k, v in tensors.items() if k != "fp4"}
    same_outcome(lambda lib: lib.torch.load_file(torch_saved(lib, tmp_path, no_fp4), backend="pread"), facts)
    pread = APR.torch.load_file(torch_saved(APR, tmp_path, tensors), backend="pread")
    assert dict_facts(pread, tensor_facts) == dict_facts(tensors, tensor_facts)
    in_bytes = {k: v for k, v in no_fp4.items() if k != "float8_e8m0fnu"}
    same_outcome(lambda lib: lib.torch.load(lib.torch.save(in_bytes)), facts)
    assert dict_facts(APR.torch.load(APR.torch.save(tensors)), tensor_facts) == dict_facts(tensors, tensor_facts)


def test_torch_metadata_and_safe_open_pt(tmp_path, torch, pt):
    tensors = torch_sample(torch)

    def read(lib):
        with lib.safe_open(torch_saved(lib, tmp_path, tensors, {"format": "pt"}), framework="pt") as f:
            return f.metadata(), f.keys(), {k: tensor_facts(f.get_tensor(k)) for k in f.keys()}

    same_outcome(read)


def test_torch_cpu_device(tmp_path, torch, pt):
    tensors = {"w": torch.randn(3, 3)}
    same_outcome(lambda lib: lib.torch.load_file(torch_saved(lib, tmp_path, tensors), device="cpu"),
                 lambda loaded: dict_facts(loaded, tensor_facts))

    def read(lib):
        with lib.safe_open(torch_saved(lib, tmp_path, tensors), framework="pt", device="cpu") as f:
            return tensor_facts(f.get_tensor("w")), tensor_facts(f.get_slice("w")[1:])

    same_outcome(read)
    # aprfast also takes a torch.device, which safetensors refuses (SafetensorError)
    loaded = APR.torch.load_file(torch_saved(APR, tmp_path, tensors), device=torch.device("cpu"))
    assert torch.equal(loaded["w"], tensors["w"])


@pytest.mark.skipif(__import__("importlib").util.find_spec("torch") is None, reason="torch is not installed")
def test_a_cuda_device_without_cuda_fails_alike(tmp_path, torch, pt):
    if os.environ.get("APRFAST_SANITIZED"):
        # torch's CUDA hooks raise a C++ exception without a GPU, and C++ exceptions abort in
        # the preloaded ASan runtime's __cxa_throw interceptor (as jaxlib's do): torch's, not
        # aprfast's; the normal run tests this
        pytest.skip("torch's C++ exceptions abort under the preloaded ASan runtime (tested in the normal run)")
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA; test_torch_adapter loads onto it")
    tensors = {"w": torch.randn(3, 3)}
    for device in ("cuda:0", 0):
        same_outcome(lambda lib, device=device: lib.torch.load_file(torch_saved(lib, tmp_path, tensors),
                                                                    device=device))


def test_torch_loads_are_writable_and_leave_the_file_alone(tmp_path, torch, pt):
    tensors = {"w": torch.randn(4, 4), "b": torch.zeros(4)}
    for lib in (ST, APR):
        path = torch_saved(lib, tmp_path, tensors)
        before = Path(path).read_bytes()
        loaded = lib.torch.load_file(path)
        loaded["w"].add_(1)  # in-place training step
        loaded["b"][0] = 5
        assert Path(path).read_bytes() == before, lib.name
        assert torch.equal(lib.torch.load_file(path)["w"], tensors["w"])


# keys torch's own indexing takes (safetensors' "pt" slices go through it)
TORCH_KEYS = [slice(None), (), slice(None, 2), (slice(None), slice(None, 2)), (0, slice(None, 2)),
              (slice(2, None), -1), [], [0, 2], (Ellipsis, 1), slice(None, None, 3), (None, 1),
              slice(-3, None), slice(None, 20), (slice(1, 3), slice(4, 5)), (slice(None), [1, 3])]


@pytest.mark.parametrize("key", TORCH_KEYS, ids=repr)
def test_get_slice_torch(tmp_path, torch, pt, key):
    values = torch.arange(50, dtype=torch.float32).reshape(10, 5)

    def read(lib):
        with lib.safe_open(torch_saved(lib, tmp_path, {"a": values}), framework="pt") as f:
            return tensor_facts(f.get_slice("a")[key])

    facts = same_outcome(read)
    assert facts == tensor_facts(values[key])


@pytest.mark.parametrize("key", [(slice(2, None), -6), 10, (0, 0, 0)], ids=repr)
def test_get_slice_torch_out_of_range(tmp_path, torch, pt, key):
    def read(lib):
        with lib.safe_open(torch_saved(lib, tmp_path, {"a": torch.zeros(10, 5)}), framework="pt") as f:
            return f.get_slice("a")[key]

    same_outcome(read)


def test_get_slice_shape_and_dtype_of_every_torch_dtype(tmp_path, torch, pt):
    tensors = torch_sample(torch)

    def read(lib):
        with lib.safe_open(torch_saved(lib, tmp_path, tensors), framework="pt") as f:
            return {k: (f.get_slice(k).get_shape(), f.get_slice(k).get_dtype()) for k in f.keys()}

    same_outcome(read)


def test_fp4_slices_answer_shape_and_dtype_but_are_read_whole(tmp_path, torch, pt):
    if not hasattr(torch, "float4_e2m1fn_x2"):
        pytest.skip("this torch has no float4_e2m1fn_x2")
    packed = {"x": torch.tensor([[0x21, 0x7F], [0x00, 0xF1]], dtype=torch.uint8).view(torch.float4_e2m1fn_x2)}

    def read(lib):
        with lib.safe_open(torch_saved(lib, tmp_path, packed), framework="pt") as f:
            part = f.get_slice("x")
            return part.get_shape(), part.get_dtype(), tensor_facts(f.get_tensor("x"))

    assert same_outcome(read)[:2] == ([2, 4], "F4")  # the logical shape: two values per byte
    with aprfast.safe_open(torch_saved(APR, tmp_path, packed), framework="pt") as f:
        with pytest.raises(aprfast.LayoutError, match="get_tensor"):  # safetensors: RuntimeError from torch
            f.get_slice("x")[:1]


def test_save_file_validates_its_arguments(tmp_path, torch, pt):
    path = lambda lib: str(tmp_path / f"bad{lib.suffix}")  # noqa: E731
    for bad in ({"a": {"not": "a tensor"}}, {"a": np.zeros(2)}, "not a dict",
                {"s": torch.sparse_coo_tensor(torch.tensor([[0], [1]]), torch.tensor([1.0]), (2, 3),
                                              check_invariants=True)}):
        error = same_outcome(lambda lib, bad=bad: lib.torch.save_file(bad, path(lib)))
        assert isinstance(error, ValueError)
        theirs = outcome(lambda bad=bad: ST.torch.save_file(bad, path(ST)))[1]
        assert str(error) == str(theirs)  # word for word
    error = same_outcome(lambda lib: lib.torch.save_file({"m": torch.zeros(2, device="meta")}, path(lib)))
    assert isinstance(error, (RuntimeError, NotImplementedError))


def test_overlapping_views_are_refused_and_disjoint_ones_saved(tmp_path, torch, pt):
    whole = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    for views in ({"A": whole, "B": whole[:1]}, {"A": whole, "B": whole[1:]}):
        error = same_outcome(lambda lib, views=views: torch_saved(lib, tmp_path, views))
        assert isinstance(error, RuntimeError)
    storage = torch.zeros(10, 10)
    disjoint = {"head": storage[:1], "tail": storage[1:]}
    same_outcome(lambda lib: lib.torch.load_file(torch_saved(lib, tmp_path, disjoint)),
                 lambda loaded: dict_facts(loaded, tensor_facts))


def _models(torch):
    class Tied(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(6, 6)
            self.b = self.a

    class Untied(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(6, 6)
            self.b = torch.nn.Linear(6, 6)

    class Copied(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(6, 6)
            self.b = torch.nn.Linear(6, 6)
            self.b.load_state_dict(self.a.state_dict())

    return Tied, Untied, Copied


def state_facts(model):
    return {name: tensor_facts(value) for name, value in model.state_dict().items()}


@pytest.mark.parametrize("kind", [0, 2], ids=["tied", "copied"])
def test_save_model_load_model_round_trip(tmp_path, torch, pt, kind):
    cls = _models(torch)[kind]
    torch.manual_seed(0)
    source = cls()

    def round_trip(lib):
        path = str(tmp_path / f"model{lib.suffix}")
        lib.torch.save_model(source, path)
        with lib.safe_open(path, framework="pt") as f:
            metadata = f.metadata()
        target = cls()
        result = lib.torch.load_model(target, path)
        return metadata, result, state_facts(target), target.a.weight is target.b.weight

    metadata, result, facts, tied = same_outcome(round_trip)
    assert facts == state_facts(source) and tied == (kind == 0)


def test_load_model_reports_missing_and_unexpected_like_safetensors(tmp_path, torch, pt):
    Tied, _, _ = _models(torch)
    state = Tied().state_dict()
    partial = {"a.weight": state["a.weight"].clone(), "extra": torch.zeros(3)}

    def load(lib, strict):
        path = torch_saved(lib, tmp_path, partial, stem="partial")
        return lib.torch.load_model(Tied(), path, strict=strict)

    missing, unexpected = same_outcome(lambda lib: load(lib, False))
    assert missing == {"a.bias"} and unexpected == ["extra"]  # one name per tie: b.bias is a.bias
    error = same_outcome(lambda lib: load(lib, True))
    assert str(error) == str(outcome(lambda: load(ST, True))[1])  # word for word


def test_load_model_fills_tied_names_from_the_name_on_file(tmp_path, torch, pt):
    Tied, _, _ = _models(torch)
    source = Tied()
    only_b = {k: v for k, v in source.state_dict().items() if k.startswith("b.")}

    def load(lib):
        target = Tied()
        result = lib.torch.load_model(target, torch_saved(lib, tmp_path, only_b, stem="only_b"))
        return result, state_facts(target)

    result, facts = same_outcome(load)
    assert result == (set(), []) and facts == state_facts(source)


def test_load_model_refuses_different_values_for_names_the_model_ties(tmp_path, torch, pt):
    Tied, Untied, _ = _models(torch)
    untied = Untied()

    def load(lib):
        path = str(tmp_path / f"untied{lib.suffix}")
        lib.torch.save_model(untied, path)
        return lib.torch.load_model(Tied(), path)

    error = same_outcome(load)
    assert 'Unexpected key(s) in state_dict: "b.bias", "b.weight"' in str(error)


def test_save_model_keeps_the_whole_tensor_of_a_view_and_load_model_refills_it(tmp_path, torch, pt):
    class Fused(torch.nn.Module):  # a buffer that is a view into part of a parameter
        def __init__(self):
            super().__init__()
            self.qkv = torch.nn.Parameter(torch.randn(6, 4))
            self.register_buffer("q", self.qkv.data[:2])

    source = Fused()

    def round_trip(lib):
        path = str(tmp_path / f"fused{lib.suffix}")
        lib.torch.save_model(source, path)
        with lib.safe_open(path, framework="pt") as f:
            listed = f.keys(), f.metadata()
        target = Fused()
        result = lib.torch.load_model(target, path)
        return listed, result, state_facts(target), target.q.data_ptr() == target.qkv.data_ptr()

    listed, result, facts, still_a_view = same_outcome(round_trip)
    assert listed == (["qkv"], {"q": "qkv"}) and result == (set(), [])
    assert facts == state_facts(source) and still_a_view


def test_tied_names_are_aliases_in_aprfast(tmp_path, torch, pt):
    # documented difference: where safetensors refuses two names for one tensor in
    # save_file (RuntimeError) and save_model drops one, aprfast stores the tensor once
    # with both names pointing at it, so a model that unties them still loads.
    Tied, Untied, _ = _models(torch)
    tied = Tied()
    with pytest.raises(RuntimeError):
        ST.torch.save_file(tied.state_dict(), str(tmp_path / "t.safetensors"))
    path = str(tmp_path / "t.apr")
    APR.torch.save_file(tied.state_dict(), path)
    with aprfast.open(path) as f:
        assert f.info("a.weight").offset == f.info("b.weight").offset
    untied = Untied()
    assert APR.torch.load_model(untied, path) == (set(), [])
    assert torch.equal(untied.b.weight, tied.a.weight)


def test_non_contiguous_tensors_are_stored_as_their_values_in_aprfast(tmp_path, torch, pt):
    # documented difference: safetensors refuses them (ValueError); aprfast stores the values
    transposed = torch.arange(6.0).reshape(2, 3).t()
    with pytest.raises(ValueError):
        ST.torch.save_file({"t": transposed}, str(tmp_path / "t.safetensors"))
    path = str(tmp_path / "t.apr")
    APR.torch.save_file({"t": transposed}, path)
    assert torch.equal(APR.torch.load_file(path)["t"], transposed)


def test_meta_device_gives_shapes_and_dtypes_in_aprfast(tmp_path, torch, pt):
    # documented difference: safetensors refuses device="meta"
    tensors = torch_sample(torch)
    path = torch_saved(APR, tmp_path, tensors)
    loaded = APR.torch.load_file(path, device="meta")
    with aprfast.safe_open(path, framework="pt", device="meta") as f:
        sliced = f.get_slice("f32")[1:, :2]
        assert sliced.device.type == "meta" and tuple(sliced.shape) == (2, 2)
        for name, value in tensors.items():
            for meta in (loaded[name], f.get_tensor(name)):
                assert meta.device.type == "meta" and meta.dtype == value.dtype and meta.shape == value.shape


# --- safetensors.flax -> aprfast.jax -----------------------------------------------------
@pytest.fixture(scope="module")
def jx():
    import os

    if os.environ.get("APRFAST_SANITIZED"):  # see test_frameworks._import_jax
        pytest.skip("jaxlib aborts under the preloaded ASan runtime (tested in the normal run)")
    jax = pytest.importorskip("jax")
    import safetensors.flax as st_flax

    import aprfast.jax as apr_jax

    ST.jax, APR.jax = st_flax, apr_jax
    return jax


def jax_facts(array):
    return str(array.dtype), tuple(array.shape), type(array).__name__, np.asarray(array).tobytes()


def jax_sample(jax):
    import jax.numpy as jnp

    key = jax.random.key(0)
    return {"f32": jax.random.normal(key, (3, 4), dtype=jnp.float32),
            "f16": jax.random.normal(key, (5,), dtype=jnp.float16),
            "bf16": jax.random.normal(key, (2, 3), dtype=jnp.bfloat16),
            "c64": jax.random.normal(key, (2,), dtype=jnp.complex64),
            "i32": jnp.arange(6, dtype=jnp.int32).reshape(2, 3), "u8": jnp.arange(4, dtype=jnp.uint8),
            "bool": jnp.array([True, False]), "scalar": jnp.array(1.5, dtype=jnp.float32),
            "empty": jnp.zeros((0, 2), dtype=jnp.float32)}


@pytest.mark.parametrize("function", ["save_file", "save", "load_file", "load"])
def test_jax_module_takes_flax_arguments(jx, function):
    import inspect

    ours = inspect.signature(getattr(APR.jax, function)).parameters
    theirs = inspect.signature(getattr(ST.jax, function)).parameters
    for name, parameter in theirs.items():
        assert name in ours and ours[name].kind == parameter.kind and ours[name].default == parameter.default


def test_jax_round_trips(tmp_path, jx):
    tensors = jax_sample(jx)
    facts = lambda loaded: dict_facts(loaded, jax_facts)  # noqa: E731

    def by_file(lib, backend="mmap"):
        path = str(tmp_path / f"j{lib.suffix}")
        lib.jax.save_file(tensors, path, metadata={"format": "flax"})
        return lib.jax.load_file(path, backend=backend)

    loaded = same_outcome(by_file, facts)
    assert facts(loaded) == facts(jax_sample(jx))  # safetensors.flax turned ``tensors`` into NumPy in place
    same_outcome(lambda lib: by_file(lib, "pread"), facts)
    # safetensors.flax.load (bytes, through safetensors.numpy) has no BF16 (KeyError)
    no_bf16 = {k: v for k, v in tensors.items() if k != "bf16"}
    same_outcome(lambda lib: lib.jax.load(lib.jax.save(no_bf16)), facts)
    assert facts(APR.jax.load(APR.jax.save(tensors))) == facts(jax_sample(jx))


@pytest.mark.parametrize("framework", ["flax", "jax"])
def test_safe_open_jax(tmp_path, jx, framework):
    tensors = jax_sample(jx)

    def read(lib):
        path = str(tmp_path / f"j{lib.suffix}")
        lib.jax.save_file(tensors, path)
        with lib.safe_open(path, framework=framework) as f:
            return ({k: jax_facts(f.get_tensor(k)) for k in f.keys()},
                    jax_facts(f.get_slice("f32")[1:, :2]), f.get_slice("bf16").get_dtype())

    same_outcome(read)


@pytest.mark.parametrize("strict", [True, False])
def test_load_model_of_a_tied_file_into_an_untied_model_is_what_safetensors_does(tmp_path, torch, pt, strict):
    # issue 28 item 9: the tie's second name is not the untied model's parameter
    Tied, Untied, _ = _models(torch)
    torch.manual_seed(0)
    source = Tied()

    def load(lib):
        path = str(tmp_path / f"tied{lib.suffix}")
        lib.torch.save_model(source, path)
        target = Untied()
        result = lib.torch.load_model(target, path, strict=strict)
        return result, state_facts(target)["a.weight"]

    outcome_here = same_outcome(load)
    if strict:
        assert "Missing key(s)" in str(outcome_here) and "b.weight" in str(outcome_here)
    else:
        (missing, unexpected), _ = outcome_here
        assert missing == {"b.weight", "b.bias"} and unexpected == []
