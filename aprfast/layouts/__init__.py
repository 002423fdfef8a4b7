"""One module per on-disk layout; this package picks the one a file or a write needs.

* :mod:`.aprender` - ``APR\\0``, the v2 container as aprender writes it.
* :mod:`.apr2` - ``APR2``, the v2 container as the APR 2.0 spec describes it.
* :mod:`.v1` - ``APRN``, the v1 model container (read and written through :mod:`aprfast.v1`).
"""

from __future__ import annotations

from ..errors import FormatError, LayoutError
from . import apr2, aprender, v1

__all__ = ["LAYOUTS", "detect", "is_v1", "plan"]

LAYOUTS = {aprender.NAME: aprender, apr2.NAME: apr2}
_BY_MAGIC = {aprender.MAGIC: aprender, apr2.MAGIC: apr2}
# Magics of other .apr generations, so a reader can say what it was given.
_KNOWN_OTHERS = {v1.MAGIC: "a v1 APRN model container: read it with aprfast.v1.load_model()",
                 b"APR1": "a historical APR1 file, which this build does not read"}


def detect(source):
    """The layout module for a source, by its magic bytes."""
    if source.size < 4:
        raise FormatError(f"file is {source.size} bytes, too short to hold a magic number", path=source.path)
    magic = bytes(source.read(0, 4, "magic"))
    layout = _BY_MAGIC.get(magic)
    if layout is None:
        what = _KNOWN_OTHERS.get(magic)
        detail = f"; it is {what}" if what else ""
        raise FormatError(f"magic {magic!r} is not a v2 tensor container (APR\\0 or APR2){detail}",
                          path=source.path)
    return layout


def is_v1(source) -> bool:
    """True when the source starts with the v1 container's magic."""
    return source.size >= 4 and bytes(source.read(0, 4, "magic")) == v1.MAGIC


def plan(inputs, metadata, *, layout: str = "auto", alignment: int = 64):
    """A write plan in ``layout``; "auto" prefers aprender's layout, so files stay readable
    by aprender, and falls back to the spec layout only when aprender's can't hold the request."""
    if layout == "auto":
        try:
            return aprender.plan(inputs, metadata, alignment=alignment)
        except LayoutError:
            return apr2.plan(inputs, metadata, alignment=alignment)
    try:
        module = LAYOUTS[layout]
    except KeyError:
        raise LayoutError(f"unknown layout {layout!r}; choose one of auto, {', '.join(LAYOUTS)}") from None
    return module.plan(inputs, metadata, alignment=alignment)
