"""Module paths from before the package was split into layers (0.x flat layout).

``import aprfast.reader`` and every other module path that existed before the move keeps
working: a finder on ``sys.meta_path`` answers the old name with the module at its new
path (the same module object, so monkeypatching and ``isinstance`` behave as before).
Public old paths warn once with a :class:`DeprecationWarning` naming the new one, as
numpy did when it moved ``numpy.core``.  Two kinds answer silently:

* paths that stay public (``aprfast.stats``): documented names;
* private paths (``aprfast._pickling`` ...): only pickles made before the move name them
  (a handle pickles as ``aprfast._pickling._reopen``), and unpickling must not warn about
  a path the user never wrote.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import warnings

#: old module path -> (new module path, warn)
MOVED = {
    "aprfast.sources": ("aprfast.io.sources", True),
    "aprfast.atomic": ("aprfast.io.atomic", True),
    "aprfast._pickling": ("aprfast.io.pickling", False),
    "aprfast._platform": ("aprfast.io.platform", False),
    "aprfast.tensor_codecs": ("aprfast.codecs.blocks", True),
    "aprfast.security.aead": ("aprfast.crypto.aead", True),
    "aprfast.security.digests": ("aprfast.crypto.digests", True),
    "aprfast.quantization": ("aprfast.numerics.quantization", True),
    "aprfast.precision": ("aprfast.numerics.precision", True),
    "aprfast.stats": ("aprfast.numerics.stats", False),
    "aprfast.drift": ("aprfast.numerics.drift", True),
    "aprfast.expectations": ("aprfast.numerics.expectations", True),
    "aprfast._rmp": ("aprfast.layouts.rmp", False),
    "aprfast._serde_json": ("aprfast.layouts.serde_json", False),
    "aprfast.reader": ("aprfast.files.reader", True),
    "aprfast.writer": ("aprfast.files.writer", True),
    "aprfast.shards": ("aprfast.files.shards", True),
    "aprfast.safe_handle": ("aprfast.files.safe_open", True),
    "aprfast.frameworks": ("aprfast.files.frameworks", True),
    "aprfast.v1reader": ("aprfast.v1.reader", True),
    "aprfast.licensing": ("aprfast.v1.licensing", True),
    "aprfast.watermark": ("aprfast.v1.watermark", True),
    "aprfast.diff": ("aprfast.tools.diff", True),
    "aprfast.merge": ("aprfast.tools.merge", True),
    "aprfast.quality": ("aprfast.tools.quality", True),
    "aprfast.protection": ("aprfast.tools.protection", True),
}


class _AliasLoader:  # the loader protocol (importlib.abc is not imported: it costs 6 modules)
    def __init__(self, new: str, warn: bool):
        self.new = new
        self.warn = warn

    def create_module(self, spec):
        return None  # a placeholder; exec_module puts the real module in its place

    def exec_module(self, module):
        old = module.__name__
        if self.warn:
            warnings.warn(f"{old} moved to {self.new}; import it from there (or use the names "
                          f"aprfast exports at the top level).  The old path will be removed in a "
                          f"future release.", DeprecationWarning, stacklevel=2)
        # the import system returns whatever sys.modules holds under the name at the end
        sys.modules[old] = importlib.import_module(self.new)


class _MovedFinder:  # the meta path finder protocol
    def find_spec(self, fullname, path=None, target=None):
        entry = MOVED.get(fullname)
        if entry is None:
            return None
        return importlib.util.spec_from_loader(fullname, _AliasLoader(*entry))


def install() -> None:
    """Put the finder on ``sys.meta_path`` once (idempotent: reloading aprfast adds none)."""
    if not any(isinstance(finder, _MovedFinder) for finder in sys.meta_path):
        # first: a stale file of an older install left at the old path must not win
        sys.meta_path.insert(0, _MovedFinder())
