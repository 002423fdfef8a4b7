"""``apr quantize IN OUT --type q4_0 [--embedding-type q8_0] [--output-type q8_0]
[--layer GLOB=TYPE ...]``: seed 002 §6.2.6.  OUT may also be given as ``-o OUT``, as
``apr convert`` takes either.

Tensors are quantized by :func:`aprfast.numerics.quantization.quantize_tensors` (the C kernels),
then dequantized to measure each one's error; the report gives every tensor's type,
bits per weight, RMSE, largest absolute error and cosine similarity.  Per-layer types:
``--layer`` rules first (in the order given; ``keep`` leaves a tensor as it is), then
``--embedding-type`` for embeddings and ``--output-type`` for the output projection,
then ``--type``.  One-dimensional tensors (norms, biases) stay as they are, as llama.cpp
keeps them, unless ``--quantize-1d``.  ``--type`` may name one of llama.cpp's mixes
(``q4_k_m``, ``q5_k_m``, ``q3_k_m``, ...): each tensor then gets the type llama-quantize
gives it (``aprfast.numerics.mixes``), ``--layer``/``--embedding-type``/``--output-type``
rules still first.  OUT is never replaced without ``--force``."""

from __future__ import annotations

import dataclasses
import fnmatch
import os

from ..dtypes import element_count
from ..errors import LayoutError
from ..files.integrity import CheckedReader
from ..layouts.aprender import COUNT_KEYS, tensor_counts
from ..numerics.mixes import MIXES, mix
from ..numerics.quantization import quant_type, quant_types, quantize_tensors
from ._common import (
    EXIT_OK,
    UsageError,
    add_key_options,
    add_progress_option,
    add_verify_option,
    non_negative_int,
    open_model,
    print_json,
    progress_for,
    refuse_existing,
    verify_from,
)

#: Names of embedding and output-projection tensors (Hugging Face, GGUF, whisper spellings).
EMBEDDING_GLOBS = ("*embed_tokens*", "*token_embedding*", "*tok_embeddings*", "*wte*", "*wpe*",
                   "*embed_positions*", "*positional_embedding*", "token_embd*", "*word_embeddings*")
OUTPUT_GLOBS = ("lm_head*", "output.weight", "*.lm_head*")
KEEP = ("keep", "none", "f32")
FLOAT_DTYPES = ("F64", "F32", "F16", "BF16")


def add_parser(commands) -> None:
    p = commands.add_parser("quantize", help="quantize a model's float tensors (q8_0, q4_0, q4_1, ...) with a report")
    p.add_argument("file", help="the model to quantize (.apr)")
    p.add_argument("destination", nargs="?", help="where to write the quantized model (or give -o)")
    p.add_argument("-o", "--output", help="where to write the quantized model")
    # not required=True: a config file's [quantize] type = "q4_0" may supply it
    p.add_argument("--type", metavar="TYPE",
                   help=f"the default type: {', '.join(t.lower() for t in quant_types(quantizable=True))}; or a "
                   f"llama.cpp mix: {', '.join(n.lower() for n, m in MIXES.items() if m.suffixed)}")
    p.add_argument("--embedding-type", metavar="TYPE", help="type for embedding tensors (keep: leave them)")
    p.add_argument("--output-type", metavar="TYPE", help="type for the output projection (lm_head)")
    p.add_argument("--layer", action="append", default=[], metavar="GLOB=TYPE",
                   help="type for tensors whose name matches GLOB (repeatable, first match wins; TYPE keep: leave)")
    p.add_argument("--quantize-1d", action="store_true", help="also quantize 1-D tensors (norms, biases)")
    p.add_argument("--layout", choices=("auto", "apr2", "aprender"), default="auto",
                   help="layout of OUT (auto: aprender's when it holds every type, else apr2)")
    p.add_argument("--threads", type=non_negative_int, default=0, help="threads for the kernels (0: every core)")
    p.add_argument("-f", "--force", action="store_true", help="replace OUT if it exists")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    add_progress_option(p)
    add_verify_option(p)
    add_key_options(p)
    p.set_defaults(run=run)


def _output(args) -> str:
    """OUT as the second argument or ``-o`` (one of the two, as apr convert)."""
    if args.destination and args.output and args.destination != args.output:
        raise UsageError(f"two outputs given: {args.destination!r} and -o {args.output!r}")
    output = args.destination or args.output
    if not output:
        raise UsageError("no output: give OUT (apr quantize IN OUT --type TYPE) or -o OUT")
    return output


def parse_rules(args) -> list:
    """[(glob, type name or None)] in the order they apply; every type checked now."""
    rules = []
    for text in args.layer:
        glob, sep, kind = text.partition("=")
        if not sep or not glob or not kind:
            raise UsageError(f"--layer {text!r}: expected GLOB=TYPE, e.g. '*.attn.*=q8_0'")
        rules.append((glob, _type_or_keep(kind, "--layer")))
    for option, globs in (("embedding_type", EMBEDDING_GLOBS), ("output_type", OUTPUT_GLOBS)):
        kind = getattr(args, option)
        if kind is not None:
            rules += [(g, _type_or_keep(kind, "--" + option.replace("_", "-"))) for g in globs]
    return rules


def _type_or_keep(name, option):
    if name.lower() in KEEP:
        return None
    try:
        kind = quant_type(name)
        kind.require_quantizer()
    except Exception as exc:  # UnknownDTypeError or a read-only type: a bad argument either way
        raise UsageError(f"{option} {name}: {getattr(exc, 'message', exc)}") from None
    return kind.name


def selector(default, rules, quantize_1d: bool):
    """``quantize_tensors``' rules callable: (name, shape) -> type name or None."""
    def pick(name, shape):
        for glob, kind in rules:
            if fnmatch.fnmatchcase(name, glob):
                return kind
        if len(shape) < 2 and not quantize_1d:
            return None
        return default
    return pick


def _mix_or_none(name):
    """The llama.cpp mix ``--type`` names (Q4_K_M, ...), each type it uses checked."""
    try:
        found = mix(name, suffixed_only=True)
    except LayoutError as exc:  # a llama.cpp file type aprfast does not offer (Q2_K_S, IQ2_M, ...)
        raise UsageError(f"--type {name}: {exc.message}") from None
    if found is not None:
        for type_name in found.types:
            _type_or_keep(type_name, f"--type {name}: its type")
    return found


def mix_selector(types: dict, rules):
    """``quantize_tensors``' rules callable for a mix: ``rules`` first, then the mix's
    type of each tensor (its F16 fallback, for rows that are not whole 32-blocks, keeps
    the tensor as it is here)."""
    def pick(name, shape):
        for glob, kind in rules:
            if fnmatch.fnmatchcase(name, glob):
                return kind
        kind = types.get(name)
        return None if kind == "F16" else kind
    return pick


def run(args) -> int:
    if args.type is None:
        raise UsageError("--type is required (or type = \"...\" in the [quantize] section of the config file)")
    default = _mix_or_none(args.type) or _type_or_keep(args.type, "--type")
    if default is None:
        raise UsageError("--type must name a quantization type")
    rules = parse_rules(args)
    output = _output(args)
    refuse_existing(args.force, output)
    result = quantize_file(args.file, output, default, rules, args)
    if args.json:
        print_json(result)
    else:
        print(format_result(result))
    return EXIT_OK


def quantize_file(source, destination, default, rules, args) -> dict:
    """Quantize ``source`` into ``destination``; the report as a dict."""
    import aprfast

    with open_model(source, args) as f, progress_for(args, "quantizing") as progress:
        # the CRC runs over the bytes read for quantizing (no pass of its own), and is
        # compared before anything is quantized or written (issue 28 item 1)
        reader = CheckedReader(f, verify=verify_from(args))
        names = list(f.keys())
        steps = 2 * len(names)  # reading, then quantizing: one step per tensor each
        read = {}
        for done, name in enumerate(reader.order(names), 1):  # file order: the disk read front to back
            read[name] = reader.get_tensor(name)
            if progress:
                progress(done, steps)
        reader.finish()
        tensors = {name: read[name] for name in names}
        del read
        # the source's counts described its tensors: the new file's are filled below
        metadata = {k: v for k, v in (f.metadata or {}).items() if k not in ("quantization", *COUNT_KEYS)}
        if hasattr(default, "ftype"):  # a llama.cpp mix: every tensor's type from the whole model
            from ..convert import tensor_mix_types

            types = tensor_mix_types(default, [(n, v.shape) for n, v in tensors.items()], f.metadata)
            select = mix_selector(types, rules)
        else:
            types, select = None, selector(default, rules, args.quantize_1d)
        quantized, report = quantize_tensors(tensors, None, select,
                                             threads=args.threads,
                                             progress=(lambda done, _: progress(len(names) + done, steps))
                                             if progress else False)
    report = _explain_kept(report, rules, args.quantize_1d, types)
    quant_meta = report.metadata(args.layout if args.layout != "auto" else "auto")
    if quant_meta is not None:
        if "method" in quant_meta:  # apr2's free-form object: record what each tensor was (seed 002 §6.2.2)
            quant_meta["original_dtypes"] = {e.name: e.original_dtype for e in report.quantized}
        metadata["quantization"] = quant_meta
    layout = args.layout if args.layout != "auto" else ("aprender" if quant_meta and "quant_type" in quant_meta
                                                        else "apr2")
    if layout == "aprender":  # its param_count / total_size fields say what was written (issue 28 item 4)
        metadata.update(tensor_counts((element_count(v.shape), v.nbytes) for v in quantized.values()))
    aprfast.save_file(quantized, destination, metadata, layout=layout)  # temp file + rename: never half-written
    return _result(source, destination, default, layout, report)


def _explain_kept(report, rules, quantize_1d, types=None):
    """The callable rules leave "the rules callable kept it": say which rule (``types``:
    a mix's, when ``--type`` named one)."""
    from ..numerics.quantization import QuantizationReport

    entries = []
    for e in report:
        if not e.quantized and e.reason == "the rules callable kept it":
            rule = next((g for g, kind in rules if fnmatch.fnmatchcase(e.name, g)), None)
            if rule:
                why = f"--layer/type rule {rule!r} keeps it"
            elif types is not None:
                why = ("llama.cpp's mix gives it F16 (rows not whole 32-element blocks): kept"
                       if types.get(e.name) == "F16" else "llama.cpp's mix does not quantize it")
            elif e.original_dtype not in FLOAT_DTYPES:
                why = f"not floating point ({e.original_dtype})"
            else:
                why = "1-D tensor (norm or bias); --quantize-1d quantizes it"
            e = dataclasses.replace(e, reason=why)
        entries.append(e)
    return QuantizationReport(entries)


def _result(source, destination, default, layout, report) -> dict:
    quantized = report.quantized
    elements = sum(e.elements for e in quantized)
    bits = sum(e.bits_per_weight * e.elements for e in quantized) / elements if elements else None
    return {"input": str(source), "output": str(destination), "type": getattr(default, "name", default),
            "layout": layout,
            "input_bytes": os.path.getsize(source), "output_bytes": os.path.getsize(destination),
            "quantized": len(quantized), "kept": len(report.kept), "bits_per_weight": bits,
            "warnings": report.warnings, "tensors": report.as_dict()}


def format_result(result) -> str:
    lines = [f"{result['input']} -> {result['output']} ({result['layout']} layout)"]
    lines.append(f"{'tensor':<40} {'type':<10} {'bits/w':>7} {'rmse':>10} {'max err':>10} {'cosine':>8}")
    for name, t in result["tensors"].items():
        if t["type"] is None:
            lines.append(f"{name[:40]:<40} {'kept':<10} {t['original_dtype']}: {t['reason']}")
        else:
            lines.append(f"{name[:40]:<40} {t['type']:<10} {t['bits_per_weight']:>7.3f} {t['rmse']:>10.3g} "
                         f"{t['max_abs_error']:>10.3g} {t['cosine_similarity']:>8.5f}")
    bits = "-" if result["bits_per_weight"] is None else f"{result['bits_per_weight']:.3f}"
    lines.append(f"{result['quantized']} tensor(s) quantized ({bits} bits/weight), {result['kept']} kept; "
                 f"{result['input_bytes']} -> {result['output_bytes']} bytes")
    lines += [f"warning: {w}" for w in result["warnings"]]
    return "\n".join(lines)
