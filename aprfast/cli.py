"""The ``apr`` command.  Today: ``apr inspect FILE`` (header, metadata, tensor table) for
v2 tensor containers and v1 model containers; ``apr inspect -`` reads a v2 file from
standard input."""

from __future__ import annotations

import argparse
import json
import sys

from . import __version__
from .api import inspect
from .errors import AprError

#: Exit codes (seed 001): 0 ok, 1 a file problem (message carries its E-code), 2 usage.
EXIT_OK, EXIT_FILE_ERROR, EXIT_USAGE = 0, 1, 2


def main(argv=None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        return args.run(args)
    except AprError as exc:
        print(f"apr: {exc}", file=sys.stderr)
        return EXIT_FILE_ERROR
    except BrokenPipeError:  # `apr inspect big.apr | head` is fine
        return EXIT_OK


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="apr", description="Inspect and work with .apr model files.")
    parser.add_argument("--version", action="version", version=f"aprfast {__version__}")
    commands = parser.add_subparsers(dest="command")
    p = commands.add_parser("inspect", help="show a file's header, metadata and tensors (reads nothing else)")
    p.add_argument("file", help="a .apr file, or - to read a v2 file from standard input")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")
    p.set_defaults(run=_inspect)
    return parser


def _inspect(args) -> int:
    if args.file == "-":
        report, name = _inspect_stdin(), "<stdin>"
    else:
        report, name = inspect(args.file), args.file
    if args.json:
        json.dump(report, sys.stdout, indent=2, sort_keys=False, default=_json_default)
        sys.stdout.write("\n")
        return EXIT_OK
    print(_format_report(name, report))
    return EXIT_OK


def _inspect_stdin() -> dict:
    """``inspect``'s report for a v2 file on standard input, read front to back by
    ``aprfast.stream``: the prefix gives the report, and the rest is read (not kept) so
    the footer and its CRC are checked before anything is printed."""
    from .stream import stream

    with stream(sys.stdin.buffer, unknown_dtypes="raw") as s:
        s.finish()
        return {"layout": s.layout, "header": s.header, "metadata": s.metadata, "tensors": s.describe()}


def _json_default(value):
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).hex()
    return str(value)


def _format_report(path, report) -> str:
    if report["layout"] == "v1":
        return _format_v1_report(path, report)
    header, tensors = report["header"], report["tensors"]
    lines = [
        f"{path}: {report['layout']} layout ({header['magic']}, version {header['version']}), "
        f"{header['file_size']} bytes",
        f"flags: {header['flags']:#06x} {' '.join(header['flag_names']) or '-'}",
        f"metadata ({header['metadata_size']} bytes):",
    ]
    for key, value in report["metadata"].items():
        if value is not None:
            lines.append(f"  {key}: {json.dumps(value, ensure_ascii=False)}")
    total = sum(t["nbytes"] for t in tensors.values())
    lines.append(f"tensors ({len(tensors)}, {total} bytes):")
    width = max((len(n) for n in tensors), default=4)
    for name, t in tensors.items():
        shape = "x".join(str(d) for d in t["shape"]) or "scalar"
        lines.append(f"  {name:<{width}}  {t['dtype']:<8} {shape:<20} {t['nbytes']:>12} B  @ {t['offset']}")
    return "\n".join(lines)


def _format_v1_report(path, report) -> str:
    h = report["header"]
    lines = [
        f"{path}: v1 model container (APRN, version {h['version'][0]}.{h['version'][1]})",
        f"model type: {h['model_type_name']} ({h['model_type']:#06x})",
        f"flags: {h['flags_raw']:#04x} {' '.join(h['flag_names']) or '-'}",
        f"payload: {h['payload_size']} bytes stored, {h['uncompressed_size']} uncompressed, "
        f"compression {h['compression_name']}",
        f"quality score: {h['quality_score'] or 'not validated'}",
        f"metadata ({h['metadata_size']} bytes):",
    ]
    for key, value in report["metadata"].items():
        lines.append(f"  {key}: {json.dumps(value, ensure_ascii=False, default=str)}")
    if "license_block_size" in report:
        lines.append(f"license block: {report['license_block_size']} bytes")
    return "\n".join(lines)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
