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

    Examples:
        >>> from aprfast.tools.text import fmt
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

    Args:
        shape: A tuple or list of ints.

    Returns:
        The text.

    Examples:
        >>> from aprfast.tools.text import shape_text
        >>> shape_text((2, 3)), shape_text(())
        ('2x3', 'scalar')
    """
    return "x".join(str(d) for d in shape) or "scalar"


def similarity_text(value: float) -> str:
    """A percentage that reads 100.00% only when it is exactly 100%.

    Args:
        value: A fraction, 0 to 1.

    Returns:
        The text, two decimals.

    Examples:
        >>> from aprfast.tools.text import similarity_text
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

    Returns:
        A dict, or None when no architecture is recognised.

    Examples:
        >>> from aprfast.tools.text import detect_architecture
        >>> detect_architecture(["model.layers.0.self_attn.q_proj.weight",
        ...                      "model.layers.0.mlp.up_proj.weight"])["id"]
        'llama'
        >>> detect_architecture(["blk.0.attn_q.weight"], {"general.architecture": "bert"})["architecture"]
        'BERT'
        >>> detect_architecture(["w"]) is None
        True
    """
    found = _names.detect_arch(names, metadata)
    if found is None:
        return None
    display, purpose = _names.ARCHITECTURES[found]
    return {"architecture": display, "purpose": purpose, "id": found}
