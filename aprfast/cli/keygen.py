"""``apr keygen PATH --type ed25519|x25519``: a new key pair, the private key in PATH
(mode 0600) and the public key in PATH.pub; over
:func:`aprfast.tools.protection.generate_keypair`.  Ed25519 keys sign (apr sign/verify),
X25519 keys receive encrypted models (apr encrypt --recipient / decrypt --key-file)."""

from __future__ import annotations

from ..tools.protection import KEYPAIR_KINDS, generate_keypair
from ._common import EXIT_OK, print_json, refuse_existing


def add_parser(commands) -> None:
    p = commands.add_parser("keygen", help="write a new Ed25519 (signing) or X25519 (encryption) key pair")
    p.add_argument("path", help="private key file to write (the public key goes to PATH.pub)")
    p.add_argument("--type", dest="kind", choices=tuple(KEYPAIR_KINDS), default="ed25519",
                   help="ed25519 for signing (default), x25519 for encryption")
    p.add_argument("--format", choices=("raw", "pem", "openssh"), default="raw",
                   help="key file format (default raw: 32 bytes; pem/openssh need the cryptography package)")
    p.add_argument("-f", "--force", action="store_true", help="replace existing key files")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")
    p.set_defaults(run=run)


def run(args) -> int:
    refuse_existing(args.force, args.path, f"{args.path}.pub")
    result = generate_keypair(args.path, args.kind, format=args.format, force=args.force)
    if args.json:
        print_json(result)
    else:
        print(f"{args.kind} key pair: private {result['private']} (mode 0600), public {result['public']}\n"
              f"public key: {result['public_key']}")
    return EXIT_OK
