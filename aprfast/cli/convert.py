"""``apr convert SRC DST``: a model from one format or precision to another (seed 001
§4.8, §13), a thin verb over :func:`aprfast.convert.convert`.  ``apr import`` and
``apr export`` (modules ``import_`` and ``export``) are the same verb with the
destination, or the source, fixed to ``.apr``.

The destination comes as a second argument or ``-o/--output`` (both spellings are in
the seed) and is never overwritten unless ``--force`` is given (QA #97: exit 1, the
file untouched).  ``--quantize`` takes a type name (``q8_0``, ``q4_k``, ...) or the
seed's ``int8``/``int4`` (GGML's Q8_0/Q4_0 blocks).  Not built yet: ``--prune`` and
``--lowrank`` (issue 13 item 8); ``--validate`` is passed to the API, which refuses
strict/relaxed until its inline validation exists.
"""

from __future__ import annotations

import os
import sys

from ._common import EXIT_ERROR, EXIT_OK, UsageError, add_progress_option, print_json, progress_for

#: The seed's names for the integer quantizations (§13.2 `--quantize int8`).
QUANTIZE_ALIASES = {"int8": "Q8_0", "int4": "Q4_0"}


def add_parser(commands) -> None:
    p = commands.add_parser("convert", help="convert between .apr, safetensors and GGUF; quantize, change precision")
    add_conversion_arguments(p, source_help="a .apr, .safetensors (file, index or directory) or .gguf file")
    p.add_argument("--to", choices=("apr", "safetensors", "gguf"),
                   help="destination format (default: from the destination's extension)")
    p.set_defaults(run=run)


def add_conversion_arguments(p, *, source_help: str) -> None:
    """The arguments convert, import and export share."""
    p.add_argument("source", help=source_help)
    p.add_argument("destination", nargs="?", help="output path (or give -o)")
    p.add_argument("-o", "--output", help="output path")
    p.add_argument("--quantize", metavar="TYPE", help="quantize 2-D float tensors: q8_0, q4_0, q4_k, ..., int8, int4")
    p.add_argument("--precision", choices=("f32", "f16", "bf16"), help="convert float tensors to this precision")
    p.add_argument("--compress", choices=("lz4", "zstd"), help="compress the tensors (.apr destinations)")
    p.add_argument("--validate", choices=("strict", "relaxed", "off"),
                   help="inline statistical validation (default: the conversion API's)")
    p.add_argument("--max-shard-size", metavar="SIZE", help="write a sharded safetensors checkpoint (e.g. 5GB)")
    p.add_argument("--no-tokenizer", action="store_true", help="do not embed a sibling tokenizer.json")
    p.add_argument("--prefix", action="append", metavar="PREFIX",
                   help="strip this prefix from tensor names (repeatable), e.g. module.")
    p.add_argument("-f", "--force", action="store_true", help="replace an existing destination")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")
    add_progress_option(p)


def run(args, *, to=None, verb="convert") -> int:
    destination = output_path(args)
    options = conversion_options(args)
    target = to or getattr(args, "to", None)
    with progress_for(args, f"{verb} {os.path.basename(str(args.source))}") as progress:
        return convert_and_report(args.source, destination, dict(options, progress=progress), target, verb,
                                  args.json)


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
    if args.quantize:
        options["quantize"] = _quant_name(args.quantize)
    if args.precision:
        options["precision"] = args.precision
    if args.compress:
        options["compression"] = args.compress
    if args.validate:
        options["validate"] = args.validate
    if args.max_shard_size:
        options["max_shard_size"] = args.max_shard_size
    if args.prefix:
        options["strip_prefix"] = tuple(args.prefix)
    return options


def _quant_name(text: str) -> str:
    from ..errors import UnknownDTypeError
    from ..quantization import quant_type, quant_types

    name = QUANTIZE_ALIASES.get(text.lower(), text)
    try:
        quant_type(name).require_quantizer()
    except UnknownDTypeError:
        raise UsageError(f"--quantize {text}: unknown type; one of "
                         f"{', '.join(quant_types(quantizable=True))}, int8, int4") from None
    except Exception as exc:  # noqa: BLE001 - a dequantize-only type: say why, as a usage error
        raise UsageError(f"--quantize {text}: {exc}") from None
    return name


def convert_and_report(source, destination, options, to, verb, as_json) -> int:
    from ..convert import DestinationExistsError, convert

    if not os.path.lexists(source):
        raise FileNotFoundError(f"{source}: no such file or directory")
    try:
        result = convert(source, destination, to=to, **options)
    except DestinationExistsError:
        print(f"apr {verb}: {destination} exists; pass --force to replace it", file=sys.stderr)
        return EXIT_ERROR
    except (NotImplementedError, ValueError) as exc:
        from ..errors import AprError

        if isinstance(exc, AprError):
            raise
        raise UsageError(str(exc)) from None
    result.update({"source": str(source), "destination": str(destination), "size": _size(destination)})
    if as_json:
        print_json(result)
    else:
        print(f"{source} ({result['source_format']}) -> {destination} ({result['format']}): "
              f"{result['tensors']} tensors, {result['bytes']:,} source bytes, {result['size']:,} bytes written")
    return EXIT_OK


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
