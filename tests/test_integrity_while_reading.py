"""Issue 28 item 1, the "no extra pass" half: quantize, sign, encrypt, diff, merge and
`apr tensors --stats` check a v2 file's footer CRC32 over the bytes they read anyway
(:class:`aprfast.files.integrity.CheckedReader` feeding a RunningCrc), not with a
whole-file pass at open, and still refuse a damaged file (E004, exit 5) before they
publish anything.  tests/test_integrity_by_default.py holds the first half (every
command refuses a damaged file); this file adds damage outside the tensors, existing
outputs left alone, and the proof that ``AprFile.verify`` is not called and that the
running CRC reads only what no tensor covered."""

from __future__ import annotations

import numpy as np
import pytest

import aprfast
from aprfast.cli import main
from aprfast.errors import ChecksumError
from aprfast.files.integrity import CheckedReader
from aprfast.files.reader import AprFile, RunningCrc
from aprfast.tools.diff import diff_models
from aprfast.tools.merge import merge_models
from aprfast.tools.protection import encrypt_file, sign_file

SEED = bytes(range(32))


def _model(rng):
    tensors = {f"blk.{i}.attn_q.weight": rng.normal(0, 0.05, (64, 256)).astype(np.float32) for i in range(3)}
    tensors["big.weight"] = rng.normal(0, 0.05, (512, 1024)).astype(np.float32)  # >= 1 MiB
    tensors["blk.0.bias"] = rng.normal(0, 0.05, 15).astype(np.float32)  # 60 bytes: padding follows it
    tensors["norm.weight"] = np.ones(256, np.float32)
    return tensors


@pytest.fixture
def files(tmp_path, rng):
    """good, bad_tensor (a bit of a tensor flipped), bad_padding (a byte of the padding
    between two tensors flipped), all in apr2 layout (no layout-change warning)."""
    good = tmp_path / "good.apr"
    aprfast.save_file(_model(rng), good, layout="apr2")
    data = good.read_bytes()
    with aprfast.open(good) as f:
        infos = sorted((f.info(n) for n in f.keys()), key=lambda i: i.offset)
        tensor = f.info("blk.1.attn_q.weight")
    gaps = [(a.offset + a.nbytes, b.offset) for a, b in zip(infos, infos[1:]) if b.offset > a.offset + a.nbytes]
    assert gaps, "the model needs padding between two tensors"
    out = {"good": good}
    for kind, at in (("tensor", tensor.offset + tensor.nbytes // 2), ("padding", gaps[0][0])):
        damaged = bytearray(data)
        damaged[at] ^= 0x04
        path = tmp_path / f"bad-{kind}.apr"
        path.write_bytes(bytes(damaged))
        out[kind] = path
    return out


@pytest.fixture
def watch(monkeypatch):
    """No whole-file pass: AprFile.verify fails the test; each RunningCrc.finish records
    (bytes it read itself, bytes it covers)."""
    finished = []

    def no_verify(self):
        raise AssertionError(f"AprFile.verify() called for {self.path}: a whole extra pass")

    real_finish = RunningCrc.finish

    def finish(self):
        try:
            real_finish(self)
        finally:
            finished.append((self.bytes_read, self.end))

    monkeypatch.setattr(AprFile, "verify", no_verify)
    monkeypatch.setattr(RunningCrc, "finish", finish)
    return finished


def _read_little(finished, count):
    """``count`` running CRCs finished, each having read under 5% of its file itself."""
    assert len(finished) == count, finished
    for read, end in finished:
        assert read < end // 20, f"the running CRC read {read} of {end} bytes: a second pass"


# --- the operations, each as the library and as `apr` ------------------------------------
def _quantize(source, out, verify=True):
    argv = ["quantize", str(source), str(out), "--type", "q8_0", "--force", "-q"]
    code = main(argv + ([] if verify else ["--no-verify"]))
    if code == 5:
        raise ChecksumError("apr quantize exit 5")
    assert code == 0


def _sign(source, out, verify=True):
    sign_file(source, SEED, output=out, force=True, verify=verify)


def _encrypt(source, out, verify=True):
    encrypt_file(source, out, password="pw", force=True, verify=verify)


def _merge(source, out, verify=True, good=None):
    merge_models([good, source], out, force=True, verify=verify)


OPERATIONS = {"quantize": _quantize, "sign": _sign, "encrypt": _encrypt, "merge": _merge}


def _run(name, source, out, files, verify=True):
    if name == "merge":
        return _merge(source, out, verify, good=files["good"])
    return OPERATIONS[name](source, out, verify)


@pytest.mark.parametrize("damage", ["tensor", "padding"])
@pytest.mark.parametrize("operation", sorted(OPERATIONS))
def test_writers_refuse_damage_and_leave_the_output_alone(files, tmp_path, watch, capsys, operation, damage):
    out = tmp_path / "out.apr"
    out.write_bytes(b"the previous output")
    with pytest.raises(ChecksumError):
        _run(operation, files[damage], out, files)
    assert out.read_bytes() == b"the previous output"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no temporary left
    fresh = tmp_path / "fresh.apr"
    with pytest.raises(ChecksumError):
        _run(operation, files[damage], fresh, files)
    assert not fresh.exists()
    capsys.readouterr()


@pytest.mark.parametrize("operation", sorted(OPERATIONS))
def test_writers_check_while_reading_with_no_extra_pass(files, tmp_path, watch, operation):
    out = tmp_path / "out.apr"
    _run(operation, files["good"], out, files)
    assert out.exists()
    _read_little(watch, 2 if operation == "merge" else 1)


@pytest.mark.parametrize("operation", sorted(OPERATIONS))
def test_writers_no_verify_proceeds(files, tmp_path, watch, capsys, operation):
    out = tmp_path / "out.apr"
    _run(operation, files["tensor"], out, files, verify=False)
    assert out.exists()
    assert watch == []  # nothing checked
    capsys.readouterr()


@pytest.mark.parametrize("damage", ["tensor", "padding"])
def test_diff_refuses_damage_on_either_side_without_an_extra_pass(files, watch, damage):
    with pytest.raises(ChecksumError):
        diff_models(files["good"], files[damage])
    with pytest.raises(ChecksumError):
        diff_models(files[damage], files["good"])
    watch.clear()
    report = diff_models(files["good"], files["good"])
    assert report.tensors_match
    _read_little(watch, 2)  # each side its own running CRC, B's fed in A's order
    watch.clear()
    report = diff_models(files["good"], files[damage], verify=False)
    assert watch == []
    assert [t.name for t in report.tensors if t.identical != t.count] == (
        ["blk.1.attn_q.weight"] if damage == "tensor" else [])


@pytest.mark.parametrize("damage", ["tensor", "padding"])
def test_tensors_stats_prints_nothing_for_a_damaged_file(files, watch, capsys, damage):
    assert main(["tensors", str(files[damage]), "--stats"]) == 5
    captured = capsys.readouterr()
    assert "[E004]" in captured.err and captured.out == ""
    assert main(["tensors", str(files["good"]), "--stats"]) == 0
    assert "big.weight" in capsys.readouterr().out
    _read_little(watch[-1:], 1)
    watch.clear()
    assert main(["tensors", str(files[damage]), "--stats", "--no-verify"]) == 0
    assert watch == []
    # --filter reads some tensors: the running CRC reads the rest, still one pass in all
    assert main(["tensors", str(files[damage]), "--stats", "--filter", "norm.*"]) == 5
    capsys.readouterr()


def test_convert_and_eager_load_do_not_call_verify(files, tmp_path, watch):
    aprfast.convert(files["good"], tmp_path / "out.safetensors")
    _read_little(watch, 1)
    with pytest.raises(ChecksumError):
        aprfast.convert(files["padding"], tmp_path / "bad.safetensors")
    assert not (tmp_path / "bad.safetensors").exists()
    aprfast.load_file(files["good"], mmap=False)
    with pytest.raises(ChecksumError):
        aprfast.load_file(files["padding"], mmap=False)


# --- the pieces -------------------------------------------------------------------------
def _stored(f, name):
    return np.frombuffer(bytes(f.stored_bytes(name)), np.uint8)


def test_running_crc_takes_ranges_in_any_order(files):
    for key in ("good", "tensor", "padding"):
        with aprfast.open(files[key]) as f:
            crc = f.running_crc()
            names = sorted(f.keys(), key=lambda n: -f.info(n).offset)  # back to front
            for name in names + names[:2]:  # and twice: the second costs nothing
                info = f.info(name)
                crc.feed(info.offset, info.nbytes, _stored(f, name))
            if key == "good":
                crc.finish()
                tensor_bytes = sum(f.info(n).nbytes for n in names)
                assert crc.bytes_read == crc.end - tensor_bytes  # header, index and padding only
            else:
                with pytest.raises(ChecksumError):
                    crc.finish()


def test_running_crc_overlaps_and_ranges_without_data(files):
    with aprfast.open(files["good"]) as f:
        info = f.info("big.weight")
        crc = f.running_crc()
        data = _stored(f, "big.weight")
        crc.feed(info.offset, info.nbytes, data)
        crc.feed(info.offset + 8, 100, data[8:108])  # inside a range fed before
        crc.feed(info.offset - 4, 16)  # straddles its start: read here
        crc.feed(info.offset, 10, b"short")  # data of the wrong size: read here
        crc.feed(0, 10**12)  # beyond the end: the CRC field stops it
        crc.finish()


@pytest.mark.parametrize("mode", ["mmap", "pread"])
@pytest.mark.parametrize("compression", [None, "zstd"])
def test_checked_reader_feeds_the_bytes_it_reads(tmp_path, rng, mode, compression):
    path = tmp_path / "m.apr"
    tensors = _model(rng)
    tensors["q"] = aprfast.quantize(tensors["big.weight"], "Q8_0")
    aprfast.save_file(tensors, path, layout="apr2", compression=compression)
    with aprfast.open(path, mode=mode) as f:
        reader = CheckedReader(f)
        assert reader.checked == "while reading"
        values = dict(reader.items())
        reader.finish()
        reader.finish()  # idempotent
        stored = sum(f.info(n).nbytes for n in f.keys())
        compressed = sum(f.info(n).nbytes for n in f.keys() if f.info(n).flags)
        # only a compressed tensor of a file that is not mapped is read a second time
        assert reader.bytes_read <= path.stat().st_size - stored + (compressed if mode == "pread" else 0)
    np.testing.assert_array_equal(values["big.weight"], tensors["big.weight"])
    with aprfast.open(path, mode=mode) as f:
        reader = CheckedReader(f, verify=False)
        assert reader.checked is None
        reader.get_tensor("blk.0.bias")
        reader.finish()
        assert reader.bytes_read == 0


def test_checked_reader_checks_sealed_and_v1_files_whole_at_open(tmp_path, rng, monkeypatch):
    from aprfast import v1

    sealed = tmp_path / "sealed.apr"
    aprfast.save_file(_model(rng), sealed, password="pw")
    with aprfast.open(sealed, password="pw") as f:
        assert f.running_crc() is None
        assert CheckedReader(f).checked == "at open"
    data = bytearray(sealed.read_bytes())
    data[len(data) // 2] ^= 1
    sealed.write_bytes(bytes(data))
    with aprfast.open(sealed, password="pw") as f, pytest.raises(aprfast.AprError):
        CheckedReader(f)
    old = tmp_path / "v1.apr"
    v1.save_model({"w": rng.normal(0, 0.05, (64, 64)).astype(np.float32)}, old)
    with aprfast.open(old) as f:
        assert CheckedReader(f).checked == "at open"
