"""examples/dask_pipeline.py (issue 15 part 5): a directory of models converted and
quantized on a Dask LocalCluster (2 worker processes, 127.0.0.1), one task per model,
written to the local moto S3 server; each object equals the quantized input."""

import importlib.util
import os

import numpy as np
import pytest

import aprfast

from servers import s3_server  # noqa: F401 - the fixture

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLE = os.path.join(os.path.dirname(HERE), "examples", "dask_pipeline.py")

pytest.importorskip("distributed")
pytest.importorskip("s3fs")


def _example():
    spec = importlib.util.spec_from_file_location("dask_pipeline", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _models(rng):
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


@pytest.fixture(scope="module")
def cluster(s3_server):  # noqa: F811 - after the S3 fixture, so workers inherit its dummy credentials
    module = _example()
    cluster, client = module.local_cluster(2)
    yield module, client
    client.close()
    cluster.close()


def _expected(value):
    """What the pipeline's Q8_0 conversion makes of one input tensor."""
    if value.ndim == 2 and value.dtype.kind == "f" and value.shape[1] % 32 == 0:
        return aprfast.quantize(value, "Q8_0")
    return value


def test_directory_converted_and_quantized_to_s3(tmp_path, s3_server, cluster):  # noqa: F811
    module, client = cluster
    models = _models(np.random.default_rng(15))
    src = tmp_path / "models"
    src.mkdir()
    aprfast.save_file(models["alpha"], src / "alpha.apr")
    from safetensors.numpy import save_file as save_safetensors

    save_safetensors(models["beta"], str(src / "beta.safetensors"))
    aprfast.save_file(models["gamma"], src / "gamma.apr", max_shard_size=40 << 10)  # 3 shards + manifest
    assert sorted(os.listdir(src))[:2] == ["alpha.apr", "beta.safetensors"] and len(os.listdir(src)) == 6
    assert [module.model_name(p) for p in module.find_models(src)] == ["alpha", "beta", "gamma"]

    bucket = s3_server.make_bucket()
    results = module.convert_directory(str(src), f"s3://{bucket}/converted", client, quantize="Q8_0",
                                       storage_options=s3_server.storage_options)
    assert [r["url"] for r in results] == [f"s3://{bucket}/converted/{n}.apr" for n in ("alpha", "beta", "gamma")]
    assert os.getpid() not in {r["worker_pid"] for r in results}  # the work ran on the cluster's processes

    fs = s3_server.fs()
    assert sorted(fs.ls(f"{bucket}/converted")) == [f"{bucket}/converted/{n}.apr" for n in ("alpha", "beta", "gamma")]
    for result, (name, tensors) in zip(results, models.items()):
        data = fs.cat_file(result["url"])
        assert len(data) == result["bytes"] and result["tensors"] == len(tensors)
        got = aprfast.load(data)
        assert sorted(got) == sorted(tensors)
        for key, value in tensors.items():
            want = _expected(value)
            if isinstance(want, aprfast.QuantizedTensor):
                assert got[key] == want, (name, key)  # the same Q8_0 blocks, byte for byte
            else:
                assert got[key].dtype == value.dtype
                np.testing.assert_array_equal(got[key], value)
        # and the same bytes as converting the input here, without Dask or S3
        local = tmp_path / f"{name}.apr"
        source = module.find_models(src)[list(models).index(name)]
        aprfast.convert(source, local, quantize="Q8_0")
        assert local.read_bytes() == data


def test_only_s3_prefixes(cluster, tmp_path):
    module, client = cluster
    with pytest.raises(ValueError, match="must be an s3:// URL"):
        module.convert_directory(str(tmp_path), str(tmp_path / "out"), client)


def test_command_line_on_a_running_scheduler(tmp_path, s3_server, cluster, capsys):  # noqa: F811
    module, client = cluster
    src = tmp_path / "models"
    src.mkdir()
    tensors = {"w": np.arange(64 * 32, dtype=np.float32).reshape(64, 32) / 3}
    aprfast.save_file(tensors, src / "one.apr")
    bucket = s3_server.make_bucket()
    # credentials from the environment (the S3 fixture's dummy ones), the endpoint from the command line
    assert module.main([str(src), f"s3://{bucket}/cli", "--quantize", "Q4_0", "--scheduler",
                        client.scheduler.address, "--endpoint-url", s3_server.endpoint_url]) == 0
    assert f"-> s3://{bucket}/cli/one.apr: 1 tensors" in capsys.readouterr().out
    got = aprfast.load(s3_server.fs().cat_file(f"{bucket}/cli/one.apr"))
    assert got["w"] == aprfast.quantize(tensors["w"], "Q4_0")
