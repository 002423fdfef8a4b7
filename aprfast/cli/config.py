"""``apr config``: the configuration in effect (seed 001 §8, Appendix B): which file was
read, the cache directory, log level and colour mode, and the defaults each command
takes from the file.  The reading and the rules are :mod:`aprfast.config`."""

from __future__ import annotations

import logging

from .. import config as apr_config
from ._common import EXIT_OK, print_json


def add_parser(commands) -> None:
    p = commands.add_parser("config", help="show the configuration file and environment in effect")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")
    p.set_defaults(run=run)


def effective(settings, color_mode: str) -> dict:
    path, named = apr_config.config_path()
    return {"config_file": str(path), "config_file_read": settings.path is not None,
            "named_by_APR_CONFIG": named, "cache_dir": str(apr_config.cache_dir(settings)),
            "log_level": logging.getLevelName(apr_config.log_level(settings)).lower(), "color": color_mode,
            "defaults": settings.defaults, "commands": settings.commands}


def run(args) -> int:
    report = effective(args.settings, args.color_mode)
    if args.json:
        print_json(report)
        return EXIT_OK
    state = "read" if report["config_file_read"] else "not present"
    print(f"config file: {report['config_file']} ({state})")
    for key in ("cache_dir", "log_level", "color"):
        print(f"{key}: {report[key]}")
    for section, table in [("defaults", report["defaults"]), *report["commands"].items()]:
        if table:
            print(f"[{section}]")
            for key, value in table.items():
                print(f"  {key} = {value!r}")
    return EXIT_OK
