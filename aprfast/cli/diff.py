"""``apr diff A B``: two models tensor by tensor (seed 001 §4.5), over
:func:`aprfast.tools.diff.diff_models`.

B may be a ``.safetensors`` or ``.gguf`` reference, its names paired with A's through
``--tensor-mapping mapping.json`` (``{"name in A": "name in B"}``).  Exit 0 when every
tensor is on both sides and within ``--tolerance`` and the metadata is the same
(``--ignore-metadata`` leaves it out, as a reference in another format never has the
same metadata); exit 6 when the tensors all match but the metadata differs (result
``METADATA DIFFERS``: a GGUF round trip adds ``gguf.*`` keys;
issue 28 item 4); exit 5 when a tensor differs: the seed's "validation failed", as
``diff`` itself reports a difference with a non-zero status.
"""

from __future__ import annotations

import sys

from ..tools.diff import DEFAULT_TOLERANCE, diff_models, load_mapping
from ..tools.text import similarity_text
from ._common import (
    EXIT_OK,
    EXIT_VALIDATION,
    UsageError,
    add_key_options,
    add_progress_option,
    add_verify_option,
    fmt,
    keys_from,
    non_negative_int,
    print_json,
    progress_for,
    verify_from,
)

#: Metadata values longer than this are shortened in the human report (vocabularies).
_SHOWN_VALUE = 60
#: The tensors match (within --tolerance) and only the metadata differs.
EXIT_METADATA_DIFFERS = 6


def add_parser(commands) -> None:
    p = commands.add_parser("diff", help="compare two models tensor by tensor (exit 5 when tensors differ, "
                                         "6 when only the metadata does)",
                            epilog="exit codes: 0 the same (IDENTICAL or MATCH), 5 a tensor differs (DIFFERENT), "
                                   "6 the tensors match but the metadata differs (METADATA DIFFERS; "
                                   "--ignore-metadata: 0)")
    p.add_argument("a", help="a .apr file")
    p.add_argument("b", help="a .apr file, or a .safetensors / .gguf reference")
    p.add_argument("--tolerance", type=float, default=DEFAULT_TOLERANCE,
                   help=f"largest |a-b| a MATCH allows (default {DEFAULT_TOLERANCE:g})")
    p.add_argument("--tensor-mapping", metavar="JSON",
                   help='JSON file {"name in A": "name in B"} for tensors named differently')
    p.add_argument("--ignore-metadata", action="store_true", help="exit 0 even if the metadata differs")
    p.add_argument("--threads", type=non_negative_int, default=0, help="threads for the statistics (0: every core)")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")
    add_key_options(p)
    add_verify_option(p)
    add_progress_option(p)
    p.set_defaults(run=run)


def run(args) -> int:
    if not args.tolerance >= 0 or args.tolerance == float("inf"):
        raise UsageError(f"--tolerance {args.tolerance}: a finite number >= 0")
    mapping = load_mapping(args.tensor_mapping) if args.tensor_mapping else None
    keys = keys_from(args)
    # the key options open whichever side is an .apr file (a reference has no keys)
    with progress_for(args, "diff") as progress:
        report = diff_models(args.a, args.b, tolerance=args.tolerance, mapping=mapping,
                             keys_a=keys if _is_apr(args.a) else None, keys_b=keys if _is_apr(args.b) else None,
                             threads=args.threads, progress=progress, verify=verify_from(args))
    same = report.tensors_match and (args.ignore_metadata or not report.metadata_differs)
    if args.json:
        print_json({**report.as_dict(), "result": _verdict(report, same)})
    else:
        print(format_report(report, same))
    if same:
        return EXIT_OK
    if report.tensors_match:
        print(f"apr diff: {args.a} and {args.b} hold the same tensors; only the metadata differs "
              "(--ignore-metadata: exit 0)", file=sys.stderr)
        return EXIT_METADATA_DIFFERS
    print(f"apr diff: {args.a} and {args.b} differ", file=sys.stderr)
    return EXIT_VALIDATION


def _is_apr(path) -> bool:
    from ..convert import detect

    try:
        return detect(path) == "apr"
    except Exception:  # noqa: BLE001 - diff_models reports the real problem with this file
        return False


def _verdict(report, same) -> str:
    if not same:
        return "METADATA DIFFERS" if report.tensors_match else "DIFFERENT"
    if all(t.identical == t.count for t in report.tensors) and not report.metadata_differs:
        return "IDENTICAL"
    return "MATCH"


def format_report(report, same) -> str:
    identical = sum(t.identical == t.count and t.status == "MATCH" for t in report.tensors)
    total = len(report.tensors) + len(report.only_in_a) + len(report.only_in_b)
    lines = [f"=== {report.a} vs {report.b} ===",
             f"Similarity: {similarity_text(report.similarity)} ({identical} of {total} tensors identical)",
             f"Weight Changes: Max delta {fmt(report.max_abs_delta)}, L2 distance {fmt(report.l2_distance)}"]
    if report.vocab_added or report.vocab_removed:
        lines.append(f"Vocab Changes: Added {report.vocab_added} tokens, Removed {report.vocab_removed} tokens")
    lines += _metadata_lines(report)
    lines.append("")
    for t in report.tensors:
        lines.append(_tensor_line(t, report.tolerance))
    lines += [f"{name}: ONLY IN A" for name, _ in report.only_in_a]
    lines += [f"{name}: ONLY IN B" for name, _ in report.only_in_b]
    verdict = _verdict(report, same)
    if verdict == "METADATA DIFFERS":
        identical = all(t.identical == t.count for t in report.tensors)
        verdict += " (tensors identical)" if identical else " (tensors match within the tolerance)"
    lines.append(f"result: {verdict}")
    return "\n".join(lines)


def _tensor_line(t, tolerance) -> str:
    label = t.name if t.name == t.other_name else f"{t.name} -> {t.other_name}"
    if t.status == "MATCH":
        how = "identical" if t.identical == t.count else f"delta {fmt(t.max_abs_delta)} <= {tolerance:g}"
        return f"{label}: MATCH ({how})"
    if t.status == "DRIFT" and t.cosine is not None:
        return f"{label}: DRIFT ({t.detail}; cosine {t.cosine:.6f}, L2 {fmt(t.l2_distance)}) !!!"
    return f"{label}: {t.status} ({t.detail}) !!!"


def _metadata_lines(report) -> list:
    if not report.metadata_differs:
        return ["Metadata: same"]
    lines = [f"Metadata: {len(report.metadata_changed)} changed, {len(report.metadata_added)} added, "
             f"{len(report.metadata_removed)} removed"]
    for key, change in sorted(report.metadata_changed.items()):
        lines.append(f"  ~ {key}: {_short(change['a'])} -> {_short(change['b'])}")
    for key, value in sorted(report.metadata_added.items()):
        lines.append(f"  + {key}: {_short(value)}")
    for key in sorted(report.metadata_removed):
        lines.append(f"  - {key}")
    return lines


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= _SHOWN_VALUE else text[:_SHOWN_VALUE - 3] + "..."
