"""The terminal UI of seed 001 §4.13 (``apr tui``), built with Textual.

Left, the navigator: the graph view (tensors grouped by module, ``g``) or the tensor
list (``t``, filtered by ``/``).  Right, the detail of the selected tensor: statistics
(``s``), histogram (``h``), the file's metadata and header (``m``) or, with two models,
the comparison (``c``).  Statistics come from :func:`aprfast.stats.tensor_stats`, computed
when a tensor is first selected and kept: small tensors at once, large ones on a worker
thread (the C engine releases the GIL), one at a time, the newest request first, so
moving through a big model never queues work.  The comparison is
:func:`aprfast.tools.diff.diff_models` on a worker thread, with its progress in the summary."""

from __future__ import annotations

import threading

from .._optional import require

require("textual")  # before any Textual import: a missing extra names itself

from textual.app import App, ComposeResult  # noqa: E402
from textual.binding import Binding  # noqa: E402
from textual.containers import Horizontal  # noqa: E402
from textual.widgets import ContentSwitcher, DataTable, Footer, Header, Input, Tree  # noqa: E402
from textual.worker import get_current_worker  # noqa: E402

from ..api import open as open_apr  # noqa: E402
from ..numerics.expectations import check_expected, expectation_for  # noqa: E402
from ..numerics.stats import tensor_stats  # noqa: E402
from ..tools.text import fmt  # noqa: E402
from . import render  # noqa: E402
from .views import ComparePane, HelpScreen, ModuleTree, TensorTable, TextPane  # noqa: E402

#: Histogram bins computed with every tensor's statistics.
BINS = 40
#: Tensors up to this many stored bytes get their statistics on the UI thread at once.
SYNC_BYTES = 4 << 20

NAV_VIEWS = {"graph": "Graph", "tensors": "Tensors"}
DETAIL_VIEWS = {"stats": "Stats", "hist": "Histogram", "meta": "Metadata", "compare": "Compare"}


class _Cancelled(Exception):
    """The app stopped the comparison (it is closing)."""


class _Lazy:
    """Results computed on demand and kept: ``request(key)`` returns the result when it
    is known (computing it at once when ``sync(key)``), else None, and starts one worker
    thread that computes the newest key requested, then calls ``ready(key)`` on the UI
    thread.  A result is the value or the exception raised computing it."""

    def __init__(self, app: App, compute, sync, ready, group: str):
        self.app, self.compute, self.sync, self.ready, self.group = app, compute, sync, ready, group
        self.results: dict = {}
        self._lock = threading.Lock()
        self._wanted = None
        self._busy = False

    def request(self, key):
        if key in self.results:
            return self.results[key]
        if self.sync(key):
            self.results[key] = self._run(key)
            return self.results[key]
        with self._lock:
            self._wanted = key
            if not self._busy:
                self._busy = True
                self.app.run_worker(self._loop, thread=True, group=self.group, exit_on_error=False)
        return None

    def _run(self, key):
        try:
            return self.compute(key)
        except Exception as exc:  # noqa: BLE001 - shown in the pane, never fatal to the UI
            return exc

    def _loop(self) -> None:
        worker = get_current_worker()
        while not worker.is_cancelled:
            with self._lock:
                key = self._wanted
                if key is None or key in self.results:
                    self._busy = False
                    return
            self.results[key] = self._run(key)
            if worker.is_cancelled:
                break
            try:
                self.app.call_from_thread(self.ready, key)
            except RuntimeError:  # the app has stopped
                break
        with self._lock:
            self._busy = False


class ModelApp(App):
    """``apr tui``: one model, or two with ``compare`` (the first is the one navigated).

    ``keys``: ``aprfast.open`` key arguments (``password``, ``private_key``,
    ``trusted_keys``) for each model.  The files are opened here, so a missing or bad
    file fails before the screen changes; :meth:`close` closes them."""

    TITLE = "apr tui"
    ENABLE_COMMAND_PALETTE = False  # every action has its key (seed 001 §4.13.5)
    CSS = """
    #body { height: 1fr; }
    #nav { width: 45%; min-width: 30; border-right: solid $accent; }
    #detail { width: 1fr; padding: 0 1; }
    #compare-summary { height: auto; margin-bottom: 1; }
    #compare-table { height: 1fr; }
    #compare-detail { height: auto; max-height: 12; margin-top: 1; }
    #search { dock: bottom; display: none; }
    #search.open { display: block; }
    """
    BINDINGS = [
        Binding("g", "view('graph')", "Graph"),
        Binding("s", "view('stats')", "Stats"),
        Binding("c", "view('compare')", "Compare"),
        Binding("t", "view('tensors')", "Tensors"),
        Binding("h", "view('hist')", "Hist"),
        Binding("m", "view('meta')", "Metadata"),
        Binding("left", "step(-1)", "Prev", show=False),
        Binding("right", "step(1)", "Next", show=False),
        Binding("slash", "search", "Search"),
        Binding("escape", "back", "Back", show=False),
        Binding("question_mark", "help", "Help"),
        Binding("q", "quit", "Quit"),
    ]

    def __init__(self, path, other=None, *, keys=None, other_keys=None, tolerance=None, threads: int = 0,
                 bins: int = BINS, sync_bytes: int = SYNC_BYTES):
        super().__init__()
        from ..tools.diff import DEFAULT_TOLERANCE

        self.path, self.other_path = str(path), (str(other) if other is not None else None)
        self.keys, self.other_keys = dict(keys or {}), dict(other_keys or keys or {})
        self.tolerance = DEFAULT_TOLERANCE if tolerance is None else tolerance
        self.threads, self.bins, self.sync_bytes = threads, bins, sync_bytes
        self.file = open_apr(self.path, unknown_dtypes="raw", **self.keys)
        self.other = None
        try:
            if self.other_path is not None:
                self.other = open_apr(self.other_path, unknown_dtypes="raw", **self.other_keys)
            self.names = list(self.file.keys())
            self.infos = {n: self.file.info(n) for n in self.names}
            self.order = render.tree_order(self.names)
        except BaseException:
            self.close()
            raise
        self.selected = self.order[0] if self.order else None
        self.nav, self.detail = "graph", "stats"
        self.history: list = []
        self.report = None
        self.diff_error = None
        self.stats = _Lazy(self, self._compute_stats, self._small, self._stats_ready, "stats")
        self.pair_stats = _Lazy(self, self._compute_pair, self._small, self._pair_ready, "pair")

    # --- files ----------------------------------------------------------------------------
    def close(self) -> None:
        for handle in (self.file, self.other):
            if handle is not None:
                handle.close()

    def _small(self, name) -> bool:
        return self.infos[name].nbytes <= self.sync_bytes

    def _compute_stats(self, name):
        return tensor_stats(self.file.get_tensor(name), bins=self.bins, threads=self.threads)

    # --- layout ---------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal(id="body"):
            with ContentSwitcher(initial="graph", id="nav"):
                yield ModuleTree(self.path, self.names, self.infos, id="graph")
                yield TensorTable(self.order, self.infos, id="tensors")
            with ContentSwitcher(initial="stats", id="detail"):
                yield TextPane(id="stats")
                yield TextPane(id="hist")
                yield TextPane(self._metadata_text(), id="meta")
                yield ComparePane(id="compare")
        yield Input(placeholder="search tensors (substring or glob), Enter to go, Esc to cancel", id="search")
        yield Footer()

    def on_mount(self) -> None:
        self.title = (f"Comparing: {self.path} vs {self.other_path}" if self.other is not None
                      else f"Model: {self.path}")
        self._subtitle()
        tree = self.query_one("#graph", ModuleTree)
        tree.focus()
        if self.selected is not None:
            tree.show(self.selected)
        self._show_selected()
        if self.other is not None:
            self.run_worker(self._diff, thread=True, group="diff", exit_on_error=False)

    def _subtitle(self) -> None:
        self.sub_title = f"[{NAV_VIEWS[self.nav]} | {DETAIL_VIEWS[self.detail]} View]"

    def _metadata_text(self) -> str:
        from ..tools.text import detect_architecture

        metadata = dict(self.file.metadata or {})
        arch = detect_architecture(self.names)
        lines = render.overview_lines(self.path, self.infos, metadata, arch and arch["architecture"])
        lines += [""] + render.metadata_lines(getattr(self.file, "layout", "?"), getattr(self.file, "header", {}),
                                              metadata)
        return "\n".join(lines)

    # --- views ----------------------------------------------------------------------------
    def action_view(self, view: str) -> None:
        if view == "compare" and self.other is None:
            self.notify("The compare view needs two models: apr tui A B --compare", severity="warning")
            return
        self.history.append((self.nav, self.detail))
        self._switch(view)

    def _switch(self, view: str) -> None:
        if view in NAV_VIEWS:
            self.nav = view
            self.query_one("#nav", ContentSwitcher).current = view
            widget = self.query_one(f"#{view}")
            widget.focus()
            if self.selected is not None:
                widget.show(self.selected)
        else:
            self.detail = view
            self.query_one("#detail", ContentSwitcher).current = view
            if view == "compare":
                self.query_one("#compare-table", DataTable).focus()
                if self.selected is not None:
                    self.query_one(ComparePane).show(self.selected)
            self._show_selected()
        self._subtitle()

    def action_back(self) -> None:
        search = self.query_one("#search", Input)
        if search.has_class("open"):
            self._close_search(keep=False)
            return
        if self.history:
            nav, detail = self.history.pop()
            self._switch(detail)
            if nav != self.nav:
                self._switch(nav)

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen())

    def action_step(self, delta: int) -> None:
        """←/→: the previous or next tensor, in the navigator's order."""
        order = self.query_one(TensorTable).shown if self.nav == "tensors" else self.order
        if not order:
            return
        i = order.index(self.selected) if self.selected in order else -1
        self.select(order[(i + delta) % len(order)], move_cursor=True)

    # --- search -----------------------------------------------------------------------------
    def action_search(self) -> None:
        if self.nav != "tensors":
            self.action_view("tensors")
        search = self.query_one("#search", Input)
        search.add_class("open")
        search.focus()

    def on_input_changed(self, event: Input.Changed) -> None:
        self.query_one(TensorTable).filter(event.value)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self._close_search(keep=True)

    def _close_search(self, keep: bool) -> None:
        search = self.query_one("#search", Input)
        search.remove_class("open")
        table = self.query_one(TensorTable)
        if not keep:
            search.value = ""
            table.filter("")
        table.focus()
        if table.shown:
            self.select(table.shown[0] if self.selected not in table.shown else self.selected, move_cursor=True)

    # --- selection --------------------------------------------------------------------------
    # A highlight is acted on only while its widget's cursor is still there: a programmatic
    # move posts one too, and an older one arriving late must not pull the selection back.
    def on_tree_node_highlighted(self, event: Tree.NodeHighlighted) -> None:
        if event.node.data is not None and event.node is event.control.cursor_node:
            self.select(event.node.data)

    def on_tree_node_selected(self, event: Tree.NodeSelected) -> None:
        if event.node.data is not None:
            self._drill_down(event.node.data)

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        name = event.row_key.value
        if name in self.infos and _row_under_cursor(event.data_table) == name:
            self.select(name, move_cursor=event.data_table.id == "compare-table")

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        name = event.row_key.value
        if name in self.infos:
            self._drill_down(name)

    def _drill_down(self, name: str) -> None:
        """Enter on a tensor: its statistics (the histogram and comparison stay where they are)."""
        self.select(name)
        if self.detail == "meta":
            self.history.append((self.nav, self.detail))
            self._switch("stats")

    def select(self, name: str, move_cursor: bool = False) -> None:
        if name == self.selected and not move_cursor:
            return
        self.selected = name
        if move_cursor:
            self.query_one(f"#{self.nav}").show(name)
            if self.other is not None:
                self.query_one(ComparePane).show(name)
        self._show_selected()

    def _show_selected(self) -> None:
        name = self.selected
        if self.detail == "compare":
            self._show_pair()
            return
        if self.detail == "meta":
            return
        pane = self.query_one(f"#{self.detail}", TextPane)
        if name is None:
            pane.set_text("(no tensors)")
            return
        heading = render.tensor_heading(name, self.infos[name], (self.order.index(name) + 1, len(self.order)))
        result = self.stats.request(name)
        if result is None:
            pane.set_text(f"{heading}\n\ncomputing statistics...")
        elif isinstance(result, Exception):
            pane.set_text(f"{heading}\n\nno statistics: {result}")
        elif self.detail == "stats":
            lines = [heading, ""] + render.stats_lines(result, check_expected(name, result))
            health = render.health_lines(self._layer_norms())
            pane.set_text("\n".join(lines + ([""] + health if health else [])))
        else:
            verdict = check_expected(name, result)
            lines = [heading, f"Mean: {fmt(result.mean)}   Std: {fmt(result.std)}   "
                              f"Min: {fmt(result.min)}   Max: {fmt(result.max)}", "", "Distribution:"]
            lines += render.histogram_lines(result, width=max(20, pane.size.width - 14 if pane.size.width else 60))
            if verdict.status in ("WARN", "FAIL"):
                lines += ["", f"ANOMALY ({verdict.status}):"] + [f"  {r}" for r in verdict.reasons]
            pane.set_text("\n".join(lines))

    def _layer_norms(self) -> list:
        """(name, stats, verdict) of every LayerNorm tensor (§10.9): computed at once when
        small, shown when known otherwise (never queued ahead of the selected tensor)."""
        rows = []
        for name in self.order:
            rule = expectation_for(name)
            if rule is None or not rule.role.startswith("layernorm"):
                continue
            result = self.stats.results.get(name)
            if result is None and self._small(name):
                result = self.stats.request(name)
            if isinstance(result, Exception):
                continue
            rows.append((name, result, result and check_expected(name, result)))
        return rows

    def _stats_ready(self, name) -> None:
        if name == self.selected:
            self._show_selected()

    # --- comparison -----------------------------------------------------------------------------
    def _diff(self) -> None:
        """The worker: diff_models over both files, its progress in the summary line."""
        from ..convert import detect
        from ..tools.diff import diff_models

        worker = get_current_worker()

        def progress(done, total):
            if worker.is_cancelled:
                raise _Cancelled
            try:
                self.call_from_thread(self.query_one(ComparePane).set_summary, f"Comparing... {done}/{total} tensors")
            except RuntimeError:  # the app has stopped
                raise _Cancelled from None

        def keys_for(path, keys):
            return keys if keys and detect(path) == "apr" else None

        try:
            report = diff_models(self.path, self.other_path, tolerance=self.tolerance,
                                 keys_a=keys_for(self.path, self.keys),
                                 keys_b=keys_for(self.other_path, self.other_keys), threads=self.threads,
                                 progress=progress)
            done, value = self._diff_ready, report
        except _Cancelled:
            return
        except Exception as exc:  # noqa: BLE001 - shown in the pane
            done, value = self._diff_failed, exc
        try:
            self.call_from_thread(done, value)
        except RuntimeError:  # the app has stopped
            pass

    def _diff_ready(self, report) -> None:
        self.report = report
        self.diffs = {t.name: t for t in report.tensors}
        pane = self.query_one(ComparePane)
        pane.fill(report)
        if self.selected is not None:
            pane.show(self.selected)
        self._show_pair()

    def _diff_failed(self, exc) -> None:
        self.diff_error = exc
        self.query_one(ComparePane).set_summary(f"comparison failed: {exc}")

    def _compute_pair(self, name):
        """Both sides' statistics with histograms over one range, for the distribution rows."""
        a, b = self.file.get_tensor(name), self.other.get_tensor(name)
        sa, sb = tensor_stats(a, threads=self.threads), tensor_stats(b, threads=self.threads)
        if not (sa.finite_count and sb.finite_count):
            return sa, sb
        lo, hi = min(sa.min, sb.min), max(sa.max, sb.max)
        return (tensor_stats(a, bins=self.bins, range=(lo, hi), threads=self.threads),
                tensor_stats(b, bins=self.bins, range=(lo, hi), threads=self.threads))

    def _show_pair(self) -> None:
        pane = self.query_one(ComparePane)
        name = self.selected
        if self.report is None or name is None:
            return
        diff = self.diffs.get(name)
        if diff is None:
            pane.set_detail(f"{name}: only in {self.path}")
            return
        both = self.pair_stats.request(name) if diff.status != "SHAPE" else None
        if isinstance(both, Exception):
            pane.set_detail("\n".join(render.pair_lines(diff) + [f"no statistics: {both}"]))
        elif both is None:
            pane.set_detail("\n".join(render.pair_lines(diff)))
        else:
            pane.set_detail("\n".join(render.pair_lines(diff, *both)))

    def _pair_ready(self, name) -> None:
        if name == self.selected and self.detail == "compare":
            self._show_pair()

    # --- closing ----------------------------------------------------------------------------------
    def on_unmount(self) -> None:
        self.workers.cancel_all()


def _row_under_cursor(table: DataTable):
    """The key of the row the table's cursor is on now (None when it has no rows)."""
    row = table.cursor_row
    if not 0 <= row < table.row_count:
        return None
    return table.ordered_rows[row].key.value
