"""Time aprfast's quantization kernels beside gguf-py (llama.cpp's NumPy quantizers), same run.

    python benchmarks/bench_quant.py            # 64 MiB of float32 (16 Mi elements)
    python benchmarks/bench_quant.py --quick    # 8 MiB, fewer repeats
    python benchmarks/bench_quant.py --paths    # also time each SIMD path (one thread, 8 MiB)

For Q8_0, Q4_0 and Q4_1: quantize and dequantize with aprfast (default path, all
cores) and with gguf.quants, checking that the bytes and floats are identical; then
aprfast with 1 thread against 2 threads.  Each time is the best of several runs into
a preallocated output.  Ratios are gguf time / aprfast time (or 1-thread time /
2-thread time): above 1 means the second is faster.

Targets: quantize >= 5x gguf, dequantize >= 2x gguf, 2 threads >= 1.6x 1 thread.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import sys
import threading
import time
import warnings

import numpy as np

from aprfast import _quant

from timing import best

try:
    import gguf
    from gguf import GGMLQuantizationType
except ImportError:  # pragma: no cover
    sys.exit("the quantization benchmark compares against gguf-py: pip install .[bench]")

MiB = 1 << 20
TYPES = ("Q8_0", "Q4_0", "Q4_1")
QUANTIZE = {"Q8_0": _quant.quantize_q8_0, "Q4_0": _quant.quantize_q4_0, "Q4_1": _quant.quantize_q4_1}
TARGETS = {"quantize": 5.0, "dequantize": 2.0, "threads": 1.6}




def gbps(nbytes, seconds):
    return nbytes / seconds / 1e9


def verdict(ratio, target):
    return "ok" if ratio >= target else "BELOW TARGET"


def bench_type(name, x, repeat, gguf_repeat):
    qtype = getattr(GGMLQuantizationType, name)
    n = x.size
    raw = np.empty(_quant.quantized_nbytes(name, n), np.uint8)
    back = np.empty(n, np.float32)
    quantize = QUANTIZE[name]

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t_gguf_q = best(lambda: gguf.quants.quantize(x, qtype), gguf_repeat)
        ref_raw = gguf.quants.quantize(x, qtype).ravel()
        t_gguf_d = best(lambda: gguf.quants.dequantize(ref_raw, qtype), gguf_repeat)
        ref_back = gguf.quants.dequantize(ref_raw, qtype).ravel()

    t_q = best(lambda: quantize(x, raw), repeat)
    t_d = best(lambda: _quant.dequantize(name, raw, back), repeat)
    assert np.array_equal(raw, ref_raw), f"{name}: quantized bytes differ from gguf-py"
    assert np.array_equal(back.view(np.uint32), ref_back.view(np.uint32)), f"{name}: floats differ from gguf-py"

    t_q1 = best(lambda: quantize(x, raw, threads=1), repeat)
    t_q2 = best(lambda: quantize(x, raw, threads=2), repeat)
    t_d1 = best(lambda: _quant.dequantize(name, raw, back, threads=1), repeat)
    t_d2 = best(lambda: _quant.dequantize(name, raw, back, threads=2), repeat)

    rows = [
        ("quantize", t_gguf_q, t_q, "quantize"),
        ("dequantize", t_gguf_d, t_d, "dequantize"),
        ("quantize 1 vs 2 threads", t_q1, t_q2, "threads"),
        ("dequantize 1 vs 2 threads", t_d1, t_d2, "threads"),
    ]
    print(f"\n{name}  ({n * 4 / MiB:.0f} MiB float32 <-> {raw.size / MiB:.1f} MiB blocks)")
    print(f"  {'':28s} {'reference':>12s} {'aprfast':>12s} {'ratio':>8s}")
    for label, t_ref, t_ours, target in rows:
        ratio = t_ref / t_ours
        print(f"  {label:28s} {t_ref * 1e3:10.1f}ms {t_ours * 1e3:10.1f}ms {ratio:7.2f}x"
              f"  (target {TARGETS[target]}x: {verdict(ratio, TARGETS[target])}; "
              f"aprfast {gbps(n * 4, t_ours):.1f} GB/s of float32)")
    return {label: t_ref / t_ours for label, t_ref, t_ours, _ in rows}


def core_check(seconds=0.3):
    """How much two threads doing independent cache-resident work get done compared with one.

    Thread scaling can only be judged when the cores are really free: on a shared or
    oversubscribed machine this is well under 2 and the 1-vs-2-thread ratios are too."""
    bufs = [np.random.default_rng(i).standard_normal(1 << 18, dtype=np.float32) for i in range(2)]
    outs = [np.empty(_quant.quantized_nbytes("Q8_0", b.size), np.uint8) for b in bufs]

    def work(i, calls):
        for _ in range(calls):
            _quant.quantize_q8_0(bufs[i], outs[i], threads=1)

    start = time.perf_counter()
    calls = 0
    while time.perf_counter() - start < seconds:
        work(0, 20)
        calls += 20
    one = time.perf_counter() - start
    threads = [threading.Thread(target=work, args=(i, calls)) for i in range(2)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    two = time.perf_counter() - start
    return 2 * one / two


def bench_paths(x, repeat):
    """Each available SIMD path on one thread, for every type both ways, on 8 MiB: small
    enough to stay in cache, so the kernels rather than memory set the pace."""
    x = x[: 2 * MiB]
    print("\nper path, 1 thread, 8 MiB of float32 (GB/s of float32):")
    names = ("Q8_0", "Q4_0", "Q4_1", "APR_Q8", "APR_Q4", "Q8_TENSOR", "Q5_0", "Q5_1", "Q4_K", "Q6_K")
    print(f"  {'':12s}" + "".join(f"{p:>22s}" for p in _quant.available_paths()))
    for name in names:
        n = x.size
        raw = np.empty(_quant.quantized_nbytes(name, n), np.uint8)
        back = np.empty(n, np.float32)
        if _quant.can_quantize(name):
            _quant.quantize(name, x, raw)
        else:
            raw[:] = np.random.default_rng(0).integers(0, 256, raw.size, dtype=np.uint8)
        cells = []
        for path in _quant.available_paths():
            t_q = (best(lambda: _quant.quantize(name, x, raw, threads=1, path=path), repeat)
                   if _quant.can_quantize(name) else None)
            t_d = best(lambda: _quant.dequantize(name, raw, back, threads=1, path=path), repeat)
            q_text = f"q {gbps(n * 4, t_q):5.1f}" if t_q else "q    - "
            cells.append(f"{q_text}  dq {gbps(n * 4, t_d):5.1f}")
        print(f"  {name:12s}" + "".join(f"{c:>22s}" for c in cells))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="8 MiB instead of 64 MiB, fewer repeats")
    parser.add_argument("--paths", action="store_true", help="also time every SIMD path on one thread")
    args = parser.parse_args(argv)

    size = (8 if args.quick else 64) * MiB
    repeat, gguf_repeat = (3, 1) if args.quick else (7, 3)
    x = np.random.default_rng(0).standard_normal(size // 4, dtype=np.float32)
    print(f"aprfast quantization kernels: path {_quant.best_path()} (available: "
          f"{', '.join(_quant.available_paths())}), {_quant.default_threads()} threads by default, "
          f"numpy {np.__version__}, gguf {importlib.metadata.version('gguf')}")
    scaling = core_check()
    print(f"core check: 2 threads on independent work do {scaling:.2f}x the work of 1"
          + ("" if scaling >= 1.8 else "  -- the cores are busy, thread ratios below are not meaningful"))
    results = {name: bench_type(name, x, repeat, gguf_repeat) for name in TYPES}
    if args.paths:
        bench_paths(x, repeat)

    print("\nsummary (ratio, target):")
    for name, ratios in results.items():
        print(f"  {name}: " + ", ".join(f"{label} {ratio:.1f}x" for label, ratio in ratios.items()))


if __name__ == "__main__":
    main()
