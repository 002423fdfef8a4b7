"""``apr convert SRC DST``: a model from one format or precision to another (seed 001
§4.8, §13), a thin verb over :func:`aprfast.convert.convert`.  ``apr import`` and
``apr export`` (modules ``import_`` and ``export``) are the same verb with the
destination, or the source, fixed to ``.apr``.

The destination comes as a second argument or ``-o/--output`` (both spellings are in
the seed) and is never overwritten unless ``--force`` is given (QA #97: exit 1, the
file untouched).  ``--quantize`` takes a type aprfast has a quantizer for (``q8_0``,
``q4_0``, ``q4_k``, ...: :func:`quantize_help` lists them, and so does ``--help``), the
seed's ``int8``/``int4`` (GGML's Q8_0/Q4_0 blocks), or one of llama.cpp's mixes
(``q4_k_m``, ``q5_k_m``, ...; ``aprfast.numerics.mixes``).  ``--arch`` maps tensor names to
the canonical ``.apr`` names (seed 001 §10.8).  ``--validate`` (default strict, the
API's) checks every tensor as it is written (seed 001 §10.9-10.10): a failure exits 5
(seed 001 Appendix A) with the tensor and the numbers, nothing written; ``--force``
or ``--validate relaxed`` writes it anyway with a warning.  ``--prune S``
(``--prune-structure row``) and ``--lowrank R`` (or the seed's ``--lowrank svd --rank
R``), both limited to ``--target GLOB`` when given, reduce size
(``aprfast.convert.optimize``); every lossy option passes the quality gate of seed 001
§4.8.4 (``--max-drift``, default 0.1 relative L2; ``aprfast.convert.gate``): a tensor
drifting more exits 5 with its numbers, nothing written, unless ``--force``.  The drift
of each changed tensor is printed.
"""

from __future__ import annotations

import os
import sys

from ._common import (
    EXIT_ERROR,
    EXIT_OK,
    EXIT_VALIDATION,
    UsageError,
    add_progress_option,
    add_verify_option,
    cli_text,
    print_json,
    progress_for,
    refuse_existing,
)

#: The seed's names for the integer quantizations (§13.2 `--quantize int8`).
QUANTIZE_ALIASES = {"int8": "Q8_0", "int4": "Q4_0"}
#: Spellings of a precision: the seed writes `--precision fp16` (§4.8) and `--quantize fp16`
#: / `--quantize bf16` (§13.2: a float "quantization" is a precision change).
PRECISION_ALIASES = {"f32": "f32", "fp32": "f32", "float32": "f32", "f16": "f16", "fp16": "f16", "float16": "f16",
                     "half": "f16", "bf16": "bf16", "bfloat16": "bf16"}


def precision_name(text: str) -> str:
    """argparse type of ``--precision``: the seed's ``fp16``/``fp32`` and NumPy's
    ``float16`` spell the same precisions as ``f16``/``f32``."""
    return PRECISION_ALIASES.get(str(text).lower(), text)


def add_parser(commands) -> None:
    p = commands.add_parser("convert", help="convert between .apr, safetensors and GGUF; quantize, change precision")
    add_conversion_arguments(p, source_help="a .apr, .safetensors (file, index or directory) or .gguf file")
    p.add_argument("--to", choices=("apr", "safetensors", "gguf", "burnpack"),
                   help="destination format (default: from the destination's extension)")
    p.set_defaults(run=run)


def add_conversion_arguments(p, *, source_help: str) -> None:
    """The arguments convert, import and export share."""
    p.add_argument("source", help=source_help)
    p.add_argument("destination", nargs="?", help="output path (or give -o)")
    p.add_argument("-o", "--output", help="output path")
    p.add_argument("--quantize", metavar="TYPE", help=quantize_help())
    p.add_argument("--precision", type=precision_name, choices=("f32", "f16", "bf16"),
                   help="convert float tensors to this precision (fp32, fp16, float16, bfloat16 are accepted too)")
    p.add_argument("--compress", choices=("lz4", "zstd"), help="compress the tensors (.apr destinations)")
    p.add_argument("--validate", choices=("strict", "relaxed", "off"),
                   help="check each tensor's statistics as it is written (seed 001 §10.9); strict (default) "
                        "exits 5 on a failure, relaxed warns, off skips")
    p.add_argument("--prune", metavar="SPARSITY", type=float,
                   help="magnitude pruning: zero this fraction (0-1) of each selected tensor's smallest weights")
    p.add_argument("--prune-structure", choices=("unstructured", "row"), default="unstructured",
                   help="--prune elements (unstructured, default) or whole rows of smallest L2 norm (row)")
    p.add_argument("--lowrank", metavar="RANK",
                   help="store 2-D weights as two SVD factors of this rank (or 'svd' with --rank)")
    p.add_argument("--rank", type=int, metavar="N", help="the rank of --lowrank svd")
    p.add_argument("--target", action="append", metavar="GLOB",
                   help="tensors --prune/--lowrank change (repeatable; default: 2-D+ float weights, no norms, "
                        "biases or embeddings)")
    p.add_argument("--max-drift", metavar="X",
                   help="quality gate of lossy conversions: largest relative L2 drift of a tensor "
                        "(default 0.1; 'off': report only); --force writes anyway")
    p.add_argument("--arch", choices=("whisper", "llama", "bert", "auto"),
                   help="map Hugging Face / GGUF / ONNX tensor names to the canonical .apr names (auto: detect)")
    p.add_argument("--names", choices=("auto", "keep"), default="auto",
                   help="auto (default): a Hugging Face model to GGUF gets llama.cpp's names, rows and keys, a GGUF "
                        "to safetensors Hugging Face's, config.json and tokenizer, either to .apr the canonical "
                        "names (and an .apr converts as the model it came from); keep: names, rows and keys as "
                        "they are")
    p.add_argument("--max-shard-size", metavar="SIZE", help="write a sharded safetensors checkpoint (e.g. 5GB)")
    p.add_argument("--no-tokenizer", action="store_true", help="do not embed a sibling tokenizer.json")
    p.add_argument("--prefix", action="append", metavar="PREFIX",
                   help="strip this prefix from tensor names (repeatable), e.g. module.")
    p.add_argument("-f", "--force", action="store_true",
                   help="replace an existing destination; write tensors that fail validation or the quality gate "
                        "(with a warning)")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="list every tensor outside the expected ranges (default: one line per rule, with a count)")
    add_verify_option(p)
    add_progress_option(p)


def run(args, *, to=None, verb="convert") -> int:
    destination = output_path(args)
    options = conversion_options(args)
    target = to or getattr(args, "to", None)
    with progress_for(args, f"{verb} {os.path.basename(str(args.source))}") as progress:
        return convert_and_report(args.source, destination, dict(options, progress=progress), target, verb,
                                  args.json, getattr(args, "verbose", False))


def output_path(args) -> str:
    if args.destination and args.output and args.destination != args.output:
        raise UsageError(f"two outputs given: {args.destination!r} and -o {args.output!r}")
    destination = args.destination or args.output
    if not destination:
        raise UsageError("no output: give DESTINATION or -o PATH")
    return destination


def conversion_options(args) -> dict:
    """``aprfast.convert`` keyword arguments; a bad value is a usage error (exit 2)."""
    options = {"force": args.force, "tokenizer": not args.no_tokenizer}
    if getattr(args, "verify", True) is False:
        options["verify"] = False
    precision = args.precision
    if args.quantize and args.quantize.lower() in PRECISION_ALIASES:  # the seed's `--quantize fp16`
        wanted = PRECISION_ALIASES[args.quantize.lower()]
        if precision is not None and precision != wanted:
            raise UsageError(f"--quantize {args.quantize} and --precision {precision} disagree")
        precision = wanted
    elif args.quantize:
        options["quantize"] = _quant_name(args.quantize)
    if precision:
        options["precision"] = precision
    if args.compress:
        options["compression"] = args.compress
    if args.validate:
        options["validate"] = args.validate
    if args.arch:
        options["arch"] = args.arch
    if getattr(args, "names", "auto") != "auto":
        options["names"] = args.names
    if args.max_shard_size:
        options["max_shard_size"] = args.max_shard_size
    if args.prefix:
        options["strip_prefix"] = tuple(args.prefix)
    options.update(_optimize_options(args))
    return options


def _optimize_options(args) -> dict:
    """``prune=``, ``lowrank=`` and ``max_drift=`` from the flags."""
    options = {}
    select = tuple(args.target) if args.target else None
    if args.prune is not None:
        if not 0.0 <= args.prune <= 1.0:
            raise UsageError(f"--prune {args.prune:g}: a fraction between 0 and 1")
        options["prune"] = {"sparsity": args.prune, "structure": args.prune_structure, "select": select}
    elif args.prune_structure != "unstructured":
        raise UsageError("--prune-structure needs --prune SPARSITY")
    if args.lowrank is not None:
        text = args.lowrank.lower()
        if text == "svd":
            if args.rank is None:
                raise UsageError("--lowrank svd needs --rank N")
            rank = args.rank
        elif text.isdigit():
            if args.rank is not None and args.rank != int(text):
                raise UsageError(f"--lowrank {text} and --rank {args.rank} disagree")
            rank = int(text)
        else:
            raise UsageError(f"--lowrank {args.lowrank}: a rank (e.g. 64) or 'svd' with --rank N")
        if rank < 1:
            raise UsageError(f"--lowrank rank {rank}: a positive integer")
        options["lowrank"] = {"rank": rank, "select": select}
    elif args.rank is not None:
        raise UsageError("--rank needs --lowrank svd")
    if args.target and args.prune is None and args.lowrank is None:
        raise UsageError("--target selects tensors for --prune or --lowrank; give one of them")
    if args.max_drift is not None:
        if args.max_drift.lower() in ("off", "none"):
            options["max_drift"] = None
        else:
            try:
                options["max_drift"] = float(args.max_drift)
            except ValueError:
                raise UsageError(f"--max-drift {args.max_drift}: a number (relative L2) or 'off'") from None
            if not options["max_drift"] >= 0:
                raise UsageError(f"--max-drift {args.max_drift}: a number >= 0")
    return options


def quantize_help() -> str:
    """``--quantize``'s help: every type it accepts (those aprfast has a quantizer for,
    and the seed's aliases), never one it would refuse (issue 26: ``q4_k`` was offered).

    Returns:
        The help text.

    Example:
        >>> quantize_help().split(";")[0]  # doctest: +ELLIPSIS
        'quantize 2-D float tensors: q8_0, q4_0, q4_1, ..., int8 (q8_0), int4 (q4_0)'
    """
    from ..numerics.mixes import MIXES
    from ..numerics.quantization import quant_types

    names = ", ".join(name.lower() for name in quant_types(quantizable=True))
    aliases = ", ".join(f"{alias} ({name.lower()})" for alias, name in QUANTIZE_ALIASES.items())
    mixes = ", ".join(name.lower() for name in MIXES if name[-2:] in ("_S", "_M", "_L"))
    return (f"quantize 2-D float tensors: {names}, {aliases}; fp16/bf16 change the precision; or a "
            f"llama.cpp mix ({mixes}: per-tensor types as llama-quantize picks them)")


def _quant_name(text: str) -> str:
    from ..errors import LayoutError, UnknownDTypeError
    from ..numerics.mixes import MIXES, mix
    from ..numerics.quantization import quant_type, quant_types

    try:
        found = mix(text, suffixed_only=True)  # llama.cpp's Q4_K_M, Q5_K_S, ...: aprfast.convert plans it
    except LayoutError as exc:  # a llama.cpp file type aprfast does not offer (Q2_K_S, IQ2_M, ...)
        raise UsageError(f"--quantize {text}: {exc.message}") from None
    if found is not None:
        for type_name in found.types:
            try:
                quant_type(type_name).require_quantizer()
            except Exception as exc:  # noqa: BLE001 - a mix needing a type aprfast cannot make
                raise UsageError(f"--quantize {text}: {exc}") from None
        return found.name
    name = QUANTIZE_ALIASES.get(text.lower(), text)
    try:
        quant_type(name).require_quantizer()
    except UnknownDTypeError:
        raise UsageError(f"--quantize {text}: unknown type; one of "
                         f"{', '.join(quant_types(quantizable=True))}, int8, int4, or llama.cpp's mixes "
                         f"{', '.join(n for n, m in MIXES.items() if m.suffixed)}") from None
    except Exception as exc:  # noqa: BLE001 - a dequantize-only type: say why, as a usage error
        raise UsageError(f"--quantize {text}: {exc}") from None
    return name


def convert_and_report(source, destination, options, to, verb, as_json, verbose=False) -> int:
    import warnings

    from ..convert import DestinationExistsError, QualityGateError, TensorValidationError, convert
    from ..remote import is_url

    if not is_url(source) and not os.path.lexists(source):  # a URL (hf://, https://, s3://) is fetched by convert
        raise FileNotFoundError(f"{source}: no such file or directory")
    if not os.path.isdir(destination):  # a directory of shards: each file written is checked by the same rule
        refuse_existing(options.get("force", False), destination)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = convert(source, destination, to=to, **options)
    except DestinationExistsError:
        print(f"apr {verb}: {destination} exists; pass --force to replace it", file=sys.stderr)
        return EXIT_ERROR
    except QualityGateError as exc:
        print(cli_text(f"apr {verb}: quality gate failed: {exc}"), file=sys.stderr)
        print(f"apr {verb}: --max-drift X raises the limit; --force writes it anyway", file=sys.stderr)
        return EXIT_VALIDATION
    except TensorValidationError as exc:
        print(cli_text(f"apr {verb}: validation failed: {exc}"), file=sys.stderr)
        return EXIT_VALIDATION
    except (NotImplementedError, ValueError) as exc:
        from ..errors import AprError

        if isinstance(exc, AprError):
            raise
        raise UsageError(str(exc)) from None
    for w in caught:  # the mapper's and validator's warnings, once each, on stderr
        print(cli_text(f"apr {verb}: warning: {w.message}"), file=sys.stderr)
    result.update({"source": str(source), "destination": str(destination), "size": _size(destination)})
    if as_json:
        print_json(result)
    else:
        print(f"{source} ({result['source_format']}) -> {destination} ({result['format']}): "
              f"{result['tensors']} tensors, {result['bytes']:,} source bytes, {result['size']:,} bytes written")
        print(_summary(result, verbose))
    return EXIT_OK


_SHOWN = 10


def _summary(result, verbose: bool = False) -> str:
    """The name mapping and validation lines under the conversion line: the tensors
    outside the expected ranges counted per rule (issue 28 item 4: a normal model's
    twelve projections are one line, not twelve), each listed with ``verbose``."""
    lines = []
    names = result.get("names")
    if names is not None and names.get("direction"):
        engine = "llama.cpp's" if names["direction"] == "hf-to-gguf" else "Hugging Face's"
        lines.append(f"names: {engine} ({names['model']} model), {names['renamed']} renamed, "
                     f"{len(names['permuted'])} with rotary rows reordered, {len(names['unknown'])} unknown kept")
    elif names is not None:
        if names["arch"]:
            how = "detected" if names["detected"] else "chosen"
            namings = ", ".join(f"{k} {v}" for k, v in names["namings"].items())
            lines.append(f"names: {names['arch']} ({how}), {names['renamed']} renamed ({namings}), "
                         f"{len(names['unknown'])} unknown kept")
        else:
            lines.append(f"names: unchanged ({names['reason']})")
    v = result["validation"]
    if v["mode"] == "off":
        lines.append("validation: off")
    else:
        parts = [f"{v['checked']} tensors checked"]
        if v["failed"]:
            parts.append(f"{len(v['failed'])} failed, written anyway")
        if v["warned"]:
            parts.append(f"{len(v['warned'])} outside the expected ranges (warnings)")
        if not v["failed"] and not v["warned"]:
            parts.append("none failed")
        if v["skipped"]:
            parts.append(f"{len(v['skipped'])} without statistics (not checked)")
        lines.append(f"validation ({v['mode']}): {', '.join(parts)}")
        if verbose:
            lines += [f"  WARN {w['name']}: {'; '.join(w['reasons'])}" for w in v["warned"]]
        else:
            lines += _rule_lines(v["warned"])
    lines += _optimize_lines(result.get("optimize") or {})
    lines += _quality_lines(result.get("quality"))
    return "\n".join(lines)


def _rule_lines(warned) -> list:
    """One line per rule: how many tensors, the first few names."""
    groups = {}
    for w in warned:
        for rule in w.get("rules") or w["reasons"]:
            groups.setdefault(rule, []).append(w["name"])
    lines = []
    for rule, names in sorted(groups.items(), key=lambda item: -len(item[1])):
        shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
        lines.append(f"  WARN {rule}: {len(names)} tensor(s) ({shown})")
    if lines:
        lines.append("  (--verbose lists each tensor with its numbers)")
    return lines


def _optimize_lines(report) -> list:
    lines = []
    p = report.get("prune")
    if p is not None:
        zeros = sum(t["zeros"] for t in p["tensors"])
        lines.append(f"prune: magnitude {p['structure']} {p['sparsity']:g}, {len(p['tensors'])} tensors, "
                     f"{zeros:,} zeros")
        lines += [f"  skip {s['name']}: {s['reason']}" for s in p["skipped"]]
    lr = report.get("lowrank")
    if lr is not None:
        lines.append(f"lowrank: rank {lr['rank']}, {len(lr['tensors'])} tensors factored (W = W.lowrank_a @ "
                     f"W.lowrank_b)")
        lines += [f"  skip {s['name']}: {s['reason']}" for s in lr["skipped"]]
    return lines


def _quality_lines(q) -> list:
    """Seed 001 §4.8.4's layer-by-layer drift, every tensor measured."""
    if q is None:
        return []
    limit = "no limit" if q["max_drift"] is None else f"max {q['max_drift']:g}"
    worst = q["worst"]
    head = f"quality gate ({limit}): {q['measured']} tensors measured"
    if worst is not None:
        head += f", worst relative L2 {worst['relative_l2']:.4g} ({worst['name']})"
    if q["failed"]:
        head += f", {len(q['failed'])} over the limit, written anyway (--force)"
    lines = [head]
    width = max((len(t["name"]) for t in q["tensors"]), default=0)
    for t in q["tensors"]:
        over = q["max_drift"] is not None and t["relative_l2"] > q["max_drift"]
        mark = "FAIL" if over else "PASS"
        lines.append(f"  {mark} {t['name']:<{width}}  {t['op']:<9} relative L2 {t['relative_l2']:<10.4g} "
                     f"max |delta| {t['max_abs_delta']:.4g}")
    return lines


def _size(path) -> int:
    """Bytes written: the file, or every file of a sharded checkpoint's directory."""
    path = os.fspath(path)
    directory = path if os.path.isdir(path) else None
    if directory is None and path.endswith(".json"):
        directory = os.path.dirname(path) or "."
    if directory is None:
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(directory, n)) for n in os.listdir(directory)
               if os.path.isfile(os.path.join(directory, n)))
