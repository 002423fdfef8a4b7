"""Issue 28 item 1: corruption never passes silently.  A byte flipped inside a tensor of
an .apr file was converted, quantized, signed, encrypted, diffed, merged and listed
with statistics as if nothing were wrong; every operation that reads a whole file now
checks the footer CRC32 while it reads and fails with E004 (exit 5 in `apr`) before it
publishes anything, unless --no-verify / verify=False."""

import numpy as np
import pytest

import aprfast
from aprfast.cli import main
from aprfast.crypto.core import save_key
from aprfast.errors import ChecksumError
from aprfast.tools.diff import diff_models
from aprfast.tools.merge import merge_models
from aprfast.tools.protection import encrypt_file, sign_file


@pytest.fixture
def damaged(tmp_path, rng):
    """(good, damaged): two copies of a model, one with a bit of a tensor's data flipped."""
    tensors = {f"blk.{i}.attn_q.weight": rng.normal(0, 0.05, (64, 256)).astype(np.float32) for i in range(3)}
    tensors["big.weight"] = rng.normal(0, 0.05, (512, 1024)).astype(np.float32)  # >= 1 MiB: the mapped path
    tensors["norm.weight"] = np.ones(256, np.float32)
    good = tmp_path / "good.apr"
    aprfast.save_file(tensors, good)
    data = bytearray(good.read_bytes())
    with aprfast.open(good) as f:
        info = f.info("blk.1.attn_q.weight")
    data[info.offset + info.nbytes // 2] ^= 0x04  # a small change: no NaN, statistics still plausible
    bad = tmp_path / "bad.apr"
    bad.write_bytes(bytes(data))
    return good, bad


@pytest.mark.parametrize("destination", ["out.safetensors", "out.apr", "out.gguf"])
@pytest.mark.parametrize("validate", ["strict", "off"])
def test_convert_refuses_a_damaged_apr_and_writes_nothing(damaged, tmp_path, destination, validate):
    _, bad = damaged
    out = tmp_path / destination
    with pytest.raises(ChecksumError) as info:
        aprfast.convert(bad, out, validate=validate)
    assert info.value.code == "E004"
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary left


def test_convert_verify_false_converts_the_damage_as_it_is(damaged, tmp_path):
    _, bad = damaged
    aprfast.convert(bad, tmp_path / "out.safetensors", verify=False)
    assert (tmp_path / "out.safetensors").exists()


def test_convert_of_a_good_file_passes_and_dropping_tensors_still_checks_the_rest(damaged, tmp_path):
    good, bad = damaged
    aprfast.convert(good, tmp_path / "ok.safetensors")
    # the damaged tensor is not converted, but its bytes are still covered by the CRC
    with pytest.raises(ChecksumError):
        aprfast.convert(bad, tmp_path / "some.safetensors", rename={"blk.1.attn_q.weight": None})
    assert not (tmp_path / "some.safetensors").exists()


def test_running_crc_reads_each_fed_tensor_once(damaged):
    good, _ = damaged
    with aprfast.open(good) as f:
        crc = f.running_crc()
        for name in sorted(f.keys(), key=lambda n: f.info(n).offset):
            info = f.info(name)
            crc.feed(info.offset, info.nbytes, np.asarray(f.get_tensor(name)).view(np.uint8).reshape(-1))
        crc.feed(0, 10)  # already covered: nothing more
        crc.finish()


def test_convert_of_a_damaged_v1_file_is_checked_whole(tmp_path, rng):
    from aprfast import v1

    path = tmp_path / "m.apr"
    v1.save_model({"w": rng.normal(0, 0.05, (64, 64)).astype(np.float32)}, path)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 1
    path.write_bytes(bytes(data))
    with pytest.raises(ChecksumError):
        aprfast.convert(path, tmp_path / "out.safetensors")
    assert not (tmp_path / "out.safetensors").exists()


def test_load_file_without_mmap_checks_and_the_mmap_default_says_it_does_not(damaged):
    _, bad = damaged
    with pytest.raises(ChecksumError):
        aprfast.load_file(bad, mmap=False)
    aprfast.load_file(bad)  # the mapped default checks nothing until asked ...
    with pytest.raises(ChecksumError):
        aprfast.load_file(bad, verify=True)  # ... one keyword away
    assert "nothing is checked until asked" in " ".join(aprfast.load_file.__doc__.split())


def test_api_tools_refuse_a_damaged_input(damaged, tmp_path):
    good, bad = damaged
    seed = bytes(range(32))
    with pytest.raises(ChecksumError):
        sign_file(bad, seed, output=tmp_path / "s.apr")
    with pytest.raises(ChecksumError):
        encrypt_file(bad, tmp_path / "e.apr", password="pw")
    with pytest.raises(ChecksumError):
        merge_models([good, bad], tmp_path / "m.apr")
    with pytest.raises(ChecksumError):
        diff_models(good, bad)
    assert not any((tmp_path / n).exists() for n in ("s.apr", "e.apr", "m.apr"))
    # verify=False reads the damage as it is
    with pytest.warns(aprfast.LayoutChangeWarning):
        sign_file(bad, seed, output=tmp_path / "s.apr", verify=False)
    report = diff_models(good, bad, verify=False)
    assert [t.name for t in report.tensors if t.identical != t.count] == ["blk.1.attn_q.weight"]


@pytest.fixture
def signing_key(tmp_path):
    path = tmp_path / "me.key"
    save_key(path, bytes(range(32)), kind="ed25519-private", format="raw")
    return path


def _commands(good, bad, tmp_path, key):
    out = str(tmp_path / "out")
    return {
        "convert": ["convert", str(bad), out + ".safetensors"],
        "export": ["export", str(bad), out + ".gguf"],
        "import": ["import", str(bad), out + ".apr"],
        "quantize": ["quantize", str(bad), "-o", out + "-q.apr", "--type", "q8_0"],
        "sign": ["sign", str(bad), "--signing-key", str(key), "-o", out + "-s.apr"],
        "encrypt": ["encrypt", str(bad), "-o", out + "-e.apr", "--password-env", "APR_TEST_PW"],
        "diff": ["diff", str(good), str(bad)],
        "merge": ["merge", str(good), str(bad), "-o", out + "-m.apr"],
        "tensors --stats": ["tensors", str(bad), "--stats"],
    }


@pytest.mark.parametrize("command", ["convert", "export", "import", "quantize", "sign", "encrypt", "diff", "merge",
                                     "tensors --stats"])
def test_apr_commands_exit_5_with_e004_and_write_nothing(damaged, tmp_path, signing_key, capsys, monkeypatch,
                                                         command):
    good, bad = damaged
    monkeypatch.setenv("APR_TEST_PW", "pw")
    argv = _commands(good, bad, tmp_path, signing_key)[command]
    before = sorted(p.name for p in tmp_path.iterdir())
    assert main(argv) == 5
    err = capsys.readouterr().err
    assert "[E004]" in err and "--no-verify" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    # --no-verify: the damage is read as it is (diff: a MATCH within its tolerance, the trap itself)
    assert main(argv + ["--no-verify"]) == 0
    assert "[E004]" not in capsys.readouterr().err
