"""What every subcommand shares: exit codes, opening a file with keys taken from the
environment or a key file (never from argv, which other users see in ``ps``), JSON."""

from __future__ import annotations

import json
import math
import os
import sys

from ..io.progress import PlainProgress
from ..tools.text import fmt, shape_text  # noqa: F401  (the cli modules take them from here)

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_NOT_FOUND, EXIT_FORMAT, EXIT_VALIDATION = 0, 1, 2, 3, 4, 5


class UsageError(Exception):
    """An argument that parsed but cannot be used (exit 2)."""


#: The library's messages name its keyword arguments; under ``apr`` they name the flags
#: (issue 28 item 3).  Applied in order by :func:`cli_text`, longest phrasings first.
CLI_WORDS = (
    ("pass password= or private_key=", "give --password-env VAR or --key-file FILE"),
    ("give password= or private_key=, not both", "give --password-env VAR or --key-file FILE, not both"),
    ("(password= or private_key=)", "(--password-env VAR or --key-file FILE)"),
    ("password= or private_key=", "--password-env VAR or --key-file FILE"),
    ("give password= or recipients=, not both", "give --password-env VAR or --recipient FILE, not both"),
    ("password= or recipients=", "--password-env VAR or --recipient FILE"),
    ("pass replace_signature=True (apr sign --resign)", "pass --resign"),
    ("replace_signature=True", "--resign"),
    ("; pass allow_unencrypted=True to read it anyway",
     "; give no --password-env or --key-file to read it (apr verify checks its signature)"),
    ("; pass allow_unencrypted=True to accept plaintext files too",
     "; give no --password-env or --key-file to read a file that is not encrypted"),
    ("max_drift= raises the limit", "--max-drift X raises the limit"),
    ("validate='relaxed' or force=True", "--validate relaxed or --force"),
    ("(validate='strict', force=True)", "(--force)"),
    ("(validate='relaxed')", "(--validate relaxed)"),
    ("validate='relaxed'", "--validate relaxed"),
    ("pass force=True", "pass --force"),
    ("force=True", "--force"),
    ("encrypt_names=True", "--encrypt-names"),
    ("save with layout='apr2' or 'auto'", "--layout apr2 or auto"),
    ("pass trusted_keys=", "give --trusted-key FILE"),
)


def cli_text(message: str) -> str:
    """``message`` in the command line's words: the keyword arguments a library
    error names (``pass password= or private_key=``) become the flags that give them
    (``--password-env VAR or --key-file FILE``).  What ``apr`` prints every error with.

    Example::

        cli_text("the file is encrypted: pass password= or private_key=")
        # 'the file is encrypted: give --password-env VAR or --key-file FILE'
    """
    for library, cli in CLI_WORDS:
        if library in message:
            message = message.replace(library, cli)
    return message


def refuse_existing(force: bool, *paths) -> None:
    """The one ``--force`` rule of every command that writes a file: anything at an
    output's name (a file, a directory, a symlink, even a dangling one:
    ``os.path.lexists``) is refused unless ``--force`` (DestinationExistsError; ``apr``
    prints "PATH exists; pass --force to replace it" and exits 1).  None paths are
    skipped (an output not asked for).

    Example::

        refuse_existing(args.force, args.output)
    """
    if force:
        return
    from ..convert import DestinationExistsError

    for path in paths:
        if path is not None and os.path.lexists(path):
            raise DestinationExistsError("destination exists; pass --force to replace it", path=os.fspath(path))


def write_atomically(path, data: bytes) -> None:
    """``data`` as the file ``path``, whole or not at all (an
    :class:`aprfast.io.atomic.AtomicFile`: a symlink at ``path`` is replaced, never
    written through)."""
    from ..io.atomic import AtomicFile

    atomic = AtomicFile(path)
    try:
        view = memoryview(data)
        while len(view):
            view = view[os.write(atomic.fd, view):]
    except BaseException:
        atomic.abort()
        raise
    atomic.commit()


def non_negative_int(text) -> int:
    """argparse type: 0, 1, 2, ... (a bad value is a usage error, exit 2)."""
    import argparse

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative")
    return value


def add_key_options(parser) -> None:
    group = parser.add_argument_group("keys for encrypted or signed v1 files")
    group.add_argument("--password-env", metavar="VAR",
                       help="read the password from environment variable VAR")
    group.add_argument("--key-file", metavar="PATH", help="X25519 private key file (raw 32 bytes or PEM)")
    group.add_argument("--trusted-key", metavar="PATH", action="append",
                       help="Ed25519 public key file whose signature is required (repeatable)")


def keys_from(args) -> dict:
    """``aprfast.open`` keyword arguments for the key options given."""
    keys = {}
    if getattr(args, "password_env", None):
        password = os.environ.get(args.password_env)
        if password is None:
            raise UsageError(f"--password-env: environment variable {args.password_env} is not set")
        keys["password"] = password
    if getattr(args, "key_file", None):
        from ..crypto.core import load_key

        keys["private_key"] = load_key(args.key_file, kind="x25519-private")[1]
    if getattr(args, "trusted_key", None):
        from ..crypto.core import load_key

        keys["trusted_keys"] = [load_key(path, kind="ed25519-public")[1] for path in args.trusted_key]
    if "password" in keys and "private_key" in keys:
        raise UsageError("give --password-env or --key-file, not both")
    return keys


def add_verify_option(parser) -> None:
    """``--no-verify`` for a command that reads a whole file: by default its footer
    CRC32 (and signature, where present) is checked while it is read, and a damaged
    file is E004, exit 5, before anything is written (issue 28 item 1)."""
    parser.add_argument("--no-verify", dest="verify", action="store_false",
                        help="do not check the input's CRC32 and signature (a damaged file then passes silently)")


def verify_from(args) -> bool:
    """Whether to check the input's integrity (``--no-verify`` says not; True by default)."""
    return getattr(args, "verify", True) is not False


def open_model(path, args, **options):
    """``aprfast.open`` with the keys of ``args``; tensors of unknown dtype come back raw
    so that listing and checking a file never fails on them."""
    import logging
    import time

    import aprfast

    started = time.perf_counter()
    opened = aprfast.open(path, unknown_dtypes="raw", **keys_from(args), **options)
    log = logging.getLogger("aprfast.cli")
    if log.isEnabledFor(logging.DEBUG):
        log.debug("opened %s: %s, %d tensor(s)%s in %.3f s", path, type(opened).__name__ + (
            f" ({opened.layout} layout)" if hasattr(opened, "layout") else ""), len(opened),
            ", CRC32 checked" if options.get("verify") else "", time.perf_counter() - started)
    return opened


def clean(value):
    """A JSON-safe copy: NaN/Inf become None (JSON has neither), bytes hex."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean(v) for v in value]
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).hex()
    return value


def print_json(report) -> None:
    json.dump(clean(report), sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")


def password_from(args) -> str | None:
    """The password named by ``--password-env VAR`` (None without the option)."""
    var = getattr(args, "password_env", None)
    if not var:
        return None
    password = os.environ.get(var)
    if password is None:
        raise UsageError(f"--password-env: environment variable {var} is not set")
    if not password:
        raise UsageError(f"--password-env: environment variable {var} is empty")
    return password


def signing_key_from(args) -> bytes | None:
    """The Ed25519 seed of ``--signing-key PATH`` (PEM, OpenSSH or raw 32 bytes).

    A public key is refused (issue 28 item 2: signing "with" ``me.key.pub`` took its 32
    bytes for a seed and signed under another identity).  A PEM or OpenSSH file says
    what it holds; raw 32 bytes do not, so a raw file named ``*.pub``, one equal to its
    ``PATH.pub`` sibling, or one whose public half is not that sibling's key is refused
    too (FormatError, exit 4, naming the file to use)."""
    path = getattr(args, "signing_key", None)
    if not path:
        return None
    from ..crypto.core import load_key
    from ..errors import FormatError

    path = os.fspath(path)
    raw = os.path.isfile(path) and os.path.getsize(path) == 32
    if not raw:
        kind, seed = load_key(path)
        if kind == "ed25519-public":
            raise FormatError(f"--signing-key {path} is an Ed25519 public key; sign with its private key"
                              f"{_private_hint(path)}", path=path)
        if kind != "ed25519-private":
            raise FormatError(f"--signing-key {path} holds an {kind} key, not an Ed25519 private key "
                              "(apr keygen PATH writes one)", path=path)
        return seed
    seed = load_key(path, kind="ed25519-private")[1]
    _check_raw_seed(path, seed)
    return seed


def _private_hint(path: str) -> str:
    private = path[:-len(".pub")] if path.endswith(".pub") else None
    return f" ({private})" if private and os.path.exists(private) else ""


def _check_raw_seed(path: str, seed: bytes) -> None:
    """Refuse a raw 32-byte ``--signing-key`` that is (or is not the private half of)
    a public key: the name, then the ``.pub`` sibling, decide."""
    from ..crypto.core import load_key, public_key_of
    from ..errors import FormatError

    if path.endswith(".pub"):
        raise FormatError(f"--signing-key {path} is a public key file (.pub); sign with its private key"
                          f"{_private_hint(path)}", path=path)
    sibling = path + ".pub"
    if not os.path.isfile(sibling):
        return
    try:
        public = load_key(sibling, kind="ed25519-public")[1]
    except Exception:  # noqa: BLE001 - a sibling of another kind says nothing about this key
        return
    if bytes(public) == bytes(seed):
        raise FormatError(f"--signing-key {path} holds the same 32 bytes as its public key {sibling}: it is "
                          "a copy of the public key, not a private key", path=path)
    if bytes(public_key_of(seed)) != bytes(public):
        raise FormatError(f"--signing-key {path} is not the private key of {sibling} (their public keys "
                          "differ): signatures would not verify with it", path=path)


def add_signing_key_option(parser, help_text: str) -> None:
    parser.add_argument("--signing-key", metavar="PATH", help=help_text)


class layout_notes:  # noqa: N801 - used as a context manager, like contextlib's
    """Within it, a :class:`aprfast.layouts.LayoutChangeWarning` becomes the line
    ``apr COMMAND: note: ...`` on stderr (issue 28 item 8); other warnings go on as
    they would.

    Example::

        with layout_notes("sign"):
            sign_file(...)
    """

    def __init__(self, command: str):
        self.command = command

    def __enter__(self):
        import warnings

        from ..layouts import LayoutChangeWarning

        self._catch = warnings.catch_warnings(record=True)
        self._caught = self._catch.__enter__()
        warnings.simplefilter("always", LayoutChangeWarning)
        return self

    def __exit__(self, *exc_info):
        import warnings

        from ..layouts import LayoutChangeWarning

        self._catch.__exit__(*exc_info)
        for w in self._caught:
            if issubclass(w.category, LayoutChangeWarning):
                print(f"apr {self.command}: note: {w.message}", file=sys.stderr)
            else:
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        return False


def add_progress_option(parser) -> None:
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bar")


def progress_for(args, description: str):
    """A context manager giving a ``progress(done, total)`` callback: a rich progress
    bar on stderr when stderr is a terminal; without rich a plain one-line progress
    there once the command has run a second (issue 28 item 5: a 12 s convert printed
    nothing), with a hint, once, that ``aprfast[cli]`` draws the bar; else
    (``--json``, ``--quiet``, a pipe) False, which the library calls take as "show
    nothing" (their default, None, would draw their own line on a terminal)."""
    if getattr(args, "json", False) or getattr(args, "quiet", False) or not sys.stderr.isatty():
        return _NoProgress()
    from importlib.util import find_spec

    if find_spec("rich") is None:  # optional: the bar is a nicety, never a requirement
        return PlainProgress(description, hint=PROGRESS_HINT)
    return _RichProgress(description)


#: Printed once per process above the first plain progress line (apr only: a library
#: call does not advertise the CLI's extra).
PROGRESS_HINT = "apr: pip install 'aprfast[cli]' for a full progress bar (rich)"


class _NoProgress:
    def __enter__(self):
        return False

    def __exit__(self, *exc_info):
        return False


class _RichProgress:
    def __init__(self, description: str):
        self.description = description

    def __enter__(self):
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeRemainingColumn

        self._bar = Progress(TextColumn("{task.description}"), BarColumn(), TaskProgressColumn(),
                             TimeRemainingColumn(), console=Console(file=sys.stderr), transient=True)
        self._bar.start()
        self._task = self._bar.add_task(self.description, total=None)
        return self.update

    def update(self, done, total) -> None:
        self._bar.update(self._task, completed=done, total=total)

    def __exit__(self, *exc_info):
        self._bar.stop()
        return False


_STATUS_COLOURS = {"PASS": "32", "WARN": "33", "FAIL": "31", "N/A": "2"}


def paint(status: str, enabled: bool) -> str:
    """``[STATUS]``, in colour (green, yellow, red, dim) when ``enabled``: the caller
    decides from ``args.color`` (``--color``, ``APR_COLOR``, the config file, a terminal)."""
    tag = f"[{status}]"
    code = _STATUS_COLOURS.get(status)
    return f"\x1b[{code}m{tag}\x1b[0m" if enabled and code else tag
