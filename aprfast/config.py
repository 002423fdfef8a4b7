"""The ``apr`` command's configuration file and environment (seed 001 §8, Appendix B).

================  ==========================================  ==========================
variable          what                                        default
================  ==========================================  ==========================
``APR_CONFIG``    the configuration file                      ``~/.config/apr/config.toml``
``APR_CACHE``     the cache directory                         ``~/.cache/apr``
``APR_LOG_LEVEL`` debug, info, warning, error, critical       ``info``
``APR_COLOR``     auto, always, never                         ``auto``
================  ==========================================  ==========================

The file is TOML, read with the standard library's ``tomllib`` (Python 3.11+) or its
back-port ``tomli`` on older Pythons: TOML has enough corner cases (dotted keys, dates,
multi-line strings, escapes) that a hand-written reader would misread some file, and
``tomli`` is the very code that became ``tomllib``.  ``[defaults]`` applies to every
command (``output_format = "json"`` turns on ``--json`` wherever a command has it;
``color``, ``log_level``, ``cache_dir``), and a section named after a command gives
defaults for that command's options (``[inspect] max_tokens = 50``; a few of the
seed's names are aliases: ``show_vocab``, ``max_tokens_display``, ``drama_mode``,
``hex_limit``).  The command line always wins over the file, and the environment
variables over the file's ``[defaults]``.  A missing default file is no configuration;
a file named by ``APR_CONFIG`` that does not exist, is not TOML, or gives an option a
value of the wrong type is a :class:`ConfigError`.
"""

from __future__ import annotations

import logging
import os
import sys
from contextlib import contextmanager
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - the back-port of the same module
    import tomli as tomllib

__all__ = ["ConfigError", "Settings", "load_settings", "config_path", "cache_dir", "log_level", "color_mode",
           "color_enabled", "ALIASES", "MAX_CONFIG_BYTES"]

log = logging.getLogger("aprfast.config")

#: A configuration file is a few lines; anything larger is not one (and is not read whole).
MAX_CONFIG_BYTES = 1 << 20
#: [defaults] keys that are settings, not option defaults.
GLOBAL_KEYS = ("output_format", "color", "log_level", "cache_dir")
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
COLOR_MODES = ("auto", "always", "never")

#: Seed 001 §8's key names for options that the command line spells differently.
ALIASES = {("inspect", "show_vocab"): "vocab", ("inspect", "max_tokens_display"): "max_tokens",
           ("debug", "drama_mode"): "drama", ("debug", "hex_limit"): "limit"}


class ConfigError(Exception):
    """A configuration file or environment variable that cannot be used (exit 2)."""


class Settings:
    """The configuration in effect: ``path`` (None when no file was read), ``defaults``
    (the ``[defaults]`` table) and ``commands`` ({command: {key: value}})."""

    def __init__(self, path=None, data=None):
        data = data or {}
        self.path = path
        self.defaults = _table(data, "defaults")
        self.commands = {k: v for k, v in data.items() if k != "defaults" and isinstance(v, dict)}
        stray = [k for k, v in data.items() if k != "defaults" and not isinstance(v, dict)]
        if stray:
            raise ConfigError(f"{path}: top-level key(s) {', '.join(stray)} belong in a [defaults] or [command] table")

    def for_command(self, command: str) -> dict:
        """{option dest: value} the file gives ``command``, aliases resolved."""
        out = {}
        if self.defaults.get("output_format") is not None:
            fmt = self.defaults["output_format"]
            if fmt not in ("text", "json"):
                raise ConfigError(f"{self.path}: [defaults] output_format must be \"text\" or \"json\", not {fmt!r}")
            out["json"] = fmt == "json"
        for key, value in self.commands.get(command, {}).items():
            out[ALIASES.get((command, key), key).replace("-", "_")] = value
        return out


def _table(data, name) -> dict:
    value = data.get(name, {})
    if not isinstance(value, dict):
        raise ConfigError(f"[{name}] must be a table")
    return value


def config_path() -> tuple:
    """(path, named): ``APR_CONFIG`` if set (named=True), else the default location."""
    named = os.environ.get("APR_CONFIG")
    if named:
        return Path(named).expanduser(), True
    base = os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config"
    return Path(base) / "apr" / "config.toml", False


def load_settings(path=None) -> Settings:
    """The configuration file's settings (``path``, else :func:`config_path`)."""
    named = path is not None
    if path is None:
        path, named = config_path()
    path = Path(path)
    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_CONFIG_BYTES + 1)
    except FileNotFoundError:
        if named:
            raise ConfigError(f"configuration file {path} (APR_CONFIG) does not exist") from None
        return Settings()
    except OSError as exc:
        raise ConfigError(f"configuration file {path}: {exc.strerror or exc}") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(f"configuration file {path} is over {MAX_CONFIG_BYTES} bytes; not a configuration file")
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ConfigError(f"configuration file {path} is not UTF-8 ({exc.reason} at byte {exc.start})") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"configuration file {path} is not valid TOML: {exc}") from None
    return Settings(path, data)


def cache_dir(settings: Settings | None = None) -> Path:
    """``APR_CACHE``, else the file's ``[defaults] cache_dir``, else ``~/.cache/apr``
    (``$XDG_CACHE_HOME/apr``).  Created (mode 0700) on first use."""
    chosen = os.environ.get("APR_CACHE") or (settings.defaults.get("cache_dir") if settings else None)
    if chosen is not None and not isinstance(chosen, str):
        raise ConfigError(f"[defaults] cache_dir must be a string, not {chosen!r}")
    if chosen:
        path = Path(chosen).expanduser()
    else:
        path = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "apr"
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"cache directory {path}: {exc.strerror or exc}") from None
    return path


def log_level(settings: Settings | None = None) -> int:
    """``APR_LOG_LEVEL``, else ``[defaults] log_level``, else info, as a logging level."""
    name = os.environ.get("APR_LOG_LEVEL") or (settings.defaults.get("log_level") if settings else None) or "info"
    if not isinstance(name, str) or name.lower() not in LOG_LEVELS:
        raise ConfigError(f"log level {name!r}: choose one of {', '.join(LOG_LEVELS)}")
    return getattr(logging, name.upper())


def color_mode(settings: Settings | None = None, given: str | None = None) -> str:
    """auto, always or never: ``--color``, else ``APR_COLOR``, else ``[defaults] color``
    (true/false or a mode), else auto."""
    value = given or os.environ.get("APR_COLOR")
    if value is None and settings is not None:
        value = settings.defaults.get("color")
    if value is None:
        return "auto"
    if isinstance(value, bool):
        return "always" if value else "never"
    text = str(value).lower()
    mode = {"1": "always", "true": "always", "yes": "always", "0": "never", "false": "never", "no": "never"}.get(
        text, text)
    if mode not in COLOR_MODES:
        raise ConfigError(f"color {value!r}: choose one of {', '.join(COLOR_MODES)}")
    return mode


def color_enabled(mode: str, stream) -> bool:
    """Whether to write ANSI colour to ``stream``: auto means a terminal, and no
    ``NO_COLOR`` in the environment (the no-color.org convention)."""
    if mode == "always":
        return True
    if mode == "never":
        return False
    return bool(getattr(stream, "isatty", lambda: False)()) and not os.environ.get("NO_COLOR")


@contextmanager
def logging_to_stderr(level: int):
    """aprfast's log records at ``level`` and above on stderr while the command runs
    (removed after, so a program calling ``main`` twice does not print twice)."""
    logger = logging.getLogger("aprfast")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("apr: %(levelname)s: %(message)s"))
    handler.setLevel(level)
    old_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(level)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)
