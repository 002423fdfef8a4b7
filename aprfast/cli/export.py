"""``apr export SRC DST``: an ``.apr`` model out to safetensors or GGUF (seed 001
§4.6); ``apr convert`` with the source required to be .apr.  ``--format`` names the
destination format when its extension does not (ONNX and TorchScript are not written)."""

from __future__ import annotations

from . import convert
from ._common import UsageError


def add_parser(commands) -> None:
    p = commands.add_parser("export", help="export a .apr model to .safetensors or .gguf")
    convert.add_conversion_arguments(p, source_help="a .apr file")
    p.add_argument("--format", dest="to", choices=("safetensors", "gguf", "burnpack"),
                   help="destination format (default: from the destination's extension)")
    p.set_defaults(run=run)


def run(args) -> int:
    from ..convert import detect

    kind = detect(args.source)
    if kind != "apr":
        raise UsageError(f"{args.source} is a {kind} file, not .apr: use apr import or apr convert")
    if args.to is None and convert.output_path(args).endswith(".apr"):
        raise UsageError("export writes .safetensors or .gguf; for .apr to .apr use apr convert")
    return convert.run(args, verb="export")
