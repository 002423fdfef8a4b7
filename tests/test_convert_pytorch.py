"""PyTorch checkpoints -> .apr without running pickle (issue 12 part 4).

Real files come from ``torch.save`` (torch is installed in CI; without it those tests
skip and say so).  Malicious and malformed files are assembled here opcode by opcode,
so they need no torch: every one must give a typed AprError and run nothing.
"""

import json
import os
import struct
import tempfile
import zipfile

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import aprfast
from aprfast.convert import detect, open_source
from aprfast.convert import pytorch as cpt
from aprfast.convert._pickle_vm import MAX_MARK_DEPTH, PickleRefusedError
from aprfast.errors import (
    AprError,
    ChecksumError,
    CorruptError,
    FormatError,
    LimitError,
    UnknownDTypeError,
    VersionError,
)

try:
    import torch
except ImportError:  # pragma: no cover - CI installs torch
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed: files written by torch.save "
                                                       "cannot be made (CI installs it)")


# --- a small pickle assembler ----------------------------------------------------------
def uni(text: str) -> bytes:
    raw = text.encode()
    return b"X" + struct.pack("<I", len(raw)) + raw


def glob(module: str, name: str) -> bytes:
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"


def i1(n: int) -> bytes:
    return b"K" + bytes([n])


def i4(n: int) -> bytes:
    return b"J" + struct.pack("<i", n)


def long1(n: int) -> bytes:
    raw = n.to_bytes((n.bit_length() + 8) // 8, "little", signed=True)
    return b"\x8a" + bytes([len(raw)]) + raw


def tup(*items: bytes) -> bytes:
    return b"(" + b"".join(items) + b"t"


PROTO = b"\x80\x02"
EMPTY_DICT = b"}"
EMPTY_TUPLE = b")"
REDUCE = b"R"
STOP = b"."


def storage_pid(key: str, numel: int, storage: str = "FloatStorage") -> bytes:
    return tup(uni("storage"), glob("torch", storage), uni(key), uni("cpu"), long1(numel)) + b"Q"


def tensor(key: str, numel: int, size, stride, offset: int = 0, storage: str = "FloatStorage") -> bytes:
    """_rebuild_tensor_v2(storage, offset, size, stride, False, OrderedDict()) as torch writes it."""
    return (glob("torch._utils", "_rebuild_tensor_v2")
            + tup(storage_pid(key, numel, storage), long1(offset), tup(*map(long1, size)), tup(*map(long1, stride)),
                  b"\x89", glob("collections", "OrderedDict") + EMPTY_TUPLE + REDUCE)
            + REDUCE)


def state_dict(**entries: bytes) -> bytes:
    body = b"".join(uni(name) + value for name, value in entries.items())
    return PROTO + EMPTY_DICT + b"(" + body + b"u" + STOP


def write_pt(path, pickle_bytes: bytes, storages=None, *, prefix="archive", compress=False, extra=None):
    """A zip laid out as torch.save lays it out, from hand-made parts."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED if compress else zipfile.ZIP_STORED) as z:
        z.writestr(f"{prefix}/data.pkl", pickle_bytes)
        z.writestr(f"{prefix}/byteorder", "little")
        for key, data in (storages or {}).items():
            z.writestr(f"{prefix}/data/{key}", data)
        for name, data in (extra or {}).items():
            z.writestr(name, data)
        z.writestr(f"{prefix}/version", "3\n")
    return path


def floats(*values) -> bytes:
    return np.array(values, np.float32).tobytes()


def read_all(path) -> dict:
    with aprfast.open(path) as f:
        return {k: f.get_tensor(k, copy=True) for k in f.keys()}


# --- hand-made files: the reader works without torch ----------------------------------
def test_hand_made_state_dict_reads(tmp_path):
    pkl = state_dict(w=tensor("0", 6, (2, 3), (3, 1)), t=tensor("0", 6, (3, 2), (1, 3)),
                     row=tensor("0", 6, (3,), (1,), offset=3))
    path = write_pt(tmp_path / "m.pt", pkl, {"0": floats(0, 1, 2, 3, 4, 5)})
    assert detect(path) == "pytorch"
    aprfast.convert(path, tmp_path / "m.apr")
    got = read_all(tmp_path / "m.apr")
    base = np.arange(6, dtype=np.float32)
    np.testing.assert_array_equal(got["w"], base.reshape(2, 3))
    np.testing.assert_array_equal(got["t"], base.reshape(2, 3).T)  # a strided view, made contiguous
    np.testing.assert_array_equal(got["row"], base[3:])


def test_the_importer_never_imports_torch_or_uses_pickle(tmp_path, run_child):
    path = write_pt(tmp_path / "m.pt", state_dict(w=tensor("0", 2, (2,), (1,))), {"0": floats(1, 2)})
    result = run_child(
        "import sys, pickle\n"
        "def refuse(*a, **k): raise AssertionError('pickle was called')\n"
        "pickle.load = pickle.loads = refuse\n"
        "pickle.Unpickler = refuse\n"
        "import aprfast\n"
        "aprfast.convert(sys.argv[1], sys.argv[2])\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
        "print(aprfast.load_file(sys.argv[2])['w'].tolist())\n", path, tmp_path / "m.apr")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[1.0, 2.0]"


# --- malicious pickles: refused, nothing runs -------------------------------------------
def os_system(marker) -> bytes:
    return glob("os", "system") + tup(uni(f"touch {marker}")) + REDUCE


MALICIOUS = {
    "os.system at the top": lambda m: PROTO + os_system(m) + STOP,
    "os.system as a value": lambda m: state_dict(w=os_system(m)),
    "posix.system": lambda m: PROTO + glob("posix", "system") + tup(uni(f"touch {m}")) + REDUCE + STOP,
    "builtins.eval": lambda m: PROTO + glob("builtins", "eval")
    + tup(uni(f"__import__('os').system('touch {m}')")) + REDUCE + STOP,
    "builtins.exec": lambda m: PROTO + glob("builtins", "exec")
    + tup(uni(f"import os; os.system('touch {m}')")) + REDUCE + STOP,
    "subprocess.Popen by STACK_GLOBAL": lambda m: b"\x80\x04" + b"\x8c\x0asubprocess\x8c\x05Popen\x93"
    + tup(b"]" + b"(" + uni("touch") + uni(str(m)) + b"e") + REDUCE + STOP,
    "nested in a tensor rebuild": lambda m: state_dict(
        w=glob("torch._utils", "_rebuild_tensor_v2") + tup(storage_pid("0", 2), os_system(m), tup(long1(2)),
                                                          tup(long1(1)), b"\x89", EMPTY_DICT) + REDUCE),
    "inside a persistent id": lambda m: state_dict(
        w=tup(uni("storage"), os_system(m), uni("0"), uni("cpu"), long1(2)) + b"Q"),
    "a storage type that is a function": lambda m: state_dict(
        w=tup(uni("storage"), glob("os", "system"), uni("0"), uni("cpu"), long1(2)) + b"Q"),
    "a dtype as the storage type": lambda m: state_dict(
        w=tup(uni("storage"), glob("torch", "float32"), uni("0"), uni("cpu"), long1(2)) + b"Q"),
    "a callable as the storage type": lambda m: state_dict(
        w=tup(uni("storage"), glob("collections", "OrderedDict"), uni("0"), uni("cpu"), long1(2)) + b"Q"),
    "getattr chain": lambda m: PROTO + glob("builtins", "getattr")
    + tup(glob("os", "path"), uni("exists")) + REDUCE + STOP,
    "torch.load itself": lambda m: PROTO + glob("torch", "load") + tup(uni(str(m))) + REDUCE + STOP,
    "a pickled nn.Module": lambda m: PROTO + glob("torch.nn.modules.linear", "Linear") + EMPTY_TUPLE
    + b"\x81" + STOP,
    "INST opcode": lambda m: PROTO + b"(" + uni(f"touch {m}") + b"ios\nsystem\n" + STOP,
    "OBJ opcode": lambda m: PROTO + b"(" + glob("os", "system") + uni(f"touch {m}") + b"o" + STOP,
    "EXT1 code": lambda m: PROTO + b"\x82\x01" + tup(uni(f"touch {m}")) + REDUCE + STOP,
    "EXT2 code": lambda m: PROTO + b"\x83\x01\x00" + STOP,
    "EXT4 code": lambda m: PROTO + b"\x84\x01\x00\x00\x00" + STOP,
    "text persistent id": lambda m: PROTO + b"P" + str(m).encode() + b"\n" + STOP,
    "out-of-band buffer": lambda m: b"\x80\x05\x97" + STOP,
    "REDUCE on a string": lambda m: PROTO + uni("os.system") + tup(uni(f"touch {m}")) + REDUCE + STOP,
    "BUILD on a tensor": lambda m: state_dict(w=tensor("0", 2, (2,), (1,)) + EMPTY_DICT + uni("__setstate__")
                                              + uni(f"touch {m}") + b"s" + b"b"),
    "NEWOBJ on a dtype marker": lambda m: PROTO + glob("torch", "float32") + EMPTY_TUPLE + b"\x81" + STOP,
    "numpy.dtype of an object type": lambda m: PROTO + glob("numpy", "dtype") + tup(uni("O8"), b"\x89", b"\x88")
    + REDUCE + STOP,
    "a bad _codecs.encode": lambda m: PROTO + glob("_codecs", "encode") + tup(uni("x"), uni("rot13"))
    + REDUCE + STOP,
}


@pytest.mark.parametrize("case", sorted(MALICIOUS))
def test_malicious_pickle_is_refused_and_runs_nothing(tmp_path, case):
    marker = tmp_path / "pwned"
    path = write_pt(tmp_path / "evil.pt", MALICIOUS[case](marker), {"0": floats(1, 2)})
    with pytest.raises(PickleRefusedError, match="not on the allowlist|not accepted|not an allowed|BUILD on|"
                                                "storage class|_codecs|numeric scalar"):
        aprfast.convert(path, tmp_path / "out.apr")
    assert not marker.exists()
    assert not (tmp_path / "out.apr").exists()


@pytest.mark.parametrize("module, name", [("os", "system"), ("builtins", "eval"), ("subprocess", "Popen"),
                                          ("torch.nn.modules.linear", "Linear")])
def test_refusal_names_the_global(tmp_path, module, name):
    path = write_pt(tmp_path / "evil.pt", PROTO + glob(module, name) + EMPTY_TUPLE + REDUCE + STOP)
    with pytest.raises(PickleRefusedError, match=rf"{module}\.{name}.*not on the allowlist") as info:
        open_source(path)
    assert info.value.code == "E001" and info.value.path == str(path)


# --- hostile structure ---------------------------------------------------------------------
def test_huge_memo_indices_cost_nothing_and_missing_ones_are_refused(tmp_path):
    pkl = PROTO + EMPTY_DICT + b"r\xff\xff\xff\xff" + b"j\xfe\xff\xff\xff" + STOP
    path = write_pt(tmp_path / "m.pt", pkl)
    with pytest.raises(CorruptError, match="memo entry 4294967294"):
        open_source(path)


def test_deep_mark_nesting_is_bounded(tmp_path):
    path = write_pt(tmp_path / "m.pt", PROTO + b"(" * (MAX_MARK_DEPTH + 5) + STOP)
    with pytest.raises(LimitError, match="MARKs nest deeper"):
        open_source(path)


def test_deeply_nested_containers_do_not_crash(tmp_path):
    depth = 200_000
    nested = PROTO + b"]" * depth + b"a" * (depth - 1) + STOP  # a list in a list in ... (no recursion)
    with pytest.raises(FormatError, match="not a dict of tensors"):
        open_source(write_pt(tmp_path / "lists.pt", nested))
    dicts = PROTO + b"".join(EMPTY_DICT + uni("k") for _ in range(depth)) + EMPTY_DICT + b"s" * depth + STOP
    with pytest.raises(FormatError, match="no state dict"):
        open_source(write_pt(tmp_path / "dicts.pt", dicts))


def test_nested_tuple_keys_are_refused_before_hashing(tmp_path):
    key = EMPTY_TUPLE + b"\x85" * 100_000  # ((((...)))) hashes recursively in C
    path = write_pt(tmp_path / "m.pt", PROTO + EMPTY_DICT + key + i1(1) + b"s" + STOP)
    with pytest.raises(CorruptError, match="dict key is a tuple"):
        open_source(path)


def test_every_truncation_is_a_typed_error(tmp_path):
    pkl = state_dict(w=tensor("0", 6, (2, 3), (3, 1)), b=tensor("0", 6, (3,), (1,), offset=3))
    for cut in range(len(pkl)):
        path = write_pt(tmp_path / f"t{cut}.pt", pkl[:cut], {"0": floats(*range(6))})
        with pytest.raises(AprError):
            open_source(path)
        os.remove(path)


VALID = state_dict(w=tensor("0", 6, (2, 3), (3, 1)), t=tensor("0", 6, (3, 2), (1, 3)),
                   h=tensor("1", 4, (2, 2), (2, 1), storage="HalfStorage"))


@settings(max_examples=200)
@given(st.lists(st.tuples(st.integers(0, len(VALID) - 1), st.integers(0, 255)), min_size=1, max_size=4))
def test_mutated_pickles_give_a_result_or_a_typed_error(edits):
    """Any byte changes to a valid data.pkl: a state dict or an AprError, nothing else
    (the fuzz target tests/fuzz/fuzz_pytorch.py does the same at scale)."""
    pkl = bytearray(VALID)
    for at, byte in edits:
        pkl[at] = byte
    with tempfile.TemporaryDirectory() as tmp:
        path = write_pt(os.path.join(tmp, "m.pt"), bytes(pkl), {"0": floats(*range(6)), "1": b"\1" * 8})
        try:
            src = open_source(path)
        except AprError:
            return
        try:
            for spec in src.specs:
                value = src.read(spec)
                np.asarray(value.data if isinstance(value, aprfast.RawTensor) else value).tobytes()
        except AprError:
            pass
        finally:
            src.close()


def _valid_zip() -> bytes:
    with tempfile.TemporaryDirectory() as tmp:
        path = write_pt(os.path.join(tmp, "m.pt"), VALID, {"0": floats(*range(6)), "1": b"\1" * 8})
        with open(path, "rb") as f:
            return f.read()


VALID_ZIP = _valid_zip()


@settings(max_examples=200)
@given(st.lists(st.tuples(st.integers(0, len(VALID_ZIP) - 1), st.integers(0, 255)), min_size=1, max_size=4),
       st.integers(0, len(VALID_ZIP)))
def test_mutated_archives_give_a_result_or_a_typed_error(edits, cut):
    """Byte changes anywhere in the zip (headers, central directory, data) and a cut:
    detection, opening and reading give data or an AprError, nothing else."""
    blob = bytearray(VALID_ZIP[:max(cut, 4)])
    for at, byte in edits:
        if at < len(blob):
            blob[at] = byte
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "m.pt")
        with open(path, "wb") as f:
            f.write(blob)
        try:
            detect(path)
            src = open_source(path)
        except AprError:
            return
        try:
            for spec in src.specs:
                value = src.read(spec)
                np.asarray(value.data if isinstance(value, aprfast.RawTensor) else value).tobytes()
        except AprError:
            pass
        finally:
            src.close()


@pytest.mark.parametrize("opcode, length", [(b"X", 1 << 31), (b"B", 1 << 31), (b"\x8d", 1 << 62),
                                            (b"\x8e", 1 << 62), (b"T", 1 << 30), (b"\x8b", 1 << 30)])
def test_lengths_beyond_the_bytes_present_are_refused(tmp_path, opcode, length):
    fmt = "<Q" if opcode in (b"\x8d", b"\x8e") else "<i" if opcode in (b"T", b"\x8b") else "<I"
    path = write_pt(tmp_path / "m.pt", PROTO + opcode + struct.pack(fmt, length) + b"abc" + STOP)
    with pytest.raises(CorruptError, match="more bytes"):
        open_source(path)


def test_protocol_2_bytes_with_a_wide_character(tmp_path):
    path = write_pt(tmp_path / "m.pt", PROTO + glob("_codecs", "encode") + tup(uni("ab\u01a0"), uni("latin1"))
                    + REDUCE + STOP)
    with pytest.raises(CorruptError, match="above U\\+00FF"):
        open_source(path)


def test_missing_storage_record(tmp_path):
    path = write_pt(tmp_path / "m.pt", state_dict(w=tensor("7", 2, (2,), (1,))), {"0": floats(1, 2)})
    with pytest.raises(CorruptError, match="storage '7' has no record"):
        open_source(path)


def test_storage_shorter_than_declared(tmp_path):
    path = write_pt(tmp_path / "m.pt", state_dict(w=tensor("0", 4, (4,), (1,))), {"0": floats(1, 2)})
    with pytest.raises(CorruptError, match=r"declares 4 elements \(16 bytes\) but its record holds 8"):
        open_source(path)


@pytest.mark.parametrize("size, stride, offset, match", [
    ((3,), (1,), 0, "reaches byte 12 of storage '0', which holds 8"),
    ((2,), (1,), 1, "reaches byte 12"),
    ((2,), (1,), (1 << 62) - 1, "reaches byte"),
    ((1 << 40,), (1,), 0, "reaches byte"),
    ((2, 2), (2, 1), 0, "reaches byte 16"),
])
def test_views_past_their_storage(tmp_path, size, stride, offset, match):
    path = write_pt(tmp_path / "m.pt", state_dict(w=tensor("0", 2, size, stride, offset)), {"0": floats(1, 2)})
    with pytest.raises(CorruptError, match=match):
        open_source(path)


@pytest.mark.parametrize("size, stride, offset", [((2,), (1,), 1 << 62), ((-1,), (1,), 0), ((2,), (-1,), 0)])
def test_out_of_range_ints_are_refused(tmp_path, size, stride, offset):
    path = write_pt(tmp_path / "m.pt", state_dict(w=tensor("0", 2, size, stride, offset)), {"0": floats(1, 2)})
    with pytest.raises(CorruptError, match="not a"):
        open_source(path)


def test_stride_zero_expansion_is_bounded(tmp_path):
    path = write_pt(tmp_path / "m.pt", state_dict(w=tensor("0", 1, (1 << 40,), (0,))), {"0": floats(1)})
    with pytest.raises(LimitError, match="stride-0"):
        open_source(path)


def test_a_flipped_storage_byte_fails_the_zip_crc(tmp_path):
    data = floats(1.5, 2.5, 3.5)
    path = write_pt(tmp_path / "m.pt", state_dict(w=tensor("0", 3, (3,), (1,))), {"0": data})
    raw = bytearray(path.read_bytes())
    at = raw.index(data)
    raw[at + 5] ^= 0x01
    path.write_bytes(bytes(raw))
    with pytest.raises(ChecksumError, match="data/0 does not match its zip CRC-32"):
        aprfast.convert(path, tmp_path / "m.apr")
    assert not (tmp_path / "m.apr").exists()


def test_compressed_storage_records_are_refused(tmp_path):
    path = write_pt(tmp_path / "m.pt", state_dict(w=tensor("0", 2, (2,), (1,))), {"0": floats(1, 2)},
                    compress=True)
    with pytest.raises(FormatError, match="compressed"):
        open_source(path)


def test_unknown_dtypes_are_refused_by_name(tmp_path):
    pkl = state_dict(w=glob("torch._utils", "_rebuild_tensor_v3")
                     + tup(storage_pid("0", 4, "UntypedStorage"), long1(0), tup(long1(1)), tup(long1(1)), b"\x89",
                           EMPTY_DICT, glob("torch", "complex32")) + REDUCE)
    path = write_pt(tmp_path / "m.pt", pkl, {"0": b"\0" * 4})
    with pytest.raises(UnknownDTypeError, match="complex32"):
        open_source(path)


def test_quantized_storages_are_refused_by_name(tmp_path):
    path = write_pt(tmp_path / "m.pt", state_dict(w=tensor("0", 2, (2,), (1,), storage="QInt8Storage")),
                    {"0": b"\0\0"})
    with pytest.raises(PickleRefusedError, match="torch.QInt8Storage"):
        open_source(path)


def test_not_a_torch_zip_is_not_detected_as_one(tmp_path):
    path = tmp_path / "other.zip"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("readme.txt", "hello")
    with pytest.raises(FormatError, match="unrecognised source format"):
        detect(path)


def test_torchscript_archives_are_named(tmp_path):
    path = write_pt(tmp_path / "m.pt", state_dict(), extra={"archive/constants.pkl": PROTO + b")."})
    with pytest.raises(FormatError, match="TorchScript"):
        open_source(path)


def test_duplicate_zip_records_are_refused(tmp_path):
    path = write_pt(tmp_path / "m.pt", state_dict(w=tensor("0", 2, (2,), (1,))), {"0": floats(1, 2)})
    with zipfile.ZipFile(path, "a") as z, pytest.warns(UserWarning, match="Duplicate name"):
        z.writestr("archive/data/0", floats(9, 9))
    with pytest.raises(CorruptError, match="appears twice"):
        open_source(path)


def test_encrypted_zip_records_are_refused(tmp_path):
    path = write_pt(tmp_path / "m.pt", state_dict())
    raw = bytearray(path.read_bytes())
    central = raw.index(b"PK\x01\x02")  # the first record's central directory entry: data.pkl
    raw[central + 8] |= 0x1  # general purpose flag bit 0, "encrypted": zipfile would want a password
    path.write_bytes(bytes(raw))
    with pytest.raises(FormatError, match="'archive/data.pkl' is encrypted"):
        open_source(path)


def test_big_endian_checkpoints_are_refused(tmp_path):
    path = tmp_path / "m.pt"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("archive/data.pkl", state_dict())
        z.writestr("archive/byteorder", "big")
    with pytest.raises(VersionError, match="little-endian"):
        open_source(path)


def test_legacy_magic_is_refused_clearly(tmp_path):
    path = tmp_path / "old.pt"
    path.write_bytes(cpt.LEGACY_MAGIC + b".")
    assert detect(path) == "pytorch"
    with pytest.raises(VersionError, match="torch < 1.6"):
        open_source(path)


# --- files written by torch.save -----------------------------------------------------------
TORCH_DTYPES = ["float32", "float64", "float16", "bfloat16", "int8", "int16", "int32", "int64", "uint8", "uint16",
                "uint32", "uint64", "bool", "complex64", "complex128", "float8_e4m3fn", "float8_e5m2",
                "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu", "float4_e2m1fn_x2"]
SHAPES = [(), (0,), (5,), (3, 4), (2, 0, 3), (2, 3, 4)]


def torch_bytes(t) -> bytes:
    """The little-endian bytes of a tensor's values in C order."""
    flat = t.detach().contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy().tobytes() if flat.element_size() else b""


def random_tensor(dtype_name: str, shape, gen):
    dtype = getattr(torch, dtype_name)
    if dtype_name == "bool":
        return torch.randint(0, 2, shape, generator=gen).bool()
    if dtype_name == "float4_e2m1fn_x2" or dtype_name.startswith("float8") or dtype_name.startswith("uint"):
        raw = torch.randint(0, 256, tuple(shape) + (torch.empty((), dtype=dtype).element_size(),),
                            generator=gen, dtype=torch.uint8)
        return raw.view(dtype).reshape(shape)
    if dtype.is_complex:
        return torch.randn(shape, dtype=dtype, generator=gen)
    if dtype.is_floating_point:
        return (torch.randn(shape, generator=gen) * 100).to(dtype)
    return torch.randint(-100, 100, shape, generator=gen).to(dtype)


def expected_shape(dtype_name: str, shape):
    if dtype_name == "float4_e2m1fn_x2":
        return tuple(shape[:-1]) + (shape[-1] * 2,) if shape else (2,)
    return tuple(shape)


def assert_same(path, tensors: dict) -> None:
    with aprfast.open(path) as f:
        assert sorted(f.keys()) == sorted(tensors)
        for name, t in tensors.items():
            got = f.get_tensor(name)
            raw = got.data if isinstance(got, aprfast.RawTensor) else np.ascontiguousarray(got)
            assert np.asarray(raw).tobytes() == torch_bytes(t), name


@needs_torch
@pytest.mark.parametrize("dtype_name", TORCH_DTYPES)
def test_every_dtype_and_shape_round_trips_bit_for_bit(tmp_path, dtype_name):
    gen = torch.Generator().manual_seed(7)
    tensors = {f"t{i}": random_tensor(dtype_name, shape, gen) for i, shape in enumerate(SHAPES)}
    torch.save(tensors, tmp_path / "m.pt")
    # random float8 bit patterns hold NaN: what is tested is the bytes, not the values
    result = aprfast.convert(tmp_path / "m.pt", tmp_path / "m.apr", validate="off")
    assert result["source_format"] == "pytorch" and result["tensors"] == len(SHAPES)
    assert_same(tmp_path / "m.apr", tensors)
    with aprfast.open(tmp_path / "m.apr") as f:
        for i, shape in enumerate(SHAPES):
            assert tuple(f.info(f"t{i}").shape) == expected_shape(dtype_name, shape)


@needs_torch
@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_every_pickle_protocol_torch_writes(tmp_path, protocol):
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.LayerNorm(3), torch.nn.BatchNorm1d(3))
    torch.save(model.state_dict(), tmp_path / "m.pt", pickle_protocol=protocol)
    aprfast.convert(tmp_path / "m.pt", tmp_path / "m.apr")
    assert_same(tmp_path / "m.apr", model.state_dict())


@needs_torch
def test_non_contiguous_views_are_made_contiguous(tmp_path):
    base = torch.arange(60, dtype=torch.float32).reshape(3, 4, 5)
    views = {"transposed": base.transpose(0, 2), "stepped": base[:, ::2, 1::2], "row": base[1], "column": base[:, 2],
             "expanded": torch.arange(3.0).reshape(3, 1).expand(3, 4),
             "permuted_bf16": base.bfloat16().permute(2, 0, 1),
             "narrow_i16": torch.arange(40, dtype=torch.int16).reshape(4, 10)[:, 3:7]}
    torch.save(views, tmp_path / "m.pt")
    aprfast.convert(tmp_path / "m.pt", tmp_path / "m.apr")
    assert_same(tmp_path / "m.apr", views)


@needs_torch
def test_tied_weights_are_stored_once(tmp_path):
    embed = torch.nn.Embedding(50, 16)
    head = torch.nn.Linear(16, 50, bias=False)
    head.weight = embed.weight  # tied, as language models tie them
    model = torch.nn.ModuleDict({"embed": embed, "head": head})
    torch.save(model.state_dict(), tmp_path / "m.pt")
    src = open_source(tmp_path / "m.pt")
    assert src.aliases == {"head.weight": "embed.weight"}
    src.close()
    aprfast.convert(tmp_path / "m.pt", tmp_path / "m.apr")
    assert_same(tmp_path / "m.apr", model.state_dict())
    with aprfast.open(tmp_path / "m.apr") as f:
        a, b = f.info("embed.weight"), f.info("head.weight")
        assert (a.offset, a.nbytes) == (b.offset, b.nbytes)
    assert os.path.getsize(tmp_path / "m.apr") < 50 * 16 * 4 * 2


@needs_torch
def test_tied_weights_stay_shared_through_precision(tmp_path):
    weight = torch.randn(8, 32)
    torch.save({"a": weight, "b": weight, "c": torch.randn(4)}, tmp_path / "m.pt")
    aprfast.convert(tmp_path / "m.pt", tmp_path / "m.apr", precision="f16")
    with aprfast.open(tmp_path / "m.apr") as f:
        assert f.info("a").offset == f.info("b").offset
        assert f.info("a").dtype.name == "F16"
        np.testing.assert_array_equal(f.get_tensor("b"), weight.half().numpy())


@needs_torch
def test_views_of_one_storage_that_differ_are_not_aliases(tmp_path):
    base = torch.arange(12.0)
    torch.save({"a": base[:6], "b": base[6:], "c": base.reshape(3, 4)}, tmp_path / "m.pt")
    src = open_source(tmp_path / "m.pt")
    assert src.aliases == {}
    src.close()
    aprfast.convert(tmp_path / "m.pt", tmp_path / "m.apr")
    assert_same(tmp_path / "m.apr", {"a": base[:6], "b": base[6:], "c": base.reshape(3, 4)})


@needs_torch
def test_full_checkpoint_finds_the_state_dict_and_keeps_simple_values(tmp_path):
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    checkpoint = {"state_dict": model.state_dict(), "epoch": 3, "best_loss": 0.25, "arch": "linear",
                  "lr": float("nan"), "sizes": [1, 2], "optimizer": optimizer.state_dict()}
    torch.save(checkpoint, tmp_path / "ckpt.pth")
    aprfast.convert(tmp_path / "ckpt.pth", tmp_path / "m.apr")
    assert_same(tmp_path / "m.apr", model.state_dict())
    with aprfast.open(tmp_path / "m.apr") as f:
        meta = f.metadata
    assert meta["epoch"] == 3 and meta["best_loss"] == 0.25 and meta["arch"] == "linear"
    assert meta["lr"] == "nan" and meta["sizes"] == [1, 2]
    assert meta["pytorch.dropped"] == ["optimizer"]


@needs_torch
def test_numpy_scalars_in_a_checkpoint_become_numbers(tmp_path):
    model = torch.nn.Linear(2, 2)
    torch.save({"model": model.state_dict(), "best_acc": np.float64(0.875), "step": np.int64(-12),
                "flag": np.bool_(True), "half": np.float16(1.5)}, tmp_path / "m.pt")
    aprfast.convert(tmp_path / "m.pt", tmp_path / "m.apr")
    with aprfast.open(tmp_path / "m.apr") as f:
        meta = f.metadata
    assert (meta["best_acc"], meta["step"], meta["flag"], meta["half"]) == (0.875, -12, True, 1.5)


@needs_torch
def test_numpy_arrays_in_a_checkpoint_are_refused_by_name(tmp_path):
    torch.save({"model": torch.nn.Linear(2, 2).state_dict(), "history": np.zeros(3)}, tmp_path / "m.pt")
    with pytest.raises(PickleRefusedError, match=r"numpy\.(_core|core)\.multiarray\._reconstruct"):
        aprfast.convert(tmp_path / "m.pt", tmp_path / "m.apr")


@needs_torch
@pytest.mark.parametrize("key", ["model", "module", "model_state_dict"])
def test_other_state_dict_keys(tmp_path, key):
    model = torch.nn.Linear(2, 2)
    torch.save({key: model.state_dict(), "step": 10}, tmp_path / "m.pt")
    aprfast.convert(tmp_path / "m.pt", tmp_path / "m.apr")
    assert_same(tmp_path / "m.apr", model.state_dict())


@needs_torch
def test_nested_dicts_are_flattened_with_dots(tmp_path):
    tensors = {"encoder": {"w": torch.ones(2), "layers": {0: torch.zeros(3)}}, "head": torch.full((2,), 5.0)}
    torch.save(tensors, tmp_path / "m.pt")
    aprfast.convert(tmp_path / "m.pt", tmp_path / "m.apr")
    assert_same(tmp_path / "m.apr", {"encoder.w": torch.ones(2), "encoder.layers.0": torch.zeros(3),
                                     "head": torch.full((2,), 5.0)})


@needs_torch
def test_strip_prefix(tmp_path):
    model = torch.nn.DataParallel(torch.nn.Linear(2, 3))
    torch.save(model.state_dict(), tmp_path / "m.pt")
    assert set(model.state_dict()) == {"module.weight", "module.bias"}
    aprfast.convert(tmp_path / "m.pt", tmp_path / "m.apr", strip_prefix="module.")
    assert_same(tmp_path / "m.apr", {"weight": model.module.weight, "bias": model.module.bias})


@needs_torch
def test_parameters_and_hf_style_bin(tmp_path):
    tensors = {"p": torch.nn.Parameter(torch.randn(3, 3)), "buffer": torch.arange(4)}
    torch.save(tensors, tmp_path / "pytorch_model.bin")
    aprfast.convert(tmp_path / "pytorch_model.bin", tmp_path / "m.apr")
    assert_same(tmp_path / "m.apr", tensors)


@needs_torch
def test_legacy_serialization_is_refused_clearly(tmp_path):
    torch.save({"w": torch.ones(2)}, tmp_path / "old.pt", _use_new_zipfile_serialization=False)
    with pytest.raises(VersionError, match="torch < 1.6"):
        aprfast.convert(tmp_path / "old.pt", tmp_path / "m.apr")
    assert not (tmp_path / "m.apr").exists()


@needs_torch
def test_whole_module_pickles_are_refused(tmp_path):
    marker = tmp_path / "ran"
    torch.save(torch.nn.Linear(2, 2), tmp_path / "model.pt")
    with pytest.raises(PickleRefusedError, match="torch.nn.modules.linear.Linear"):
        aprfast.convert(tmp_path / "model.pt", tmp_path / "m.apr")
    assert not marker.exists()


@needs_torch
@pytest.mark.parametrize("destination", ["m.safetensors", "m.gguf"])
def test_pytorch_to_other_formats(tmp_path, destination):
    tensors = {"w": torch.randn(4, 8), "t": torch.randn(8, 4).t(), "i": torch.arange(5, dtype=torch.int32)}
    torch.save(tensors, tmp_path / "m.pt")
    aprfast.convert(tmp_path / "m.pt", tmp_path / destination)
    aprfast.convert(tmp_path / destination, tmp_path / "back.apr")
    assert_same(tmp_path / "back.apr", tensors)


@needs_torch
def test_source_reads_are_views_of_the_map(tmp_path):
    torch.save({"w": torch.randn(64, 64)}, tmp_path / "m.pt")
    src = open_source(tmp_path / "m.pt")
    try:
        value = src.read(src.specs[0])
        assert not value.flags.owndata and not value.flags.writeable
        assert src.raw_range(src.specs[0]) is not None
        del value
    finally:
        src.close()


def test_fuzz_target_seeds_pass_the_target(tmp_path):
    """tests/fuzz/fuzz_pytorch.py's seeds are valid inputs of its target (so a fuzz run
    starts from files that reach the tensors, not from refusals)."""
    import importlib.util

    fuzz_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fuzz")
    spec = importlib.util.spec_from_file_location("aprfast_fuzz_pytorch", os.path.join(fuzz_dir, "fuzz_pytorch.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.write_seeds(str(tmp_path)) == 6
    for seed in sorted(tmp_path.iterdir()):
        module.target_pytorch(seed.read_bytes())  # no exception: every seed converts


# --- transformers checkpoint directories ------------------------------------------------------
def write_sharded(directory, shards: dict, weight_map=None):
    """Shards written by torch.save plus a pytorch_model.bin.index.json as transformers writes it."""
    directory.mkdir(exist_ok=True)
    names = {}
    for _i, (shard, tensors) in enumerate(shards.items()):
        torch.save(tensors, directory / shard)
        names.update({name: shard for name in tensors})
    index = {"metadata": {"total_size": 0}, "weight_map": weight_map or names}
    (directory / cpt.INDEX_NAME).write_text(json.dumps(index, indent=2))
    return directory / cpt.INDEX_NAME


@needs_torch
@pytest.mark.parametrize("given", ["directory", "index"])
def test_sharded_bin_checkpoint_converts_as_one(tmp_path, given):
    first = {"embed.weight": torch.randn(10, 4), "layers.0.w": torch.randn(4, 4)}
    second = {"layers.1.w": torch.randn(4, 4).t(), "head.bias": torch.zeros(10)}
    index = write_sharded(tmp_path / "ckpt", {"pytorch_model-00001-of-00002.bin": first,
                                              "pytorch_model-00002-of-00002.bin": second})
    source = tmp_path / "ckpt" if given == "directory" else index
    assert detect(source) == "pytorch"
    aprfast.convert(source, tmp_path / "m.apr")
    assert_same(tmp_path / "m.apr", {**first, **second})


@needs_torch
def test_a_directory_with_pytorch_model_bin(tmp_path):
    (tmp_path / "ckpt").mkdir()
    tensors = {"w": torch.randn(3, 3)}
    torch.save(tensors, tmp_path / "ckpt" / cpt.WEIGHTS_NAME)
    assert detect(tmp_path / "ckpt") == "pytorch"
    aprfast.convert(tmp_path / "ckpt", tmp_path / "m.apr")
    assert_same(tmp_path / "m.apr", tensors)


@needs_torch
@pytest.mark.parametrize("weight_map, match", [
    ({"a": "shard1.bin", "b": "shard1.bin", "c": "shard2.bin"}, "shard 'shard2.bin' listed in the index is missing"),
    ({"a": "shard1.bin", "b": "shard1.bin", "c": "shard1.bin"}, "1 tensors listed in the index are in no shard"),
    ({"a": "../shard1.bin", "b": "../shard1.bin"}, "not a plain file name"),
])
def test_sharded_bin_index_problems(tmp_path, weight_map, match):
    index = write_sharded(tmp_path / "ckpt", {"shard1.bin": {"a": torch.ones(1), "b": torch.ones(2)}}, weight_map)
    with pytest.raises(CorruptError, match=match):
        cpt.ShardedPyTorchSource(index)


@needs_torch
def test_a_tensor_in_the_wrong_shard(tmp_path):
    index = write_sharded(tmp_path / "ckpt", {"s1.bin": {"a": torch.ones(1)}, "s2.bin": {"b": torch.ones(1)}},
                          {"a": "s2.bin", "b": "s1.bin"})
    with pytest.raises(CorruptError, match="tensor 'a' is in shard 's1.bin', but the index maps it to 's2.bin'"):
        aprfast.convert(index, tmp_path / "m.apr")


def test_many_protocol_0_lines_are_read_one_line_each(tmp_path):
    """A text opcode reads only its own line: a megabyte of tiny ones is quick (a copy
    of the next 64 KiB per line would make it quadratic)."""
    count = 300_000
    pkl = PROTO + b"(" + b"I1\n" * count + b"l" + STOP
    with pytest.raises(FormatError, match="not a dict of tensors"):
        open_source(write_pt(tmp_path / "m.pt", pkl))


@pytest.mark.parametrize("levels, match", [(12, "holds one dict twice"), (40, "no state dict found")])
def test_one_dict_under_many_keys_is_looked_at_once(tmp_path, levels, match):
    """Through the memo, levels of dicts each holding the next one twice are 2**levels
    paths when walked as a tree; each dict is looked at once and a repeat is refused
    (40 levels: the tensor lies deeper than the 16 looked at)."""
    leaf = EMPTY_DICT + uni("w") + tensor("0", 2, (2,), (1,)) + b"s" + b"r" + struct.pack("<I", 0)
    body = leaf
    for level in range(1, levels):
        body = (EMPTY_DICT + uni("a") + body + b"s" + uni("b") + b"j" + struct.pack("<I", level - 1) + b"s"
                + b"r" + struct.pack("<I", level))
    path = write_pt(tmp_path / "m.pt", PROTO + body + STOP, {"0": floats(1, 2)})
    with pytest.raises(AprError, match=match):
        open_source(path)
