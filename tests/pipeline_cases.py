"""What tests/test_dask_pipeline.py and tests/test_ray_pipeline.py share: the example
(examples/dask_pipeline.py, loaded by path), a directory of models in every form it takes
(a single .apr, a safetensors file, a sharded .apr model), and the checks of what the
pipeline wrote to S3, whichever engine scheduled the tasks."""

import importlib.util
import os

import numpy as np

import aprfast

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLE = os.path.join(os.path.dirname(HERE), "examples", "dask_pipeline.py")
NAMES = ("alpha", "beta", "gamma")
#: What each model's task receives: an open handle for the .apr models, the path otherwise.
RECEIVED = ["AprFile", "str", "ShardedFile"]


def load_example():
    spec = importlib.util.spec_from_file_location("dask_pipeline", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def models(rng):
    return {
        "alpha": {"attn.weight": rng.standard_normal((64, 128), dtype=np.float32),
                  "attn.bias": rng.standard_normal(64, dtype=np.float32),
                  "embed.weight": rng.standard_normal((32, 64)).astype(np.float16),
                  "odd.weight": rng.standard_normal((8, 40), dtype=np.float32),  # 40: not whole Q8_0 blocks
                  "step": np.array([7], np.int64)},
        "beta": {"mlp.up.weight": rng.standard_normal((96, 64), dtype=np.float32),
                 "norm.weight": np.ones(96, np.float32)},
        "gamma": {f"layers.{i}.weight": rng.standard_normal((128, 64), dtype=np.float32) for i in range(3)},
    }


def write_models(src, tensors) -> None:
    """alpha.apr, beta.safetensors and gamma as 3 shards + manifest, into ``src``."""
    from safetensors.numpy import save_file as save_safetensors

    src.mkdir()
    aprfast.save_file(tensors["alpha"], src / "alpha.apr")
    save_safetensors(tensors["beta"], str(src / "beta.safetensors"))
    aprfast.save_file(tensors["gamma"], src / "gamma.apr", max_shard_size=40 << 10)
    assert sorted(os.listdir(src))[:2] == ["alpha.apr", "beta.safetensors"] and len(os.listdir(src)) == 6


def expected(value):
    """What the pipeline's Q8_0 conversion makes of one input tensor."""
    if value.ndim == 2 and value.dtype.kind == "f" and value.shape[1] % 32 == 0:
        return aprfast.quantize(value, "Q8_0")
    return value


def check_written(module, src, tensors, results, fs, prefix, tmp_path) -> None:
    """Every model of ``src`` is at ``s3://{prefix}/{name}.apr`` (and nothing else is),
    each tensor the Q8_0 conversion of its input, byte for byte what converting the
    input here writes; the tasks ran in other processes and received handles for the
    .apr models."""
    assert [r["url"] for r in results] == [f"s3://{prefix}/{n}.apr" for n in NAMES]
    assert [r["received"] for r in results] == RECEIVED
    assert os.getpid() not in {r["worker_pid"] for r in results}  # the work ran on the cluster's processes
    assert sorted(fs.ls(prefix)) == [f"{prefix}/{n}.apr" for n in NAMES]
    for result, (name, model) in zip(results, tensors.items()):
        data = fs.cat_file(result["url"])
        assert len(data) == result["bytes"] and result["tensors"] == len(model)
        got = aprfast.load(data)
        assert sorted(got) == sorted(model)
        for key, value in model.items():
            want = expected(value)
            if isinstance(want, aprfast.QuantizedTensor):
                assert got[key] == want, (name, key)  # the same Q8_0 blocks, byte for byte
            else:
                assert got[key].dtype == value.dtype
                np.testing.assert_array_equal(got[key], value)
        # and the same bytes as converting the input here, without a cluster or S3
        local = tmp_path / f"{name}.apr"
        source = module.find_models(src)[list(tensors).index(name)]
        aprfast.convert(source, local, quantize="Q8_0")
        assert local.read_bytes() == data
