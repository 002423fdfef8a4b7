"""``apr validate FILE``: integrity and value checks, exit 5 when one fails.

``--checksum`` (the file's CRC32 and, for signed v1 files, the signature), ``--nan-check``
(no NaN or Inf in any tensor), ``--zero-check`` (no weight entirely zero; an all-zero bias only warns),
``--shapes`` (below); none given means all four (the shapes too since issue 28 item 10: the seed's
acceptance item 33, "Vocab Match", expects ``apr validate`` to catch ``n_vocab`` 500 against an
embedding of 512 rows; the comparison reads only the metadata and the index).  ``--stats``
checks every tensor against seed 001 §10.9's expected statistics
(:mod:`aprfast.numerics.expectations`, the rules ``apr tensors --stats`` and ``aprfast.convert``'s inline validation
use; FAIL on NaN/Inf or a LayerNorm mean outside its range, WARN outside the expected std).  ``--shapes``
compares metadata sizes (``n_vocab``, ``hidden_size``, ``n_mels``, context lengths) with
the tensors' dimensions.  :func:`validate_file` is the same as a function.

``--quality`` prints the 100-point assessment of seed 001 §11 (:func:`aprfast.tools.quality.quality_report`, which
scores the checksum, NaN/Inf, zero and shape items itself, so the other checks are not run again) and exits 5
when the score is below ``--min-score``."""

from __future__ import annotations

import sys

from ..convert.mle import format_validate as format_mle
from ..convert.mle import is_mle, validate_mle
from ..errors import ChecksumError, DecryptError, SignatureError, ValidationError
from ..numerics.expectations import check_expected, count_by_rule
from ..numerics.stats import tensor_stats
from ._common import (
    EXIT_OK,
    EXIT_VALIDATION,
    UsageError,
    add_key_options,
    add_progress_option,
    cli_text,
    keys_from,
    non_negative_int,
    open_model,
    paint,
    print_json,
    progress_for,
)

CHECKS = ("checksum", "nan-check", "zero-check", "shapes", "stats")
#: The code of a failed value or shape check: the file is intact, a rule refuses its values
#: (:class:`aprfast.errors.ValidationError`); a failed checksum keeps E004 (damaged bytes).
RULE_CODE = ValidationError.code
#: What `apr validate FILE` runs with no check named (--stats is asked for explicitly).
DEFAULT_CHECKS = ("checksum", "nan-check", "zero-check", "shapes")


def add_parser(commands) -> None:
    p = commands.add_parser("validate", help="check the CRC, NaN/Inf, all-zero tensors and metadata sizes against "
                                             "the tensors (exit 5 on failure)")
    p.add_argument("file", help="a .apr file")
    p.add_argument("--checksum", action="store_true", help="verify the CRC32 (and signature) over the whole file")
    p.add_argument("--nan-check", action="store_true", help="fail if any tensor holds NaN or Inf")
    p.add_argument("--zero-check", action="store_true", help="fail if any tensor is entirely zero")
    p.add_argument("--shapes", action="store_true",
                   help="fail if metadata sizes (n_vocab, hidden_size, n_mels, n_ctx...) disagree with tensor dims")
    p.add_argument("--stats", action="store_true",
                   help="fail if a tensor's statistics contradict its role (seed 001 §10.9: NaN/Inf, LayerNorm mean)")
    p.add_argument("--quality", action="store_true", help="print the 100-point quality assessment (seed 001 §11)")
    p.add_argument("--min-score", type=non_negative_int, default=None, metavar="N",
                   help="with --quality: exit 5 when the score is below N")
    p.add_argument("--threads", type=non_negative_int, default=0, help="threads for the statistics (0: every core)")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")
    add_progress_option(p)
    add_key_options(p)
    p.set_defaults(run=run)


def run(args) -> int:
    if args.min_score is not None and not args.quality:
        raise UsageError("--min-score needs --quality")
    if args.quality:
        return run_quality(args)
    if is_mle(args.file):  # a peer format: header, section CRCs and signature (convert.mle)
        report = validate_mle(args.file)
        if args.json:
            print_json(report)
        else:
            print(format_mle(report))
        return EXIT_OK if report["ok"] else EXIT_VALIDATION
    flags = (args.checksum, args.nan_check, args.zero_check, args.shapes, args.stats)
    wanted = [name for name, flag in zip(CHECKS, flags) if flag]
    with open_model(args.file, args) as f:
        report = validate_file(f, checks=wanted or DEFAULT_CHECKS, threads=args.threads)
    report["file"] = args.file
    if args.json:
        print_json(report)
    else:
        print(format_report(report, color=getattr(args, "color", False)))
    failed = [check for check in report["checks"] if check["status"] == "FAIL"]
    for check in failed:
        code = f"[{check['code']}] " if check.get("code") else ""
        print(f"apr validate: {check['name']} failed: {code}{check['detail']}", file=sys.stderr)
    for line in _kind_of_failure(report["checks"]):
        print(f"apr validate: {line}", file=sys.stderr)
    return EXIT_OK if report["passed"] else EXIT_VALIDATION


def _kind_of_failure(checks) -> list:
    """What the failures mean (issue 28 item 4): damaged bytes (E004) or an intact file whose
    values break a rule (E009).  Both exit 5 here, so the line says which."""
    codes = {c.get("code") for c in checks if c["status"] == "FAIL"}
    crc_passed = any(c["name"] == "checksum" and c["status"] == "PASS" for c in checks)
    if "E004" in codes and RULE_CODE in codes:
        return ["the file's bytes are damaged (apr explain E004), and the values read from them break a rule "
                f"(apr explain {RULE_CODE})"]
    if "E004" in codes:
        return ["the file's bytes are damaged (apr explain E004): fetch or copy it again"]
    if RULE_CODE in codes:
        intact = "the file is intact (its CRC32 matches)" if crc_passed else "the file reads"
        return [f"{intact}, but its values break a rule (apr explain {RULE_CODE})"]
    return []


def run_quality(args) -> int:
    from ..tools.quality import quality_report

    with progress_for(args, "scoring") as progress:
        report = quality_report(args.file, threads=args.threads, progress=progress, **keys_from(args))
    minimum = args.min_score or 0
    report["min_score"] = minimum
    report["ok"] = report["score"] >= minimum and "error" not in report
    if args.json:
        print_json(report)
    else:
        print(format_quality(report, color=getattr(args, "color", False)))
    if not report["ok"]:
        why = report["error"]["message"] if "error" in report else f"below --min-score {minimum}"
        print(f"apr validate: quality score {report['score']}/100: {why}", file=sys.stderr)
    return EXIT_OK if report["ok"] else EXIT_VALIDATION


def format_quality(report, color: bool = False) -> str:
    """The §4.4 table: one line per category, the failures, the total."""
    lines = [f"=== 100-Point Quality Assessment: {report['file']} ===", ""]
    for key, cat in report["categories"].items():
        lines.append(f"{key}. {cat['name'] + ':':<32} {cat['passed']:>2}/{cat['applicable']:<2} applicable (of 25)")
    failed = [i for i in report["items"] if i["status"] == "FAIL"]
    if failed:
        lines.append("")
        lines += [f"  {paint('FAIL', color)} #{i['item']} {i['claim']}: {i['detail']}" for i in failed]
    lines += ["", f"{report['not_applicable']} item(s) not applicable (need a runtime, a reference, or are "
                  "properties of the tool): left out of the score",
              f"TOTAL: {report['score']}/100 ({report['grade']}) - {report['passed']} of {report['applicable']} "
              "applicable items passed"]
    return "\n".join(lines)


def validate_file(f, *, checks=DEFAULT_CHECKS, threads: int = 0) -> dict:
    """Run ``checks`` on an open file (``aprfast.open``'s result).  Returns
    ``{"passed": bool, "checks": [{"name", "status" PASS/FAIL, "code", "detail", ...}]}``."""
    unknown = set(checks) - set(CHECKS)
    if unknown:
        raise ValueError(f"unknown checks {sorted(unknown)}; known: {', '.join(CHECKS)}")
    results = []
    if "checksum" in checks:
        results.append(_checksum(f))
    if "nan-check" in checks or "zero-check" in checks or "stats" in checks:
        bad_values, all_zero, skipped, verdicts = _scan(f, threads)
        if "nan-check" in checks:
            detail = ", ".join(f"{n} ({s.nan_count} NaN, {s.inf_count} Inf)" for n, s in bad_values)
            results.append({"name": "nan-check", "status": "FAIL" if bad_values else "PASS",
                            "code": RULE_CODE if bad_values else None, "tensors": [n for n, _ in bad_values],
                            "skipped": skipped,
                            "detail": f"{len(bad_values)} tensor(s) with NaN/Inf: {detail}" if bad_values
                            else "no NaN or Inf in any tensor"})
        if "zero-check" in checks:
            results.append(_zero_result(all_zero, skipped))
        if "stats" in checks:
            results.append(_stats_result(verdicts, skipped))
    if "shapes" in checks:
        results.append(_shapes_result(f))
    return {"passed": all(r["status"] != "FAIL" for r in results), "checks": results}


def _zero_result(all_zero, skipped) -> dict:
    # A bias initialised to zero is normal (and often stays near it); an all-zero weight
    # is a tensor that was never loaded (seed 001 §10.11 "missing conv bias" aside).
    hard = [n for n in all_zero if not n.endswith("bias")]
    soft = [n for n in all_zero if n.endswith("bias")]
    if hard:
        status, detail = "FAIL", f"{len(hard)} all-zero tensor(s): {', '.join(hard)}"
    elif soft:
        status, detail = "WARN", f"{len(soft)} all-zero bias tensor(s) (allowed): {', '.join(soft)}"
    else:
        status, detail = "PASS", "no tensor is entirely zero"
    return {"name": "zero-check", "status": status, "code": RULE_CODE if hard else None, "tensors": all_zero,
            "skipped": skipped, "detail": detail}


def _shapes_result(f) -> dict:
    from ..tools.quality import shape_checks

    rows = shape_checks(f.metadata or {}, [f.info(n) for n in f.keys()])
    bad = [r for r in rows if r["status"] == "FAIL"]
    if bad:
        detail = "; ".join(f"{r['key']}={r['value']} but {r['tensor']} dim {r['dim']} is {r['actual']}" for r in bad)
    elif rows:
        detail = f"{len(rows)} metadata size(s) match the tensors: " + ", ".join(sorted({r["key"] for r in rows}))
    else:
        detail = "no metadata size names a tensor dimension (nothing to compare)"
    return {"name": "shapes", "status": "FAIL" if bad else "PASS", "code": RULE_CODE if bad else None,
            "detail": detail,
            "comparisons": rows}


def _stats_result(verdicts, skipped) -> dict:
    failed = [(n, v) for n, v in verdicts if v.status == "FAIL"]
    warned = [(n, v) for n, v in verdicts if v.status == "WARN"]
    checked = sum(v.status != "-" for _, v in verdicts)
    if failed:
        status = "FAIL"
        detail = f"{len(failed)} tensor(s) outside the expected statistics: " + \
            "; ".join(f"{n} ({', '.join(v.reasons)})" for n, v in failed)
    elif warned:  # one clause per rule with a count (apr tensors --stats lists each tensor's numbers)
        status = "WARN"
        detail = f"{len(warned)} tensor(s) outside the expected ranges (allowed): " + \
            "; ".join(f"{rule}: {len(names)} ({', '.join(names[:3])}{', ...' if len(names) > 3 else ''})"
                      for rule, names in count_by_rule(warned))
    else:
        status, detail = "PASS", f"{checked} tensor(s) with an expectation, all within it"
    return {"name": "stats", "status": status, "code": RULE_CODE if failed else None, "skipped": skipped,
            "detail": detail,
            "tensors": {n: {"status": v.status, "role": v.role, "reasons": list(v.reasons)} for n, v in verdicts
                        if v.status in ("FAIL", "WARN")}}


def _checksum(f) -> dict:
    try:
        f.verify()
    except (ChecksumError, SignatureError, DecryptError) as exc:
        return {"name": "checksum", "status": "FAIL", "code": exc.code, "detail": cli_text(exc.message)}
    return {"name": "checksum", "status": "PASS", "code": None, "detail": "CRC32 matches"
            + ("; signature valid" if getattr(f, "signer", None) else "")}


def _scan(f, threads):
    """(tensors with NaN/Inf as (name, stats), names of all-zero tensors, names skipped,
    (name, §10.9 verdict) of every tensor with statistics)."""
    bad, zeros, skipped, verdicts = [], [], [], []
    for name in f.keys():
        try:
            stats = tensor_stats(f.get_tensor(name), threads=threads)
        except TypeError:  # complex or unknown dtype: no statistics to check
            skipped.append(name)
            continue
        if stats.nan_count or stats.inf_count:
            bad.append((name, stats))
        if stats.count and stats.zero_count == stats.count:
            zeros.append(name)
        verdicts.append((name, check_expected(name, stats)))
    return bad, zeros, skipped, verdicts


def format_report(report, color: bool = False) -> str:
    lines = [f"{report.get('file', '<file>')}:"]
    for check in report["checks"]:
        code = f" [{check['code']}]" if check.get("code") else ""
        lines.append(f"  {paint(check['status'], color)} {check['name']}{code}: {check['detail']}")
        if check.get("skipped"):
            lines.append(f"         not checked (no statistics for their dtype): {', '.join(check['skipped'])}")
    failed = sum(c["status"] == "FAIL" for c in report["checks"])  # WARN passes
    lines.append(f"result: {'PASS' if report['passed'] else 'FAIL'} "
                 f"({len(report['checks']) - failed} of {len(report['checks'])} checks passed)")
    return "\n".join(lines)
