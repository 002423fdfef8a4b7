"""aprfast's GGML quantization beside gguf-py (llama.cpp's NumPy quantizers), same run.

    python benchmarks/bench_quant.py            # 64 MiB of float32 (16 Mi elements), 5 rounds
    python benchmarks/bench_quant.py --quick    # 8 MiB, 3 rounds
    python benchmarks/bench_quant.py --paths    # also time each SIMD path (one thread, 8 MiB)
    python benchmarks/bench_quant.py --dequantize all   # dequantize rows for every type gguf-py reads

Like with like, for Q8_0, Q4_0 and Q4_1, quantize and dequantize:

* allocating API vs allocating API: ``aprfast.quantize(x, "q8_0")`` /
  ``aprfast.dequantize(qt)`` against ``gguf.quants.quantize(x, qtype)`` /
  ``gguf.quants.dequantize(raw, qtype)``.  aprfast is shown on one thread and with the
  default ``threads=0`` (the cores idle at the call) against the same gguf samples
  (NumPy, one thread).  In a loop aprfast's 64 MiB results come from its cache of freed
  buffers; the fresh-memory dequantize row empties that cache before each call (untimed).
* the kernels into a preallocated output (``_quant.quantize_q8_0(x, out)``) have no
  peer: gguf-py has no ``out=``; they give the 1 vs 2 thread scaling, as measured.

And for the dequantize-only types (issue 27), ``aprfast.dequantize`` of 64 MiB of random
blocks (``--dequantize``: Q3_K and Q5_K by default, ``all`` for every type gguf-py can
dequantize) against ``gguf.quants.dequantize``.  Where ``llama-cpp-python`` is installed
(``pip install llama-cpp-python`` builds llama.cpp's ``ggml`` libraries from source), a
second row per type times aprfast's kernel into a preallocated output, one thread,
against llama.cpp's own C dequantizer for that type, ``ggml_get_type_traits(type)->to_float``
from ``libggml-base``, called through ctypes (which drops the GIL) into a preallocated
output, one thread: the like-for-like kernel comparison.  Its floats are checked equal
to aprfast's first.

Bytes and floats are checked identical to gguf-py's before anything is timed.

``--clock thread`` times every sample by the CPU time of the calling thread
(``time.thread_time``) instead of the wall clock: on a shared machine other processes
barely move it, so the ratios settle where wall times swing 2-3x between runs.  Only the
one-thread rows are timed then (aprfast ``threads=1``, gguf-py's NumPy, llama.cpp's
to_float, all on the calling thread): the CPU time of a thread a tool starts is not
the calling thread's, so the ``threads=0`` and 2-thread rows are left out.

    python benchmarks/bench_quant.py --clock thread --quantize '' --dequantize all
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
import warnings

import numpy as np
import timing
from timing import Row, Table, interleaved

import aprfast
from aprfast import _quant
from aprfast._memory import release_buffer_cache

try:
    import gguf
    from gguf import GGMLQuantizationType
    GGUF_WHY = None
except ImportError as exc:  # pragma: no cover
    gguf = None
    GGUF_WHY = f"not installed ({exc.name}): aprfast's rows run without a peer; pip install .[bench]"

MiB = 1 << 20


def ggml_to_float():
    """``(type id, name) -> to_float`` from llama.cpp's libggml-base (the llama-cpp-python
    package's build), or None and the reason it is absent."""
    import ctypes
    import importlib.util
    import pathlib

    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or spec.origin is None:
        return None, "llama-cpp-python is not installed (pip install llama-cpp-python builds it)"
    libs = sorted(pathlib.Path(spec.origin).parent.glob("lib/libggml-base.*"))
    if not libs:
        return None, "llama-cpp-python has no lib/libggml-base.*"
    base = ctypes.CDLL(str(libs[0]))
    to_float_t = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)

    class Traits(ctypes.Structure):  # struct ggml_type_traits in ggml.h (ggml 0.25)
        _fields_ = [("type_name", ctypes.c_char_p), ("blck_size", ctypes.c_int64),
                    ("blck_size_interleave", ctypes.c_int64), ("type_size", ctypes.c_size_t),
                    ("is_quantized", ctypes.c_bool), ("to_float", to_float_t), ("from_float_ref", ctypes.c_void_p)]

    base.ggml_get_type_traits.restype = ctypes.POINTER(Traits)
    base.ggml_get_type_traits.argtypes = [ctypes.c_int]

    def lookup(type_id: int, name: str):
        traits = base.ggml_get_type_traits(type_id).contents
        if (traits.type_name or b"").decode().upper() != name or not traits.to_float:
            return None
        return traits.to_float
    return lookup, None
TYPES = ("Q8_0", "Q4_0", "Q4_1")
DEQUANTIZE = ("Q3_K", "Q5_K")
#: Every GGML block type aprfast dequantizes: gguf-py 0.19 cannot dequantize Q8_1, Q8_K and
#: Q1_0 (their rows have llama.cpp's to_float as the only peer, where it has one).
DEQUANTIZE_ALL = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q8_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_K",
                  "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M", "IQ4_NL", "IQ4_XS", "TQ1_0",
                  "TQ2_0", "MXFP4", "NVFP4", "Q1_0")
#: What a sample measures (--clock): the wall clock, or the calling thread's CPU time.
CLOCKS = {"wall": time.perf_counter, "thread": time.thread_time}
CLOCK = CLOCKS["wall"]
LLAMA_TO_FLOAT = ggml_to_float()
QUANTIZE = {"Q8_0": _quant.quantize_q8_0, "Q4_0": _quant.quantize_q4_0, "Q4_1": _quant.quantize_q4_1}


def bench_type(table, name, x, rounds):
    n = x.size
    size = f"{n * 4 / MiB:.0f} MiB f32"
    cores = _quant.default_threads()
    qt = aprfast.quantize(x, name.lower())
    if gguf is not None:
        qtype = getattr(GGMLQuantizationType, name)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ref_raw = gguf.quants.quantize(x, qtype).ravel()
            ref_back = gguf.quants.dequantize(ref_raw, qtype).ravel()
        if not np.array_equal(qt.data, ref_raw):
            sys.exit(f"{name}: quantized bytes differ from gguf-py")
        if not np.array_equal(aprfast.dequantize(qt).view(np.uint32), ref_back.view(np.uint32)):
            sys.exit(f"{name}: floats differ from gguf-py")

    def quiet(fn):
        def run():
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return fn()
        return run

    every = f"threads=0 (idle cores, up to {cores})"
    cold = f"{every}, into fresh memory (buffer cache emptied first)"
    for op, ours, theirs in (
            ("quantize", lambda t: aprfast.quantize(x, name.lower(), threads=t),
             quiet(lambda: gguf.quants.quantize(x, qtype)) if gguf is not None else None),
            ("dequantize", lambda t: aprfast.dequantize(qt, threads=t),
             quiet(lambda: gguf.quants.dequantize(ref_raw, qtype)) if gguf is not None else None)):
        tools = {"threads=1": lambda: ours(1)}
        if CLOCK is CLOCKS["wall"]:  # a thread's CPU time does not count the threads it starts
            tools[every] = lambda: ours(0)
            if op == "dequantize":  # 64 MiB of floats: from aprfast's buffer cache, unless it is emptied
                tools[cold] = lambda: ours(0)
        if theirs is not None:
            tools["gguf"] = theirs
        r = interleaved(tools, rounds, setup={cold: release_buffer_cache}, clock=CLOCK)
        peer = {f"gguf.quants.{op} (1 thread)": r.pop("gguf")} if "gguf" in r else None
        for label, samples in r.items():
            table.add(Row(f"{name} {op}, allocating, aprfast {label}", size, samples, peer))

    if CLOCK is not CLOCKS["wall"]:
        return
    # the kernels into a preallocated output, 1 vs 2 threads: no peer has out=
    raw = np.empty(_quant.quantized_nbytes(name, n), np.uint8)
    back = np.empty(n, np.float32)
    quantize = QUANTIZE[name]
    r = interleaved({"q1": lambda: quantize(x, raw, threads=1), "q2": lambda: quantize(x, raw, threads=2),
                     "d1": lambda: _quant.dequantize(name, raw, back, threads=1),
                     "d2": lambda: _quant.dequantize(name, raw, back, threads=2)}, rounds, min_sample=0.02)
    table.notes.append(
        f"{name} kernels into a preallocated out (no peer: gguf-py has no out=), as measured: quantize "
        f"1 thread {r['q1'].text()}, 2 threads {r['q2'].text()} ({r['q1'].median / r['q2'].median:.2f}x); "
        f"dequantize 1 thread {r['d1'].text()}, 2 threads {r['d2'].text()} "
        f"({r['d1'].median / r['d2'].median:.2f}x).")


def bench_dequantize(table, name, nbytes, rounds):
    """``aprfast.dequantize`` of ``nbytes`` of random blocks against gguf-py's, floats checked first."""
    from aprfast.tensors import QuantizedTensor

    elems, block_bytes = _quant.block_info(name)
    blocks = nbytes // block_bytes
    raw = np.random.default_rng(1).integers(0, 256, blocks * block_bytes, dtype=np.uint8)
    qt = QuantizedTensor(aprfast.dtypes.by_name(name), (blocks // 64, 64 * elems), raw[: blocks // 64 * 64
                                                                                       * block_bytes])
    tools = {"threads=1": lambda: aprfast.dequantize(qt, threads=1)}
    if CLOCK is CLOCKS["wall"]:  # a thread's CPU time does not count the threads it starts
        tools[f"threads=0 (idle cores, up to {_quant.default_threads()})"] = lambda: aprfast.dequantize(qt, threads=0)
    peer = gguf is not None
    if peer:
        qtype = getattr(GGMLQuantizationType, name)
        ref = qt.data.reshape(qt.shape[0], -1)
        try:
            with warnings.catch_warnings(), np.errstate(all="ignore"):
                warnings.simplefilter("ignore")
                want = gguf.quants.dequantize(ref[:1], qtype)
        except NotImplementedError:
            table.skip(f"{name} gguf.quants.dequantize", "gguf-py cannot dequantize this type")
            peer = False
    if peer:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            want = gguf.quants.dequantize(ref, qtype)
        if not np.array_equal(aprfast.dequantize(qt).view(np.uint32), want.view(np.uint32)):
            sys.exit(f"{name}: floats differ from gguf-py")
        del want

        def theirs():
            with warnings.catch_warnings(), np.errstate(all="ignore"):
                warnings.simplefilter("ignore")
                return gguf.quants.dequantize(ref, qtype)
        tools["gguf"] = theirs
    r = interleaved(tools, rounds, clock=CLOCK)
    peer = {"gguf.quants.dequantize (1 thread)": r.pop("gguf")} if "gguf" in r else None
    for label, samples in r.items():
        table.add(Row(f"{name} dequantize, allocating, aprfast {label}", f"{qt.nbytes / MiB:.0f} MiB blocks",
                      samples, peer))
    bench_to_float(table, name, qt, rounds)


def bench_to_float(table, name, qt, rounds):
    """aprfast's kernel against llama.cpp's to_float for ``name``, both one thread into a
    preallocated output, floats checked equal first."""
    lookup, why = LLAMA_TO_FLOAT
    if lookup is None or gguf is None:
        table.skip("llama.cpp to_float rows", why or GGUF_WHY)
        return
    to_float = lookup(int(getattr(GGMLQuantizationType, name)), name)
    if to_float is None:
        table.skip(f"{name} llama.cpp to_float", "this ggml build has no to_float for it")
        return
    raw = np.ascontiguousarray(qt.data)
    n = int(np.prod(qt.shape))
    ours, theirs = np.empty(n, np.float32), np.empty(n, np.float32)
    _quant.dequantize(name, raw, ours, threads=1)
    to_float(raw.ctypes.data, theirs.ctypes.data, n)
    differ = ours.view(np.uint32) != theirs.view(np.uint32)
    if (differ & ~(np.isnan(ours) & np.isnan(theirs))).any():
        table.skip(f"{name} llama.cpp to_float", "its floats differ from aprfast's (FORMAT.md: which we follow)")
        return
    if differ.any():  # random blocks hold NaN scales; ggml negates them and quiets signalling ones
        table.notes.append(f"{name}: llama.cpp's to_float gives the same floats except the sign or quiet bit of "
                           f"{int(differ.sum())} NaNs (docs/FORMAT.md, NaN and infinity)")
    r = interleaved({"aprfast": lambda: _quant.dequantize(name, raw, ours, threads=1),
                     "llama.cpp": lambda: to_float(raw.ctypes.data, theirs.ctypes.data, n)}, rounds, clock=CLOCK)
    table.add(Row(f"{name} dequantize into out=, 1 thread, aprfast kernel", f"{qt.nbytes / MiB:.0f} MiB blocks",
                  r["aprfast"], others={"llama.cpp ggml to_float (1 thread)": r["llama.cpp"]}))


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


def bench_paths(x, rounds):
    """Each available SIMD path on one thread, for every type both ways, on 8 MiB."""
    x = x[: 2 * MiB]
    n = x.size
    print("\nper path, 1 thread, 8 MiB of float32 (median GB/s of float32):")
    names = ("Q8_0", "Q4_0", "Q4_1", "APR_Q8", "APR_Q4", "Q8_TENSOR", "Q5_0", "Q5_1", "Q4_K", "Q6_K")
    paths = _quant.available_paths()
    print(f"  {'':12s}" + "".join(f"{p:>22s}" for p in paths))
    for name in names:
        raw = np.empty(_quant.quantized_nbytes(name, n), np.uint8)
        back = np.empty(n, np.float32)
        if _quant.can_quantize(name):
            _quant.quantize(name, x, raw)
        else:
            raw[:] = np.random.default_rng(0).integers(0, 256, raw.size, dtype=np.uint8)
        tools = {}
        for p in paths:
            if _quant.can_quantize(name):
                tools["q " + p] = lambda p=p: _quant.quantize(name, x, raw, threads=1, path=p)
            tools["d " + p] = lambda p=p: _quant.dequantize(name, raw, back, threads=1, path=p)
        r = interleaved(tools, rounds, min_sample=0.01)
        cells = []
        for p in paths:
            q = f"q {n * 4 / r['q ' + p].median / 1e9:5.1f}" if "q " + p in r else "q    - "
            cells.append(f"{q}  dq {n * 4 / r['d ' + p].median / 1e9:5.1f}")
        print(f"  {name:12s}" + "".join(f"{c:>22s}" for c in cells))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="8 MiB instead of 64 MiB, 3 rounds")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--paths", action="store_true", help="also time every SIMD path on one thread")
    parser.add_argument("--md-out", default=None, help="also write the Markdown table to this file")
    parser.add_argument("--dequantize", default=",".join(DEQUANTIZE),
                        help="types to dequantize from random blocks (comma-separated, 'all', or '' for none)")
    parser.add_argument("--quantize", default=",".join(TYPES),
                        help=f"types to quantize and dequantize both ways (of {', '.join(TYPES)}; '' for none)")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="wall",
                        help="what a sample measures: the wall clock (default) or the calling thread's CPU time "
                             "(steadier on a busy machine; one-thread rows only)")
    args = parser.parse_args(argv)
    global CLOCK
    CLOCK = CLOCKS[args.clock]

    size = (8 if args.quick else 64) * MiB
    rounds = 3 if args.quick else args.rounds
    x = np.random.default_rng(0).standard_normal(size // 4, dtype=np.float32)
    versions = (f"gguf {timing.version('gguf') if gguf else 'absent'}, quant path {_quant.best_path()} (available: "
                f"{', '.join(_quant.available_paths())})")
    title = "GGML quantization" + (", CPU time of the calling thread" if args.clock == "thread" else "")
    table = Table(title, "gguf-py (gguf.quants)", versions=versions)
    if gguf is None:
        table.skip("gguf-py", GGUF_WHY)
    scaling = core_check()
    table.notes.append(f"core check: 2 threads on independent cache-resident work did {scaling:.2f}x the work of 1"
                       + ("" if scaling >= 1.8 else " — the cores were busy, so thread ratios understate scaling"))
    print(table.notes[-1], flush=True)
    if args.clock != "wall":
        table.notes.append("--clock thread: every sample is the CPU time of the calling thread (time.thread_time), "
                           "not wall time; only one-thread rows are timed")
    for name in (t.upper() for t in args.quantize.split(",") if t):
        if name not in TYPES:
            parser.error(f"--quantize: {name} is not one of {', '.join(TYPES)}")
        bench_type(table, name, x, rounds)
    extra = DEQUANTIZE_ALL if args.dequantize == "all" else [t for t in args.dequantize.split(",") if t]
    for name in extra:
        bench_dequantize(table, name.upper(), size, rounds)
    if args.paths:
        bench_paths(x, rounds)
    table.finish(args.md_out)


if __name__ == "__main__":
    main()
