"""aprfast's float16 / bfloat16 conversions beside NumPy, ml_dtypes and (if installed) torch.

    python benchmarks/bench_half.py            # 64 MiB of float32 (16 Mi elements), 15 rounds
    python benchmarks/bench_half.py --quick    # 8 MiB, 5 rounds
    python benchmarks/bench_half.py --paths    # also every kernel this CPU runs, 1 thread
    python benchmarks/bench_half.py --sweep    # also 1 vs 2 threads from 64 Ki to 16 Mi elements

Like with like, for each of f32->f16, f16->f32, f32->bf16, bf16->f32:

* allocating API vs allocating API: ``aprfast.to_float16(x)`` / ``to_bfloat16`` /
  ``to_float32`` against ``x.astype(np.float16)`` (NumPy), ``x.astype(ml_dtypes.bfloat16)``
  and ``tensor.to(dtype)`` (torch), in a loop (aprfast's buffer cache serves repeats, as
  glibc serves NumPy's below 32 MiB) and into fresh memory (the cache emptied before
  every aprfast call, untimed);
* kernel vs kernel into the same kind of preallocated buffer: ``aprfast.to_float16(x,
  out=out)`` against ``np.copyto(out, x, casting="unsafe")`` (NumPy, or ml_dtypes' cast
  for bfloat16; ``astype`` cannot write into an existing array) and torch's
  ``out.copy_(x)``.

Each pairing is run with one thread (aprfast ``threads=1``, ``torch.set_num_threads(1)``)
and with the default (aprfast ``threads=0``: the cores idle at the call; torch's default); NumPy and ml_dtypes
always run on one thread, which the row says.  The source is standard-normal float32
(like weights; NumPy is much slower on values that underflow or overflow float16, which
would flatter aprfast).  Outputs are checked bit for bit against the peer.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np
import timing
from timing import Row, Table, interleaved

import aprfast
from aprfast import _half
from aprfast._memory import release_buffer_cache

try:
    import ml_dtypes
    ML_WHY = None
except ImportError as exc:  # pragma: no cover
    ml_dtypes = None
    ML_WHY = f"not installed ({exc.name}): the bfloat16 rows compare against it"

try:
    import torch
    TORCH_WHY = None
except ImportError as exc:
    torch = None
    TORCH_WHY = f"not installed ({exc.name}); pip install torch to add its column"

MiB = 1 << 20


def directions(n):
    """(name, aprfast allocating fn, aprfast into-out fn, NumPy/ml_dtypes source, target dtype,
    torch source, torch target dtype, peer name) for each conversion that can run here."""
    rng = np.random.default_rng(0)
    f32 = rng.standard_normal(n, dtype=np.float32)
    f16 = f32.astype(np.float16)
    out = []
    t32 = torch.from_numpy(f32) if torch is not None else None
    out.append(("f32 -> f16", aprfast.to_float16, f32, np.float16, t32, "float16", "NumPy astype/copyto"))
    out.append(("f16 -> f32", aprfast.to_float32, f16, np.float32,
                torch.from_numpy(f16) if torch is not None else None, "float32", "NumPy astype/copyto"))
    if ml_dtypes is not None:
        bf16 = f32.astype(ml_dtypes.bfloat16)
        out.append(("f32 -> bf16", aprfast.to_bfloat16, f32, ml_dtypes.bfloat16, t32, "bfloat16",
                    "ml_dtypes astype/copyto"))
        out.append(("bf16 -> f32", aprfast.to_float32, bf16, np.float32,
                    t32.to(torch.bfloat16) if torch is not None else None, "float32", "ml_dtypes astype/copyto"))
    return out


def bits(a):
    return np.asarray(a).view(np.uint16 if np.asarray(a).dtype.itemsize == 2 else np.uint32)


def bench_against_peers(table, n, rounds):
    size = f"{n * 4 / MiB:.0f} MiB f32"
    cores = os.cpu_count()
    for name, convert, src, dtype, tsrc, tdtype, peer in directions(n):
        np_out = np.empty(n, dtype)
        ours_out = np.empty(n, dtype)
        t_out = torch.empty(n, dtype=getattr(torch, tdtype)) if torch is not None else None
        expected = src.astype(dtype)
        if not np.array_equal(bits(convert(src)), bits(expected)):
            sys.exit(f"{name}: aprfast and {peer} disagree")
        for threads, label in ((1, "1 thread"), (0, f"threads=0 (idle cores, up to {cores})")):
            if torch is not None:
                torch.set_num_threads(1 if threads == 1 else cores)
            tools = {"aprfast": lambda: convert(src, threads=threads),
                     "aprfast, cold cache": lambda: convert(src, threads=threads),
                     "astype": lambda: src.astype(dtype)}
            if torch is not None:
                tools["torch .to()"] = lambda: tsrc.to(getattr(torch, tdtype))
            # The cold-cache variant empties aprfast's buffer cache before each call
            # (untimed), so its output is fresh memory, as NumPy's is from 32 MiB on.
            r = interleaved(tools, rounds, min_sample=0.02, setup={"aprfast, cold cache": release_buffer_cache})
            primary = {peer.split()[0] + " astype (1 thread)": r.pop("astype")}
            torch_cell = {f"torch .to() ({label})": r.pop("torch .to()")} if torch is not None else None
            table.add(Row(f"{name}, allocating, aprfast {label}", size, r.pop("aprfast"), primary, torch_cell))
            table.add(Row(f"{name}, allocating into fresh memory (buffer cache emptied first), aprfast {label}",
                          size, r.pop("aprfast, cold cache"), primary, torch_cell))

            tools = {"aprfast": lambda: convert(src, out=ours_out, threads=threads),
                     "copyto": lambda: np.copyto(np_out, src, casting="unsafe")}
            if torch is not None:
                tools["torch copy_"] = lambda: t_out.copy_(tsrc)
            r = interleaved(tools, rounds, min_sample=0.02)
            primary = {peer.split()[0] + " np.copyto into out (1 thread)": r.pop("copyto")}
            table.add(Row(f"{name}, into a preallocated out, aprfast {label}", size, r.pop("aprfast"), primary,
                          {f"torch out.copy_() ({label})": r.pop("torch copy_")} if torch is not None else None))
            if not np.array_equal(bits(ours_out), bits(np_out)):
                sys.exit(f"{name}: aprfast and {peer} disagree (into out)")
        if torch is not None:
            torch.set_num_threads(cores)
    table.notes.append("NumPy and ml_dtypes conversions run on one thread whatever the row says; the thread "
                       "count applies to aprfast and torch (torch gets every core in the threads=0 rows).")
    table.notes.append("Allocating rows: from 32 MiB on, aprfast's results come from its cache of freed aligned "
                       "buffers, so a loop of same-size conversions reuses touched memory (glibc does that for "
                       "NumPy below 32 MiB only). The fresh-memory rows empty that cache before each call: the "
                       "first call of a process, or sizes that do not repeat, pay the kernel's zeroing of new "
                       "pages, as every peer does here.")
    table.notes.append("threads=0 starts only the threads idle cores can run at the time of the call "
                       "(/proc/loadavg's runnable count) and none below 2 Mi elements.")


def thread_scaling(table, n, rounds):
    """aprfast's kernels at 1 and 2 threads, as measured (no target applied)."""
    for name, convert, src, dtype, *_ in directions(n):
        out = np.empty(n, dtype)
        r = interleaved({"1": lambda: convert(src, out=out, threads=1),
                         "2": lambda: convert(src, out=out, threads=2)}, rounds, min_sample=0.02)
        table.notes.append(f"{name} thread scaling (into out): 1 thread {r['1'].text()}, 2 threads "
                           f"{r['2'].text()}: {r['1'].median / r['2'].median:.2f}x as measured")


def bench_paths(n, rounds):
    print(f"\nEvery kernel, 1 thread, {n * 4 / MiB:.0f} MiB of float32 (median [min..max] per call)")
    kernels = {"f32 -> f16": _half.f32_to_f16, "f16 -> f32": _half.f16_to_f32,
               "f32 -> bf16": _half.f32_to_bf16, "bf16 -> f32": _half.bf16_to_f32}
    for name, _, src, dtype, *_ in directions(n):
        out = np.empty(n, dtype)
        s = src if src.dtype == np.float32 else src.view(np.uint16)
        o = out if out.dtype == np.float32 else out.view(np.uint16)
        kernel = kernels[name]
        r = interleaved({p: (lambda p=p: kernel(s, o, threads=1, path=p)) for p in _half.available_paths()},
                        rounds, min_sample=0.02)
        print(f"{name:<12} " + "  ".join(f"{p} {v.text()}" for p, v in r.items()))


def bench_thread_sweep(rounds):
    """1 vs 2 threads by size: where splitting starts to pay (PARALLEL_MIN_ELEMENTS in half.c)."""
    print("\n1 vs 2 threads by size (into out; the C side may still run one thread below its threshold)")
    for shift in range(16, 25):
        n = 1 << shift
        cells = [f"{n:>10,}"]
        for name, convert, src, dtype, *_ in directions(n)[:2]:
            out = np.empty(n, dtype)
            r = interleaved({"1": lambda: convert(src, out=out, threads=1),
                             "2": lambda: convert(src, out=out, threads=2)}, rounds, min_sample=0.01)
            cells.append(f"{name}: 1t {r['1'].text()} 2t {r['2'].text()} ({r['1'].median / r['2'].median:.2f}x)")
        print("  ".join(cells))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="8 MiB, 5 rounds")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--paths", action="store_true", help="also time every kernel")
    parser.add_argument("--sweep", action="store_true", help="also sweep sizes, 1 vs 2 threads")
    parser.add_argument("--md-out", default=None, help="also write the Markdown table to this file")
    args = parser.parse_args()
    n = (8 if args.quick else 64) * MiB // 4
    rounds = 5 if args.quick else args.rounds
    versions = (f"ml_dtypes {timing.version('ml_dtypes') if ml_dtypes else 'absent'}, "
                f"torch {torch.__version__ if torch else 'absent'}, kernel {_half.best_path()}")
    table = Table("float16 / bfloat16 conversions", "NumPy / ml_dtypes", versions=versions)
    if ml_dtypes is None:
        table.skip("ml_dtypes (bfloat16 rows)", ML_WHY)
    if torch is None:
        table.skip("torch", TORCH_WHY)
    bench_against_peers(table, n, rounds)
    thread_scaling(table, n, rounds)
    if args.paths:
        bench_paths(n, rounds)
    if args.sweep:
        bench_thread_sweep(rounds)
    table.finish(args.md_out)


if __name__ == "__main__":
    main()
