"""``apr inspect FILE``: header, metadata and tensor table, reading nothing else;
``--verify`` also checks the file's CRC (and signature) by reading it whole;
``apr inspect -`` reads a v2 file from standard input (its CRC is always checked)."""

from __future__ import annotations

import json
import sys

from ..api import inspect as inspect_file
from ..errors import ChecksumError, SignatureError
from ._common import EXIT_OK, EXIT_VALIDATION, add_key_options, open_model, print_json


def add_parser(commands) -> None:
    p = commands.add_parser("inspect", help="show a file's header, metadata and tensors (reads nothing else)")
    p.add_argument("file", help="a .apr file, or - to read a v2 file from standard input")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")
    p.add_argument("--verify", action="store_true",
                   help="also check the CRC32 (and signature) over the whole file; exit 5 if they fail")
    add_key_options(p)
    p.set_defaults(run=run)


def run(args) -> int:
    if args.file == "-":
        report, name = inspect_stdin(), "<stdin>"
        if args.verify:
            report["verified"] = {"ok": True, "detail": "CRC32 checked while reading standard input"}
    else:
        report, name = inspect_file(args.file), args.file
        if args.verify:
            report["verified"] = verify(args.file, args)
    if args.json:
        print_json(report)
    else:
        print(format_report(name, report))
    ok = report.get("verified", {"ok": True})["ok"]
    if not ok:
        v = report["verified"]
        print(f"apr: [{v['code']}] {name}: {v['detail']}", file=sys.stderr)
    return EXIT_OK if ok else EXIT_VALIDATION


def verify(path, args) -> dict:
    """{"ok", "code", "detail"}: the whole-file checks of ``f.verify()``."""
    try:
        with open_model(path, args) as f:
            f.verify()
    except (ChecksumError, SignatureError) as exc:
        return {"ok": False, "code": exc.code, "detail": exc.message}
    return {"ok": True, "code": None, "detail": "checksum valid"}


def inspect_stdin() -> dict:
    """``inspect``'s report for a v2 file on standard input, read front to back by
    ``aprfast.stream``: the prefix gives the report, and the rest is read (not kept) so
    the footer and its CRC are checked before anything is printed."""
    from ..stream import stream

    with stream(sys.stdin.buffer, unknown_dtypes="raw") as s:
        s.finish()
        # Every stored key, as `inspect FILE` reports (older streams have only .metadata).
        metadata = getattr(s, "stored_metadata", s.metadata)
        return {"layout": s.layout, "header": s.header, "metadata": metadata, "tensors": s.describe()}


def format_report(path, report) -> str:
    if report["layout"] == "v1":
        text = _format_v1_report(path, report)
    else:
        text = _format_v2_report(path, report)
    if "verified" in report:
        v = report["verified"]
        text += f"\nchecksum: {'valid' if v['ok'] else 'INVALID'}" + ("" if v["ok"] else f" [{v['code']}] {v['detail']}")
    return text


def _format_v2_report(path, report) -> str:
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
