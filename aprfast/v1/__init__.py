"""The v1 model container ("APRN", seed 000): :func:`save_model`, :func:`load_model`,
:func:`inspect_model`, licensing and lazy tensor files (:class:`~aprfast.v1.reader.V1File`).
"""

from . import api as _api
from .api import *  # noqa: F403  (the public names, listed in api.__all__)
from .api import __all__  # noqa: F401


def __getattr__(name):
    # every other name of the old flat module aprfast.v1
    try:
        return getattr(_api, name)
    except AttributeError:
        raise AttributeError(f"module 'aprfast.v1' has no attribute {name!r}") from None
