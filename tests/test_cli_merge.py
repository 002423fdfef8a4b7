"""`apr merge` and aprfast.tools.merge: average of [1.0] and [3.0] is [2.0] (QA #58), weighted,
slerp, TIES (trim, elect, disjoint mean: Yadav et al. 2023) and DARE (drop with p,
rescale by 1/(1-p): Yu et al. 2023) on hand-computed examples, dtypes kept, and the
refusals (mismatched models, missing base, existing output)."""

import json
import math

import numpy as np
import pytest

import aprfast
from aprfast.cli import main
from aprfast.tools.merge import merge_models


def save(path, tensors, metadata=None):
    aprfast.save_file(tensors, path, metadata=metadata)
    return str(path)


def load(path, name="w"):
    with aprfast.open(path) as f:
        return f.get_tensor(name).copy()


def test_average_of_one_and_three_is_two(tmp_path, capsys):
    a, b = save(tmp_path / "a.apr", {"w": np.array([1.0], np.float32)}), \
        save(tmp_path / "b.apr", {"w": np.array([3.0], np.float32)})
    out = tmp_path / "m.apr"
    assert main(["merge", a, b, "-o", str(out)]) == 0
    assert "average of 2 models, 1 tensors merged" in capsys.readouterr().out
    merged = load(out)
    assert merged.dtype == np.float32 and merged.tolist() == [2.0]
    with aprfast.open(out) as f:
        assert f.metadata["merge"]["method"] == "average" and f.metadata["merge"]["models"] == ["a.apr", "b.apr"]


def test_weighted_normalises_the_weights_and_keeps_f16(tmp_path):
    a = save(tmp_path / "a.apr", {"w": np.array([1.0, 2.0], np.float16)})
    b = save(tmp_path / "b.apr", {"w": np.array([3.0, 6.0], np.float16)})
    out = tmp_path / "m.apr"
    assert main(["merge", a, b, "-o", str(out), "--method", "weighted", "--weights", "3,1"]) == 0
    merged = load(out)
    assert merged.dtype == np.float16 and merged.tolist() == [1.5, 3.0]  # (3*1 + 3)/4, (3*2 + 6)/4


def test_slerp_of_orthogonal_unit_vectors(tmp_path):
    a = save(tmp_path / "a.apr", {"w": np.array([1.0, 0.0], np.float64)})
    b = save(tmp_path / "b.apr", {"w": np.array([0.0, 1.0], np.float64)})
    for t, expected in ((0.5, [math.sqrt(0.5)] * 2), (0.0, [1.0, 0.0]), (1.0, [0.0, 1.0]),
                        (1 / 3, [math.cos(math.pi / 6), math.sin(math.pi / 6)])):
        out = tmp_path / f"s{t}.apr"
        assert main(["merge", a, b, "-o", str(out), "--strategy", "slerp", "--t", str(t)]) == 0
        np.testing.assert_allclose(load(out), expected, atol=1e-12)
    # parallel vectors: the line, not a division by sin(0)
    c = save(tmp_path / "c.apr", {"w": np.array([2.0, 0.0], np.float64)})
    merge_models([a, c], tmp_path / "p.apr", method="slerp", t=0.5)
    np.testing.assert_allclose(load(tmp_path / "p.apr"), [1.5, 0.0])


TIES_MODELS = [[1.0, -2.0, 0.5, 0.0, 3.0], [-3.0, 1.0, 0.4, 0.2, 1.1], [2.0, 1.5, -0.1, 0.0, -0.5]]


@pytest.mark.parametrize("density, lam, expected", [
    # no trim: elected signs [0, +, +, +, +]; each entry the mean of the non-zero values agreeing with it
    (1.0, 1.0, [0.0, 1.25, 0.45, 0.2, 2.05]),
    # keep 2 of 5 per model: [0,-2,0,0,3], [-3,0,0,0,1.1], [2,1.5,0,0,0]; signs [-, -, 0, 0, +]
    (0.4, 1.0, [-3.0, -2.0, 0.0, 0.0, 2.05]),
    (0.4, 0.5, [-1.5, -1.0, 0.0, 0.0, 1.025]),
])
def test_ties_trims_elects_and_takes_the_disjoint_mean(tmp_path, density, lam, expected):
    base_value = 0.25
    base = save(tmp_path / "base.apr", {"w": np.full(5, base_value)})
    models = [save(tmp_path / f"m{i}.apr", {"w": np.array(v) + base_value}) for i, v in enumerate(TIES_MODELS)]
    out = tmp_path / "t.apr"
    assert main(["merge", *models, "--base", base, "-o", str(out), "--method", "ties", "--density", str(density),
                 "--lambda", str(lam)]) == 0
    np.testing.assert_allclose(load(out), np.array(expected) + base_value, atol=1e-12)


def test_dare_drops_with_p_and_rescales_survivors(tmp_path, rng):
    n = 20000
    base_w = rng.standard_normal(n)
    delta = rng.standard_normal(n)
    base = save(tmp_path / "base.apr", {"w": base_w})
    model = save(tmp_path / "m.apr", {"w": base_w + delta})
    out = tmp_path / "d.apr"
    assert main(["merge", model, "--base", base, "-o", str(out), "--method", "dare", "--density", "0.25",
                 "--seed", "7", "--weights", "1"]) == 0
    got = load(out) - base_w
    kept = got != 0
    np.testing.assert_allclose(got[kept], delta[kept] / 0.25, rtol=1e-12)  # survivors scaled by 1/(1-p)
    assert abs(kept.mean() - 0.25) < 0.02  # each entry kept with probability 1-p
    again = tmp_path / "d2.apr"
    merge_models([model], again, method="dare", base=base, density=0.25, seed=7, weights=[1])
    np.testing.assert_array_equal(load(again), load(out))  # the seed makes it reproducible
    merge_models([model], tmp_path / "d3.apr", method="dare", base=base, density=0.25, seed=8, weights=[1])
    assert not np.array_equal(load(tmp_path / "d3.apr"), load(out))


def test_dare_with_density_one_is_the_average(tmp_path):
    base = save(tmp_path / "base.apr", {"w": np.array([0.0, 1.0])})
    a = save(tmp_path / "a.apr", {"w": np.array([1.0, 3.0])})
    b = save(tmp_path / "b.apr", {"w": np.array([3.0, 5.0])})
    merge_models([a, b], tmp_path / "d.apr", method="dare", base=base, density=1.0)
    np.testing.assert_allclose(load(tmp_path / "d.apr"), [2.0, 4.0])


def test_equal_integer_tensors_are_copied_and_differing_ones_refused(tmp_path, capsys):
    a = save(tmp_path / "a.apr", {"w": np.array([1.0], np.float32), "ids": np.array([4, 5], np.int64)})
    b = save(tmp_path / "b.apr", {"w": np.array([3.0], np.float32), "ids": np.array([4, 5], np.int64)})
    out = tmp_path / "m.apr"
    assert main(["merge", a, b, "-o", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["copied"] == 1
    assert load(out, "ids").tolist() == [4, 5]
    c = save(tmp_path / "c.apr", {"w": np.array([3.0], np.float32), "ids": np.array([4, 6], np.int64)})
    assert main(["merge", a, c, "-o", str(tmp_path / "x.apr")]) == 4
    assert "not floating point and differs" in capsys.readouterr().err
    assert not (tmp_path / "x.apr").exists()


def test_models_with_other_tensors_or_shapes_are_refused(tmp_path):
    a = save(tmp_path / "a.apr", {"w": np.ones((2, 2), np.float32)})
    b = save(tmp_path / "b.apr", {"w": np.ones(4, np.float32)})
    c = save(tmp_path / "c.apr", {"v": np.ones((2, 2), np.float32)})
    assert main(["merge", a, b, "-o", str(tmp_path / "x.apr")]) == 4
    assert main(["merge", a, c, "-o", str(tmp_path / "x.apr")]) == 4
    assert not (tmp_path / "x.apr").exists()


@pytest.mark.parametrize("extra", [["--method", "ties"], ["--method", "slerp", "THIRD"], ["--weights", "1,x"],
                                   ["--method", "weighted"], ["--method", "weighted", "--weights", "1"],
                                   ["--method", "dare", "--base", "BASE", "--density", "0"],
                                   ["--base", "BASE"], ["--density", "0.5"], ["--t", "2", "--method", "slerp"],
                                   ["--weights", "1,2"], ["--t", "0.3"], ["--seed", "3"],
                                   ["--lambda", "2", "--method", "dare", "--base", "BASE"]])
def test_bad_options_are_usage_errors(tmp_path, extra):
    a = save(tmp_path / "a.apr", {"w": np.ones(2, np.float32)})
    b = save(tmp_path / "b.apr", {"w": np.ones(2, np.float32)})
    extra = [a if e in ("THIRD", "BASE") else e for e in extra]
    models = [a, b] + ([extra.pop()] if extra[-1] == a and "slerp" in extra else [])
    assert main(["merge", *models, "-o", str(tmp_path / "x.apr"), *extra]) == 2
    assert not (tmp_path / "x.apr").exists()


def test_existing_output_is_kept_without_force(tmp_path):
    a = save(tmp_path / "a.apr", {"w": np.array([1.0], np.float32)})
    b = save(tmp_path / "b.apr", {"w": np.array([3.0], np.float32)})
    out = tmp_path / "m.apr"
    out.write_bytes(b"old")
    assert main(["merge", a, b, "-o", str(out)]) == 1
    assert out.read_bytes() == b"old"
    assert main(["merge", a, b, "-o", str(out), "--force"]) == 0 and load(out).tolist() == [2.0]


def test_missing_input_exits_3(tmp_path):
    a = save(tmp_path / "a.apr", {"w": np.array([1.0], np.float32)})
    assert main(["merge", a, str(tmp_path / "nope.apr"), "-o", str(tmp_path / "m.apr")]) == 3


def test_quantized_inputs_are_dequantized_and_merged_as_f32(tmp_path, rng):
    w = rng.standard_normal((2, 64)).astype(np.float32)
    plain_a, plain_b = save(tmp_path / "a.apr", {"w": w}), save(tmp_path / "b.apr", {"w": -w})
    qa, qb = tmp_path / "qa.apr", tmp_path / "qb.apr"
    aprfast.convert(plain_a, qa, quantize="Q8_0")
    aprfast.convert(plain_b, qb, quantize="Q8_0")
    out = tmp_path / "m.apr"
    assert main(["merge", str(qa), str(qb), "-o", str(out)]) == 0
    merged = load(out)
    assert merged.dtype == np.float32 and merged.shape == (2, 64)
    np.testing.assert_allclose(merged, 0.0, atol=1e-6)  # Q8_0 of -w is exactly minus Q8_0 of w
