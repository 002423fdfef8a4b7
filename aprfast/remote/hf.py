"""``hf://`` models through huggingface_hub (the ``hf`` extra).

``hf://[datasets/|spaces/]org/repo[@revision]/path/to/model.apr``:

- a file already in huggingface_hub's cache (``HF_HUB_CACHE``) is opened from there,
  memory-mapped like any local file, with no request at all;
- with ``HF_HUB_OFFLINE=1`` only the cache is used (a file missing from it is
  :class:`~aprfast.errors.AprFileNotFoundError`, and nothing is sent);
- otherwise the file is read lazily with ranged requests through huggingface_hub's
  ``HfFileSystem`` (an fsspec filesystem), which takes the token from ``storage_options``
  (``token=``) or from the environment (``HF_TOKEN``) and the cached login as usual.

aprfast itself caches nothing here, so ``APR_CACHE`` is not involved: huggingface_hub's
cache is the one cache.
"""

from __future__ import annotations

import os
import re

from .._optional import require
from ..errors import AprFileNotFoundError

__all__ = ["parse_hf_url", "resolve", "open_hf", "open_hf_stream", "hub_offline"]

_TYPES = {"datasets": "dataset", "spaces": "space"}


def parse_hf_url(url: str):
    """(repo_type, repo_id, revision, filename) of an ``hf://`` URL (ValueError otherwise)."""
    m = re.fullmatch(r"hf://(.+)", url)
    if not m:
        raise ValueError(f"not an hf:// URL: {url!r}")
    parts = m.group(1).split("/")
    repo_type = "model"
    if parts[0] in _TYPES:
        repo_type = _TYPES[parts.pop(0)]
    if len(parts) < 3 or not all(parts):
        raise ValueError(f"an hf:// URL names org/repo/file: {url!r}")
    org, repo = parts[0], parts[1]
    revision = None
    if "@" in repo:
        repo, revision = repo.split("@", 1)
        revision = revision.replace("%2F", "/")
    return repo_type, f"{org}/{repo}", revision, "/".join(parts[2:])


def hub_offline() -> bool:
    """HF_HUB_OFFLINE as huggingface_hub reads it, looked at now (not at import)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in ("1", "ON", "YES", "TRUE")


def resolve(url: str, storage_options=None):
    """("local", path) for a file in huggingface_hub's cache, else ("remote", fs, path)
    for HfFileSystem; offline and not cached: AprFileNotFoundError."""
    hub = require("huggingface_hub")
    repo_type, repo_id, revision, filename = parse_hf_url(url)
    options = dict(storage_options or {})
    cached = hub.try_to_load_from_cache(repo_id, filename, revision=revision, repo_type=repo_type,
                                        cache_dir=options.get("cache_dir"))
    if isinstance(cached, str):
        return ("local", cached)
    if hub_offline():
        raise AprFileNotFoundError(f"HF_HUB_OFFLINE is set and {filename!r} of {repo_type} {repo_id!r}"
                                   f"{'@' + revision if revision else ''} is not in huggingface_hub's cache",
                                   path=url)
    fs = hub.HfFileSystem(**{k: v for k, v in options.items() if k in ("token", "endpoint")})
    prefix = {"model": "", "dataset": "datasets/", "space": "spaces/"}[repo_type]
    return ("remote", fs, f"{prefix}{repo_id}{'@' + revision if revision else ''}/{filename}")


def open_hf(url: str, storage_options=None, *, mode=None):
    """A Source for an ``hf://`` URL: the cached file when there is one, else ranged reads."""
    where = resolve(url, storage_options)
    if where[0] == "local":
        from ..io.sources import open_source

        return open_source(where[1], mode=mode)
    from .fsspec import FsspecSource

    return FsspecSource(url, fs=where[1], path=where[2], connections=dict(storage_options or {}).get("connections", 8))


def open_hf_stream(url: str, storage_options=None):
    """A forward-only binary file object over an ``hf://`` file (cached, or streamed)."""
    where = resolve(url, storage_options)
    if where[0] == "local":
        return open(where[1], "rb")  # noqa: SIM115 - the caller closes it
    return where[1].open(where[2], "rb", block_size=8 << 20)
