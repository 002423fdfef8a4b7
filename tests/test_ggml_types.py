"""Every GGML type gguf-py knows is an aprfast block dtype (issue 27 items 1 and 6):
registered with its block geometry and an APR2 id, kept as blocks through GGUF -> .apr
-> GGUF byte for byte, listed by ``inspect`` and ``apr tensors``, sliced by whole rows,
and refused by aprender's layout with an error naming the layout that holds it."""

import json
import re
import struct
from pathlib import Path

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

import aprfast  # noqa: E402
from aprfast import dtypes  # noqa: E402
from aprfast.cli import main  # noqa: E402
from aprfast.convert import gguf as cg  # noqa: E402
from aprfast.tensors import QuantizedTensor  # noqa: E402

GGMLType = gguf.GGMLQuantizationType
PLAIN = {"F32", "F16", "BF16", "F64", "I8", "I16", "I32", "I64"}
#: Block types aprfast reads from GGUF (every GGML type that is not a plain element type).
BLOCK_TYPES = sorted((name for name in cg.GGML_TYPES.values() if name not in PLAIN),
                     key=lambda n: [k for k, v in cg.GGML_TYPES.items() if v == n][0])
#: Where aprfast's block size differs from gguf-py's GGML_QUANT_SIZES, and why.
SIZE_EXCEPTIONS = {
    # ggml-common.h's block_q8_1 is f16 d, f16 s, 32 x i8 (static_assert: 36 bytes);
    # gguf-py's table keeps 40, from when d and s were f32.  Files follow ggml.
    "Q8_1": ((32, 40), (32, 36)),
}
FORMAT_MD = Path(__file__).resolve().parent.parent / "docs" / "FORMAT.md"


def test_every_ggml_type_of_the_installed_gguf_py_is_known():
    """Item 6: the day gguf-py learns a type, this fails naming it."""
    missing = [f"{t.name} (id {t.value})" for t in GGMLType if cg.GGML_TYPES.get(t.value) != t.name]
    assert not missing, f"gguf-py {getattr(gguf, '__version__', '')} has GGML types aprfast lacks: {missing}"
    assert set(cg.GGML_TYPES) == {t.value for t in GGMLType}, "aprfast reads ids gguf-py does not define"


@pytest.mark.parametrize("type_name", BLOCK_TYPES)
def test_block_geometry_is_gguf_py_s(type_name):
    d = dtypes.by_name(type_name)
    assert d.packed and d.blocks_per_row and not d.tensor_header
    theirs = gguf.GGML_QUANT_SIZES[getattr(GGMLType, type_name)]
    if type_name in SIZE_EXCEPTIONS:
        assert (theirs, (d.block_elems, d.block_bytes)) == SIZE_EXCEPTIONS[type_name]
    else:
        assert (d.block_elems, d.block_bytes) == theirs
    assert d.nbytes((3, 2 * d.block_elems)) == 6 * d.block_bytes


def test_apr2_ids_are_unique_and_recorded_in_format_md():
    ids = {type_name: dtypes.APR2_IDS.id_of(dtypes.by_name(type_name)) for type_name in BLOCK_TYPES}
    assert len(set(ids.values())) == len(ids)
    assert all(dtypes.APR2_IDS.dtype(i).name == name for name, i in ids.items())
    text = FORMAT_MD.read_text(encoding="utf-8")
    for type_name, type_id in ids.items():
        assert re.search(rf"^\| {type_name} \|[^\n]*\| {type_id}\*? \|", text, re.M), \
            f"docs/FORMAT.md §4 lists no row for {type_name} with APR2 id {type_id}"


@pytest.mark.parametrize("type_name", [t for t in BLOCK_TYPES if not dtypes.APRENDER_IDS.holds(dtypes.by_name(t))])
def test_aprender_layout_refuses_and_names_the_layout_that_can(tmp_path, type_name):
    d = dtypes.by_name(type_name)
    qt = QuantizedTensor(d, (1, d.block_elems), np.zeros(d.block_bytes, np.uint8))
    with pytest.raises(aprfast.LayoutError, match=rf"no dtype id for {type_name} \(the apr2 layout can hold it"):
        aprfast.save_file({"w": qt}, tmp_path / "m.apr", layout="aprender")
    aprfast.save_file({"w": qt}, tmp_path / "m.apr")  # auto picks APR2
    with aprfast.open(tmp_path / "m.apr") as f:
        assert f.layout == "apr2" and f.info("w").dtype is d


def random_blocks(rng, type_name, rows, blocks_per_row):
    d = dtypes.by_name(type_name)
    return rng.integers(0, 256, (rows, blocks_per_row * d.block_bytes), dtype=np.uint8)


def gguf_py_file(path, rng, types):
    """A GGUF that gguf-py writes, one (3, 2-block) tensor of random blocks per type."""
    w = gguf.GGUFWriter(str(path), "llama")
    expected = {}
    for type_name in types:
        blocks = random_blocks(rng, type_name, 3, 2)
        w.add_tensor(f"t.{type_name.lower()}", blocks, raw_dtype=getattr(GGMLType, type_name))
        expected[f"t.{type_name.lower()}"] = (type_name, blocks)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return expected


# gguf-py sizes Q8_1 blocks at 40 bytes (see SIZE_EXCEPTIONS): its files of Q8_1 are not ggml's.
GGUF_PY_TYPES = [t for t in BLOCK_TYPES if t not in SIZE_EXCEPTIONS]


def test_gguf_import_keeps_blocks_and_export_gives_them_back(tmp_path, rng):
    expected = gguf_py_file(tmp_path / "a.gguf", rng, GGUF_PY_TYPES)
    aprfast.convert(tmp_path / "a.gguf", tmp_path / "a.apr", validate="off")  # random blocks hold NaN
    with aprfast.open(tmp_path / "a.apr") as f:
        for name, (type_name, blocks) in expected.items():
            got = f.get_tensor(name)
            d = dtypes.by_name(type_name)
            assert isinstance(got, QuantizedTensor) and got.dtype is d
            assert got.shape == (3, 2 * d.block_elems)
            assert got.data.tobytes() == blocks.tobytes()
    aprfast.convert(tmp_path / "a.apr", tmp_path / "b.gguf", validate="off")
    reader_a, reader_b = gguf.GGUFReader(str(tmp_path / "a.gguf")), gguf.GGUFReader(str(tmp_path / "b.gguf"))
    a = {t.name: (int(t.tensor_type), [int(x) for x in t.shape], t.data.tobytes()) for t in reader_a.tensors}
    b = {t.name: (int(t.tensor_type), [int(x) for x in t.shape], t.data.tobytes()) for t in reader_b.tensors}
    assert a == b and len(a) == len(GGUF_PY_TYPES)


def s(text: bytes) -> bytes:
    return struct.pack("<Q", len(text)) + text


def handmade_gguf(tensors, alignment=32):
    """GGUF v3 bytes with ``tensors`` = [(name, ggml id, ne, data)], as ggml lays them out."""
    infos, data, offset = b"", b"", 0
    for name, type_id, ne, raw in tensors:
        infos += s(name.encode()) + struct.pack(f"<I{len(ne)}QIQ", len(ne), *ne, type_id, offset)
        pad = -len(raw) % alignment
        data += raw + b"\0" * pad
        offset += len(raw) + pad
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), 0) + infos
    return head + b"\0" * (-len(head) % alignment) + data


@pytest.mark.parametrize("type_name", BLOCK_TYPES)
def test_handmade_ggml_layout_round_trips_byte_for_byte(tmp_path, rng, type_name):
    """ggml's own sizes (Q8_1 included): the tensor bytes and the whole file come back."""
    d = dtypes.by_name(type_name)
    raw = random_blocks(rng, type_name, 2, 3).tobytes()
    original = handmade_gguf([("w", cg._GGML_IDS[type_name], (3 * d.block_elems, 2), raw)])
    (tmp_path / "a.gguf").write_bytes(original)
    aprfast.convert(tmp_path / "a.gguf", tmp_path / "a.apr", validate="off")  # random blocks hold NaN
    with aprfast.open(tmp_path / "a.apr") as f:
        got = f.get_tensor("w")
        assert got.dtype is d and got.shape == (2, 3 * d.block_elems) and got.data.tobytes() == raw
    aprfast.convert(tmp_path / "a.apr", tmp_path / "b.gguf", validate="off")
    source = cg.GGUFSource(tmp_path / "b.gguf")
    try:
        (spec,) = source.specs
        assert (spec.name, spec.dtype, spec.shape) == ("w", d, (2, 3 * d.block_elems))
        assert source.read(spec).data.tobytes() == raw
    finally:
        source.close()


@pytest.mark.parametrize("type_id", [4, 5, 31, 33, 36, 38, 42, 1000])
def test_a_gguf_tensor_of_an_unknown_type_id_is_a_typed_error_naming_id_and_tensor(tmp_path, type_id):
    (tmp_path / "a.gguf").write_bytes(handmade_gguf([("blk.0.weird", type_id, (256, 1), b"\0" * 256)]))
    with pytest.raises(aprfast.UnknownDTypeError, match=rf"'blk\.0\.weird' has GGML type id {type_id},"):
        cg.GGUFSource(tmp_path / "a.gguf")
    with pytest.raises(aprfast.UnknownDTypeError, match=f"type id {type_id}"):
        aprfast.convert(tmp_path / "a.gguf", tmp_path / "a.apr", validate="off")  # random blocks hold NaN
    assert not (tmp_path / "a.apr").exists()


def test_inspect_and_apr_tensors_list_every_type(tmp_path, rng, capsys):
    tensors = {}
    for type_name in BLOCK_TYPES:
        d = dtypes.by_name(type_name)
        tensors[f"w.{type_name.lower()}"] = QuantizedTensor(d, (2, d.block_elems),
                                                            random_blocks(rng, type_name, 2, 1).reshape(-1))
    aprfast.save_file(tensors, tmp_path / "m.apr")
    listed = aprfast.inspect(tmp_path / "m.apr")["tensors"]
    for name, qt in tensors.items():
        assert listed[name]["dtype"] == qt.dtype.name and listed[name]["shape"] == list(qt.shape)
        assert listed[name]["nbytes"] == 2 * qt.dtype.block_bytes
    assert main(["tensors", "--json", str(tmp_path / "m.apr")]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)["tensors"]}
    assert {name: rows[name]["dtype"] for name in tensors} == {n: t.dtype.name for n, t in tensors.items()}
    assert main(["tensors", str(tmp_path / "m.apr")]) == 0
    out = capsys.readouterr().out
    assert all(type_name in out for type_name in BLOCK_TYPES)


@pytest.mark.parametrize("type_name", BLOCK_TYPES)
def test_get_slice_takes_whole_rows(tmp_path, rng, type_name):
    d = dtypes.by_name(type_name)
    blocks = random_blocks(rng, type_name, 5, 2)
    aprfast.save_file({"w": QuantizedTensor(d, (5, 2 * d.block_elems), blocks.reshape(-1))}, tmp_path / "m.apr")
    with aprfast.open(tmp_path / "m.apr") as f:
        part = f.get_slice("w")[1:4]
        assert part.dtype is d and part.shape == (3, 2 * d.block_elems)
        assert part.data.tobytes() == blocks[1:4].tobytes()
        with pytest.raises(aprfast.AprError):
            f.get_slice("w")[:, 1:3]  # not whole blocks
