"""What the terminal UI shows, as plain text: the module tree of tensor names, a model's
overview, one tensor's statistics, a vertical histogram, a pair's comparison.  No
Textual here, so these are tested (and reusable) without the ``tui`` extra; the
widgets in :mod:`aprfast.tui.views` only place this text."""

from __future__ import annotations

from ..dtypes import element_count
from ..tools.text import fmt, shape_text

#: Eighths of a cell, for bars whose height is not a whole number of rows.
_BLOCKS = " ▁▂▃▄▅▆▇█"


# --- the graph view: names split on dots ---------------------------------------------------
class ModuleNode:
    """One module of the tree: ``children`` by the next name part, ``tensor`` the full
    name when a tensor ends here (a name may be both a tensor and a prefix of others)."""

    __slots__ = ("part", "children", "tensor")

    def __init__(self, part: str = ""):
        self.part, self.children, self.tensor = part, {}, None

    def tensors(self) -> list:
        """Every tensor name at or below this node, in tree order."""
        out = [self.tensor] if self.tensor is not None else []
        for child in self.children.values():
            out += child.tensors()
        return out


def module_tree(names) -> ModuleNode:
    """The tensors grouped by module: ``encoder.layers.0.fc1.weight`` sits under
    encoder / layers / 0 / fc1.  Children keep the order of ``names``."""
    root = ModuleNode()
    for name in names:
        node = root
        for part in name.split("."):
            node = node.children.setdefault(part, ModuleNode(part))
        node.tensor = name
    return root


def tree_order(names) -> list:
    """The names in the order the tree shows them (modules kept together)."""
    return module_tree(names).tensors()


# --- numbers for people ----------------------------------------------------------------------
def human_bytes(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"  # pragma: no cover


def module_label(node: ModuleNode, infos: dict) -> str:
    names = node.tensors()
    params = sum(element_count(infos[n].shape) for n in names)
    return f"{node.part}  ({len(names)} tensor{'s' if len(names) != 1 else ''}, {params:,} params)"


def tensor_label(part: str, info) -> str:
    return f"{part}  {info.dtype_name} [{shape_text(info.shape)}]"


# --- the overview and metadata views ---------------------------------------------------------
def overview_lines(path: str, infos: dict, metadata: dict, architecture=None) -> list:
    """Seed 001 §4.13.2's overview box: parameters, tensors, size, dtypes, vocabulary, architecture."""
    params = sum(element_count(i.shape) for i in infos.values())
    size = sum(i.nbytes for i in infos.values())
    dtypes: dict = {}
    for i in infos.values():
        dtypes[i.dtype_name] = dtypes.get(i.dtype_name, 0) + 1
    dtype_text = ", ".join(f"{d} x{n}" for d, n in sorted(dtypes.items(), key=lambda kv: -kv[1])) or "-"
    vocab = metadata.get("tokenizer.vocabulary") or metadata.get("vocab")
    vocab_size = len(vocab) if isinstance(vocab, list) else metadata.get("vocab_size") or metadata.get("n_vocab")
    lines = [f"Model: {path}",
             f"Total params: {params:,}    Tensors: {len(infos)}    Size: {human_bytes(size)}",
             f"Dtypes: {dtype_text}"]
    extra = []
    if vocab_size is not None:
        extra.append(f"Vocab: {vocab_size:,}" if isinstance(vocab_size, int) else f"Vocab: {vocab_size}")
    if architecture:
        extra.append(f"Arch: {architecture}")
    if extra:
        lines.append("    ".join(extra))
    return lines


def metadata_lines(layout, header: dict, metadata: dict, width: int = 100) -> list:
    """The header's fields, then each metadata key with its value (long values cut short)."""
    lines = [f"Layout: {layout}", "", "Header:"]
    for key, value in (header or {}).items():
        lines.append(f"  {key}: {_short(value, width)}")
    lines += ["", f"Metadata ({len(metadata or {})} keys):"]
    for key, value in (metadata or {}).items():
        lines.append(f"  {key}: {_short(value, width)}")
    return lines


def _short(value, width: int) -> str:
    if isinstance(value, list) and len(value) > 8:
        text = repr(value[:8])[:-1] + f", ... ({len(value)} items)]"
    else:
        text = repr(value) if not isinstance(value, str) else value
    return text if len(text) <= width else text[:width - 3] + "..."


# --- one tensor ------------------------------------------------------------------------------
def tensor_heading(name: str, info, position=None) -> str:
    """The tensor's name, then shape, dtype, size and (``position`` = (i, n)) where it is."""
    where = f"    ({position[0]}/{position[1]})" if position else ""
    return (f"{name}{where}\nShape: [{', '.join(map(str, info.shape))}]    dtype: {info.dtype_name}    "
            f"Size: {human_bytes(info.nbytes)}    Elements: {element_count(info.shape):,}")


def stats_lines(stats, verdict=None) -> list:
    """The numbers of :func:`aprfast.stats.tensor_stats`, with the §10.9 verdict."""
    lines = [f"Min:   {fmt(stats.min):>12}    Max:  {fmt(stats.max):>12}",
             f"Mean:  {fmt(stats.mean):>12}    Std:  {fmt(stats.std):>12}",
             f"NaN:   {stats.nan_count:>12}    Inf:  {stats.inf_count:>12}",
             f"Zeros: {stats.zero_count:>12}    Sparsity: {stats.sparsity:.1%}",
             f"Count: {stats.count:>12}    Finite: {stats.finite_count:>10}"]
    if verdict is not None and verdict.status == "-" and not verdict.reasons:
        lines += ["", "Expected ranges (seed 001 §10.9): none for this name"]
    elif verdict is not None:
        role = f" ({verdict.role})" if verdict.role else ""
        lines += ["", f"Expected ranges (seed 001 §10.9){role}: {verdict.status}"]
        lines += [f"  ! {reason}" for reason in verdict.reasons]
    return lines


def health_lines(rows, limit: int = 12) -> list:
    """Seed 001 §4.13.2's "Layer Norm Health": ``rows`` of (name, stats or None, verdict
    or None), None while a tensor's statistics are not known.  Beyond ``limit`` rows
    the ones that are not OK come first and the rest are counted."""
    if not rows:
        return []

    def ok(row):
        return row[2] is not None and row[2].status in ("PASS", "-")

    shown = rows if len(rows) <= limit else ([r for r in rows if not ok(r)] + [r for r in rows if ok(r)])[:limit]
    width = max(len(name) for name, _, _ in shown)
    lines = ["Layer norm health:" + (f" {sum(map(ok, rows))} of {len(rows)} OK" if len(rows) > limit else ""),
             f"  {'tensor':<{width}}  {'mean':>10}  {'std':>10}  status"]
    for name, stats, verdict in shown:
        if stats is None:
            lines.append(f"  {name:<{width}}  {'...':>10}  {'...':>10}  (not computed yet)")
        else:
            mark = "OK" if verdict.status in ("PASS", "-") else verdict.status
            lines.append(f"  {name:<{width}}  {fmt(stats.mean):>10}  {fmt(stats.std):>10}  {mark}")
    if len(shown) < len(rows):
        lines.append(f"  ... {len(rows) - len(shown)} more")
    return lines


def histogram_lines(stats, width: int = 60, height: int = 10) -> list:
    """A vertical bar chart of ``stats.histogram`` (seed 001 §4.13.4): count labels on
    the left, the bin edges underneath.  Bins are merged or widened to fit ``width``."""
    if not stats.histogram or not stats.finite_count:
        return ["(no finite values)"]
    counts = _fit(list(stats.histogram), width)
    top = max(counts) or 1
    label_width = max(len(str(top)), 1)
    cells = [c / top * height * 8 for c in counts]  # eighths of a row
    lines = []
    for row in range(height, 0, -1):
        floor = (row - 1) * 8
        bar = "".join(_BLOCKS[max(0, min(8, round(v - floor)))] for v in cells)
        label = str(top) if row == height else (str(top // 2) if row == (height + 1) // 2 else "")
        lines.append(f"{label:>{label_width}} │{bar}")
    lines.append(f"{'0':>{label_width}} └{'─' * len(counts)}")
    lo, hi = stats.bin_edges[0], stats.bin_edges[-1]
    left, mid, right = fmt(float(lo)), fmt(float((lo + hi) / 2)), fmt(float(hi))
    axis = left + mid.center(max(len(counts) - len(left) - len(right), len(mid) + 2)) + right
    lines.append(" " * (label_width + 2) + axis)
    return lines


def _fit(counts: list, width: int) -> list:
    """``counts`` resampled to ``width`` columns: adjacent bins summed, or each repeated."""
    n = len(counts)
    if n <= width:
        repeat = max(1, width // n)
        return [c for c in counts for _ in range(repeat)]
    per = -(-n // width)
    return [sum(counts[i:i + per]) for i in range(0, n, per)]


def sparkline(counts, width: int = 40) -> str:
    """One row of block characters for a histogram (the comparison view's distributions)."""
    counts = _fit(list(counts), width)
    top = max(counts) or 1
    return "".join(_BLOCKS[round(c / top * 8)] for c in counts)


# --- two models --------------------------------------------------------------------------------
def compare_summary(report) -> list:
    """Seed 001 §4.13.3's summary box from an :class:`aprfast.tools.diff.DiffReport`."""
    from ..tools.text import similarity_text

    changed = len(report.drifted)
    return [f"Comparing: {report.a} vs {report.b}",
            f"Similarity: {similarity_text(report.similarity)}    Changed: {changed} tensor"
            f"{'s' if changed != 1 else ''}    New: {len(report.only_in_b)}    Removed: {len(report.only_in_a)}",
            f"Max Δ: {fmt(report.max_abs_delta)}    L2 dist: {fmt(report.l2_distance)}    "
            f"Metadata: {'differs' if report.metadata_differs else 'same'}    Tolerance: {report.tolerance:g}"]


def pair_lines(diff, stats_a=None, stats_b=None, width: int = 40) -> list:
    """One pair: the diff's numbers, each side's mean and their distributions over one range."""
    lines = [f"{diff.name}: {diff.status}" + (f" ({diff.detail})" if diff.detail else ""),
             f"Max Δ: {fmt(diff.max_abs_delta)}    Cosine: {fmt(diff.cosine)}    L2: {fmt(diff.l2_distance)}    "
             f"Identical: {diff.identical:,} of {diff.count:,}"]
    if stats_a is not None and stats_b is not None:
        delta = (stats_b.mean - stats_a.mean) if stats_a.mean is not None and stats_b.mean is not None else None
        lines += ["", f"Mean A: {fmt(stats_a.mean)}    Mean B: {fmt(stats_b.mean)}    Δ: "
                      + (f"{delta:+.4g}" if delta is not None else "-")]
        if stats_a.histogram and stats_b.histogram:
            lines += ["", f"A: {sparkline(stats_a.histogram, width)}  (mean={fmt(stats_a.mean)})",
                      f"B: {sparkline(stats_b.histogram, width)}  (mean={fmt(stats_b.mean)})",
                      f"   {fmt(stats_a.bin_edges[0])} .. {fmt(stats_a.bin_edges[-1])}"]
    return lines
