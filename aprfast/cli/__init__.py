"""The ``apr`` command: one module per subcommand, each a thin layer over a Python
function a program can call directly.

Exit codes (seed 001 Appendix A): 0 success, 1 general error, 2 invalid arguments,
3 file not found, 4 format error (any AprError while reading), 5 validation failed.
Results go to stdout (``--json`` for machines), diagnostics to stderr.
"""

from __future__ import annotations

import argparse
import sys

from .. import __version__
from ..convert._common import DestinationExistsError
from ..errors import AprError, AprFileNotFoundError, AprIOError
from . import (convert, debug, decrypt, diff, encrypt, explain, export, import_, inspect, keygen, lint, merge, sign,
               tensors, validate, verify)
from ._common import (EXIT_ERROR, EXIT_FORMAT, EXIT_NOT_FOUND, EXIT_OK, EXIT_USAGE, EXIT_VALIDATION,
                      UsageError)

__all__ = ["main", "EXIT_OK", "EXIT_ERROR", "EXIT_USAGE", "EXIT_NOT_FOUND", "EXIT_FORMAT", "EXIT_VALIDATION"]

#: The subcommand modules, in `apr --help` order; each has add_parser(subparsers).
COMMANDS = (inspect, debug, validate, tensors, lint, diff, convert, import_, export, merge, sign, verify, encrypt,
            decrypt, keygen, explain)


def main(argv=None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        return args.run(args)
    except UsageError as exc:
        print(f"apr {args.command}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (AprFileNotFoundError, FileNotFoundError) as exc:
        print(f"apr: {exc}", file=sys.stderr)
        return EXIT_NOT_FOUND
    except DestinationExistsError as exc:  # QA #97: never replaced without --force
        print(f"apr {args.command}: {exc.path} exists; pass --force to replace it", file=sys.stderr)
        return EXIT_ERROR
    except NotImplementedError as exc:
        print(f"apr {args.command}: not supported: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except AprIOError as exc:  # permission, EIO: not the file's format
        print(f"apr: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except AprError as exc:
        print(f"apr: {exc}", file=sys.stderr)
        return EXIT_FORMAT
    except BrokenPipeError:  # `apr inspect big.apr | head` is fine
        return EXIT_OK
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # noqa: BLE001 - a bug or an unforeseen input: a message and exit 1, not a trace
        print(f"apr {args.command}: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_ERROR


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="apr", allow_abbrev=False,
                                     description="Inspect and work with .apr model files.",
                                     epilog="exit codes: 0 success, 1 error, 2 invalid arguments, "
                                            "3 file not found, 4 format error, 5 validation failed")
    parser.add_argument("--version", action="version", version=f"aprfast {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in COMMANDS:
        module.add_parser(commands)
    # No prefix matching: `--password SECRET` must be refused, not read as --password-env
    # (a secret typed on the command line is visible in ps; it has to fail loudly).
    for sub in commands.choices.values():
        sub.allow_abbrev = False
    return parser
