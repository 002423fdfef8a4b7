"""`apr convert`, `apr import`, `apr export`: thin verbs over aprfast.convert.  The
output is the converted model, never an overwritten file without --force (QA #97),
bad options are usage errors (exit 2), a missing source exit 3."""

import json
import os

import numpy as np
import pytest

import aprfast
from aprfast.cli import main
from aprfast.convert import detect


@pytest.fixture
def model(tmp_path, rng):
    tensors = {"blk.0.attn_q.weight": rng.standard_normal((8, 64)).astype(np.float32),
               "output_norm.weight": np.ones(64, np.float32)}
    path = tmp_path / "m.apr"
    aprfast.save_file(tensors, path, metadata={"license": "MIT"})
    return path, tensors


def test_convert_precision_writes_f16(model, tmp_path, capsys):
    src, tensors = model
    out = tmp_path / "h.apr"
    assert main(["convert", str(src), str(out), "--precision", "f16"]) == 0
    assert "m.apr (apr) -> " in capsys.readouterr().out
    with aprfast.open(out) as f:
        assert f.info("output_norm.weight").dtype_name == "F16"
        np.testing.assert_array_equal(f.get_tensor("blk.0.attn_q.weight"),
                                      tensors["blk.0.attn_q.weight"].astype(np.float16))


def test_convert_quantize_int8_alias_is_q8_0_and_output_flag(model, tmp_path, capsys):
    src, _ = model
    out = tmp_path / "q.apr"
    assert main(["convert", str(src), "--quantize", "int8", "-o", str(out), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["destination"] == str(out) and doc["format"] == "apr" and doc["size"] == os.path.getsize(out)
    with aprfast.open(out) as f:
        assert f.info("blk.0.attn_q.weight").dtype_name == "Q8_0"
        assert f.info("output_norm.weight").dtype_name == "F32"  # 1-D: kept


def test_existing_output_is_not_overwritten_without_force(model, tmp_path, capsys):
    src, _ = model
    out = tmp_path / "exists.apr"
    out.write_bytes(b"precious")
    assert main(["convert", str(src), str(out)]) == 1
    assert "exists; pass --force" in capsys.readouterr().err
    assert out.read_bytes() == b"precious"
    assert main(["export", str(src), str(tmp_path / "e.safetensors")]) == 0
    before = (tmp_path / "e.safetensors").read_bytes()
    assert main(["export", str(src), str(tmp_path / "e.safetensors"), "--precision", "f16"]) == 1
    assert (tmp_path / "e.safetensors").read_bytes() == before
    assert main(["convert", str(src), str(out), "--force"]) == 0
    with aprfast.open(out) as f:
        assert set(f.keys()) == {"blk.0.attn_q.weight", "output_norm.weight"}


def test_export_gguf_then_import_round_trips(model, tmp_path):
    src, tensors = model
    gguf = tmp_path / "m.gguf"
    assert main(["export", str(src), str(gguf)]) == 0
    back = tmp_path / "back.apr"
    assert main(["import", str(gguf), "-o", str(back)]) == 0
    with aprfast.open(back) as f:
        for name, value in tensors.items():
            np.testing.assert_array_equal(f.get_tensor(name), value)


def test_export_format_flag_and_refusals(model, tmp_path, capsys):
    src, _ = model
    out = tmp_path / "model.bin"
    assert main(["export", str(src), str(out), "--format", "safetensors"]) == 0
    assert detect(out) == "safetensors"
    assert main(["export", str(out), str(tmp_path / "x.gguf")]) == 2  # source not .apr
    assert main(["export", str(src), str(tmp_path / "x.apr")]) == 2
    assert "apr convert" in capsys.readouterr().err


def test_import_writes_apr_whatever_the_extension(model, tmp_path):
    src, _ = model
    st = tmp_path / "m.safetensors"
    aprfast.convert(src, st)
    out = tmp_path / "imported.model"
    assert main(["import", str(st), str(out)]) == 0
    assert detect(out) == "apr"
    assert main(["import", "hf://openai/whisper-tiny", str(tmp_path / "w.apr")]) == 2


@pytest.mark.parametrize("argv", [["--quantize", "bogus"], ["--precision", "f8"], ["--compress", "gzip"],
                                  ["--validate", "sometimes"]])
def test_bad_options_are_usage_errors(model, tmp_path, argv):
    src, _ = model
    out = tmp_path / "o.apr"
    code = main(["convert", str(src), str(out), *argv]) if argv[0] == "--quantize" else None
    if code is None:
        with pytest.raises(SystemExit) as exc:
            main(["convert", str(src), str(out), *argv])
        code = exc.value.code
    assert code == 2 and not out.exists()


def test_no_output_or_two_outputs_is_a_usage_error(model, tmp_path):
    src, _ = model
    assert main(["convert", str(src)]) == 2
    assert main(["convert", str(src), str(tmp_path / "a.apr"), "-o", str(tmp_path / "b.apr")]) == 2


def test_missing_source_exits_3_and_junk_source_exits_4(tmp_path):
    assert main(["convert", str(tmp_path / "nope.safetensors"), str(tmp_path / "o.apr")]) == 3
    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"\x00garbage" * 4)
    assert main(["convert", str(junk), str(tmp_path / "o.apr")]) == 4
    assert not (tmp_path / "o.apr").exists()


@pytest.mark.parametrize("verb", ["convert", "import", "export"])
def test_help_names_only_quantize_types_that_are_accepted(verb, model, tmp_path, capsys):
    """issue 26 item 4: `apr export --help` offered q4_k when it exited 2; the list is the
    registry's, so every type it names (q4_k too, now that it quantizes) is accepted."""
    import re

    with pytest.raises(SystemExit):
        main([verb, "--help"])
    text = " ".join(capsys.readouterr().out.split())
    listed = re.search(r"quantize 2-D float tensors: (.*?); fp16", text).group(1)
    names = [n.split(" (")[0] for n in listed.split(", ")]
    assert {"q8_0", "q4_0", "q4_k", "int8", "int4"} <= set(names)
    src, _ = model
    for name in names:
        out = tmp_path / f"{verb}-{name}.gguf"
        if verb == "import":
            out = out.with_suffix(".apr")
        args = [verb, str(src), str(out), "--quantize", name, "--validate", "off", "--force"]
        assert main(args) != 2, name  # not a usage error: the type is accepted


def test_import_seed_spelling_from_and_output(tmp_path, rng, capsys):
    """seed 001 §13.2: `apr import model.safetensors --from safetensors --output model.apr`."""
    from safetensors.numpy import save_file

    tensors = {"w": rng.standard_normal((4, 4)).astype(np.float32)}
    save_file(tensors, str(tmp_path / "model.safetensors"))
    out = tmp_path / "model.apr"
    assert main(["import", str(tmp_path / "model.safetensors"), "--from", "safetensors", "--output", str(out)]) == 0
    assert aprfast.load_file(out)["w"].tobytes() == tensors["w"].tobytes()
    capsys.readouterr()
    # a source of another format than --from says is a usage error, nothing written
    assert main(["import", str(out), "--from", "gguf", "--output", str(tmp_path / "x.apr")]) == 2
    assert "--from gguf, but" in capsys.readouterr().err and not (tmp_path / "x.apr").exists()
    with pytest.raises(SystemExit) as exc:  # an unknown format is argparse's usage error
        main(["import", str(tmp_path / "model.safetensors"), "--from", "tflite", "-o", str(tmp_path / "y.apr")])
    assert exc.value.code == 2
