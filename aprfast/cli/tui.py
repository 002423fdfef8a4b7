"""``apr tui FILE`` and ``apr tui A B --compare``: the terminal UI of seed 001 §4.13, over
:class:`aprfast.tui.ModelApp` (Textual, the ``tui`` extra: without it the command says
which extra to install and exits 1).  Keys open encrypted or signed files as in every
other command; with ``--compare`` they open both models."""

from __future__ import annotations

import sys

from .._optional import MissingDependencyError
from ..tools.diff import DEFAULT_TOLERANCE
from ._common import EXIT_ERROR, EXIT_OK, UsageError, add_key_options, keys_from, non_negative_int


def add_parser(commands) -> None:
    p = commands.add_parser("tui", help="explore a model (or compare two) in a terminal UI")
    p.add_argument("files", nargs="+", metavar="FILE", help="a .apr file; two with --compare")
    p.add_argument("--compare", action="store_true", help="compare two models tensor by tensor (MATCH/DRIFT)")
    p.add_argument("--tolerance", type=float, default=DEFAULT_TOLERANCE,
                   help=f"largest |a-b| a MATCH allows in the compare view (default {DEFAULT_TOLERANCE:g})")
    p.add_argument("--bins", type=int, default=40, help="histogram bins (default 40)")
    p.add_argument("--threads", type=non_negative_int, default=0, help="threads for the statistics (0: every core)")
    add_key_options(p)
    p.set_defaults(run=run)


def run(args) -> int:
    try:
        app = build_app(args)
    except MissingDependencyError as exc:
        print(f"apr tui: {exc}", file=sys.stderr)
        return EXIT_ERROR
    try:
        app.run()
    finally:
        app.close()
    return EXIT_OK if app.return_code in (None, 0) else EXIT_ERROR


def build_app(args):
    """The app for the parsed arguments (files opened, nothing drawn yet).
    MissingDependencyError without Textual."""
    if args.compare and len(args.files) != 2:
        raise UsageError("--compare takes exactly two files")
    if not args.compare and len(args.files) != 1:
        raise UsageError("two files need --compare (apr tui A B --compare)")
    if not args.tolerance >= 0 or args.tolerance == float("inf"):
        raise UsageError(f"--tolerance {args.tolerance}: a finite number >= 0")
    if not 1 <= args.bins <= 4096:
        raise UsageError("--bins must be in 1..4096")
    keys = keys_from(args)
    from ..tui.app import ModelApp

    other = args.files[1] if args.compare else None
    return ModelApp(args.files[0], other, keys=keys, tolerance=args.tolerance, threads=args.threads, bins=args.bins)
