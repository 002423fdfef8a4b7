"""Which kernels run: the compiled modules (``aprfast._crc``, ...) or their pure-Python
twins in :mod:`aprfast._pure`.

``APRFAST_BACKEND=python`` forces the twins; ``APRFAST_BACKEND=c`` forces the compiled
modules and fails at import if one is missing; unset (or ``auto``) takes the compiled
modules when every one of them imports and the twins otherwise.  The choice is all or
nothing so that :data:`aprfast.backend` says exactly what runs.

The twins replace the compiled modules under their own names in ``sys.modules`` (and
as attributes of the package) before the rest of aprfast imports them, so every
``from ._crc import crc32`` in the package, and in tests, gets the selected backend
without an import line changing.
"""

from __future__ import annotations

import importlib
import os
import sys

#: The compiled modules, each with a twin of the same name in aprfast._pure.
MODULES = ("_crc", "_half", "_memory", "_blocks", "_index", "_inputs", "_metascan", "_quant", "_stats")

ENV = "APRFAST_BACKEND"
_CHOICES = ("auto", "c", "python")


def requested() -> str:
    """The backend asked for by ``APRFAST_BACKEND``: "auto", "c" or "python"."""
    value = os.environ.get(ENV, "").strip().lower() or "auto"
    if value not in _CHOICES:
        raise ImportError(f"{ENV}={value!r}: expected one of {', '.join(_CHOICES)}")
    return value


def _import_compiled(package: str) -> dict:
    return {name: importlib.import_module(f"{package}.{name}") for name in MODULES}


def _install_pure(package: str) -> None:
    pkg = sys.modules[package]
    for name in MODULES:
        twin = importlib.import_module(f"{package}._pure.{name}")
        sys.modules[f"{package}.{name}"] = twin
        setattr(pkg, name, twin)


def select(package: str = "aprfast") -> str:
    """Make ``<package>._crc`` etc. the selected backend's modules; return "c" or "python"."""
    choice = requested()
    if choice == "python":
        _install_pure(package)
        return "python"
    try:
        _import_compiled(package)
    except ImportError as exc:
        if choice == "c":
            raise ImportError(f"{ENV}=c but a compiled aprfast module is missing ({exc}); build it with "
                              "`python setup.py build_ext --inplace` or unset the variable") from exc
        for name in MODULES:  # a partial set of compiled modules is not used
            sys.modules.pop(f"{package}.{name}", None)
        _install_pure(package)
        return "python"
    return "c"


#: The backend of this process, chosen once when aprfast is first imported.
BACKEND = select(__name__.rpartition(".")[0])
