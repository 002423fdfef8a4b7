"""`apr trace`: a load traced tensor by tensor (bytes read, read/decode/stats spans, the
statistics of each tensor), as a table, --json and a Chrome trace; exit codes.  Times
are only checked to be present and non-negative, never against a clock."""

import json

import numpy as np
import pytest

import aprfast
from aprfast.cli import main
from aprfast.cli._common import clean
from aprfast.numerics.stats import tensor_stats


@pytest.fixture
def tensors(rng):
    return {"a.weight": rng.standard_normal((32, 16)).astype(np.float32),
            "b.bias": np.arange(8, dtype=np.float16),
            "c.step": np.array(5, np.int64)}


@pytest.fixture
def model(tmp_path, tensors):
    path = tmp_path / "m.apr"
    aprfast.save_file(tensors, path, layout="apr2")
    return path


def trace_json(capsys, *argv):
    assert main(["trace", "--json", *argv]) == 0
    return json.loads(capsys.readouterr().out)


def test_json_trace_counts_bytes_and_carries_each_tensors_stats(model, tensors, capsys):
    trace = trace_json(capsys, str(model))
    assert [t["name"] for t in trace["tensors"]] == sorted(tensors)
    with aprfast.open(model) as f:
        for t in trace["tensors"]:
            assert t["bytes_read"] == f.info(t["name"]).nbytes
            assert t["stats"] == clean(tensor_stats(tensors[t["name"]]).as_dict())
            assert t["dtype"] == f.info(t["name"]).dtype_name and t["steps"] == ["view"]
            for key in ("read_us", "decode_us", "stats_us"):
                assert t[key] >= 0
            assert t["read_at_us"] <= t["decode_at_us"] <= t["stats_at_us"]  # in the order they ran
    assert trace["bytes_read"] == sum(t["bytes_read"] for t in trace["tensors"])
    assert trace["verify"]["us"] >= 0 and trace["open"]["us"] >= 0 and trace["layout"] == "apr2"


def test_no_verify_skips_the_whole_file_check(model, capsys):
    assert trace_json(capsys, "--no-verify", str(model))["verify"] is None


def test_chrome_trace_events(model, tmp_path, tensors, capsys):
    out = tmp_path / "trace.json"
    assert main(["trace", "--chrome", str(out), str(model)]) == 0
    capsys.readouterr()
    doc = json.loads(out.read_text())
    spans = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert all(isinstance(e["ts"], (int, float)) and e["dur"] >= 0 and e["pid"] == 1 for e in spans)
    names = {e["name"] for e in spans}
    for name in tensors:
        assert {f"read {name}", f"decode {name}", f"stats {name}"} <= names
    assert {"open", "verify"} <= names
    threads = {e["args"]["name"] for e in doc["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"}
    assert threads == {"file", "read", "decode", "stats"}
    assert [e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "process_name"] == [str(model)]
    stats = next(e for e in spans if e["name"] == "stats a.weight")["args"]
    assert stats["count"] == 512


def test_chrome_file_is_not_replaced_without_force(model, tmp_path, capsys):
    out = tmp_path / "trace.json"
    out.write_text("mine")
    assert main(["trace", "--chrome", str(out), str(model)]) == 1
    assert out.read_text() == "mine" and "--force" in capsys.readouterr().err
    assert main(["trace", "--chrome", str(out), "--force", str(model)]) == 0
    assert "traceEvents" in json.loads(out.read_text())


def test_text_table(model, capsys):
    assert main(["trace", str(model)]) == 0
    out = capsys.readouterr().out
    assert "decode = view" in out and "read ms" in out
    line = next(x for x in out.splitlines() if x.startswith("a.weight"))
    assert "F32" in line and "32x16" in line and "2048" in line
    assert out.splitlines()[-1].startswith("TOTAL 2072 bytes read")  # 2048 (f32) + 16 (f16) + 8 (i64)


def test_compressed_and_encrypted_files_name_their_decode_steps(tmp_path, tensors, capsys, monkeypatch):
    packed = tmp_path / "z.apr"
    aprfast.save_file(tensors, packed, layout="apr2", compression="zstd")
    trace = trace_json(capsys, str(packed))
    assert trace["decode_steps"] == ["decompress"]
    assert trace["tensors"][0]["stats"] == clean(tensor_stats(tensors["a.weight"]).as_dict())
    sealed = tmp_path / "e.apr"
    aprfast.save_file(tensors, sealed, password="pw")
    monkeypatch.setenv("APR_TEST_PW", "pw")
    trace = trace_json(capsys, "--password-env", "APR_TEST_PW", str(sealed))
    assert trace["decode_steps"] == ["decrypt", "check chunks"]
    assert trace["tensors"][0]["stats"] == clean(tensor_stats(tensors["a.weight"]).as_dict())
    assert main(["trace", str(sealed)]) == 4  # no key


def test_a_flipped_data_byte_fails_the_verify_span(model, capsys):
    with aprfast.open(model) as f:
        at = f.info("a.weight").offset + 1
    with open(model, "r+b") as fh:
        fh.seek(at)
        byte = fh.read(1)[0]
        fh.seek(at)
        fh.write(bytes([byte ^ 1]))
    assert main(["trace", str(model)]) == 4
    assert "E004" in capsys.readouterr().err
    assert main(["trace", "--no-verify", str(model)]) == 0


def test_missing_file_exits_3(tmp_path):
    assert main(["trace", str(tmp_path / "absent.apr")]) == 3


def test_diff_of_identical_models_shows_zero_drift(model, tmp_path, capsys):
    copy = tmp_path / "copy.apr"
    copy.write_bytes(model.read_bytes())
    assert main(["trace", str(model), "--diff", str(copy)]) == 0  # §11 #75
    out = capsys.readouterr().out
    assert "No drift: every tensor matches" in out
    assert main(["trace", "--json", str(model), "--diff", str(copy)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [r["drift"] for r in report["tensors"] if r["name"] != "c.step"] == [0.0, 0.0]
    assert {r["status"] for r in report["tensors"]} == {"MATCH"}
    assert report["divergence"] is None and report["identical_within_tolerance"] is True


def test_diff_finds_the_changed_tensor(tmp_path, tensors, capsys):
    a, b = tmp_path / "a.apr", tmp_path / "b.apr"
    aprfast.save_file(tensors, a, layout="apr2")
    changed = dict(tensors, **{"b.bias": tensors["b.bias"] + np.float16(1)})
    del changed["c.step"]
    aprfast.save_file(changed, b, layout="apr2")
    assert main(["trace", "--json", str(a), "--diff", str(b)]) == 5
    report = json.loads(capsys.readouterr().out)
    row = next(r for r in report["tensors"] if r["name"] == "b.bias")
    assert row["status"] == "DRIFT" and row["drift"] == pytest.approx(1.0)
    assert report["divergence"] == "b.bias" and report["only_in_a"] == ["c.step"]
    assert main(["trace", str(a), "--diff", str(b), "--tolerance", "2"]) == 5  # c.step is still missing
    out = capsys.readouterr().out
    assert "only in" in out and "c.step" in out
    assert main(["trace", str(a), "--diff", str(b), "--tolerance", "nan"]) == 2


def test_diff_chrome_trace_has_one_process_per_file(model, tmp_path, capsys):
    out = tmp_path / "t.json"
    assert main(["trace", str(model), "--diff", str(model), "--chrome", str(out)]) == 0
    capsys.readouterr()
    doc = json.loads(out.read_text())
    assert {e["pid"] for e in doc["traceEvents"]} == {1, 2}


def test_v1_container_is_decoded_at_open(tmp_path, tensors, capsys):
    from aprfast import v1

    path = tmp_path / "v1.apr"
    v1.save_model({"a.weight": tensors["a.weight"]}, path, compression="zstd")
    trace = trace_json(capsys, str(path))
    assert trace["layout"] == "v1" and trace["decode_steps"] == ["decompress"]
    (entry,) = trace["tensors"]
    assert entry["bytes_read"] is None and entry["read_us"] is None  # offsets are inside the payload
    assert entry["stats"] == clean(tensor_stats(tensors["a.weight"]).as_dict())
