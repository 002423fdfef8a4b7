"""Convert and quantize a directory of models in parallel on Dask or Ray, writing them to S3.

    python examples/dask_pipeline.py MODELS_DIR s3://bucket/prefix --quantize Q8_0
    python examples/dask_pipeline.py MODELS_DIR s3://bucket/prefix --endpoint-url http://127.0.0.1:5000 \\
        --workers 2 --quantize Q4_0 --precision f16
    python examples/dask_pipeline.py MODELS_DIR s3://bucket/prefix --engine ray --workers 2

One task per model: every ``.apr`` (any variant, or a sharded model by its
``*.apr.index.json``), ``.safetensors`` and ``.gguf`` file directly in ``MODELS_DIR``
is converted with :func:`aprfast.convert` (2-D float weights quantized, the rest kept or
converted to ``--precision``) into a temporary file on the worker, then uploaded to
``{prefix}/{model name}.apr`` with s3fs (a multipart upload for large files: the object
appears whole or not at all).  Each task streams one tensor at a time, so a worker's
memory is bounded by the largest tensor, not the model.

An ``.apr`` model travels to its task as an open ``aprfast`` handle, not as a path: this
process opens it (a damaged header or index fails here, before any task is scheduled)
and the handle pickles as its path and options (a few hundred bytes, never the mapped
bytes); the worker reopens it, and refuses a file that changed since the task was submitted.

The engines only schedule the one task (:func:`convert_one`):

* ``--engine dask`` (the default; ``pip install "aprfast[dask]"``): without
  ``--scheduler`` a ``LocalCluster`` of worker processes on 127.0.0.1 is started (no
  dashboard); ``--scheduler`` names a running scheduler's address.
* ``--engine ray`` (``pip install "aprfast[ray]"``): without ``--scheduler`` a local Ray
  cluster of ``--workers`` CPUs is started on 127.0.0.1 only (no dashboard, no usage
  statistics) and shut down at the end; ``--scheduler`` is the address ``ray.init``
  connects to (``auto``, ``HOST:PORT``).

Credentials come from the environment (``AWS_ACCESS_KEY_ID``, ...) or
``storage_options``; ``--endpoint-url`` points s3fs at an S3-compatible server.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
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


def open_model(path):
    """What the task for the model at ``path`` receives: an open aprfast handle for an
    .apr model (one file, or a sharded model by its manifest), which pickles as its path
    and options and is reopened by the worker; the path itself for safetensors and GGUF
    (``aprfast.open`` reads .apr files only).  Opening here checks the header and index
    before any task is scheduled."""
    if path.endswith(MANIFEST) or path.endswith(".apr"):
        import aprfast

        return aprfast.open(path)
    return path


def convert_one(model, destination, *, quantize="Q8_0", precision=None, storage_options=None) -> dict:
    """One task: convert ``model`` to a temporary .apr on this worker, upload it to the
    ``s3://`` URL ``destination``, remove the temporary file.  Returns what was written.

    ``model`` is a path or an open aprfast handle.  A handle arrives here unpickled, that
    is reopened on this worker, which refused it if the file changed since it was pickled
    (when the task was submitted); the conversion then streams the file by the handle's
    path (the converter keeps its own reader), and the handle is closed at the end."""
    import s3fs

    import aprfast

    handle = None if isinstance(model, (str, os.PathLike)) else model
    source = handle.path if handle is not None else os.fspath(model)
    with handle if handle is not None else contextlib.nullcontext():
        with tempfile.TemporaryDirectory(prefix="aprfast-pipeline-") as tmp:
            local = os.path.join(tmp, "model.apr")
            report = aprfast.convert(source, local, quantize=quantize, precision=precision, durable=False)
            size = os.path.getsize(local)
            fs = s3fs.S3FileSystem(skip_instance_cache=True, **(storage_options or {}))
            fs.put_file(local, destination)
    return {"source": source, "url": destination, "tensors": report["tensors"], "bytes": size,
            "worker_pid": os.getpid(), "received": type(model).__name__}


def plan(directory, prefix: str) -> list:
    """``(name, path, destination URL)`` of every model of ``directory``, in model order."""
    if not prefix.startswith("s3://"):
        raise ValueError(f"prefix must be an s3:// URL, not {prefix!r}")
    models = find_models(directory)
    names = [model_name(m) for m in models]
    if len(set(names)) != len(names):
        raise ValueError(f"two models in {directory} would be written to the same name: {sorted(names)}")
    return [(name, path, f"{prefix.rstrip('/')}/{name}.apr") for name, path in zip(names, models)]


def convert_directory(directory, prefix: str, scheduler, *, quantize="Q8_0", precision=None,
                      storage_options=None) -> list:
    """Convert every model of ``directory`` to ``{prefix}/{name}.apr``, one
    :func:`convert_one` task per model, on ``scheduler``: a Dask ``Client``, or ``"ray"``
    for the Ray cluster this process is connected to (:func:`ray_cluster`).  Returns each
    task's result, in model order.  The .apr handles opened for the tasks are closed here
    once every task has finished."""
    jobs = plan(directory, prefix)
    options = {"quantize": quantize, "precision": precision, "storage_options": storage_options}
    with contextlib.ExitStack() as opened:
        tasks = [(name, _opened(opened, path), destination) for name, path, destination in jobs]
        if isinstance(scheduler, str) and scheduler == "ray":
            return run_on_ray(tasks, options)
        return run_on_dask(scheduler, tasks, options)


def _opened(stack, path):
    model = open_model(path)
    if not isinstance(model, str):
        stack.callback(model.close)
    return model


def run_on_dask(client, tasks, options) -> list:
    """``convert_one(model, destination, **options)`` for each ``(name, model,
    destination)`` on the Dask ``client``'s cluster; the results in task order."""
    futures = [client.submit(convert_one, model, destination, key=f"convert-{name}", pure=False, **options)
               for name, model, destination in tasks]
    return client.gather(futures)


def run_on_ray(tasks, options) -> list:
    """The same tasks on the Ray cluster this process is connected to (Ray pickles the
    arguments, aprfast handles included, with cloudpickle); the results in task order."""
    ray = engine_package("ray")
    if not ray.is_initialized():  # a bare .remote() would start a default cluster on every interface
        raise RuntimeError("Ray is not initialized: run the tasks inside ray_cluster() (or after ray.init)")
    task = ray.remote(num_cpus=1)(convert_one)
    refs = [task.options(name=f"convert-{name}").remote(model, destination, **options)
            for name, model, destination in tasks]
    return ray.get(refs)


def engine_package(module: str):
    """``import module`` (``distributed`` or ``ray``), or an ImportError naming the extra."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        extra = {"distributed": "dask"}.get(module, module)
        raise ImportError(f"this engine needs the '{module}' package: pip install 'aprfast[{extra}]'") from exc


def local_cluster(workers: int = 2):
    """A LocalCluster of worker processes on 127.0.0.1 without a dashboard, and its client."""
    distributed = engine_package("distributed")
    cluster = distributed.LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, host="127.0.0.1",
                                       dashboard_address=None, worker_dashboard_address=None)
    return cluster, distributed.Client(cluster)


@contextlib.contextmanager
def dask_cluster(address=None, workers: int = 2):
    """A Dask client of the scheduler at ``address``, or of a new :func:`local_cluster`
    (closed on exit)."""
    if address:
        cluster, client = None, engine_package("distributed").Client(address)
    else:
        cluster, client = local_cluster(workers)
    try:
        yield client
    finally:
        client.close()
        if cluster is not None:
            cluster.close()


#: The environment of a local Ray cluster that stays on this machine.  Ray reads both when
#: it is imported, and its processes inherit them.  RAY_USAGE_STATS_ENABLED=0: no usage
#: statistics are sent.  RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 is Ray's switch for a
#: single-machine cluster (the default on Windows and macOS): the node's address is
#: 127.0.0.1 and every Ray server listens there; without it Ray advertises the machine's
#: address and binds its gRPC servers to all interfaces.
LOCAL_RAY_ENVIRONMENT = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}


@contextlib.contextmanager
def ray_cluster(address=None, workers: int = 2):
    """Connect this process to the Ray cluster at ``address``, or start a local one of
    ``workers`` CPUs on 127.0.0.1 only, without dashboard or usage statistics; yields
    ``"ray"`` (the scheduler :func:`convert_directory` takes) and calls ``ray.shutdown()``
    on exit (which stops a local cluster's processes)."""
    saved = {key: os.environ.get(key) for key in LOCAL_RAY_ENVIRONMENT}
    if not address:
        os.environ.update(LOCAL_RAY_ENVIRONMENT)
    try:
        ray = engine_package("ray")
        if address:
            ray.init(address=address)
        else:
            ray.init(address="local", num_cpus=workers, include_dashboard=False)
        try:
            if not address:
                _check_loopback(ray)
            yield "ray"
        finally:
            ray.shutdown()
    finally:
        _restore_environment(saved)


def _check_loopback(ray) -> None:
    """Refuse a local cluster that advertises another address than 127.0.0.1 (Ray was
    imported before :data:`LOCAL_RAY_ENVIRONMENT` was set, so it ignored it)."""
    address = ray.util.get_node_ip_address()
    if address != "127.0.0.1":
        raise RuntimeError(f"the local Ray cluster runs on {address}, not 127.0.0.1: ray was imported before "
                           f"ray_cluster() set {sorted(LOCAL_RAY_ENVIRONMENT)}; set them before importing ray")


def _restore_environment(saved) -> None:
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", help="directory of models")
    parser.add_argument("prefix", help="s3://bucket/prefix the converted models are written under")
    parser.add_argument("--quantize", default="Q8_0", help="quantization type of 2-D float weights (default Q8_0)")
    parser.add_argument("--precision", default=None, help="f32/f16/bf16 for the tensors not quantized")
    parser.add_argument("--engine", choices=("dask", "ray"), default="dask", help="who schedules the tasks "
                        "(default dask)")
    parser.add_argument("--workers", type=int, default=2, help="worker processes (Dask) or CPUs (Ray) of the "
                        "local cluster started without --scheduler (default 2)")
    parser.add_argument("--scheduler", default=None, help="address of a running Dask scheduler, or of a Ray "
                        "cluster (auto, HOST:PORT)")
    parser.add_argument("--endpoint-url", default=None, help="S3-compatible endpoint (e.g. a local server)")
    args = parser.parse_args(argv)
    storage_options = {"client_kwargs": {"endpoint_url": args.endpoint_url}} if args.endpoint_url else None
    cluster = ray_cluster if args.engine == "ray" else dask_cluster
    with cluster(args.scheduler, args.workers) as scheduler:
        results = convert_directory(args.models, args.prefix, scheduler, quantize=args.quantize,
                                    precision=args.precision, storage_options=storage_options)
    for r in results:
        print(f"{r['source']} -> {r['url']}: {r['tensors']} tensors, {r['bytes']} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
