"""``apr import SRC DST``: a safetensors file, sharded checkpoint or GGUF file into
``.apr`` (seed 001 §4.7, §13.2); ``apr convert`` with the destination fixed to .apr.
Remote sources (``hf://``, ``https://``) are not fetched: download them first."""

from __future__ import annotations

from . import convert
from ._common import UsageError


def add_parser(commands) -> None:
    p = commands.add_parser("import", help="import a .safetensors or .gguf model into .apr")
    convert.add_conversion_arguments(p, source_help="a .safetensors (file, index or directory) or .gguf file")
    p.set_defaults(run=run)


def run(args) -> int:
    if "://" in args.source:
        raise UsageError(f"{args.source}: remote sources are not fetched by apr; download the files and import "
                         "the local path")
    return convert.run(args, to="apr", verb="import")
