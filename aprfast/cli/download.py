"""``apr download URL``: copy a remote file (``hf://``, ``http(s)://``, ``s3://``, any
fsspec URL) into the download cache without converting it (seed 001 §13.9).  The work
is :func:`aprfast.remote.cache.download`."""

from __future__ import annotations

from ._common import EXIT_OK, UsageError, print_json


def add_parser(commands) -> None:
    p = commands.add_parser("download", help="copy a remote file into the download cache (APR_CACHE)")
    p.add_argument("url", help="hf://org/repo/file (or hf://org/repo: the whole repository), http(s)://..., "
                               "s3://bucket/key, ...")
    p.add_argument("--force", action="store_true", help="download again even if the cache holds it")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")
    p.set_defaults(run=run)


def run(args) -> int:
    from ..config import cache_dir
    from ..remote.cache import hf_repo, cache_path_for, download

    if hf_repo(args.url) is None:  # a whole hf:// repository has no single file path
        try:
            cache_path_for(args.url)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    path = download(args.url, cache_dir=cache_dir(args.settings), force=args.force)
    if args.json:
        print_json({"url": args.url, "path": str(path), "size": path.stat().st_size})
    else:
        print(path)
    return EXIT_OK
