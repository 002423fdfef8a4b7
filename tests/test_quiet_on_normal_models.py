"""Issue 28 item 4: quiet on normal models.  Weights at std 0.02 (the usual
initializer_range) warned "std 0.0199 outside the expected 0.02-0.1" on most
projections, on every convert, one line per tensor, printed rounded as "std 0.02 outside
0.02-0.1"; converted aprender-layout files said param_count 0 and total_size 0.  (The
lint and diff halves are in test_cli_lint.py and test_cli_diff.py.)"""

from types import SimpleNamespace

import numpy as np
import pytest

import aprfast
from aprfast.cli import main
from aprfast.numerics.expectations import STD_TOLERANCE, check_expected, count_by_rule
from aprfast.stats import tensor_stats


def _stats(std, mean=0.0):
    return SimpleNamespace(nan_count=0, inf_count=0, count=1000, mean=mean, std=std)


@pytest.mark.parametrize("std", [0.0199, 0.02, 0.0176, 0.1, 0.11])
def test_std_near_the_bounds_is_not_a_warning(std):
    assert check_expected("layers.0.attn.q_proj.weight", _stats(std)).status == "PASS"


def test_sampled_initialisation_at_0_02_passes(rng):
    for i in range(12):
        w = rng.normal(0, 0.02, (256, 256)).astype(np.float32)
        assert check_expected(f"layers.{i}.attn.q_proj.weight", tensor_stats(w)).status == "PASS"


def test_outside_the_tolerance_warns_with_digits_that_show_the_side():
    low = 0.02 * (1 - STD_TOLERANCE)
    verdict = check_expected("x.q_proj.weight", _stats(low * 0.9999))
    assert verdict.status == "WARN"
    shown = verdict.reasons[0].split()[1]
    assert float(shown) < 0.02 and shown != "0.02"
    assert verdict.rules == ("attention weight: std outside the expected 0.02-0.1",)
    # a value that would round onto the bound prints more digits
    from aprfast.numerics import expectations

    assert expectations._shown(0.0199999, 0.02) != "0.02"


def test_count_by_rule_gives_one_group_per_rule():
    verdicts = [(f"l{i}.q_proj.weight", check_expected(f"l{i}.q_proj.weight", _stats(0.5))) for i in range(5)]
    verdicts.append(("l.fc1.weight", check_expected("l.fc1.weight", _stats(0.5, mean=0.3))))
    groups = dict(count_by_rule(verdicts))
    assert len(groups["attention weight: std outside the expected 0.02-0.1"]) == 5
    assert groups["linear weight: mean not ~0.0"] == ["l.fc1.weight"]


def test_convert_prints_one_line_per_rule_and_lists_them_with_verbose(tmp_path, rng, capsys):
    tensors = {f"layers.{i}.attn.{p}_proj.weight": rng.normal(0, 0.3, (32, 32)).astype(np.float32)
               for i in range(3) for p in "qkv"}
    src = tmp_path / "m.apr"
    aprfast.save_file(tensors, src)
    assert main(["convert", str(src), str(tmp_path / "a.safetensors")]) == 0
    out = capsys.readouterr().out
    warn_lines = [line for line in out.splitlines() if line.strip().startswith("WARN")]
    assert warn_lines == ["  WARN attention weight: std outside the expected 0.02-0.1: 9 tensor(s) "
                          "(layers.0.attn.k_proj.weight, layers.0.attn.q_proj.weight, layers.0.attn.v_proj.weight, "
                          "...)"]
    assert "--verbose" in out
    assert main(["convert", str(src), str(tmp_path / "b.safetensors"), "--verbose"]) == 0
    out = capsys.readouterr().out
    assert sum(line.strip().startswith("WARN layers.") for line in out.splitlines()) == 9


def test_converters_fill_param_count_and_total_size(tmp_path, rng):
    tensors = {"w": rng.normal(0, 0.02, (4, 256)).astype(np.float32), "b": np.zeros(4, np.float16)}
    aprfast.save_file(tensors, tmp_path / "m.safetensors".replace(".safetensors", ".apr"))
    counts = {"param_count": 4 * 256 + 4, "total_size": 4 * 256 * 4 + 4 * 2}
    # save_file writes what its caller gives, as aprender's AprV2Writer (byte identity): 0
    assert {k: aprfast.inspect(tmp_path / "m.apr")["metadata"][k] for k in counts} == \
        {"param_count": 0, "total_size": 0}
    aprfast.convert(tmp_path / "m.apr", tmp_path / "m.safetensors")
    aprfast.convert(tmp_path / "m.safetensors", tmp_path / "c.apr")
    with aprfast.open(tmp_path / "c.apr") as f:
        assert f.layout == "aprender" and {k: f.metadata[k] for k in counts} == counts
    # converted on, the counts describe each new file (and travel to no other format)
    aprfast.convert(tmp_path / "c.apr", tmp_path / "c.safetensors")
    assert (tmp_path / "c.safetensors").read_bytes() == (tmp_path / "m.safetensors").read_bytes()
    aprfast.convert(tmp_path / "c.apr", tmp_path / "h.apr", precision="f16")
    with aprfast.open(tmp_path / "h.apr") as f:
        assert f.metadata["param_count"] == counts["param_count"]
        assert f.metadata["total_size"] == (4 * 256 + 4) * 2
    assert main(["quantize", str(tmp_path / "c.apr"), str(tmp_path / "q.apr"), "--type", "apr_q8"]) == 0
    with aprfast.open(tmp_path / "q.apr") as f:
        assert f.layout == "aprender" and f.metadata["param_count"] == counts["param_count"]
        assert f.info("w").dtype_name == "APR_Q8"
        assert f.metadata["total_size"] == sum(f.info(n).nbytes for n in f.keys()) == 4 + 4 * 256 + 4 * 2
    from aprfast.tools.merge import merge_models

    merge_models([tmp_path / "m.apr", tmp_path / "c.apr"], tmp_path / "merged.apr")
    with aprfast.open(tmp_path / "merged.apr") as f:
        assert {k: f.metadata[k] for k in counts} == counts
