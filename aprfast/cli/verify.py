"""``apr verify FILE``: check a model's CRC32 and signature without decrypting it
(exit 0 valid, 5 unsigned, tampered or signed by a key not given with
``--trusted-key``); over :func:`aprfast.tools.protection.verify_file`.  A v2 file has every
chunk's digest checked over its stored bytes, so an encrypted file needs no key unless
its names are encrypted (``--password-env`` / ``--key-file`` then; with a key each
chunk's AES-GCM tag is checked too)."""

from __future__ import annotations

import sys

from ..errors import ChecksumError, DecryptError, SignatureError
from ..tools.protection import verify_file
from ._common import EXIT_OK, EXIT_VALIDATION, keys_from, print_json


def add_parser(commands) -> None:
    p = commands.add_parser("verify", help="check a model's checksums and signature (exit 5 if they fail)")
    p.add_argument("file", help="a v1 or v2 .apr file")
    p.add_argument("--trusted-key", metavar="PATH", action="append",
                   help="Ed25519 public key file the signer must be (repeatable); without it any valid "
                        "signature passes as self-signed")
    p.add_argument("--password-env", metavar="VAR",
                   help="v2 only: password from environment variable VAR, to check each chunk's AES-GCM tag "
                        "(needed when the names are encrypted)")
    p.add_argument("--key-file", metavar="PATH", help="v2 only: X25519 private key file, as --password-env")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")
    p.set_defaults(run=run)


def run(args) -> int:
    trusted = None
    if args.trusted_key:
        from ..crypto.core import load_key

        trusted = [load_key(path, kind="ed25519-public")[1] for path in args.trusted_key]
    keys = keys_from(args)
    try:
        result = verify_file(args.file, trusted_keys=trusted, password=keys.get("password"),
                             private_key=keys.get("private_key"))
    except (ChecksumError, SignatureError, DecryptError) as exc:
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
        if result["container"] == "v2":
            tags = " and AES-GCM tags" if result["tags_checked"] else ""
            print(f"{args.file}: {result['chunks']} chunk(s): {result['digest']} digests{tags} valid")
    return EXIT_OK
