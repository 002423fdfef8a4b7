"""Warm eager loads under two states of glibc's allocator (issue 29 item 0).

    python benchmarks/bench_warm_allocator.py            # both states, 7 rounds each
    python benchmarks/bench_warm_allocator.py --rounds 15

The same loop runs in two child processes: one with glibc's defaults, one with
``MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=1073741824``, the state a
long-lived process reaches once it has freed blocks of 32 MiB (glibc raises its mmap
threshold on such frees): allocations below the threshold then come from a heap that
keeps its pages.  Each round loads a cached 504 MiB file (200 float32 tensors of
645x1024) with ``aprfast.load_file(mmap=False)``, the same with ``verify=False``, and
``safetensors.numpy.load_file``, one call each, the file read into the page cache
before and the result dropped and collected after every call (independent samples).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import time

STATES = {
    "glibc defaults": {},
    "raised mmap threshold": {"MALLOC_MMAP_THRESHOLD_": "33554432", "MALLOC_TRIM_THRESHOLD_": "1073741824"},
}


def child(directory: str, rounds: int) -> None:
    import numpy as np
    from safetensors.numpy import load_file as st_load

    import aprfast

    apr, st = os.path.join(directory, "large.apr"), os.path.join(directory, "large.safetensors")
    buffer = bytearray(16 << 20)  # allocated once: the warm-up must not move the allocator

    def cache(path):
        with open(path, "rb", buffering=0) as f:
            while f.readinto(buffer):
                pass

    tools = {"aprfast load_file(mmap=False)": (lambda: aprfast.load_file(apr, mmap=False), apr),
             "aprfast load_file(mmap=False, verify=False)": (
                 lambda: aprfast.load_file(apr, mmap=False, verify=False), apr),
             "safetensors.numpy.load_file": (lambda: st_load(st), st)}
    times = {name: [] for name in tools}
    for _ in range(rounds + 1):  # the first round warms up
        for name, (fn, path) in tools.items():
            cache(path)
            gc.collect()
            start = time.perf_counter()
            out = fn()
            times[name].append(time.perf_counter() - start)
            del out
            gc.collect()
    del np
    print(json.dumps({name: sorted(t[1:]) for name, t in times.items()}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--dir", default=None)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.rounds)
        return
    import numpy as np
    from safetensors.numpy import save_file

    import aprfast

    print(f"load average (1 min) {os.getloadavg()[0]:.2f}, {os.cpu_count()} cores")
    with tempfile.TemporaryDirectory(dir=args.dir) as directory:
        rng = np.random.default_rng(0)
        tensors = {f"layers.{i:03d}.weight": rng.standard_normal((645, 1024), dtype=np.float32) for i in range(200)}
        aprfast.save_file(tensors, os.path.join(directory, "large.apr"))
        save_file(tensors, os.path.join(directory, "large.safetensors"))
        del tensors
        print("| allocator state | tool | median [min..max] |\n|---|---|---|")
        for state, env in STATES.items():
            out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", directory,
                                  "--rounds", str(args.rounds)], env={**os.environ, **env},
                                 capture_output=True, text=True, check=True)
            for name, t in json.loads(out.stdout.strip().splitlines()[-1]).items():
                print(f"| {state} | {name} | {t[len(t) // 2] * 1e3:.1f} [{t[0] * 1e3:.1f}..{t[-1] * 1e3:.1f}] ms |")
    print(f"load average (1 min) {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()
