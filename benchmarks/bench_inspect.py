"""aprfast.inspect (header, metadata and the whole tensor index) against what any
safetensors inspector does (read the 8-byte length, the JSON header, ``json.loads``),
from 50 to 1,000,000 tensors, in both v2 layouts.

    python benchmarks/bench_inspect.py                    # 50, 10k, 100k and 1M tensors
    python benchmarks/bench_inspect.py --quick            # 3 rounds
    python benchmarks/bench_inspect.py --models small,tiny --md-out F.md

Models (models.py): "small" 50 float32 tensors of 80x256, "tiny" 10,000 of 256 floats,
"index" 100,000 of 16 floats, "million" 1,000,000 of 4 floats.  Each is saved with
``aprfast.save_file`` in the aprender layout (what ``layout="auto"`` writes) and in
the APR2 spec layout (``layout="apr2"``), with ``safetensors.numpy.save_file``, and
(up to 100,000 tensors) with gguf's GGUFWriter.

Rows, all tools of one model timed round-robin in one run (timing.py):

* inspect: ``aprfast.inspect(path)`` | safetensors' header read and ``json.loads`` |
  ``GGUFReader(path).tensors``; limit: one ``os.pread`` of the aprfast file's prefix
  (header, metadata and index: the bytes any inspector must read).  ``inspect``'s
  ``tensors`` builds each entry's dict when it is asked for; every entry was checked
  while parsing.
* inspect + every entry: the same, then ``list(info["tensors"].items())``, so every
  per-tensor dict exists, as after ``json.loads`` (default layout only).
* inspect in a fresh process (unless ``--no-fresh``): each sample a new Python process
  (round-robin across tools) that imports its tool, then times one inspect.

Files are in the page cache; a sample is a loop of calls lasting about 50 ms.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile

import timing
from models import model
from timing import Row, Samples, Table, interleaved

import aprfast

try:
    import safetensors.numpy as st_numpy
except ImportError:  # pragma: no cover
    sys.exit("the benchmarks compare against safetensors: pip install .[bench]")

try:
    import gguf
    GGUF_WHY = None
except ImportError as exc:
    gguf = None
    GGUF_WHY = f"not installed ({exc.name})"

MODELS = ("small", "tiny", "index", "million")
#: GGUFWriter and GGUFReader take minutes over a million tensors; not run there.
GGUF_MOST = 100_000


def gguf_save(tensors, path):
    writer = gguf.GGUFWriter(path, "bench")
    for name, value in tensors.items():
        writer.add_tensor(name, value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def prefix_reader(path):
    """One ``os.pread`` of everything before the data (the floor for any inspector)."""
    data_offset = aprfast.inspect(path)["header"]["data_offset"]

    def read():
        fd = os.open(path, os.O_RDONLY)
        try:
            return os.pread(fd, data_offset, 0)
        finally:
            os.close(fd)
    return read, data_offset


def st_header(path):
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        return json.loads(f.read(n))


def every_entry(path):
    info = aprfast.inspect(path)
    return list(info["tensors"].items())


_CHILD = r"""
import json, sys, time
sys.path.insert(0, {here!r})
who, path = sys.argv[1], sys.argv[2]
if who == "safetensors":
    def run():
        with open(path, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            return json.loads(f.read(n))
else:
    import aprfast
    run = lambda: aprfast.inspect(path)
start = time.perf_counter()
run()
print(time.perf_counter() - start)
"""


def fresh_samples(tools: dict, rounds: int) -> dict:
    """One inspect per new Python process (imports done before the clock starts),
    round-robin across tools: what a command-line inspector pays, every page fresh."""
    code = _CHILD.format(here=os.path.dirname(os.path.abspath(__file__)))
    out = {k: Samples() for k in tools}
    for _ in range(rounds):
        for tool, (who, path) in tools.items():
            done = subprocess.run([sys.executable, "-c", code, who, path], capture_output=True, text=True)
            if done.returncode != 0:
                raise RuntimeError(f"fresh-process inspect with {tool} failed:\n{done.stderr}")
            out[tool].append(float(done.stdout.strip().splitlines()[-1]))
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="3 rounds")
    parser.add_argument("--rounds", type=int, default=7, help="timed rounds per model (default 7)")
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated subset")
    parser.add_argument("--fresh-rounds", type=int, default=5, help="fresh processes per tool (default 5)")
    parser.add_argument("--no-fresh", action="store_true", help="skip the fresh-process rows")
    parser.add_argument("--dir", default=None, help="where to write files (default: a temp dir)")
    parser.add_argument("--md-out", default=None, help="also write the Markdown table to this file")
    args = parser.parse_args()
    rounds = 3 if args.quick else args.rounds
    fresh_rounds = 2 if args.quick else args.fresh_rounds
    wanted = args.models.split(",")
    unknown = [m for m in wanted if m not in MODELS]
    if unknown:
        parser.error(f"unknown model(s) {unknown}; choose from {', '.join(MODELS)}")

    versions = f"safetensors {timing.version('safetensors')}, gguf {timing.version('gguf') if gguf else 'absent'}"
    table = Table("inspect: header, metadata and tensor index", "safetensors header + json.loads",
                  others_title="GGUFReader", versions=versions)
    if gguf is None:
        table.skip("gguf (GGUFReader)", GGUF_WHY)
    with tempfile.TemporaryDirectory(dir=args.dir) as directory:
        for name in [m for m in MODELS if m in wanted]:
            tensors = model(name, 1.0)
            count = len(tensors)
            size = f"{count:,} tensors"
            print(f"--- {name}: {size}", flush=True)
            apr = {layout: os.path.join(directory, f"{name}.{layout}.apr") for layout in ("aprender", "apr2")}
            for layout, path in apr.items():
                aprfast.save_file(tensors, path, layout=layout, durable=False)
            st = os.path.join(directory, f"{name}.safetensors")
            st_numpy.save_file(tensors, st)
            gg = None
            if gguf is not None and count <= GGUF_MOST:
                gg = os.path.join(directory, f"{name}.gguf")
                gguf_save(tensors, gg)
            elif gguf is not None:
                table.skip(f"GGUFReader at {size}", f"GGUFWriter/GGUFReader take minutes over more than "
                           f"{GGUF_MOST:,} tensors")
            del tensors
            gc.collect()
            os.sync()  # writeback of what was just saved ends before anything is timed

            tools = {f"aprfast {layout}": (lambda p=path: aprfast.inspect(p)) for layout, path in apr.items()}
            tools["aprfast aprender, every entry"] = lambda: every_entry(apr["aprender"])
            tools["header + json.loads"] = lambda: st_header(st)
            floors = {}
            for layout, path in apr.items():
                read, nbytes = prefix_reader(path)
                shown = f"{nbytes / (1 << 20):.1f} MiB" if nbytes >= 1 << 20 else f"{nbytes / 1024:.1f} KiB"
                floors[layout] = (f"pread of the {shown} prefix", f"floor {layout}")
                tools[f"floor {layout}"] = read
            if gg is not None:
                tools["GGUFReader"] = lambda: gguf.GGUFReader(gg).tensors
            r = interleaved(tools, rounds, min_sample=0.05, slow=2.0, slow_rounds=min(3, rounds))
            primary = {"header + json.loads": r["header + json.loads"]}
            others = {"GGUFReader": r["GGUFReader"]} if "GGUFReader" in r else {}
            for layout in apr:
                label, key = floors[layout]
                table.add(Row(f"{name}: inspect, {layout} layout", size, r[f"aprfast {layout}"], primary, others,
                              {label: r[key]}))
            table.add(Row(f"{name}: inspect + every entry, aprender layout", size,
                          r["aprfast aprender, every entry"], primary, others))
            if not args.no_fresh:
                fresh = {f"aprfast {layout}": ("aprfast", path) for layout, path in apr.items()}
                fresh["header + json.loads"] = ("safetensors", st)
                f = fresh_samples(fresh, fresh_rounds)
                for layout in apr:
                    table.add(Row(f"{name}: inspect in a fresh process, {layout} layout", size,
                                  f[f"aprfast {layout}"], {"header + json.loads": f["header + json.loads"]}))
            for path in [*apr.values(), st] + ([gg] if gg else []):
                os.unlink(path)
    table.notes.append("inspect's tensors is a dict that builds an entry when asked for (the index was checked "
                       "in full while parsing); the every-entry row builds all of them, as json.loads does.")
    table.notes.append("Fresh-process rows: each sample is a new Python process that imports its tool, then times "
                       "one inspect of a file in the page cache (every page of memory it fills is new).")
    table.notes.append("A tool whose first call took over 2 s is sampled in 3 rounds only (its cell says n=...).")
    table.finish(args.md_out)


if __name__ == "__main__":
    main()
