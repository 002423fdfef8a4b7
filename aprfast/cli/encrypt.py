"""``apr encrypt IN -o OUT``: encrypt a model (v1: its payload; v2: every tensor in
1 MiB chunks, ``--encrypt-names`` for metadata and index too) with a password from the
environment (``--password-env VAR``, Argon2id) or to recipients' X25519 public key
files (``--recipient PATH``, repeatable); over :func:`aprfast.tools.protection.encrypt_file`.
Encrypting changes the signed bytes: ``--signing-key`` signs the result, else the
result is unsigned (said on stderr when the input was signed)."""

from __future__ import annotations

import sys

from ..tools.protection import encrypt_file
from ._common import (
    EXIT_OK,
    UsageError,
    add_signing_key_option,
    add_verify_option,
    layout_notes,
    password_from,
    print_json,
    refuse_existing,
    signing_key_from,
    verify_from,
)


def add_parser(commands) -> None:
    p = commands.add_parser("encrypt", help="encrypt a model (password from the environment, or recipients)")
    p.add_argument("file", help="a v1 or v2 .apr file")
    p.add_argument("-o", "--output", required=True, help="the encrypted file to write")
    p.add_argument("--password-env", metavar="VAR", help="read the password from environment variable VAR")
    p.add_argument("--recipient", metavar="PATH", action="append",
                   help="X25519 public key file of a recipient (repeatable)")
    add_signing_key_option(p, "Ed25519 private key file to sign the encrypted file with")
    p.add_argument("--encrypt-names", action="store_true",
                   help="v2 only: encrypt the metadata and tensor index as well (nothing listable without the key)")
    p.add_argument("-f", "--force", action="store_true", help="replace an existing OUTPUT")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")
    add_verify_option(p)
    p.set_defaults(run=run)


def run(args) -> int:
    password = password_from(args)
    if (password is None) == (not args.recipient):
        raise UsageError("give --password-env VAR or --recipient PATH (not both)")
    recipients = None
    if args.recipient:
        from ..crypto.core import load_key

        recipients = [load_key(path, kind="x25519-public")[1] for path in args.recipient]
    refuse_existing(args.force, args.output)
    with layout_notes("encrypt"):  # an aprender-layout file is written as APR2: say so
        result = encrypt_file(args.file, args.output, password=password, recipients=recipients,
                              signing_key=signing_key_from(args), encrypt_names=args.encrypt_names,
                              force=args.force, verify=verify_from(args))
    if args.json:
        print_json(result)
    else:
        print(f"{result['file']}: encrypted ({result['encryption']})" + (", signed" if result["signed"] else ""))
    if result["was_signed"] and not result["signed"]:
        print(f"apr encrypt: {args.file} was signed; {args.output} is not (give --signing-key to sign it)",
              file=sys.stderr)
    return EXIT_OK
