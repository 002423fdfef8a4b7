"""``apr verify FILE``: check a model's CRC32 and signature without decrypting it
(exit 0 valid, 5 unsigned, tampered or signed by a key not given with
``--trusted-key``); over :func:`aprfast.protection.verify_file`."""

from __future__ import annotations

import sys

from ..errors import ChecksumError, SignatureError
from ..protection import verify_file
from ._common import EXIT_OK, EXIT_VALIDATION, print_json


def add_parser(commands) -> None:
    p = commands.add_parser("verify", help="check a v1 model's checksum and signature (exit 5 if they fail)")
    p.add_argument("file", help="a v1 .apr file")
    p.add_argument("--trusted-key", metavar="PATH", action="append",
                   help="Ed25519 public key file the signer must be (repeatable); without it any valid "
                        "signature passes as self-signed")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")
    p.set_defaults(run=run)


def run(args) -> int:
    trusted = None
    if args.trusted_key:
        from ..crypto import load_key

        trusted = [load_key(path, kind="ed25519-public")[1] for path in args.trusted_key]
    try:
        result = verify_file(args.file, trusted_keys=trusted)
    except (ChecksumError, SignatureError) as exc:
        if args.json:
            print_json({"file": args.file, "valid": False, "code": exc.code, "detail": exc.message})
        print(f"apr verify: [{exc.code}] {args.file}: {exc.message}", file=sys.stderr)
        return EXIT_VALIDATION
    result.update({"file": args.file, "valid": True})
    if args.json:
        print_json(result)
    else:
        who = "a trusted key" if result["trusted"] else "its embedded key (self-signed: give --trusted-key)"
        print(f"{args.file}: checksum valid; signature valid, by {who}: {result['signer']}")
    return EXIT_OK
