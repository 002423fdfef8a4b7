"""``apr keygen PATH --type ed25519|x25519|ecdsa-p256|ecdsa-p384|ecdsa-p521``: a new key
pair, the private key in PATH (mode 0600) and the public key in PATH.pub; over
:func:`aprfast.tools.protection.generate_keypair`.  Ed25519 keys sign .apr files (apr
sign/verify), X25519 keys receive encrypted models (apr encrypt --recipient / decrypt
--key-file), ECDSA keys (PEM) sign OpenSSF model-signing bundles (apr sign --format
sigstore, and ``model_signing sign key``).

Key files say what they are (issue 28 item 2): PEM by default (PKCS#8 ``BEGIN PRIVATE
KEY`` / ``BEGIN PUBLIC KEY``, read with no extra package), so a public key cannot pass for
a private one; ``--format raw`` writes the bare 32 bytes, ``--format openssh`` OpenSSH's
files (Ed25519).  The public key's fingerprint (``SHA256:...``, as ``ssh-keygen -l``
shows it) is printed, as ``apr sign`` and ``apr verify`` print the signer's."""

from __future__ import annotations

import os

from ..tools.protection import KEYPAIR_KINDS, generate_keypair
from ._common import EXIT_OK, UsageError, print_json, refuse_existing


def add_parser(commands) -> None:
    p = commands.add_parser("keygen", help="write a new Ed25519 or ECDSA (signing) or X25519 (encryption) key pair")
    p.add_argument("path", help="private key file to write (the public key goes to PATH.pub)")
    p.add_argument("--type", dest="kind", choices=tuple(KEYPAIR_KINDS), default="ed25519",
                   help="ed25519 for .apr signatures (default), x25519 for encryption, ecdsa-p256/p384/p521 "
                        "for Sigstore model-signing bundles (apr sign --format sigstore)")
    p.add_argument("--format", choices=("raw", "pem", "openssh"), default=None,
                   help="key file format (default pem: says whether it is the private or the public key; raw: "
                        "32 bytes that do not; openssh needs the cryptography package)")
    p.add_argument("--password-env", metavar="VAR",
                   help="ECDSA only: encrypt the private key with the password in environment variable VAR")
    p.add_argument("-f", "--force", action="store_true", help="replace existing key files")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")
    p.set_defaults(run=run)


def run(args) -> int:
    refuse_existing(args.force, args.path, f"{args.path}.pub")
    password = None
    if args.password_env:
        if not args.kind.startswith("ecdsa-"):
            raise UsageError("--password-env encrypts ECDSA private keys only")
        password = os.environ.get(args.password_env)
        if password is None:
            raise UsageError(f"--password-env: environment variable {args.password_env} is not set")
    if args.kind.startswith("ecdsa-") and args.format not in (None, "pem"):
        raise UsageError(f"--type {args.kind} keys are PEM files (model-signing tools read PEM), not {args.format}")
    result = generate_keypair(args.path, args.kind, format=args.format, force=args.force, password=password)
    if args.json:
        print_json(result)
    else:
        print(f"{args.kind} key pair ({result['format']}): private {result['private']} (mode 0600), "
              f"public {result['public']}")
        if args.kind.startswith("ecdsa-"):
            print(f"key hint (SHA-256 of the public PEM): {result['public_key']}")
        else:
            print(f"fingerprint: {result['fingerprint']}\npublic key: {result['public_key']}")
    return EXIT_OK
