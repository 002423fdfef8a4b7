"""``aprfast.inspect``'s ``tensors``: a dict that builds each entry when asked for
(aprfast.layouts._common.TensorIndex) must behave as the fully built dict it stands
for, everywhere a caller can tell, and every check of the index must still run
inside ``inspect`` (a hostile index fails there, never later on access)."""

from __future__ import annotations

import copy
import json
import pickle
import threading

import numpy as np
import pytest
from hostile_builders import APR2, APRENDER, Entry, build, honest

import aprfast
from aprfast.errors import AprError, CorruptError
from aprfast.files.reader import AprFile
from aprfast.layouts._common import TensorIndex

NAMES = ["a", "b.weight", "ünïcödé", "名前.bias", "z" * 200, "\U0001F600.emoji", "layers.10.x", "layers.9.x"]


def _tensors():
    rng = np.random.default_rng(3)
    out = {name: rng.standard_normal((i % 3 + 1, 4)).astype(np.float32) for i, name in enumerate(NAMES)}
    out["scalar"] = np.float64(2.5)
    out["empty"] = np.zeros((0, 7), np.int32)
    out["half"] = np.ones(5, np.float16)
    return out


def _plain(path) -> dict:
    """What inspect's tensors were before: every entry built at once, in C."""
    with AprFile(path, unknown_dtypes="raw") as f:
        built = f._file.describe()
    assert type(built) is dict
    return built


@pytest.fixture(params=["aprender", "apr2", "apr2-lz4"])
def saved(request, tmp_path):
    path = tmp_path / f"{request.param}.apr"
    if request.param == "apr2-lz4":  # compressed entries carry raw_size and flags too
        tensors = {**_tensors(), "big": np.zeros(1 << 16, np.float32)}
        aprfast.save_file(tensors, path, compression="lz4")
    else:
        aprfast.save_file(_tensors(), path, layout=request.param)
    return path


def test_reads_as_the_built_dict(saved):
    info = aprfast.inspect(saved)
    table, plain = info["tensors"], _plain(saved)
    assert isinstance(table, TensorIndex) and isinstance(table, dict)
    assert len(table) == len(plain) and bool(table)
    assert list(table) == list(plain)
    assert list(table.keys()) == list(plain.keys())
    for name, entry in plain.items():
        assert name in table
        assert table[name] == entry
        assert list(table[name]) == list(entry)  # the same keys in the same order
        assert table.get(name) == entry
    assert "missing" not in table and 3 not in table and None not in table
    assert table.get("missing") is None and table.get("missing", 7) == 7
    with pytest.raises(KeyError):
        table["missing"]
    assert list(table.values()) == list(plain.values())
    assert list(table.items()) == list(plain.items())
    assert list(reversed(table)) == list(reversed(plain))
    if "big" in plain:
        assert {"raw_size", "flags"} <= set(table["big"])


def test_equality_both_ways_before_and_after_building(saved):
    plain = _plain(saved)
    table = aprfast.inspect(saved)["tensors"]
    assert table == plain and plain == table
    assert not (table != plain) and not (plain != table)
    assert table == aprfast.inspect(saved)["tensors"]
    other = dict(plain)
    other.popitem()
    assert table != other and other != table
    changed = copy.deepcopy(plain)
    changed[next(iter(changed))]["nbytes"] += 1
    assert table != changed and changed != table
    assert table != list(plain) and table != None  # noqa: E711
    assert [table] == [plain] and {"t": table} == {"t": plain}


def test_json_encodes_as_the_built_dict(saved):
    info = aprfast.inspect(saved)
    plain = {**info, "tensors": _plain(saved)}
    for kw in ({}, {"indent": 2}, {"sort_keys": True}, {"indent": 1, "sort_keys": True}):
        assert json.dumps(info, **kw) == json.dumps(plain, **kw)
        assert json.dumps(info["tensors"], **kw) == json.dumps(plain["tensors"], **kw)
    assert json.loads(json.dumps(info)) == json.loads(json.dumps(plain))


def test_copies_and_pickles_are_plain_dicts(saved):
    plain = _plain(saved)
    table = aprfast.inspect(saved)["tensors"]
    for made in (dict(table), {**table}, table.copy(), copy.copy(table), copy.deepcopy(table),
                 pickle.loads(pickle.dumps(table)), pickle.loads(pickle.dumps(table, protocol=0)),
                 table | {}, {} | table):
        assert type(made) is dict
        assert made == plain and list(made) == list(plain)
    both = table | {"extra": 1}
    assert type(both) is dict and both == {**plain, "extra": 1}
    # the whole report too: pickled data holds nothing of aprfast
    blob = pickle.dumps(aprfast.inspect(saved))
    assert b"aprfast" not in blob
    assert repr(table) == repr(plain)
    assert str(table) == str(plain)


def test_keys_view(saved):
    plain = _plain(saved)
    keys = aprfast.inspect(saved)["tensors"].keys()
    assert len(keys) == len(plain)
    assert keys == plain.keys() and plain.keys() == keys
    assert (keys & {"a", "nope"}) == {"a"}
    assert (keys | {"nope"}) == set(plain) | {"nope"}
    assert "a" in keys and "nope" not in keys
    assert list(reversed(keys)) == list(reversed(plain.keys()))
    assert repr(keys) == repr(plain.keys())


def test_an_entry_asked_for_twice_is_the_same_dict(saved):
    table = aprfast.inspect(saved)["tensors"]
    entry = table["a"]
    assert table["a"] is entry
    entry["note"] = "mine"
    assert table["a"]["note"] == "mine"
    # building the rest keeps what was handed out
    assert dict(table.items())["a"] is entry
    assert json.loads(json.dumps(table))["a"]["note"] == "mine"
    assert table["a"] is entry and table["b.weight"] is dict(table.items())["b.weight"]


@pytest.mark.parametrize("change", [
    lambda d: d.__setitem__("new", {"x": 1}),
    lambda d: d.__setitem__("a", 5),
    lambda d: d.__delitem__("a"),
    lambda d: d.pop("a"),
    lambda d: d.pop("missing", None),
    lambda d: d.popitem(),
    lambda d: d.setdefault("a", 1),
    lambda d: d.setdefault("new", 1),
    lambda d: d.update({"new": 1}, other=2),
    lambda d: d.clear(),
    lambda d: d.__ior__({"new": 1}),
])
def test_changes_make_it_an_ordinary_dict(saved, change):
    plain = _plain(saved)
    table = aprfast.inspect(saved)["tensors"]
    asked = table["b.weight"]
    r1, r2 = change(table), change(plain)
    assert (r1 is table) if r2 is plain else r1 == r2
    assert table == plain and plain == table
    assert list(table) == list(plain) and list(table.items()) == list(plain.items())
    assert len(table) == len(plain)
    assert json.dumps(table) == json.dumps(plain)
    assert repr(table) == repr(plain)
    assert pickle.loads(pickle.dumps(table)) == plain
    if "b.weight" in table:
        assert table["b.weight"] is asked  # entries handed out before stay the same objects
    table["later"] = 1
    plain["later"] = 1
    assert table == plain and list(table) == list(plain)


def test_missing_key_errors_match_a_dict(saved):
    table = aprfast.inspect(saved)["tensors"]
    with pytest.raises(KeyError):
        table.pop("missing")
    with pytest.raises(KeyError):
        del table["missing"]


@pytest.mark.parametrize("layout", ["aprender", "apr2"])
def test_an_empty_index(layout, tmp_path):
    path = tmp_path / "empty.apr"
    aprfast.save_file({}, path, layout=layout)
    table = aprfast.inspect(path)["tensors"]
    assert len(table) == 0 and not table and table == {} and {} == table
    assert list(table) == [] and list(table.items()) == []
    assert json.dumps(table) == "{}" and json.dumps(table, indent=2) == "{}"
    assert repr(table) == "{}"


@pytest.mark.parametrize("layout", ["aprender", "apr2"])
def test_many_entries_match(layout, tmp_path):
    data = np.arange(3 * 20_000, dtype=np.float32).reshape(20_000, 3)
    tensors = {f"block.{i % 97}.t{i}" + ("é" * (i % 5)): data[i] for i in range(20_000)}
    path = tmp_path / "many.apr"
    aprfast.save_file(tensors, path, layout=layout)
    plain = _plain(path)
    table = aprfast.inspect(path)["tensors"]
    assert list(table) == list(plain)  # names only: no entry built
    for name in list(plain)[::997]:
        assert table[name] == plain[name]
    assert table == plain
    assert json.loads(json.dumps(table)) == plain


def test_a_buffer_changed_after_inspect_does_not_change_the_table():
    data = bytearray(aprfast.save(_tensors()))
    expected = _plain(bytes(data))
    table = aprfast.inspect(data)["tensors"]  # nothing built yet
    end = aprfast.inspect(bytes(data))["header"]["data_offset"]
    data[64:end] = b"\xff" * (end - 64)  # metadata and index overwritten in the caller's buffer
    assert list(table) == list(expected)  # read from inspect's own copy of the index
    assert table["a"] == expected["a"]
    assert table == expected


def test_threads_building_at_once_see_the_same_contents(saved):
    plain = _plain(saved)
    table = aprfast.inspect(saved)["tensors"]
    seen, start = [], threading.Barrier(4)

    def read():
        start.wait()
        seen.append((dict(table.items()), [table[n] for n in plain]))

    threads = [threading.Thread(target=read) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(seen) == 4
    for items, entries in seen:
        assert items == plain and entries == list(plain.values())


# --- every check runs inside inspect ------------------------------------------------------
def _deep_index(layout, last: Entry | None = None, *, count=5000):
    """An honest index of ``count`` entries, whose last entry may be replaced by a lie."""
    parts = honest(layout, {f"t.{i:05d}": np.float32([i]) for i in range(count)})
    if last is not None:
        parts.entries[-1] = last
    return build(layout, parts)


@pytest.mark.parametrize("layout", [APRENDER, APR2])
@pytest.mark.parametrize("lie, message", [
    (lambda off: Entry("t.04998", 0, (1,), off, 4), "appears twice"),
    (lambda off: Entry(b"t.\xff9999", 0, (1,), off, 4), "not UTF-8"),
    (lambda off: Entry("t.09999", 0, (1,), 1 << 40, 4), "outside"),
    (lambda off: Entry("t.09999", 0, (3,), off, 4), "needs 12 bytes"),
    (lambda off: Entry("t.09999", 0, (2,), 0, 8), "overlap"),
])
def test_a_lie_in_the_last_entry_fails_inside_inspect(layout, lie, message, tmp_path):
    honest_parts = honest(layout, {f"t.{i:05d}": np.float32([i]) for i in range(5000)})
    data = _deep_index(layout, lie(honest_parts.entries[-1].offset))
    path = tmp_path / "lie.apr"
    path.write_bytes(data)
    for target in (path, data, bytearray(data)):
        with pytest.raises(AprError, match=message) as caught:
            aprfast.inspect(target)
        assert isinstance(caught.value, CorruptError)


@pytest.mark.parametrize("layout", [APRENDER, APR2])
def test_an_honest_deep_index_reads_back(layout, tmp_path):
    path = tmp_path / "ok.apr"
    path.write_bytes(_deep_index(layout))
    table = aprfast.inspect(path)["tensors"]
    assert len(table) == 5000 and table["t.04999"]["shape"] == [1]
    assert table == _plain(path)


def test_open_of_a_callers_bytearray_keeps_its_own_index(tmp_path):
    # the index entries decode names and shapes on demand: overwriting the caller's
    # buffer after open must change neither (nor where the decoder reads)
    import numpy as np

    path = tmp_path / "m.apr"
    aprfast.save_file({"alpha": np.arange(6, dtype=np.float32), "beta": np.ones((2, 3), np.float32)}, path)
    data = bytearray(path.read_bytes())
    f = aprfast.open(data)
    keys = list(f.keys())
    data[:len(data) - 64] = b"\xff" * (len(data) - 64)  # the index (and the data) overwritten
    assert list(f.keys()) == keys == ["alpha", "beta"]
    assert f.info("beta").shape == (2, 3)
