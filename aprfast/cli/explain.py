"""``apr explain``: an error code or error class (``apr explain E002``, ``apr explain
ValidationError``; an unknown one says "Unknown Error Code" and exits 1, never crashes),
one tensor (``apr explain --tensor NAME FILE``, with fuzzy suggestions for a name the file
lacks) or a file's architecture (``apr explain FILE``, from its tensor names)."""

from __future__ import annotations

import difflib
import os
import re
import sys

from .. import errors as _errors
from ..convert import TensorValidationError
from ..convert import names as _names
from ..convert.gate import QualityGateError
from ..errors import CODES
from ..numerics.expectations import check_expected, expectation_for
from ..numerics.stats import tensor_stats
from ..tools.text import detect_architecture
from ._common import EXIT_ERROR, EXIT_OK, UsageError, add_key_options, fmt, open_model, print_json

#: Meaning, common causes and what to do, per code (seed 001 §7 and §4.12).
ERRORS = {
    "E001": ("Invalid file format", "The bytes are not a file of a layout aprfast knows (wrong magic, unknown "
             "dtype id, a tensor name the file lacks).",
             ["Not an .apr file, or a newer format", "The file was cut off before the header"],
             ["Run `apr inspect FILE` to see what the header says", "Check the file came from an .apr writer"]),
    "E002": ("Corrupted data", "Sizes, offsets or contents of a known layout contradict each other: the bytes "
             "were damaged or written wrongly. (A file that reads intact but whose values break a rule, such as "
             "NaN weights, is E009, not E002.) `apr` exits 4 (5 when a whole-file CRC32 check finds the damage: E004).",
             ["Interrupted download", "Bit rot", "Disk error", "A writer bug"],
             ["Run `apr validate --checksum FILE` to verify", "Check the source's MD5/SHA256 and download again"]),
    "E003": ("Unsupported version", "A layout version or feature this build does not read.",
             ["File written by a newer aprender/aprfast"], ["Upgrade aprfast", "Re-export with an older format"]),
    "E004": ("Checksum mismatch", "A stored CRC32 does not match the bytes it covers: the bytes were damaged "
             "after writing (corruption, like E002). `apr` exits 5 when its whole-file check finds it.",
             ["Interrupted download or copy", "Bit rot", "Bytes edited after writing"],
             ["Run `apr validate --checksum FILE`", "Fetch the file again"]),
    "E005": ("Decryption failed", "Wrong key or password, or the ciphertext was tampered with.",
             ["Wrong password or key file", "The file was modified"],
             ["Check --password-env / --key-file", "Fetch the file again"]),
    "E006": ("Signature invalid", "A signature is missing, untrusted or does not verify (or a license "
             "refuses this use).", ["File modified after signing", "Signed by a key you do not trust"],
             ["Check --trusted-key", "Ask the publisher for the right public key"]),
    "E007": ("File I/O error", "The operating system refused a read or write.",
             ["Path does not exist", "No permission", "Disk full or failing"],
             ["Check the path and permissions", "Check free space and the kernel log"]),
    "E008": ("Out of memory", "Honouring the file would exceed a parser limit or the memory available.",
             ["A hostile or corrupt file declaring huge sizes", "A model larger than this machine"],
             ["Validate the file's origin", "Raise aprfast.Limits if the file is trusted"]),
    "E009": ("Validation failed", "The file is intact (it parses and its checksums match), but its contents "
             "break a validation rule: NaN/Inf values, statistics the tensor's role rules out, metadata sizes that "
             "disagree with the tensors, a lossy conversion drifting past its quality gate. Corruption (E002, "
             "E004) means the bytes were damaged and fetching the file again fixes it; a validation failure "
             "means the values are what the writer wrote, so fetching it again does not. `apr` exits 5.",
             ["A training run that diverged (NaN/Inf)", "A wrong export (metadata from another model)",
              "Quantization or pruning too aggressive for a tensor"],
             ["Run `apr validate FILE` (add --stats) to see every rule that fails and on which tensor",
              "Fix the model at its source, or relax the rule: `--validate relaxed`, `--max-drift X` or "
              "`--force` (aprfast.convert: validate='relaxed', max_drift=, force=True)"]),
}

#: Architectures recognised (id -> display name, purpose): the converter's detector's.
ARCHITECTURES = _names.ARCHITECTURES


def add_parser(commands) -> None:
    p = commands.add_parser("explain", help="explain an error code, a tensor, or a file's architecture")
    p.add_argument("target", nargs="?", help="an error code (E001-E009), an error class name "
                                             "(ValidationError) or a .apr file")
    p.add_argument("file", nargs="?", help="the file, when --tensor is given before it")
    p.add_argument("--tensor", metavar="NAME", help="explain one tensor of FILE")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")
    add_key_options(p)
    p.set_defaults(run=run)


def run(args) -> int:
    path = args.file or (args.target if args.tensor or _looks_like_file(args.target) else None)
    if args.tensor:
        if not path:
            raise UsageError("--tensor NAME needs a file: apr explain --tensor NAME FILE")
        return _tensor(path, args.tensor, args)
    if not args.target:
        raise UsageError("give an error code (apr explain E002), a file, or --tensor NAME FILE")
    if path:
        return _architecture(path, args)
    return _code(args.target, args)


def _looks_like_file(target) -> bool:
    return bool(target) and not re.fullmatch(r"[Ee]\d+", target) and (os.path.exists(target) or "." in target
                                                                        or os.sep in target)


def explain_code(code: str) -> dict:
    """{"code", "known", "category", "title", "description", "causes", "troubleshooting"}; for an
    error class name (``ValidationError``, ``CorruptError``...) also "class" and "is_a" (its
    aprfast error bases, so ``TensorValidationError`` says it is a ``ValidationError``)."""
    text = code.strip()
    cls = error_class(text)
    if cls is not None:
        explained = explain_code(cls.code)
        bases = [b.__name__ for b in cls.__mro__[1:] if issubclass(b, _errors.AprError) and b is not _errors.AprError]
        return {**explained, "class": cls.__name__, "is_a": bases}
    code = text.upper()
    if code not in ERRORS or code not in CODES:
        return {"code": code, "known": False, "title": "Unknown Error Code",
                "description": f"{code} is not an aprfast error code or class; known: {', '.join(CODES)}"}
    title, description, causes, steps = ERRORS[code]
    return {"code": code, "known": True, "category": CODES[code], "title": title, "description": description,
            "causes": causes, "troubleshooting": steps}


def error_class(name: str):
    """The aprfast error class called ``name`` (``aprfast.errors``' and the converter's), or None."""
    found = getattr(_errors, name, None) if name.isidentifier() else None
    if found is None:
        found = {c.__name__: c for c in (TensorValidationError, QualityGateError)}.get(name)
    return found if isinstance(found, type) and issubclass(found, _errors.AprError) else None


def _code(code, args) -> int:
    e = explain_code(code)
    if args.json:
        print_json(e)
    elif not e["known"]:
        print(f"{e['code']}: Unknown Error Code\n{e['description']}")
    else:
        lines = [f"{e['class']} is {e['code']}" + (f" (a {', a '.join(e['is_a'])})" if e["is_a"] else "")] \
            if "class" in e else []
        lines += [f"{e['code']}: {e['title']} ({e['category']})", e["description"],
                 f"- Common causes: {', '.join(e['causes'])}.", "- Troubleshooting:"]
        lines += [f"  {i}. {step}" for i, step in enumerate(e["troubleshooting"], 1)]
        print("\n".join(lines))
    return EXIT_OK if e["known"] else EXIT_ERROR


def suggest(name, names, n: int = 5) -> list:
    """Names close to ``name``: difflib's closest, then names containing it."""
    names = list(names)
    close = difflib.get_close_matches(name, names, n=n, cutoff=0.5)
    close += [c for c in names if name.lower() in c.lower() and c not in close]
    return close[:n]


def _tensor(path, name, args) -> int:
    with open_model(path, args) as f:
        if name not in f:
            close = suggest(name, f.keys())
            if args.json:
                print_json({"name": name, "found": False, "suggestions": close})
            print(f"apr explain: no tensor named {name!r} in {path}"
                  + (f"; did you mean: {', '.join(close)}?" if close else " (no similar names)"), file=sys.stderr)
            return EXIT_ERROR
        info = f.info(name)
        try:
            s = tensor_stats(f.get_tensor(name))
        except TypeError:
            s = None
    rule = expectation_for(name)
    verdict = check_expected(name, s) if s is not None else None
    report = {"name": name, "found": True, "dtype": info.dtype_name, "shape": list(info.shape),
              "nbytes": info.nbytes, "role": rule.role if rule else _guess_role(name),
              "stats": s.as_dict() if s is not None else None,
              "status": verdict.status if verdict else "-", "reasons": list(verdict.reasons) if verdict else []}
    if args.json:
        print_json(report)
        return EXIT_OK
    health = {"PASS": "Healthy", "WARN": "Suspicious", "FAIL": "Unhealthy"}.get(report["status"], "no expectation")
    lines = [f"{name}", f"- Role: {report['role']}", f"- Shape: {report['shape']} ({info.dtype_name}, "
             f"{info.nbytes} bytes)"]
    if s is not None:
        lines.append(f"- Stats: Mean {fmt(s.mean)}, Std {fmt(s.std)}, Min {fmt(s.min)}, Max {fmt(s.max)} ({health})")
    lines += [f"  {reason}" for reason in report["reasons"]]
    print("\n".join(lines))
    return EXIT_OK


def _guess_role(name) -> str:
    for pattern, role in ((r"bias$", "bias"), (r"(embed|wte|wpe)", "embedding"), (r"conv", "convolution"),
                          (r"(attn|attention)", "attention"), (r"(mlp|fc|ffn|dense|linear)", "feed-forward"),
                          (r"(norm|ln)", "normalisation")):
        if re.search(pattern, name):
            return role
    return "unknown"


def _architecture(path, args) -> int:
    with open_model(path, args) as f:
        names = f.keys()
        metadata = f.metadata or {}
        params = 0
        for name in names:
            shape = f.info(name).shape
            count = 1
            for d in shape:
                count *= d
            params += count
    found = detect_architecture(names, metadata)
    report = {"file": path, "tensors": len(names), "parameters": params,
              **(found or {"architecture": None, "purpose": None})}
    if args.json:
        print_json(report)
        return EXIT_OK
    if found:
        print(f"This is a {found['architecture']} model.\n- Purpose: {found['purpose']}")
    else:
        print("The architecture is not one aprfast recognises from tensor names.")
    print(f"- Tensors: {len(names)}\n- Parameters: {params:,}")
    return EXIT_OK
