"""``apr download URL``: copy a remote file (``hf://``, ``http(s)://``, ``s3://``, any
fsspec URL) into the download cache without converting it (seed 001 §13.9).  The work
is :func:`aprfast.remote.cache.download`: at most ``--max-size`` bytes (default 64 GiB,
1 GiB of a body whose length the server does not declare),
nothing recorded nor left behind on failure (a nonzero exit), the URL shown redacted
(no userinfo, no query) in messages, ``--json`` and the cache's records."""

from __future__ import annotations

import re

from ._common import EXIT_OK, UsageError, print_json

_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(?:([kmgt])(i?))?b?\s*", re.IGNORECASE)


def add_parser(commands) -> None:
    p = commands.add_parser("download", help="copy a remote file into the download cache (APR_CACHE)")
    p.add_argument("url", help="hf://org/repo/file (or hf://org/repo: the whole repository), http(s)://..., "
                               "s3://bucket/key, ...")
    p.add_argument("--force", action="store_true", help="download again even if the cache holds it")
    p.add_argument("--max-size", metavar="SIZE", default=None,
                   help="refuse a file larger than this (bytes, or 500MB, 8GiB...; 0: no limit; default: 64GiB, "
                        "1GiB when the server declares no length)")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")
    p.set_defaults(run=run)


def run(args) -> int:
    from ..config import cache_dir
    from ..remote import redact_url
    from ..remote.cache import cache_path_for, download, hf_repo

    if hf_repo(args.url) is None:  # a whole hf:// repository has no single file path
        try:
            cache_path_for(args.url)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    max_size = None if args.max_size is None else _size(args.max_size)
    path = download(args.url, cache_dir=cache_dir(args.settings), force=args.force, max_size=max_size)
    if args.json:
        print_json({"url": redact_url(args.url), "path": str(path), "size": path.stat().st_size})
    else:
        print(path)
    return EXIT_OK


def _size(text: str) -> int:
    """Bytes from ``--max-size``: 1000000, 500MB (10**6), 8GiB (2**30); 0 is no limit."""
    m = _SIZE.fullmatch(text)
    if not m:
        raise UsageError(f"--max-size {text!r} is not a size (e.g. 1000000, 500MB, 8GiB, 0 for no limit)")
    base = 1024 if m.group(3) else 1000
    return int(float(m.group(1)) * base ** " kmgt".index((m.group(2) or " ").lower()))
