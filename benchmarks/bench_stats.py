"""aprfast's one-pass tensor statistics beside NumPy computing the same set.

    python benchmarks/bench_stats.py            # 256 MiB of float32 (64 Mi elements), 7 rounds
    python benchmarks/bench_stats.py --quick    # 32 MiB, 5 rounds

The set (issue 13's target: aprfast at least 4x faster than NumPy on 256 MiB of float32):
``min``, ``max``, ``mean``, ``std``, ``isnan().sum()``, ``isinf().sum()``,
``count_nonzero`` and a 64-bin ``histogram`` over the data's min..max.

Rows, each aprfast against that whole NumPy sequence (NumPy runs on one thread):

* ``tensor_stats(x, bins=64)`` - no range given, so aprfast reads the tensor twice
  (moments, then the histogram over the min..max it found), as ``np.histogram`` does;
* ``tensor_stats(x, bins=64, range=...)`` - the range known, one pass;
* ``tensor_stats(x)`` - no histogram, against NumPy's set without ``histogram``;

each with one thread and with every core; and the second target of issue 13: the 100-point
quality assessment (``apr validate --quality``: ``aprfast.tools.quality.quality_report``) of a
model at most twice the time of one owned ``load_file(mmap=False)`` of it (``--model-mib``,
512 by default, 64 with ``--quick``; both into a fresh path's file, interleaved).  The data is
standard-normal float32 with no
NaN (NumPy's ``min``/``mean`` would give NaN otherwise, a different answer).  The
answers are compared before timing: counts and histogram exactly, moments to 1e-6.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import numpy as np
from timing import Row, Table, interleaved

import aprfast
from aprfast.numerics.stats import tensor_stats
from aprfast.tools.quality import quality_report

MiB = 1 << 20
BINS = 64


def numpy_set(x, hist=True, range_=None):
    out = (x.min(), x.max(), x.mean(), x.std(), np.isnan(x).sum(), np.isinf(x).sum(), np.count_nonzero(x))
    if hist:
        out += (np.histogram(x, BINS, range=range_),)
    return out


def check(x):
    ours = tensor_stats(x, bins=BINS)
    mn, mx, mean, std, nan, inf, nonzero, (counts, _) = numpy_set(x)
    if (ours.min, ours.max) != (float(mn), float(mx)) or (ours.nan_count, ours.inf_count) != (nan, inf) \
            or ours.count - ours.zero_count != nonzero:
        sys.exit("aprfast and NumPy disagree on min/max/counts")
    if abs(ours.mean - mean) > 1e-6 or abs(ours.std - std) > 1e-6:
        sys.exit(f"aprfast and NumPy disagree on mean/std: {ours.mean} {mean} {ours.std} {std}")
    if sum(ours.histogram) != counts.sum() or max(abs(int(a) - int(b)) for a, b in zip(ours.histogram, counts)) > 64:
        sys.exit("aprfast and NumPy disagree on the histogram")


def bench(table, n, rounds):
    x = np.random.default_rng(0).standard_normal(n, dtype=np.float32)
    check(x)
    size = f"{n * 4 / MiB:.0f} MiB f32"
    lo, hi = float(x.min()), float(x.max())
    cores = os.cpu_count()
    cases = (("min..max found (2 passes), 64 bins", dict(bins=BINS), lambda: numpy_set(x)),
             ("range given (1 pass), 64 bins", dict(bins=BINS, range=(lo, hi)), lambda: numpy_set(x, True, (lo, hi))),
             ("no histogram", {}, lambda: numpy_set(x, False)))
    for label, kwargs, peer in cases:
        for threads, tlabel in ((1, "1 thread"), (0, f"all {cores} cores")):
            r = interleaved({"aprfast": lambda: tensor_stats(x, threads=threads, **kwargs), "numpy": peer},
                            rounds, slow=5.0)
            table.add(Row(f"stats, {label}, aprfast {tlabel}", size, r["aprfast"],
                          {"NumPy set (1 thread)": r["numpy"]}))
    table.notes.append("NumPy set: min, max, mean, std, isnan().sum(), isinf().sum(), count_nonzero, "
                       f"histogram({BINS}); NumPy runs on one thread whatever the row says.")


def bench_quality(table, model_bytes, rounds):
    """quality_report of a model of LayerNorm, bias and linear tensors against one owned load."""
    rng = np.random.default_rng(1)
    per = 4 * MiB
    tensors = {}
    for i in range(max(1, model_bytes // per)):
        tensors[f"encoder.layers.{i}.fc1.weight"] = (rng.standard_normal(per // 4, dtype=np.float32) * 0.03
                                                     ).reshape(1024, -1)
        tensors[f"encoder.layers.{i}.layer_norm.weight"] = np.ones(1024, np.float32)
        tensors[f"encoder.layers.{i}.layer_norm.bias"] = np.zeros(1024, np.float32)
    with tempfile.TemporaryDirectory(dir=os.environ.get("APRFAST_BENCH_DIR")) as d:
        path = os.path.join(d, "model.apr")
        aprfast.save_file(tensors, path, metadata={"model_type": "whisper"}, durable=False)
        del tensors
        report = quality_report(path)
        size = f"{os.path.getsize(path) / MiB:.0f} MiB model"
        r = interleaved({"quality": lambda: quality_report(path),
                         "load_file(mmap=False)": lambda: aprfast.load_file(path, mmap=False)}, rounds, slow=5.0)
        table.add(Row("apr validate --quality (quality_report), all cores", size, r["quality"],
                      {"load_file(mmap=False)": r["load_file(mmap=False)"]}))
        table.notes.append(f"quality row: score {report.get('score')} of {report.get('max_score', 100)}; target: "
                           "the assessment at most 2x one load (ratio >= 0.5)")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="32 MiB, 5 rounds")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--md-out", default=None, help="also write the Markdown table to this file")
    parser.add_argument("--model-mib", type=int, default=None, help="model size of the quality row (default 512)")
    args = parser.parse_args()
    n = (32 if args.quick else 256) * MiB // 4
    rounds = 5 if args.quick else args.rounds
    table = Table("tensor statistics", "NumPy", versions=f"numpy {np.__version__}")
    bench(table, n, rounds)
    bench_quality(table, (args.model_mib or (64 if args.quick else 512)) * MiB, rounds)
    table.finish(args.md_out)


if __name__ == "__main__":
    main()
