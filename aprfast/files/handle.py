"""The one protocol every open aprfast object shares (:class:`Handle`): ``close`` and
``closed``, the context manager, pickling as the arguments that opened it, a ``repr``
that says what is open, and the "file is closed" error.

:class:`~aprfast.files.reader.AprFile`, :class:`~aprfast.files.shards.ShardedFile`,
:class:`~aprfast.v1.reader.V1File` and :class:`~aprfast.stream.TensorStream` derive from
it, so the protocol is written once.  :class:`TensorMapping` adds the read-only mapping
protocol (``keys``, ``in``, ``len``, iteration over names) of the three file handles.
"""

from __future__ import annotations

from ..errors import AprIOError
from ..io import pickling


class Handle:
    """Base of every open aprfast object.

    Subclasses provide :meth:`close`, :attr:`closed` and, for ``repr``,
    :meth:`_describe` (what is open, e.g. the path) and :meth:`_state` (what it holds).

    Examples:
        >>> import aprfast, numpy as np
        >>> blob = aprfast.save({"w": np.zeros(2, np.float32)})
        >>> with aprfast.open(blob) as f:
        ...     f.closed
        False
        >>> f.closed
        True
    """

    #: set by the opener: where the handle's bytes come from (None for a buffer)
    path = None

    def close(self) -> None:
        """Release the file (idempotent); views already handed out stay valid."""
        raise NotImplementedError

    @property
    def closed(self) -> bool:
        """True once :meth:`close` ran."""
        raise NotImplementedError

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __reduce__(self):
        # pickles as the path/URL and arguments that opened it: the other side reopens it
        # (aprfast.io.pickling says what may travel); one opened from bytes is refused
        return pickling.reduce_handle(self)

    def __repr__(self):
        state = "closed" if self.closed else self._state()
        return f"<aprfast.{type(self).__name__} {self._describe()} {state}>"

    def _describe(self) -> str:
        return str(self.path or "<buffer>")

    def _state(self) -> str:
        return "open"

    def _check_open(self) -> None:
        if self.closed:
            raise AprIOError("the file is closed", path=self.path)


class TensorMapping(Handle):
    """A :class:`Handle` that is also a read-only mapping of tensor names: ``keys()``,
    ``name in f``, ``len(f)`` and ``for name in f``.  Subclasses give :meth:`keys` and may
    give a faster ``__contains__``."""

    def keys(self) -> list:
        """The tensor names, in file order."""
        raise NotImplementedError

    def __iter__(self):
        return iter(self.keys())

    def __len__(self) -> int:
        return len(self.keys())

    def __contains__(self, name) -> bool:
        return name in self.keys()

    def _state(self) -> str:
        return f"{len(self)} tensors"
