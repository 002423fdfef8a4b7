"""`apr lint`: every falsifiable guarantee of seed 001 §4.11 fails when it should
(no license: WARN, QA #52; non-canonical names; 32-byte alignment; a large
uncompressed tensor; non-zero padding) and a clean file has no findings."""

import json

import numpy as np
import pytest

import aprfast
from aprfast import v1
from aprfast.cli import main
from aprfast.cli.lint import lint_file

CLEAN_METADATA = {"license": "MIT", "model_card": "a test model", "provenance": "made by the test"}


def lint(path):
    with aprfast.open(path) as f:
        return lint_file(f, path)


def test_clean_file_has_no_findings(tmp_path, capsys):
    path = tmp_path / "m.apr"
    aprfast.save_file({"encoder.conv1.weight": np.ones((4, 4), np.float32)}, path, metadata=CLEAN_METADATA)
    assert main(["lint", str(path)]) == 0
    assert capsys.readouterr().out.strip() == f"{path}: no findings"


@pytest.mark.parametrize("missing", ["license", "model_card", "provenance"])
def test_each_missing_metadata_field_warns_and_exits_5(tmp_path, capsys, missing):
    path = tmp_path / "m.apr"
    metadata = {k: v for k, v in CLEAN_METADATA.items() if k != missing}
    aprfast.save_file({"encoder.weight": np.ones(4, np.float32)}, path, metadata=metadata)
    assert main(["lint", str(path)]) == 5
    out, err = capsys.readouterr()
    assert out.splitlines()[0] == f"[WARN] Metadata: Missing '{missing}' field"
    assert "1 finding(s) at WARN" in err
    assert main(["lint", str(path), "--fail-on", "never"]) == 0


def test_names_get_their_canonical_spelling(tmp_path):
    path = tmp_path / "m.apr"
    names = ["model.encoder.conv1.weight", "blk.0.attn_q.weight", "token_embd.weight", "encoder.w",
             "model.decoder.embed_tokens.weight", "/encoder/conv2/weight", "encoder.layer_norm.weight"]
    aprfast.save_file({n: np.ones(2, np.float32) for n in names}, path, metadata=CLEAN_METADATA)
    found = {x["tensor"]: x for x in lint(path) if x["category"] == "Tensor Naming"}
    assert set(found) == set(names) - {"encoder.layer_norm.weight"}
    assert found["model.encoder.conv1.weight"]["level"] == "INFO"  # a convention, not a failure (issue 28 item 4)
    assert found["model.encoder.conv1.weight"]["message"].endswith("canonical: 'encoder.conv1.weight'")
    assert found["blk.0.attn_q.weight"]["message"].endswith("canonical: 'layers.0.attn.q_proj.weight'")
    assert found["token_embd.weight"]["message"].endswith("canonical: 'token_embedding'")
    assert found["encoder.w"]["level"] == "INFO" and found["encoder.w"]["message"].endswith("'encoder.weight'")
    assert found["model.decoder.embed_tokens.weight"]["message"].endswith("canonical: 'decoder.token_embedding'")
    assert found["/encoder/conv2/weight"]["level"] == "INFO"


def test_info_findings_fail_only_with_fail_on_info(tmp_path, capsys):
    path = tmp_path / "m.apr"
    aprfast.save_file({"encoder.w": np.ones(2, np.float32)}, path, metadata=CLEAN_METADATA)
    assert main(["lint", str(path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [(x["level"], x["category"], x["tensor"]) for x in doc["findings"]] == \
        [("INFO", "Tensor Naming", "encoder.w")]
    assert main(["lint", str(path), "--fail-on", "info"]) == 5


def test_alignment_to_32_bytes_is_info(tmp_path):
    path = tmp_path / "m.apr"
    aprfast.save_file({"a": np.ones(3, np.float32), "b": np.ones(3, np.float32)}, path, layout="apr2", alignment=32,
                      metadata=CLEAN_METADATA)
    with aprfast.open(path) as f:
        offsets = [f.info(n).offset for n in f.keys()]
    unaligned = [x for x in lint(path) if x["category"] == "Efficiency"]
    assert any(o % 64 for o in offsets)  # the file really has a tensor off the 64-byte grid
    assert len(unaligned) == 1 and unaligned[0]["level"] == "INFO" and "aligned to 64 bytes" in unaligned[0]["message"]


def test_large_uncompressed_tensor_is_info_and_compressed_is_not(tmp_path):
    big = {"encoder.weight": np.zeros((600, 600), np.float32)}  # 1.44 MB
    plain, packed = tmp_path / "p.apr", tmp_path / "c.apr"
    aprfast.save_file(big, plain, metadata=CLEAN_METADATA)
    aprfast.save_file(big, packed, metadata=CLEAN_METADATA, compression="zstd")
    assert [x["tensor"] for x in lint(plain) if x["category"] == "Compression"] == ["encoder.weight"]
    assert not [x for x in lint(packed) if x["category"] == "Compression"]


def test_nonzero_padding_between_tensors_warns(tmp_path, capsys):
    path = tmp_path / "m.apr"
    aprfast.save_file({"a": np.ones(3, np.float32), "b": np.ones(3, np.float32)}, path, metadata=CLEAN_METADATA)
    with aprfast.open(path) as f:
        first = min((f.info(n) for n in f.keys()), key=lambda i: i.offset)
    assert not [x for x in lint(path) if x["category"] == "Padding"]
    data = bytearray(path.read_bytes())
    assert data[first.end] == 0
    data[first.end] = 0x5A
    path.write_bytes(bytes(data))
    assert main(["lint", str(path)]) == 5
    assert f"[WARN] Padding: non-zero bytes in the {64 - first.nbytes % 64}-byte gap at offset {first.end}" \
        in capsys.readouterr().out


def test_v1_file_gets_naming_and_metadata_checks(tmp_path):
    path = tmp_path / "v1.apr"
    v1.save_model({"model.encoder.w": np.ones(2, np.float32)}, path)
    categories = {x["category"] for x in lint(path)}
    assert categories == {"Metadata", "Tensor Naming"}


def test_missing_file_exits_3(tmp_path):
    assert main(["lint", str(tmp_path / "nope.apr")]) == 3


def test_a_hugging_face_named_model_passes_with_one_line_per_naming_rule(tmp_path, capsys):
    """Issue 28 item 4: 33 tensors keeping 'model.' were 33 WARN lines and exit 5."""
    path = tmp_path / "m.apr"
    names = [f"model.layers.{i}.self_attn.{p}_proj.weight" for i in range(8) for p in "qkvo"] + \
        ["model.embed_tokens.weight"]
    aprfast.save_file({n: np.ones(2, np.float32) for n in names}, path, metadata=CLEAN_METADATA)
    assert main(["lint", str(path)]) == 0
    out = capsys.readouterr().out
    naming = [line for line in out.splitlines() if "Tensor Naming" in line]
    assert len(naming) == 2
    assert any(line.startswith("[INFO] Tensor Naming: 32 tensors: source prefix 'model.'") for line in naming)
    assert "--verbose" in out
    assert main(["lint", str(path), "--verbose"]) == 0
    assert sum("Tensor Naming" in line for line in capsys.readouterr().out.splitlines()) == 33
