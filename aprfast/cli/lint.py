"""``apr lint FILE``: best practices and conventions, not corruption (seed 001 §4.11).

Each falsifiable guarantee of §4.11 is one check:

* **Naming** (§10.8): names that keep a source prefix (``model.``), GGUF or ONNX
  spellings, or abbreviations (``encoder.w``) get INFO with the canonical name: a
  convention, not a failure (issue 28 item 4: every Hugging Face model keeps
  ``model.``; ``apr convert --arch auto`` renames).  The text report gives one line per
  naming rule with a count and an example (``--verbose``: one per tensor).
* **Metadata**: a missing ``license``, ``model_card`` or ``provenance`` is a WARN
  (aprender's ``data_source`` counts as provenance).
* **Efficiency**: a tensor whose data does not start on a 64-byte boundary is INFO.
* **Compression**: an uncompressed tensor above 1 MiB is INFO.
* **Padding**: bytes between tensors that are not zero are a WARN (they hide data and
  make files that hold the same tensors differ).

Alignment, compression and padding concern the v2 data section; v1 containers store
one payload and get the naming and metadata checks only.  Exit 5 when a finding at or
above ``--fail-on`` (default warn: a missing license, non-zero padding) is found, else 0.
:func:`lint_file` is the function.
"""

from __future__ import annotations

import re
import sys

from ._common import EXIT_OK, EXIT_VALIDATION, add_key_options, open_model, print_json

LEVELS = ("INFO", "WARN")
ALIGNMENT = 64
LARGE_TENSOR = 1 << 20
REQUIRED_METADATA = ("license", "model_card", "provenance")
#: Keys aprender writes that say the same as ``provenance``.
PROVENANCE_ALIASES = ("provenance", "data_source", "source")
_PAD_CHUNK = 1 << 20

#: (pattern, level, why, replacement or None): §10.8's canonical names.  A replacement
#: is re.sub's, applied to the name to suggest the canonical spelling.
NAMING_RULES = (
    (r"^model\.", "INFO", "source prefix 'model.' is not part of the APR name", ""),
    (r"^/|/", "INFO", "ONNX-style path: APR names use dots", None),
    (r"^blk\.(\d+)\.attn_q\.", "INFO", "GGUF name", r"layers.\1.attn.q_proj."),
    (r"^blk\.(\d+)\.attn_k\.", "INFO", "GGUF name", r"layers.\1.attn.k_proj."),
    (r"^blk\.(\d+)\.attn_v\.", "INFO", "GGUF name", r"layers.\1.attn.v_proj."),
    (r"^blk\.(\d+)\.attn_output\.", "INFO", "GGUF name", r"layers.\1.attn.o_proj."),
    (r"^blk\.", "INFO", "GGUF name: APR uses layers.N", None),
    (r"^token_embd\.weight$", "INFO", "GGUF name", "token_embedding"),
    (r"\bembed_tokens\.weight$", "INFO", "HuggingFace name", "token_embedding"),
    (r"\bembed_positions\.weight$", "INFO", "HuggingFace name", "positional_embedding"),
    (r"\.w$", "INFO", "abbreviated: write 'weight' for auto-mapping", ".weight"),
    (r"\.b$", "INFO", "abbreviated: write 'bias' for auto-mapping", ".bias"),
    (r"[^A-Za-z0-9_.]", "INFO", "characters other than letters, digits, '_' and '.'", None),
)


def add_parser(commands) -> None:
    p = commands.add_parser("lint", help="check naming, metadata, alignment, compression and padding conventions")
    p.add_argument("file", help="a .apr file")
    p.add_argument("--fail-on", choices=("info", "warn", "never"), default="warn",
                   help="exit 5 when a finding at this level or above is found (default warn)")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="one naming finding per tensor (default: one line per naming rule, with a count)")
    add_key_options(p)
    p.set_defaults(run=run)


def run(args) -> int:
    with open_model(args.file, args) as f:
        findings = lint_file(f, args.file)
    if args.json:
        print_json({"file": args.file, "findings": findings})
    else:
        print(format_findings(args.file, findings, verbose=args.verbose))
    if args.fail_on == "never":
        return EXIT_OK
    threshold = LEVELS.index(args.fail_on.upper())
    failing = [x for x in findings if LEVELS.index(x["level"]) >= threshold]
    if failing:
        print(f"apr lint: {len(failing)} finding(s) at {args.fail_on.upper()} or above", file=sys.stderr)
        return EXIT_VALIDATION
    return EXIT_OK


def lint_file(f, path) -> list:
    """Findings ``{"level", "category", "message", "tensor"}`` for an open file."""
    findings = _metadata_findings(f.metadata or {})
    infos = [f.info(name) for name in f.keys()]
    for info in infos:
        findings += _naming_findings(info.name)
    from ..files.reader import AprFile

    if isinstance(f, AprFile):  # the data section's layout: v2 only
        findings += _layout_findings(infos)
        findings += _padding_findings(infos, path)
    return findings


def _finding(level, category, message, tensor=None) -> dict:
    return {"level": level, "category": category, "message": message, "tensor": tensor}


def _metadata_findings(metadata) -> list:
    out = []
    for key in REQUIRED_METADATA:
        keys = PROVENANCE_ALIASES if key == "provenance" else (key,)
        if not any(metadata.get(k) not in (None, "", {}, []) for k in keys):
            out.append(_finding("WARN", "Metadata", f"Missing '{key}' field"))
    return out


def _naming_findings(name) -> list:
    """At most one finding per name: every rule it breaks, the highest level, and the
    canonical name with every rule's fix applied in turn."""
    broken, canonical = [], name
    for pattern, level, why, replacement in NAMING_RULES:
        if re.search(pattern, canonical):
            broken.append((level, why))
            if replacement is not None:
                canonical = re.sub(pattern, replacement, canonical, count=1)
    if not broken:
        return []
    level = max((lv for lv, _ in broken), key=LEVELS.index)
    hint = f"; canonical: '{canonical}'" if canonical != name else ""
    finding = _finding(level, "Tensor Naming", f"'{name}': {'; '.join(w for _, w in broken)}{hint}", name)
    finding["rule"] = "; ".join(w for _, w in broken)
    return [finding]


def _layout_findings(infos) -> list:
    out = []
    unaligned = [i.name for i in infos if i.nbytes and i.offset % ALIGNMENT]
    if unaligned:
        out.append(_finding("INFO", "Efficiency", f"{len(unaligned)} tensor(s) not aligned to {ALIGNMENT} bytes: "
                                                  f"{', '.join(unaligned[:10])}"))
    for i in infos:
        if i.dtype is not None and i.nbytes > LARGE_TENSOR and i.nbytes == i.dtype.nbytes(i.shape):
            out.append(_finding("INFO", "Compression", f"'{i.name}' is {i.nbytes:,} bytes uncompressed "
                                                       "(apr convert --compress zstd)", i.name))
    return out


def _padding_findings(infos, path) -> list:
    """Non-zero bytes between consecutive tensors (shared extents counted once)."""
    extents = sorted({(i.offset, i.end) for i in infos if i.nbytes})
    out = []
    with open(path, "rb") as fh:
        for (_, end), (start, _) in zip(extents, extents[1:]):
            if start > end and _has_nonzero(fh, end, start - end):
                out.append(_finding("WARN", "Padding", f"non-zero bytes in the {start - end}-byte gap at offset {end}"))
    return out


def _has_nonzero(fh, offset, size) -> bool:
    fh.seek(offset)
    while size > 0:
        chunk = fh.read(min(size, _PAD_CHUNK))
        if not chunk:
            return False
        if chunk.count(0) != len(chunk):
            return True
        size -= len(chunk)
    return False


def format_findings(path, findings, verbose: bool = False) -> str:
    """The report: each finding, naming findings one line per rule with a count
    unless ``verbose``."""
    if not findings:
        return f"{path}: no findings"
    lines, groups = [], {}
    for x in findings:
        if x["category"] == "Tensor Naming" and not verbose:
            if x["rule"] not in groups:
                groups[x["rule"]] = []
                lines.append((x["level"], x["rule"]))  # where the group's line goes
            groups[x["rule"]].append(x)
        else:
            lines.append(f"[{x['level']}] {x['category']}: {x['message']}")
    lines = [line if isinstance(line, str) else _naming_line(*line, groups[line[1]]) for line in lines]
    counts = {level: sum(x["level"] == level for x in findings) for level in LEVELS}
    lines.append(f"{path}: {counts['WARN']} warning(s), {counts['INFO']} info"
                 + (" (--verbose lists each tensor's name finding)" if groups else ""))
    return "\n".join(lines)


def _naming_line(level, rule, found) -> str:
    example = found[0]["message"]
    if len(found) == 1:
        return f"[{level}] Tensor Naming: {example}"
    return f"[{level}] Tensor Naming: {len(found)} tensors: {rule} (e.g. {example})"
