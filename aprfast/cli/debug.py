"""``apr debug FILE``: a file's bytes for someone chasing a problem (seed 001 §4.3).

Without options: the layout, header fields and the result of each check (header,
whole-file checksum, opening every tensor's index entry).  ``--hex`` dumps bytes
(``--offset``, ``--limit`` bytes, default 256); ``--strings`` lists printable ASCII
runs (``--min-length``, at most ``--limit`` of them, default 50), read in bounded
chunks, as ``strings(1)`` would; ``--drama`` tells the same checks as a play in three
acts, in colour only when stdout is a terminal (``APR_COLOR=always|never`` overrides),
plain text otherwise (QA #53).  Exit 5 when a check fails, 4 when the header cannot be
read at all.  :func:`hex_dump`, :func:`find_strings` and :func:`debug_checks` are the
functions behind it.
"""

from __future__ import annotations

import os
import re

from ..errors import AprError, DecryptError
from ._common import (
    EXIT_FORMAT,
    EXIT_OK,
    EXIT_VALIDATION,
    UsageError,
    add_key_options,
    cli_text,
    non_negative_int,
    open_model,
    print_json,
)

_READ_CHUNK = 1 << 20
_MAX_RUN = 1 << 20
#: Bytes `strings` treats as text (printable ASCII without the vertical whitespace).
_TEXT = bytes(range(0x20, 0x7f)) + b"\t"
DEFAULT_HEX_LIMIT = 256
DEFAULT_STRINGS_LIMIT = 50


def add_parser(commands) -> None:
    p = commands.add_parser("debug", help="bytes and checks of a file: --hex, --strings, --drama")
    p.add_argument("file", help="a .apr file")
    p.add_argument("--hex", action="store_true", help="hex dump of --limit bytes from --offset")
    p.add_argument("--strings", action="store_true", help="printable ASCII runs in the file")
    p.add_argument("--drama", action="store_true", help="the checks as a play in three acts")
    p.add_argument("--limit", type=non_negative_int, help="bytes for --hex (256), strings for --strings (50)")
    p.add_argument("--offset", type=non_negative_int, default=0, help="where --hex starts (default 0)")
    p.add_argument("--min-length", type=non_negative_int, default=4, help="shortest string --strings shows (4)")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")
    add_key_options(p)
    p.set_defaults(run=run)


def run(args) -> int:
    if not os.path.lexists(args.file):
        raise FileNotFoundError(f"{args.file}: no such file")
    if args.hex:
        rows = hex_dump(args.file, args.offset, DEFAULT_HEX_LIMIT if args.limit is None else args.limit)
        _emit(args, {"file": args.file, "offset": args.offset, "hex": rows}, "\n".join(rows))
        return EXIT_OK
    if args.strings:
        if args.min_length < 1:
            raise UsageError("--min-length must be at least 1")
        found = find_strings(args.file, args.min_length, DEFAULT_STRINGS_LIMIT if args.limit is None else args.limit)
        _emit(args, {"file": args.file, "strings": [{"offset": o, "text": t} for o, t in found]},
              "\n".join(f"{o:>10}  {t}" for o, t in found))
        return EXIT_OK
    checks = debug_checks(args.file, args)
    if args.drama and not args.json:
        print(drama(args.file, checks, color=getattr(args, "color", False)))
    else:
        _emit(args, {"file": args.file, **checks}, format_checks(args.file, checks))
    if checks["header"]["status"] == "FAIL":
        return EXIT_FORMAT
    return EXIT_VALIDATION if any(c["status"] == "FAIL" for c in checks["checks"]) else EXIT_OK


def _emit(args, report, text) -> None:
    if args.json:
        print_json(report)
    else:
        print(text)


# --- bytes ---------------------------------------------------------------------------
def hex_dump(path, offset: int = 0, limit: int = DEFAULT_HEX_LIMIT) -> list:
    """``limit`` bytes from ``offset`` as rows of 16: offset, hex, ASCII (only those
    bytes are read)."""
    with open(path, "rb") as fh:
        fh.seek(offset)
        data = fh.read(limit)
    rows = []
    for start in range(0, len(data), 16):
        chunk = data[start:start + 16]
        hexed = " ".join(f"{b:02x}" for b in chunk)
        text = "".join(chr(b) if 32 <= b < 127 else "." for b in chunk)
        rows.append(f"{offset + start:08x}  {hexed:<47}  |{text}|")
    return rows


def find_strings(path, min_length: int = 4, limit: int = DEFAULT_STRINGS_LIMIT) -> list:
    """(offset, text) of the first ``limit`` runs of at least ``min_length`` printable
    ASCII bytes, reading the file in bounded chunks (a run may span two)."""
    pattern = re.compile(rb"[%s]{%d,}" % (re.escape(_TEXT), min_length))
    found, carry, base = [], b"", 0
    with open(path, "rb") as fh:
        while len(found) < limit:
            chunk = fh.read(_READ_CHUNK)
            buf = carry + chunk
            # a run touching the end may go on in the next chunk: hold it back (up to
            # _MAX_RUN bytes: a longer run is reported in pieces, memory stays bounded)
            end = len(buf) if not chunk else len(buf.rstrip(_TEXT))
            if len(buf) - end > _MAX_RUN:
                end = len(buf)
            for m in pattern.finditer(buf, 0, end):
                found.append((base + m.start(), m.group().decode("ascii")))
                if len(found) >= limit:
                    break
            if not chunk:
                break
            carry, base = buf[end:], base + end
    return found


# --- checks --------------------------------------------------------------------------
def debug_checks(path, args=None) -> dict:
    """``{"header": {...}, "summary": {...}, "checks": [{"name", "status", "detail"}]}``:
    the header as read, then the checksum and every tensor, each PASS/FAIL/SKIP."""
    from ..api import inspect as inspect_file

    try:
        report = inspect_file(path)
    except AprError as exc:
        return {"header": {"status": "FAIL", "code": exc.code, "detail": exc.message, "magic": _magic(path)},
                "summary": {}, "checks": []}
    header = report["header"]
    summary = {"layout": report["layout"], "magic": header["magic"], "version": _version(header["version"]),
               "flags": header.get("flag_names", []), "metadata_keys": len(report.get("metadata") or {}),
               "license": bool((report.get("metadata") or {}).get("license"))}
    checks = [_checksum_check(path, args)]
    tensors = _tensor_check(path, args)
    checks.append(tensors["check"])
    summary.update({"tensors": tensors["count"], "parameters": tensors["parameters"]})
    return {"header": {"status": "PASS", "magic": header["magic"], "detail": "header read"}, "summary": summary,
            "checks": checks}


def _magic(path) -> str:
    with open(path, "rb") as fh:
        return repr(fh.read(4))


def _version(version) -> str:
    return ".".join(str(v) for v in version) if isinstance(version, (list, tuple)) else str(version)


def _keys_args(args):
    return args if args is not None else _NoKeys()


class _NoKeys:
    password_env = key_file = trusted_key = None


def _checksum_check(path, args) -> dict:
    from ..tools.protection import container_of, verify_file

    try:
        if container_of(path) == "v1":  # CRC and signature need no decryption key
            signed = verify_file(path, require_signature=False)["signed"]
            return {"name": "checksum", "status": "PASS",
                    "detail": "CRC32 matches" + ("; signature valid" if signed else "")}
        with open_model(path, _keys_args(args)) as f:
            f.verify()
    except AprError as exc:
        return {"name": "checksum", "status": "FAIL", "code": exc.code, "detail": cli_text(exc.message)}
    return {"name": "checksum", "status": "PASS", "detail": "CRC32 matches"}


def _tensor_check(path, args) -> dict:
    from ..dtypes import element_count

    try:
        with open_model(path, _keys_args(args)) as f:
            shapes = [f.info(n).shape for n in f.keys()]
    except DecryptError as exc:
        return {"count": None, "parameters": None,
                "check": {"name": "tensors", "status": "SKIP", "detail": f"encrypted, no key given: {exc.message}"}}
    except AprError as exc:
        return {"count": None, "parameters": None,
                "check": {"name": "tensors", "status": "FAIL", "code": exc.code, "detail": exc.message}}
    parameters = sum(element_count(s) for s in shapes)
    return {"count": len(shapes), "parameters": parameters,
            "check": {"name": "tensors", "status": "PASS", "detail": f"{len(shapes)} tensors indexed"}}


def format_checks(path, checks) -> str:
    h = checks["header"]
    if h["status"] == "FAIL":
        return f"{path}: header unreadable (magic {h['magic']}): [{h['code']}] {h['detail']}"
    s = checks["summary"]
    lines = [f"{path}: {s['layout']} layout, magic {s['magic']}, version {s['version']}",
             f"flags: {' '.join(s['flags']) or '-'}",
             f"metadata keys: {s['metadata_keys']}",
             f"tensors: {_or_unknown(s['tensors'])}, parameters: {_or_unknown(s['parameters'], ',')}"]
    for c in checks["checks"]:
        code = f" [{c['code']}]" if c.get("code") else ""
        lines.append(f"[{c['status']}] {c['name']}{code}: {c['detail']}")
    return "\n".join(lines)


def _or_unknown(value, spec="") -> str:
    return "unknown" if value is None else format(value, spec)


# --- drama ---------------------------------------------------------------------------
def drama(path, checks, *, color: bool = False) -> str:
    """The checks of :func:`debug_checks` as seed 001 §4.3's play."""
    def act(title):
        return f"\x1b[1m{title}\x1b[0m" if color else title

    lines = [act(f"====[ DRAMA: {os.path.basename(path)} ]===="), "", act("ACT I: THE HEADER")]
    h = checks["header"]
    if h["status"] == "FAIL":
        lines += [f"  Scene 1: Magic bytes... {h['magic']} (gasps from the audience!)",
                  f"  The stage collapses: [{h['code']}] {h['detail']}", "", act("ACT III: THE VERDICT"),
                  "  TRAGEDY: this is no model file we can perform."]
        return "\n".join(lines)
    s = checks["summary"]
    lines += [f"  Scene 1: Magic bytes... {s['magic']} (applause!)",
              f"  Scene 2: Version check... {s['version']} (standing ovation!)",
              f"  Scene 3: Flags... {' | '.join(s['flags']) or 'none'}", "", act("ACT II: THE METADATA")]
    parameters = s["parameters"]
    cast = "hidden behind the curtain" if parameters is None else \
        (f"{parameters:,} (a cast of millions!)" if parameters >= 1_000_000 else f"{parameters:,} (an intimate cast)")
    lines += [f"  Scene 1: Parameters... {cast}",
              f"  Scene 2: Tensors... {_or_unknown(s['tensors'])}",
              f"  Scene 3: License... {'present' if s['license'] else 'missing (the critics frown)'}",
              "", act("ACT III: THE VERDICT")]
    for i, c in enumerate(checks["checks"], 1):
        mood = {"PASS": "bravo!", "SKIP": "the understudy sits this one out", "FAIL": "a scream offstage!"}[c["status"]]
        lines.append(f"  Scene {i}: {c['name'].capitalize()}... {c['detail']} ({mood})")
    failed = [c for c in checks["checks"] if c["status"] == "FAIL"]
    if failed:
        lines.append(f"  TRAGEDY: {', '.join(c['name'] for c in failed)} failed. The model must not go on.")
    elif any(c["status"] == "SKIP" for c in checks["checks"]):
        lines.append("  INTERMISSION: part of the play happens behind the curtain; give the key to see the end.")
    else:
        lines.append("  CURTAIN CALL: Model is PRODUCTION READY!")
    return "\n".join(lines)
