"""One check for the converters' hostile-file tests: a source given these bytes must
raise a typed error while opening or reading its tensors, never crash or return data."""

from __future__ import annotations

import pytest

from aprfast.errors import AprError


def assert_source_refuses(source_class, path, data: bytes, error=AprError, match=None) -> None:
    """Write ``data`` to ``path``, open it with ``source_class`` and read every tensor:
    ``error`` (matching ``match``) must be raised on the way."""
    path.write_bytes(data)
    with pytest.raises(error, match=match):
        src = source_class(path)
        try:
            for spec in src.specs:
                src.read(spec)
        finally:
            src.close()
