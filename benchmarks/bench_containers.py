"""Time aprfast beside safetensors, NumPy and (if installed) torch, in the same run.

    python benchmarks/bench_containers.py            # full sizes (~512 MiB model)
    python benchmarks/bench_containers.py --quick    # 1/8 of the sizes, fewer repeats
    python benchmarks/bench_containers.py --markdown # also print the README table

Models: "large" ~512 MiB in 200 float32 tensors, "small" ~4 MiB in 50 tensors,
"tiny" 10,000 tensors of 1 KiB.  Each operation reports the best of several runs
(files are in the page cache, as in a real reload loop).  Ratios are peer time
divided by aprfast time: above 1 means aprfast is faster.  Save peak memory is
measured in a child process as peak RSS minus RSS with the input tensors built.
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import os
import subprocess
import sys
import tempfile
import zlib

import numpy as np

import aprfast
import timing

try:
    import safetensors.numpy as st_numpy
    from safetensors import safe_open
except ImportError:  # pragma: no cover
    sys.exit("the benchmarks compare against safetensors: pip install .[bench]")

try:
    import torch
except ImportError:
    torch = None

MiB = 1 << 20

best = functools.partial(timing.best, min_sample=0.05)


MODELS = ("large", "small", "tiny")


def model(name: str, scale: float) -> dict:
    """One benchmark model, built only when asked for (the large one is 512 MiB)."""
    rng = np.random.default_rng(0)
    if name == "large":
        rows = max(1, int(655 * scale))
        return {f"layers.{i:03d}.weight": rng.standard_normal((rows, 1024), dtype=np.float32)
                for i in range(200)}
    if name == "small":
        return {f"layers.{i:02d}.weight": rng.standard_normal((80, 256), dtype=np.float32) for i in range(50)}
    return {f"t.{i:05d}": rng.standard_normal(256, dtype=np.float32) for i in range(10_000)}




class Bench:
    def __init__(self, directory, repeat):
        self.dir = directory
        self.repeat = repeat
        self.rows = []

    def path(self, model, ext):
        return os.path.join(self.dir, f"{model}.{ext}")

    def row(self, model, op, ours, peers, target=None):
        self.rows.append({"model": model, "op": op, "aprfast": ours, "peers": peers, "target": target})
        peer_text = "  ".join(f"{name} {t * 1e3:9.3f} ms (x{t / ours:6.1f})" for name, t in peers.items())
        print(f"{model:6} {op:28} aprfast {ours * 1e3:9.3f} ms   {peer_text}", flush=True)

    def run_model(self, model, tensors):
        r = self.repeat
        apr, st, npz = self.path(model, "apr"), self.path(model, "safetensors"), self.path(model, "npz")
        npy_dir = self.path(model, "npy.d")
        os.makedirs(npy_dir, exist_ok=True)
        pt = self.path(model, "pt")

        # save
        peers = {"safetensors": best(lambda: st_numpy.save_file(tensors, st), r),
                 "np.savez": best(lambda: np.savez(npz, **tensors), r)}
        if torch is not None:
            tt = {k: torch.from_numpy(v) for k, v in tensors.items()}
            peers["torch.save"] = best(lambda: torch.save(tt, pt), r)
        ours_fast = best(lambda: aprfast.save_file(tensors, apr, durable=False), r)
        ours_durable = best(lambda: aprfast.save_file(tensors, apr), r)
        self.row(model, "save_file (no fsync)", ours_fast, peers)
        self.row(model, "save_file (fsync, default)", ours_durable, peers)
        for name, value in tensors.items():
            np.save(os.path.join(npy_dir, name + ".npy"), value)
        names = list(tensors)
        os.sync()  # let writeback of what was just saved finish before timing reads

        # open and list
        def st_keys():
            with safe_open(st, "np") as f:
                return list(f.keys())

        def apr_keys():
            with aprfast.open(apr) as f:
                return f.keys()

        def npz_keys():
            with np.load(npz) as f:
                return list(f.keys())

        self.row(model, "open + list", best(apr_keys, r * 5),
                 {"safetensors": best(st_keys, r * 5), "np.load(npz)": best(npz_keys, r * 5)})

        # zero-copy access of every tensor
        def st_all_lazy():
            with safe_open(st, "np") as f:
                return [f.get_tensor(k) for k in names]

        def apr_all_views():
            with aprfast.open(apr) as f:
                return [f.get_tensor(k) for k in names]

        def npy_mmap_all():
            return [np.load(os.path.join(npy_dir, k + ".npy"), mmap_mode="r") for k in names]

        self.row(model, "open + every tensor (lazy)", best(apr_all_views, r),
                 {"safetensors": best(st_all_lazy, r), "np.load(mmap_mode)": best(npy_mmap_all, r)})

        # eager load of everything into owned arrays
        peers = {"safetensors": best(lambda: st_numpy.load_file(st), r),
                 "np.load(npz)": best(lambda: dict(np.load(npz)), r)}
        if torch is not None:
            peers["torch.load"] = best(lambda: torch.load(pt, weights_only=True), r)
        total = sum(v.nbytes for v in tensors.values())
        buf = bytearray(total)
        buf_view = memoryview(buf)

        def readinto_baseline():
            with open(st, "rb", buffering=0) as f:
                f.readinto(buf_view)

        peers["readinto (floor)"] = best(readinto_baseline, r)
        self.row(model, "load_file (eager, owned)", best(lambda: aprfast.load_file(apr, mmap=False), r), peers)

        # one tensor out of many, from an already-open file
        one = names[len(names) // 2]
        with safe_open(st, "np") as sf, aprfast.open(apr) as af:
            self.row(model, f"get one tensor ({tensors[one].nbytes // 1024} KiB)",
                     best(lambda: af.get_tensor(one), r * 20),
                     {"safetensors": best(lambda: sf.get_tensor(one), r * 20)})


def crc_row(bench, size):
    data = np.random.default_rng(1).integers(0, 256, size, dtype=np.uint8)
    ours = best(lambda: aprfast.crc32(data), bench.repeat)
    single = best(lambda: aprfast.crc32(data, threads=1), bench.repeat)
    z = best(lambda: zlib.crc32(data), bench.repeat)
    bench.row("crc32", f"{size // MiB} MiB (all cores)", ours, {"zlib.crc32": z})
    bench.row("crc32", f"{size // MiB} MiB (1 thread)", single, {"zlib.crc32": z})


def save_peak_rss(model_name, scale, directory):
    """Peak RSS above the inputs while save_file runs, in a fresh process (MiB)."""
    code = f"""
import os, resource, sys
sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})
import numpy as np, aprfast, safetensors.numpy as stn
from bench_containers import model

t = model({model_name!r}, {scale})
def status(key):
    for line in open('/proc/self/status'):
        if line.startswith(key + ':'):
            return int(line.split()[1]) * 1024
base = status('VmRSS')
with open('/proc/self/clear_refs', 'w') as f:
    f.write('5')  # reset the peak (VmHWM) to the current RSS: measure the save alone
fn = sys.argv[1]
if fn == 'aprfast':
    aprfast.save_file(t, {os.path.join(directory, 'peak.apr')!r})
else:
    stn.save_file(t, {os.path.join(directory, 'peak.safetensors')!r})
print((status('VmHWM') - base) / 2**20)
"""
    out = {}
    for who in ("aprfast", "safetensors"):
        result = subprocess.run([sys.executable, "-c", code, who], capture_output=True, text=True, check=True)
        out[who] = float(result.stdout.strip())
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="1/8 sizes, 2 repeats")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--dir", default=None, help="where to write files (default: a temp dir)")
    parser.add_argument("--json", default=None, help="write the results to this JSON file")
    parser.add_argument("--markdown", action="store_true", help="also print the README table")
    args = parser.parse_args()
    scale = 0.125 if args.quick else 1.0
    repeat = 2 if args.quick else args.repeat
    with tempfile.TemporaryDirectory(dir=args.dir) as directory:
        bench = Bench(directory, repeat)
        print(f"aprfast {aprfast.__version__}, crc32 kernel {aprfast._crc.best_path()}, {os.cpu_count()} cores, "
              f"torch {'yes' if torch else 'not installed'}")
        for name in MODELS:
            tensors = model(name, scale)
            size = sum(v.nbytes for v in tensors.values())
            print(f"--- {name}: {len(tensors)} tensors, {size / MiB:.1f} MiB")
            bench.run_model(name, tensors)
            del tensors
            gc.collect()
        crc_row(bench, int(256 * MiB * scale))
        peaks = {m: save_peak_rss(m, scale, directory) for m in ("large", "small")}
        for name, peak in peaks.items():
            print(f"{name:6} save_file peak RSS above inputs: aprfast {peak['aprfast']:.1f} MiB, "
                  f"safetensors {peak['safetensors']:.1f} MiB")
        results = {"rows": bench.rows, "save_peak_rss_mib": peaks, "scale": scale}
        if args.json:
            with open(args.json, "w") as f:
                json.dump(results, f, indent=1)
        if args.markdown:
            print(markdown_table(results))


def markdown_table(results) -> str:
    """The README's table: each operation, aprfast's time, and each peer's time and ratio."""
    def ms(t):
        return f"{t * 1e3:.3f} ms" if t < 0.01 else f"{t * 1e3:.1f} ms"

    lines = ["| model | operation | aprfast | safetensors (zlib for crc32) | other peers |",
             "|---|---|---|---|---|"]
    for row in results["rows"]:
        peers = dict(row["peers"])
        st = peers.pop("safetensors", None) or peers.pop("zlib.crc32", None)
        st_text = f"{ms(st)} (**{st / row['aprfast']:.1f}x**)" if st else ""
        others = ", ".join(f"{name} {ms(t)} ({t / row['aprfast']:.1f}x)" for name, t in peers.items())
        lines.append(f"| {row['model']} | {row['op']} | {ms(row['aprfast'])} | {st_text} | {others} |")
    for name, peak in results["save_peak_rss_mib"].items():
        lines.append(f"| {name} | save_file peak RSS above the inputs | {peak['aprfast']:.1f} MiB | "
                     f"{peak['safetensors']:.1f} MiB | |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
