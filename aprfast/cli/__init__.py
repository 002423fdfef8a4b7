"""The ``apr`` command: one module per subcommand, each a thin layer over a Python
function a program can call directly.

Exit codes (seed 001 Appendix A): 0 success, 1 general error, 2 invalid arguments,
3 file not found, 4 format error (any AprError while reading), 5 validation failed
(a ValidationError, E009: the file is intact but its values break a rule; and the CRC32
check, E004, of every command that reads a whole file, unless ``--no-verify``).
Results go to stdout (``--json`` for machines), diagnostics to stderr.

Every command reads the configuration file and environment of :mod:`aprfast.config`
(``APR_CONFIG``, ``APR_CACHE``, ``APR_LOG_LEVEL``, ``APR_COLOR``): the file gives option
defaults, the command line wins; a bad configuration is an invalid argument (exit 2).
"""

from __future__ import annotations

import argparse
import difflib
import logging
import re
import sys
import time

from .. import __version__
from .. import config as apr_config
from ..convert import DestinationExistsError
from ..errors import AprError, AprFileNotFoundError, AprIOError, ChecksumError, ValidationError
from . import (
    cache,
    convert,
    debug,
    decrypt,
    diff,
    download,
    edit,
    encrypt,
    explain,
    export,
    import_,
    inspect,
    keygen,
    lint,
    merge,
    quantize,
    sign,
    tensors,
    trace,
    tui,
    validate,
    verify,
)
from . import config as config_command
from ._common import (
    EXIT_ERROR,
    EXIT_FORMAT,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_USAGE,
    EXIT_VALIDATION,
    UsageError,
    cli_text,
)

log = logging.getLogger("aprfast.cli")

__all__ = ["main", "EXIT_OK", "EXIT_ERROR", "EXIT_USAGE", "EXIT_NOT_FOUND", "EXIT_FORMAT", "EXIT_VALIDATION"]

#: The subcommand modules, in `apr --help` order; each has add_parser(subparsers).
COMMANDS = (inspect, debug, validate, tensors, lint, diff, edit, convert, import_, export, quantize, merge, trace,
            sign, verify, encrypt, decrypt, keygen, explain, tui, config_command, download, cache)


def main(argv=None) -> int:
    try:
        settings = apr_config.load_settings()
        level = apr_config.log_level(settings)
    except apr_config.ConfigError as exc:
        print(f"apr: configuration: {exc}", file=sys.stderr)
        return EXIT_USAGE
    with apr_config.logging_to_stderr(level):
        return _main(argv, settings)


def _main(argv, settings) -> int:
    try:
        parser = _parser(settings)
    except apr_config.ConfigError as exc:
        print(f"apr: configuration: {exc}", file=sys.stderr)
        return EXIT_USAGE
    args = _parse(parser, argv)
    if not getattr(args, "command", None):
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    _debug_start(args, argv, settings)
    started = time.perf_counter()
    code = _run(args, settings)
    log.debug("apr %s: exit %s after %.3f s", args.command, code, time.perf_counter() - started)
    return code


def _debug_start(args, argv, settings) -> None:
    """``APR_LOG_LEVEL=debug`` (seed 001 §8's environment table): what runs, with what."""
    if not log.isEnabledFor(logging.DEBUG):
        return
    import platform

    from .. import _backend

    log.debug("aprfast %s (%s backend), Python %s on %s", __version__, _backend.BACKEND,
              platform.python_version(), platform.platform(terse=True))
    log.debug("configuration file: %s", settings.path or "none")
    # argv holds no secret: keys and passwords come from files and the environment only
    log.debug("command: apr %s", " ".join(sys.argv[1:] if argv is None else map(str, argv)))


def _run(args, settings) -> int:
    try:
        args.settings = settings
        args.color_mode = apr_config.color_mode(settings, args.color_choice)
        args.color = apr_config.color_enabled(args.color_mode, sys.stdout)
    except apr_config.ConfigError as exc:
        print(f"apr: configuration: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        return args.run(args)
    except UsageError as exc:
        print(cli_text(f"apr {args.command}: {exc}"), file=sys.stderr)
        return EXIT_USAGE
    except (AprFileNotFoundError, FileNotFoundError) as exc:
        print(cli_text(f"apr: {exc}"), file=sys.stderr)
        return EXIT_NOT_FOUND
    except DestinationExistsError as exc:  # QA #97: never replaced without --force
        print(f"apr {args.command}: {exc.path} exists; pass --force to replace it", file=sys.stderr)
        return EXIT_ERROR
    except NotImplementedError as exc:
        print(cli_text(f"apr {args.command}: not supported: {exc}"), file=sys.stderr)
        return EXIT_ERROR
    except AprIOError as exc:  # permission, EIO: not the file's format
        print(cli_text(f"apr: {exc}"), file=sys.stderr)
        return EXIT_ERROR
    except ValidationError as exc:  # an intact file whose values break a rule: not a format error
        print(cli_text(f"apr {args.command}: validation failed: {exc}"), file=sys.stderr)
        return EXIT_VALIDATION
    except AprError as exc:
        print(cli_text(f"apr: {exc}"), file=sys.stderr)
        if isinstance(exc, ChecksumError) and getattr(args, "verify", None) is True:
            # the integrity check of a command reading a whole file failed: exit 5, as apr validate's
            print(f"apr {args.command}: the input is damaged (--no-verify reads it anyway)", file=sys.stderr)
            return EXIT_VALIDATION
        return EXIT_FORMAT
    except BrokenPipeError:  # `apr inspect big.apr | head` is fine
        return EXIT_OK
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # noqa: BLE001 - a bug or an unforeseen input: a message and exit 1, not a trace
        print(cli_text(f"apr {args.command}: error: {type(exc).__name__}: {exc}"), file=sys.stderr)
        return EXIT_ERROR


class _Parser(argparse.ArgumentParser):
    """argparse with a close match for a mistyped choice (a command, a ``--precision``)."""

    def error(self, message):
        found = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)$", message)
        if found:
            close = difflib.get_close_matches(found.group(1), re.findall(r"'([^']*)'", found.group(2)), n=1)
            if close:
                message += f"; did you mean {close[0]!r}?"
        super().error(message)


def _parse(parser, argv):
    """The arguments; an option the command does not have is that command's error
    (its usage, a close match), not the top-level usage argparse gives."""
    args, extras = parser.parse_known_args(argv)
    if extras:
        sub = _command_parser(parser, args)
        sub.error(_unrecognized(sub, extras))
    return args


def _command_parser(parser, args):
    """The (sub)parser that parsed ``args``: ``apr cache info``'s is cache's info."""
    while True:
        action = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
        chosen = getattr(args, action.dest, None) if action is not None else None
        if chosen not in getattr(action, "choices", {}):
            return parser
        parser = action.choices[chosen]


def _unrecognized(sub, extras) -> str:
    """What ``apr`` says of arguments the command does not take.  Only option names
    are repeated (a value after an unknown option may be a secret: ``--password
    hunter2``)."""
    known = [s for a in sub._actions for s in a.option_strings]
    options = [a.split("=", 1)[0] for a in extras if a.startswith("-") and a != "-"]
    if not options:
        return f"unexpected argument(s): {' '.join(extras)}"
    said = []
    for name in options:
        if name.startswith("--pass") and "--password-env" in known:
            said.append(f"{name}: a password is never taken from the command line (anyone on the machine can "
                        "read it in ps); put it in an environment variable and give its name: --password-env VAR")
            continue
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
        said.append(f"unrecognized option {name}" + (f"; did you mean {close[0]}?" if close else
                                                     f" ({sub.prog} -h lists its options)"))
    return "; ".join(said)


def build_parser(settings=None) -> argparse.ArgumentParser:
    """The ``apr`` argument parser, one subparser per command (what the docs' CLI reference is generated from)."""
    return _parser(settings)


def _parser(settings=None) -> argparse.ArgumentParser:
    parser = _Parser(prog="apr", allow_abbrev=False,
                                     description="Inspect and work with .apr model files.",
                                     epilog="exit codes: 0 success, 1 error, 2 invalid arguments, "
                                            "3 file not found, 4 format error, 5 validation failed, "
                                            "6 (apr diff) tensors match, metadata differs")
    parser.add_argument("--version", action="version", version=f"aprfast {__version__}")
    parser.add_argument("--color", dest="color_choice", choices=apr_config.COLOR_MODES, default=None,
                        help="colour in the output (default: APR_COLOR, the config file, else auto)")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in COMMANDS:
        module.add_parser(commands)
    if settings is not None:
        for name, sub in commands.choices.items():
            apply_config(sub, name, settings)
    # No prefix matching: `--password SECRET` must be refused, not read as --password-env
    # (a secret typed on the command line is visible in ps; it has to fail loudly).
    for sub in commands.choices.values():
        sub.allow_abbrev = False
    return parser


def apply_config(sub, command: str, settings) -> None:
    """Defaults for ``sub``'s options from the configuration file, each checked as the
    command line would check it (a wrong type is a ConfigError, exit 2)."""
    actions = {a.dest: a for a in sub._actions if a.option_strings}
    for dest, value in settings.for_command(command).items():
        action = actions.get(dest)
        if action is None:
            if dest != "json" and command in settings.commands:
                apr_config.log.warning("%s: [%s] %s is not an option of apr %s; ignored",
                                       settings.path, command, dest, command)
            continue
        sub.set_defaults(**{dest: _config_value(action, value, f"{settings.path}: [{command}] {dest}")})
    for dest, value in settings.defaults.items():  # [defaults] keys naming an option: every command that has it
        if dest in actions and dest not in apr_config.GLOBAL_KEYS:
            sub.set_defaults(**{dest: _config_value(actions[dest], value, f"{settings.path}: [defaults] {dest}")})


def _config_value(action, value, where):
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
        if not isinstance(value, bool):
            raise apr_config.ConfigError(f"{where} must be true or false, not {value!r}")
        return value
    if isinstance(value, (dict, bool)) or (isinstance(value, list) and not isinstance(action, argparse._AppendAction)):
        raise apr_config.ConfigError(f"{where}: {value!r} is not a value for {action.option_strings[-1]}")
    if isinstance(action, argparse._AppendAction):
        return [_one_value(action, v, where) for v in (value if isinstance(value, list) else [value])]
    return _one_value(action, value, where)


def _one_value(action, value, where):
    if action.type is None and not isinstance(value, str):
        raise apr_config.ConfigError(f"{where} must be a string, not {value!r}")
    if action.type is not None:
        try:
            value = action.type(str(value))
        except (argparse.ArgumentTypeError, ValueError, TypeError) as exc:
            raise apr_config.ConfigError(f"{where}: {exc}") from None
    if action.choices is not None and value not in action.choices:
        raise apr_config.ConfigError(f"{where}: {value!r}; choose one of {', '.join(map(str, action.choices))}")
    return value
