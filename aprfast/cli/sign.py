"""``apr sign FILE --signing-key KEY``: sign a v1 model with an Ed25519 key file, in
place (atomically) or to ``-o OUT``; over :func:`aprfast.protection.sign_file`.  The
payload is signed as stored, so an encrypted file is signed without its key."""

from __future__ import annotations

from ..protection import sign_file
from ._common import EXIT_OK, UsageError, add_signing_key_option, print_json, signing_key_from


def add_parser(commands) -> None:
    p = commands.add_parser("sign", help="sign a v1 model with an Ed25519 key file")
    p.add_argument("file", help="a v1 .apr file")
    add_signing_key_option(p, "Ed25519 private key file (from apr keygen; raw 32 bytes, PEM or OpenSSH)")
    p.add_argument("-o", "--output", help="write the signed file here instead of replacing FILE")
    p.add_argument("--resign", action="store_true", help="replace an existing signature")
    p.add_argument("-f", "--force", action="store_true", help="replace an existing OUTPUT")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")
    p.set_defaults(run=run)


def run(args) -> int:
    key = signing_key_from(args)
    if key is None:
        raise UsageError("--signing-key PATH is required")
    result = sign_file(args.file, key, output=args.output, replace_signature=args.resign, force=args.force)
    if args.json:
        print_json(result)
    else:
        print(f"{result['file']}: signed by {result['signer']}")
    return EXIT_OK
