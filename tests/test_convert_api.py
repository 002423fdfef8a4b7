"""aprfast.convert: format detection, options, refusals and bounded memory."""

import os
import shutil
import tracemalloc

import numpy as np
import pytest
import safetensors.numpy as sn

import aprfast
from aprfast.convert import DestinationExistsError, detect


@pytest.fixture
def model(tmp_path, rng):
    tensors = {"embed.weight": rng.standard_normal((8, 64)).astype(np.float32),
               "layer.0.weight": rng.standard_normal((4, 64)).astype(np.float16),
               "layer.0.bias": rng.standard_normal(4).astype(np.float32),
               "steps": np.arange(3, dtype=np.int64)}
    sn.save_file(tensors, tmp_path / "m.safetensors", metadata={"src": "test"})
    return tensors


def test_format_comes_from_the_bytes_not_the_extension(tmp_path, model):
    shutil.copy(tmp_path / "m.safetensors", tmp_path / "weights.gguf")
    aprfast.save_file(model, tmp_path / "a.apr")
    shutil.copy(tmp_path / "a.apr", tmp_path / "misnamed.safetensors")
    aprfast.convert(tmp_path / "a.apr", tmp_path / "real.gguf")
    shutil.copy(tmp_path / "real.gguf", tmp_path / "real.bin")
    assert detect(tmp_path / "weights.gguf") == "safetensors"
    assert detect(tmp_path / "misnamed.safetensors") == "apr"
    assert detect(tmp_path / "real.bin") == "gguf"
    for src in ("weights.gguf", "misnamed.safetensors", "real.bin"):
        aprfast.convert(tmp_path / src, tmp_path / f"{src}.apr")
        got = aprfast.load_file(tmp_path / f"{src}.apr")
        assert all(got[k].tobytes() == v.tobytes() for k, v in model.items())


def test_unknown_source_is_refused(tmp_path):
    (tmp_path / "x.safetensors").write_bytes(b"PK\x03\x04 not a model")
    with pytest.raises(aprfast.FormatError, match="unrecognised"):
        aprfast.convert(tmp_path / "x.safetensors", tmp_path / "x.apr")


def test_existing_destination_is_refused_unless_force(tmp_path, model):
    (tmp_path / "out.apr").write_bytes(b"keep me")
    with pytest.raises(DestinationExistsError) as err:
        aprfast.convert(tmp_path / "m.safetensors", tmp_path / "out.apr")
    assert isinstance(err.value, FileExistsError) and isinstance(err.value, aprfast.AprIOError)
    assert (tmp_path / "out.apr").read_bytes() == b"keep me"
    aprfast.convert(tmp_path / "m.safetensors", tmp_path / "out.apr", force=True)
    assert set(aprfast.load_file(tmp_path / "out.apr")) == set(model)


def test_destination_format_from_to(tmp_path, model):
    aprfast.convert(tmp_path / "m.safetensors", tmp_path / "out.bin", to="gguf")
    assert detect(tmp_path / "out.bin") == "gguf"
    with pytest.raises(ValueError, match="cannot tell"):
        aprfast.convert(tmp_path / "m.safetensors", tmp_path / "out.weights")
    with pytest.raises(ValueError, match="to="):
        aprfast.convert(tmp_path / "m.safetensors", tmp_path / "o.apr", to="onnx")


def test_rename_and_drop(tmp_path, model):
    aprfast.convert(tmp_path / "m.safetensors", tmp_path / "r.apr",
                    rename=lambda n: None if n == "steps" else "model." + n)
    got = aprfast.load_file(tmp_path / "r.apr")
    assert set(got) == {"model." + n for n in model if n != "steps"}
    assert got["model.embed.weight"].tobytes() == model["embed.weight"].tobytes()
    with pytest.raises(aprfast.LayoutError, match="both"):
        aprfast.convert(tmp_path / "m.safetensors", tmp_path / "s.apr", rename=lambda n: "same")
    assert not (tmp_path / "s.apr").exists()


@pytest.mark.parametrize("precision,dtype", [("f16", np.float16), ("f32", np.float32), ("bf16", "bfloat16")])
def test_precision_converts_float_tensors_only(tmp_path, model, precision, dtype):
    import ml_dtypes
    want = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    aprfast.convert(tmp_path / "m.safetensors", tmp_path / "p.apr", precision=precision)
    got = aprfast.load_file(tmp_path / "p.apr")
    for name, value in model.items():
        if value.dtype.kind == "f":
            assert got[name].dtype == want
            assert got[name].tobytes() == value.astype(np.float32).astype(want).tobytes()
        else:
            assert got[name].dtype == value.dtype and got[name].tobytes() == value.tobytes()


def test_quantize_applies_to_2d_float_weights_whose_rows_fit(tmp_path, model):
    aprfast.convert(tmp_path / "m.safetensors", tmp_path / "q.apr", quantize="Q8_0")
    with aprfast.open(tmp_path / "q.apr") as f:
        assert f.info("embed.weight").dtype.name == "Q8_0"
        assert f.info("layer.0.weight").dtype.name == "Q8_0"
        assert f.info("layer.0.bias").dtype.name == "F32"  # 1-D: kept
        q = f.get_tensor("embed.weight")
        assert q == aprfast.quantize(model["embed.weight"], "Q8_0")
    aprfast.convert(tmp_path / "m.safetensors", tmp_path / "q2.apr",
                    quantize=lambda name, shape: "Q4_0" if name.startswith("layer") else None)
    with aprfast.open(tmp_path / "q2.apr") as f:
        assert f.info("embed.weight").dtype.name == "F32" and f.info("layer.0.weight").dtype.name == "Q4_0"
    with pytest.raises(aprfast.UnknownDTypeError):
        aprfast.convert(tmp_path / "m.safetensors", tmp_path / "q3.apr", quantize="Q9_9")


def test_validate_modes_are_checked_before_anything_is_written(tmp_path, model):
    # the modes themselves: tests/test_convert_validation.py
    with pytest.raises(ValueError, match="validate='yes'"):
        aprfast.convert(tmp_path / "m.safetensors", tmp_path / "v.apr", validate="yes")
    assert not (tmp_path / "v.apr").exists()
    result = aprfast.convert(tmp_path / "m.safetensors", tmp_path / "v.apr")
    assert result["validation"]["mode"] == "strict" and result["validation"]["checked"] == len(model)


def test_progress_reports_source_bytes(tmp_path, model):
    calls = []
    result = aprfast.convert(tmp_path / "m.safetensors", tmp_path / "p.apr", progress=lambda d, t: calls.append((d, t)))
    total = sum(v.nbytes for v in model.values())
    assert result["bytes"] == total and len(calls) == len(model)
    assert [c[1] for c in calls] == [total] * len(model) and calls[-1][0] == total
    assert [c[0] for c in calls] == sorted(c[0] for c in calls)


def test_compression_falls_back_to_the_spooled_writer(tmp_path, model):
    zeros = {"z": np.zeros((256, 256), np.float32)}  # compresses, so it is stored with zstd's flag
    sn.save_file({**model, **zeros}, tmp_path / "m.safetensors")
    aprfast.convert(tmp_path / "m.safetensors", tmp_path / "c.apr", compression="zstd")
    assert aprfast.inspect(tmp_path / "c.apr")["tensors"]["z"]["flags"] == 2
    got = aprfast.load_file(tmp_path / "c.apr")
    assert all(got[k].tobytes() == v.tobytes() for k, v in {**model, **zeros}.items())
    with pytest.raises(ValueError, match="compression"):
        aprfast.convert(tmp_path / "m.safetensors", tmp_path / "c.gguf", compression="zstd")


def test_a_failure_mid_stream_leaves_no_destination(tmp_path, model):
    def boom(done, total):
        raise RuntimeError("stop")
    for dest in ("x.apr", "x.safetensors", "x.gguf"):
        with pytest.raises(RuntimeError):
            aprfast.convert(tmp_path / "m.safetensors", tmp_path / dest, progress=boom)
        assert not (tmp_path / dest).exists()
    calls = []

    def third(done, total):  # fails once two shards are committed
        calls.append(done)
        if len(calls) == 3:
            raise RuntimeError("stop")
    with pytest.raises(RuntimeError):
        aprfast.convert(tmp_path / "m.safetensors", tmp_path / "shards", max_shard_size=1, progress=third)
    assert sorted(os.listdir(tmp_path)) == ["m.safetensors"]  # the directory it made is gone too
    (tmp_path / "mine").mkdir()  # a directory that was there before stays, empty
    calls.clear()
    with pytest.raises(RuntimeError):
        aprfast.convert(tmp_path / "m.safetensors", tmp_path / "mine", max_shard_size=1, progress=third)
    assert os.listdir(tmp_path / "mine") == []


def test_apr_to_apr_keeps_quantized_blocks(tmp_path, rng):
    q = aprfast.quantize(rng.standard_normal((2, 64)).astype(np.float32), "Q4_1")
    aprfast.save_file({"q": q, "x": np.ones(3)}, tmp_path / "a.apr", metadata={"k": [1, 2]}, layout="apr2")
    aprfast.convert(tmp_path / "a.apr", tmp_path / "b.apr")
    with aprfast.open(tmp_path / "b.apr") as f:
        assert f.get_tensor("q") == q and f.metadata["k"] == [1, 2]


# --- memory ----------------------------------------------------------------------------
def make_64mib(path, rng):
    """Sixteen 4 MiB tensors: a 64 MiB model whose largest tensor is 4 MiB."""
    tensors = {f"l{i}.weight": rng.standard_normal((1024, 1024)).astype(np.float32) for i in range(16)}
    sn.save_file(tensors, path)
    return 4 << 20


@pytest.mark.parametrize("dest", ["m.apr", "m.gguf", "m.safetensors"])
def test_peak_traced_memory_is_bounded_by_the_largest_tensor(tmp_path, rng, dest):
    largest = make_64mib(tmp_path / "src.safetensors", rng)
    tracemalloc.start()
    try:
        aprfast.convert(tmp_path / "src.safetensors", tmp_path / dest, durable=False)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2 * largest + (4 << 20), f"peak {peak / 2**20:.1f} MiB for a 64 MiB model"


@pytest.mark.slow("long memory-bound measurement")
def test_peak_traced_memory_with_precision_and_quantize(tmp_path, rng):
    largest = make_64mib(tmp_path / "src.safetensors", rng)
    for i, opts in enumerate(({"precision": "f16"}, {"quantize": "Q8_0"})):
        tracemalloc.start()
        try:
            aprfast.convert(tmp_path / "src.safetensors", tmp_path / f"o{i}.apr", durable=False, **opts)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert peak < 3 * largest + (4 << 20), f"{opts}: peak {peak / 2**20:.1f} MiB"


@pytest.mark.peak_memory
def test_peak_rss_is_bounded(tmp_path, rng, run_child):
    make_64mib(tmp_path / "src.safetensors", rng)
    script = """
import resource, sys, aprfast
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
aprfast.convert(sys.argv[1], sys.argv[2], durable=False)
aprfast.convert(sys.argv[2], sys.argv[3], durable=False)
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024)
"""
    done = run_child(script, tmp_path / "src.safetensors", tmp_path / "m.apr", tmp_path / "m.gguf")
    assert done.returncode == 0, done.stderr
    grown = int(done.stdout.strip())
    # The .apr source is read through a map: its pages count in RSS while touched, so the
    # bound is the 64 MiB file's worth below what an eager load of both files would take.
    assert grown < 100, f"peak RSS grew {grown} MiB converting a 64 MiB model twice"


@pytest.mark.parametrize("kind", ["zstd apr2", "v1 zstd", "v1 plain"])
@pytest.mark.parametrize("dest", ["o.safetensors", "o.gguf", "o.apr"])
def test_every_apr_variant_is_a_source(tmp_path, rng, kind, dest):
    from aprfast import v1
    tensors = {"z": np.zeros((64, 64), np.float32), "r": rng.standard_normal((8, 8)).astype(np.float32)}
    if kind == "zstd apr2":
        aprfast.save_file(tensors, tmp_path / "s.apr", compression="zstd")
    else:
        v1.save_model(tensors, tmp_path / "s.apr", compression="zstd" if "zstd" in kind else "none")
    aprfast.convert(tmp_path / "s.apr", tmp_path / dest)
    aprfast.convert(tmp_path / dest, tmp_path / "back.apr")
    got = aprfast.load_file(tmp_path / "back.apr")
    assert {k: v.tobytes() for k, v in got.items()} == {k: v.tobytes() for k, v in tensors.items()}
