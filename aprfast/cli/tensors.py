"""``apr tensors FILE``: the tensor list (``--filter GLOB``), ``--stats`` per tensor with
PASS/WARN/FAIL against seed 001 §10.9's expected ranges (exit 5 if any FAIL), and
``--hist NAME``, a terminal histogram of one tensor."""

from __future__ import annotations

import fnmatch
import sys

from ..files.integrity import CheckedReader
from ..numerics.expectations import check_value
from ..numerics.stats import tensor_stats
from ._common import (
    EXIT_ERROR,
    EXIT_OK,
    EXIT_VALIDATION,
    add_key_options,
    add_verify_option,
    fmt,
    non_negative_int,
    open_model,
    print_json,
    shape_text,
    verify_from,
)


def add_parser(commands) -> None:
    p = commands.add_parser("tensors", help="list tensors; --stats checks them against expected ranges")
    p.add_argument("file", help="a .apr file")
    p.add_argument("--filter", metavar="GLOB", help="only tensors whose name matches (fnmatch, e.g. '*.weight')")
    p.add_argument("--stats", action="store_true",
                   help="min/max/mean/std, NaN/Inf/zero counts, sparsity, PASS/WARN/FAIL (exit 5 on FAIL)")
    p.add_argument("--hist", metavar="NAME", help="print a terminal histogram of tensor NAME")
    p.add_argument("--bins", type=int, default=20, help="histogram bins (default 20)")
    p.add_argument("--threads", type=non_negative_int, default=0, help="threads for the statistics (0: every core)")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")
    add_key_options(p)
    add_verify_option(p)
    p.set_defaults(run=run)


def run(args) -> int:
    with open_model(args.file, args) as f:
        if args.hist:
            return _hist(f, args)
        # --stats reads every tensor: the file's CRC runs over those reads and is compared
        # before anything is printed (issue 28 item 1)
        rows = list_tensors(f, pattern=args.filter, stats=args.stats, threads=args.threads,
                            verify=bool(args.stats) and verify_from(args))
    if args.json:
        print_json({"file": args.file, "tensors": rows})
    else:
        print(format_rows(rows, args.stats))
    failed = [r["name"] for r in rows if r.get("status") == "FAIL"]
    if failed:
        print(f"apr tensors: {len(failed)} tensor(s) FAIL the expected ranges: {', '.join(failed)}",
              file=sys.stderr)
        return EXIT_VALIDATION
    return EXIT_OK


def list_tensors(f, *, pattern=None, stats=False, threads=0, verify=False) -> list:
    """One dict per tensor (name, dtype, shape, nbytes; with ``stats`` also the
    statistics, ``status`` PASS/WARN/FAIL/- and ``reasons``).  ``verify`` (with
    ``stats``): check the file's CRC32 over the bytes the statistics read and raise
    ChecksumError before returning (:class:`aprfast.files.integrity.CheckedReader`)."""
    reader = CheckedReader(f, verify=verify and stats)
    rows = []
    for name in f.keys():
        if pattern and not fnmatch.fnmatchcase(name, pattern):
            continue
        info = f.info(name)
        row = {"name": name, "dtype": info.dtype_name, "shape": list(info.shape), "nbytes": info.nbytes}
        if stats:
            # a compressed-tensors weight: the statistics of its values, not of its packed bytes
            real = name in getattr(f, "compressed_weights", {})
            row.update(_stats_row(name, reader.get_tensor(name, dequantize=real), threads))
        rows.append(row)
    reader.finish()
    return rows


def _stats_row(name, tensor, threads) -> dict:
    s, verdict = check_value(name, tensor, threads=threads)
    if s is None:
        return {"stats": None, "status": "-", "reasons": list(verdict.reasons)}
    return {"stats": s.as_dict(), "status": verdict.status, "role": verdict.role, "reasons": list(verdict.reasons)}


def format_rows(rows, stats) -> str:
    if not rows:
        return "no tensors"
    width = max(len(r["name"]) for r in rows)
    lines = []
    if stats:
        lines.append(f"{'':6} {'name':<{width}}  {'dtype':<8} {'shape':<14} {'min':>10} {'max':>10} "
                     f"{'mean':>10} {'std':>10} {'nan':>5} {'inf':>5} {'zeros':>7}")
    for r in rows:
        shape = shape_text(r["shape"])
        if not stats:
            lines.append(f"{r['name']:<{width}}  {r['dtype']:<8} {shape:<20} {r['nbytes']:>12} B")
            continue
        s = r["stats"]
        if s is None:
            lines.append(f"[{r['status']:>4}] {r['name']:<{width}}  {r['dtype']:<8} {shape:<14} "
                         f"({r['reasons'][0]})")
            continue
        lines.append(f"[{r['status']:>4}] {r['name']:<{width}}  {r['dtype']:<8} {shape:<14} {fmt(s['min']):>10} "
                     f"{fmt(s['max']):>10} {fmt(s['mean']):>10} {fmt(s['std']):>10} {s['nan_count']:>5} "
                     f"{s['inf_count']:>5} {s['sparsity']:>6.1%}")
        for reason in r["reasons"]:
            lines.append(f"{'':7}{reason}")
    return "\n".join(lines)


def _hist(f, args) -> int:
    name = args.hist
    if name not in f:
        from .explain import suggest

        close = suggest(name, f.keys())
        print(f"apr tensors: no tensor named {name!r}" + (f"; did you mean: {', '.join(close)}" if close else ""),
              file=sys.stderr)
        return EXIT_ERROR
    if args.bins < 1:
        from ._common import UsageError

        raise UsageError("--bins must be at least 1")
    info = f.info(name)
    s = tensor_stats(f.get_tensor(name), bins=args.bins, threads=args.threads)
    if args.json:
        print_json({"file": args.file, "name": name, "dtype": info.dtype_name, "shape": list(info.shape),
                    "stats": s.as_dict()})
    else:
        print(render_histogram(name, info, s))
    return EXIT_OK


def render_histogram(name, info, s, width: int = 40) -> str:
    """The terminal histogram of seed 001 §4.2.1, one bar per bin."""
    lines = [f"Distribution: {name} (shape: {list(info.shape)}, {info.dtype_name})",
             f"Min: {fmt(s.min)}  Max: {fmt(s.max)}  Mean: {fmt(s.mean)}  Std: {fmt(s.std)}"
             + (f"  NaN: {s.nan_count}  Inf: {s.inf_count}" if s.nan_count or s.inf_count else ""), ""]
    if not s.finite_count:
        lines.append("(no finite values)")
        return "\n".join(lines)
    top = max(s.histogram) or 1
    edges = s.bin_edges
    for i, count in enumerate(s.histogram):
        bar = "#" * round(count / top * width)
        close = "]" if i == len(s.histogram) - 1 else ")"
        lines.append(f"  [{edges[i]:>10.4g}, {edges[i + 1]:>10.4g}{close} {bar:<{width}} {count}")
    return "\n".join(lines)
