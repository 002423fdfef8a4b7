"""Time aprfast's float16 / bfloat16 conversions beside NumPy and ml_dtypes, in the same run.

    python benchmarks/bench_half.py            # 64 MiB of float32 (16 Mi elements) each way
    python benchmarks/bench_half.py --quick    # 8 MiB, fewer repeats
    python benchmarks/bench_half.py --paths    # also every kernel this CPU runs, 1 thread
    python benchmarks/bench_half.py --sweep    # 1 vs 2 threads from 64 Ki to 16 Mi elements

Peers: ``src.astype(dtype)`` (what users write; it allocates its result) and
``np.copyto(out, src, casting="unsafe")`` into a preallocated array (the like-for-like
comparison, since aprfast writes into ``out``).  Float16 goes through NumPy, bfloat16
through ml_dtypes.  Each figure is the best per-call time of several samples; ratios are
peer time divided by aprfast time, so above 1 means aprfast is faster.  The source is
standard-normal float32 (like weights; NumPy is much slower on values that underflow or
overflow float16, which would flatter aprfast).
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

from aprfast import _half

import functools

import timing

best = functools.partial(timing.best, min_sample=0.01)

try:
    import ml_dtypes
except ImportError:  # pragma: no cover
    sys.exit("the bfloat16 benchmark compares against ml_dtypes: pip install ml_dtypes")

MiB = 1 << 20




def directions(n):
    """(name, narrow dtype, kernel, source, aprfast out, peer out) for the four conversions."""
    rng = np.random.default_rng(0)
    f32 = rng.standard_normal(n, dtype=np.float32)
    f16 = f32.astype(np.float16)
    bf16 = f32.astype(ml_dtypes.bfloat16)
    return [
        ("f32 -> f16", np.float16, _half.f32_to_f16, f32, np.empty(n, np.uint16), np.empty(n, np.float16)),
        ("f16 -> f32", np.float32, _half.f16_to_f32, f16, np.empty(n, np.float32), np.empty(n, np.float32)),
        ("f32 -> bf16", ml_dtypes.bfloat16, _half.f32_to_bf16, f32, np.empty(n, np.uint16),
         np.empty(n, ml_dtypes.bfloat16)),
        ("bf16 -> f32", np.float32, _half.bf16_to_f32, bf16, np.empty(n, np.float32), np.empty(n, np.float32)),
    ]


def as_bits(a):
    """The view the kernels take: halves as uint16, floats as themselves."""
    return a if a.dtype == np.float32 else a.view(np.uint16)


def bench_against_peers(n, repeat):
    print(f"{n * 4 / MiB:.0f} MiB of float32 ({n:,} elements); kernel: {_half.best_path()}, "
          f"{_half.default_threads()} online cores")
    header = (f"{'direction':<12} {'astype':>8} {'copyto':>8} {'apr 1t':>8} {'apr 2t':>8}   "
              f"{'astype/1t':>9} {'copyto/1t':>9} {'1t/2t':>6}  {'GB/s 1t':>7} {'GB/s 2t':>7}")
    print(header)
    print("-" * len(header))
    for name, dtype, kernel, src, out, peer_out in directions(n):
        src_bits, out_bits = as_bits(src), as_bits(out)
        t_astype = best(lambda: src.astype(dtype), repeat)
        t_copyto = best(lambda: np.copyto(peer_out, src, casting="unsafe"), repeat)
        t1 = best(lambda: kernel(src_bits, out_bits, threads=1), repeat)
        t2 = best(lambda: kernel(src_bits, out_bits, threads=2), repeat)
        moved = src.nbytes + out.nbytes
        print(f"{name:<12} {t_astype * 1e3:7.2f}m {t_copyto * 1e3:7.2f}m {t1 * 1e3:7.2f}m {t2 * 1e3:7.2f}m   "
              f"{t_astype / t1:8.1f}x {t_copyto / t1:8.1f}x {t1 / t2:5.2f}x  "
              f"{moved / t1 / 1e9:7.1f} {moved / t2 / 1e9:7.1f}")
        if not np.array_equal(out.view(np.uint16 if out.dtype == np.uint16 else np.uint32),
                              peer_out.view(np.uint16 if out.dtype == np.uint16 else np.uint32)):
            sys.exit(f"{name}: aprfast and the peer disagree")
    print("(times per call in ms; GB/s counts bytes read plus bytes written)")


def bench_paths(n, repeat):
    print(f"\nEvery kernel, 1 thread, {n * 4 / MiB:.0f} MiB of float32 (ms per call)")
    paths = _half.available_paths()
    print(f"{'direction':<12} " + " ".join(f"{p:>12}" for p in paths))
    for name, _, kernel, src, out, _ in directions(n):
        src_bits, out_bits = as_bits(src), as_bits(out)
        times = [best(lambda: kernel(src_bits, out_bits, threads=1, path=p), repeat) for p in paths]
        print(f"{name:<12} " + " ".join(f"{t * 1e3:11.2f}m" for t in times))


def bench_thread_sweep(repeat):
    """1 vs 2 threads by size: where splitting starts to pay (PARALLEL_MIN_ELEMENTS in half.c)."""
    print("\n1 vs 2 threads by size (f32 -> f16 and f16 -> f32; the C side may still run one "
          "thread below its threshold)")
    print(f"{'elements':>10} {'f32->f16 1t':>12} {'2t':>9} {'ratio':>6} {'f16->f32 1t':>12} {'2t':>9} {'ratio':>6}")
    for shift in range(16, 25):
        n = 1 << shift
        row = [f"{n:>10,}"]
        for name, _, kernel, src, out, _ in directions(n)[:2]:
            src_bits, out_bits = as_bits(src), as_bits(out)
            t1 = best(lambda: kernel(src_bits, out_bits, threads=1), repeat)
            t2 = best(lambda: kernel(src_bits, out_bits, threads=2), repeat)
            row.append(f"{t1 * 1e6:10.1f}us {t2 * 1e6:7.1f}us {t1 / t2:5.2f}x")
        print(" ".join(row))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="8 MiB and fewer repeats")
    parser.add_argument("--paths", action="store_true", help="also time every kernel")
    parser.add_argument("--sweep", action="store_true", help="also sweep sizes, 1 vs 2 threads")
    args = parser.parse_args()
    n = (8 if args.quick else 64) * MiB // 4
    repeat = 5 if args.quick else 15
    print(f"aprfast half conversions, NumPy {np.__version__}, ml_dtypes {ml_dtypes.__version__}, "
          f"{os.cpu_count()} CPUs\n")
    bench_against_peers(n, repeat)
    if args.paths:
        bench_paths(n, repeat)
    if args.sweep:
        bench_thread_sweep(repeat)


if __name__ == "__main__":
    main()
