"""Convert and quantize a directory of models in parallel on Dask, writing them to S3.

    python examples/dask_pipeline.py MODELS_DIR s3://bucket/prefix --quantize Q8_0
    python examples/dask_pipeline.py MODELS_DIR s3://bucket/prefix --endpoint-url http://127.0.0.1:5000 \\
        --workers 2 --quantize Q4_0 --precision f16

One Dask task per model: every ``.apr`` (any variant, or a sharded model by its
``*.apr.index.json``), ``.safetensors`` and ``.gguf`` file directly in ``MODELS_DIR``
is converted with :func:`aprfast.convert` (2-D float weights quantized, the rest kept or
converted to ``--precision``) into a temporary file on the worker, then uploaded to
``{prefix}/{model name}.apr`` with s3fs (a multipart upload for large files: the object
appears whole or not at all).  Each task streams one tensor at a time, so a worker's
memory is bounded by the largest tensor, not the model.

Without ``--scheduler`` a ``LocalCluster`` of worker processes on 127.0.0.1 is started
(no dashboard).  Credentials come from the environment (``AWS_ACCESS_KEY_ID``, ...) or
``storage_options``; ``--endpoint-url`` points s3fs at an S3-compatible server.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

SUFFIXES = (".apr", ".safetensors", ".gguf")
MANIFEST = ".apr.index.json"


def find_models(directory) -> list:
    """The models directly in ``directory``, sorted: plain files by extension, a sharded
    .apr model by its manifest (its shard files are not models of their own)."""
    names = sorted(os.listdir(directory))
    shard_files = set()
    for name in names:
        if name.endswith(MANIFEST):
            import json

            with open(os.path.join(directory, name), encoding="utf-8") as f:
                shard_files.update(s["file"] for s in json.load(f).get("shards", ()))
    return [os.path.join(directory, n) for n in names
            if (n.endswith(MANIFEST) or n.endswith(SUFFIXES)) and n not in shard_files
            and os.path.isfile(os.path.join(directory, n))]


def model_name(path) -> str:
    """``m.apr.index.json`` -> ``m``; ``m.safetensors`` -> ``m``."""
    base = os.path.basename(path)
    if base.endswith(MANIFEST):
        return base[:-len(MANIFEST)]
    return os.path.splitext(base)[0]


def convert_one(source, destination, *, quantize="Q8_0", precision=None, storage_options=None) -> dict:
    """One task: convert ``source`` to a temporary .apr on this worker, upload it to the
    ``s3://`` URL ``destination``, remove the temporary file.  Returns what was written."""
    import aprfast
    import s3fs

    with tempfile.TemporaryDirectory(prefix="aprfast-dask-") as tmp:
        local = os.path.join(tmp, "model.apr")
        report = aprfast.convert(source, local, quantize=quantize, precision=precision, durable=False)
        size = os.path.getsize(local)
        fs = s3fs.S3FileSystem(skip_instance_cache=True, **(storage_options or {}))
        fs.put_file(local, destination)
    return {"source": os.fspath(source), "url": destination, "tensors": report["tensors"], "bytes": size,
            "worker_pid": os.getpid()}


def convert_directory(directory, prefix: str, client, *, quantize="Q8_0", precision=None,
                      storage_options=None) -> list:
    """Convert every model of ``directory`` to ``{prefix}/{name}.apr`` on the Dask
    ``client``'s cluster, one task per model; returns each task's result, in model order."""
    if not prefix.startswith("s3://"):
        raise ValueError(f"prefix must be an s3:// URL, not {prefix!r}")
    models = find_models(directory)
    names = [model_name(m) for m in models]
    if len(set(names)) != len(names):
        raise ValueError(f"two models in {directory} would be written to the same name: {sorted(names)}")
    futures = [client.submit(convert_one, source, f"{prefix.rstrip('/')}/{name}.apr", quantize=quantize,
                             precision=precision, storage_options=storage_options, key=f"convert-{name}",
                             pure=False)
               for source, name in zip(models, names)]
    return client.gather(futures)


def local_cluster(workers: int = 2):
    """A LocalCluster of worker processes on 127.0.0.1 without a dashboard, and its client."""
    from distributed import Client, LocalCluster

    cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, host="127.0.0.1",
                           dashboard_address=None, worker_dashboard_address=None)
    return cluster, Client(cluster)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", help="directory of models")
    parser.add_argument("prefix", help="s3://bucket/prefix the converted models are written under")
    parser.add_argument("--quantize", default="Q8_0", help="quantization type of 2-D float weights (default Q8_0)")
    parser.add_argument("--precision", default=None, help="f32/f16/bf16 for the tensors not quantized")
    parser.add_argument("--workers", type=int, default=2, help="LocalCluster worker processes (default 2)")
    parser.add_argument("--scheduler", default=None, help="address of an existing Dask scheduler")
    parser.add_argument("--endpoint-url", default=None, help="S3-compatible endpoint (e.g. a local server)")
    args = parser.parse_args(argv)
    storage_options = {"client_kwargs": {"endpoint_url": args.endpoint_url}} if args.endpoint_url else None
    if args.scheduler:
        from distributed import Client

        cluster, client = None, Client(args.scheduler)
    else:
        cluster, client = local_cluster(args.workers)
    try:
        results = convert_directory(args.models, args.prefix, client, quantize=args.quantize,
                                    precision=args.precision, storage_options=storage_options)
    finally:
        client.close()
        if cluster is not None:
            cluster.close()
    for r in results:
        print(f"{r['source']} -> {r['url']}: {r['tensors']} tensors, {r['bytes']} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
