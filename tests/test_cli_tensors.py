"""`apr tensors`: listing with --filter, --stats with PASS/WARN/FAIL against seed 001
§10.9 (exit 5 on FAIL), --hist, --json; in-process and as a real command."""

import json

import numpy as np

import aprfast
from aprfast.cli import main
from aprfast.cli.tensors import list_tensors

APR = "import sys; from aprfast.cli import main; sys.exit(main(sys.argv[1:]))"


def model(tmp_path, rng, ln_mean=1.0, bias=0.0, embed_std=0.03):
    tensors = {
        "encoder.layer_norm.weight": (ln_mean + 0.05 * rng.standard_normal(384)).astype(np.float32),
        "encoder.layer_norm.bias": np.full(384, bias, np.float32),
        "decoder.token_embedding.weight": (embed_std * rng.standard_normal((50, 16))).astype(np.float32),
        "encoder.layers.0.self_attn.q_proj.weight": (0.05 * rng.standard_normal((16, 16))).astype(np.float16),
        "encoder.layers.0.fc1.weight": aprfast.quantize((0.03 * rng.standard_normal((16, 64))).astype(np.float32),
                                                        "q8_0"),
    }
    path = tmp_path / "m.apr"
    aprfast.save_file(tensors, path, layout="apr2")
    return str(path)


def test_list_and_filter(tmp_path, rng, capsys):
    path = model(tmp_path, rng)
    assert main(["tensors", path]) == 0
    out = capsys.readouterr().out
    assert len(out.splitlines()) == 5 and "Q8_0" in out and "384" in out
    assert main(["tensors", "--filter", "*layer_norm*", "--json", path]) == 0
    rows = json.loads(capsys.readouterr().out)["tensors"]
    assert [r["name"] for r in rows] == ["encoder.layer_norm.bias", "encoder.layer_norm.weight"]
    assert rows[1] == {"name": "encoder.layer_norm.weight", "dtype": "F32", "shape": [384], "nbytes": 1536}


def test_healthy_stats_pass(tmp_path, rng, capsys):
    path = model(tmp_path, rng)
    assert main(["tensors", "--stats", path]) == 0
    out = capsys.readouterr().out
    assert out.count("[PASS]") == 5, out
    assert main(["tensors", "--stats", "--json", path]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)["tensors"]}
    ln = rows["encoder.layer_norm.weight"]
    assert ln["status"] == "PASS" and ln["role"] == "layernorm weight"
    assert ln["stats"]["count"] == 384 and 0.9 < ln["stats"]["mean"] < 1.1
    assert rows["encoder.layer_norm.bias"]["stats"]["sparsity"] == 1.0


def test_layernorm_mean_11_fails_with_exit_5(tmp_path, rng, capsys):
    path = model(tmp_path, rng, ln_mean=11.0)  # QA #28
    assert main(["tensors", "--stats", path]) == 5
    out, err = capsys.readouterr()
    line = next(line for line in out.splitlines() if "encoder.layer_norm.weight" in line)
    assert line.startswith("[FAIL]")
    assert "mean 11" in out and "outside [0.5, 3.0]" in out
    assert "encoder.layer_norm.weight" in err
    assert main(["tensors", "--stats", "--json", path]) == 5
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)["tensors"]}
    assert rows["encoder.layer_norm.weight"]["status"] == "FAIL"
    assert rows["encoder.layer_norm.bias"]["status"] == "PASS"


def test_bias_and_embedding_falsifications(tmp_path, rng, capsys):
    path = model(tmp_path, rng, bias=5.0, embed_std=1.0)  # QA #29, #30
    assert main(["tensors", "--stats", "--json", path]) == 5
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)["tensors"]}
    assert rows["encoder.layer_norm.bias"]["status"] == "FAIL"
    embedding = rows["decoder.token_embedding.weight"]  # QA #30: "should warn"
    assert embedding["status"] == "WARN" and embedding["reasons"][0].endswith("above 0.2")


def test_histogram(tmp_path, rng, capsys):
    path = model(tmp_path, rng, ln_mean=11.0)
    assert main(["tensors", "--hist", "encoder.layer_norm.weight", "--bins", "10", path]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Distribution: encoder.layer_norm.weight (shape: [384], F32)")
    bars = [line for line in out.splitlines() if line.lstrip().startswith("[")]
    assert len(bars) == 10 and sum(int(b.split()[-1]) for b in bars) == 384
    assert "Mean: 11" in out
    assert main(["tensors", "--hist", "encoder.layer_norm.weight", "--json", path]) == 0
    stats = json.loads(capsys.readouterr().out)["stats"]
    assert len(stats["histogram"]) == 20 and sum(stats["histogram"]) == 384


def test_histogram_of_a_missing_tensor_suggests_names(tmp_path, rng, capsys):
    path = model(tmp_path, rng)
    assert main(["tensors", "--hist", "encoder.layer_nrom.weight", path]) == 1
    err = capsys.readouterr().err
    assert "did you mean" in err and "encoder.layer_norm.weight" in err
    assert main(["tensors", "--hist", "encoder.layer_norm.weight", "--bins", "0", path]) == 2


def test_list_tensors_api(tmp_path, rng):
    with aprfast.open(model(tmp_path, rng)) as f:
        rows = list_tensors(f, pattern="*.fc1.*", stats=True)
    assert len(rows) == 1 and rows[0]["status"] == "PASS" and rows[0]["stats"]["count"] == 16 * 64


def test_missing_and_corrupt_files(tmp_path, capsys):
    assert main(["tensors", str(tmp_path / "none.apr")]) == 3
    (tmp_path / "x.apr").write_bytes(b"APR2" + bytes(10))
    assert main(["tensors", "--stats", str(tmp_path / "x.apr")]) == 4
    assert "apr: [E" in capsys.readouterr().err


def test_as_a_real_command(tmp_path, rng, run_child):
    path = model(tmp_path, rng, ln_mean=11.0)
    done = run_child(APR, "tensors", "--stats", "--json", path)
    assert done.returncode == 5
    rows = {r["name"]: r["status"] for r in json.loads(done.stdout)["tensors"]}
    assert rows["encoder.layer_norm.weight"] == "FAIL"
    done = run_child(APR, "tensors", "--hist", "encoder.layer_norm.weight", path)
    assert done.returncode == 0 and "Distribution:" in done.stdout
