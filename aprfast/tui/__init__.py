"""``apr tui``: the terminal UI of seed 001 §4.13, built with Textual (the ``tui`` extra).

:class:`ModelApp` needs Textual; without it, reaching for it raises
:class:`~aprfast._optional.MissingDependencyError` naming the extra to install.
:mod:`aprfast.tui.render` (the text the views show) needs nothing beyond aprfast."""

__all__ = ["ModelApp"]


def __getattr__(name):
    if name == "ModelApp":
        from .app import ModelApp

        return ModelApp
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
