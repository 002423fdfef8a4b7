"""What seed 001 §10.9 expects of a tensor's statistics, by its name: the one rule table
behind ``apr tensors --stats``, ``apr validate --stats``, ``apr explain --tensor``, the
quality score (items 26-30) and the inline validation of ``aprfast.convert``.

A rule matches names with ``fnmatch`` (case-sensitive), first match wins.  The verdict of
:func:`check_expected` is FAIL for what the seed says must not be written (NaN or Inf
anywhere, §13.6; a LayerNorm weight mean outside [0.5, 3.0] or bias mean outside
[-0.5, 0.5], §10.9's "Acceptable Range"), WARN for what it only expects (attention,
linear and embedding std ranges, "mean ~0.0", QA #30's embedding std < 0.2), PASS when
a rule matched and held, and "-" when no rule names the tensor.

The std ranges are rules of thumb from initialisation (``initializer_range`` 0.02), so
they are compared with a tolerance (:data:`STD_TOLERANCE`, relative): the std of a
tensor drawn from N(0, 0.02) sits just below 0.02 about half the time (0.0199 is
normal, not a warning), and a normal truncated at two sigmas has 0.88 of the sigma.
Values are compared unrounded; a reason prints enough digits to show which side of
the bound the value is on.  Each reason comes with its rule (``Verdict.rules``), so a
report can count tensors per rule instead of listing every one.
docs/guide/statistics.md ("Tensor statistics") shows it in use.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field

from .stats import tensor_stats

__all__ = ["Expectation", "EXPECTATIONS", "NEAR_ZERO_MEAN", "STD_TOLERANCE", "expectation_for", "Verdict",
           "check_expected", "check_value", "count_by_rule"]


@dataclass(frozen=True)
class Expectation:
    """What §10.9 expects of tensors whose name matches ``pattern`` (fnmatch).

    Examples:
        >>> from aprfast.numerics.expectations import Expectation, expectation_for
        >>> expectation_for("encoder.layer_norm.weight").mean_range
        (0.5, 3.0)
        >>> Expectation("my role", "*.scale", std_max=1.0).std_max
        1.0
    """

    role: str
    pattern: str
    mean_range: tuple | None = None
    std_range: tuple | None = None
    std_max: float | None = None


_LN_WEIGHT, _LN_BIAS = (0.5, 3.0), (-0.5, 0.5)

#: First match wins.  LayerNorm ranges are the seed's "acceptable range" (outside: FAIL);
#: linear and embedding std ranges are its "expected std" (outside: WARN), and the QA
#: checklist's embedding std < 0.2 (#30, "should warn") warns above it.  The canonical
#: names of aprfast.convert.names are covered, and so are Hugging Face's BERT
#: ``LayerNorm`` and llama.cpp's ``*_norm`` / ``token_embd`` names.
EXPECTATIONS = (
    Expectation("layernorm weight", "*layer_norm*.weight", mean_range=_LN_WEIGHT),
    Expectation("layernorm weight", "*layernorm*.weight", mean_range=_LN_WEIGHT),
    Expectation("layernorm weight", "*LayerNorm.weight", mean_range=_LN_WEIGHT),
    Expectation("layernorm weight", "*ln*.weight", mean_range=_LN_WEIGHT),
    Expectation("layernorm weight", "*norm.weight", mean_range=_LN_WEIGHT),
    Expectation("layernorm bias", "*layer_norm*.bias", mean_range=_LN_BIAS),
    Expectation("layernorm bias", "*layernorm*.bias", mean_range=_LN_BIAS),
    Expectation("layernorm bias", "*LayerNorm.bias", mean_range=_LN_BIAS),
    Expectation("layernorm bias", "*ln*.bias", mean_range=_LN_BIAS),
    Expectation("layernorm bias", "*norm.bias", mean_range=_LN_BIAS),
    Expectation("attention weight", "*[qkv]_proj.weight", std_range=(0.02, 0.10)),
    Expectation("attention weight", "*out_proj.weight", std_range=(0.02, 0.10)),
    Expectation("linear weight", "*fc[12].weight", std_range=(0.02, 0.05)),
    Expectation("token embedding", "*token_embedding*", std_range=(0.02, 0.05), std_max=0.2),
    Expectation("token embedding", "*embed_tokens*", std_range=(0.02, 0.05), std_max=0.2),
    Expectation("token embedding", "*word_embeddings*", std_range=(0.02, 0.05), std_max=0.2),
    Expectation("token embedding", "token_embd.weight", std_range=(0.02, 0.05), std_max=0.2),
    Expectation("positional embedding", "*positional_embedding*", std_range=(0.01, 0.02), std_max=0.2),
    Expectation("positional embedding", "*embed_positions*", std_range=(0.01, 0.02), std_max=0.2),
)

#: |mean| above this for attention/linear weights and embeddings ("mean ~0.0") warns.
NEAR_ZERO_MEAN = 0.1
#: The std ranges' bounds are widened by this fraction of themselves before comparing
#: (0.02-0.10 accepts 0.017-0.115): sampling and truncated initialisation put a normal
#: model's std a little off the round numbers (issue 28 item 4).
STD_TOLERANCE = 0.15


def expectation_for(name: str) -> Expectation | None:
    """The §10.9 rule for a tensor name, or None when the seed expects nothing of it.

    Args:
        name: A tensor name.

    Returns:
        The first :class:`Expectation` of :data:`EXPECTATIONS` whose pattern matches, or None.

    Examples:
        >>> from aprfast.numerics.expectations import expectation_for
        >>> expectation_for("model.embed_tokens.weight").role, expectation_for("lm_head.scale")
        ('token embedding', None)
    """
    for rule in EXPECTATIONS:
        if fnmatch.fnmatchcase(name, rule.pattern):
            return rule
    return None


@dataclass(frozen=True)
class Verdict:
    """``status`` is PASS, WARN, FAIL or "-" (no rule); ``reasons`` say why (failures
    first, each with the numbers).  Made by :func:`check_expected`.

    Examples:
        >>> from aprfast.numerics.expectations import Verdict
        >>> Verdict("PASS", "layernorm weight").reasons
        ()
    """

    status: str
    role: str | None
    reasons: tuple = ()
    #: the rule each reason comes from, without the tensor's numbers ("attention weight:
    #: std outside 0.02-0.1"), one per reason: what reports count tensors by
    rules: tuple = field(default=(), repr=False, compare=False)


def _shown(value: float, bound: float) -> str:
    """``value`` with enough digits that it does not print as ``bound``."""
    for digits in (4, 6, 8):
        text = f"{value:.{digits}g}"
        if float(text) != bound:
            return text
    return repr(value)


def _outside(value: float, low: float, high: float) -> bool:
    return not low * (1 - STD_TOLERANCE) <= value <= high * (1 + STD_TOLERANCE)


def check_expected(name: str, stats) -> Verdict:
    """PASS / WARN / FAIL for one tensor's :class:`aprfast.stats.TensorStats` against
    §10.9.  NaN or Inf anywhere is FAIL, whatever the name.

    Args:
        name: The tensor's name (picks the rule).
        stats: Its :class:`aprfast.stats.TensorStats`.

    Returns:
        A :class:`Verdict`.

    Examples:
        >>> import numpy as np
        >>> from aprfast.stats import tensor_stats
        >>> from aprfast.numerics.expectations import check_expected
        >>> check_expected("encoder.layer_norm.weight", tensor_stats(np.full(8, 11, np.float32)))
        Verdict(status='FAIL', role='layernorm weight', reasons=('mean 11 outside [0.5, 3.0]',))
        >>> check_expected("anything", tensor_stats(np.float32([1, np.nan]))).status
        'FAIL'
    """
    rule = expectation_for(name)
    fails, warns = [], []  # (reason, rule)
    if stats.nan_count or stats.inf_count:
        fails.append((f"{stats.nan_count} NaN, {stats.inf_count} Inf in {stats.count} values", "NaN or Inf"))
    if rule is not None and stats.mean is not None:
        role = rule.role
        if rule.mean_range is not None and not rule.mean_range[0] <= stats.mean <= rule.mean_range[1]:
            low, high = rule.mean_range
            shown = _shown(stats.mean, low if stats.mean < low else high)
            fails.append((f"mean {shown} outside [{low}, {high}]", f"{role}: mean outside [{low}, {high}]"))
        if rule.std_max is not None and stats.std > rule.std_max * (1 + STD_TOLERANCE):
            warns.append((f"std {_shown(stats.std, rule.std_max)} above {rule.std_max}",
                          f"{role}: std above {rule.std_max}"))
        elif rule.std_range is not None and _outside(stats.std, *rule.std_range):
            low, high = rule.std_range
            shown = _shown(stats.std, low if stats.std < low else high)
            warns.append((f"std {shown} outside the expected {low}-{high}",
                          f"{role}: std outside the expected {low}-{high}"))
        if rule.std_range is not None and abs(stats.mean) > NEAR_ZERO_MEAN:
            warns.append((f"mean {stats.mean:.4g}, expected ~0.0", f"{role}: mean not ~0.0"))
    role = rule.role if rule is not None else None
    if fails:
        found = fails + warns
        return Verdict("FAIL", role, tuple(r for r, _ in found), tuple(k for _, k in found))
    if warns:
        return Verdict("WARN", role, tuple(r for r, _ in warns), tuple(k for _, k in warns))
    return Verdict("PASS" if rule is not None else "-", role, ())


def count_by_rule(verdicts) -> list:
    """``[(rule, [tensor names])]``, most tensors first, of ``(name, Verdict)`` pairs:
    one line per rule in a report instead of one per tensor (``--verbose`` lists them).

    Args:
        verdicts: ``(name, Verdict)`` pairs (any status; PASS and "-" add nothing).

    Returns:
        A list of ``(rule, names)``.

    Examples:
        >>> import numpy as np
        >>> from aprfast.stats import tensor_stats
        >>> from aprfast.numerics.expectations import check_expected, count_by_rule
        >>> flat = tensor_stats(np.full(8, 0.5, np.float32))
        >>> count_by_rule([(n, check_expected(n, flat)) for n in ("a.q_proj.weight", "a.k_proj.weight")])
        [('attention weight: std outside the expected 0.02-0.1', ['a.q_proj.weight', 'a.k_proj.weight']), \
('attention weight: mean not ~0.0', ['a.q_proj.weight', 'a.k_proj.weight'])]
    """
    groups = {}
    for name, verdict in verdicts:
        for rule in verdict.rules:
            groups.setdefault(rule, []).append(name)
    return sorted(groups.items(), key=lambda item: -len(item[1]))


def check_value(name: str, value, *, threads: int = 0):
    """``(stats, verdict)`` of one tensor value (an array, RawTensor or QuantizedTensor)
    in one pass of :func:`aprfast.stats.tensor_stats`; ``stats`` is None (verdict "-",
    the reason given) for dtypes without statistics (complex, unknown ids).

    Args:
        name: The tensor's name (picks the rule).
        value: An array, a :class:`aprfast.RawTensor` or a :class:`aprfast.QuantizedTensor`.
        threads: Threads for the statistics engine (0: every core).

    Returns:
        ``(stats, verdict)``: a :class:`aprfast.stats.TensorStats` (or None) and a :class:`Verdict`.

    Examples:
        >>> import numpy as np
        >>> from aprfast.numerics.expectations import check_value
        >>> stats, verdict = check_value("model.embed_tokens.weight", np.full((4, 4), 0.5, np.float32))
        >>> stats.mean, verdict.status, verdict.reasons
        (0.5, 'WARN', ('std 0 outside the expected 0.02-0.05', 'mean 0.5, expected ~0.0'))
        >>> check_value("x", np.zeros(2, np.complex64))[1].status
        '-'
    """
    try:
        stats = tensor_stats(value, threads=threads)
    except TypeError as exc:
        return None, Verdict("-", None, (str(exc),))
    return stats, check_expected(name, stats)
