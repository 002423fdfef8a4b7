"""``apr decrypt IN -o OUT``: write the plaintext of an encrypted v1 or v2 model, with the
password from the environment (``--password-env VAR``) or an X25519 private key file
(``--key-file PATH``); ``--trusted-key`` requires its signature first.  Over
:func:`aprfast.tools.protection.decrypt_file`."""

from __future__ import annotations

import sys

from ..tools.protection import decrypt_file
from ._common import (
    EXIT_OK,
    UsageError,
    add_key_options,
    add_signing_key_option,
    keys_from,
    print_json,
    refuse_existing,
    signing_key_from,
)


def add_parser(commands) -> None:
    p = commands.add_parser("decrypt", help="decrypt a model (password from the environment, or a key file)")
    p.add_argument("file", help="an encrypted v1 or v2 .apr file")
    p.add_argument("-o", "--output", required=True, help="the plaintext file to write")
    add_key_options(p)
    add_signing_key_option(p, "Ed25519 private key file to sign the decrypted file with")
    p.add_argument("-f", "--force", action="store_true", help="replace an existing OUTPUT")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")
    p.set_defaults(run=run)


def run(args) -> int:
    keys = keys_from(args)
    if "password" not in keys and "private_key" not in keys:
        raise UsageError("give --password-env VAR or --key-file PATH")
    refuse_existing(args.force, args.output)
    result = decrypt_file(args.file, args.output, signing_key=signing_key_from(args), force=args.force, **keys)
    if args.json:
        print_json(result)
    else:
        print(f"{result['file']}: decrypted (was {result['was']})" + (", signed" if result["signed"] else ""))
    if result["was_signed"] and not result["signed"]:
        print(f"apr decrypt: {args.file} was signed; {args.output} is not (give --signing-key to sign it)",
              file=sys.stderr)
    return EXIT_OK
