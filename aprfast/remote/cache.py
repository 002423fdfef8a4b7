"""aprfast's own download cache (seed 001 §13.9): ``apr download`` copies a remote file
into ``APR_CACHE`` (:func:`aprfast.config.cache_dir`, ``~/.cache/apr`` by default), and
``apr cache info|clear`` report and empty it.

Layout: ``{cache}/{scheme}/{where}/{path}`` (``hf/org/repo/model.apr``,
``https/example.org/models/m.apr``, ``s3/bucket/key.apr``) and ``{cache}/checksum.json``
recording each file's URL, size and SHA-256.  Files are written through
:class:`aprfast.io.atomic.AtomicFile`, so an interrupted download leaves no partial file;
``clear`` removes only what ``checksum.json`` records (and then-empty directories),
never anything else a user keeps in that directory.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import urllib.parse
from pathlib import Path

from ..errors import AprIOError
from . import is_url, open_stream

__all__ = ["cache_path_for", "download", "cache_info", "cache_clear", "CHECKSUMS"]

CHECKSUMS = "checksum.json"
re_hf_repo = re.compile(r"hf://(datasets/|spaces/)?([^/@]+)/([^/@]+)(?:@([^/]+))?/?")
_CHUNK = 8 << 20


def _cache_root(cache_dir) -> Path:
    if cache_dir is not None:
        path = Path(cache_dir).expanduser()
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        return path
    from ..config import cache_dir as configured

    return configured()


def cache_path_for(url: str) -> Path:
    """The path of ``url``'s copy relative to the cache (ValueError for a URL that does
    not name a file, or whose parts would leave the cache)."""
    if not is_url(url):
        raise ValueError(f"not a URL: {url!r}")
    parts = urllib.parse.urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme == "hf":
        from .hf import parse_hf_url

        repo_type, repo_id, revision, filename = parse_hf_url(url)
        kind = "" if repo_type == "model" else f"{repo_type}s/"
        pieces = ["hf", *f"{kind}{repo_id}{'@' + revision if revision else ''}".split("/"), *filename.split("/")]
    else:
        where = (parts.netloc or "local").replace(":", "_")
        pieces = [scheme, where, *urllib.parse.unquote(parts.path).split("/")]
        pieces = [pieces[0], pieces[1], *[p for p in pieces[2:] if p != ""]]
    if len(pieces) < 3 or any(p in ("", ".", "..") or "/" in p or "\\" in p or "\0" in p for p in pieces):
        raise ValueError(f"{url!r} does not name a file that can be cached")
    return Path(*pieces)


def _load_checksums(root: Path) -> dict:
    path = root / CHECKSUMS
    try:
        with open(path, encoding="utf-8") as f:
            records = json.load(f)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise AprIOError(f"cannot read the cache's records: {exc}", path=str(path)) from exc
    return records if isinstance(records, dict) else {}


def _save_checksums(root: Path, records: dict) -> None:
    from ..io.atomic import AtomicFile

    data = json.dumps(records, indent=1, sort_keys=True).encode()
    atomic = AtomicFile(root / CHECKSUMS)
    try:
        os.write(atomic.fd, data)
    except BaseException:
        atomic.abort()
        raise
    atomic.commit()


def download(url: str, *, cache_dir=None, storage_options=None, force: bool = False) -> Path:
    """Copy the file at ``url`` into the cache and return its local path (already there
    with its recorded size: returned without a request unless ``force``)."""
    from ..io.atomic import AtomicFile

    root = _cache_root(cache_dir)
    repo = hf_repo(url)
    if repo is not None:
        return _download_hf_repo(url, root, *repo, force=force)
    relative = cache_path_for(url)
    target = root / relative
    records = _load_checksums(root)
    known = records.get(relative.as_posix())
    if not force and known and target.is_file() and target.stat().st_size == known.get("size"):
        return target
    target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    digest, size = hashlib.sha256(), 0
    stream = open_stream(url, storage_options)
    atomic = AtomicFile(target)
    try:
        buffer = bytearray(_CHUNK)
        view = memoryview(buffer)
        while True:
            n = stream.readinto(view)
            if not n:
                break
            digest.update(view[:n])
            written = 0
            while written < n:
                written += os.write(atomic.fd, view[written:n])
            size += n
    except BaseException as exc:
        atomic.abort()
        if isinstance(exc, OSError) and not isinstance(exc, AprIOError):
            raise AprIOError(f"download failed after {size} bytes: {exc}", path=url) from exc
        raise
    finally:
        stream.close()
    expected = getattr(stream, "size", None)  # fsspec files know theirs; HTTP bodies check their own
    if isinstance(expected, int) and expected != size:
        atomic.abort()
        raise AprIOError(f"download ended after {size} of {expected} bytes", path=url)
    atomic.commit()
    records = _load_checksums(root)  # again: another download may have recorded meanwhile
    records[relative.as_posix()] = {"url": url, "size": size, "sha256": digest.hexdigest()}
    _save_checksums(root, records)
    return target


def hf_repo(url: str):
    """(repo_type, repo_id, revision) for an ``hf://`` URL naming a whole repository."""
    m = re_hf_repo.fullmatch(url)
    if not m:
        return None
    kind, org, repo, revision = m.group(1), m.group(2), m.group(3), m.group(4)
    return {"datasets/": "dataset", "spaces/": "space", None: "model"}[kind], f"{org}/{repo}", revision


def _download_hf_repo(url, root: Path, repo_type, repo_id, revision, *, force: bool) -> Path:
    """A whole Hub repository into ``{cache}/hf/org/repo`` with huggingface_hub's
    ``snapshot_download`` (HF_HUB_OFFLINE honoured: offline, nothing is fetched)."""
    from .._optional import require
    from ..errors import AprFileNotFoundError
    from .hf import hub_offline

    hub = require("huggingface_hub")
    relative = Path("hf", *repo_id.split("/"))
    if revision:
        relative = relative.with_name(f"{relative.name}@{revision}")
    target = root / relative
    if hub_offline():
        raise AprFileNotFoundError("HF_HUB_OFFLINE is set: a repository cannot be downloaded", path=url)
    try:
        hub.snapshot_download(repo_id, repo_type=repo_type, revision=revision, local_dir=str(target),
                              force_download=force)
    except Exception as exc:  # noqa: BLE001 - huggingface_hub's errors, typed here
        raise AprIOError(f"cannot download the repository: {type(exc).__name__}: {exc}", path=url) from exc
    records = _load_checksums(root)
    for path in sorted(target.rglob("*")):
        if path.is_file() and ".cache" not in path.relative_to(target).parts:
            digest = hashlib.sha256()
            with open(path, "rb") as f:
                for block in iter(lambda: f.read(_CHUNK), b""):
                    digest.update(block)
            records[path.relative_to(root).as_posix()] = {"url": url, "size": path.stat().st_size,
                                                          "sha256": digest.hexdigest()}
    _save_checksums(root, records)
    return target


def cache_info(*, cache_dir=None) -> dict:
    """The cache's directory, its recorded files (URL, size, SHA-256, present), and totals."""
    root = _cache_root(cache_dir)
    records = _load_checksums(root)
    files = []
    for relative, record in sorted(records.items()):
        path = root / relative
        present = path.is_file()
        files.append({"path": relative, "url": record.get("url"), "size": record.get("size"),
                      "sha256": record.get("sha256"),
                      "present": present and path.stat().st_size == record.get("size")})
    return {"cache_dir": str(root), "files": files, "count": len(files),
            "bytes": sum(f["size"] or 0 for f in files if f["present"])}


def cache_clear(*, cache_dir=None) -> dict:
    """Remove every recorded file, the directories that became empty, and the records."""
    root = _cache_root(cache_dir)
    records = _load_checksums(root)
    removed, freed = 0, 0
    for relative in records:
        path = root / relative
        if root not in path.resolve().parents:  # a hand-edited record pointing elsewhere
            continue
        try:
            freed += path.stat().st_size
            path.unlink()
            removed += 1
        except FileNotFoundError:
            continue
        parent = path.parent
        while parent != root:
            try:
                parent.rmdir()
            except OSError:
                break
            parent = parent.parent
    try:
        (root / CHECKSUMS).unlink()
    except FileNotFoundError:
        pass
    return {"cache_dir": str(root), "removed": removed, "bytes": freed}
