"""Progress of long calls (issue 28 item 5): one plain line on a terminal's stderr.

The long library calls (:func:`aprfast.convert`, :func:`aprfast.quantize_tensors`,
:func:`aprfast.tools.diff.diff_models`, :func:`aprfast.tools.merge.merge_models`,
:func:`aprfast.tools.quality.quality_report`) take ``progress=`` and resolve it with
:func:`progress_to`:

* ``None`` (the default) or ``True``: a plain line on ``sys.stderr`` when it is a
  terminal, and only once the call has run :attr:`PlainProgress.DELAY` seconds (1 s): a
  quick call prints nothing, and a pipe, a log file, a notebook (whose stderr is no
  terminal) or a service never see a byte.  A library writing to stderr unasked is
  hostile in pipelines; one that sits silent for a minute on a terminal looks hung, so
  the default is the one a person watching would want and nobody else notices;
* ``False``: nothing;
* a callable: called as ``progress(done, total)`` (the unit is the call's: bytes for
  ``convert``, tensors for the others), nothing printed.

The ``apr`` command draws its own (rich's bar when installed) and passes its callback, or
``False`` under ``--quiet``/``--json``; it adds a hint that ``aprfast[cli]`` draws a full
bar, which a library call does not print.
"""

from __future__ import annotations

import contextlib
import sys
import time

__all__ = ["PlainProgress", "progress_to"]


class PlainProgress:
    """``description: 42% (3 s)`` rewritten in place on a stream (``\\r``), only once
    :attr:`DELAY` seconds have passed (quick calls print nothing) and at most every
    :attr:`INTERVAL` seconds; cleared at the end.  ``hint``, when given, is printed on
    its own line the first time a progress line is shown in the process.

    Args:
        description: What runs, the start of the line ("convert model.apr").
        hint: A line printed once per process above the first progress line, or None.
        stream: Where to write (default: ``sys.stderr`` at ``__enter__``).

    Returns:
        As a context manager, the ``update(done, total)`` callable.

    Example::

        with PlainProgress("convert model.apr") as progress:
            progress(done_bytes, total_bytes)

    Examples:
        >>> import io
        >>> out = io.StringIO()
        >>> PlainProgress.DELAY, saved = 0.0, PlainProgress.DELAY
        >>> with PlainProgress("work", stream=out) as progress:
        ...     progress(1, 4); progress(4, 4)
        >>> PlainProgress.DELAY = saved
        >>> "work: 100%" in out.getvalue(), out.getvalue().endswith("\\r\\x1b[K")
        (True, True)
    """

    #: Seconds a call runs before its first line is shown.
    DELAY = 1.0
    #: Shortest time between two redraws, in seconds.
    INTERVAL = 0.1
    hinted = False  # the hint, once per process

    def __init__(self, description: str, *, hint=None, stream=None):
        self.description = description
        self.hint = hint
        self.stream = stream

    def __enter__(self):
        if self.stream is None:
            self.stream = sys.stderr
        self._start = time.monotonic()
        self._last = None
        return self.update

    def update(self, done, total) -> None:
        """Redraw the line for ``done`` of ``total`` (a count when ``total`` is 0 or None)."""
        now = time.monotonic()
        finished = bool(total) and done >= total  # the last step is always shown
        if now - self._start < self.DELAY or (self._last is not None and now - self._last < self.INTERVAL
                                               and not finished):
            return
        if self.hint and not PlainProgress.hinted:
            PlainProgress.hinted = True
            self.stream.write(self.hint + "\n")
        self._last = now
        share = f"{100 * done / total:.0f}%" if total else f"{done}"
        self.stream.write(f"\r{self.description}: {share} ({now - self._start:.0f} s)\x1b[K")
        self.stream.flush()

    def __exit__(self, *exc_info):
        if self._last is not None:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
        return False


def progress_to(progress, description: str):
    """The ``progress=`` argument of a long call, as a context manager giving a
    ``progress(done, total)`` callable or None.

    Args:
        progress: None or True (a :class:`PlainProgress` line on ``sys.stderr`` if it is a
            terminal, else nothing), False (nothing) or a callable (given back as it is).
        description: The start of the line ("aprfast.convert model.apr").

    Returns:
        A context manager; ``with progress_to(progress, "...") as update:`` gives a
        callable to call after each step, or None when nothing is to be reported.

    Raises:
        TypeError: ``progress`` is none of the above.

    Examples:
        >>> seen = []
        >>> with progress_to(lambda done, total: seen.append((done, total)), "work") as update:
        ...     update(1, 2); update(2, 2)
        >>> seen
        [(1, 2), (2, 2)]
        >>> with progress_to(False, "work") as update:
        ...     update is None
        True
    """
    if progress is False:
        return contextlib.nullcontext(None)
    if progress is None or progress is True:
        stream = sys.stderr
        if stream is None or not _isatty(stream):
            return contextlib.nullcontext(None)
        return PlainProgress(description, stream=stream)
    if callable(progress):
        return contextlib.nullcontext(progress)
    raise TypeError(f"progress= takes None, True, False or a callable(done, total), not {type(progress).__name__}")


def _isatty(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):  # a closed or odd stream: no terminal
        return False
