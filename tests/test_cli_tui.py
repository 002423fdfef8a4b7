"""``apr tui`` (seed 001 §4.13), driven headless by Textual's test pilot: the module tree
(graph view), the statistics of the selected tensor (tensor_stats' own numbers, computed
at once or on a worker thread), every view's key of §4.13.5 and the help overlay, search,
the comparison of two models (MATCH / DRIFT from aprfast.tools.diff), quitting, an SVG
screenshot, the command line's errors, and the message without the ``tui`` extra.

Textual's pilot is async; each test runs it with ``asyncio.run`` (no pytest plugin)."""

import asyncio
import os
import re
import subprocess
import sys
import threading

import numpy as np
import pytest

import aprfast
from aprfast.cli import main
from aprfast.cli._common import fmt
from aprfast.numerics.expectations import check_expected
from aprfast.numerics.stats import tensor_stats
from aprfast.tui import render

NAMES = ["decoder.layer_norm.weight", "encoder.conv1.weight", "encoder.layer_norm.weight",
         "encoder.layers.0.fc1.weight", "step"]


def weights(rng):
    return {"encoder.conv1.weight": (0.04 * rng.standard_normal((16, 8))).astype(np.float32),
            "encoder.layer_norm.weight": (1 + 0.1 * rng.standard_normal(16)).astype(np.float32),
            "encoder.layers.0.fc1.weight": (0.03 * rng.standard_normal((32, 16))).astype(np.float32),
            "decoder.layer_norm.weight": (11 + 0.2 * rng.standard_normal(16)).astype(np.float32),
            "step": np.array([3, 4], np.int64)}


@pytest.fixture
def model(tmp_path, rng):
    tensors = weights(rng)
    path = tmp_path / "a.apr"
    aprfast.save_file(tensors, path, metadata={"license": "MIT", "name": "tui-demo"})
    return path, tensors


@pytest.fixture
def ModelApp():
    pytest.importorskip("textual")
    from aprfast.tui import ModelApp

    return ModelApp


def drive(app, script, size=(120, 36)):
    """Run ``script(app, pilot)`` against the app headless; the files are closed after."""
    async def go():
        async with app.run_test(size=size) as pilot:
            await pilot.pause()
            return await script(app, pilot)
    try:
        return asyncio.run(go())
    finally:
        app.close()


async def settle(app, pilot):
    """Every worker done and its results on screen."""
    await app.workers.wait_for_complete()
    await pilot.pause()


async def highlight_in_tree(app, pilot, name):
    """Down the tree to ``name``, opening (Enter) the collapsed modules above it."""
    tree = app.query_one("#graph")
    for _ in range(50):
        node = tree.cursor_node
        if node is not None and node.data == name:
            return
        if node is not None and not node.is_expanded and name.startswith(_module_path(node) + "."):
            await pilot.press("enter")
        await pilot.press("down")
    raise AssertionError(f"{name} not reached in the tree")


def _module_path(node):
    parts = []
    while node.parent is not None:
        parts.append(str(node.label).split()[0])
        node = node.parent
    return ".".join(reversed(parts))


def pane_text(app, view):
    return app.query_one(f"#{view}").text


def expected_stats_lines(name, tensor, bins=40):
    s = tensor_stats(tensor, bins=bins)
    return render.stats_lines(s, check_expected(name, s))


# --- the graph view -------------------------------------------------------------------------------
def test_the_tree_groups_tensors_by_module(model, ModelApp):
    path, _ = model

    async def script(app, pilot):
        tree = app.query_one("#graph")
        top = [str(node.label).split()[0] for node in tree.root.children]
        assert top == ["decoder", "encoder", "step"]
        encoder = tree.root.children[1]
        assert [str(n.label).split()[0] for n in encoder.children] == ["conv1", "layer_norm", "layers"]
        assert str(encoder.label) == "encoder  (3 tensors, 656 params)"
        assert sorted(tree.nodes) == NAMES
        leaf = tree.nodes["encoder.conv1.weight"]
        assert str(leaf.label) == "weight  F32 [16x8]" and leaf.parent.parent is encoder
        # the first tensor is selected, with the tree's cursor on it
        assert app.selected == "decoder.layer_norm.weight"
        assert tree.cursor_node.data == "decoder.layer_norm.weight"
    drive(ModelApp(path), script)


def test_moving_through_the_tree_shows_the_tensor_stats_numbers(model, ModelApp):
    path, tensors = model

    async def script(app, pilot):
        for name in ("encoder.conv1.weight", "encoder.layers.0.fc1.weight", "step"):
            await highlight_in_tree(app, pilot, name)
            await pilot.pause()
            assert app.selected == name
            text = pane_text(app, "stats")
            assert text.splitlines()[0] == f"{name}    ({render.tree_order(NAMES).index(name) + 1}/5)"
            s = tensor_stats(tensors[name])
            for label, value in (("Min:", s.min), ("Max:", s.max), ("Mean:", s.mean), ("Std:", s.std)):
                assert re.search(rf"(^|  ){label} +{re.escape(fmt(value))}( |$)", text, re.M), (label, text)
            for line in expected_stats_lines(name, tensors[name]):
                assert line in text
    drive(ModelApp(path), script)


def test_a_failing_layernorm_shows_its_verdict(model, ModelApp):
    path, _ = model

    async def script(app, pilot):
        text = pane_text(app, "stats")
        assert "decoder.layer_norm.weight" in text
        assert "(layernorm weight): FAIL" in text and "outside [0.5, 3.0]" in text
        # seed 001 §4.13.2's LayerNorm health: every LayerNorm tensor of the model
        health = text[text.index("Layer norm health:"):].splitlines()
        assert len(health) == 4
        assert health[2].split()[0] == "decoder.layer_norm.weight" and health[2].endswith("FAIL")
        assert health[3].split()[0] == "encoder.layer_norm.weight" and health[3].endswith("OK")
    drive(ModelApp(path), script)


def test_large_tensors_get_their_statistics_from_a_worker(model, ModelApp):
    """Above sync_bytes the statistics are computed on a worker thread while the UI
    says so; the result is kept, never computed twice."""
    path, tensors = model
    name = "encoder.layers.0.fc1.weight"
    release = threading.Event()
    threads = []

    async def script(app, pilot):
        compute = app.stats.compute

        def held(key):
            threads.append(threading.current_thread())
            assert release.wait(30)
            return compute(key)
        app.stats.compute = held
        await highlight_in_tree(app, pilot, name)
        await pilot.pause()
        assert app.selected == name and pane_text(app, "stats").endswith("computing statistics...")
        release.set()
        await settle(app, pilot)
        assert app.stats.results[name] == tensor_stats(tensors[name], bins=40)
        text = pane_text(app, "stats")
        for line in expected_stats_lines(name, tensors[name]):
            assert line in text
        # a tensor passed over while the worker was busy was never computed: the worker
        # takes the newest request only
        assert "encoder.layer_norm.weight" not in app.stats.results
        before, calls = app.stats.results[name], len(threads)
        await highlight_in_tree(app, pilot, "step")
        await settle(app, pilot)
        await pilot.press("up", "up", "up")
        await settle(app, pilot)
        assert app.selected == name
        assert app.stats.results[name] is before and len(threads) == calls + 1  # "step" only
    drive(ModelApp(path, sync_bytes=0), script)
    assert threads and all(t is not threading.main_thread() for t in threads)


def test_a_tensor_without_statistics_says_why_instead_of_failing(tmp_path, ModelApp):
    """tensor_stats' TypeError (an unknown dtype read raw) is shown, not raised."""
    path = tmp_path / "c.apr"
    aprfast.save_file({"w": np.zeros(3, np.float32)}, path)

    async def script(app, pilot):
        app.stats.results["w"] = TypeError("no statistics for arrays of dtype complex64")
        app._show_selected()
        await pilot.pause()
        assert "no statistics: no statistics for arrays of dtype complex64" in pane_text(app, "stats")
    drive(ModelApp(path), script)


# --- keys -----------------------------------------------------------------------------------------
def test_each_view_has_its_key_and_escape_goes_back(model, ModelApp):
    path, _ = model

    async def script(app, pilot):
        nav = app.query_one("#nav")
        detail = app.query_one("#detail")
        assert (nav.current, detail.current) == ("graph", "stats")
        assert app.sub_title == "[Graph | Stats View]"
        for key, view, switcher in (("h", "hist", detail), ("m", "meta", detail), ("s", "stats", detail),
                                    ("t", "tensors", nav), ("g", "graph", nav)):
            await pilot.press(key)
            await pilot.pause()
            assert switcher.current == view, key
        assert app.sub_title == "[Graph | Stats View]"
        assert app.focused is app.query_one("#graph")
        # Esc: back to the view before
        await pilot.press("h", "m")
        await pilot.pause()
        assert detail.current == "meta"
        await pilot.press("escape")
        await pilot.pause()
        assert detail.current == "hist"
        await pilot.press("escape")
        await pilot.pause()
        assert detail.current == "stats"
        await pilot.press("t")
        await pilot.pause()
        assert app.focused is app.query_one("#tensors")
        await pilot.press("escape")
        await pilot.pause()
        assert nav.current == "graph" and app.focused is app.query_one("#graph")
        await pilot.press("h")
        # without a second model `c` stays where it is
        await pilot.press("c")
        await pilot.pause()
        assert detail.current == "hist"
    drive(ModelApp(path), script)


def test_the_histogram_view_and_left_right_step_through_tensors(model, ModelApp):
    path, tensors = model

    async def script(app, pilot):
        await pilot.press("h")
        await pilot.pause()
        text = pane_text(app, "hist")
        name = "decoder.layer_norm.weight"
        s = tensor_stats(tensors[name], bins=40)
        assert text.startswith(name) and "Distribution:" in text and "ANOMALY (FAIL):" in text
        assert f"{max(s.histogram)} │" in text and fmt(s.bin_edges[0]) in text and fmt(s.bin_edges[-1]) in text
        order = render.tree_order(NAMES)
        for expected in order[1:]:
            await pilot.press("right")
            await pilot.pause()
            assert app.selected == expected
            assert pane_text(app, "hist").startswith(expected)
        await pilot.press("right")  # wraps round
        await pilot.pause()
        assert app.selected == order[0]
        await pilot.press("left")
        await pilot.pause()
        assert app.selected == order[-1]
        await pilot.press("g")
        await pilot.pause()
        assert app.query_one("#graph").cursor_node.data == order[-1]
    drive(ModelApp(path), script)


def test_the_metadata_view_shows_header_and_metadata(model, ModelApp):
    path, _ = model

    async def script(app, pilot):
        await pilot.press("m")
        await pilot.pause()
        text = pane_text(app, "meta")
        assert f"Model: {path}" in text and "Tensors: 5" in text and "Total params: 674" in text
        assert "Layout: " in text and "magic:" in text and "name: tui-demo" in text and "license: MIT" in text
    drive(ModelApp(path), script)


def test_search_filters_the_list_and_enter_selects(model, ModelApp):
    path, _ = model

    async def script(app, pilot):
        await pilot.press("slash")
        await pilot.pause()
        assert app.query_one("#nav").current == "tensors" and app.focused.id == "search"
        await pilot.press(*"conv")
        await pilot.pause()
        table = app.query_one("#tensors")
        assert table.shown == ["encoder.conv1.weight"] and table.row_count == 1
        await pilot.press("enter")
        await pilot.pause()
        assert app.selected == "encoder.conv1.weight" and app.focused is table
        # a glob; Esc cancels and shows every tensor again
        await pilot.press("slash", *"*norm*")
        await pilot.pause()
        assert table.shown == ["decoder.layer_norm.weight", "encoder.layer_norm.weight"]
        await pilot.press("escape")
        await pilot.pause()
        assert table.shown == render.tree_order(NAMES) and not app.query_one("#search").has_class("open")
    drive(ModelApp(path), script)


def test_enter_on_a_tensor_drills_down_to_its_statistics(model, ModelApp):
    path, _ = model

    async def script(app, pilot):
        await pilot.press("m", "t")
        await pilot.pause()
        await pilot.press("down", "enter")
        await pilot.pause()
        assert app.query_one("#detail").current == "stats"
        assert pane_text(app, "stats").startswith(app.selected)
    drive(ModelApp(path), script)


def test_help_overlay_opens_and_closes(model, ModelApp):
    path, _ = model

    async def script(app, pilot):
        from aprfast.tui.views import KEYS, HelpScreen

        await pilot.press("question_mark")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        text = str(app.screen.query_one("#help-text").content)
        for _key, what in KEYS:
            assert what in text
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, HelpScreen) and app.is_running
    drive(ModelApp(path), script)


def test_q_quits(model, ModelApp):
    path, _ = model

    async def script(app, pilot):
        await pilot.press("q")
        await pilot.pause()
        return app.is_running
    app = ModelApp(path)
    assert drive(app, script) is False
    assert app.return_code == 0


# --- two models -----------------------------------------------------------------------------------
@pytest.fixture
def changed(model, tmp_path):
    path, tensors = model
    other = {k: v.copy() for k, v in tensors.items()}
    other["decoder.layer_norm.weight"] -= 10
    b = tmp_path / "b.apr"
    aprfast.save_file(other, b, metadata={"license": "MIT", "name": "tui-demo"})
    return path, b, tensors, other


def test_compare_view_shows_drift_for_a_changed_tensor_and_match_for_equal_ones(changed, ModelApp):
    a, b, tensors, other = changed

    async def script(app, pilot):
        await settle(app, pilot)
        await pilot.press("c")
        await pilot.pause()
        assert app.query_one("#detail").current == "compare"
        table = app.query_one("#compare-table")
        status = {row.value: str(table.get_cell(row, "status")) for row in table.rows}
        assert status == {n: ("DRIFT" if n == "decoder.layer_norm.weight" else "MATCH") for n in NAMES}
        assert str(table.get_cell("decoder.layer_norm.weight", "max Δ")) == fmt(app.report.max_abs_delta)
        summary = str(app.query_one("#compare-summary").content)
        assert "Changed: 1 tensor" in summary and f"Comparing: {a} vs {b}" in summary
        # the selected pair: both sides' means and their distributions
        await pilot.pause()
        detail = str(app.query_one("#compare-detail").content)
        name = "decoder.layer_norm.weight"
        assert detail.startswith(f"{name}: DRIFT")
        ma, mb = tensor_stats(tensors[name]).mean, tensor_stats(other[name]).mean
        assert f"Mean A: {fmt(ma)}    Mean B: {fmt(mb)}" in detail
        await pilot.press("down")  # the next pair, in the table's order
        await pilot.pause()
        assert app.selected == "encoder.conv1.weight"
        assert str(app.query_one("#compare-detail").content).startswith("encoder.conv1.weight: MATCH")
    drive(ModelApp(a, b), script)


def test_the_comparison_arriving_keeps_the_selected_tensor(changed, ModelApp):
    """The table filling (its cursor on row 0) must not pull the selection away."""
    a, b, _, _ = changed

    async def script(app, pilot):
        await highlight_in_tree(app, pilot, "encoder.layer_norm.weight")
        await settle(app, pilot)
        await pilot.press("c")
        await settle(app, pilot)
        table = app.query_one("#compare-table")
        assert app.selected == "encoder.layer_norm.weight"
        assert table.ordered_rows[table.cursor_row].key.value == "encoder.layer_norm.weight"
        assert str(app.query_one("#compare-detail").content).startswith("encoder.layer_norm.weight: MATCH")
        await pilot.press("down")
        await settle(app, pilot)
        assert app.selected == "encoder.layers.0.fc1.weight"
        assert app.query_one("#graph").cursor_node.data == "encoder.layers.0.fc1.weight"
    drive(ModelApp(a, b), script)


def test_compare_uses_diff_models_numbers(changed, ModelApp):
    from aprfast.tools.diff import diff_models

    a, b, _, _ = changed

    async def script(app, pilot):
        await settle(app, pilot)
        return app.report
    report = drive(ModelApp(a, b), script)
    expected = diff_models(a, b)
    assert [(t.name, t.status, t.max_abs_delta, t.cosine) for t in report.tensors] == \
           [(t.name, t.status, t.max_abs_delta, t.cosine) for t in expected.tensors]


# --- every variant aprfast.open reads -----------------------------------------------------------------
def variants(tmp_path, tensors):
    from aprfast import v1

    small = {k: v for k, v in tensors.items() if k != "step"}
    yield "apr2", {}, lambda p: aprfast.save_file(tensors, p, layout="apr2")
    yield "lz4", {}, lambda p: aprfast.save_file(tensors, p, compression="lz4")
    yield "password", {"password": "pw"}, lambda p: aprfast.save_file(tensors, p, password="pw")
    yield "v1", {}, lambda p: v1.save_model(small, p, compression="zstd")
    yield "v1-password", {"password": "pw"}, lambda p: v1.save_model(small, p, password="pw")


def test_every_variant_opens_with_its_keys(model, tmp_path, ModelApp):
    _, tensors = model
    for kind, keys, save in variants(tmp_path, tensors):
        path = tmp_path / f"{kind}.apr"
        save(path)
        app = ModelApp(path, keys=keys)
        try:
            name = "encoder.conv1.weight"
            assert app.stats.request(name) == tensor_stats(tensors[name], bins=40), kind
            assert f"Model: {path}" in app._metadata_text()
        finally:
            app.close()


def test_a_sharded_model_opens_by_its_index(model, tmp_path, ModelApp):
    _, tensors = model
    out = tmp_path / "sharded"
    out.mkdir()
    aprfast.save_file(tensors, out / "model.apr", max_shard_size=1200)
    (index,) = out.glob("*.index.json")
    assert len(list(out.glob("model-*-of-*.apr"))) > 1

    async def script(app, pilot):
        assert sorted(app.query_one("#graph").nodes) == NAMES
        await highlight_in_tree(app, pilot, "encoder.layers.0.fc1.weight")
        await pilot.pause()
        for line in expected_stats_lines("encoder.layers.0.fc1.weight", tensors["encoder.layers.0.fc1.weight"]):
            assert line in pane_text(app, "stats")
    drive(ModelApp(index), script)


# --- a screenshot ---------------------------------------------------------------------------------
def test_a_screenshot_shows_the_tensor_names(changed, ModelApp, tmp_path, record_property):
    a, b, _, _ = changed

    async def script(app, pilot):
        await settle(app, pilot)
        await pilot.press("t", "c")
        await pilot.pause()
        return app.save_screenshot("apr-tui.svg", str(tmp_path))
    shot = drive(ModelApp(a, b), script)
    record_property("screenshot", shot)
    print(f"screenshot: {shot}")
    with open(shot, encoding="utf-8") as fh:
        svg = fh.read()
    assert svg.startswith("<svg")
    for name in NAMES:
        assert name in svg, name
    assert "DRIFT" in svg and "MATCH" in svg


# --- the command line -----------------------------------------------------------------------------
def test_the_command_runs_the_app_with_keys(model, tmp_path, monkeypatch, ModelApp):
    """`apr tui` opens an encrypted file with --password-env and runs the app (here
    headless: the pilot presses q)."""
    _, tensors = model
    sealed = tmp_path / "sealed.apr"
    aprfast.save_file(tensors, sealed, password="pw")
    monkeypatch.setenv("APR_TUI_PW", "pw")
    seen = {}

    def run_headless(app):
        async def go():
            async with app.run_test() as pilot:
                await pilot.pause()
                seen["stats"] = pane_text(app, "stats")
                await pilot.press("q")
        asyncio.run(go())

    monkeypatch.setattr(ModelApp, "run", run_headless)
    assert main(["tui", str(sealed), "--password-env", "APR_TUI_PW"]) == 0
    assert seen["stats"].startswith("decoder.layer_norm.weight")


@pytest.mark.parametrize("argv, code, message", [
    (["tui", "A", "B"], 2, "two files need --compare"),
    (["tui", "A", "--compare"], 2, "--compare takes exactly two files"),
    (["tui", "A", "--bins", "0"], 2, "--bins"),
])
def test_bad_arguments_exit_2(argv, code, message, model, capsys):
    path, _ = model
    argv = [str(path) if a in ("A", "B") else a for a in argv]
    assert main(argv) == code
    assert message in capsys.readouterr().err


def test_a_missing_file_exits_3(tmp_path, capsys, ModelApp):
    assert main(["tui", str(tmp_path / "nope.apr")]) == 3


def test_a_wrong_password_exits_4(model, tmp_path, monkeypatch, ModelApp):
    _, tensors = model
    sealed = tmp_path / "sealed.apr"
    aprfast.save_file(tensors, sealed, password="pw")
    monkeypatch.setenv("APR_TUI_PW", "wrong")
    assert main(["tui", str(sealed), "--password-env", "APR_TUI_PW"]) == 4


HIDE_TEXTUAL = r"""
import importlib.abc, sys
class Hide(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "textual":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, Hide())
from aprfast.cli import main
sys.exit(main(["tui", sys.argv[1]]))
"""


def test_without_textual_the_command_names_the_extra(model):
    path, _ = model
    package_parent = os.path.dirname(os.path.dirname(os.path.abspath(aprfast.__file__)))
    env = dict(os.environ, PYTHONPATH=package_parent)
    out = subprocess.run([sys.executable, "-c", HIDE_TEXTUAL, str(path)], env=env, capture_output=True, text=True,
                         timeout=120, cwd=os.path.dirname(package_parent))
    assert out.returncode == 1, out.stderr
    assert "apr tui: the terminal UI (apr tui) needs the 'textual' package" in out.stderr
    assert "pip install 'aprfast[tui]'" in out.stderr
    assert "Traceback" not in out.stderr


# --- the text the views show ------------------------------------------------------------------------
def test_module_tree_keeps_a_tensor_that_is_also_a_prefix():
    root = render.module_tree(["a.b", "a.b.c", "x"])
    assert list(root.children) == ["a", "x"]
    b = root.children["a"].children["b"]
    assert b.tensor == "a.b" and b.children["c"].tensor == "a.b.c"
    assert root.tensors() == ["a.b", "a.b.c", "x"]


def test_histogram_lines_draw_each_bin_to_scale():
    s = tensor_stats(np.array([0, 0, 0, 0, 1, 1, 3], np.float32), bins=3)
    assert s.histogram == (4, 2, 1)
    lines = render.histogram_lines(s, width=3, height=4)
    assert lines[0] == "4 │█  "
    assert lines[2] == "2 │██ "
    assert lines[3] == "  │███"
    assert lines[4] == "0 └───"
    assert "0" in lines[5] and "3" in lines[5]
    assert render.histogram_lines(tensor_stats(np.array([np.nan], np.float32), bins=3)) == ["(no finite values)"]


def test_health_lines_put_what_is_not_ok_first_when_there_are_many():
    good = tensor_stats(np.ones(4, np.float32))
    bad = tensor_stats(np.full(4, 11.0, np.float32))
    rows = [(f"layers.{i}.norm.weight", good, check_expected(f"layers.{i}.norm.weight", good)) for i in range(20)]
    rows[15] = ("layers.15.norm.weight", bad, check_expected("layers.15.norm.weight", bad))
    lines = render.health_lines(rows, limit=5)
    assert lines[0] == "Layer norm health: 19 of 20 OK"
    assert lines[2].split()[0] == "layers.15.norm.weight" and lines[2].endswith("FAIL")
    assert len(lines) == 2 + 5 + 1 and lines[-1] == "  ... 15 more"
    assert len(render.health_lines(rows[:3], limit=5)) == 2 + 3
