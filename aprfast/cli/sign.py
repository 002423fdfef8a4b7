"""``apr sign FILE --signing-key KEY``: sign a model with an Ed25519 key file, in
place (atomically) or to ``-o OUT``; over :func:`aprfast.tools.protection.sign_file`.  A v1
payload is signed as stored, so an encrypted v1 file is signed without its key; a v2
file is saved again signed, and an encrypted one needs its key (``--password-env`` /
``--key-file``).

``apr sign --format sigstore MODEL --key KEY [--output BUNDLE]``: an OpenSSF
model-signing Sigstore bundle over a model directory (a sharded model, a Hugging Face
folder) or one file, with an ECDSA key (``apr keygen --type ecdsa-p256``), offline;
over :func:`aprfast.tools.model_signing.sign_model`.  The model is not changed; the
bundle (default MODEL.sig) is what ``model_signing verify key`` and ``apr verify
--bundle`` check."""

from __future__ import annotations

import os

from ..tools.protection import sign_file
from ._common import (
    EXIT_OK,
    UsageError,
    add_signing_key_option,
    add_verify_option,
    keys_from,
    layout_notes,
    print_json,
    refuse_existing,
    signing_key_from,
    verify_from,
)


def add_parser(commands) -> None:
    p = commands.add_parser("sign", help="sign a model: an .apr file with an Ed25519 key, or any model "
                                         "directory or file as a Sigstore bundle with an ECDSA key")
    p.add_argument("file", metavar="MODEL", help="a v1 or v2 .apr file; with --format sigstore also a model "
                                                "directory (a sharded model's) or any file")
    p.add_argument("--format", choices=("apr", "sigstore"), default=None,
                   help="apr (default for a file): the .apr file's own Ed25519 signature, written into the file; "
                        "sigstore (default for a directory): an OpenSSF model-signing bundle beside the model "
                        "(ECDSA key)")
    add_signing_key_option(p, "Ed25519 private key file (from apr keygen; raw 32 bytes, PEM or OpenSSH)")
    p.add_argument("--key", metavar="PATH", dest="sigstore_key",
                   help="--format sigstore: the ECDSA P-256/P-384/P-521 private key PEM file (apr keygen PATH "
                        "--type ecdsa-p256)")
    p.add_argument("-o", "--output", help="write the signed file here instead of replacing FILE; with --format "
                                          "sigstore the bundle to write (default MODEL.sig)")
    p.add_argument("--resign", action="store_true", help="replace an existing signature")
    p.add_argument("--password-env", metavar="VAR",
                   help="encrypted v2 files: the password, from environment variable VAR (the file is re-sealed)")
    p.add_argument("--key-file", metavar="PATH", help="encrypted v2 files: the X25519 private key file")
    p.add_argument("--key-password-env", metavar="VAR",
                   help="--format sigstore: the password of an encrypted ECDSA key, from environment variable VAR")
    p.add_argument("--ignore-path", metavar="PATH", action="append", default=[],
                   help="--format sigstore: leave PATH (relative to the model directory) out of the bundle "
                        "(repeatable)")
    p.add_argument("-f", "--force", action="store_true", help="replace an existing OUTPUT")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")
    add_verify_option(p)
    p.set_defaults(run=run)


def run(args) -> int:
    if args.format == "sigstore" or (args.format is None and os.path.isdir(args.file)):
        return _run_sigstore(args)
    if args.sigstore_key or args.key_password_env or args.ignore_path:
        # --key names the ECDSA key file of a bundle; the .apr signature's key is --signing-key
        raise UsageError("--key, --key-password-env and --ignore-path go with --format sigstore (the .apr "
                         "signature's key file is --signing-key)")
    key = signing_key_from(args)
    if key is None:
        raise UsageError("--signing-key PATH is required")
    refuse_existing(args.force, args.output)  # no OUTPUT: FILE itself is re-signed in place
    keys = keys_from(args)
    with layout_notes("sign"):  # an aprender-layout file is written back as APR2: say so
        result = sign_file(args.file, key, output=args.output, replace_signature=args.resign, force=args.force,
                           password=keys.get("password"), private_key=keys.get("private_key"),
                           verify=verify_from(args))
    from ..crypto.core import key_fingerprint

    result["fingerprint"] = key_fingerprint(bytes.fromhex(result["signer"]))
    if args.json:
        print_json(result)
    else:
        print(f"{result['file']}: signed by {result['fingerprint']} (Ed25519 public key {result['signer']})")
    return EXIT_OK


def _run_sigstore(args) -> int:
    from ..tools.model_signing import sign_model

    key = args.sigstore_key or args.signing_key
    if not key:
        raise UsageError("--key PATH is required: an ECDSA private key PEM (apr keygen PATH --type ecdsa-p256)")
    if args.resign or args.password_env or args.key_file:
        raise UsageError("--resign, --password-env and --key-file are for the .apr signature, not --format sigstore "
                         "(the bundle signs the stored bytes; an existing bundle is replaced)")
    password = None
    if args.key_password_env:
        password = os.environ.get(args.key_password_env)
        if password is None:
            raise UsageError(f"--key-password-env: environment variable {args.key_password_env} is not set")
    result = sign_model(args.file, key, format="sigstore", output=args.output, password=password,
                        ignore_paths=args.ignore_path)
    if args.json:
        print_json(result)
    else:
        print(f"{result['model']}: {len(result['files'])} file(s) signed by key {result['key_hint'][:16]}...; "
              f"Sigstore bundle {result['bundle']}")
    return EXIT_OK
