"""Review 2026-11 N4: the bounded pickle interpreter bounded the stream (MAX_PICKLE_BYTES),
not what it builds: 16 MiB of EMPTY_LIST (a 16 KB deflated data.pkl) took 1.2 GiB RSS,
EMPTY_SET ran for minutes.  Every opcode now charges the memory it adds to a budget of
max(METADATA_MEMORY_FACTOR x the stream, METADATA_MEMORY_FLOOR), and work that is not
one step per byte (hashing a big tuple key again and again, allowed calls walking a big
memoised argument) to a budget of WORK_FACTOR steps per byte."""

import os
import pickle
import struct
import time
import tracemalloc
import zipfile

import pytest
from test_convert_pytorch import (
    EMPTY_DICT,
    EMPTY_TUPLE,
    PROTO,
    REDUCE,
    STOP,
    floats,
    glob,
    i1,
    long1,
    state_dict,
    tensor,
    tup,
    uni,
    write_pt,
)

import aprfast
from aprfast import limits
from aprfast.convert import _pickle_vm as vm
from aprfast.errors import CorruptError, LimitError

#: CPU-time bounds hold for the normal build; tests/sanitize.sh runs everything about ten times
#: slower (ASan, UBSan, -O1), so there they are scaled, not dropped
CPU = 10 if os.environ.get("APRFAST_SANITIZED") else 1

MARK, APPENDS, SETITEMS, BINGET0, BINPUT0 = b"(", b"e", b"u", b"h\x00", b"q\x00"


@pytest.fixture
def small_floor(monkeypatch):
    """A 1 MiB floor: a 2 MiB stream may then build 8 MiB (4x), so the bound shows
    with inputs that run in a fraction of a second."""
    monkeypatch.setattr(limits, "METADATA_MEMORY_FLOOR", 1 << 20)


def traced_peak(fn):
    tracemalloc.start()
    try:
        try:
            fn()
            outcome = None
        except LimitError as exc:
            outcome = exc
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return outcome, peak


ONE_BYTE_BUILDERS = {
    "EMPTY_LIST": b"]", "EMPTY_SET": b"\x8f", "EMPTY_DICT": b"}", "EMPTY_TUPLE": b")", "NONE": b"N",
    "DUP": b"2", "BININT2": b"M\x00\x10", "BINFLOAT": b"G" + struct.pack(">d", 1.5),
    "TUPLE1 chain": b"\x85", "MEMOIZE": b"\x94", "EMPTY_LIST+MEMOIZE": b"]\x94",
    "LONG_BINPUT spread": None, "SHORT_BINUNICODE": b"\x8c\x03abc",
}


@pytest.mark.slow("long memory-bound measurement")
@pytest.mark.parametrize("case", sorted(ONE_BYTE_BUILDERS))
def test_what_a_stream_builds_is_at_most_4x_its_size(small_floor, case):
    unit = ONE_BYTE_BUILDERS[case]
    if unit is None:  # each LONG_BINPUT a new sparse memo entry: 5 bytes -> a dict entry and an int
        body = b"N" + b"".join(b"r" + struct.pack("<I", 1000 + 7 * i) for i in range(400_000))
    else:
        body = (b"N" if case in ("DUP", "TUPLE1 chain", "MEMOIZE") else b"") + unit * ((2 << 20) // len(unit))
    data = PROTO + body + STOP
    outcome, peak = traced_peak(lambda: vm.unpickle(data, {}))
    assert peak < 4 * len(data) + (1 << 20), f"{case}: peak {peak / 2**20:.1f} MiB for {len(data) / 2**20:.1f} MiB"
    if outcome is not None:
        assert "bytes of objects" in str(outcome)


@pytest.mark.parametrize("name, unit, key", [
    ("a big tuple key again and again", MARK + i1(1) * 200_000 + b"t" + BINPUT0 + b"0" + EMPTY_DICT + MARK,
     BINGET0 + b"N"),
    ("a big tuple set item again and again", MARK + i1(1) * 200_000 + b"t" + BINPUT0 + b"0" + b"\x8f" + MARK,
     BINGET0),
])
def test_hashing_one_big_key_again_and_again_is_charged(name, unit, key):
    data = PROTO + unit + key * 300_000 + (SETITEMS if "dict" in name or "key" in name else b"\x90") + STOP
    t = time.process_time()
    with pytest.raises(LimitError, match="steps per byte"):
        vm.unpickle(data, {})
    assert time.process_time() - t < 5 * CPU, name  # 6e10 hash steps before the fix


def _ordered_dict_again_and_again() -> bytes:
    pairs = b"]" + MARK + b"".join(tup(i1(i % 250), b"N") for i in range(30_000)) + APPENDS + BINPUT0
    call = glob("collections", "OrderedDict") + BINGET0 + b"\x85" + REDUCE + b"0"
    return PROTO + pairs + b"0" + call * 20_000 + EMPTY_DICT + STOP


def _size_again_and_again() -> bytes:
    dims = MARK + i1(1) * 100_000 + b"t" + BINPUT0 + b"0"
    call = glob("torch", "Size") + BINGET0 + b"\x85" + REDUCE + b"0"
    return PROTO + dims + call * 20_000 + EMPTY_DICT + STOP


def _bytes_again_and_again() -> bytes:
    text = uni("x" * 1_000_000) + BINPUT0 + b"0"
    call = glob("_codecs", "encode") + BINGET0 + uni("latin1") + b"\x86" + REDUCE
    return PROTO + text + call * 2_000 + EMPTY_DICT + STOP


@pytest.mark.slow("long memory-bound measurement")
@pytest.mark.parametrize("make", [_ordered_dict_again_and_again, _size_again_and_again, _bytes_again_and_again],
                         ids=["OrderedDict of a memoised list", "torch.Size of a memoised tuple",
                              "_codecs.encode of a memoised str"])
def test_allowed_calls_on_one_big_memoised_argument_are_charged(tmp_path, make):
    path = write_pt(tmp_path / "m.pt", make())
    t = time.process_time()
    outcome, peak = traced_peak(lambda: aprfast.convert(path, tmp_path / "o.apr"))
    assert isinstance(outcome, LimitError), outcome
    assert time.process_time() - t < 10 * CPU
    assert peak < 4 * os.path.getsize(path) + (80 << 20)


def test_a_sparse_memo_reads_as_pickle_reads_it():
    """Indices out of order (a dict), in order (a list), MEMOIZE after both, overwrites."""
    data = (PROTO + b"]" + b"r" + struct.pack("<I", 5)  # memo[5] = A (sparse)
            + b"0" + b"K\x07" + b"\x94"              # memo[1] = 7 (MEMOIZE: the memo holds one entry)
            + b"0" + b"K\x08" + BINPUT0              # memo[0] = 8
            + b"0" + b"K\x09" + b"q\x01"             # memo[1] = 9 (overwrite)
            + b"0" + b"K\x0a" + b"\x94"              # memo[3] = 10 (three entries: 0, 1, 5)
            + b"0" + MARK + b"h\x05" + BINGET0 + b"h\x01" + b"h\x03" + b"l" + STOP)
    assert vm.unpickle(data, {}) == pickle.loads(data) == [[], 8, 9, 10]
    with pytest.raises(CorruptError, match="never stored"):
        vm.unpickle(PROTO + b"K\x01" + b"r" + struct.pack("<I", 9) + b"h\x03" + STOP, {})


@pytest.mark.peak_memory
@pytest.mark.parametrize("opcode", ["5d", "8f"], ids=["EMPTY_LIST", "EMPTY_SET"])
def test_the_reviewers_deflated_bomb(tmp_path, run_child, opcode):
    """16 MiB of one opcode deflated to a 16 KB .pt: 1189 MiB and 6 s (EMPTY_LIST), minutes
    (EMPTY_SET) before the fix; now the budget (64 MiB of objects) stops it."""
    path = tmp_path / "bomb.pt"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("archive/data.pkl", PROTO + bytes.fromhex(opcode) * (16 << 20) + STOP)
        z.writestr("archive/byteorder", "little")
        z.writestr("archive/version", "3\n")
    script = """
import resource, sys, time, aprfast
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t = time.process_time()
try:
    aprfast.convert(sys.argv[1], sys.argv[2])
    print("converted")
except aprfast.LimitError:
    print("LimitError")
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024, time.process_time() - t)
"""
    done = run_child(script, path, tmp_path / "o.apr")
    assert done.returncode == 0, done.stderr
    outcome, numbers = done.stdout.split("\n", 1)
    grown, cpu = numbers.split()
    assert outcome == "LimitError"
    # the budget's 64 MiB floor, the 16 MiB stream and its copy in the zip reader
    assert int(grown) < 128, f"peak RSS grew {grown} MiB"
    assert float(cpu) < 4


# --- what the checkpoint reader builds from the pickle's result ---------------------------
def test_a_huge_int_where_an_int_is_checked_is_a_typed_error(tmp_path):
    huge = b"\x8b" + struct.pack("<i", 2000) + b"\x01" * 2000  # 4800 decimal digits: repr() refuses it
    pkl = (PROTO + EMPTY_DICT + MARK + uni("w") + glob("torch._utils", "_rebuild_tensor_v2")
           + tup(tensor("0", 2, (2,), (1,))[len(glob("torch._utils", "_rebuild_tensor_v2")) + 1:].split(b"Q", 1)[0]
                 + b"Q", huge, tup(long1(2)), tup(long1(1)), b"\x89",
                 glob("collections", "OrderedDict") + EMPTY_TUPLE + REDUCE)
           + REDUCE + SETITEMS + STOP)
    path = write_pt(tmp_path / "m.pt", pkl, {"0": floats(1, 2)})
    with pytest.raises(CorruptError, match="an int of 15993 bits"):
        aprfast.convert(path, tmp_path / "o.apr")


def test_one_list_under_many_top_level_keys_is_refused(tmp_path):
    shared = b"]" + MARK + i1(1) * 4096 + APPENDS + BINPUT0 + b"0"
    keys = b"".join(uni(f"k{i}") + BINGET0 for i in range(20_000))
    pkl = (PROTO + shared + EMPTY_DICT + MARK + uni("state_dict") + EMPTY_DICT + MARK + uni("w")
           + tensor("0", 2, (2,), (1,)) + SETITEMS + keys + SETITEMS + STOP)
    path = write_pt(tmp_path / "m.pt", pkl, {"0": floats(1, 2)})
    t = time.process_time()
    with pytest.raises(LimitError, match="one list repeated"):
        aprfast.convert(path, tmp_path / "o.apr")
    assert time.process_time() - t < 2 * CPU  # 82 M items copied into metadata before the fix


def test_one_long_key_at_every_level_is_refused(tmp_path):
    key = uni("k" * 60_000) + BINPUT0
    inner = EMPTY_DICT + MARK + b"".join(i1(i) + tensor("0", 2, (2,), (1,)) for i in range(200)) + SETITEMS
    levels = 15
    pkl = PROTO + key + b"0" + EMPTY_DICT
    for _ in range(levels):
        pkl += BINGET0 + EMPTY_DICT
    pkl += BINGET0 + inner + b"s" + b"s" * levels + STOP
    path = write_pt(tmp_path / "m.pt", pkl, {"0": floats(1, 2)})
    with pytest.raises(LimitError, match="names take more characters"):
        aprfast.convert(path, tmp_path / "o.apr")


def test_honest_state_dicts_still_read(tmp_path):
    entries = {f"model.layers.{i}.weight": tensor(str(i), 6, (2, 3), (3, 1)) for i in range(300)}
    pkl = state_dict(**{k.replace(".", "_"): v for k, v in entries.items()})
    path = write_pt(tmp_path / "m.pt", pkl, {str(i): floats(*range(6)) for i in range(300)})
    aprfast.convert(path, tmp_path / "o.apr")
    assert len(aprfast.load_file(tmp_path / "o.apr")) == 300
