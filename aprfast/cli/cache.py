"""``apr cache info|clear``: aprfast's download cache (seed 001 §13.9) in ``APR_CACHE``.
The work is :mod:`aprfast.remote.cache`."""

from __future__ import annotations

from ._common import EXIT_OK, print_json


def add_parser(commands) -> None:
    p = commands.add_parser("cache", help="show or clear the download cache (APR_CACHE)")
    actions = p.add_subparsers(dest="cache_action", metavar="{info,clear}", required=True)
    info = actions.add_parser("info", help="the cache directory, its files and their total size")
    info.add_argument("--json", action="store_true", help="print machine-readable JSON")
    clear = actions.add_parser("clear", help="remove every file apr download put in the cache")
    clear.add_argument("--json", action="store_true", help="print machine-readable JSON")
    for sub in (info, clear):
        sub.allow_abbrev = False
    p.set_defaults(run=run)


def run(args) -> int:
    from ..config import cache_dir
    from ..remote.cache import cache_clear, cache_info

    root = cache_dir(args.settings)
    if args.cache_action == "clear":
        report = cache_clear(cache_dir=root)
        if args.json:
            print_json(report)
        else:
            print(f"removed {report['removed']} files ({report['bytes']} bytes) from {report['cache_dir']}")
        return EXIT_OK
    report = cache_info(cache_dir=root)
    if args.json:
        print_json(report)
        return EXIT_OK
    print(f"cache: {report['cache_dir']}")
    print(f"{report['count']} files, {report['bytes']} bytes")
    for f in report["files"]:
        state = "" if f["present"] else "  (missing or changed)"
        print(f"  {f['path']}  {f['size']} B  sha256 {f['sha256'][:16]}  {f['url']}{state}")
    return EXIT_OK
