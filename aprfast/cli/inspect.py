"""``apr inspect FILE``: header, metadata and tensor table, reading nothing else;
``--verify`` also checks the file's CRC (and signature) by reading it whole;
``apr inspect -`` reads a v2 file from standard input (its CRC is always checked).

``--header`` prints the header alone, ``--vocab`` the embedded vocabulary (seed 001 §5.2),
``--quantization`` each packed tensor's type, block size, bits per weight and original
dtype (seed 002 §6.2.6), ``--full`` all of them with every metadata value in full.
Keys (``--password-env``, ``--key-file``, ``--trusted-key``) open encrypted or signed
files and streams whose names or metadata are sealed."""

from __future__ import annotations

import json
import sys

from ..api import inspect as inspect_file
from ..convert.mle import format_inspect as format_mle
from ..convert.mle import inspect_mle, is_mle
from ..dtypes import element_count
from ..errors import ChecksumError, SignatureError
from ..tools.quality import VOCAB_KEYS, VOCAB_SIZE_KEYS
from ._common import (
    EXIT_OK,
    EXIT_VALIDATION,
    add_key_options,
    cli_text,
    keys_from,
    non_negative_int,
    open_model,
    print_json,
)

SPECIAL_TOKEN_KEYS = ("bos_token_id", "eos_token_id", "unk_token_id", "pad_token_id")
#: Metadata values longer than this are cut short in the text report (``--full``: whole).
LONG_VALUE = 200


def add_parser(commands) -> None:
    p = commands.add_parser("inspect", help="show a file's header, metadata and tensors (reads nothing else)")
    p.add_argument("file", help="a .apr file, or - to read a v2 file from standard input")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")
    p.add_argument("--verify", action="store_true",
                   help="also check the CRC32 (and signature) over the whole file; exit 5 if they fail")
    p.add_argument("--header", action="store_true", help="print the header alone")
    p.add_argument("--vocab", action="store_true", help="print the embedded vocabulary")
    p.add_argument("--max-tokens", type=non_negative_int, default=20, metavar="N",
                   help="tokens --vocab shows (default 20; --full shows all)")
    p.add_argument("--quantization", action="store_true",
                   help="each quantized tensor's type, block size, bits/weight and original dtype")
    p.add_argument("--full", action="store_true",
                   help="everything: header, every metadata value in full, vocabulary, quantization, tensors")
    add_key_options(p)
    p.set_defaults(run=run)


def run(args) -> int:
    if args.file != "-" and is_mle(args.file):  # a peer format: its own report (convert.mle)
        report = inspect_mle(args.file)
        if args.json:
            print_json(report)
        else:
            print(format_mle(args.file, report))
        return EXIT_OK
    report, name = read_report(args)
    if args.verify:
        report["verified"] = ({"ok": True, "detail": "CRC32 checked while reading standard input"}
                              if args.file == "-" else verify(args.file, args))
    if args.vocab or args.full:
        report["vocab"] = vocab_report(report["metadata"], None if args.full else args.max_tokens)
    if args.quantization or args.full:
        report["quantization"] = quantization_report(report)
    if args.header and not args.full:
        report = {k: report[k] for k in ("layout", "header", "verified") if k in report}
    if args.json:
        print_json(report)
    elif args.header and not args.full:
        print(format_header(name, report))
    else:
        print(format_report(name, report, full=args.full))
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
        return {"ok": False, "code": exc.code, "detail": cli_text(exc.message)}
    return {"ok": True, "code": None, "detail": "checksum valid"}


def read_report(args) -> tuple:
    """(report, name shown): header, metadata and tensor index.  Without keys this
    reads nothing but those (``aprfast.inspect``); with keys the file is opened with
    them, so sealed metadata and names can be listed."""
    keys = keys_from(args)
    if args.file == "-":
        return inspect_stdin(keys), "<stdin>"
    if not keys:
        return inspect_file(args.file), args.file
    from ..files.reader import AprFile

    with open_model(args.file, args) as f:  # keys checked here, whatever the variant
        if isinstance(f, AprFile):
            return {"layout": f.layout, "header": f.header, "metadata": f.stored_metadata,
                    "tensors": {n: f.info(n).as_dict() for n in f.keys()}}, args.file
    # a v1 container's header and metadata are never sealed: the report needs no key
    return inspect_file(args.file), args.file


def vocab_report(metadata, limit) -> dict:
    """The vocabulary stored in the metadata: where, how many, the first ``limit``
    tokens (None: all), the stated size and the special token ids."""
    key = next((k for k in VOCAB_KEYS if isinstance(metadata.get(k), list)), None)
    tokens = metadata[key] if key else []
    stated_key = next((k for k in VOCAB_SIZE_KEYS if isinstance(metadata.get(k), int)), None)
    special = {}
    for k in SPECIAL_TOKEN_KEYS:
        for full in (f"tokenizer.{k}", k):
            if isinstance(metadata.get(full), int) and not isinstance(metadata.get(full), bool):
                special[k] = metadata[full]
                break
    shown = tokens if limit is None else tokens[:limit]
    return {"key": key, "size": len(tokens), "stated_size": metadata.get(stated_key) if stated_key else None,
            "tokens": list(shown), "truncated": len(shown) < len(tokens), "special_tokens": special}


def quantization_report(report) -> dict:
    """Seed 002 §6.2.6 ``--quantization``: each packed tensor's type, block size,
    bits per weight (stored bytes / elements) and original dtype, with the file's
    ``quantization`` metadata.  The original dtype is what the metadata records
    (``original_dtype``, as ``apr quantize`` writes it), else None: the packed bytes
    cannot tell whether they came from f32, f16 or bf16."""
    from ..numerics.quantization import quant_type, quant_types

    known = set(quant_types())
    meta = report["metadata"].get("quantization")
    meta = meta if isinstance(meta, dict) else {}
    originals = meta.get("original_dtypes") if isinstance(meta.get("original_dtypes"), dict) else {}
    tensors = {}
    for name, t in report.get("tensors", {}).items():
        if t["dtype"] not in known:
            continue
        kind = quant_type(t["dtype"])
        elements = element_count(t["shape"])
        tensors[name] = {"type": kind.name, "block_size": kind.block_size,
                         "bits_per_weight": t["nbytes"] * 8 / elements if elements else None,
                         "original_dtype": originals.get(name, meta.get("original_dtype"))}
    return {"quantized": bool(tensors), "metadata": meta or None, "tensors": tensors}


def inspect_stdin(keys=None) -> dict:
    """``inspect``'s report for a v2 file on standard input, read front to back by
    ``aprfast.stream``: the prefix gives the report, and the rest is read (not kept) so
    the footer and its CRC are checked before anything is printed.  ``keys`` open an
    encrypted or signed stream (a signature is checked by the end of the stream)."""
    from ..stream import stream

    with stream(sys.stdin.buffer, unknown_dtypes="raw", **(keys or {})) as s:
        s.finish()
        # Every stored key, as `inspect FILE` reports (older streams have only .metadata).
        metadata = getattr(s, "stored_metadata", s.metadata)
        return {"layout": s.layout, "header": s.header, "metadata": metadata, "tensors": s.describe()}


def format_header(path, report) -> str:
    lines = [f"{path}: {report['layout']} layout, header:"]
    for key, value in report["header"].items():
        if isinstance(value, int) and not isinstance(value, bool) and key in ("flags", "flags_raw"):
            value = f"{value:#06x}"
        elif isinstance(value, (list, tuple)):
            value = " ".join(map(str, value)) or "-"
        elif isinstance(value, dict):
            value = json.dumps(value, default=str)
        lines.append(f"  {key}: {value}")
    if "verified" in report:
        lines.append(f"checksum: {'valid' if report['verified']['ok'] else 'INVALID'}")
    return "\n".join(lines)


def format_report(path, report, full: bool = False) -> str:
    if report["layout"] == "v1":
        text = _format_v1_report(path, report, full)
    else:
        text = _format_v2_report(path, report, full)
    if "vocab" in report:
        text += "\n" + format_vocab(report["vocab"])
    if "quantization" in report:
        text += "\n" + format_quantization(report["quantization"])
    if "verified" in report:
        v = report["verified"]
        text += f"\nchecksum: {'valid' if v['ok'] else 'INVALID'}"
        text += "" if v["ok"] else f" [{v['code']}] {v['detail']}"
    return text


def format_vocab(vocab) -> str:
    if vocab["key"] is None:
        return "vocabulary: none in the metadata"
    stated = "" if vocab["stated_size"] in (None, vocab["size"]) else f" (metadata states {vocab['stated_size']})"
    lines = [f"vocabulary ({vocab['key']}): {vocab['size']} tokens{stated}"]
    if vocab["special_tokens"]:
        lines.append("  special: " + ", ".join(f"{k}={v}" for k, v in vocab["special_tokens"].items()))
    lines += [f"  {i:>6}  {json.dumps(tok, ensure_ascii=False)}" for i, tok in enumerate(vocab["tokens"])]
    if vocab["truncated"]:
        lines.append(f"  ... {vocab['size'] - len(vocab['tokens'])} more (--max-tokens N, or --full)")
    return "\n".join(lines)


def format_quantization(quant) -> str:
    if not quant["quantized"]:
        return "quantization: none (no tensor is quantized)"
    lines = ["quantization:"]
    for name, q in quant["tensors"].items():
        bits = "-" if q["bits_per_weight"] is None else f"{q['bits_per_weight']:.4g}"
        lines.append(f"  {name}: Type: {q['type']}, Block size: {q['block_size'] or 'per tensor'}, "
                     f"Bits/weight: {bits}, Original: {q['original_dtype'] or 'not recorded'}")
    return "\n".join(lines)


def _value_text(value, full: bool) -> str:
    text = json.dumps(value, ensure_ascii=False, default=str)
    if full or len(text) <= LONG_VALUE:
        return text
    return f"{text[:LONG_VALUE]}... ({len(text)} characters; --full shows all)"


def _format_v2_report(path, report, full: bool = False) -> str:
    header, tensors = report["header"], report["tensors"]
    lines = [
        f"{path}: {report['layout']} layout ({header['magic']}, version {header['version']}), "
        f"{header['file_size']} bytes",
        f"flags: {header['flags']:#06x} {' '.join(header['flag_names']) or '-'}",
    ]
    if isinstance(header.get("security"), dict):
        sec = header["security"]
        lines.append(f"security: encryption {sec.get('encryption') or 'none'}, signature {sec.get('signature')}"
                     + (f" by {sec['signer']}" if sec.get("signer") else "") + f", digest {sec.get('digest')}")
    lines += [
        f"metadata ({header['metadata_size']} bytes):",
    ]
    for key, value in report["metadata"].items():
        if value is not None:
            lines.append(f"  {key}: {_value_text(value, full)}")
    total = sum(t["nbytes"] for t in tensors.values())
    lines.append(f"tensors ({len(tensors)}, {total} bytes):")
    width = max((len(n) for n in tensors), default=4)
    for name, t in tensors.items():
        shape = "x".join(str(d) for d in t["shape"]) or "scalar"
        lines.append(f"  {name:<{width}}  {t['dtype']:<8} {shape:<20} {t['nbytes']:>12} B  @ {t['offset']}")
    return "\n".join(lines)


def _format_v1_report(path, report, full: bool = False) -> str:
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
        lines.append(f"  {key}: {_value_text(value, full)}")
    if "license_block_size" in report:
        lines.append(f"license block: {report['license_block_size']} bytes")
    return "\n".join(lines)
