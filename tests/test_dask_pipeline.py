"""examples/dask_pipeline.py (issue 15 part 5): a directory of models converted and
quantized on a Dask LocalCluster (2 worker processes, 127.0.0.1), one task per model,
written to the local moto S3 server; each object equals the quantized input.  The same
example on Ray: tests/test_ray_pipeline.py."""

import numpy as np
import pytest
from pipeline_cases import check_written, load_example, models, write_models
from servers import s3_server  # noqa: F401 - the fixture

import aprfast

pytest.importorskip("distributed")
pytest.importorskip("s3fs")

pytestmark = pytest.mark.slow("a Dask cluster")


@pytest.fixture(scope="module")
def cluster(s3_server):  # noqa: F811 - after the S3 fixture, so workers inherit its dummy credentials
    module = load_example()
    cluster, client = module.local_cluster(2)
    yield module, client
    client.close()
    cluster.close()


def test_directory_converted_and_quantized_to_s3(tmp_path, s3_server, cluster):  # noqa: F811
    module, client = cluster
    tensors = models(np.random.default_rng(15))
    src = tmp_path / "models"
    write_models(src, tensors)
    assert [module.model_name(p) for p in module.find_models(src)] == ["alpha", "beta", "gamma"]

    bucket = s3_server.make_bucket()
    results = module.convert_directory(str(src), f"s3://{bucket}/converted", client, quantize="Q8_0",
                                       storage_options=s3_server.storage_options)
    check_written(module, src, tensors, results, s3_server.fs(), f"{bucket}/converted", tmp_path)


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
