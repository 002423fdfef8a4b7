"""MkDocs hooks (``hooks:`` in mkdocs.yml): the CLI reference page is generated from the
``apr`` argparse parsers at build time, so it cannot drift from the code.

A page holding the marker ``<!-- apr-cli-reference -->`` gets, in its place, one section
per subcommand (and per sub-subcommand, such as ``apr cache info``) with that parser's
``format_help()`` output, in ``apr --help`` order.
"""

from __future__ import annotations

import argparse
import os

MARKER = "<!-- apr-cli-reference -->"

#: Help text is wrapped at this width whatever the terminal of the build says.
COLUMNS = "96"


def _subparsers(parser: argparse.ArgumentParser):
    """(name, subparser, one-line help) of ``parser``'s subcommands, in declaration order."""
    for action in parser._actions:  # argparse exposes no public accessor for subparsers
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help for choice in action._choices_actions}
            for name, sub in action.choices.items():
                yield name, sub, helps.get(name) or ""


def _sections(parser: argparse.ArgumentParser, prefix: str, level: int):
    for name, sub, summary in _subparsers(parser):
        title = f"{prefix} {name}"
        anchor = title.replace(" ", "-")
        yield f"{'#' * level} `{title}` {{#{anchor}}}\n"
        if summary:
            yield f"{summary[0].upper()}{summary[1:]}.\n" if not summary.endswith(".") else f"{summary}\n"
        yield "```text\n" + sub.format_help().rstrip() + "\n```\n"
        yield from _sections(sub, title, level + 1)


def cli_reference() -> str:
    """The generated Markdown: ``apr --help``, then every subcommand's help."""
    from aprfast.cli import build_parser

    saved = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = COLUMNS
    try:
        parser = build_parser()  # no settings: the defaults shown are the built-in ones
        parts = ["## `apr` {#apr}\n", "```text\n" + parser.format_help().rstrip() + "\n```\n"]
        parts.extend(_sections(parser, "apr", 2))
    finally:
        if saved is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = saved
    return "\n".join(parts)


def on_page_markdown(markdown: str, page, config, files) -> str:
    if MARKER in markdown:
        markdown = markdown.replace(MARKER, cli_reference())
    return markdown
