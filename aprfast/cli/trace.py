"""``apr trace FILE``: a load of the model traced tensor by tensor (seed 001 §4.10, §4.8.5).

aprfast has no inference runtime, so it traces what it owns: opening the file (header,
metadata, index; for a sealed file the signature and key), then for each tensor

* ``read``: the stored bytes fetched from the file (a positional read of the index extent),
* ``decode``: ``get_tensor`` turning them into an array - a zero-copy view for a plain
  tensor, decompression, decryption and chunk checks when the file has them (``steps``
  names which),
* ``stats``: :func:`aprfast.stats.tensor_stats` of the values as they pass,

and last the whole-file ``verify`` (CRC32, signature).  A v1 container's payload is
decompressed and decrypted when it is opened (STREAMING ones chunk by chunk), so for v1
that time is in the ``open`` span and there is no per-tensor read.  A table, ``--json``, or a Chrome
trace (``--chrome out.json``, open in chrome://tracing or Perfetto).  ``--diff OTHER``
traces a second model and compares the statistics tensor by tensor (drift: the larger of
|Δmean| and |Δstd|; §11 #75: identical models show 0), exit 5 beyond ``--tolerance``.  Tracing a forward
pass (activations, layer times) needs a runtime and is out of scope.  The times are
measurements of this run (page cache warm or cold), not properties of the file.
"""

from __future__ import annotations

import json
import math
import os
import time

from ..io import platform as _platform
from ..numerics.stats import tensor_stats
from ._common import (
    EXIT_OK,
    EXIT_VALIDATION,
    UsageError,
    add_key_options,
    fmt,
    non_negative_int,
    open_model,
    print_json,
    refuse_existing,
    shape_text,
    write_atomically,
)

_CHUNK = 1 << 22  # read in 4 MiB pieces: the bytes are counted, never kept


def add_parser(commands) -> None:
    p = commands.add_parser("trace", help="trace a load tensor by tensor: bytes, read/decode/stats times, statistics")
    p.add_argument("file", help="a .apr file")
    p.add_argument("--json", action="store_true", help="print the trace as JSON")
    p.add_argument("--chrome", metavar="OUT.json", help="also write a Chrome trace event file")
    p.add_argument("--diff", metavar="OTHER", help="also trace OTHER and compare each tensor's statistics")
    p.add_argument("--tolerance", type=float, default=0.0, help="--diff: drift above this fails (default 0)")
    p.add_argument("--no-verify", action="store_true", help="skip the whole-file CRC/signature check")
    p.add_argument("--threads", type=non_negative_int, default=0, help="threads for the statistics (0: every core)")
    p.add_argument("-f", "--force", action="store_true", help="replace an existing --chrome file")
    add_key_options(p)
    p.set_defaults(run=run)


def run(args) -> int:
    refuse_existing(args.force, args.chrome)
    if not args.tolerance >= 0:  # also refuses NaN
        raise UsageError(f"--tolerance {args.tolerance}: must be a number >= 0")
    traces = [trace_load(path, args, verify=not args.no_verify, threads=args.threads)
              for path in ([args.file, args.diff] if args.diff else [args.file])]
    if args.chrome:
        write_atomically(args.chrome, json.dumps(chrome_events(*traces)).encode("utf-8"))
    if not args.diff:
        print_json(traces[0]) if args.json else print(format_trace(traces[0]))
        return EXIT_OK
    report = diff_traces(*traces, tolerance=args.tolerance)
    print_json(report) if args.json else print(format_diff(report))
    return EXIT_OK if report["identical_within_tolerance"] else EXIT_VALIDATION


class _Clock:
    """Microseconds since the trace began, and spans measured against it."""

    def __init__(self):
        self.start = time.perf_counter()

    def now(self) -> float:
        return (time.perf_counter() - self.start) * 1e6

    def span(self, fn):
        began = self.now()
        value = fn()
        return value, began, self.now() - began


def trace_load(path, args=None, *, verify: bool = True, threads: int = 0) -> dict:
    """The trace of one load of ``path`` as a dict: ``open`` and ``verify`` spans and one
    entry per tensor (``bytes_read``, ``read_us``, ``decode_us``, ``stats_us``, span
    starts ``*_at_us``, ``steps`` and the statistics)."""
    from ..files.reader import AprFile

    clock = _Clock()
    f, open_at, open_us = clock.span(lambda: open_model(path, args))
    with f:
        steps = _decode_steps(f)
        plain_v2 = isinstance(f, AprFile)
        tensors = [_trace_tensor(f, name, clock, steps, plain_v2, threads) for name in f.keys()]
        verify_span = None
        if verify:
            _, at, took = clock.span(f.verify)
            verify_span = {"at_us": at, "us": took}
    read = sum(t["bytes_read"] or 0 for t in tensors)
    return {"file": os.fspath(path), "layout": getattr(f, "layout", "v1"), "open": {"at_us": open_at, "us": open_us},
            "verify": verify_span, "bytes_read": read, "total_us": clock.now(), "decode_steps": steps,
            "tensors": tensors}


def _decode_steps(f) -> list:
    header = getattr(f, "header", {}) or {}
    flags = " ".join(header.get("flag_names", ())) if isinstance(header, dict) else ""
    steps = []
    if "COMPRESS" in flags or str(header.get("compression_name", "none")).lower() not in ("none", ""):
        steps.append("decompress")
    if "ENCRYPTED" in flags:
        steps.append("decrypt")
    if "SIGNED" in flags or "ENCRYPTED" in flags:
        steps.append("check chunks")
    return steps or ["view"]


def _trace_tensor(f, name, clock, steps, plain_v2, threads) -> dict:
    info = f.info(name)
    entry = {"name": name, "dtype": info.dtype_name, "shape": list(info.shape), "bytes_read": None,
             "read_at_us": None, "read_us": None}
    if plain_v2:  # v1 offsets are inside the payload, not the file: no separate read to time
        entry["bytes_read"], entry["read_at_us"], entry["read_us"] = clock.span(
            lambda: _pread(f.path, info.offset, info.nbytes))
    value, entry["decode_at_us"], entry["decode_us"] = clock.span(lambda: f.get_tensor(name))
    entry["steps"] = steps
    try:
        stats, entry["stats_at_us"], entry["stats_us"] = clock.span(lambda: tensor_stats(value, threads=threads))
        entry["stats"] = stats.as_dict()
    except TypeError:  # complex or unknown dtype: no statistics
        entry.update(stats_at_us=None, stats_us=None, stats=None)
    return entry


def _pread(path, offset, size) -> int:
    """Read ``size`` bytes at ``offset`` in bounded chunks; the count read.  The reader
    has already checked every extent against the file, but a short read (a file cut
    while being traced) is still an error, not a smaller number."""
    from ..errors import CorruptError

    fd = os.open(path, os.O_RDONLY)
    try:
        done = 0
        while done < size:
            got = len(_platform.pread(fd, min(size - done, _CHUNK), offset + done))
            if not got:
                raise CorruptError(f"file ends inside a tensor: {size} bytes at offset {offset}", path=path)
            done += got
        return done
    finally:
        os.close(fd)


def chrome_events(*traces) -> dict:
    """The Chrome trace event format: complete ("X") events in microseconds, one process
    (pid) per file and one row (tid) per phase so each tensor's read/decode/stats line up."""
    events = []
    for pid, trace in enumerate(traces, 1):
        events += _file_events(trace, pid)
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"files": [t["file"] for t in traces]}}


def _file_events(trace, pid) -> list:
    events = [_event("open", "load", trace["open"]["at_us"], trace["open"]["us"], pid, 0, {"file": trace["file"]})]
    for t in trace["tensors"]:
        args = {"dtype": t["dtype"], "shape": t["shape"], "bytes": t["bytes_read"]}
        if t["read_us"] is not None:
            events.append(_event(f"read {t['name']}", "read", t["read_at_us"], t["read_us"], pid, 1, args))
        events.append(_event(f"decode {t['name']}", "+".join(t["steps"]), t["decode_at_us"], t["decode_us"], pid, 2,
                             args))
        if t["stats_us"] is not None:
            events.append(_event(f"stats {t['name']}", "stats", t["stats_at_us"], t["stats_us"], pid, 3, t["stats"]))
    if trace["verify"]:
        events.append(_event("verify", "verify", trace["verify"]["at_us"], trace["verify"]["us"], pid, 0, {}))
    events.append({"name": "process_name", "ph": "M", "pid": pid, "args": {"name": trace["file"]}})
    names = {0: "file", 1: "read", 2: "decode", 3: "stats"}
    events += [{"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": n}}
               for tid, n in names.items()]
    return events


def _event(name, cat, ts, dur, pid, tid, args) -> dict:
    from ._common import clean

    return {"name": name, "cat": cat, "ph": "X", "ts": round(ts, 3), "dur": round(dur, 3), "pid": pid, "tid": tid,
            "args": clean(args)}


def diff_traces(a, b, *, tolerance: float = 0.0) -> dict:
    """Each shared tensor's statistics side by side with its drift (max of |Δmean|,
    |Δstd|; NaN statistics on either side drift by infinity), the first divergence,
    and the tensors only one model has."""
    b_tensors = {t["name"]: t for t in b["tensors"]}
    a_names = {t["name"] for t in a["tensors"]}
    rows = []
    for t in a["tensors"]:
        other = b_tensors.get(t["name"])
        if other is None:
            continue
        drift = _drift(t["stats"], other["stats"])
        rows.append({"name": t["name"], "mean_a": (t["stats"] or {}).get("mean"),
                     "mean_b": (other["stats"] or {}).get("mean"), "std_a": (t["stats"] or {}).get("std"),
                     "std_b": (other["stats"] or {}).get("std"), "drift": drift,
                     "status": "MATCH" if drift is not None and drift <= tolerance else
                     ("-" if drift is None else "DRIFT")})
    only_a = [t["name"] for t in a["tensors"] if t["name"] not in b_tensors]
    only_b = [n for n in b_tensors if n not in a_names]
    divergence = next((r["name"] for r in rows if r["status"] == "DRIFT"), None)
    return {"a": a, "b": b, "tolerance": tolerance, "tensors": rows, "only_in_a": only_a, "only_in_b": only_b,
            "divergence": divergence, "identical_within_tolerance": divergence is None and not only_a and not only_b}


def _drift(sa, sb):
    """None when neither side has statistics (integer or unknown dtypes on both)."""
    if not sa and not sb:
        return None
    if not sa or not sb:
        return math.inf
    deltas = []
    for key in ("mean", "std"):
        x, y = sa.get(key), sb.get(key)
        if x is None and y is None:
            continue
        if x is None or y is None or math.isnan(x) or math.isnan(y):
            return math.inf
        deltas.append(abs(x - y))
    return max(deltas, default=0.0)


def format_diff(report) -> str:
    lines = [f"Trace diff: {report['a']['file']} vs {report['b']['file']} (tolerance {report['tolerance']})",
             f"{'tensor':<40} {'mean a':>10} {'mean b':>10} {'std a':>10} {'std b':>10} {'drift':>10}  status"]
    for r in report["tensors"]:
        lines.append(f"{r['name'][:40]:<40} {fmt(r['mean_a']):>10} {fmt(r['mean_b']):>10} {fmt(r['std_a']):>10} "
                     f"{fmt(r['std_b']):>10} {fmt(r['drift']):>10}  {r['status']}")
    for side, names in (("a", report["only_in_a"]), ("b", report["only_in_b"])):
        if names:
            lines.append(f"only in {report[side]['file']}: {', '.join(names)}")
    if report["divergence"]:
        row = next(r for r in report["tensors"] if r["name"] == report["divergence"])
        lines.append(f"Divergence detected at: {row['name']} (mean {fmt(row['mean_a'])} -> {fmt(row['mean_b'])})")
    else:
        lines.append("No drift: " + ("every tensor matches" if report["identical_within_tolerance"] else
                                     "shared tensors match, but the tensor sets differ"))
    return "\n".join(lines)


def format_trace(trace) -> str:
    lines = [f"{trace['file']}: {trace['layout']} layout, decode = {'+'.join(trace['decode_steps'])}",
             f"{'tensor':<36} {'dtype':<8} {'shape':<14} {'bytes':>10} {'read ms':>8} {'decode ms':>9} "
             f"{'stats ms':>8} {'min':>9} {'max':>9} {'mean':>9} {'std':>9}"]
    for t in trace["tensors"]:
        s = t["stats"] or {}
        lines.append(f"{t['name'][:36]:<36} {t['dtype']:<8} {shape_text(t['shape'])[:14]:<14} "
                     f"{fmt(t['bytes_read']):>10} {_ms(t['read_us']):>8} {_ms(t['decode_us']):>9} "
                     f"{_ms(t['stats_us']):>8} {fmt(s.get('min')):>9} {fmt(s.get('max')):>9} "
                     f"{fmt(s.get('mean')):>9} {fmt(s.get('std')):>9}")
    verify = f", verify {_ms(trace['verify']['us'])} ms" if trace["verify"] else ""
    lines.append(f"TOTAL {trace['bytes_read']} bytes read, open {_ms(trace['open']['us'])} ms{verify}, "
                 f"{_ms(trace['total_us'])} ms in all")
    return "\n".join(lines)


def _ms(us) -> str:
    return "-" if us is None else f"{us / 1000:.3f}"
