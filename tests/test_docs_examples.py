"""The Python examples of the documentation site run.

Every fenced ```python block of ``docs/**/*.md`` is executed: a page's blocks in order, in
one fresh namespace per page (a later block may use what an earlier one defined), in a
temporary working directory that holds a copy of ``examples/tiny.apr``.  A block right
after a line holding only an ``<!-- skip-test: reason -->`` comment is not run (it needs the network, a GPU,
torch, a cluster, or files only a real model has); the reason is required.

Examples that need an optional package this environment lacks are skipped whole, page by
page, with the missing module named (``MissingDependencyError`` or ``ImportError``).
"""

from __future__ import annotations

import os
import re
import shutil
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
TINY = ROOT / "examples" / "tiny.apr"
#: Optional packages (extras, or peers the examples compare with): a page whose example
#: needs one that is not installed is skipped, naming it.  Any other missing module fails.
OPTIONAL = {"torch", "jax", "ml_dtypes", "zstandard", "lz4", "nacl", "argon2", "cryptography", "msgpack",
            "blake3", "onnx", "cbor2", "rich", "fsspec", "s3fs", "huggingface_hub", "textual", "dask", "ray",
            "safetensors", "gguf"}

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>```+|~~~+)(?P<info>[^\n`]*)$")
_SKIP = re.compile(r"<!--\s*skip-test\s*:\s*(?P<reason>[^>]*?)\s*-->")


def extract_blocks(text: str):
    """(line number, code, skip reason or None) of each ```python block of ``text``."""
    lines = text.split("\n")
    blocks, i, previous = [], 0, ""
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            if lines[i].strip():
                previous = lines[i]
            i += 1
            continue
        indent, fence, info = m.group("indent"), m.group("fence"), m.group("info").strip()
        start, body = i + 1, []
        i += 1
        while i < len(lines) and not (lines[i].strip().startswith(fence) and lines[i].strip().strip(fence[0]) == ""):
            body.append(lines[i])
            i += 1
        i += 1  # the closing fence
        language = info.split()[0].lstrip(".").lower() if info else ""
        if language in ("python", "py"):
            skip = _SKIP.fullmatch(previous.strip())
            code = textwrap.dedent("\n".join(line[len(indent):] if line.startswith(indent) else line
                                             for line in body))
            blocks.append((start + 1, code, skip.group("reason") if skip else None))
        previous = ""
    return blocks


def _pages():
    pages = []
    for path in sorted(DOCS.rglob("*.md")):
        blocks = extract_blocks(path.read_text(encoding="utf-8"))
        if any(skip is None for _, _, skip in blocks):
            pages.append(pytest.param(path, id=str(path.relative_to(DOCS))))
    return pages


def test_the_extractor_sees_blocks_and_skip_markers():
    text = textwrap.dedent("""\
        intro

        ```python
        a = 1
        ```

        <!-- skip-test: needs a GPU -->

        ```python
        b = 2
        ```

        ```console
        $ not python
        ```

        - item:

          ```python
          c = a + 1
          ```
        """)
    blocks = extract_blocks(text)
    assert [(code.strip(), skip) for _, code, skip in blocks] == [
        ("a = 1", None), ("b = 2", "needs a GPU"), ("c = a + 1", None)]


def test_every_skip_marker_gives_a_reason_and_precedes_a_python_block():
    for path in sorted(DOCS.rglob("*.md")):
        text = path.read_text(encoding="utf-8")
        for m in re.finditer(r"^[ \t]*<!--\s*skip-test\b[^>]*-->[ \t]*$", text, re.MULTILINE):
            marker = _SKIP.fullmatch(m.group(0).strip())
            assert marker and marker.group("reason"), \
                f"{path.relative_to(ROOT)}: {m.group(0)!r} gives no reason"
            after = text[m.end():].lstrip()
            assert after.startswith("```python"), \
                f"{path.relative_to(ROOT)}: {m.group(0)!r} is not followed by a ```python block"


@pytest.mark.parametrize("page", _pages())
def test_page_examples_run(page, tmp_path, monkeypatch):
    if not TINY.exists():
        pytest.skip("examples/tiny.apr is not next to the tests (installed package)")
    shutil.copy(TINY, tmp_path / "tiny.apr")
    os.makedirs(tmp_path / "examples", exist_ok=True)
    shutil.copy(TINY, tmp_path / "examples" / "tiny.apr")
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "__docs_example__"}
    from aprfast import MissingDependencyError

    for line, code, skip in extract_blocks(page.read_text(encoding="utf-8")):
        if skip is not None:
            continue
        where = f"{page.relative_to(ROOT)}:{line}"
        try:
            exec(compile(code, where, "exec"), namespace)
        except MissingDependencyError as exc:
            pytest.skip(f"{where}: {exc}")
        except ModuleNotFoundError as exc:
            if (exc.name or "").partition(".")[0] not in OPTIONAL:
                raise
            pytest.skip(f"{where}: {exc}")


def test_the_cli_reference_covers_every_command():
    """docs/hooks.py renders every subcommand of ``apr`` (and ``apr cache``'s own) with its
    options, from the parsers themselves."""
    import importlib.util

    from aprfast.cli import COMMANDS, build_parser

    if not (DOCS / "hooks.py").exists():
        pytest.skip("docs/ is not next to the tests (installed package)")
    spec = importlib.util.spec_from_file_location("_aprfast_docs_hooks", DOCS / "hooks.py")
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    text = hooks.cli_reference()
    names = [name for name, _, _ in hooks._subparsers(build_parser())]
    assert len(names) == len(COMMANDS) and "inspect" in names and "cache" in names
    for name in names + ["cache info", "cache clear"]:
        assert f"## `apr {name}`" in text and f"usage: apr {name}" in text, name
    assert "--password-env" in text and "--max-shard-size" in text
    page = (DOCS / "cli" / "reference.md").read_text(encoding="utf-8")
    assert hooks.on_page_markdown(page, None, None, None).count("usage: apr") == text.count("usage: apr")
