"""`apr validate --quality`, `--min-score`, `--shapes` and aprfast.tools.quality.quality_report:
each §11 falsification that one file can show moves its item to FAIL, items that need
a runtime stay N/A and out of the denominator, and the exit codes follow Appendix A."""

import json
import struct

import numpy as np
import pytest

import aprfast
from aprfast.cli import main
from aprfast.numerics.quantization import quantize
from aprfast.tools import quality
from aprfast.tools.quality import quality_report, shape_checks

RUNTIME_ITEMS = (36, 39, 40, 43, 44, 45, 46, 47, 100)


def whisperish(rng, n_vocab=64, d=32):
    return {"encoder.conv1.weight": (0.05 * rng.standard_normal((d, 8, 3))).astype(np.float32),
            "encoder.layer_norm.weight": (1 + 0.05 * rng.standard_normal(d)).astype(np.float32),
            "encoder.layer_norm.bias": (0.01 * rng.standard_normal(d)).astype(np.float32),
            "encoder.layers.0.fc1.weight": (0.03 * rng.standard_normal((d, d))).astype(np.float32),
            "decoder.token_embedding.weight": (0.03 * rng.standard_normal((n_vocab, d))).astype(np.float32),
            "decoder.positional_embedding": (0.015 * rng.standard_normal((16, d))).astype(np.float32)}


META = {"n_vocab": 64, "n_mels": 8, "n_text_ctx": 16, "n_text_state": 32, "license": "MIT", "model_card": "a test",
        "provenance": "tests/test_cli_quality.py"}


@pytest.fixture(autouse=True)
def no_clock(monkeypatch):
    """Item 51 times `inspect`; a loaded CI machine must not change a test's result."""
    monkeypatch.setattr(quality, "INSPECT_BUDGET_S", float("inf"))


@pytest.fixture
def model(tmp_path, rng):
    path = tmp_path / "m.apr"
    aprfast.save_file(whisperish(rng), path, metadata=META, layout="apr2")
    return path


def item(report, number):
    return next(i for i in report["items"] if i["item"] == number)


def offset_of(path, name):
    with aprfast.open(path) as f:
        return f.info(name).offset


def test_healthy_model_scores_every_applicable_item(model):
    report = quality_report(model)
    assert len(report["items"]) == 100
    assert report["failed"] == 0 and report["score"] == 100 and report["grade"] == "EXCELLENT"
    for number in (1, 2, 3, 4, 5, 6, 7, 13, 14, 18, 19, 21, 22, 26, 27, 28, 29, 31, 32, 33, 48, 49, 86, 87, 95):
        assert item(report, number)["status"] == "PASS", item(report, number)
    assert {r["key"] for r in report["shapes"]} == {"n_vocab", "n_mels", "n_text_ctx", "n_text_state"}


def test_runtime_items_are_not_applicable_and_left_out_of_the_score(model):
    report = quality_report(model)
    for number in RUNTIME_ITEMS:
        assert item(report, number)["status"] == "N/A"
        assert "runtime" in item(report, number)["detail"]
    applicable = [i for i in report["items"] if i["status"] != "N/A"]
    assert report["applicable"] == len(applicable) < 100
    assert report["not_applicable"] == 100 - len(applicable)
    assert report["passed"] == sum(i["status"] == "PASS" for i in applicable)
    assert sum(c["applicable"] for c in report["categories"].values()) == report["applicable"]


def test_layernorm_mean_11_fails_item_28_and_lowers_the_score(tmp_path, rng):
    tensors = whisperish(rng)
    tensors["encoder.layer_norm.weight"] = np.full(32, 11.0, np.float32)  # §10.11's failure mode
    path = tmp_path / "ln.apr"
    aprfast.save_file(tensors, path, metadata=META, layout="apr2")
    report = quality_report(path)
    assert item(report, 28)["status"] == "FAIL" and "encoder.layer_norm.weight" in item(report, 28)["detail"]
    assert report["failed"] == 1
    assert report["score"] == round(100 * (report["applicable"] - 1) / report["applicable"])


def test_flipped_payload_bit_fails_the_checksum_item(model):
    at = offset_of(model, "encoder.layers.0.fc1.weight") + 3
    with open(model, "r+b") as fh:
        fh.seek(at)
        byte = fh.read(1)[0]
        fh.seek(at)
        fh.write(bytes([byte ^ 0x10]))
    report = quality_report(model)
    assert item(report, 4)["status"] == "FAIL" and "E004" in item(report, 4)["detail"]


def test_injected_nan_and_inf_fail_items_26_and_27(model):
    at = offset_of(model, "encoder.layers.0.fc1.weight")
    with open(model, "r+b") as fh:
        fh.seek(at)
        fh.write(struct.pack("<II", 0x7FC00000, 0x7F800000))
    report = quality_report(model)
    assert item(report, 26)["status"] == "FAIL" and item(report, 27)["status"] == "FAIL"


def test_n_vocab_mismatch_fails_item_33_and_validate_shapes(tmp_path, rng, capsys):
    path = tmp_path / "vocab.apr"
    aprfast.save_file(whisperish(rng), path, metadata=dict(META, n_vocab=65), layout="apr2")
    assert item(quality_report(path), 33)["status"] == "FAIL"
    assert main(["validate", "--shapes", str(path)]) == 5
    out, err = capsys.readouterr()
    assert "[FAIL] shapes" in out and "n_vocab=65" in out and "decoder.token_embedding.weight" in out
    assert "shapes failed" in err
    assert main(["validate", "--shapes", "--json", str(path)]) == 5
    check = json.loads(capsys.readouterr().out)["checks"][0]
    assert check["name"] == "shapes" and check["status"] == "FAIL"
    assert check["comparisons"][0]["actual"] == 64


def test_truncated_positional_embedding_fails_the_context_item(tmp_path, rng):
    tensors = whisperish(rng)
    tensors["decoder.positional_embedding"] = tensors["decoder.positional_embedding"][:15]
    path = tmp_path / "pos.apr"
    aprfast.save_file(tensors, path, metadata=META, layout="apr2")
    assert item(quality_report(path), 49)["status"] == "FAIL"


def test_shapes_without_metadata_sizes_compares_nothing_and_passes(tmp_path, rng, capsys):
    path = tmp_path / "bare.apr"
    aprfast.save_file(whisperish(rng), path, layout="apr2")
    assert main(["validate", "--shapes", str(path)]) == 0
    assert "nothing to compare" in capsys.readouterr().out
    assert item(quality_report(path), 33)["status"] == "N/A"


def test_shape_checks_reads_the_named_dimension(rng):
    class Info:
        def __init__(self, name, shape):
            self.name, self.shape = name, shape

    rows = shape_checks({"n_mels": 80}, [Info("encoder.conv1.weight", (384, 80, 3))])
    assert rows == [{"key": "n_mels", "value": 80, "tensor": "encoder.conv1.weight", "dim": 1, "actual": 80,
                     "status": "PASS", "item": 48}]
    assert shape_checks({"n_mels": True}, [Info("encoder.conv1.weight", (384, 1, 3))]) == []  # bool is no size


def test_q8_0_byte_minus_128_fails_item_34(tmp_path, rng):
    tensors = whisperish(rng)
    tensors["decoder.w"] = quantize((0.1 * rng.standard_normal((4, 64))).astype(np.float32), "q8_0")
    path = tmp_path / "q8.apr"
    aprfast.save_file(tensors, path, metadata=META, layout="apr2")
    assert item(quality_report(path), 34)["status"] == "PASS"
    with open(path, "r+b") as fh:
        fh.seek(offset_of(path, "decoder.w") + 2 + 5)  # block 0: f16 scale, then 32 int8 values
        fh.write(b"\x80")
    assert item(quality_report(path), 34)["status"] == "FAIL"


def test_undefined_flag_bit_fails_item_11(model):
    with open(model, "r+b") as fh:
        fh.seek(8)  # APR2 header: magic, u16 major, u16 minor, u32 flags
        flags = struct.unpack("<I", fh.read(4))[0]
        fh.seek(8)
        fh.write(struct.pack("<I", flags | 0x4000))
    report = quality_report(model)
    assert item(report, 11)["status"] == "FAIL" and "0x4000" in item(report, 11)["detail"]


def test_inspect_over_budget_fails_item_51(model, monkeypatch):
    monkeypatch.setattr(quality, "INSPECT_BUDGET_S", 0.0)
    assert item(quality_report(model), 51)["status"] == "FAIL"
    assert "ms" in item(quality_report(model), 51)["detail"]


def test_unreadable_file_scores_zero(tmp_path):
    path = tmp_path / "junk.apr"
    path.write_bytes(b"APR2" + b"\xff" * 60)
    report = quality_report(path)
    assert report["score"] == 0 and report["error"]["code"].startswith("E00")


def test_cli_quality_text_json_and_min_score(model, capsys):
    assert main(["validate", "--quality", str(model)]) == 0
    out = capsys.readouterr().out
    assert "100-Point Quality Assessment" in out and "TOTAL: 100/100 (EXCELLENT)" in out
    assert main(["validate", "--quality", "--min-score", "100", "--json", str(model)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["score"] == 100 and report["min_score"] == 100 and report["ok"] is True
    assert [i["item"] for i in report["items"]] == list(range(1, 101))


def test_cli_score_below_min_score_exits_5(tmp_path, rng, capsys):
    path = tmp_path / "nolicense.apr"
    aprfast.save_file(whisperish(rng), path, metadata={"n_vocab": 64}, layout="apr2")
    score = quality_report(path)["score"]
    assert score < 100
    assert main(["validate", "--quality", "--min-score", str(score), str(path)]) == 0
    capsys.readouterr()
    assert main(["validate", "--quality", "--min-score", str(score + 1), str(path)]) == 5
    out, err = capsys.readouterr()
    assert f"TOTAL: {score}/100" in out and "[FAIL] #86 Metadata Copy" in out
    assert f"below --min-score {score + 1}" in err


def test_cli_exit_codes_for_bad_arguments_and_missing_files(model, tmp_path, capsys):
    assert main(["validate", "--min-score", "50", str(model)]) == 2  # needs --quality
    assert main(["validate", "--quality", str(tmp_path / "absent.apr")]) == 3
    junk = tmp_path / "junk.apr"
    junk.write_bytes(b"\0" * 64)
    assert main(["validate", "--quality", str(junk)]) == 5
    assert "quality score 0/100" in capsys.readouterr().err


def test_embedded_tokenizer_vocabulary_and_special_ids(tmp_path, rng):
    meta = dict(META, **{"tokenizer.vocabulary": [f"t{i}" for i in range(64)], "tokenizer.vocab_size": 64,
                         "tokenizer.eos_token_id": 63})
    path = tmp_path / "tok.apr"
    aprfast.save_file(whisperish(rng), path, metadata=meta, layout="apr2")
    report = quality_report(path)
    assert item(report, 84)["status"] == "PASS" and item(report, 85)["status"] == "PASS"
    meta["tokenizer.eos_token_id"] = 64  # one past the vocabulary
    meta["tokenizer.vocabulary"] = meta["tokenizer.vocabulary"][:-1]  # truncated (§11 #84)
    aprfast.save_file(whisperish(rng), path, metadata=meta, layout="apr2")
    report = quality_report(path)
    assert item(report, 84)["status"] == "FAIL" and "63 tokens" in item(report, 84)["detail"]
    assert item(report, 85)["status"] == "FAIL" and "eos_token_id=64" in item(report, 85)["detail"]


def test_sealed_file_scores_with_its_key_and_needs_it(tmp_path, rng, monkeypatch, capsys):
    path = tmp_path / "sealed.apr"
    aprfast.save_file(whisperish(rng), path, metadata=META, password="pw", encrypt_names=True)
    report = quality_report(path, password="pw")
    assert item(report, 24)["status"] == "PASS" and item(report, 4)["status"] == "PASS"
    assert item(report, 28)["status"] == "PASS" and report["failed"] == 0
    monkeypatch.setenv("APR_TEST_PW", "pw")
    assert main(["validate", "--quality", "--password-env", "APR_TEST_PW", "--json", str(path)]) == 0
    assert json.loads(capsys.readouterr().out)["score"] == 100
    assert main(["validate", "--quality", str(path)]) == 4  # no key: E005, not a score
    assert "E005" in capsys.readouterr().err


def test_progress_reports_tensor_bytes_up_to_the_total(model):
    calls = []
    quality_report(model, progress=lambda done, total: calls.append((done, total)))
    with aprfast.open(model) as f:
        total = sum(f.info(n).nbytes for n in f.keys())
    assert len(calls) == 6 and calls[-1] == (total, total)
    assert [d for d, _ in calls] == sorted(d for d, _ in calls)


def test_v1_container_scores_what_applies_to_it(tmp_path, rng):
    from aprfast import v1

    path = tmp_path / "v1.apr"
    # aprender's v1 Metadata is a typed struct: model sizes live in its `custom` table
    v1_meta = {"custom": {k: v for k, v in META.items() if k not in ("license", "model_card")}}
    v1.save_model(whisperish(rng), path, metadata=v1_meta, compression="zstd")
    report = quality_report(path)
    assert item(report, 8)["status"] == "PASS" and item(report, 4)["status"] == "PASS"
    assert item(report, 6)["status"] == "N/A" and item(report, 22)["status"] == "N/A"  # one payload, no extents
    assert item(report, 28)["status"] == "PASS" and item(report, 33)["status"] == "PASS"
    plain = tmp_path / "v1-plain.apr"
    v1.save_model(whisperish(rng), plain, metadata=v1_meta)
    assert item(quality_report(plain), 8)["status"] == "N/A"


def test_non_zero_padding_fails_item_22_and_extended_file_fails_to_open(tmp_path):
    path = tmp_path / "pad.apr"
    aprfast.save_file({"a": np.ones(3, np.float32), "b": np.ones(5, np.float32)}, path, layout="apr2")
    with aprfast.open(path) as f:
        gap_start, gap_end = f.info("a").end, f.info("b").offset
    assert gap_end > gap_start and item(quality_report(path), 22)["status"] == "PASS"
    with open(path, "r+b") as fh:
        fh.seek(gap_start)
        fh.write(b"\xff" * (gap_end - gap_start))  # §11 #22: "fill padding with 0xFF"
    assert item(quality_report(path), 22)["status"] == "FAIL"
    with open(path, "ab") as fh:
        fh.write(b"garbage")  # §11 #13: the footer no longer ends the file
    report = quality_report(path)
    assert report["score"] == 0 and report["error"]["code"] == "E002"


def test_validate_shapes_reads_a_v1_containers_custom_sizes(tmp_path, rng, capsys):
    from aprfast import v1

    path = tmp_path / "v1.apr"
    v1.save_model(whisperish(rng), path, metadata={"custom": {"n_vocab": 63}})
    assert main(["validate", "--shapes", str(path)]) == 5
    assert "n_vocab=63 but decoder.token_embedding.weight dim 0 is 64" in capsys.readouterr().out
