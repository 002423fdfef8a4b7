"""``apr import SRC DST``: a safetensors file, sharded checkpoint or GGUF file into
``.apr`` (seed 001 §4.7, §13.2); ``apr convert`` with the destination fixed to .apr.
Remote sources (``hf://``, ``https://``) are not fetched: download them first.

The destination is DST, ``-o`` or ``--output``; ``--from FORMAT`` (seed 001 §13.2:
``apr import model.safetensors --from safetensors --output model.apr``) states the
source's format, which is checked against its bytes: a source of another format is a
usage error (exit 2), nothing written."""

from __future__ import annotations

from . import convert
from ._common import UsageError


def add_parser(commands) -> None:
    p = commands.add_parser("import", help="import a .safetensors or .gguf model into .apr")
    convert.add_conversion_arguments(p, source_help="a .safetensors (file, index or directory) or .gguf file")
    p.add_argument("--from", dest="source_format", choices=SOURCE_FORMATS, metavar="FORMAT",
                   help=f"the source's format ({', '.join(SOURCE_FORMATS)}), checked against its bytes "
                        "(default: detected)")
    p.set_defaults(run=run)


#: ``--from`` choices: the formats aprfast.convert reads (a sharded safetensors
#: checkpoint is "safetensors").
SOURCE_FORMATS = ("safetensors", "gguf", "pytorch", "onnx", "burnpack", "mle", "apr")


def run(args) -> int:
    if "://" in args.source:
        raise UsageError(f"{args.source}: remote sources are not fetched by apr; download the files and import "
                         "the local path")
    if getattr(args, "source_format", None):
        _check_source_format(args.source, args.source_format)
    return convert.run(args, to="apr", verb="import")


def _check_source_format(source: str, stated: str) -> None:
    """Refuse a source whose bytes are not the ``--from`` format (an unreadable or
    unknown source is left to the conversion, which says why)."""
    from ..convert import detect
    from ..errors import AprError

    try:
        found = detect(source)
    except (AprError, OSError):
        return
    if found is None:
        return
    if found == "safetensors-sharded":
        found = "safetensors"
    if found != stated:
        raise UsageError(f"--from {stated}, but {source} is {found} (detected from its bytes)")
