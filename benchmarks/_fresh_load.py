"""Child of bench_containers.py's fresh-process rows: one load of a prepared file in a new
Python process.  Imports only what its tool needs, then times the load alone and reports,
as one JSON line, the seconds, the peak RSS (VmHWM) of the whole process and the peak
above the RSS it had after its imports.

    python benchmarks/_fresh_load.py TOOL PATH

Not a benchmark by itself: bench_containers.py --fresh runs it round-robin.
"""

import json
import os
import sys
import time


def status(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return float("nan")


def loader(tool, path):
    """The load, as a zero-argument function, with its imports done now."""
    if tool.startswith("aprfast"):
        import aprfast

        if tool == "aprfast.load_file(mmap=False)":
            return lambda: aprfast.load_file(path, mmap=False)
        if tool == "aprfast.load_file (views)":
            return lambda: aprfast.load_file(path)
    if tool == "safetensors.numpy.load_file":
        import safetensors.numpy as stn

        return lambda: stn.load_file(path)
    if tool == "safetensors.torch.load_file (views)":
        import safetensors.torch as stt

        return lambda: stt.load_file(path)
    if tool.startswith("torch.load"):
        import torch

        mmap = "mmap" in tool
        return lambda: torch.load(path, weights_only=True, mmap=mmap)
    if tool == "np.load(npz)":
        import numpy as np

        def npz():
            with np.load(path) as f:
                return {k: f[k] for k in f.files}
        return npz
    if tool.startswith("np.load(npy"):
        import numpy as np

        mode = "r" if "mmap" in tool else None
        names = sorted(os.listdir(path))
        return lambda: {n: np.load(os.path.join(path, n), mmap_mode=mode) for n in names}
    if tool.startswith("GGUFReader"):
        import numpy as np
        from gguf import GGUFReader

        if "copy" in tool:
            return lambda: {t.name: np.array(t.data) for t in GGUFReader(path).tensors}
        return lambda: {t.name: t.data for t in GGUFReader(path).tensors}
    if tool in ("fresh huge-page buffer + readinto", "fresh 4 KiB-page buffer + readinto"):
        import mmap

        import numpy as np
        from timing import read_into

        advice = "MADV_HUGEPAGE" if tool.startswith("fresh huge") else "MADV_NOHUGEPAGE"

        def readinto():
            # the floor for an owned load: fresh memory (huge pages advised, or refused)
            # and one read; private, as an allocator maps (Python's default anonymous map
            # is shared, shmem-backed, and about 1.3x slower to fault in here)
            buf = mmap.mmap(-1, max(os.path.getsize(path), 1), flags=mmap.MAP_PRIVATE)
            if hasattr(mmap, advice):
                buf.madvise(getattr(mmap, advice))
            read_into(path, buf)
            return {"file": np.frombuffer(buf, np.uint8)}
        return readinto
    raise SystemExit(f"unknown tool {tool!r}")


def nbytes(result):
    total = 0
    for value in result.values():
        total += value.nbytes if hasattr(value, "nbytes") else value.numel() * value.element_size()
    return total


def main():
    tool, path = sys.argv[1], sys.argv[2]
    load = loader(tool, path)
    before = status("VmRSS")
    reset = False
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # VmHWM := current RSS, so the peak below is the load's alone
        reset = True
    except OSError:
        pass
    start = time.perf_counter()
    result = load()
    seconds = time.perf_counter() - start
    peak = status("VmHWM")
    print(json.dumps({"seconds": seconds, "peak": peak, "peak_above": peak - before if reset else float("nan"),
                      "nbytes": nbytes(result)}))


if __name__ == "__main__":
    main()
