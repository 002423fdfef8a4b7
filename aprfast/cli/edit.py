"""``apr edit FILE [--set KEY=VALUE ...] [--unset KEY ...] [--rename OLD=NEW ...]
[--drop NAME ...]``: change a v2 file's metadata, rename tensors or drop them from the
index, in place when the file was saved with room (``save_file(..., reserve=)``), else by
an atomic rewrite that copies the tensor data in the kernel; over :func:`aprfast.edit`.

A VALUE that is valid JSON is taken as JSON (``4096``, ``true``, ``[1, 2]``, ``{"a": 1}``,
``"quoted"``), anything else as a string (``--set name=llama``)."""

from __future__ import annotations

import json

from ..tools.edit import edit
from ._common import EXIT_OK, UsageError, add_signing_key_option, non_negative_int, print_json, signing_key_from


def add_parser(commands) -> None:
    p = commands.add_parser("edit", help="change metadata, rename or drop tensors without rewriting the tensor data "
                                         "(in place when the file has room)")
    p.add_argument("file", metavar="FILE", help="a v2 .apr file (APR\\0 or APR2)")
    p.add_argument("--set", metavar="KEY=VALUE", action="append", default=[], dest="set_",
                   help="set a metadata key; VALUE is JSON when it parses as JSON, else a string (repeatable)")
    p.add_argument("--unset", metavar="KEY", action="append", default=[], help="remove a metadata key (repeatable)")
    p.add_argument("--rename", metavar="OLD=NEW", action="append", default=[],
                   help="rename tensor OLD to NEW (repeatable; applied together, so swaps work)")
    p.add_argument("--drop", metavar="NAME", action="append", default=[],
                   help="remove tensor NAME from the index (repeatable; its bytes stay until the file is saved "
                        "again)")
    add_signing_key_option(p, "signed APR2 files: the Ed25519 private key to sign the edited file with (required "
                              "for one)")
    p.add_argument("--reserve", metavar="BYTES", type=non_negative_int, default=None,
                   help="if the file must be rewritten, leave this much room for later in-place edits (default: "
                        "as the file had)")
    p.add_argument("--no-sync", action="store_true",
                   help="skip the fsyncs (a process crash still leaves the old or the new file; a power loss may not)")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")
    p.set_defaults(run=run)


def _pairs(items, option: str) -> list:
    pairs = []
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"{option} takes KEY=VALUE, not {item!r}")
        pairs.append((key, value))
    return pairs


def _value(key: str, text: str):
    try:
        value = json.loads(text)
    except ValueError:
        return text
    if value is None:
        raise UsageError(f"--set {key}=null: to remove a key use --unset {key}")
    return value


def run(args) -> int:
    metadata = {key: _value(key, text) for key, text in _pairs(args.set_, "--set")}
    for key in args.unset:
        if key in metadata:
            raise UsageError(f"metadata key {key!r} is both set and unset")
        metadata[key] = None
    rename = {}
    for old, new in _pairs(args.rename, "--rename"):
        if old in rename:
            raise UsageError(f"tensor {old!r} is renamed twice")
        rename[old] = new
    if not (metadata or rename or args.drop or args.signing_key):
        raise UsageError("nothing to do: give --set, --unset, --rename or --drop")
    result = edit(args.file, metadata=metadata, rename=rename, drop=args.drop, signing_key=signing_key_from(args),
                  durable=not args.no_sync, reserve=args.reserve)
    if args.json:
        print_json(result)
    else:
        how = "in place" if result["in_place"] else "rewritten"
        print(f"{result['file']}: {how}, {result['bytes_written']} bytes written; {result['tensors']} tensors, "
              f"{result['renamed']} renamed, {result['dropped']} dropped, {len(result['metadata_keys'])} metadata "
              f"key(s) changed; room for in-place edits: {result['room']} bytes")
    return EXIT_OK
