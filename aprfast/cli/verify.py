"""``apr verify FILE``: check a model's CRC32 and signature without decrypting it
(exit 0 valid, 5 unsigned, tampered or signed by a key not given with
``--trusted-key``); over :func:`aprfast.tools.protection.verify_file`.  A v2 file has every
chunk's digest checked over its stored bytes, so an encrypted file needs no key unless
its names are encrypted (``--password-env`` / ``--key-file`` then; with a key each
chunk's AES-GCM tag is checked too).

``apr verify MODEL --bundle BUNDLE --public-key KEY`` (or ``--format sigstore``, or a
directory MODEL): check an OpenSSF model-signing Sigstore bundle, from ``apr sign
--format sigstore`` or ``model_signing sign key``, against the model directory or file
with the signer's ECDSA public key, offline (exit 5 naming each changed, added or
removed file); over :func:`aprfast.tools.model_signing.verify_model`."""

from __future__ import annotations

import os
import sys

from ..errors import ChecksumError, DecryptError, SignatureError
from ..tools.protection import verify_file
from ._common import EXIT_OK, EXIT_VALIDATION, UsageError, cli_text, keys_from, print_json


def add_parser(commands) -> None:
    p = commands.add_parser("verify", help="check a model's checksums and signature, or a Sigstore bundle "
                                           "(exit 5 if they fail)")
    p.add_argument("file", metavar="MODEL", help="a v1 or v2 .apr file; with a bundle also a model directory or "
                                                "any file")
    p.add_argument("--format", choices=("apr", "sigstore"), default=None,
                   help="apr: the .apr file's own signature (default for a file without --bundle); sigstore: an "
                        "OpenSSF model-signing bundle (default with --bundle/--public-key or for a directory)")
    p.add_argument("--bundle", metavar="PATH", help="the Sigstore bundle to check (default MODEL.sig)")
    p.add_argument("--public-key", metavar="PATH",
                   help="the signer's ECDSA public key PEM (the .pub from apr keygen --type ecdsa-p256)")
    p.add_argument("--ignore-unsigned-files", action="store_true",
                   help="sigstore: files the bundle does not list are not an error")
    p.add_argument("--trusted-key", metavar="PATH", action="append",
                   help="Ed25519 public key file the signer must be (repeatable); without it any valid "
                        "signature passes as self-signed")
    p.add_argument("--password-env", metavar="VAR",
                   help="v2 only: password from environment variable VAR, to check each chunk's AES-GCM tag "
                        "(needed when the names are encrypted)")
    p.add_argument("--key-file", metavar="PATH", help="v2 only: X25519 private key file, as --password-env")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")
    p.set_defaults(run=run)


def _is_sigstore(args) -> bool:
    if args.format is not None:
        return args.format == "sigstore"
    return bool(args.bundle or args.public_key or args.ignore_unsigned_files) or os.path.isdir(args.file)


def run(args) -> int:
    if _is_sigstore(args):
        return _run_sigstore(args)
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
            print_json({"file": args.file, "valid": False, "code": exc.code, "detail": cli_text(exc.message)})
        print(cli_text(f"apr verify: [{exc.code}] {args.file}: {exc.message}"), file=sys.stderr)
        return EXIT_VALIDATION
    result.update({"file": args.file, "valid": True})
    if result.get("signer"):
        from ..crypto.core import key_fingerprint

        result["fingerprint"] = key_fingerprint(bytes.fromhex(result["signer"]))
    if args.json:
        print_json(result)
    else:
        who = "a trusted key" if result["trusted"] else "its embedded key (self-signed: give --trusted-key)"
        print(f"{args.file}: checksum valid; signature valid, by {who}: {result['signer']} "
              f"(fingerprint {result.get('fingerprint')})")
        if not result["trusted"]:
            print(f"{args.file}: signed by {result.get('fingerprint')}; compare it with the signer's "
                  "(apr keygen prints it), or pass --trusted-key THEIR.pub")
        if result["container"] == "v2":
            tags = " and AES-GCM tags" if result["tags_checked"] else ""
            print(f"{args.file}: {result['chunks']} chunk(s): {result['digest']} digests{tags} valid")
    return EXIT_OK


def _run_sigstore(args) -> int:
    from ..tools.model_signing import ModelTamperedError, default_bundle, verify_model

    if args.password_env or args.key_file:
        raise UsageError("--password-env and --key-file are for the .apr signature, not a Sigstore bundle")
    public_key = args.public_key
    if public_key is None and args.trusted_key and len(args.trusted_key) == 1:
        public_key = args.trusted_key[0]
    if public_key is None:
        raise UsageError("--public-key PATH is required to check a Sigstore bundle: the signer's ECDSA public key")
    try:
        result = verify_model(args.file, args.bundle, public_key, ignore_unsigned_files=args.ignore_unsigned_files)
    except SignatureError as exc:
        if args.json:
            report = {"file": args.file, "bundle": str(args.bundle or default_bundle(args.file)), "valid": False,
                      "code": exc.code, "detail": exc.message, "path": exc.path}
            if isinstance(exc, ModelTamperedError):
                report.update(changed=list(exc.changed), added=list(exc.added), removed=list(exc.removed))
            print_json(report)
        print(f"apr verify: {exc}", file=sys.stderr)
        return EXIT_VALIDATION
    if args.json:
        print_json(result)
    else:
        print(f"{result['model']}: Sigstore bundle {result['bundle']} valid: {result['files']} file(s) match, "
              f"signed by key {result['key_hint'][:16]}...")
    return EXIT_OK
