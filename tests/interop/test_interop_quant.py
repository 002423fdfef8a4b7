"""aprender's APR_Q8 / APR_Q4 quantizers against the real crate: apr-format 0.72.3's
add_q8_tensor / add_q4_tensor (through the harness) must write exactly the bytes
aprfast's kernels produce, on every kernel path."""

import hashlib
import json
import subprocess

import numpy as np
import pytest
from test_quant_kernels import ADVERSARIAL, F32, PATHS, ours_quantize, random_floats


def crate_tensor_sha256(harness_bin, tmp_path, tensors: dict[str, np.ndarray], as_: str) -> dict[str, str]:
    """sha256 of each tensor's bytes as apr-format writes them (write-v2, then read)."""
    spec = {
        "metadata": {"model_type": "quant_kernels"},
        "tensors": [{"name": name, "shape": [int(x.size)], "f32_hex": np.asarray(x, "<f4").tobytes().hex(),
                     "as": as_} for name, x in tensors.items()],
    }
    spec_path, out_path = tmp_path / f"{as_}.json", tmp_path / f"{as_}.apr"
    spec_path.write_text(json.dumps(spec))
    for args in (("write-v2", spec_path, out_path), ("read", out_path)):
        proc = subprocess.run([str(harness_bin), *map(str, args)], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        result = json.loads(proc.stdout)
        assert result["ok"], result
    return {t["name"]: t["sha256"] for t in result["tensors"]}


def crate_inputs() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(31337)
    tensors = {f"random{n:04d}": random_floats(rng, n) for n in (1, 7, 31, 32, 33, 95, 500, 1000)}
    tensors["empty"] = np.zeros(0, F32)
    for i, (_name, block) in enumerate(ADVERSARIAL.items()):
        tensors[f"adv{i:02d}"] = np.concatenate([block, np.linspace(-2, 2, 45, dtype=F32)])
        tensors[f"adv{i:02d}alone"] = block
    tensors["wide"] = (rng.standard_normal(900) * 10.0 ** rng.integers(-30, 30, 900)).astype(F32)
    return tensors


@pytest.mark.parametrize(("as_", "type_name"), (("q8", "APR_Q8"), ("q4", "APR_Q4")))
def test_apr_quantize_matches_the_crate(harness_bin, tmp_path, as_, type_name):
    tensors = crate_inputs()
    if as_ == "q4":
        # add_q4_tensor panics when >= 1024 elements are > 99 % zero nibbles; ours stay below 1024.
        assert all(x.size < 1024 for x in tensors.values())
    crate = crate_tensor_sha256(harness_bin, tmp_path, tensors, as_)
    for path in PATHS:
        for name, x in tensors.items():
            ours = hashlib.sha256(ours_quantize(type_name, x, path=path).tobytes()).hexdigest()
            assert ours == crate[name], f"{type_name} {name} on {path}"


