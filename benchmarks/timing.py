"""What every benchmark script shares: timing that keeps all samples, tools run
round-robin, the machine's state, and the Markdown table the README pastes.

Method (the same for every row of every script):

* Each tool is warmed up once (page cache, first touch, code paths), then timed in
  ``rounds`` rounds; within a round the tools run one after another (A, B, C, then
  B, A, C, ...: :func:`schedule`), so a burst of load from other processes hits every
  tool alike instead of the whole loop of one of them, and no tool always runs after
  the same one.
* A sample is one call, or, for calls too short for the timer, a loop of calls lasting
  about ``min_sample`` seconds (like timeit) divided by its length.  ``setup`` runs
  before every call outside the timed region (e.g. removing the destination of a save).
  With ``independent=True`` (bench_containers.py's default) a sample is always one
  call, its result dropped untimed before the next tool runs: the loop an outside
  reviewer writes, where no call reuses buffers its own predecessor just freed.
* Reported: the median over the rounds and the min..max range.  Ratios are
  peer median / aprfast median: above 1 means aprfast is faster.
"""

from __future__ import annotations

import gc
import math
import os
import platform
import shlex
import statistics
import sys
import time

__all__ = ["Samples", "interleaved", "schedule", "machine", "Row", "Table", "fmt_time", "fmt_bytes", "command_line"]


class Samples(list):
    """Per-call values (seconds, or bytes for memory rows) of one tool, one per round."""

    @property
    def median(self) -> float:
        return statistics.median(self)

    @property
    def lo(self) -> float:
        return min(self)

    @property
    def hi(self) -> float:
        return max(self)

    def text(self, unit: str = "s") -> str:
        """"1.23 [1.20..1.41] ms": the median, then min..max in the median's unit."""
        scale, name = _unit(self.median, unit)
        if len(self) == 1:
            return f"{_num(self.median * scale)} {name}"
        return f"{_num(self.median * scale)} [{_num(self.lo * scale)}..{_num(self.hi * scale)}] {name}"


def _num(x: float) -> str:
    if x != x:
        return "n/a"
    return f"{x:.3g}" if abs(x) < 1000 else f"{x:.0f}"


def _unit(value: float, unit: str):
    if unit != "s":
        return 1 / (1 << 20), "MiB"
    for scale, name in ((1, "s"), (1e3, "ms"), (1e6, "µs")):
        if value >= 1 / scale:
            return scale, name
    return 1e9, "ns"


def fmt_time(t: float) -> str:
    scale, name = _unit(t, "s")
    return f"{_num(t * scale)} {name}"


def fmt_bytes(n: float) -> str:
    return f"{_num(n / (1 << 20))} MiB"


def _run(fn, number, setup, clock=time.perf_counter, teardown=None):
    """One sample: the mean time of ``number`` calls, ``setup`` before each and
    ``teardown`` after each, untimed."""
    if setup is None and teardown is None:
        start = clock()
        for _ in range(number):
            fn()
        return (clock() - start) / number
    total = 0.0
    for _ in range(number):
        if setup is not None:
            setup()
        start = clock()
        fn()
        total += clock() - start
        if teardown is not None:
            teardown()
    return total / number


def _calibrate(fn, min_sample, setup, first, clock=time.perf_counter, teardown=None):
    """How many calls make one sample last about ``min_sample`` seconds (1 for slow calls);
    ``first`` is the time of the warm-up call, so a slow call is not run again to learn it."""
    number, elapsed = 1, first
    while min_sample > 0 and elapsed < min_sample and number < 1_000_000:
        number *= max(2, min(10, int(min_sample / max(elapsed, 1e-9)) + 1))
        elapsed = _run(fn, number, setup, clock, teardown) * number
    return number


def _once(fn, setup, clock=time.perf_counter, teardown=None) -> float:
    """One independent sample: ``setup``, one timed call, ``teardown``, and its result
    dropped (and garbage collected) after the clock stops, so the next tool starts
    without it."""
    if setup is not None:
        setup()
    gc.collect()
    start = clock()
    result = fn()
    elapsed = clock() - start
    if teardown is not None:
        teardown()
    del result
    gc.collect()
    return elapsed


def schedule(names: list, i: int) -> list:
    """The order of round ``i``: ``names`` taken with a stride coprime to their count,
    starting at ``i``, the stride changing each round.

    Why not a rotation: rotating keeps each tool's predecessor (C always follows B), and
    what the predecessor leaves decides the sample on a VM that hands freed memory back
    to the host.  In the 4 GiB warm row, ``backend="auto"`` always followed a direct
    read, which drops the file from the page cache, so the next setup read 4 GiB back
    into the cache with the memory just freed and the auto sample populated memory the
    host had taken back: 3.17 s, while ``backend="pread"`` (the same code path, after
    auto) took 0.50 s (stop 41).  With stride s, tool k follows tool k - s, so n tools
    see up to phi(n) different predecessors over as many rounds.

    Examples:
        >>> schedule(["a", "b", "c", "d"], 0)
        ['a', 'b', 'c', 'd']
        >>> schedule(["a", "b", "c", "d"], 1)
        ['b', 'a', 'd', 'c']
    """
    n = len(names)
    if n == 0:
        return []
    strides = [s for s in range(1, n) if math.gcd(s, n) == 1] or [1]
    stride = strides[i % len(strides)]
    return [names[(i + j * stride) % n] for j in range(n)]


def interleaved(tools: dict, rounds: int, *, min_sample: float = 0.0, setup=None, slow: float | None = None,
                slow_rounds: int = 3, independent: bool = False, clock=time.perf_counter, teardown=None) -> dict:
    """Time every tool of ``tools`` (name -> zero-argument callable) round-robin, in the
    order :func:`schedule` gives each round (each tool follows a different tool from
    round to round).

    ``setup`` is a callable run before every call (of every tool) outside the timed
    region, or a dict name -> callable; ``teardown`` the same, run after every call
    (what a call left behind is measured there, not on the clock).  A tool whose
    warm-up call took longer than ``slow`` seconds is sampled in the first
    ``slow_rounds`` rounds only (its cell then says n=...), so one very slow peer
    cannot stretch a run by minutes.

    ``independent``: every sample is one call whose result is dropped, untimed, before
    the next tool runs (``min_sample`` is ignored): no call of a tool follows another of
    the same tool, so none reuses the memory its predecessor just freed, and freeing a
    result is not timed.  Otherwise a sample is a loop of calls of one tool (about
    ``min_sample`` seconds; results freed inside the loop, where each call may reuse
    the last one's buffers).

    ``clock``: what a sample measures; ``time.thread_time`` gives the CPU time of the
    calling thread, which other processes on a busy machine barely move (for tools whose
    work runs on the calling thread only: a thread they start is not counted).
    Returns name -> Samples (seconds per call)."""
    setups = setup if isinstance(setup, dict) else {name: setup for name in tools}
    teardowns = teardown if isinstance(teardown, dict) else {name: teardown for name in tools}
    names = list(tools)

    def order(i):
        return schedule(names, i)

    if independent:
        limit = {}
        for name, fn in tools.items():
            # warm-up: page cache, first touch, code paths
            first = _once(fn, setups.get(name), clock, teardowns.get(name))
            limit[name] = slow_rounds if slow is not None and first > slow else rounds
        out = {name: Samples() for name in tools}
        for i in range(rounds):
            for name in order(i):
                if i < limit[name]:
                    out[name].append(_once(tools[name], setups.get(name), clock, teardowns.get(name)))
        return out
    numbers, limit = {}, {}
    for name, fn in tools.items():
        # warm-up: page cache, first touch, code paths
        first = _run(fn, 1, setups.get(name), clock, teardowns.get(name))
        numbers[name] = _calibrate(fn, min_sample, setups.get(name), first, clock, teardowns.get(name))
        limit[name] = slow_rounds if slow is not None and first > slow else rounds
    out = {name: Samples() for name in tools}
    for i in range(rounds):
        for name in order(i):
            if i >= limit[name]:
                continue
            gc.collect()
            out[name].append(_run(tools[name], numbers[name], setups.get(name), clock, teardowns.get(name)))
    return out


def loadavg() -> float:
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):  # pragma: no cover - not on every platform
        return float("nan")


def cores() -> str:
    return f"{os.cpu_count()} cores ({usable_cores()} usable by this process)"


def page_reporting_order() -> int | None:
    """The order of the free blocks this kernel reports to a hypervisor (virtio-balloon
    free page reporting: free blocks of 2^order pages go back to the host, and are slow
    to populate again; docs/performance.md, "Fresh memory on a VM that reports free
    pages"), or None where it does not."""
    try:
        with open("/sys/module/page_reporting/parameters/page_reporting_order") as f:
            order = int(f.read())
    except (OSError, ValueError):
        return None
    return order if os.path.isdir("/sys/bus/virtio/drivers/virtio_balloon") else None


MADV_HUGEPAGE, MADV_NOHUGEPAGE, MADV_POPULATE_WRITE = 14, 15, 23  # Linux's values


def usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def populate(nbytes: int, huge: bool, threads: int = 1) -> float:
    """Seconds to populate (``MADV_POPULATE_WRITE``, Linux 5.14+) a fresh private map of
    ``nbytes`` with huge or 4 KiB pages, split over ``threads`` threads: the machine's
    own cost of fresh memory, which every loader that returns arrays of its own pays.

    Why ctypes: ``mmap.madvise`` keeps the GIL during the call, so threads calling it
    would take turns; a ctypes call releases it.  Raises OSError where the kernel
    refuses the advice."""
    import ctypes
    import mmap
    import threading

    if nbytes <= 0:
        return 0.0
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    huge_page = 2 << 20
    m = mmap.mmap(-1, nbytes + huge_page, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    anchor = ctypes.c_char.from_buffer(m)
    try:
        base = (ctypes.addressof(anchor) + huge_page - 1) & ~(huge_page - 1)  # whole huge pages
        libc.madvise(base, nbytes, MADV_HUGEPAGE if huge else MADV_NOHUGEPAGE)  # advisory
        errors = []
        share = -(-nbytes // threads // huge_page) * huge_page

        def work(lo, hi):
            step = 64 << 20
            for at in range(lo, hi, step):
                if libc.madvise(base + at, min(step, hi - at), MADV_POPULATE_WRITE):
                    errors.append(ctypes.get_errno())
                    return

        spans = [(lo, min(lo + share, nbytes)) for lo in range(0, nbytes, share)]
        workers = [threading.Thread(target=work, args=span) for span in spans[1:]]
        start = time.perf_counter()
        for w in workers:
            w.start()
        work(*spans[0])
        for w in workers:
            w.join()
        seconds = time.perf_counter() - start
        if errors:
            raise OSError(errors[0], f"MADV_POPULATE_WRITE refused: {os.strerror(errors[0])}")
        return seconds
    finally:
        del anchor
        m.close()


def machine(extra: str = "", load: bool = True) -> str:
    """The line each script prints first: the 1-minute load average and the cores, so a
    reader can tell a quiet machine from a busy one."""
    import numpy as np

    import aprfast

    text = (f"{cores()}, {platform.machine()}, Python {platform.python_version()}, NumPy {np.__version__}, "
            f"aprfast {aprfast.__version__}")
    if load:
        text = f"load average (1 min) {loadavg():.2f}, " + text
    return text + (f", {extra}" if extra else "")


def command_line() -> str:
    """The command that reproduces this run."""
    script = os.path.relpath(os.path.abspath(sys.argv[0]), os.getcwd())
    args, skip = [], False
    for a in sys.argv[1:]:  # where the table was written to is not part of the measurement
        if skip:
            skip = False
        elif a == "--md-out":
            skip = True
        elif not a.startswith("--md-out="):
            args.append(a)
    return " ".join(shlex.quote(a) for a in ["python", script, *args])


def version(module_name: str) -> str:
    try:
        import importlib.metadata as md

        return md.version(module_name)
    except Exception:  # noqa: BLE001 - only a label
        return "?"


class Row:
    """One comparison: aprfast against the best tool of each group.

    ``primary``: name -> Samples of the main peer's variants (safetensors for the
    containers, NumPy for float16, ...); the fastest variant is shown.  ``others``: the
    other tools for the same job; the fastest is shown.  ``limits``: what no tool can
    beat (a plain read, the raw primitive), shown for scale and never counted as a loss."""

    def __init__(self, path, size, aprfast, primary=None, others=None, limits=None, unit="s", note=""):
        self.path, self.size, self.aprfast = path, size, aprfast
        self.primary, self.others, self.limits = primary or {}, others or {}, limits or {}
        self.unit, self.note = unit, note

    @staticmethod
    def _best(group):
        if not group:
            return None, None
        name = min(group, key=lambda k: group[k].median)
        return name, group[name]

    def ratio(self, samples) -> float:
        return samples.median / self.aprfast.median if self.aprfast.median > 0 else float("nan")

    def cell(self, group, with_name=True):
        name, samples = self._best(group)
        if samples is None:
            return "—"
        label = f"{name}: " if with_name else ""
        fewer = f" (n={len(samples)})" if len(samples) < len(self.aprfast) else ""
        return f"{label}{samples.text(self.unit)}{fewer}"

    def paired(self, samples):
        """The ratio of each round (the limit's sample over aprfast's of the same round),
        or None where the two do not pair up one to one.

        Why: against a limit on a shared disk the two medians can come from different
        minutes (the development VM's fio direct write of 504 MiB took 118 ms and 255 ms
        within the same hour, stop 37); a round runs both seconds apart, so the ratio of
        each round cancels much of that drift."""
        if self.unit != "s" or len(samples) != len(self.aprfast) or len(samples) < 2:
            return None
        return Samples(t / a for t, a in zip(samples, self.aprfast) if a > 0)

    def ratio_cell(self, group, paired=False):
        _, samples = self._best(group)
        if samples is None:
            return "—"
        r = self.ratio(samples)
        text = f"{r:.2f}x"
        text = f"**{text}**" if r < 1 else text
        rounds = self.paired(samples) if paired else None
        if rounds:
            text += f" (per round {rounds.median:.2f}x [{rounds.lo:.2f}..{rounds.hi:.2f}])"
        return text

    def mark(self) -> str:
        marks = []
        for group in (self.primary, self.others):
            name, samples = self._best(group)
            if samples is None:
                continue
            if self.ratio(samples) < 1:
                more = {"s": "slower than", "bytes": "more bytes written than"}.get(self.unit, "more memory than")
                marks.append(f"❌ {more} {name}")
            elif samples.lo <= self.aprfast.hi and self.aprfast.lo <= samples.hi:
                marks.append(f"≈ ranges overlap {name}")
        if self.note:
            marks.append(self.note)
        return "; ".join(marks)

    def console(self) -> str:
        parts = [f"{self.path:<46} {self.size:>10}  aprfast {self.aprfast.text(self.unit):<30}"]
        for title, group in (("", self.primary), ("", self.others), ("limit ", self.limits)):
            for name, samples in group.items():
                parts.append(f"    {title}{name} {samples.text(self.unit)} (x{self.ratio(samples):.2f})")
        return "\n".join(parts)


class Table:
    """Rows printed as they are measured, then as one Markdown table."""

    def __init__(self, title: str, primary_title: str, *, others_title: str = "best other peer",
                 limits_title: str = "limit (not a peer)", versions: str = ""):
        self.title, self.primary_title, self.versions = title, primary_title, versions
        self.others_title, self.limits_title = others_title, limits_title
        self.rows = []
        self.skipped = []
        self.notes = []
        self.load_start = loadavg()
        self.started = time.time()
        print(machine(versions), flush=True)

    def skip(self, what: str, reason: str) -> None:
        text = f"{what}: {reason}"
        if text not in self.skipped:
            self.skipped.append(text)
            print(f"SKIPPED {text}", flush=True)

    def add(self, row: Row) -> Row:
        self.rows.append(row)
        print(row.console(), flush=True)
        return row

    def markdown(self) -> str:
        groups = [("primary", self.primary_title), ("others", self.others_title), ("limits", self.limits_title)]
        shown = [(attr, title) for attr, title in groups if any(getattr(r, attr) for r in self.rows)]
        head = ["path", "size", "aprfast median [min..max]"]
        for _, title in shown:
            head += [title, "ratio"]
        head.append("mark")
        lines = [f"### {self.title}", "",
                 f"`{command_line()}` — {machine(self.versions, load=False)}; load average (1 min) "
                 f"{self.load_start:.2f} at the start, {loadavg():.2f} at the end; "
                 f"{time.time() - self.started:.0f} s wall time.", ""]
        lines.append("| " + " | ".join(head) + " |")
        lines.append("|" + "---|" * len(head))
        for r in self.rows:
            cells = [r.path, r.size, r.aprfast.text(r.unit)]
            for attr, _ in shown:
                if attr == "limits" and len(r.limits) > 1:  # every limit: which one binds differs by row
                    ordered = sorted(r.limits, key=lambda k: r.limits[k].median)
                    cells += ["; ".join(r.cell({k: r.limits[k]}) for k in ordered),
                              "; ".join(r.ratio_cell({k: r.limits[k]}, paired=True) for k in ordered)]
                    continue
                cells += [r.cell(getattr(r, attr)), r.ratio_cell(getattr(r, attr), paired=attr == "limits")]
            cells.append(r.mark())
            lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
        lines.append("")
        lines.append("Median over rounds with min..max; tools run round-robin within each row, the order "
                     "changed each round so no tool always follows the same one; ratio = peer median / "
                     "aprfast median (above 1: aprfast faster, or uses less memory in MiB rows; **bold** "
                     "below 1; against a limit, also the median [min..max] of each round's own ratio, "
                     "the two run seconds apart). ❌ marks rows "
                     "where aprfast loses to the peer shown; ≈ marks rows whose ranges overlap.")
        for note in self.notes:
            lines.append(f"- {note}")
        for text in self.skipped:
            lines.append(f"- skipped {text}")
        return "\n".join(lines)

    def finish(self, md_out: str | None = None) -> str:
        text = self.markdown()
        print("\n" + text, flush=True)
        if md_out:
            with open(md_out, "w") as f:
                f.write(text + "\n")
        return text


def unlinker(path):
    """A setup step removing ``path`` (so every tool writes to a path that does not exist)."""
    def unlink():
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
    return unlink


def read_into(path, buf) -> int:
    """Fill ``buf`` from the start of ``path`` with unbuffered reads until it is full or
    the file ends; the bytes read.  One ``read()`` returns at most 2 GiB - 4 KiB on
    Linux, so a single ``readinto`` of a 4 GiB file reads half of it: the floors of
    the owned-load rows looked 2x faster than they are before this loop."""
    view = memoryview(buf).cast("B")
    done = 0
    with open(path, "rb", buffering=0) as f:
        while done < len(view):
            got = f.readinto(view[done:])
            if not got:
                break
            done += got
    return done

