"""What every subcommand shares: exit codes, opening a file with keys taken from the
environment or a key file (never from argv, which other users see in ``ps``), JSON."""

from __future__ import annotations

import json
import math
import os
import sys

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_NOT_FOUND, EXIT_FORMAT, EXIT_VALIDATION = 0, 1, 2, 3, 4, 5


class UsageError(Exception):
    """An argument that parsed but cannot be used (exit 2)."""


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
        from ..crypto import load_key

        keys["private_key"] = load_key(args.key_file, kind="x25519-private")[1]
    if getattr(args, "trusted_key", None):
        from ..crypto import load_key

        keys["trusted_keys"] = [load_key(path, kind="ed25519-public")[1] for path in args.trusted_key]
    if "password" in keys and "private_key" in keys:
        raise UsageError("give --password-env or --key-file, not both")
    return keys


def open_model(path, args, **options):
    """``aprfast.open`` with the keys of ``args``; tensors of unknown dtype come back raw
    so that listing and checking a file never fails on them."""
    import aprfast

    return aprfast.open(path, unknown_dtypes="raw", **keys_from(args), **options)


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


def fmt(value) -> str:
    """A number for humans: ints as they are, floats to 4 significant digits."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def shape_text(shape) -> str:
    return "x".join(str(d) for d in shape) or "scalar"
