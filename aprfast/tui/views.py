"""The terminal UI's widgets: the module tree (graph view), the tensor list, the text
panes (statistics, histogram, metadata), the comparison pane and the help overlay.  Each
only places text that :mod:`aprfast.tui.render` makes; the app decides what is shown."""

from __future__ import annotations

import fnmatch

from .._optional import require

require("textual")  # before any Textual import: a missing extra names itself

from rich.text import Text  # noqa: E402 - Textual's own dependency
from textual.app import ComposeResult  # noqa: E402
from textual.binding import Binding  # noqa: E402
from textual.containers import Vertical, VerticalScroll  # noqa: E402
from textual.screen import ModalScreen  # noqa: E402
from textual.widgets import DataTable, Static, Tree  # noqa: E402

from ..tools.text import fmt, shape_text  # noqa: E402
from . import render  # noqa: E402

#: Seed 001 §4.13.5's keys (and this UI's one addition, ``m``), as the help overlay lists them.
KEYS = (
    ("g", "Graph view: tensors grouped by module"),
    ("s", "Stats view: the selected tensor's statistics"),
    ("c", "Compare view (two models, --compare)"),
    ("t", "Tensor list"),
    ("h", "Histogram view"),
    ("m", "Metadata and header view"),
    ("Enter", "Select / drill down"),
    ("Esc", "Back / cancel"),
    ("↑/↓", "Navigate the list"),
    ("←/→", "Previous / next tensor"),
    ("/", "Search tensors"),
    ("?", "Help"),
    ("q", "Quit"),
)


class ModuleTree(Tree, inherit_bindings=False):
    """The graph view: tensor names split on dots, modules as branches, tensors as leaves
    (``node.data`` is the tensor's full name; None for a module).  ←/→ are left to the
    app (previous/next tensor), not scrolling."""

    BINDINGS = [*Tree.BINDINGS,
                Binding("pageup", "page_up", "Page up", show=False),
                Binding("pagedown", "page_down", "Page down", show=False),
                Binding("home", "scroll_home", "Home", show=False),
                Binding("end", "scroll_end", "End", show=False)]

    def __init__(self, title: str, names, infos: dict, **kwargs):
        super().__init__(Text(title), **kwargs)
        self.nodes: dict = {}
        self._fill(self.root, render.module_tree(names), infos, depth=0)
        self.root.expand()

    def _fill(self, parent, module, infos, depth) -> None:
        for child in module.children.values():
            if child.tensor is not None and not child.children:
                self.nodes[child.tensor] = parent.add_leaf(Text(render.tensor_label(child.part, infos[child.tensor])),
                                                           data=child.tensor)
                continue
            node = parent.add(Text(render.module_label(child, infos)), data=child.tensor, expand=depth < 2)
            if child.tensor is not None:
                self.nodes[child.tensor] = node
            self._fill(node, child, infos, depth + 1)

    def show(self, name: str) -> None:
        """Expand the modules above ``name`` and put the cursor on it (after the tree's
        lines are rebuilt)."""
        node = self.nodes.get(name)
        if node is None or (self.cursor_node is node):
            return
        parent = node.parent
        while parent is not None:
            parent.expand()
            parent = parent.parent
        self.call_after_refresh(self._move_to, node, 3)

    def _move_to(self, node, tries: int) -> None:
        if node.line < 0 and tries:  # the tree's lines are not rebuilt yet
            self.call_after_refresh(self._move_to, node, tries - 1)
        elif node.line >= 0:
            self.move_cursor(node)


class RowTable(DataTable, inherit_bindings=False):
    """A table navigated by rows; ←/→ are left to the app (previous/next tensor): a row
    cursor has no columns to move in."""

    BINDINGS = [Binding("enter", "select_cursor", "Select", show=False),
                Binding("up", "cursor_up", "Cursor up", show=False),
                Binding("down", "cursor_down", "Cursor down", show=False),
                Binding("pageup", "page_up", "Page up", show=False),
                Binding("pagedown", "page_down", "Page down", show=False),
                Binding("home", "scroll_home", "Home", show=False),
                Binding("end", "scroll_end", "End", show=False)]


class TensorTable(RowTable):
    """The tensor list: one row per tensor (key: its name), ``filter`` by substring or glob."""

    def __init__(self, names, infos: dict, **kwargs):
        super().__init__(cursor_type="row", zebra_stripes=True, **kwargs)
        self.names, self.infos, self.shown = list(names), infos, list(names)

    def on_mount(self) -> None:
        for column in ("name", "dtype", "shape", "size"):
            self.add_column(column, key=column)
        self._rows(self.names)

    def _rows(self, names) -> None:
        self.clear()
        self.shown = list(names)
        for name in names:
            info = self.infos[name]
            self.add_row(Text(name), info.dtype_name, shape_text(info.shape), render.human_bytes(info.nbytes),
                         key=name)

    def filter(self, query: str) -> list:
        """Show only the tensors matching ``query`` (a glob when it has ``*?[``, else a
        case-insensitive substring); returns them."""
        self._rows(matching(self.names, query))
        return self.shown

    def show(self, name: str) -> None:
        if name in self.shown and (not self.row_count or self.cursor_row != self.shown.index(name)):
            self.move_cursor(row=self.shown.index(name))


def matching(names, query: str) -> list:
    query = query.strip()
    if not query:
        return list(names)
    if any(ch in query for ch in "*?["):
        return [n for n in names if fnmatch.fnmatchcase(n, query)]
    q = query.lower()
    return [n for n in names if q in n.lower()]


class TextPane(VerticalScroll):
    """A scrolling pane of plain text (never read as markup: tensor names and metadata
    may hold brackets)."""

    def __init__(self, text: str = "", **kwargs):
        super().__init__(**kwargs)
        self._initial = text

    def compose(self) -> ComposeResult:
        yield Static(Text(self._initial), markup=False)

    def set_text(self, text: str) -> None:
        self.query_one(Static).update(Text(text))

    @property
    def text(self) -> str:
        return str(self.query_one(Static).content)


class ComparePane(Vertical):
    """Seed 001 §4.13.3: the summary, one row per tensor pair (MATCH / DRIFT / SHAPE, max
    delta, cosine similarity, L2) and the selected pair's detail."""

    def compose(self) -> ComposeResult:
        yield Static(Text("Comparing..."), id="compare-summary", markup=False)
        table = RowTable(id="compare-table", cursor_type="row", zebra_stripes=True)
        yield table
        yield Static(Text(""), id="compare-detail", markup=False)

    def on_mount(self) -> None:
        table = self.query_one("#compare-table", DataTable)
        for column in ("tensor", "status", "max Δ", "similarity", "L2"):
            table.add_column(column, key=column)

    def set_summary(self, text: str) -> None:
        self.query_one("#compare-summary", Static).update(Text(text))

    def set_detail(self, text: str) -> None:
        self.query_one("#compare-detail", Static).update(Text(text))

    def fill(self, report) -> None:
        self.set_summary("\n".join(render.compare_summary(report)))
        table = self.query_one("#compare-table", DataTable)
        table.clear()
        for t in report.tensors:
            status = Text(t.status, style="green" if t.status == "MATCH" else "bold red")
            cosine = f"{t.cosine * 100:.4f}%" if t.cosine is not None else "-"
            table.add_row(Text(t.name), status, fmt(t.max_abs_delta), cosine, fmt(t.l2_distance), key=t.name)
        for name, _ in report.only_in_a:
            table.add_row(Text(name), Text("ONLY IN A", style="yellow"), "-", "-", "-", key=name)
        for name, _ in report.only_in_b:
            table.add_row(Text(name), Text("ONLY IN B", style="yellow"), "-", "-", "-", key=f"b:{name}")

    def show(self, name: str) -> None:
        table = self.query_one("#compare-table", DataTable)
        try:
            row = table.get_row_index(name)
        except Exception:  # noqa: BLE001 - not compared (yet, or only on one side)
            return
        if table.cursor_row != row:
            table.move_cursor(row=row)


class HelpScreen(ModalScreen):
    """The ``?`` overlay: every key and what it does; Esc, ? or q closes it."""

    BINDINGS = [Binding("escape,question_mark,q", "dismiss", "Close help")]
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > Static { width: 60; height: auto; border: round $accent; padding: 1 2; background: $panel; }
    """

    def compose(self) -> ComposeResult:
        lines = ["Keys", ""] + [f"  {key:<7} {what}" for key, what in KEYS] + ["", "Esc, ? or q closes this help"]
        yield Static(Text("\n".join(lines)), id="help-text", markup=False)
