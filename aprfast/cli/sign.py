"""``apr sign FILE --signing-key KEY``: sign a model with an Ed25519 key file, in
place (atomically) or to ``-o OUT``; over :func:`aprfast.tools.protection.sign_file`.  A v1
payload is signed as stored, so an encrypted v1 file is signed without its key; a v2
file is saved again signed, and an encrypted one needs its key (``--password-env`` /
``--key-file``)."""

from __future__ import annotations

from ..tools.protection import sign_file
from ._common import (
    EXIT_OK,
    UsageError,
    add_signing_key_option,
    keys_from,
    print_json,
    refuse_existing,
    signing_key_from,
)


def add_parser(commands) -> None:
    p = commands.add_parser("sign", help="sign a model with an Ed25519 key file")
    p.add_argument("file", help="a v1 or v2 .apr file")
    add_signing_key_option(p, "Ed25519 private key file (from apr keygen; raw 32 bytes, PEM or OpenSSH)")
    p.add_argument("-o", "--output", help="write the signed file here instead of replacing FILE")
    p.add_argument("--resign", action="store_true", help="replace an existing signature")
    p.add_argument("--password-env", metavar="VAR",
                   help="encrypted v2 files: the password, from environment variable VAR (the file is re-sealed)")
    p.add_argument("--key-file", metavar="PATH", help="encrypted v2 files: the X25519 private key file")
    p.add_argument("-f", "--force", action="store_true", help="replace an existing OUTPUT")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")
    p.set_defaults(run=run)


def run(args) -> int:
    key = signing_key_from(args)
    if key is None:
        raise UsageError("--signing-key PATH is required")
    refuse_existing(args.force, args.output)  # no OUTPUT: FILE itself is re-signed in place
    keys = keys_from(args)
    result = sign_file(args.file, key, output=args.output, replace_signature=args.resign, force=args.force,
                       password=keys.get("password"), private_key=keys.get("private_key"))
    if args.json:
        print_json(result)
    else:
        print(f"{result['file']}: signed by {result['signer']}")
    return EXIT_OK
