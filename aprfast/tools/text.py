"""What the command line and the TUI both print: numbers, shapes, similarity and the
architecture of a model, formatted one way for both (they live here, below ``cli/`` and
``tui/``, so that neither imports the other)."""

from __future__ import annotations

from ..convert import names as _names

__all__ = ["fmt", "shape_text", "similarity_text", "detect_architecture"]


def fmt(value) -> str:
    """A number for humans: ints as they are, floats to 4 significant digits.

    Args:
        value: an int, a float or None.

    Returns:
        The text; ``"-"`` for None.

    Example:
        >>> fmt(3.14159265), fmt(12), fmt(None)
        ('3.142', '12', '-')
    """
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def shape_text(shape) -> str:
    """A shape as ``2x3``; ``scalar`` for ``()``.

    Example:
        >>> shape_text((2, 3)), shape_text(())
        ('2x3', 'scalar')
    """
    return "x".join(str(d) for d in shape) or "scalar"


def similarity_text(value: float) -> str:
    """A percentage that reads 100.00% only when it is exactly 100%.

    Example:
        >>> similarity_text(1.0), similarity_text(0.999999)
        ('100.00%', '>99.99%')
    """
    text = f"{value * 100:.2f}%"
    return ">99.99%" if text == "100.00%" and value < 1.0 else text


def detect_architecture(names, metadata=None) -> dict | None:
    """``{"architecture", "purpose", "id"}`` of the model, or None: the detector
    ``aprfast.convert(arch="auto")`` uses (GGUF's ``general.architecture``, else the
    tensor names, in any of the namings it maps).

    Args:
        names: the model's tensor names.
        metadata: its metadata (a GGUF's ``general.architecture`` decides first).

    Example:
        >>> detect_architecture(["model.embed_tokens.weight", "lm_head.weight"])["id"]
        'llama'
    """
    found = _names.detect_arch(names, metadata)
    if found is None:
        return None
    display, purpose = _names.ARCHITECTURES[found]
    return {"architecture": display, "purpose": purpose, "id": found}
