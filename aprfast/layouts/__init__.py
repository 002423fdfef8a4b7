"""One module per on-disk layout; this package picks the one a file or a write needs.

* :mod:`.aprender` - ``APR\\0``, the v2 container as aprender writes it.
* :mod:`.apr2` - ``APR2``, the v2 container as the APR 2.0 spec describes it.
* :mod:`.v1` - ``APRN``, the v1 model container (read and written through :mod:`aprfast.v1`).
* :mod:`.apr1` - ``APR1``, aprender's historical JSON-indexed layout (read only).
"""

from __future__ import annotations

from ..errors import FormatError, LayoutError
from . import apr1, apr2, aprender, v1
from ._common import MAX_RESERVE, align, check_reserve, find_aliases

__all__ = ["LAYOUTS", "MAX_RESERVE", "LayoutChangeWarning", "align", "caller_metadata", "check_reserve", "detect",
           "is_v1", "plan", "warn_layout_change"]


class LayoutChangeWarning(UserWarning):
    """An operation wrote the APR2 (spec) layout from a file in aprender's layout
    (``APR\\0``): signing, encrypting or compressing need the APR2 security block or
    per-tensor codecs, which aprender's layout has not, and aprender reads only its own
    layout, so the new file is one aprender will not read (issue 28 item 8).  ``apr``
    prints it as a line on stderr.

    Examples:
        >>> import warnings, numpy as np, aprfast
        >>> from aprfast.tools.protection import sign_file
        >>> aprfast.save_file({"w": np.zeros(2, np.float32)}, "m.apr")  # aprender's layout
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     _ = sign_file("m.apr", bytes(32), output="signed.apr")
        >>> [type(w.message).__name__ for w in caught]
        ['LayoutChangeWarning']
    """


def warn_layout_change(source, output, why: str, stacklevel: int = 3) -> None:
    """Warn (:class:`LayoutChangeWarning`) that ``output`` is APR2 where ``source`` was
    in aprender's layout, saying ``why`` and what aprender will not read.

    Args:
        source: The input's path.
        output: The path written.
        why: What needs the APR2 layout ("a signature", "encryption", ...).
        stacklevel: For :func:`warnings.warn`.
    """
    import warnings

    warnings.warn(f"{source} is in aprender's layout (APR\\0); {why} needs the APR2 layout, so {output} is APR2, "
                  "which aprender does not read (its readers take APR\\0 files only)", LayoutChangeWarning,
                  stacklevel=stacklevel)

#: The layouts aprfast writes (``layout=`` of save_file and plan).
LAYOUTS = {aprender.NAME: aprender, apr2.NAME: apr2}
# Every layout read as a tensor container; APR1 is read only, so it is not in LAYOUTS.
_READ = {**LAYOUTS, apr1.NAME: apr1}
_BY_MAGIC = {aprender.MAGIC: aprender, apr2.MAGIC: apr2, apr1.MAGIC: apr1}
# Magics of other .apr generations, so a reader can say what it was given.
_KNOWN_OTHERS = {v1.MAGIC: "a v1 APRN model container: read it with aprfast.v1.load_model()"}


#: Formats aprfast converts but does not open as a tensor container: the magic says which,
#: so the error can name the format and the command that converts it (issue 28).
_CONVERTIBLE = {b"GGUF": "GGUF", b"NRUB": "Burnpack", b"MLE\0": "MLE", b"PK\x03\x04": "PyTorch (a torch.save zip)",
                b"\x80\x02\x8a\x0a": "PyTorch (a legacy torch.save pickle)"}
_CONVERT_HINT = ("convert it first: `apr import {path} --output model.apr` or "
                 "aprfast.convert({path!r}, 'model.apr')")


def _foreign_format(head: bytes, size: int) -> str | None:
    """The name of a format aprfast converts, recognised from a file's first 16 bytes."""
    for magic, name in _CONVERTIBLE.items():
        if head.startswith(magic):
            return name
    # safetensors: a little-endian u64 header length, then the JSON header's "{"
    if len(head) >= 9 and head[8:9] == b"{" and 2 <= int.from_bytes(head[:8], "little") <= size - 8:
        return "safetensors"
    return None


def detect(source):
    """The layout module for a source, by its magic bytes.

    Args:
        source: an :class:`aprfast.io.sources.Source`.

    Returns:
        The layout module (:mod:`~aprfast.layouts.aprender`, :mod:`~aprfast.layouts.apr2`
        or :mod:`~aprfast.layouts.apr1`).

    Raises:
        FormatError: the file is too short, or another format; the message names the
            format when aprfast converts it (GGUF, safetensors, PyTorch, Burnpack, MLE) and
            how to convert it, or says it is a v1 container.
    """
    if source.size < 4:
        raise FormatError(f"file is {source.size} bytes, too short to hold a magic number", path=source.path)
    magic = bytes(source.read(0, 4, "magic"))
    layout = _BY_MAGIC.get(magic)
    if layout is None:
        what = _KNOWN_OTHERS.get(magic)
        if what is None:
            head = bytes(source.read(0, min(16, source.size), "magic"))
            foreign = _foreign_format(head, source.size)
            if foreign is not None:
                path = source.path or "FILE"
                what = f"a {foreign} file, not an .apr tensor container: " + _CONVERT_HINT.format(path=str(path))
        detail = f"; it is {what}" if what else ""
        raise FormatError(f"magic {magic!r} is not a tensor container (APR\\0, APR2 or APR1){detail}",
                          path=source.path)
    return layout


def caller_metadata(parsed) -> dict:
    """A parsed file's metadata as its writer's caller gave it (each layout adds keys of
    its own: aprender's typed defaults, APR2's ``apr_version``)."""
    return _READ[parsed.layout].caller_metadata(parsed.metadata)


def has_shared_storage(inputs) -> bool:
    """True when two inputs are one storage (tied weights)."""
    return bool(find_aliases(inputs))


def is_v1(source) -> bool:
    """True when the source starts with the v1 container's magic."""
    return source.size >= 4 and bytes(source.read(0, 4, "magic")) == v1.MAGIC


def plan(inputs, metadata, *, layout: str = "auto", alignment: int = 64, in_given_order: bool = False,
         compression: str | None = None, compression_level: int | None = None, security=None, reserve: int = 0):
    """A write plan in ``layout``; "auto" prefers aprender's layout, so files stay readable
    by aprender, and falls back to the spec layout only when aprender's can't hold the request.
    ``in_given_order`` lays the data out in the order of ``inputs`` (a planned Writer)
    instead of index (name) order; the index is sorted either way.  ``compression``
    ("lz4", "zstd") exists only in the spec layout: "auto" then means apr2, and
    "aprender" is refused.  ``security`` (aprfast.security.SecurityOptions: encryption,
    signing, digests) likewise exists only in the spec layout.  ``reserve`` (bytes, 0:
    none) leaves room before the data for in-place edits (docs/FORMAT.md §5.2)."""
    if security is not None:
        if layout not in ("auto", apr2.NAME):
            raise LayoutError(f"encryption and signing need the apr2 layout; the {layout!r} layout has neither "
                              "(use layout='auto' or 'apr2')")
        if compression is None and compression_level is not None:
            raise LayoutError("compression_level was given without a compression")
        return apr2.plan(inputs, metadata, alignment=alignment, in_given_order=in_given_order,
                         compression=compression, compression_level=compression_level, security=security,
                         reserve=reserve)
    if compression is not None or compression_level is not None:
        if compression is None:
            raise LayoutError("compression_level was given without a compression")
        if layout not in ("auto", apr2.NAME):
            raise LayoutError(f"compression={compression!r} needs the apr2 layout; the {layout!r} layout has no "
                              "per-tensor codec (use layout='auto' or 'apr2')")
        return apr2.plan(inputs, metadata, alignment=alignment, in_given_order=in_given_order,
                         compression=compression, compression_level=compression_level, reserve=reserve)
    if layout == "auto":
        if not in_given_order and has_shared_storage(inputs):
            # aprender's layout stores every name's bytes (as aprender would); the spec
            # layout stores one storage once under all its names
            return apr2.plan(inputs, metadata, alignment=alignment, reserve=reserve)
        try:
            return aprender.plan(inputs, metadata, alignment=alignment, in_given_order=in_given_order,
                                 reserve=reserve)
        except LayoutError:
            return apr2.plan(inputs, metadata, alignment=alignment, in_given_order=in_given_order, reserve=reserve)
    try:
        module = LAYOUTS[layout]
    except KeyError:
        raise LayoutError(f"unknown layout {layout!r}; choose one of auto, {', '.join(LAYOUTS)}") from None
    return module.plan(inputs, metadata, alignment=alignment, in_given_order=in_given_order, reserve=reserve)
